"""The keyring: keys by id, one current key for new files, loaded from TOML.

Config (``[keyring]`` in a cryptdisk TOML file; exactly one source per key)::

    [keyring]
    current_key_id = 2            # optional when there is one key
    algorithm = "aes-256-gcm"     # optional default for the keys below

    [[keyring.keys]]
    id = 1
    hex = "00112233..."           # inline (keep the config private)

    [[keyring.keys]]
    id = 2
    from_env = "CRYPTDISK_KEY_2"  # environment variable holding hex

    [[keyring.keys]]
    id = 3
    file = "keys/k3.hex"          # key file (relative to the config), mode 0600

    [[keyring.keys]]
    id = 4
    command = ["pass", "show", "cryptdisk/k4"]   # prints hex on stdout

    [[keyring.keys]]
    id = 5
    source = "pkcs11"             # a key that stays in an HSM (see cryptdisk.keys.providers)
    module = "/usr/lib/softhsm/libsofthsm2.so"
    token = "cryptdisk"
    key = "kek-5"
    pin_env = "CRYPTDISK_PIN"

Every key is loaded when the keyring is built, so a missing variable or a bad
file fails at start-up, naming the config path and the element.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..errors import ConfigError, KeyNotFoundError, KeyringError, with_location
from ._audit import set_audit_log
from ._hygiene import enable_mlock
from ._key import Key
from ._provider import parse_key_entry
from ._remote import closed_on_error
from ._sources import shown_value

__all__ = ["FollowingKeyring", "Keyring"]

def _table_line(text: str, table: str, index: int) -> str:
    """``line N`` of the ``index``-th ``[[table]]`` header in TOML ``text`` (for messages)."""
    pattern = re.compile(r"^\s*\[\[\s*" + re.escape(table).replace(r"\.", r"\s*\.\s*") + r"\s*\]\]")
    seen = -1
    for number, line in enumerate(text.splitlines(), 1):
        if pattern.match(line):
            seen += 1
            if seen == index:
                return f"line {number} ([[{table}]] #{index + 1})"
    return f"[[{table}]] #{index + 1}"


# the settings of a config's [keyring] table (its [[keyring.keys]] entries are checked each)
KEYRING_SETTINGS = frozenset({"current_key_id", "algorithm", "keys", "audit_log", "mlock"})

class Keyring:
    """Keys by id; the current key encrypts new files, every key can read.

    ``any_id=True`` makes a single-key keyring answer for every key id (used
    when a key is given alone, e.g. ``--key-env``); the key check value in each
    header still tells a wrong key apart.
    """

    def __init__(self, keys: Iterable[Key], current_key_id: int | None = None, *,
                 any_id: bool = False, config_path: str | None = None,
                 retired: Iterable[int] = ()) -> None:
        by_id: dict[int, Key] = {}
        for key in keys:
            if not isinstance(key, Key):
                raise TypeError(f"keyring entries must be Key objects, not {type(key).__name__}")
            if key.key_id in by_id:
                raise ValueError(f"duplicate key id {key.key_id}")
            by_id[key.key_id] = key
        if not by_id:
            raise KeyringError("a keyring needs at least one key",
                               hint="generate one with 'cryptdisk keygen'")
        if current_key_id is None:
            if len(by_id) > 1:
                raise KeyringError(
                    f"keyring has {len(by_id)} keys; say which is current (current_key_id)"
                )
            current_key_id = next(iter(by_id))
        if current_key_id not in by_id:
            raise KeyNotFoundError(
                f"current key id {current_key_id} is not among the keyring's keys "
                f"({', '.join(map(str, sorted(by_id)))})",
                key_id=current_key_id,
            )
        if any_id and len(by_id) != 1:
            raise ValueError("any_id needs exactly one key")
        self._keys = by_id
        self._current = current_key_id
        self._any_id = any_id
        self.config_path = config_path
        #: ids of the config's retired keys (``state = "retired"``): known, not loaded
        self.retired = frozenset(retired)

    # -- KeyLookup -------------------------------------------------------------

    def current_key(self) -> Key:
        return self._keys[self._current]

    def key_by_id(self, key_id: int) -> Key:
        key = self._keys.get(key_id)
        if key is not None:
            return key
        if self._any_id:
            return self.current_key().with_id(key_id)
        known = ", ".join(map(str, sorted(self._keys)))
        where = f" in {self.config_path}" if self.config_path else ""
        if key_id in self.retired:
            raise KeyNotFoundError(
                f"key {key_id} is retired{where} (state = \"retired\"): it is not loaded",
                key_id=key_id,
                hint="a file under a retired key was restored or missed when the key was "
                "retired; remove the key's state line to load it again, then rewrap")
        raise KeyNotFoundError(
            f"no key with id {key_id}{where} (keys: {known})",
            key_id=key_id,
            hint=f"add the key with id {key_id} to the keyring; it was in use when the file "
            "was written",
        )

    # -- inspection ------------------------------------------------------------

    @property
    def current_key_id(self) -> int:
        return self._current

    @property
    def ids(self) -> list[int]:
        return sorted(self._keys)

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys[i] for i in sorted(self._keys))

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._keys

    def __repr__(self) -> str:
        return f"<Keyring keys={self.ids} current={self._current}>"

    def __reduce__(self) -> Any:
        raise TypeError(
            "a Keyring cannot be pickled (that would write key material); pass its config "
            "path and load it again with Keyring.from_config"
        )

    def close(self) -> None:
        """Close the provider-held keys (wipes their unwrap caches); local keys need nothing."""
        for key in self._keys.values():
            close = getattr(key, "close", None)
            if close is not None:
                close()

    def adopt(self, other: Keyring) -> None:
        """Take ``other``'s keys, current key and retired ids in place: whatever holds this
        keyring (a disk, a server's user file, its audit log) reads and writes with them
        from now on. The keys are replaced before the current id, so a lookup meanwhile
        finds the current key among them (``other`` keeps the key that was current).

        The keys replaced (not among ``other``'s) are retired: a provider-held key closes its
        session or connection once no call is using it, so reloading keys again and again
        (each rotation, each change of a followed config) leaves no session open."""
        before = self._keys
        self._keys = dict(other._keys)
        self._current = other._current
        self.retired = other.retired
        kept = {id(key) for key in self._keys.values()}
        for key in before.values():
            retire = getattr(key, "retire", None)
            if retire is not None and id(key) not in kept:
                retire()

    def with_current(self, key_id: int) -> Keyring:
        """The same keys with another current key."""
        return Keyring(self._keys.values(), key_id, config_path=self.config_path,
                       retired=self.retired)

    def with_key(self, key: Key, *, current: bool = False) -> Keyring:
        keys = [k for k in self._keys.values() if k.key_id != key.key_id] + [key]
        return Keyring(keys, key.key_id if current else self._current,
                       config_path=self.config_path, retired=self.retired - {key.key_id})

    # -- construction ------------------------------------------------------------

    @classmethod
    def single(cls, key: Key | bytes | bytearray, *, key_id: int = 1) -> Keyring:
        """A keyring of one key that answers for any key id (see the class docstring)."""
        if not isinstance(key, Key):
            key = Key(key_id, key, source="inline")
        return cls([key], key.key_id, any_id=True)

    @classmethod
    def generate(cls, key_id: int = 1) -> Keyring:
        """A keyring with one fresh random key (for tests and demos)."""
        return cls([Key.generate(key_id)])

    @classmethod
    def from_config(cls, path: str | os.PathLike[str]) -> Keyring:
        """Load the ``[keyring]`` section of a cryptdisk TOML config file."""
        name = os.fspath(path)
        try:
            with open(name, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise ConfigError("config file does not exist", path=name) from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file: {exc.strerror}", path=name) from None
        text = raw.decode("utf-8", errors="replace")
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"not valid TOML: {exc}", path=name) from None
        return cls.from_mapping(data.get("keyring"), path=name, text=text)

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any] | None, *, path: str | None = None,
                     text: str = "") -> Keyring:
        """Build a keyring from a parsed ``[keyring]`` table (see the module docstring).

        On an error, the provider-held keys it made are closed first."""
        with closed_on_error():
            return cls._from_mapping(section, path=path, text=text)

    @classmethod
    def _from_mapping(cls, section: Mapping[str, Any] | None, *, path: str | None,
                      text: str) -> Keyring:
        if not isinstance(section, Mapping):
            raise ConfigError("no [keyring] section", path=path,
                              hint="see 'cryptdisk keygen --help' for an example config")
        unknown = set(section) - KEYRING_SETTINGS
        if unknown:
            raise ConfigError(f"unknown setting(s) in [keyring]: {', '.join(sorted(unknown))}",
                              path=path, where="[keyring]")
        entries = section.get("keys")
        if not isinstance(entries, list) or not entries:
            raise ConfigError("[keyring] has no keys; add [[keyring.keys]] entries", path=path)
        default_alg = section.get("algorithm")
        base = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
        audit = section.get("audit_log")
        if audit is not None:
            if not isinstance(audit, str) or not audit:
                raise ConfigError("audit_log must be a file path", path=path, where="[keyring]")
            set_audit_log(os.path.join(base, os.path.expanduser(audit)))
        mlock = section.get("mlock", False)
        if not isinstance(mlock, bool):
            raise ConfigError("mlock must be true or false", path=path, where="[keyring]")
        if mlock:
            enable_mlock()
        keys: list[Key] = []
        seen: dict[int, str] = {}
        retired: set[int] = set()
        for i, entry in enumerate(entries):
            where = _table_line(text, "keyring.keys", i)
            if isinstance(entry, Mapping) and "state" in entry:
                state = entry["state"]
                if state not in ("active", "retired"):
                    raise ConfigError(f"state = {state!r}: a key's state is \"active\" (the "
                                      "default) or \"retired\"", path=path, where=where)
                entry = {k: v for k, v in entry.items() if k != "state"}
                if state == "retired":
                    key_id = entry.get("id")
                    if not isinstance(key_id, int) or isinstance(key_id, bool):
                        raise ConfigError("each key needs an integer id (0 to 2**64-1)",
                                          path=path, where=where)
                    if key_id in seen or key_id in retired:
                        raise ConfigError(f"duplicate key id {key_id}", path=path, where=where)
                    retired.add(key_id)
                    continue
            key = _key_from_entry(entry, default_alg, base, path, where)
            if key.key_id in seen or key.key_id in retired:
                first = seen.get(key.key_id, "a retired entry")
                raise ConfigError(f"duplicate key id {key.key_id} (first at {first})",
                                  path=path, where=where)
            seen[key.key_id] = where
            keys.append(key)
        current = section.get("current_key_id")
        if current is not None and current in retired:
            raise ConfigError(f"current_key_id = {current} names a retired key", path=path,
                              where="[keyring]", hint="promote an active key")
        if not keys:
            raise ConfigError("every key of [keyring] is retired; add a key", path=path)
        if current is not None and (not isinstance(current, int) or current not in seen):
            raise ConfigError(
                f"current_key_id = {shown_value(current)} is not the id of a key in this keyring "
                f"(ids: {', '.join(map(str, sorted(seen)))})",
                path=path, where="[keyring]",
            )
        if current is None and len(keys) > 1:
            raise ConfigError("several keys but no current_key_id; say which key encrypts "
                              "new files", path=path, where="[keyring]")
        return cls(keys, current, config_path=path, retired=retired)


def _key_from_entry(entry: Any, default_alg: Any, base: str, path: str | None,
                    where: str) -> Key:
    loaded = parse_key_entry(entry, path=path, where=where, base=base, algorithm_field=True,
                             default_algorithm=default_alg)
    if loaded.key is not None:  # a provider-held key (source = "NAME")
        return loaded.key  # type: ignore[no-any-return]
    try:
        return Key(loaded.key_id, loaded.material, algorithm=loaded.algorithm,
                   source=loaded.source)
    except (KeyringError, ValueError) as exc:
        raise with_location(exc, path, where) from None


#: a file modified less than this long ago may still change within its modification time's
#: clock tick (its bytes are read at each stamp until then)
_RACY_NS = 2_000_000_000
#: files up to this size (configs, key files) are stamped by their bytes too
_STAMP_BYTES = 1 << 20
#: the digests' key, this process's own: a stamp says nothing of a key file's bytes
_STAMP_KEY = os.urandom(32)
#: path -> (inode, mtime, size, digest) of a file read once its mtime had settled: an edit
#: since then changes its mtime, so a file whose stat is the same has the same bytes
_SETTLED: dict[str, tuple[int, int, int, bytes]] = {}


def file_stamp(path: str) -> tuple[int, int, int, bytes] | None:
    """What changes when the file at ``path`` is rewritten or replaced (None: no file it can
    read): its inode, modification time and size and, for a file of up to 1 MiB, a keyed
    digest of its bytes (an edit in place that keeps the size within one tick of the file
    system's clock leaves the other three as they were). The bytes are read while the
    file changed less than two seconds ago and once after that; otherwise a stamp costs
    one ``stat``."""
    now = time.time_ns()  # (before the read: a digest cached was read after it settled)
    try:
        st = os.stat(path)
        if st.st_size > _STAMP_BYTES:
            return (st.st_ino, st.st_mtime_ns, st.st_size, b"")
        known = _SETTLED.get(path)
        if known is not None and known[:3] == (st.st_ino, st.st_mtime_ns, st.st_size):
            return known
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read(_STAMP_BYTES + 1)
    except OSError:
        return None
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size,
             hashlib.blake2b(data, key=_STAMP_KEY, digest_size=16).digest())
    if now - st.st_mtime_ns >= _RACY_NS:
        _SETTLED[path] = stamp
    return stamp


class FollowingKeyring(Keyring):
    """The keyring of a config file, loaded again when the file changes: a long-running
    process (``cryptdisk serve``) takes the key that ``cryptdisk keys add`` / ``promote``
    in another process made current, and reads files rewrapped under it.

    The file's :func:`file_stamp` is checked on each lookup (a ``stat``, not a page); a
    config that does not load at that moment (an edit half written by hand) leaves the
    keys loaded before in use.
    """

    def __init__(self, path: str | os.PathLike[str], loaded: Keyring | None = None) -> None:
        """``loaded``: the keyring read from ``path`` already (its keys are taken over)."""
        self._path = os.fspath(path)
        self._stamp = file_stamp(self._path)
        if loaded is None:
            loaded = Keyring.from_config(self._path)
        super().__init__(loaded, loaded.current_key_id, config_path=loaded.config_path,
                         retired=loaded.retired)

    def _follow(self) -> None:
        stamp = file_stamp(self._path)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            loaded = Keyring.from_config(self._path)
        except (ConfigError, KeyringError, OSError):
            return  # keep the keys loaded before; the next change is tried again
        self.adopt(loaded)

    def current_key(self) -> Key:
        self._follow()
        return super().current_key()

    def key_by_id(self, key_id: int) -> Key:
        self._follow()
        return super().key_by_id(key_id)

    @property
    def current_key_id(self) -> int:
        self._follow()
        return self._current

    @property
    def ids(self) -> list[int]:
        self._follow()
        return sorted(self._keys)

    def __iter__(self) -> Iterator[Key]:
        self._follow()
        return super().__iter__()

    def __contains__(self, key_id: object) -> bool:
        self._follow()
        return super().__contains__(key_id)

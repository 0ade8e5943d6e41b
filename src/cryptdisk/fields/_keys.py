"""Named field keys: ``[fields.keys.NAME]`` in a cryptdisk config, apart from at-rest keys.

::

    [fields.keys.cards]              # one key: id 1 unless given
    from_env = "CARDS_KEY"           # any key provider: hex, from_env, file, command

    [[fields.keys.emails]]           # several versions: the highest id encrypts
    id = 1
    file = "emails-1.key"
    [[fields.keys.emails]]
    id = 2
    file = "emails-2.key"

Each version's material (16 or 32 bytes) is never used directly: every function
derives its own subkey with HKDF-SHA256 (:meth:`cryptdisk.keys.Key.derive`), so the
GCM, AES-SIV, FF1 and HMAC keys of one field key are independent.

A field key whose material is also an at-rest key of the config (the ``[keyring]`` or an
encrypted disk's keys: the same file or the same bytes) is refused with a
:class:`ConfigError`: one key serves one purpose.
"""

from __future__ import annotations

import contextlib
import os
import tomllib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESSIV

from ..errors import ConfigError, CryptdiskError, FieldError, KeyNotFoundError, with_location
from ..keys import Key, parse_key_entry

__all__ = ["FieldKey", "FieldKeys"]

_MAX_FIELD_ID = 2**32 - 1  # the ciphertext header holds a u32 key id (Tink's layout)


class _Version:
    """One version of a field key: lazily derived subkeys, each for one purpose."""

    __slots__ = ("_ecb", "_gcm", "_gcm_key", "_hmac", "_key", "_siv", "_siv_key")

    def __init__(self, key: Key) -> None:
        self._key = key
        self._gcm: AESGCM | None = None
        self._siv: AESSIV | None = None
        self._gcm_key: bytes | None = None
        self._siv_key: bytes | None = None
        self._ecb: Any = None
        self._hmac: bytes | None = None

    def gcm_key(self) -> bytes:
        """The AES-256-GCM subkey (for the C loops of ``_cfields``)."""
        if self._gcm_key is None:
            self._gcm_key = self._key.derive(b"cryptdisk fields aes-256-gcm v1", 32)
        return self._gcm_key

    def siv_key(self) -> bytes:
        """The AES-SIV subkey, 64 bytes (RFC 5297's two 256-bit keys)."""
        if self._siv_key is None:
            self._siv_key = self._key.derive(b"cryptdisk fields aes-siv v1", 64)
        return self._siv_key

    def gcm(self) -> AESGCM:
        if self._gcm is None:
            self._gcm = AESGCM(self.gcm_key())
        return self._gcm

    def siv(self) -> AESSIV:
        if self._siv is None:
            self._siv = AESSIV(self.siv_key())
        return self._siv

    def ff1_cipher(self) -> Any:
        """AES-256 ECB (FF1's PRF building block) under the FF1 subkey."""
        if self._ecb is None:
            self._ecb = Cipher(algorithms.AES(self._key.derive(b"cryptdisk fields ff1 v1", 32)),
                               modes.ECB())  # noqa: S305 - FF1's PRF blocks, see _ff1
        return self._ecb

    def hmac_key(self) -> bytes:
        if self._hmac is None:
            self._hmac = self._key.derive(b"cryptdisk fields hmac-sha256 v1", 32)
        return self._hmac


class FieldKey:
    """A named field key with one or more versions (ids); the highest id is current.

    Holds no public material: ``repr`` shows the name and ids, pickling raises.
    Ciphertexts name the version that made them, so older versions still decrypt
    after a new one is added.
    """

    __slots__ = ("_current", "_name", "_versions")

    def __init__(self, name: str, keys: Mapping[int, Key] | Key) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError("a field key needs a non-empty name")
        if isinstance(keys, Key):
            keys = {keys.key_id: keys}
        if not keys:
            raise ValueError(f"field key {name!r} has no versions")
        for key_id, key in keys.items():
            if not isinstance(key, Key):
                raise TypeError(f"field key {name!r}: expected cryptdisk Keys")
            if not 0 <= key_id <= _MAX_FIELD_ID:
                raise ValueError(f"field key {name!r}: ids go from 0 to 2**32-1, not {key_id}")
        self._name = name
        self._versions = {i: _Version(k) for i, k in keys.items()}
        self._current = max(self._versions)

    @classmethod
    def generate(cls, name: str, key_id: int = 1) -> FieldKey:
        """A new random 256-bit field key (tests, demos)."""
        return cls(name, Key.generate(key_id))

    @property
    def name(self) -> str:
        return self._name

    @property
    def current_id(self) -> int:
        return self._current

    @property
    def ids(self) -> list[int]:
        return sorted(self._versions)

    def _version(self, key_id: int | None = None) -> _Version:
        if key_id is None:
            return self._versions[self._current]
        try:
            return self._versions[key_id]
        except KeyError:
            raise KeyNotFoundError(
                f"field key {self._name!r} has no version {key_id} (versions: "
                f"{', '.join(map(str, self.ids))})", key_id=key_id,
                hint="the value was encrypted under another key or a version that was "
                "removed from [fields.keys]") from None

    def named_version(self, version: int | None, what: str) -> _Version:
        """The version a function whose output names none (FF1, tokens, ``mask_hash``)
        computes under: ``version``, or the key's only one.

        On a key with several versions a missing ``version`` is a :class:`FieldError` (a
        guess would turn values made under another version into other characters, or
        hashes into ones that no longer match, without an error); an unknown one is a
        :class:`KeyNotFoundError`. Neither message holds key material.
        """
        if version is None:
            if len(self._versions) == 1:
                return self._versions[self._current]
            ids = ", ".join(map(str, self.ids))
            made = "hashes" if what == "mask_hash" else "FF1 values and tokens"
            raise FieldError(
                f"{what}: field key {self._name!r} has versions {ids}, and {made} do not "
                "name the version that made them: say which one (version := "
                f"{self._current} in SQL, version={self._current} in Python and in a "
                "protect rule)",
                hint=f"give the version the {made} you read or match were made with; new "
                f"ones may use the current one, {self._current}")
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"{what}: version is a key id (an int), not "
                            f"{type(version).__name__}")
        return self._version(version)

    def __repr__(self) -> str:
        return f"<FieldKey {self._name!r} ids={self.ids} current={self._current}>"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("field keys cannot be pickled (that would write key material); "
                        "pass the config path and the key's name instead")


class FieldKeys(Mapping[str, FieldKey]):
    """The field keys of a config, by name (``keys["cards"]``)."""

    def __init__(self, keys: Mapping[str, FieldKey] | None = None) -> None:
        self._keys = dict(keys or {})

    def __getitem__(self, name: str) -> FieldKey:
        try:
            return self._keys[name]
        except KeyError:
            known = ", ".join(sorted(self._keys)) or "none"
            raise KeyNotFoundError(f"no field key named {name!r} (field keys: {known})",
                                   hint="declare it as [fields.keys.NAME] in the config"
                                   ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"<FieldKeys {sorted(self._keys)}>"

    def __reduce__(self) -> Any:
        raise TypeError("field keys cannot be pickled; pass the config path instead")

    @classmethod
    def from_config(cls, path: str | os.PathLike[str], *,
                    at_rest: Iterable[Key] | None = None) -> FieldKeys:
        """The ``[fields.keys]`` of a TOML config (none if it has no ``[fields]``).

        A field key holding the material of an at-rest key is a :class:`ConfigError`:
        ``at_rest`` are those keys (a loaded config's :meth:`~cryptdisk.config.Config.
        cryptdisk_keys`); without it, the config's ``[keyring]`` and disks are loaded
        to find them when it has field keys and either section."""
        name = os.fspath(path)
        try:
            with open(name, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError("config file does not exist", path=name) from None
        except OSError as exc:
            raise ConfigError(f"cannot read config file: {exc.strerror}", path=name) from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"not valid TOML: {exc}", path=name) from None
        except UnicodeDecodeError:  # tomllib decodes the bytes first: a binary file
            raise ConfigError("not valid TOML: not UTF-8 text", path=name) from None
        keys = cls.from_mapping(data.get("fields"), path=name)
        if keys and at_rest is None and ("keyring" in data or "disks" in data):
            from ..config import load_config

            # loaded for the comparison alone: a provider-held key's session (PKCS#11,
            # KMIP) and unwrap cache are let go at once, also when the check fails (the
            # exception's traceback would otherwise keep them open)
            loaded = load_config(name).cryptdisk_keys()
            try:
                keys.check_apart(loaded, path=name)
            finally:
                for key in loaded:
                    close = getattr(key, "close", None)
                    if close is not None:
                        with contextlib.suppress(CryptdiskError):
                            close()
            return keys
        keys.check_apart(at_rest or (), path=name)
        return keys

    @staticmethod
    def key_files(path: str | os.PathLike[str]) -> tuple[str, ...]:
        """The key files the ``[fields.keys]`` of the config at ``path`` are read from
        (``file = ...``, as the ``file`` provider resolves them), for a process that
        follows them (:class:`._scanfns.FieldExtension`); none when the config does not
        parse (:meth:`from_config` says why)."""
        name = os.fspath(path)
        try:
            with open(name, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
            return ()
        fields = data.get("fields")
        specs = fields.get("keys") if isinstance(fields, Mapping) else None
        if not isinstance(specs, Mapping):
            return ()
        base = os.path.dirname(os.path.abspath(name))
        out = []
        for spec in specs.values():
            for entry in spec if isinstance(spec, list) else [spec]:
                value = entry.get("file") if isinstance(entry, Mapping) else None
                if isinstance(value, str) and value:
                    out.append(os.path.join(base, os.path.expanduser(value)))
        return tuple(out)

    def check_apart(self, at_rest: Iterable[Key], *, path: str | None = None) -> None:
        """Raise :class:`ConfigError` if a version of a field key has the material of one
        of the ``at_rest`` keys (compared in constant time; no message holds material)."""
        at_rest = list(at_rest)
        for name, fkey in self._keys.items():
            for key_id in fkey.ids:
                mine = fkey._versions[key_id]._key
                for other in at_rest:
                    if mine.same_material(other):
                        raise ConfigError(
                            f"field key {name!r} version {key_id} is the at-rest key "
                            f"{other.key_id} (the same material): a field key must be a key "
                            "of its own", path=path, where=f"[fields.keys.{name}]",
                            hint="make a separate one with 'cryptdisk keygen -o "
                            f"{name}.key' and name it in [fields.keys.{name}]")

    @classmethod
    def from_mapping(cls, section: Any, *, path: str | None = None) -> FieldKeys:
        """Build from a parsed ``[fields]`` table (see the module docstring)."""
        if section is None:
            return cls()
        if not isinstance(section, Mapping):
            raise ConfigError("[fields] must be a table", path=path, where="[fields]")
        unknown = set(section) - {"keys"}
        if unknown:
            raise ConfigError(f"unknown setting(s) in [fields]: {', '.join(sorted(unknown))}",
                              path=path, where="[fields]")
        specs = section.get("keys", {})
        if not isinstance(specs, Mapping):
            raise ConfigError("[fields.keys] must hold [fields.keys.NAME] tables", path=path,
                              where="[fields.keys]")
        base = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
        out: dict[str, FieldKey] = {}
        for kname, spec in specs.items():
            entries = spec if isinstance(spec, list) else [spec]
            versions: dict[int, Key] = {}
            for i, entry in enumerate(entries):
                where = (f"[[fields.keys.{kname}]] #{i + 1}" if isinstance(spec, list)
                         else f"[fields.keys.{kname}]")
                loaded = parse_key_entry(entry, path=path, where=where, base=base,
                                         default_id=None if isinstance(spec, list) else 1)
                if loaded.key_id > _MAX_FIELD_ID:
                    raise ConfigError(f"field key ids go from 0 to 2**32-1, not "
                                      f"{loaded.key_id}", path=path, where=where)
                if loaded.key_id in versions:
                    raise ConfigError(f"duplicate id {loaded.key_id} in field key {kname!r}",
                                      path=path, where=where)
                try:
                    versions[loaded.key_id] = Key(loaded.key_id, loaded.material,
                                                  source=loaded.source)
                except ValueError as exc:
                    raise with_location(exc, path, where) from None
            out[kname] = FieldKey(kname, versions)
        return cls(out)

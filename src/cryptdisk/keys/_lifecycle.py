"""The key lifecycle of a config's ``[keyring]``: add, promote, retire, destroy.

A key entry's state lives in the config itself, so the config stays the one place
that says which keys exist:

* *active* (no ``state`` field): loaded, reads the files under it;
* *current*: the active key ``current_key_id`` names; it wraps every new file;
* *retired* (``state = "retired"``): checked unused when it was retired and no longer
  loaded (its variable, file, token or server is not consulted);
* destroyed: its material is gone (key file deleted, token object or KMIP key
  destroyed) and its entry removed.

Every change is one edit of the config's text (comments and layout kept), checked by
parsing the result, which must equal the parsed old config with exactly that change,
and written crash-safe: a temporary file in the same directory, fsynced, renamed over
the config, the directory fsynced. A process killed at any point leaves the old config
or the new one. Whether any file still uses a key is the caller's check
(:func:`files_under_key` reads headers only).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from .._flocks import exclusive
from ..errors import (
    ConfigError,
    FormatError,
    KeyFileError,
    KeyringError,
    KeySourceError,
    NotEncryptedError,
)
from ..format import HEADER_SIZE, read_named_header
from ..format.clickhouse import (
    CH_HEADER_SIZE,
    CHHeader,
    clickhouse_fingerprint,
    clickhouse_v1_key_hash,
    is_clickhouse_header,
)
from ._audit import audit_event
from ._keyring import KEYRING_SETTINGS
from ._provider import (
    _SOURCES,
    RAW_PROVIDERS,
    get_key_provider,
    key_provider_names,
    parse_key_entry,
)
from ._rotate import iter_files

__all__ = ["KeyConfig", "KeyEntryState", "atomic_write_text", "files_under_key",
           "key_usage"]

STATES = ("active", "retired")


@dataclass(frozen=True)
class KeyEntryState:
    """One ``[[keyring.keys]]`` entry as the lifecycle sees it (no material)."""

    key_id: int
    state: str  # "current", "active" or "retired"
    source: str  # hex, env, file, command, or a provider name
    where: str  # the variable, file or provider reference (never material)


def atomic_write_text(path: str, text: str) -> None:
    """Replace ``path`` with ``text``: temporary file, fsync, rename, fsync of the directory.

    The file keeps the old file's mode (0600 for a new one). A process killed at any
    point leaves the old file or the new one (and at worst a stray ``.tmp`` file, which the
    next edit deletes).
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o600
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)
        data = text.encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


#: ``{key id: material, or None when it could not be loaded}`` of the keyring keys that could
#: key a ClickHouse disk (local ones), asked for the first time a ClickHouse file is met.
ClickHouseKeys = Callable[[], Mapping[int, bytes | None]]


def key_usage(paths: Iterable[str | os.PathLike[str]], *,
              clickhouse: ClickHouseKeys | None = None) -> dict[int | None, list[str]]:
    """Key id -> the encrypted files under ``paths`` that use it (headers only).

    cryptdisk files are counted by the key id in their header. Files in ClickHouse's
    format (a ``clickhouse`` disk's, whose data is encrypted with the key itself) are
    counted when ``clickhouse`` gives the keyring's keys: by the header's key
    fingerprint (version 2) or id and key hash (version 1); one that matches none of
    them is under a key outside the keyring (a disk's own) and not counted, unless a
    key's material could not be loaded to compare, when it may be that key's. Other
    files are left out; files whose header cannot be read or parsed (permissions,
    damage, a newer format) are under ``None``: any key may be theirs.
    """
    found: dict[int | None, list[str]] = {}
    match: Callable[[Any], tuple[bool, int | None]] | None = None
    for name in iter_files(paths):
        key_id: int | None
        try:
            fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC)
            try:
                # read again while it changes: a rewrap may be writing it (read_named_header)
                key_id = read_named_header(partial(os.pread, fd, HEADER_SIZE, 0), name).key_id
            except NotEncryptedError:
                if clickhouse is None:
                    continue
                head = os.pread(fd, CH_HEADER_SIZE, 0)
                if not is_clickhouse_header(head):
                    continue
                if match is None:
                    match = _clickhouse_matcher(clickhouse())
                counted, key_id = match(CHHeader.parse(head, name))
                if not counted:
                    continue
            finally:
                os.close(fd)
        except (FormatError, OSError, ValueError):
            key_id = None
        found.setdefault(key_id, []).append(name)
    return found


def _clickhouse_matcher(keys: Mapping[int, bytes | None],
                        ) -> Callable[[Any], tuple[bool, int | None]]:
    """(counted, key id) of a ClickHouse header among ``keys``."""
    by_fp = {clickhouse_fingerprint(m): i for i, m in keys.items() if m is not None}
    by_v1 = {(i, clickhouse_v1_key_hash(m)): i for i, m in keys.items() if m is not None}
    unknown = any(m is None for m in keys.values())

    def match(header: Any) -> tuple[bool, int | None]:
        if header.version == 2 and header.key_fingerprint in by_fp:
            return True, by_fp[header.key_fingerprint]
        if header.version == 1 and (header.key_id, header.v1_key_hash) in by_v1:
            return True, by_v1[(header.key_id, header.v1_key_hash)]
        return unknown, None
    return match


def files_under_key(paths: Iterable[str | os.PathLike[str]], key_id: int, *,
                    clickhouse: ClickHouseKeys | None = None) -> list[str]:
    """The encrypted files under ``paths`` that use key ``key_id`` (see :func:`key_usage`),
    and those that might (marked so)."""
    usage = key_usage(paths, clickhouse=clickhouse)
    return usage.get(key_id, []) + [f"{p} (header unreadable or key unknown)"
                                    for p in usage.get(None, [])]


# -- TOML text edits ------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*\[")
_KEYRING = re.compile(r"^\s*\[\s*keyring\s*\]\s*(#.*)?$")
_KEYS = re.compile(r"^\s*\[\[\s*keyring\s*\.\s*keys\s*\]\]\s*(#.*)?$")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {type(value).__name__} values into a key entry")


def _spans(lines: list[str], pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    """(first, end) line ranges of every table whose header matches ``pattern``."""
    spans = []
    for i, line in enumerate(lines):
        if pattern.match(line):
            end = i + 1
            while end < len(lines) and not _HEADER.match(lines[end]):
                end += 1
            while end > i + 1 and not lines[end - 1].strip():  # leave blank lines after it
                end -= 1
            spans.append((i, end))
    return spans


class _Stale(Exception):
    """The config file changed since this KeyConfig read it (another process edited it)."""


_F = TypeVar("_F", bound=Callable[..., Any])

#: how many times an edit is redone on a config that other processes keep changing
_EDIT_ATTEMPTS = 20


def _edit(method: _F) -> _F:
    """Make an edit of the config safe beside other processes editing it (two ``cryptdisk
    keys add`` at once): if the file changed since it was read, it is read again and the
    edit (its checks included) is made again on what is there now, so no process's edit
    is lost and none is made on a state that no longer holds."""
    @functools.wraps(method)
    def edit(self: KeyConfig, *args: Any, **kwargs: Any) -> Any:
        for _ in range(_EDIT_ATTEMPTS):
            try:
                return method(self, *args, **kwargs)
            except _Stale:
                self._read()
        raise ConfigError("other processes kept changing the config during this edit; it is "
                          "unchanged by it", path=self.path, hint="run the command again")
    return edit  # type: ignore[return-value]


def _remove_killed_temps(path: str) -> None:
    """Delete the temporary files of edits of ``path`` that were killed (:func:`atomic_write_text`
    names them ``.NAME.PID.tmp``): called under the edit lock, so no live edit owns one. They
    hold the config's text, a ``hex`` key's material too, which a destroy must not leave."""
    directory, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(rf"\.{re.escape(name)}\.[0-9]+\.tmp")
    for entry in os.listdir(directory):
        if pattern.fullmatch(entry):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, entry))


@contextlib.contextmanager
def _edit_lock(path: str) -> Any:
    """An exclusive lock serialising the edits of the configs of ``path``'s directory (a
    ``flock`` of the directory: the config itself is replaced by each edit, and a lock file
    would be one more file beside it)."""
    with exclusive(os.path.dirname(os.path.abspath(path))):  # (closed in a forked child)
        yield


class KeyConfig:
    """The ``[keyring]`` of a TOML config file, read now, and the lifecycle's edits of it.

    Edits (:meth:`add`, :meth:`promote`, :meth:`retire`, :meth:`destroy`) by several
    processes at once are serialised: each is made on the file as it is when it writes.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.base = os.path.dirname(os.path.abspath(self.path))
        self._read()

    def _read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                self.text = f.read().decode("utf-8")
        except FileNotFoundError:
            raise ConfigError("config file does not exist", path=self.path) from None
        except UnicodeDecodeError:
            raise ConfigError("not UTF-8 text", path=self.path) from None
        if self.path.endswith(".xml") or self.text.lstrip().startswith("<"):
            raise ConfigError("the key lifecycle edits the [keyring] of a TOML config; a "
                              "ClickHouse XML config's keys are its disks' and edited by hand",
                              path=self.path, hint="see docs/keys-lifecycle.md")
        try:
            self.data = tomllib.loads(self.text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"not valid TOML: {exc}", path=self.path) from None
        ring = self.data.get("keyring")
        if not isinstance(ring, dict) or not isinstance(ring.get("keys"), list):
            raise ConfigError("no [keyring] with [[keyring.keys]] entries", path=self.path)
        unknown = set(ring) - KEYRING_SETTINGS  # a typo is not an absent setting
        if unknown:
            raise ConfigError(f"unknown setting(s) in [keyring]: {', '.join(sorted(unknown))}",
                              path=self.path, where="[keyring]")
        for number, entry in enumerate(ring["keys"], 1):
            _check_entry_fields(entry, self.path, f"[[keyring.keys]] #{number}")

    # -- reading ---------------------------------------------------------------------

    @property
    def _entries(self) -> list[dict[str, Any]]:
        return self.data["keyring"]["keys"]  # type: ignore[no-any-return]

    @property
    def current_key_id(self) -> int | None:
        current = self.data["keyring"].get("current_key_id")
        live = [e for e in self._entries if e.get("state", "active") != "retired"]
        if current is None and len(live) == 1:
            current = live[0].get("id")
        return current if isinstance(current, int) else None

    def _index(self, key_id: int) -> int:
        for i, entry in enumerate(self._entries):
            if entry.get("id") == key_id:
                return i
        known = ", ".join(str(e.get("id")) for e in self._entries)
        raise KeyringError(f"{self.path}: no key with id {key_id} in [keyring] (keys: {known})")

    def has(self, key_id: int) -> bool:
        return any(e.get("id") == key_id for e in self._entries)

    def has_entry(self, entry: Mapping[str, Any]) -> bool:
        """True when an entry equal to ``entry`` is there (an add already done)."""
        return any(e == dict(entry) for e in self._entries)

    def entry(self, key_id: int) -> dict[str, Any]:
        return dict(self._entries[self._index(key_id)])

    def state(self, key_id: int) -> str:
        entry = self.entry(key_id)
        if entry.get("state", "active") == "retired":
            return "retired"
        return "current" if key_id == self.current_key_id else "active"

    def states(self) -> list[KeyEntryState]:
        out = []
        for entry in self._entries:
            key_id = entry.get("id")
            if not isinstance(key_id, int):
                continue
            source, where = _describe_entry(entry)
            out.append(KeyEntryState(key_id, self.state(key_id), source, where))
        return sorted(out, key=lambda s: s.key_id)

    def unknown_sources(self) -> list[str]:
        """What is wrong with each ``source = "NAME"`` entry that names no provider: the
        error loading the config would give, for a listing that loads no key."""
        names = set(key_provider_names())
        return [f"key {e.get('id')}: unknown source {e['source']!r} (sources: "
                f"{', '.join(sorted(_SOURCES))})" for e in self._entries
                if "source" in e and not (isinstance(e["source"], str) and e["source"] in names)]

    def local_materials(self) -> dict[int, bytes | None]:
        """The material of every local (not provider-held) key entry, retired ones too,
        for telling which key a ClickHouse-format file uses; None for one that does not
        load now (an unset variable, a missing file, a failing command)."""
        out: dict[int, bytes | None] = {}
        for entry in self._entries:
            key_id = entry.get("id")
            if not isinstance(key_id, int) or "source" in entry:
                continue
            spec = {k: v for k, v in entry.items() if k not in ("state", "algorithm")}
            try:
                out[key_id] = parse_key_entry(spec, path=self.path, where="", base=self.base,
                                              sizes=(16, 24, 32)).material
            except (KeyringError, ConfigError):
                out[key_id] = None
        return out

    # -- edits -----------------------------------------------------------------------

    def _write(self, text: str, expected: dict[str, Any], what: str) -> None:
        try:
            got = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            got = None
        if got != expected:
            raise ConfigError(
                f"cannot {what} by editing the config's text safely (its [keyring] is laid "
                "out in a way this edit does not handle); the config is unchanged",
                path=self.path, hint="make the change by hand (see docs/keys-lifecycle.md) "
                "or write the keys as [[keyring.keys]] tables")
        with _edit_lock(self.path):
            try:
                with open(self.path, "rb") as f:
                    now: str | None = f.read().decode("utf-8", "replace")
            except FileNotFoundError:
                now = None
            if now != self.text:
                raise _Stale()
            atomic_write_text(self.path, text)
            _remove_killed_temps(self.path)
        self._read()

    def _lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    @staticmethod
    def _join(lines: list[str]) -> str:
        text = "".join(lines)
        return text if text.endswith("\n") else text + "\n"

    @_edit
    def add(self, entry: Mapping[str, Any], *,
            check: Callable[[Mapping[str, Any]], None] | None = None) -> None:
        """Append a ``[[keyring.keys]]`` entry (an active key, not current).

        The entry is loaded first (its variable read, its provider connected), so a
        key that cannot be used is never written into the config.
        """
        key_id = entry.get("id")
        if not isinstance(key_id, int) or isinstance(key_id, bool) or key_id < 0:
            raise ConfigError("a new key needs an integer id", path=self.path)
        if any(e.get("id") == key_id for e in self._entries):
            raise KeyringError(f"{self.path}: [keyring] already has a key with id {key_id}",
                               hint="choose an unused id (cryptdisk keys list)")
        (check or self._check_loads)(entry)
        lines = self._lines()
        body = "[[keyring.keys]]\n" + "".join(f"{k} = {_toml_value(v)}\n"
                                              for k, v in entry.items())
        spans = _spans(lines, _KEYS)
        if spans:
            at = spans[-1][1]
            if lines and at > 0 and not lines[at - 1].endswith("\n"):
                lines[at - 1] += "\n"
            lines[at:at] = ["\n", body]
        else:
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            lines += ["\n", body]
        expected = copy.deepcopy(self.data)
        expected["keyring"]["keys"].append(dict(entry))
        self._write(self._join(lines), expected, f"add key {key_id}")
        audit_event("add", key_id, config=self.path, source=_describe_entry(entry)[0])

    def _check_loads(self, entry: Mapping[str, Any]) -> None:
        entry = {k: v for k, v in entry.items() if k != "state"}
        loaded = parse_key_entry(entry, path=self.path, where=f"key {entry.get('id')}",
                                 base=self.base, algorithm_field=True,
                                 default_algorithm=self.data["keyring"].get("algorithm"))
        if loaded.key is not None:
            loaded.key.close()

    @_edit
    def promote(self, key_id: int) -> bool:
        """Make key ``key_id`` current (``current_key_id``); False when it already was."""
        if self.state(key_id) == "retired":
            raise KeyringError(f"{self.path}: key {key_id} is retired; add a new key instead of "
                               "promoting a retired one")
        if self.data["keyring"].get("current_key_id") == key_id:
            return False
        self._check_loads(self.entry(key_id))
        lines = self._lines()
        ring = _spans(lines, _KEYRING)
        line = f"current_key_id = {key_id}\n"
        if ring:
            first, end = ring[0]
            for i in range(first + 1, end):
                found = re.match(r"^(\s*current_key_id\s*=\s*)[0-9_]+(.*)$", lines[i],
                                 re.DOTALL)
                if found:
                    lines[i] = f"{found.group(1)}{key_id}{found.group(2)}"
                    break
                if re.match(r"^\s*current_key_id\s*=", lines[i]):
                    lines[i] = line
                    break
            else:
                lines.insert(first + 1, line)
        else:
            keys = _spans(lines, _KEYS)
            at = keys[0][0] if keys else len(lines)
            lines[at:at] = ["[keyring]\n", line, "\n"]
        expected = copy.deepcopy(self.data)
        expected["keyring"]["current_key_id"] = key_id
        old = self.current_key_id
        self._write(self._join(lines), expected, f"make key {key_id} current")
        audit_event("promote", key_id, config=self.path, previous=old)
        return True

    def _check_no_disk_names(self, key_id: int) -> None:
        """Refuse a key a disk of the config names: its ``names_key_id`` (the key its names
        key derives from, for the disk's life: without it no name on that disk reads), its
        ``current_key_id``, or an id in its ``keys`` (the config would no longer load)."""
        disks = self.data.get("disks")
        for name, spec in disks.items() if isinstance(disks, dict) else ():
            if not isinstance(spec, dict):
                continue
            keys = spec.get("keys")
            listed = isinstance(keys, list) and any(
                type(entry) is int and entry == key_id for entry in keys)
            if not listed and keys is not None:
                continue  # (the disk's own [[disks.NAME.keys]] by that id, not the keyring's)
            if spec.get("encrypt_names") is True and spec.get("names_key_id") == key_id:
                raise KeyringError(
                    f"{self.path}: key {key_id} is the names key (names_key_id) of disk "
                    f"{name!r}: the names of its files read with that key only, whatever key "
                    "their headers are under", hint="copy the files to a disk with another "
                    "names_key_id first; the key stays while the disk holds files")
            if listed or spec.get("current_key_id") == key_id:
                setting = "keys" if listed else "current_key_id"
                raise KeyringError(
                    f"{self.path}: disk {name!r} names key {key_id} in its {setting}: the "
                    "config would not load without it",
                    hint=f"take key {key_id} out of [disks.{name}] once none of its files "
                    "uses it, then retire it")

    def _set_state(self, key_id: int, state: str) -> None:
        index = self._index(key_id)
        lines = self._lines()
        spans = _spans(lines, _KEYS)
        if len(spans) != len(self._entries):
            raise ConfigError("the keys of [keyring] are not all [[keyring.keys]] tables; "
                              f"set state = {state!r} on key {key_id} by hand", path=self.path)
        first, end = spans[index]
        line = f'state = "{state}"\n'
        for i in range(first + 1, end):
            if re.match(r"^\s*state\s*=", lines[i]):
                lines[i] = line
                break
        else:
            lines.insert(first + 1, line)
        expected = copy.deepcopy(self.data)
        expected["keyring"]["keys"][index]["state"] = state
        self._write(self._join(lines), expected, f"set key {key_id}'s state")

    @_edit
    def retire(self, key_id: int) -> bool:
        """Mark key ``key_id`` retired; False when it already was. The caller checked usage."""
        state = self.state(key_id)
        if state == "current":
            raise KeyringError(f"{self.path}: key {key_id} is the current key; promote another "
                               "key and rewrap the files to it first")
        if state == "retired":
            return False
        self._check_no_disk_names(key_id)
        self._set_state(key_id, "retired")
        audit_event("retire", key_id, config=self.path)
        return True

    @_edit
    def destroy(self, key_id: int) -> list[str]:
        """Destroy a retired key's material, then remove its entry; what was done, in words.

        Material cryptdisk cannot reach (an environment variable, a command's secret
        store) raises :class:`KeySourceError` *after* the entry is removed, saying so.
        Resumable: material already gone counts as destroyed.
        """
        if self.state(key_id) != "retired":
            raise KeyringError(f"{self.path}: key {key_id} is not retired; retire it first "
                               f"(cryptdisk keys retire {key_id}), which checks no file "
                               "uses it")
        self._check_no_disk_names(key_id)
        entry = self.entry(key_id)
        done, left = _destroy_material(entry, self.base)
        index = self._index(key_id)
        lines = self._lines()
        spans = _spans(lines, _KEYS)
        if len(spans) != len(self._entries):
            raise ConfigError("the keys of [keyring] are not all [[keyring.keys]] tables; "
                              f"remove key {key_id} by hand", path=self.path)
        first, end = spans[index]
        while end < len(lines) and not lines[end].strip():
            end += 1
        del lines[first:end]
        expected = copy.deepcopy(self.data)
        del expected["keyring"]["keys"][index]
        self._write(self._join(lines), expected, f"remove key {key_id}")
        done.append(f"removed key {key_id}'s entry from {self.path}")
        audit_event("destroy", key_id, config=self.path, source=_describe_entry(entry)[0],
                    material_left=left or None)
        if left:
            raise KeySourceError(f"key {key_id}: {left}; cryptdisk removed its entry but "
                                 "cannot destroy the material there",
                                 hint="destroy it where it is kept")
        return done


def _check_entry_fields(entry: Any, path: str, where: str) -> None:
    """Refuse a key entry with a field the keyring does not take, or without its one key
    source, as loading the keyring does (:func:`parse_key_entry`), without loading it (a
    listing reads no variable and calls no provider). A ``source = ...`` entry's fields
    are its provider's, checked when it loads."""
    if not isinstance(entry, Mapping):
        raise ConfigError("a key entry must be a table", path=path, where=where)
    if "source" in entry:
        return
    providers = [n for n in key_provider_names() if n not in RAW_PROVIDERS and n not in _SOURCES]
    fields = {"id", "source", "state", "algorithm", *providers}
    unknown = set(entry) - fields
    if unknown:
        raise ConfigError(f"unknown field(s) {', '.join(sorted(unknown))} in a key entry "
                          f"(fields: {', '.join(sorted(fields))})", path=path, where=where)
    chosen = [n for n in providers if n in entry]
    if len(chosen) != 1:
        raise ConfigError(f"key {entry.get('id')} needs exactly one of {', '.join(providers)} "
                          f"(found {', '.join(chosen) or 'none'})", path=path, where=where)


def _describe_entry(entry: Mapping[str, Any]) -> tuple[str, str]:
    """(source, where) of an entry, for listings: never material."""
    if "source" in entry:
        name = str(entry["source"])
        ref = {k: v for k, v in entry.items() if k in ("token", "key", "kms_key", "host",
                                                        "port", "wrapped_key")}
        return name, " ".join(f"{k}={v}" for k, v in ref.items())
    for field_name, label in (("file", "file"), ("from_env", "env"), ("command", "command"),
                              ("hex", "hex")):
        if field_name in entry:
            if field_name == "hex":
                return label, "(in the config)"
            value = entry[field_name]
            return label, " ".join(value) if isinstance(value, list) else str(value)
    return "?", ""


def _destroy_material(entry: Mapping[str, Any], base: str) -> tuple[list[str], str]:
    """Destroy what cryptdisk can reach: (what was done, what it could not do or "")."""
    key_id = entry.get("id")
    if "source" in entry:
        from ._remote import RemoteKeyProvider, RetryPolicy

        cls = get_key_provider(str(entry["source"]))
        if not issubclass(cls, RemoteKeyProvider):  # pragma: no cover - the parser refuses
            raise ConfigError(f"key {key_id}: {entry['source']} is not a source")
        rest = {k: v for k, v in entry.items()
                if k not in ("id", "source", "algorithm", "state", "cache_entries",
                             "cache_seconds", "retries", "retry_seconds")}
        retry_args = {arg: entry[name] for name, arg in (("retries", "retries"),
                                                         ("retry_seconds", "seconds"))
                      if name in entry}
        try:
            retry = RetryPolicy(**retry_args)
        except ValueError as exc:
            raise ConfigError(f"key {key_id}: {exc}") from None
        from ._kek import wrapped_provider

        provider = wrapped_provider(cls, rest, base)
        try:  # as loading: a provider that does not answer is tried again (destroy resumes)
            return [retry.call("destroy", int(key_id or 0),
                               lambda: provider.destroy(f"key {key_id}"))], ""
        finally:
            provider.close()
    if "file" in entry:
        path = os.path.join(base, os.path.expanduser(str(entry["file"])))
        try:
            os.unlink(path)
        except FileNotFoundError:
            return [f"key file {path} was already gone"], ""
        except OSError as exc:
            raise KeyFileError(f"key {key_id}: cannot delete key file {path}: "
                               f"{exc.strerror}") from None
        _sync_dir(os.path.dirname(path))
        return [f"deleted key file {path}"], ""
    if "hex" in entry:
        return ["its material was in the config entry itself"], ""
    if "from_env" in entry:
        return [], f"its material is in environment variable {entry['from_env']}"
    if "command" in entry:
        return [], "its material is wherever its command reads it from"
    return [], "its material is in a source cryptdisk does not know"


def _sync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

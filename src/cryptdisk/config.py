"""Loading a cryptdisk config: keys, disks and storage policies.

One file defines everything, in TOML or as ClickHouse's ``storage_configuration``
XML (accepted unchanged; a path ending in ``.xml`` or text starting with ``<``)::

    [keyring]                       # optional; see cryptdisk.keys.Keyring
    current_key_id = 1
    [[keyring.keys]]
    id = 1
    from_env = "CRYPTDISK_KEY_1"

    [disks.raw]
    type = "local"                  # path: relative to this file
    path = "data"

    [disks.bucket]
    type = "fsspec"                 # any fsspec URL; no secrets in storage_options
    url = "s3://bucket/prefix"
    storage_options = { endpoint_url = "http://127.0.0.1:9000" }

    [disks.secure]
    type = "encrypted"              # cryptdisk's authenticated format over another disk
    disk = "raw"
    path = "secure/"
    algorithm = "aes-256-gcm"
    keys = [1]                      # ids from [keyring], or [[disks.secure.keys]] entries
    segment_size = 65536
    cache_mb = 256                  # cache of decrypted reads, in memory (0: off)
    encrypt_names = false           # true: file and directory names encrypted (AES-SIV)
    # names_key_id = 1              # with encrypt_names: the key the names key derives from

    [disks.ch]
    type = "clickhouse"             # ClickHouse's AES-CTR encrypted-disk format
    disk = "raw"
    path = "ch/"
    algorithm = "AES_128_CTR"
    current_key_id = 0
    [[disks.ch.keys]]
    id = 0
    hex = "00112233445566778899aabbccddeeff"   # or from_env, file, raw (ClickHouse <key>)

    [policies.hot_cold]
    [[policies.hot_cold.volumes]]
    name = "main"
    disks = ["secure"]

As in ClickHouse, a disk named ``default`` always exists (when the config does
not define one it is a ``local`` disk at ``data/`` next to the config file,
created on first write), and so does a policy named ``default`` (one volume
holding the ``default`` disk). Every error names the config file and the line
(TOML) or element (XML) at fault.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .disks import (
    DISK_TYPES,
    ClickHouseDisk,
    ClickHouseKey,
    Disk,
    EncryptedDisk,
    LocalDisk,
    StoragePolicy,
    Volume,
)
from .errors import ConfigError, KeyringError, PolicyError, with_location
from .keys import Key, Keyring, closed_on_error, parse_key_entry, shown_value

__all__ = ["Config", "load_config"]

_TOP = {"keyring", "disks", "policies", "server", "fields"}  # [server], [fields]: read by
# cryptdisk.server and cryptdisk.fields


@dataclass
class Config:
    """A loaded config: keyring (may be None), disks and policies by name, and its path."""

    path: str
    keyring: Keyring | None
    disks: dict[str, Disk] = field(default_factory=dict)
    policies: dict[str, StoragePolicy] = field(default_factory=dict)
    #: True when the config declares no ``default`` policy and the implicit one
    #: (the plain ``default`` disk) stands in; the database refuses to use it.
    default_policy_implied: bool = False

    def disk(self, name: str) -> Disk:
        try:
            return self.disks[name]
        except KeyError:
            raise PolicyError(f"no disk named {name!r} in {self.path} (disks: "
                              f"{', '.join(sorted(self.disks))})") from None

    def policy(self, name: str) -> StoragePolicy:
        try:
            return self.policies[name]
        except KeyError:
            raise PolicyError(f"no storage policy named {name!r} in {self.path} (policies: "
                              f"{', '.join(sorted(self.policies))})") from None

    def cryptdisk_keys(self) -> list[Key]:
        """Every cryptdisk key the config knows (keyring and encrypted disks)."""
        seen: dict[tuple[int, bytes], Key] = {}
        rings = [self.keyring] if self.keyring else []
        rings += [d.keyring for d in self.disks.values() if isinstance(d, EncryptedDisk)]
        for ring in rings:
            for key in ring:
                seen.setdefault((key.key_id, key.check_value), key)
        return list(seen.values())

    def clickhouse_keys(self) -> list[ClickHouseKey]:
        """Every ClickHouse key of every ``clickhouse`` disk."""
        out: list[ClickHouseKey] = []
        for d in self.disks.values():
            if isinstance(d, ClickHouseDisk):
                out.extend(d.keys.values())
        return out

    def __repr__(self) -> str:
        return f"<Config {self.path!r} disks={sorted(self.disks)} policies={sorted(self.policies)}>"

    def __reduce__(self) -> Any:
        raise TypeError("a Config holds keys and cannot be pickled; load it again by path")


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load a TOML or ClickHouse XML config (see the module docstring)."""
    name = os.path.abspath(os.fspath(path))
    try:
        with open(name, "rb") as f:
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise ConfigError("config file does not exist", path=name) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", path=name) from None
    if name.endswith(".xml") or text.lstrip().startswith("<"):
        from .disks import parse_clickhouse_storage_xml

        data = parse_clickhouse_storage_xml(name)
        with closed_on_error():  # provider-held keys made before a failure: closed
            return _Builder(name, "", data, xml=True).build()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", path=name) from None
    with closed_on_error():  # provider-held keys made before a failure: closed
        return _Builder(name, text, data, xml=False).build()


class _Builder:
    def __init__(self, path: str, text: str, data: Mapping[str, Any], *, xml: bool) -> None:
        self.path = path
        self.text = text
        self.data = data
        self.xml = xml
        self.base = os.path.dirname(path)
        self.specs: Mapping[str, Any] = {}
        self.disks: dict[str, Disk] = {}
        self.building: list[str] = []
        self.keyring: Keyring | None = None

    def error(self, message: str, where: str, hint: str | None = None) -> ConfigError:
        return ConfigError(message, path=self.path, where=where, hint=hint)

    def where(self, table: str) -> str:
        """``line N ([table])`` in TOML, the element path in XML."""
        if self.xml:
            parts = table.split(".")
            if parts[0] == "disks":
                return "<storage_configuration><disks><" + "><".join(parts[1:]) + ">"
            if parts[0] == "policies":
                return "<storage_configuration><policies><" + "><".join(parts[1:]) + ">"
            return "<" + "><".join(parts) + ">"
        pattern = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(
            f'(?:{re.escape(p)}|"{re.escape(p)}")' for p in table.split(".")) + r"\s*\]")
        for number, line in enumerate(self.text.splitlines(), 1):
            if pattern.match(line):
                return f"line {number} ([{table}])"
        return f"[{table}]"

    def entry_where(self, table: str, index: int) -> str:
        if self.xml:
            return self.where(table) + f" #{index + 1}"
        pattern = re.compile(r"^\s*\[\[\s*" + r"\s*\.\s*".join(
            f'(?:{re.escape(p)}|"{re.escape(p)}")' for p in table.split(".")) + r"\s*\]\]")
        seen = -1
        for number, line in enumerate(self.text.splitlines(), 1):
            if pattern.match(line):
                seen += 1
                if seen == index:
                    return f"line {number} ([[{table}]] #{index + 1})"
        return f"[[{table}]] #{index + 1}"

    # -- top level -----------------------------------------------------------------

    def build(self) -> Config:
        unknown = set(self.data) - _TOP
        if unknown:
            raise self.error(f"unknown section(s) {', '.join(sorted(unknown))} "
                             f"(known: {', '.join(sorted(_TOP))})", "top level")
        if "keyring" in self.data:
            try:
                self.keyring = Keyring.from_mapping(self.data["keyring"], path=self.path,
                                                    text=self.text)
            except ValueError as exc:
                if isinstance(exc, ConfigError):
                    raise
                raise with_location(exc, self.path, self.where("keyring")) from None
        specs = self.data.get("disks", {})
        if not isinstance(specs, Mapping):
            raise self.error("disks must be a table of [disks.NAME] sections", "[disks]")
        self.specs = specs
        for name in specs:
            self.disk(name, "[disks]")
        if "default" not in self.disks:
            self.disks["default"] = LocalDisk("default", os.path.join(self.base, "data"))
        declared = self.data.get("policies", {})
        policies = self.policies()
        implied = not (isinstance(declared, Mapping) and "default" in declared)
        return Config(self.path, self.keyring, dict(self.disks), policies,
                      default_policy_implied=implied)

    # -- disks ---------------------------------------------------------------------

    def disk(self, name: str, referrer: str) -> Disk:
        if name in self.disks:
            return self.disks[name]
        if name not in self.specs:
            if name == "default":
                self.disks["default"] = LocalDisk("default", os.path.join(self.base, "data"))
                return self.disks["default"]
            raise self.error(f"unknown disk {name!r} (disks: "
                             f"{', '.join(sorted(self.specs)) or 'none'})", referrer)
        where = self.where(f"disks.{name}")
        if name in self.building:
            raise self.error(f"disk {name!r} wraps itself ({' -> '.join(self.building)} -> "
                             f"{name})", where)
        spec = self.specs[name]
        if not isinstance(spec, Mapping):
            raise self.error(f"disk {name!r} must be a table", where)
        kind = spec.get("type")
        cls = DISK_TYPES.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise self.error(f"disk {name!r} has unknown type {kind!r} (types: "
                             f"{', '.join(sorted(DISK_TYPES))})", where)
        settings = cls.config_settings
        unknown = set(spec) - settings
        if unknown:
            raise self.error(f"unknown setting(s) {', '.join(sorted(unknown))} for a {kind} "
                             f"disk (settings: {', '.join(sorted(settings))})", where)
        self.building.append(name)
        try:
            disk = cls.from_config(name, spec, where, self)
        except (ConfigError, KeyringError):
            raise
        except ValueError as exc:
            raise self.error(f"disk {name!r}: {exc}", where) from None
        finally:
            self.building.pop()
        self.disks[name] = disk
        return disk

    # -- what a disk type's from_config asks (cryptdisk.disks.DiskConfig) ---------------

    def string(self, spec: Mapping[str, Any], key: str, where: str,
               default: str | None = None) -> str:
        value = spec.get(key, default)
        if value is None:
            raise self.error(f"missing setting {key!r}", where)
        if not isinstance(value, str):
            raise self.error(f"{key} must be a string", where)
        return value

    # -- keys ----------------------------------------------------------------------

    def key_entries(self, name: str, spec: Mapping[str, Any], where: str,
                    sizes: tuple[int, ...]) -> list[tuple[int, str, bytes | Key]]:
        entries = spec.get("keys")
        if entries is None:
            if self.keyring is None:
                raise self.error(f"disk {name!r} has no keys and the config has no [keyring]",
                                 where, "add keys = [ID, ...] and a [keyring], or "
                                 f"[[disks.{name}.keys]] entries")
            entries = self.keyring.ids
        if not isinstance(entries, list) or not entries:
            raise self.error(f"disk {name!r}: keys must be a non-empty list", where)
        out: list[tuple[int, str, bytes | Key]] = []
        seen: dict[int, str] = {}
        for index, entry in enumerate(entries):
            at = self.entry_where(f"disks.{name}.keys", index) if isinstance(
                entry, Mapping) else where
            if isinstance(entry, int) and not isinstance(entry, bool):
                if self.keyring is None or entry not in self.keyring:
                    known = ", ".join(map(str, self.keyring.ids)) if self.keyring else "none"
                    raise self.error(f"disk {name!r} uses key id {entry}, which [keyring] does "
                                     f"not define (ids: {known})", where)
                item: tuple[int, str, bytes | Key] = (entry, "keyring",
                                                      self.keyring.key_by_id(entry))
            elif isinstance(entry, Mapping):
                item = self._key_entry(entry, sizes, at)
            else:
                raise self.error(f"disk {name!r}: a key is a keyring id or a table", where)
            if item[0] in seen:
                raise self.error(f"duplicate key id {item[0]} (first at {seen[item[0]]})", at)
            seen[item[0]] = at
            out.append(item)
        return out

    def _key_entry(self, entry: Mapping[str, Any], sizes: tuple[int, ...],
                   at: str) -> tuple[int, str, bytes | Key]:
        loaded = parse_key_entry(entry, path=self.path, where=at, base=self.base, sizes=sizes,
                                 default_id=0, exclude=())
        return loaded.key_id, loaded.source, loaded.key or loaded.material

    def current_key_id(self, name: str, spec: Mapping[str, Any], where: str,
                       ids: list[int]) -> int:
        current = spec.get("current_key_id")
        if current is None:
            if self.keyring is not None and self.keyring.current_key_id in ids:
                return self.keyring.current_key_id
            if len(ids) == 1:
                return ids[0]
            raise self.error(f"disk {name!r} has several keys; set current_key_id", where)
        if not isinstance(current, int) or current not in ids:
            raise self.error(f"disk {name!r}: current_key_id = {shown_value(current)} is not one "
                             f"of its key ids ({', '.join(map(str, ids))})", where)
        return current

    # -- policies ------------------------------------------------------------------

    def policies(self) -> dict[str, StoragePolicy]:
        specs = self.data.get("policies", {})
        if not isinstance(specs, Mapping):
            raise self.error("policies must be a table of [policies.NAME] sections",
                             "[policies]")
        out: dict[str, StoragePolicy] = {}
        for pname, pspec in specs.items():
            where = self.where(f"policies.{pname}")
            if not isinstance(pspec, Mapping) or set(pspec) - {"volumes"}:
                raise self.error(f"policy {pname!r} takes only volumes", where)
            vols = pspec.get("volumes")
            if not isinstance(vols, list) or not vols:
                raise self.error(f"policy {pname!r} has no volumes", where,
                                 f"add [[policies.{pname}.volumes]] with name and disks")
            volumes = []
            for index, vspec in enumerate(vols):
                at = self.entry_where(f"policies.{pname}.volumes", index)
                volumes.append(self._volume(vspec, index, at))
            out[pname] = StoragePolicy(pname, volumes)
        if "default" not in out:
            out["default"] = StoragePolicy("default", [Volume("default",
                                                              [self.disks["default"]])])
        return out

    def _volume(self, vspec: Any, index: int, at: str) -> Volume:
        if not isinstance(vspec, Mapping):
            raise self.error("a volume must be a table", at)
        unknown = set(vspec) - {"name", "disks"}
        if unknown:
            raise self.error(f"unknown setting(s) {', '.join(sorted(unknown))} in a volume "
                             "(settings: name, disks)", at)
        names = vspec.get("disks")
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise self.error("a volume needs disks = [\"NAME\", ...]", at)
        return Volume(str(vspec.get("name", f"volume{index + 1}")),
                      [self.disk(n, at) for n in names])

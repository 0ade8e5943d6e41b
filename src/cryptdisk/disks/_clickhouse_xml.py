"""ClickHouse ``storage_configuration`` XML, read into the shape of cryptdisk's TOML config.

:func:`parse_clickhouse_storage_xml` returns what ``tomllib`` would return for
the equivalent TOML, so the one config loader accepts either file::

    <disks><NAME><type>local</type><path>/dir/</path></NAME>     [disks.NAME] type = "local"
    <disks><NAME>  (no <type>)                                   ... a local disk too
    <disks><NAME><type>encrypted</type>                          [disks.NAME] type = "clickhouse"
        <disk>OTHER</disk> <path>prefix/</path>                    disk, path
        <algorithm>aes_128_ctr</algorithm>                         algorithm = "AES_128_CTR"
        <key_hex id="N">hex</key_hex>                              [[disks.NAME.keys]] id, hex
        <key id="N">16 chars</key>                                 ... id, raw
        <key_hex id="N" from_env="VAR"/>                           ... id, from_env
        <key id="N" from_env="VAR"/>                               ... id, raw_from_env
        <current_key_id>N</current_key_id>                         current_key_id = N
        (or <current_key>, <current_key_hex>: matched to a key's id)
    <policies><P><volumes><V><disk>d</disk>...                   [[policies.P.volumes]]
                                                                 name = "V", disks = [...]

As in ClickHouse, a single key without an ``id`` gets id 0; several keys
without ids get the ids after the largest explicit one (ClickHouse finds keys
by fingerprint, so the ids only name them). As in ClickHouse, a disk needs
``<current_key_id>`` (or ``<current_key>``/``<current_key_hex>``) unless its
only key has id 0. Settings ClickHouse reads that cryptdisk has no use for
(``keep_free_space_bytes``, ``move_factor``, ...) are ignored; an element
ClickHouse does not read there (``<algoritm>``) is a :class:`ConfigError`
naming its path and line. Key material never appears in error messages.
"""

from __future__ import annotations

import binascii
import os
import xml.etree.ElementTree as ET
from typing import Any, NoReturn
from xml.parsers import expat

from ..errors import ConfigError
from ..format.clickhouse import CHAlgorithm
from ..keys import is_variable_name, not_a_variable_name, shown_value

__all__ = ["parse_clickhouse_storage_xml"]

_ROOTS = ("clickhouse", "yandex")
_SC = "storage_configuration"
_KEY_TAGS = ("key", "key_hex")
_CURRENT_TAGS = ("current_key_id", "current_key", "current_key_hex")


# What ClickHouse reads in each part of a storage_configuration. cryptdisk uses some of it
# and ignores the rest (free space, moves, merges); anything else is a typo or a setting
# of a version cryptdisk does not know, and is refused with its line.
_SC_CHILDREN = frozenset({"disks", "policies"})
_COMMON_DISK = frozenset({"type", "skip_access_check", "readonly"})
_LOCAL_DISK = _COMMON_DISK | {"path", "keep_free_space_bytes", "keep_free_space_ratio"}
_ENCRYPTED_DISK = _COMMON_DISK | {"disk", "path", "algorithm", "use_fake_transaction",
                                  *_KEY_TAGS, *_CURRENT_TAGS}
_POLICY = frozenset({"volumes", "move_factor"})
_VOLUME = frozenset({"disk", "max_data_part_size_bytes", "max_data_part_size_ratio",
                     "prefer_not_to_merge", "perform_ttl_move_on_insert", "load_balancing",
                     "least_used_ttl_ms", "volume_priority"})


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[ET.Element, int] = {}

    def error(self, message: str, where: str, hint: str | None = None) -> ConfigError:
        return ConfigError(message, path=self.source, where=where, hint=hint)

    def only(self, elem: ET.Element, where: str, known: frozenset[str], what: str) -> None:
        """Refuse a child of ``elem`` that ClickHouse does not read there (a typo, usually)."""
        for child in elem:
            if child.tag not in known:
                line = self.lines.get(child)
                raise self.error(
                    f"unknown element <{child.tag}> in {what}",
                    f"{where}/{child.tag}" + (f", line {line}" if line else ""),
                    f"known here: {', '.join(sorted(known))}")

    def text(self, elem: ET.Element, where: str) -> str:
        """An element's text, taken from the environment with ``from_env`` (non-secret values)."""
        for attr in ("incl", "from_zk"):
            if attr in elem.attrib:
                raise self.error(f"{attr}= substitutions are not supported", where,
                                 "write the value into the file, or use from_env=")
        var = elem.get("from_env")
        if var is not None:
            value = os.environ.get(var)
            if not value and not is_variable_name(var):
                raise self.error(not_a_variable_name("from_env="), where,
                                 "write the variable's name there and export the value in it")
            if not value:
                raise self.error(f"environment variable {var} is not set or empty", where,
                                 f"export {var}=... before loading the config")
            return value.strip()
        return (elem.text or "").strip()

    def uint(self, elem: ET.Element, where: str) -> int:
        value = self.text(elem, where)
        if not value.isdigit():
            raise self.error(f"expected an unsigned integer, got {shown_value(value)}", where)
        return int(value)

    # -- disks -------------------------------------------------------------------------

    def disks(self, elem: ET.Element, where: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for disk in elem:
            at = f"{where}/{disk.tag}"
            if disk.tag in out:
                raise self.error(f"disk {disk.tag!r} is defined twice", at)
            spec = self.disk(disk, at)
            if spec is not None:
                out[disk.tag] = spec
        return out

    def disk(self, elem: ET.Element, where: str) -> dict[str, Any] | None:
        type_elem = elem.find("type")
        kind = "local" if type_elem is None else self.text(type_elem, f"{where}/type").lower()
        if kind == "local":
            self.only(elem, where, _LOCAL_DISK, f"local disk {elem.tag!r}")
            path = elem.find("path")
            if path is None:
                if elem.tag == "default":
                    return None  # settings of ClickHouse's implicit default disk
                raise self.error("a local disk needs <path>", where)
            return {"type": "local", "path": self.text(path, f"{where}/path")}
        if kind == "encrypted":
            return self.encrypted(elem, where)
        raise self.error(
            f"disk type {kind!r} is not supported (supported: local, encrypted)",
            f"{where}/type", "keep only local and encrypted disks in the file cryptdisk reads")

    def encrypted(self, elem: ET.Element, where: str) -> dict[str, Any]:
        self.only(elem, where, _ENCRYPTED_DISK, f"encrypted disk {elem.tag!r}")
        inner = elem.find("disk")
        if inner is None or not self.text(inner, f"{where}/disk"):
            raise self.error("an encrypted disk needs <disk> (the disk it wraps)", where)
        spec: dict[str, Any] = {"type": "clickhouse", "disk": self.text(inner, f"{where}/disk")}
        path = elem.find("path")
        if path is not None:
            spec["path"] = self.text(path, f"{where}/path")
            if spec["path"] and not spec["path"].endswith("/"):
                raise self.error("the path of an encrypted disk must end with '/'",
                                 f"{where}/path")
        alg = elem.find("algorithm")
        try:
            name = self.text(alg, f"{where}/algorithm") if alg is not None else "aes_128_ctr"
            spec["algorithm"] = CHAlgorithm.parse(name).name
        except ValueError as exc:
            raise self.error(str(exc), f"{where}/algorithm") from None
        keys, literal = self.keys(elem, where)
        spec["keys"] = keys
        current = self.current(elem, where, keys, literal)
        if current is not None:
            spec["current_key_id"] = current
        return spec

    # -- keys --------------------------------------------------------------------------

    def keys(self, elem: ET.Element, where: str) -> tuple[list[dict[str, Any]], list[bytes | None]]:
        """Key entries in document order, and each key's literal bytes (None for from_env)."""
        entries: list[tuple[int | None, dict[str, Any], bytes | None, str]] = []
        for index, key in enumerate(k for k in elem if k.tag in _KEY_TAGS):
            at = f"{where}/{key.tag}[{index + 1}]"
            entry, literal = self.key(key, at)
            key_id = None
            if "id" in key.attrib:
                raw_id = key.get("id", "").strip()
                if not raw_id.isdigit():
                    raise self.error(f"key id must be an unsigned integer, got {raw_id!r}", at)
                key_id = int(raw_id)
            entries.append((key_id, entry, literal, at))
        if not entries:
            raise self.error("an encrypted disk needs at least one <key> or <key_hex>", where)
        explicit = [e[0] for e in entries if e[0] is not None]
        next_id = 0 if not explicit else max(explicit) + 1
        seen: dict[int, str] = {}
        out, literals = [], []
        for key_id, entry, literal, at in entries:
            if key_id is None:
                key_id, next_id = next_id, next_id + 1
            if key_id in seen:
                raise self.error(f"key id {key_id} is used twice (also at {seen[key_id]})", at)
            seen[key_id] = at
            out.append({"id": key_id, **entry})
            literals.append(literal)
        return out, literals

    def key(self, elem: ET.Element, where: str) -> tuple[dict[str, Any], bytes | None]:
        var = elem.get("from_env")
        if var is not None:
            if not var:
                raise self.error("from_env= names no variable", where)
            return ({"from_env": var} if elem.tag == "key_hex" else {"raw_from_env": var}), None
        text = self.text(elem, where)
        if elem.tag == "key_hex":
            return {"hex": text}, self.unhex(text, where)
        raw = elem.text or ""  # a raw key is its exact characters
        return {"raw": raw}, raw.encode("utf-8")

    def unhex(self, text: str, where: str) -> bytes:
        try:
            return binascii.unhexlify(text)
        except (binascii.Error, ValueError):
            raise self.error("key_hex is not valid hex (an even number of 0-9a-f characters)",
                             where) from None

    def current(self, elem: ET.Element, where: str, keys: list[dict[str, Any]],
                literals: list[bytes | None]) -> int | None:
        given = [e for e in elem if e.tag in _CURRENT_TAGS]
        if len(given) > 1:
            raise self.error("the current key is given more than once "
                             f"({', '.join('<' + e.tag + '>' for e in given)})", where)
        if not given:
            if len(keys) == 1 and keys[0]["id"] == 0:
                return None  # one key with id 0 (or none): current, as in ClickHouse
            ids = ", ".join(str(k["id"]) for k in keys)
            raise self.error(
                f"no current key: the disk has {'keys' if len(keys) > 1 else 'a key'} with "
                f"id {ids} and no <current_key_id> (ClickHouse refuses to start with this "
                "disk: 'The current key is not specified')", where,
                f"add <current_key_id>{keys[-1]['id']}</current_key_id> naming the key that "
                "encrypts new files")
        cur = given[0]
        at = f"{where}/{cur.tag}"
        if cur.tag == "current_key_id":
            value = self.uint(cur, at)
            if value not in [k["id"] for k in keys]:
                raise self.error(f"current_key_id {value} is not the id of any key "
                                 f"(ids: {', '.join(str(k['id']) for k in keys)})", at)
            return value
        wanted = (self.unhex(self.text(cur, at), at) if cur.tag == "current_key_hex"
                  else (cur.text or "").encode("utf-8"))
        for key, literal in zip(keys, literals, strict=True):
            if literal is not None and literal == wanted:
                return int(key["id"])
        raise self.error(f"<{cur.tag}> is not one of the disk's literal keys", at,
                         "use <current_key_id> with the key's id instead")

    # -- policies ----------------------------------------------------------------------

    def policies(self, elem: ET.Element, where: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for policy in elem:
            at = f"{where}/{policy.tag}"
            if policy.tag in out:
                raise self.error(f"policy {policy.tag!r} is defined twice", at)
            self.only(policy, at, _POLICY, f"policy {policy.tag!r}")
            volumes_elem = policy.find("volumes")
            if volumes_elem is None or len(volumes_elem) == 0:
                raise self.error(f"policy {policy.tag!r} has no volumes", at)
            volumes = []
            for volume in volumes_elem:
                vat = f"{at}/volumes/{volume.tag}"
                self.only(volume, vat, _VOLUME, f"volume {volume.tag!r}")
                disks = [self.text(d, f"{vat}/disk") for d in volume.findall("disk")]
                if not disks or not all(disks):
                    raise self.error(f"volume {volume.tag!r} needs at least one <disk>", vat)
                volumes.append({"name": volume.tag, "disks": disks})
            out[policy.tag] = {"volumes": volumes}
        return out


def _read(path_or_text: str | bytes | os.PathLike[str]) -> tuple[str | bytes, str]:
    if isinstance(path_or_text, bytes):
        return path_or_text, "<xml>"
    if isinstance(path_or_text, str) and path_or_text.lstrip().startswith("<"):
        return path_or_text, "<xml>"
    name = os.fspath(path_or_text)
    try:
        with open(name, "rb") as f:
            return f.read(), name
    except FileNotFoundError:
        raise ConfigError("config file does not exist", path=name) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", path=name) from None


class _Forbidden(Exception):
    pass


def _refuse(*_args: Any) -> NoReturn:
    raise _Forbidden


def _parse_xml(data: str | bytes, parser: _Parser) -> ET.Element:
    """Parse with expat into an ElementTree, refusing DTDs (so no entity expansion at all).

    Each element's line is noted in ``parser.lines`` for error messages.
    """
    builder = ET.TreeBuilder()
    p = expat.ParserCreate()

    def start(tag: str, attrs: dict[str, str]) -> None:
        parser.lines[builder.start(tag, attrs)] = p.CurrentLineNumber

    p.StartElementHandler = start
    p.EndElementHandler = builder.end
    p.CharacterDataHandler = builder.data
    p.StartDoctypeDeclHandler = _refuse
    p.EntityDeclHandler = _refuse
    try:
        p.Parse(data, True)
    except expat.ExpatError as exc:
        raise parser.error(f"malformed XML ({expat.ErrorString(exc.code)})",
                           f"line {exc.lineno}, column {exc.offset + 1}") from None
    except _Forbidden:
        raise parser.error("DOCTYPE and entity declarations are not allowed",
                           f"line {p.CurrentLineNumber}") from None
    return builder.close()


def parse_clickhouse_storage_xml(path_or_text: str | bytes | os.PathLike[str]) -> dict[str, Any]:
    """Read a ClickHouse ``storage_configuration`` (a file path, or XML text) as a config dict.

    The root may be ``<clickhouse>``, ``<yandex>`` or ``<storage_configuration>``.
    Raises :class:`ConfigError` naming the file and the element (or line) at fault.
    """
    data, source = _read(path_or_text)
    parser = _Parser(source)
    root = _parse_xml(data, parser)
    if root.tag == _SC:
        sc: ET.Element | None = root
    elif root.tag in _ROOTS:
        sc = root.find(_SC)
    else:
        raise parser.error(f"unexpected root element <{root.tag}>", root.tag,
                           "the root must be <clickhouse>, <yandex> or <storage_configuration>")
    if sc is None:
        raise parser.error("no <storage_configuration> in this file", root.tag)
    parser.only(sc, _SC, _SC_CHILDREN, "<storage_configuration>")
    out: dict[str, Any] = {}
    disks = sc.find("disks")
    if disks is not None:
        out["disks"] = parser.disks(disks, f"{_SC}/disks")
    policies = sc.find("policies")
    if policies is not None:
        out["policies"] = parser.policies(policies, f"{_SC}/policies")
    return out

"""The catalog and the config must agree on where and how each table is stored.

The catalog records, per table, whether its storage policy encrypts, and per
part the type of the disk it was written to and whether it is encrypted. A
config opened on the database must agree: a part recorded as encrypted found
on a disk that does not encrypt (or in another format), or a table whose
policy encrypted and in this config does not, would be read as garbage or
would get plaintext written next to its encrypted parts. Such a config is
refused, naming the table, the recorded disk and the configured one; making a
table plain is an explicit move (``ALTER TABLE t MODIFY SETTING
storage_policy = ...``) under a config that agrees.

Catalogs written before these fields existed are inferred (a part with a key
id or algorithm was encrypted; a table was encrypted if a part was) and the
inference is recorded with the next change (never at open: a writer checks
first that the catalog was not rolled back).
"""

from __future__ import annotations

from typing import Any

from ..disks import Disk
from ._catalog import Catalog, PartMeta, TableMeta
from ._storage import policy_disk

__all__ = ["disagreements", "record_storage"]

#: The file format each disk type stores (types not listed store plain files).
_FORMATS = {"encrypted": "cryptdisk", "clickhouse": "clickhouse"}


def _format(disk_type: str | None) -> str | None:
    return None if disk_type is None else _FORMATS.get(disk_type, "plain")


def _describe(disk: Disk) -> str:
    how = "encrypted" if disk.is_encrypted else "not encrypted"
    return f"disk {disk.name!r} (type {disk.type}, {how}, at {disk.path})"


def _recorded(part: PartMeta) -> str:
    how = "encrypted" if part.is_encrypted else "not encrypted"
    kind = f"type {part.disk_type}, " if part.disk_type else ""
    return f"disk {part.disk!r} ({kind}{how})"


def _table_encrypted(meta: TableMeta) -> bool | None:
    if meta.encrypted is not None:
        return meta.encrypted
    if meta.parts:
        return any(p.is_encrypted for p in meta.parts)
    return None  # an empty table of an older catalog: nothing to disagree with


def _part_disagrees(part: PartMeta, disk: Disk) -> bool:
    if part.is_encrypted != bool(disk.is_encrypted):
        return True
    recorded = _format(part.disk_type)
    return recorded is not None and recorded != _format(disk.type)


def disagreements(catalog: Catalog, config: Any) -> list[str]:
    """Why ``config`` cannot be used on ``catalog``'s data (empty when it can)."""
    out: list[str] = []
    for meta in catalog.tables.values():
        for part in meta.parts:
            disk = config.disks.get(part.disk)
            if disk is not None and _part_disagrees(part, disk):
                out.append(f"table {meta.name}: part {part.path} was written to "
                           f"{_recorded(part)}; this config's is {_describe(disk)}")
                break  # one part names the disk; the others say the same
        policy = config.policies.get(meta.policy)
        if policy is None:
            continue
        target = policy_disk(policy)
        if _table_encrypted(meta) and not target.is_encrypted:
            out.append(f"table {meta.name}: its storage policy {meta.policy!r} encrypted "
                       f"when the catalog recorded it; in this config it writes to "
                       f"{_describe(target)}")
    return out


def record_storage(catalog: Catalog, config: Any) -> bool:
    """Fill in what the catalog does not record yet (new parts, older catalogs) from ``config``.

    Call only once :func:`disagreements` is empty. Returns True if anything changed.
    """
    changed = False
    for meta in catalog.tables.values():
        for part in meta.parts:
            disk = config.disks.get(part.disk)
            if part.encrypted is None:
                part.encrypted = part.is_encrypted
                changed = True
            if part.disk_type is None and disk is not None:
                part.disk_type = disk.type
                changed = True
        if meta.encrypted is None:
            known = _table_encrypted(meta)
            policy = config.policies.get(meta.policy)
            if known is None and policy is not None:
                known = bool(policy_disk(policy).is_encrypted)
            if known is not None:
                meta.encrypted = known
                changed = True
    return changed

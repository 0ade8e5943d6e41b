"""System tables: ``system.disks``, ``storage_policies``, ``tables``, ``columns``, ``parts``,
``keys``, ``views``.

Built from the config and the catalog on each query that names them. They
show ids, names, paths and counts; never key material.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

__all__ = ["system_tables"]


def _disks(db: Any) -> pa.Table:
    disks = list(db.config.disks.values())
    return pa.table({
        "name": [d.name for d in disks],
        "path": [d.path for d in disks],
        "type": [d.type for d in disks],
        "is_encrypted": [bool(d.is_encrypted) for d in disks],
    })


def _policies(db: Any) -> pa.Table:
    rows: dict[str, list[Any]] = {"policy_name": [], "volume_name": [], "volume_priority": [],
                                  "disks": [], "is_encrypted": []}
    for pname, policy in db.config.policies.items():
        for i, vol in enumerate(policy.volumes, 1):
            rows["policy_name"].append(pname)
            rows["volume_name"].append(vol.name)
            rows["volume_priority"].append(i)
            rows["disks"].append([d.name for d in vol.disks])
            rows["is_encrypted"].append(all(d.is_encrypted for d in vol.disks))
    return pa.table(rows, schema=pa.schema([("policy_name", pa.string()),
                                            ("volume_name", pa.string()),
                                            ("volume_priority", pa.int64()),
                                            ("disks", pa.list_(pa.string())),
                                            ("is_encrypted", pa.bool_())]))


def _tables(db: Any) -> pa.Table:
    metas = list(db.catalog.tables.values())
    return pa.table({
        "name": pa.array([t.name for t in metas], pa.string()),
        "storage_policy": pa.array([t.policy for t in metas], pa.string()),
        "order_by": pa.array([t.order_by for t in metas], pa.string()),
        "columns": pa.array([", ".join(f"{c} {ty}" for c, ty in t.columns) for t in metas],
                            pa.string()),
        "parts": pa.array([len(t.parts) for t in metas], pa.int64()),
        "rows": pa.array([t.rows for t in metas], pa.int64()),
        "bytes": pa.array([sum(p.bytes for p in t.parts) for t in metas], pa.int64()),
        "is_encrypted": pa.array([all(getattr(db.config.disks.get(p.disk), "is_encrypted", False)
                                      for p in t.parts)
                                  if t.parts else db.config.policies[t.policy].volumes[0]
                                  .disks[0].is_encrypted for t in metas], pa.bool_()),
    })


def _columns(db: Any) -> pa.Table:
    rows = [(t, i, c, ty) for t in db.catalog.tables.values()
            for i, (c, ty) in enumerate(t.columns, 1)]
    keys = {t.name: (t.order_by or "").split(",") for t in db.catalog.tables.values()}
    return pa.table({
        "table": pa.array([t.name for t, *_ in rows], pa.string()),
        "name": pa.array([c for _, _, c, _ in rows], pa.string()),
        "position": pa.array([i for _, i, _, _ in rows], pa.int64()),
        "type": pa.array([ty for *_, ty in rows], pa.string()),
        "is_in_order_by": pa.array([c in keys[t.name] for t, _, c, _ in rows], pa.bool_()),
        "is_nullable": pa.array([c not in t.not_null for t, _, c, _ in rows], pa.bool_()),
        "default_expression": pa.array([t.defaults.get(c) for t, _, c, _ in rows],
                                       pa.string()),
    })


def _parts(db: Any) -> pa.Table:
    rows = [(t.name, p) for t in db.catalog.tables.values() for p in t.parts]
    return pa.table({
        "table": pa.array([t for t, _ in rows], pa.string()),
        "part": pa.array([p.id for _, p in rows], pa.string()),
        "rows": pa.array([p.rows for _, p in rows], pa.int64()),
        "bytes": pa.array([p.bytes for _, p in rows], pa.int64()),
        "bytes_on_disk": pa.array([p.bytes_on_disk for _, p in rows], pa.int64()),
        "disk": pa.array([p.disk for _, p in rows], pa.string()),
        "path": pa.array([p.path for _, p in rows], pa.string()),
        "key_id": pa.array([p.key_id for _, p in rows], pa.uint64()),
        "algorithm": pa.array([p.algorithm for _, p in rows], pa.string()),
        # NULL for a part on an encrypted disk (AES-GCM authenticates it, see _parts)
        "sha256": pa.array([p.sha256 or None for _, p in rows], pa.string()),
        # the sparse index: min and max of the table's first ORDER BY column (as text)
        "key_min": pa.array([_text(p.key_min) for _, p in rows], pa.string()),
        "key_max": pa.array([_text(p.key_max) for _, p in rows], pa.string()),
    })


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _keys(db: Any) -> pa.Table:
    uses = Counter(p.key_id for t in db.catalog.tables.values() for p in t.parts
                   if p.key_id is not None)
    from ..format import HEADER_SIZE, Header
    from ._catalog import catalog_key_id
    remote = getattr(db, "_remote", None)
    if remote is not None:
        data = remote.read_bytes("catalog") or b""
        uses[Header.parse(data[:HEADER_SIZE], f"{db.path}/catalog").key_id] += 1
    else:
        uses[catalog_key_id(db.path, db.keyring)] += 1
    # the pins and the server's files beside the directory, sealed with the keyring
    for _path, key_id, _problem in db._sidecar_key_ids():
        if key_id is not None:
            uses[key_id] += 1
    keys = list(db.keyring)
    return pa.table({
        "id": pa.array([k.key_id for k in keys], pa.uint64()),
        "algorithm": pa.array([k.algorithm.label.lower() for k in keys], pa.string()),
        "source": pa.array([k.source for k in keys], pa.string()),
        "is_current": pa.array([k.key_id == db.keyring.current_key_id for k in keys]),
        "files": pa.array([uses.get(k.key_id, 0) for k in keys], pa.int64()),
    })


def _views(db: Any) -> pa.Table:
    views = list(db.catalog.views.values())
    return pa.table({
        "name": pa.array([v.name for v in views], pa.string()),
        "query": pa.array([v.query for v in views], pa.string()),
        # the names given after the view's name (NULL: its query's)
        "columns": pa.array([v.columns for v in views], pa.list_(pa.string())),
        "reads": pa.array([v.reads for v in views], pa.list_(pa.string())),
        # False: read with the rights of its owner (WITH (security_invoker = false))
        "security_invoker": pa.array([v.security_invoker for v in views], pa.bool_()),
        "owner": pa.array([v.owner for v in views], pa.string()),
    })


def system_tables(db: Any) -> dict[str, pa.Table]:
    """Name -> Arrow table for every system table."""
    return {"disks": _disks(db), "storage_policies": _policies(db), "tables": _tables(db),
            "columns": _columns(db), "parts": _parts(db), "keys": _keys(db),
            "views": _views(db)}

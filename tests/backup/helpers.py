"""Shared helpers for the backup tests."""

from __future__ import annotations

from typing import Any

import cryptdisk

FAST_KDF = {"memory_cost": 1024, "iterations": 1, "lanes": 1}  # tests only: cheap Argon2id


def make_db(path: Any, rows: int = 2000) -> None:
    db = cryptdisk.connect(path)
    db.sql("CREATE TABLE t (id BIGINT, s VARCHAR, f DOUBLE) ORDER BY id")
    db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR), range / 7 FROM range({rows})")
    db.sql("CREATE TABLE u (k VARCHAR, v BIGINT)")
    db.sql("INSERT INTO u VALUES ('a', 1), ('b', NULL)")
    db.close()


def content(path: Any) -> dict[str, Any]:
    """Every table's rows and an order-independent checksum, read-only."""
    db = cryptdisk.connect(path, read_only=True)
    try:
        out = {}
        for name in sorted(db.catalog.tables):
            rows = sorted(db.query(f"SELECT * FROM {name}"), key=repr)
            cols = ", ".join(c for c, _t in db.table(name).columns)
            (check,) = db.query(f"SELECT bit_xor(hash({cols})), count(*) FROM {name}")
            out[name] = (rows, check)
        return out
    finally:
        db.close()

"""Several processes writing one encrypted database at once stay consistent (WAL and rollback)."""

from __future__ import annotations

import os

import pytest

from cryptdisk.bench._bodies_oltp import run_clients
from cryptdisk.bench._oltp_sqlite import DbSpec, load, open_db
from cryptdisk.bench.oltp import BIG_CACHE_KIB, Case


@pytest.mark.parametrize(("journal", "sync", "cache"), [
    ("wal", "normal", BIG_CACHE_KIB), ("wal", "full", 64), ("delete", "normal", 64),
    ("truncate", "full", 64),  # each process lays out the journal another one emptied
])
def test_concurrent_tpcb_clients_keep_the_books_balanced(tmp_path, journal, sync, cache):
    spec = DbSpec("cryptdisk", str(tmp_path / "mp.db"), os.urandom(32).hex(), journal, sync,
                  cache)
    load(spec, 1)
    result = run_clients(spec, Case("tpcb-like", 1, journal, sync, cache, 3), 1.5)
    assert result["txns"] > 20
    conn = open_db(spec)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        (history, deltas), = conn.execute(
            "SELECT count(*), coalesce(sum(delta), 0) FROM pgbench_history").fetchall()
        assert history == result["txns"]  # every reported commit is there, no other
        for table, column in (("pgbench_accounts", "abalance"), ("pgbench_tellers", "tbalance"),
                              ("pgbench_branches", "bbalance")):
            (total,), = conn.execute(f"SELECT sum({column}) FROM {table}").fetchall()
            assert total == deltas, table
    finally:
        conn.close()

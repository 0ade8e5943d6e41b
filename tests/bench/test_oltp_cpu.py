"""The CPU-per-transaction tool runs real transactions on the real strategies."""

from __future__ import annotations

import pytest

import cryptdisk.sqlite as csql
from cryptdisk.bench._oltp_cpu import cpu_per_transaction


@pytest.fixture(autouse=True, params=csql.IMPLEMENTATIONS)
def vfs_implementation(request, monkeypatch) -> str:
    """Both VFSes (C and Python), as the SQLite tests run."""
    monkeypatch.setenv("CRYPTDISK_SQLITE_VFS", request.param)
    return request.param


def test_cpu_per_transaction_runs_tpcb_on_an_encrypted_database(tmp_path):
    us = cpu_per_transaction("cryptdisk", "tpcb", 30, str(tmp_path))
    assert 0 < us < 1e6
    raw = (tmp_path / "cryptdisk" / "bench.db").read_bytes()
    assert not raw.startswith(b"SQLite format 3")  # the tool measured the encrypted store
    assert b"pgbench_accounts" not in raw

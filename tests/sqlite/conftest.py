"""Fixtures for the encrypted SQLite tests."""

from __future__ import annotations

import pytest

import cryptdisk
import cryptdisk.sqlite as csql


@pytest.fixture(autouse=True, params=csql.IMPLEMENTATIONS)
def vfs_implementation(request, monkeypatch) -> str:
    """Every test here runs against both VFSes (C and Python), children included."""
    monkeypatch.setenv("CRYPTDISK_SQLITE_VFS", request.param)
    return request.param


@pytest.fixture
def keyring() -> cryptdisk.Keyring:
    return cryptdisk.Keyring.generate()


def files_of(path) -> list:
    """The database file and whichever of its journal, WAL and shm exist."""
    out = []
    for suffix in ("", "-journal", "-wal", "-shm"):
        p = path.parent / (path.name + suffix)
        if p.exists():
            out.append(p)
    return out

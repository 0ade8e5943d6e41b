"""Helpers shared by the encrypted-SQLite tests (imported by them; not a test module)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import apsw

import cryptdisk.sqlite as csql

__all__ = ["legacy_wal_db", "old_layout"]


@contextlib.contextmanager
def old_layout(monkeypatch, path, keyring) -> Iterator[apsw.Connection]:
    """A connection (Python VFS) that writes WALs and journals as mutable files (kind 2),
    as cryptdisk did before they became framed files (and without claiming safe append
    then); closed at the end."""
    with monkeypatch.context() as patch:
        patch.setattr(csql._vfs, "framing", lambda *args: (0, 0))
        patch.setattr(csql._vfs, "_SAFE_APPEND", 0)
        conn = csql.connect(str(path), keyring=keyring, implementation="python")
        try:
            yield conn
        finally:
            conn.close()


def legacy_wal_db(tmp_path: Path, keyring, monkeypatch) -> Path:
    """A database with a WAL written as a mutable file (kind 2) holding one commit, as a
    crash of an older cryptdisk leaves it (so the WAL is not checkpointed away)."""
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    db = tmp_path / "t.db"
    with old_layout(monkeypatch, old_dir / "t.db", keyring) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.execute("PRAGMA wal_autocheckpoint=0")
        old.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        old.execute("INSERT INTO t VALUES(1, 'first')")
        for suffix in ("", "-wal"):
            shutil.copy(str(old_dir / "t.db") + suffix, str(db) + suffix)
    with open(str(db) + "-wal", "rb") as f:
        assert f.read(10)[9] == 2  # a mutable WAL
    return db

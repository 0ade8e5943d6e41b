"""WALs and rollback journals are framed files: a record per WAL frame or journal record."""

from __future__ import annotations

import os

import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.format import Header, Kind, SegmentLayout


def _header(path) -> Header:
    with open(path, "rb") as f:
        return Header.parse(f.read(128))


def _frames(path) -> int:
    header = _header(path)
    _count, size, _cut = SegmentLayout.of(header).measure(os.stat(path).st_size)
    return (size - 32) // (header.segment_size + 24)


@pytest.mark.parametrize("page", [512, 4096, 65536])
def test_the_wal_is_framed_and_commits_are_not_padded(tmp_path, keyring, page):
    """With synchronous=FULL SQLite pads a commit to a sector boundary unless the database
    claims power-safe overwrite; it does, so a one-page commit appends exactly one frame."""
    path = str(tmp_path / "w.db")
    conn = csql.connect(path, keyring=keyring)
    conn.execute(f"PRAGMA page_size={page}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v INTEGER)")
    conn.execute("INSERT INTO t VALUES (1, 0)")
    header = _header(path + "-wal")
    assert (header.kind, header.lead, header.frame_extra) == (Kind.FRAMED, 32, 24)
    assert header.segment_size == page
    before = _frames(path + "-wal")
    for i in range(10):
        conn.execute("UPDATE t SET v = ? WHERE id = 1", (i + 1,))  # one page per commit
    assert _frames(path + "-wal") - before == 10
    assert conn.execute("SELECT v FROM t").fetchall() == [(10,)]
    conn.close()
    with cryptdisk.open(path, "rb", keyring=keyring) as f:  # checkpointed at close
        assert f.read(16) == b"SQLite format 3\0"


@pytest.mark.parametrize("page", [512, 4096, 8192, 65536])
@pytest.mark.parametrize("sync", ["off", "full"])
def test_the_rollback_journal_is_framed(tmp_path, keyring, page, sync):
    """Its segment 0 is the journal header (512 bytes: the sector size SQLite uses with
    power-safe overwrite), then one segment per record: page number, page, checksum.
    (With synchronous=FULL SQLite first writes the header's magic as zeros.)"""
    path = str(tmp_path / "j.db")
    conn = csql.connect(path, keyring=keyring)
    conn.execute(f"PRAGMA page_size={page}")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("PRAGMA journal_mode=PERSIST")  # the journal stays after the commit
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    with conn:
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 300) for i in range(100)])
    conn.execute("UPDATE t SET v = 'y' WHERE id < 50")
    header = _header(path + "-journal")
    assert (header.kind, header.lead, header.frame_extra) == (Kind.FRAMED, 512, 8)
    assert header.segment_size == page  # a record per journal record: page + 8 bytes
    with cryptdisk.open(path + "-journal", "rb", keyring=keyring) as f:
        journal = f.read()
    records = (len(journal) - 512) // (page + 8)
    assert records >= 1 and len(journal) == 512 + records * (page + 8)
    assert conn.execute("SELECT count(*) FROM t WHERE v = 'y'").fetchall() == [(50,)]
    conn.close()

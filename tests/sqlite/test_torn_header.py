"""An encrypted SQLite database opened while ``cryptdisk sqlite rotate`` writes its header:
the VFS (C and Python) reads a torn header again until it opens (format/_reread.py).

Deterministic, as tests/format/test_torn_header.py: the database holds a torn header
(the new header's first bytes, the old one's last) and the rewrap's write completes
while the VFS pauses before reading it again.
"""

from __future__ import annotations

import os
import types

import pytest

import cryptdisk.sqlite as csql
import cryptdisk.sqlite._header as sqlite_header
from cryptdisk import Key, Keyring
from cryptdisk.errors import HeaderAuthenticationError, KeyNotFoundError, WrongKeyError
from cryptdisk.format import HEADER_SIZE, REREAD_DELAYS, _reread
from cryptdisk.keys import rewrap_file

OLD, NEW = Key(1, b"\x11" * 32), Key(256, b"\x22" * 32)
OLD_RING, NEW_RING = Keyring([OLD, NEW], 1), Keyring([OLD, NEW], 256)
CUTS = [(33, KeyNotFoundError), (40, WrongKeyError), (64, HeaderAuthenticationError)]


def _make(path) -> tuple[bytes, bytes]:
    """A database of 200 rows; its header and the one a rewrap to NEW writes."""
    conn = csql.connect(str(path), keyring=OLD_RING)
    with conn:  # one transaction
        conn.execute("CREATE TABLE t(v)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1, 201)])
    conn.close()
    with open(path, "rb") as f:
        old = f.read(HEADER_SIZE)
    assert rewrap_file(path, NEW_RING)
    with open(path, "rb") as f:
        new = f.read(HEADER_SIZE)
    return old, new


def _write_header(path, header: bytes) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, header, 0)
    finally:
        os.close(fd)


def _sum(path, keyring) -> int:
    conn = csql.connect(str(path), keyring=keyring)
    try:
        return int(conn.execute("SELECT sum(v) FROM t").fetchall()[0][0])
    finally:
        conn.close()


@pytest.mark.parametrize(("cut", "error"), CUTS)
def test_the_vfs_reads_a_torn_header_again_and_opens_the_completed_one(
        tmp_path, monkeypatch, vfs_implementation, cut, error):
    path = tmp_path / "a.db"
    old, new = _make(path)
    _write_header(path, new[:cut] + old[cut:])
    pauses: list[float] = []

    def sleep(seconds: float) -> None:  # the rewrap's write completes meanwhile
        pauses.append(seconds)
        _write_header(path, new)

    fake = types.SimpleNamespace(sleep=sleep)
    monkeypatch.setattr(_reread, "REREAD_DELAYS", (0.001,) * len(REREAD_DELAYS))
    monkeypatch.setattr(_reread, "time", fake)  # the Python VFS's reads
    monkeypatch.setattr(sqlite_header, "time", fake)  # the C VFS's (its loop in file.c)
    assert _sum(path, OLD_RING) == 200 * 201 // 2
    assert pauses == [0.001]


@pytest.mark.parametrize(("cut", "error"), CUTS)
def test_without_a_second_read_the_torn_header_fails_the_open(
        tmp_path, monkeypatch, vfs_implementation, cut, error):
    path = tmp_path / "a.db"
    old, new = _make(path)
    _write_header(path, new[:cut] + old[cut:])
    monkeypatch.setattr(_reread, "REREAD_DELAYS", ())
    with pytest.raises(error):
        _sum(path, OLD_RING)


def test_a_header_that_stays_torn_fails_the_open_after_every_read(
        tmp_path, monkeypatch, vfs_implementation):
    """The error is the one a single read gives, raised after 1 + len(REREAD_DELAYS)
    reads (the C VFS's loop ends where header_for stops asking)."""
    path = tmp_path / "a.db"
    old, new = _make(path)
    _write_header(path, new[:64] + old[64:])
    pauses: list[float] = []
    fake = types.SimpleNamespace(sleep=pauses.append)
    monkeypatch.setattr(_reread, "time", fake)
    monkeypatch.setattr(sqlite_header, "time", fake)
    unwraps: list[int] = []

    def counted(real):  # type: ignore[no-untyped-def]
        def open_header(*args, **kwargs):  # type: ignore[no-untyped-def]
            unwraps.append(1)
            return real(*args, **kwargs)
        return open_header

    monkeypatch.setattr(_reread, "open_header", counted(_reread.open_header))
    monkeypatch.setattr(sqlite_header, "open_header", counted(sqlite_header.open_header))
    with pytest.raises(HeaderAuthenticationError, match="tampered with or corrupted"):
        _sum(path, OLD_RING)
    assert pauses == [d for d in REREAD_DELAYS if d]
    assert len(unwraps) == 1  # the same bytes read again are not unwrapped again
    monkeypatch.undo()
    _write_header(path, new)  # the rewrap done: it opens under either keyring
    assert _sum(path, OLD_RING) == _sum(path, NEW_RING) == 200 * 201 // 2

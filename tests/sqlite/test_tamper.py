"""Tampering with any file of an encrypted database raises a clear error, never data."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil

import apsw
import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.errors import (
    AuthenticationError,
    HeaderAuthenticationError,
    KeyNotFoundError,
    NotEncryptedError,
    WrongKeyError,
)
from cryptdisk.format import HEADER_SIZE

from .helpers import old_layout

PAGE = 4096
RECORD = PAGE + 32


def record_offset(index: int) -> int:
    return HEADER_SIZE + index * RECORD


def make_db(path, keyring, rows: int = 200, journal: str = "delete") -> None:
    conn = csql.connect(str(path), keyring=keyring)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    with conn:
        conn.executemany("INSERT INTO t VALUES(?, ?)",
                         [(i, f"row {i} " + "x" * 200) for i in range(rows)])
    conn.close()


def read_all(path, keyring) -> list:
    conn = csql.connect(str(path), keyring=keyring)
    try:
        conn.execute("PRAGMA cache_size=2")
        return conn.execute("SELECT * FROM t ORDER BY id").fetchall()
    finally:
        conn.close()


def edit(path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def crash_copy(tmp_path, keyring, journal: str = "delete"):
    """A database (``make_db``, synchronous=FULL, SQLite's default) copied with its hot
    journal in the middle of a transaction that spilled pages to it, as a crash would
    leave them: the directory ``tmp_path / "crash"`` holding ``j.db`` and
    ``j.db-journal``. ``journal``: the rollback journal mode of every transaction
    (TRUNCATE leaves the journal file of the transaction before, emptied)."""
    db = tmp_path / "j.db"
    make_db(db, keyring, journal=journal)
    conn = csql.connect(str(db), keyring=keyring)
    conn.execute(f"PRAGMA journal_mode={journal}").fetchall()
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA cache_size=2")
    conn.execute("BEGIN")
    conn.execute("UPDATE t SET v = 'changed'")  # spills: pages written under a hot journal
    crash = tmp_path / "crash"
    crash.mkdir()
    shutil.copy(db, crash / "j.db")
    shutil.copy(str(db) + "-journal", crash / "j.db-journal")
    conn.execute("ROLLBACK")
    conn.close()
    return crash


def test_flipped_byte_in_a_page(tmp_path, keyring):
    db = tmp_path / "a.db"
    make_db(db, keyring)
    at = record_offset(5) + 100
    raw = db.read_bytes()
    edit(db, at, bytes([raw[at] ^ 1]))
    with pytest.raises(csql.PageAuthenticationError) as info:
        read_all(db, keyring)
    err = info.value
    assert isinstance(err, AuthenticationError) and isinstance(err, apsw.CorruptError)
    assert err.path == str(db) and err.offset == record_offset(5)
    assert str(db) in str(err) and f"offset {record_offset(5)}" in str(err)


def test_swapped_pages(tmp_path, keyring):
    db = tmp_path / "a.db"
    make_db(db, keyring)
    raw = bytearray(db.read_bytes())
    a, b = record_offset(3), record_offset(4)
    raw[a : a + RECORD], raw[b : b + RECORD] = raw[b : b + RECORD], raw[a : a + RECORD]
    db.write_bytes(raw)
    with pytest.raises(csql.PageAuthenticationError, match="segment 3 at offset"):
        read_all(db, keyring)


def test_page_copied_from_another_database(tmp_path, keyring):
    """Same key, same page number, other file: the file id in the AD tells them apart."""
    db, other = tmp_path / "a.db", tmp_path / "b.db"
    make_db(db, keyring)
    make_db(other, keyring)
    at = record_offset(2)
    edit(db, at, other.read_bytes()[at : at + RECORD])
    with pytest.raises(csql.PageAuthenticationError):
        read_all(db, keyring)


def test_truncated_by_one_segment(tmp_path, keyring):
    db = tmp_path / "a.db"
    make_db(db, keyring)
    os.truncate(db, db.stat().st_size - RECORD)
    with pytest.raises(csql.PageTruncatedError, match="truncated"):
        read_all(db, keyring)


def test_truncated_mid_segment(tmp_path, keyring):
    db = tmp_path / "a.db"
    make_db(db, keyring)
    os.truncate(db, db.stat().st_size - 100)
    with pytest.raises(AuthenticationError, match="truncated"):
        read_all(db, keyring)


def test_tampered_header(tmp_path, keyring):
    db = tmp_path / "a.db"
    make_db(db, keyring)
    edit(db, 20, bytes([db.read_bytes()[20] ^ 0x55]))  # inside the (random) file id: flip bits
    with pytest.raises(HeaderAuthenticationError):
        csql.connect(str(db), keyring=keyring)


def test_flipped_byte_in_the_wal(tmp_path, keyring, caplog):
    """A WAL segment that does not authenticate is logged and treated as torn, never read."""
    db = tmp_path / "w.db"
    conn = csql.connect(str(db), keyring=keyring)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # no padding: the commit frame ends the WAL
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO t VALUES(1, 'in the wal')")
    for name in ("intact", "tampered"):
        (tmp_path / name).mkdir()
        for suffix in ("", "-wal"):
            shutil.copy(str(db) + suffix, tmp_path / name / ("w.db" + suffix))
    conn.close()
    intact = csql.connect(str(tmp_path / "intact" / "w.db"), keyring=keyring)  # WAL recovery
    assert intact.execute("SELECT v FROM t").fetchall() == [("in the wal",)]
    intact.close()
    wal = tmp_path / "tampered" / "w.db-wal"
    raw = wal.read_bytes()
    edit(wal, len(raw) - 50, bytes([raw[-50] ^ 0x80]))
    with caplog.at_level(logging.WARNING, logger="cryptdisk.sqlite"):
        conn = csql.connect(str(tmp_path / "tampered" / "w.db"), keyring=keyring)
        rows = conn.execute("SELECT v FROM t").fetchall()
        conn.close()
    # The tampered segment reads as a torn write: SQLite drops the commit in it,
    # exactly as after a crash, and never sees the unauthenticated bytes.
    assert rows == []
    assert any("w.db-wal" in r.getMessage() and "does not authenticate" in r.getMessage()
               for r in caplog.records)


def test_hot_journal_tampered(tmp_path, keyring, caplog):
    """A rollback journal left by a crash is authenticated before SQLite replays it: a bad
    segment reaches SQLite as zeros (a torn journal), and is logged."""
    crash = crash_copy(tmp_path, keyring)
    good = tmp_path / "good"
    shutil.copytree(crash, good)
    assert len(read_all(good / "j.db", keyring)) == 200  # the crash copy rolls back fine
    journal = crash / "j.db-journal"
    raw = journal.read_bytes()
    edit(journal, HEADER_SIZE + 700, bytes([raw[HEADER_SIZE + 700] ^ 4]))
    with caplog.at_level(logging.WARNING, logger="cryptdisk.sqlite"):
        with contextlib.suppress(apsw.Error):  # a journal cut short may leave it corrupt
            read_all(crash / "j.db", keyring)
    assert any("j.db-journal" in r.getMessage() and "does not authenticate" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("journal", ["delete", "truncate"])
@pytest.mark.parametrize("tail", ["random", "zeros", "moved", "plaintext", "cut"])
def test_what_a_power_loss_appends_to_a_journal_is_never_played_back(tmp_path, keyring,
                                                                        caplog, tail, journal):
    """SQLite takes a framed journal's record count from its size (the database claims
    safe append), so a power loss could leave records after the synced ones that were
    never written whole: random blocks, zeros, a record from elsewhere in the file, one
    that was never encrypted, a cut one. Each reads as zeros, where SQLite's playback
    stops, so the database rolls back to exactly where it was. In TRUNCATE mode too,
    where the journal is the file the transaction before emptied."""
    crash = crash_copy(tmp_path, keyring, journal)
    journal = crash / "j.db-journal"
    with cryptdisk.open(journal, "rb", keyring=keyring) as f:
        plain = f.read()
    assert plain[8:12] == b"\xff\xff\xff\xff"  # the record count is the journal's size
    record = 16 + (4 + PAGE + 4) + 16
    first = HEADER_SIZE + 16 + 512 + 16  # after the header's segment (the sector, 512)
    raw = journal.read_bytes()
    assert (len(raw) - first) % record == 0
    # The first record with one byte of its page changed where SQLite's checksum does not
    # look (it sums every 200th byte from the end): played back, it would change a row.
    altered = bytearray(plain[512:512 + 4 + PAGE + 4])
    altered[4 + PAGE - 50] ^= 0x20
    appended = {
        "random": os.urandom(record),
        "zeros": bytes(record),
        "moved": raw[first:first + record],  # authentic, at another index
        "plaintext": altered + bytes(32),  # passes SQLite's checksum, never encrypted
        "cut": raw[first:first + record // 2],
    }[tail]
    with open(journal, "ab") as f:
        f.write(appended)
    with caplog.at_level(logging.WARNING, logger="cryptdisk.sqlite"):
        rows = read_all(crash / "j.db", keyring)
    assert rows == [(i, f"row {i} " + "x" * 200) for i in range(200)]
    assert any("j.db-journal" in r.getMessage() for r in caplog.records)
    conn = csql.connect(str(crash / "j.db"), keyring=keyring)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def test_wrong_key(tmp_path, keyring):
    db = tmp_path / "a.db"
    make_db(db, keyring)
    other = cryptdisk.Keyring.generate()  # same id 1, different key
    with pytest.raises(WrongKeyError):
        csql.connect(str(db), keyring=other)


def test_unknown_key_id(tmp_path, keyring):
    db = tmp_path / "a.db"
    make_db(db, keyring)
    other = cryptdisk.Keyring.generate(key_id=9)
    with pytest.raises(KeyNotFoundError, match="no key with id 1"):
        csql.connect(str(db), keyring=other)


def test_a_wal_under_a_key_the_reader_lacks_names_the_wal(tmp_path):
    """After a rotation, a writer whose current key is the new one writes its WAL under
    it; a reader without that key fails at open, and the error says which file."""
    old, new = cryptdisk.Key(1, bytes(range(32))), cryptdisk.Key(2, bytes(range(1, 33)))
    db = tmp_path / "a.db"
    conn = csql.connect(str(db), keyring=cryptdisk.Keyring([old]))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t(x)")
    conn.close()
    writer = csql.connect(str(db), keyring=cryptdisk.Keyring([old, new], current_key_id=2))
    writer.execute("INSERT INTO t VALUES(1)")
    with pytest.raises(KeyNotFoundError, match=r"a\.db-wal: no key with id 2") as info:
        csql.connect(str(db), keyring=cryptdisk.Keyring([old]))
    assert info.value.path.endswith("a.db-wal") and info.value.key_id == 2
    writer.close()


def test_plain_database_is_refused(tmp_path, keyring):
    db = tmp_path / "plain.db"
    conn = apsw.Connection(str(db))
    conn.execute("CREATE TABLE t(x)")
    conn.close()
    with pytest.raises(NotEncryptedError):
        csql.connect(str(db), keyring=keyring)


def test_unauthenticated_bytes_never_reach_sqlite(tmp_path, keyring):
    """Even after the error the connection returns no row from the bad page."""
    db = tmp_path / "a.db"
    make_db(db, keyring)
    edit(db, record_offset(1) + 64, b"\0" * 8)
    conn = csql.connect(str(db), keyring=keyring)
    for _ in range(2):
        with pytest.raises(csql.PageAuthenticationError):
            conn.execute("SELECT * FROM t WHERE id = 0").fetchall()
    conn.close()


def test_torn_rewrite_of_a_legacy_wal_tail_recovers(tmp_path, keyring, caplog, monkeypatch):
    """A WAL written before WALs became framed files (a mutable file, kind 2) shares its
    last segment between commits. Either VFS that goes on appending to one copies that
    record to -cdtail first, so a rewrite cut short (SIGKILL between kernel pages, power
    loss) falls back to it: the earlier commit survives, whichever VFS reads it."""
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    db = legacy / "t.db"
    reopened = tmp_path / "reopened"
    reopened.mkdir()
    with old_layout(monkeypatch, db, keyring) as old:
        old.execute("PRAGMA journal_mode=WAL")
        old.execute("PRAGMA wal_autocheckpoint=0")
        old.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        old.execute("INSERT INTO t VALUES(1, 'first')")
        for suffix in ("", "-wal"):  # as a crash would leave them
            shutil.copy(str(db) + suffix, reopened / ("t.db" + suffix))
    with open(reopened / "t.db-wal", "rb") as f:
        assert f.read(10)[9] == 2  # a mutable WAL (kind 2), not a framed one
    conn = csql.connect(str(reopened / "t.db"), keyring=keyring)  # C or Python VFS
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("INSERT INTO t VALUES(2, 'second')")  # rewrites the shared tail segment
    crash = tmp_path / "crash"
    crash.mkdir()
    for suffix in ("", "-wal", "-wal-cdtail"):
        shutil.copy(str(reopened / "t.db") + suffix, crash / ("t.db" + suffix))
    conn.close()
    saved = (crash / "t.db-wal-cdtail").read_bytes()
    index = int.from_bytes(saved[:8], "little")
    wal = crash / "t.db-wal"
    length = min(RECORD, wal.stat().st_size - record_offset(index))
    half = length // 2
    edit(wal, record_offset(index) + half, bytes(length - half))  # second half never written
    nosave = tmp_path / "nosave"
    shutil.copytree(crash, nosave)
    os.unlink(nosave / "t.db-wal-cdtail")
    for reader in csql.IMPLEMENTATIONS:
        copy = tmp_path / f"read-by-{reader}"
        shutil.copytree(crash, copy)
        monkeypatch.setenv("CRYPTDISK_SQLITE_VFS", reader)
        assert read_all(copy / "t.db", keyring)[0] == (1, "first"), reader
    # Without the saved record the segment reads as torn: 'first' is lost too.
    with caplog.at_level(logging.WARNING, logger="cryptdisk.sqlite"):
        assert (1, "first") not in read_all(nosave / "t.db", keyring)
    assert any("does not authenticate" in r.getMessage() for r in caplog.records)


def test_a_legacy_hot_journal_rolls_back(tmp_path, keyring, monkeypatch):
    """A rollback journal written before journals became framed files (a mutable file,
    kind 2) and left hot by a crash is replayed by either VFS: the database comes back as
    it was before the interrupted transaction."""
    db = tmp_path / "j.db"
    make_db(db, keyring)
    crash = tmp_path / "crash"
    crash.mkdir()
    with old_layout(monkeypatch, db, keyring) as conn:
        conn.execute("PRAGMA cache_size=2")
        conn.execute("BEGIN")
        conn.execute("UPDATE t SET v = 'changed'")  # spills: pages written under a hot journal
        shutil.copy(db, crash / "j.db")
        shutil.copy(str(db) + "-journal", crash / "j.db-journal")
        conn.execute("ROLLBACK")
    assert (crash / "j.db-journal").read_bytes()[9] == 2  # a mutable journal
    spilled = tmp_path / "spilled"
    spilled.mkdir()
    shutil.copy(crash / "j.db", spilled / "j.db")  # without its journal: the spilled pages
    assert any(v == "changed" for _, v in read_all(spilled / "j.db", keyring))
    rows = read_all(crash / "j.db", keyring)  # C or Python VFS (the fixture's)
    assert len(rows) == 200 and all(v.startswith("row ") for _, v in rows)
    assert not (crash / "j.db-journal").exists() or (crash / "j.db-journal").stat().st_size == 0

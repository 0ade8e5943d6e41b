"""WALs and rollback journals are framed files: a record per WAL frame or journal record."""

from __future__ import annotations

import collections
import os

import apsw
import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.format import Header, Kind, SegmentLayout

from .helpers import old_layout


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


class _CountSyncs(apsw.VFS):
    """A shim over an encrypted VFS that counts xSync calls per file: main or journal."""

    def __init__(self, base: str) -> None:
        self.syncs: collections.Counter[str] = collections.Counter()
        self.base_name = base
        super().__init__("cd-count-syncs", base)

    def xOpen(self, name, flags):
        return _CountingFile(self, name, flags)


class _CountingFile(apsw.VFSFile):
    def __init__(self, vfs: _CountSyncs, name, flags) -> None:
        path = name.filename() if isinstance(name, apsw.URIFilename) else str(name)
        self._what = "journal" if path.endswith("-journal") else "main"
        self._counter = vfs.syncs
        super().__init__(vfs.base_name, name, flags)

    def xSync(self, flags: int) -> None:
        self._counter[self._what] += 1
        super().xSync(flags)


@pytest.fixture
def count_syncs(keyring):
    shim = _CountSyncs(csql.vfs_for(keyring).vfs_name)
    yield shim
    shim.unregister()


def _open_with_a_legacy_journal(path, keyring, monkeypatch, journal_mode: str) -> apsw.Connection:
    """A 100-row table whose PERSIST journal an older cryptdisk left as a mutable file
    (kind 2), opened through the sync-counting shim (``count_syncs``) with
    synchronous=FULL and ``journal_mode``."""
    with old_layout(monkeypatch, path, keyring) as old:
        old.execute("PRAGMA journal_mode=PERSIST")
        old.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
        with old:
            old.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 300) for i in range(100)])
    assert _header(str(path) + "-journal").kind == Kind.MUTABLE
    conn = apsw.Connection(str(path), vfs="cd-count-syncs")
    for pragma in ("synchronous=FULL", f"journal_mode={journal_mode}"):
        conn.execute(f"PRAGMA {pragma}").fetchall()
    return conn


def _commit_two_pages(conn: apsw.Connection, value: str) -> None:
    with conn:
        conn.execute("UPDATE t SET v = ? WHERE id IN (1, 99)", (value,))


@pytest.mark.parametrize("page", [512, 4096, 65536])
def test_a_commit_syncs_its_framed_journal_once(tmp_path, keyring, count_syncs, page):
    """The database file claims safe append (a framed journal's records read back as
    written or as zeros), so with synchronous=FULL SQLite syncs the journal once per
    commit, not twice, and leaves the record count to the journal's size
    (docs/sqlite-vfs.md, "Durability")."""
    path = str(tmp_path / "j.db")
    conn = apsw.Connection(path, vfs="cd-count-syncs")
    for pragma in (f"page_size={page}", "synchronous=FULL", "journal_mode=DELETE"):
        conn.execute(f"PRAGMA {pragma}").fetchall()
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    with conn:
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, "x" * 300) for i in range(100)])
    count_syncs.syncs.clear()
    _commit_two_pages(conn, "y")
    assert count_syncs.syncs == {"journal": 1, "main": 1}
    assert conn.execute("SELECT count(*) FROM t WHERE v = 'y'").fetchall() == [(2,)]
    conn.close()


def test_a_journal_reused_from_before_is_synced_as_on_any_disk(tmp_path, keyring,
                                                               count_syncs, monkeypatch):
    """A rollback journal that already had a header when SQLite opened it (PERSIST
    keeping it between transactions) was laid out when it was created: here as
    a mutable file (kind 2) by a cryptdisk from before journals were framed, or for a
    page size VACUUM may have changed since. A torn segment there could zero part of a
    record, so while it is open the database does not claim safe append, and SQLite
    writes the record count and syncs the journal twice per commit, as on any disk."""
    path = tmp_path / "j.db"
    conn = _open_with_a_legacy_journal(path, keyring, monkeypatch, "PERSIST")
    count_syncs.syncs.clear()
    _commit_two_pages(conn, "y")
    # two in the commit, one after PERSIST zeroes the journal's header
    assert count_syncs.syncs == {"journal": 3, "main": 1}
    assert _header(str(path) + "-journal").kind == Kind.MUTABLE
    assert conn.execute("SELECT count(*) FROM t WHERE v = 'y'").fetchall() == [(2,)]
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.execute("PRAGMA journal_mode=DELETE").fetchall()  # deletes the legacy journal
    conn.execute("PRAGMA journal_mode=PERSIST").fetchall()
    count_syncs.syncs.clear()
    _commit_two_pages(conn, "z")  # SQLite creates the journal: framed, safe append
    assert count_syncs.syncs == {"journal": 2, "main": 1}
    assert _header(str(path) + "-journal").kind == Kind.FRAMED
    count_syncs.syncs.clear()
    _commit_two_pages(conn, "w")  # and reopens it for the next transaction: reused
    assert count_syncs.syncs == {"journal": 3, "main": 1}
    conn.execute("PRAGMA journal_mode=DELETE").fetchall()
    count_syncs.syncs.clear()
    _commit_two_pages(conn, "v")  # a new journal again
    assert count_syncs.syncs == {"journal": 1, "main": 1}
    assert conn.execute("SELECT count(*) FROM t WHERE v = 'v'").fetchall() == [(2,)]
    conn.close()


def test_a_truncate_mode_journal_starts_over_each_transaction(tmp_path, keyring, count_syncs,
                                                              monkeypatch):
    """TRUNCATE mode empties the journal at the end of every transaction, and the header
    goes with it (an empty journal is no journal to SQLite). So each transaction lays out
    a journal of its own, which claims safe append as in DELETE mode: SQLite syncs it once
    in the commit and once more after emptying it, where a journal kept from before (the
    legacy mutable one here, for its first commit) takes the two syncs of any disk."""
    path = tmp_path / "t.db"
    journal = str(path) + "-journal"
    conn = _open_with_a_legacy_journal(path, keyring, monkeypatch, "TRUNCATE")
    for n, value in enumerate("abcd"):
        count_syncs.syncs.clear()
        _commit_two_pages(conn, value)
        # the first commit still had the legacy journal open: two syncs, then the emptying one
        assert count_syncs.syncs == {"journal": 3 if n == 0 else 2, "main": 1}, n
        assert os.path.getsize(journal) == 0  # header and all
        assert conn.execute("SELECT count(*) FROM t WHERE v = ?", (value,)).fetchall() == [(2,)]
    conn.execute("PRAGMA cache_size=2").fetchall()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE t SET v = 'e' WHERE id < 50")  # spills: the journal is written
    assert _header(journal).kind == Kind.FRAMED  # laid out by this transaction
    with cryptdisk.open(journal, "rb", keyring=keyring) as f:
        assert f.read(12)[8:12] == b"\xff\xff\xff\xff"  # the record count: the file's size
    conn.execute("ROLLBACK")
    assert os.path.getsize(journal) == 0
    assert conn.execute("SELECT count(*) FROM t WHERE v = 'e'").fetchall() == [(0,)]
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()


def test_an_emptied_journal_kept_open_lays_itself_out_again(tmp_path, keyring):
    """With locking_mode=EXCLUSIVE SQLite keeps the journal open between transactions:
    emptied by one, it gets a new header (a new data key) at the next one's first write,
    through the same open file, and a rollback plays that journal back."""
    path = str(tmp_path / "x.db")
    conn = csql.connect(path, keyring=keyring)
    for pragma in ("locking_mode=EXCLUSIVE", "journal_mode=TRUNCATE", "synchronous=FULL",
                   "cache_size=2"):
        conn.execute(f"PRAGMA {pragma}").fetchall()
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    ids, file_ids = set(), set()
    for n in range(5):
        with conn:
            conn.executemany("INSERT INTO t VALUES (?, ?)",
                             [(n * 100 + i, "x" * 300) for i in range(100)])
        ids.update(range(n * 100, n * 100 + 100))
        assert os.path.getsize(path + "-journal") == 0
        conn.execute("BEGIN")
        conn.execute("UPDATE t SET v = 'gone'")  # spills: the journal is written
        header = _header(path + "-journal")
        assert header.kind == Kind.FRAMED and header.file_id not in file_ids
        file_ids.add(header.file_id)
        conn.execute("ROLLBACK")
        assert conn.execute("SELECT count(*) FROM t WHERE v = 'gone'").fetchall() == [(0,)]
    conn.close()
    conn = csql.connect(path, keyring=keyring)
    assert {i for (i,) in conn.execute("SELECT id FROM t")} == ids
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    conn.close()

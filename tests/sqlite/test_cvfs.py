"""What the C VFS does beyond the Python one: it avoids decrypting what it just wrote."""

from __future__ import annotations

import os

import pytest

import cryptdisk.sqlite as csql
from cryptdisk.format import Header, SegmentLayout
from cryptdisk.sqlite import _native


@pytest.fixture(autouse=True)
def vfs_implementation() -> None:
    """These tests are about the C VFS only (overrides conftest's run-under-both)."""


def _stats_delta(before: dict) -> dict:
    after = _native._cvfs.stats()
    return {k: after[k] - before[k] for k in before}


def _make_bank(conn, accounts: int) -> None:
    """The tables _tpcb_like updates, with ``accounts`` accounts."""
    conn.execute("CREATE TABLE acc(id INTEGER PRIMARY KEY, bal INTEGER, pad TEXT)")
    conn.execute("CREATE TABLE hist(v BLOB)")
    with conn:
        conn.executemany("INSERT INTO acc VALUES(?, 0, ?)",
                         [(i, "x" * 80) for i in range(accounts)])


def _tpcb_like(conn, i: int) -> None:
    with conn:
        conn.execute("UPDATE acc SET bal = bal + 1 WHERE id = ?", (i * 7919 % 5000,))
        conn.execute("INSERT INTO hist(v) VALUES(randomblob(50))")


def test_wal_commits_decrypt_nothing_and_checkpoints_each_page_once(tmp_path, keyring):
    conn = csql.connect(str(tmp_path / "w.db"), keyring=keyring, implementation="c")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    _make_bank(conn, 5000)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("SELECT sum(bal) FROM acc").fetchall()  # every page in SQLite's cache
    before = _native._cvfs.stats()
    for i in range(300):
        _tpcb_like(conn, i)
    delta = _stats_delta(before)
    assert delta["sealed"] >= 600  # the work was done: two or more frames a commit
    assert delta["opened"] == 0  # commits append whole frames: nothing is read back
    before = _native._cvfs.stats()
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    delta = _stats_delta(before)
    pages = conn.execute("PRAGMA page_count").fetchall()[0][0]
    # the checkpoint reads each page's last frame once and seals it into the database once
    assert 0 < delta["opened"] == delta["sealed"] <= pages
    assert conn.execute("SELECT sum(bal) FROM acc").fetchall() == [(300,)]
    conn.close()
    other = csql.connect(str(tmp_path / "w.db"), keyring=keyring, implementation="python")
    assert other.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert other.execute("SELECT sum(bal), (SELECT count(*) FROM hist) FROM acc").fetchall() \
        == [(300, 300)]
    other.close()


@pytest.mark.parametrize("journal", ["wal", "delete", "persist"])
def test_two_connections_taking_turns_never_trust_a_stale_cache(tmp_path, keyring, journal):
    """Each connection's cached tail goes stale when the other one writes; the nonce check
    notices, so every commit of both is there and the database is sound."""
    path = str(tmp_path / "t.db")
    a = csql.connect(path, keyring=keyring, implementation="c")
    a.execute(f"PRAGMA journal_mode={journal}")
    _make_bank(a, 5000)
    b = csql.connect(path, keyring=keyring, implementation="c")
    for i in range(400):
        _tpcb_like(a if i % 3 else b, i)
        if i % 97 == 0:
            (b if i % 2 else a).execute("PRAGMA wal_checkpoint(PASSIVE)" if journal == "wal"
                                        else "SELECT 1")
    for conn in (a, b):
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("SELECT sum(bal), (SELECT count(*) FROM hist) FROM acc").fetchall() \
            == [(400, 400)]
    a.close()
    b.close()


def _records(path) -> set[tuple[bytes, int, bytes]]:
    """(nonce, index, whole record) of every record in a mutable or framed file now."""
    with open(path, "rb") as f:
        raw = f.read()
    layout = SegmentLayout.of(Header.parse(raw))
    out, index = set(), 0
    while (at := layout.record_offset(index)) + 32 < len(raw):
        record = raw[at : at + layout.capacity(index) + 32]
        out.add((record[:16], index, record))
        index += 1
    return out


def test_a_forked_child_never_reuses_the_parents_nonces(tmp_path, keyring):
    """Nonces come from a per-file pool drawn 1 KiB at a time; a child that goes on using an
    inherited connection must draw its own, or both would seal with the same nonce (seen on
    disk one after the other, even where the later record replaced the earlier one)."""

    path = str(tmp_path / "f.db")
    conn = csql.connect(path, keyring=keyring, implementation="c")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(v BLOB)")
    conn.execute("INSERT INTO t VALUES(randomblob(100))")  # the WAL's pool is drawn now
    pid = os.fork()
    if pid == 0:  # the child: one commit through the inherited connection, then out
        try:
            conn.execute("INSERT INTO t VALUES(randomblob(100))")
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    seen = _records(path + "-wal")
    for _ in range(3):
        conn.execute("INSERT INTO t VALUES(randomblob(100))")
        seen |= _records(path + "-wal")
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(5,)]
    by_nonce: dict[bytes, set[tuple[int, bytes]]] = {}
    for nonce, index, record in seen:
        by_nonce.setdefault(nonce, set()).add((index, record))
    assert len(seen) >= 8
    assert all(len(records) == 1 for records in by_nonce.values())  # one nonce, one record
    conn.close()


def _wal_frames(path) -> int:
    """Frames in a framed WAL of 4 KiB pages, from its size."""
    with open(path, "rb") as f:
        layout = SegmentLayout.of(Header.parse(f.read(128)))
    _count, size, _cut = layout.measure(os.stat(path).st_size)
    return (size - 32) // (4096 + 24)


@pytest.mark.parametrize("sync", ["normal", "full"])
def test_wal_commits_never_rewrite_a_committed_record(tmp_path, keyring, sync):
    """A WAL is a framed file: a record per frame, so a commit appends whole records and
    never rewrites one holding an earlier commit's bytes (no -cdtail copy needed either):
    one record sealed per frame written."""
    path = str(tmp_path / "s.db")
    conn = csql.connect(path, keyring=keyring, implementation="c")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    _make_bank(conn, 2000)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for i in range(20):  # the WAL starts over and reaches a steady state
        _tpcb_like(conn, i)
    committed = _records(path + "-wal")
    frames_before = _wal_frames(path + "-wal")
    before = _native._cvfs.stats()
    commits = 100
    for i in range(commits):
        _tpcb_like(conn, i)
    delta = _stats_delta(before)
    frames = _wal_frames(path + "-wal") - frames_before
    assert frames >= commits
    assert delta["tail_saves"] == 0
    assert committed <= _records(path + "-wal")  # every earlier record still as it was
    assert delta["sealed"] == frames  # one record per frame, no padding frames
    assert conn.execute("SELECT count(*) FROM hist").fetchall() == [(commits + 20,)]
    conn.close()


@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_file_sizes_are_read_without_a_stat(tmp_path, keyring, journal):
    """Sizes come from lseek on SQLite's descriptor, never xFileSize's fstat.

    On Linux 6.13+ a stat marks the file's ctime as seen, so its next write takes a
    fine-grained timestamp and dirties the inode: with synchronous=FULL each commit's
    fdatasync then writes the inode block too (docs/sqlite-vfs.md, "Files on disk").
    """
    conn = csql.connect(str(tmp_path / "s.db"), keyring=keyring, implementation="c")
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("PRAGMA synchronous=FULL")
    _make_bank(conn, 5000)
    before = _native._cvfs.stats()
    for i in range(200):
        _tpcb_like(conn, i)
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)" if journal == "wal" else "SELECT 1")
    delta = _stats_delta(before)
    assert delta["size_queries"] > 0  # journal/WAL appends and page writes asked for sizes
    assert delta["size_fstats"] == 0
    conn.close()
    other = csql.connect(str(tmp_path / "s.db"), keyring=keyring, implementation="python")
    assert other.execute("SELECT sum(bal), (SELECT count(*) FROM hist) FROM acc").fetchall() \
        == [(200, 200)]
    other.close()


def _journal_headers(conn, path: str, transactions: int) -> list[bytes]:
    """The header of each transaction's rollback journal (DELETE mode), read mid-transaction
    (with a cache small enough that the transaction spills, so the journal is on disk)."""
    headers = []
    for i in range(transactions):
        conn.execute("BEGIN")
        conn.execute("UPDATE acc SET bal = bal + 1 WHERE id = ?", (i,))
        conn.execute("INSERT INTO hist(v) VALUES(randomblob(50))")  # spills: the journal exists
        with open(path + "-journal", "rb") as f:
            headers.append(f.read(128))
        conn.execute("COMMIT")
    return headers


def test_journal_headers_are_made_ahead_in_batches_and_each_used_once(tmp_path, keyring):
    path = str(tmp_path / "j.db")
    conn = csql.connect(path, keyring=keyring, implementation="c")
    conn.execute("PRAGMA cache_size=2")  # spill to the database mid-transaction
    _make_bank(conn, 500)
    before = _native._cvfs.stats()
    headers = _journal_headers(conn, path, 40)
    ids = {Header.parse(h).file_id for h in headers}
    assert len(ids) == 40  # a fresh file id (and data key) for every journal
    assert 0 < _stats_delta(before)["header_batches"] <= 40 // 8 + 1  # one call per 8 journals
    assert conn.execute("SELECT sum(bal), (SELECT count(*) FROM hist) FROM acc").fetchall() \
        == [(40, 40)]
    conn.close()


def test_a_forked_child_never_uses_the_parents_pooled_journal_headers(tmp_path, keyring):
    path, other = str(tmp_path / "p.db"), str(tmp_path / "c.db")
    setup = csql.connect(other, keyring=keyring, implementation="c")
    _make_bank(setup, 500)
    setup.close()
    conn = csql.connect(path, keyring=keyring, implementation="c")
    conn.execute("PRAGMA cache_size=2")  # spill to the database mid-transaction
    _make_bank(conn, 500)
    _journal_headers(conn, path, 1)  # the pool now holds headers made ahead
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another database, through the inherited VFS and its pool
        try:
            child = csql.connect(other, keyring=keyring, implementation="c")
            child.execute("PRAGMA cache_size=2")
            os.write(write_end, b"".join(_journal_headers(child, other, 3)))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as r:
        theirs = r.read()
    assert os.waitpid(pid, 0)[1] == 0
    assert len(theirs) == 3 * 128
    mine = _journal_headers(conn, path, 3)
    child_ids = {Header.parse(theirs[i:i + 128]).file_id for i in range(0, len(theirs), 128)}
    assert not child_ids & {Header.parse(h).file_id for h in mine}
    conn.close()


class _BadBatches(_native.NativeVFS):
    """header_for answers a batch of journal headers with a list one short."""

    def _header_for(self, path, header, segment_size, lead, frame_extra, count=0, attempt=None):
        made = super()._header_for(path, header, segment_size, lead, frame_extra, count, attempt)
        return made[1:] if count else made


def test_a_malformed_batch_of_headers_is_an_error_not_a_journal(tmp_path, keyring):
    import apsw

    vfs = _BadBatches(keyring)
    path = str(tmp_path / "b.db")
    conn = apsw.Connection(path, vfs=vfs.vfs_name)
    with pytest.raises(TypeError, match=r"a list of 8 \(header, dek\) pairs"):
        conn.execute("CREATE TABLE t(v)")  # the first journal: a batch is asked for
    conn.close()
    journal = path + "-journal"
    assert not os.path.exists(journal) or os.path.getsize(journal) == 0  # nothing half-made
    good = csql.connect(path, keyring=keyring, implementation="c")  # and nothing broken
    good.execute("CREATE TABLE t(v)")
    good.execute("INSERT INTO t VALUES(1)")
    assert good.execute("SELECT v FROM t").fetchall() == [(1,)]
    good.close()


def _failing_updates(conn, other, times: int) -> None:
    """Run ``times`` multi-row UPDATEs whose function raises on the second row, checking
    after each that neither connection sees the first row's change."""
    def boom(value):
        if value == "b":
            raise ValueError("refused")
        return value + "x"

    conn.create_scalar_function("boom", boom)
    for _ in range(times):
        with pytest.raises(ValueError, match="refused"):
            conn.execute("UPDATE f SET s = boom(s)")
        assert conn.execute("SELECT s FROM f ORDER BY id").fetchall() == [("a",), ("b",), ("c",)]
        assert other.execute("SELECT s FROM f ORDER BY id").fetchall() == [("a",), ("b",), ("c",)]


def test_a_statement_failing_in_a_function_rolls_back_whatever_journal_it_needs(tmp_path, keyring):
    """A function that raises leaves its exception pending while SQLite rolls the
    statement back, and the rollback may need a batch of new journal headers from Python
    (every 8 journals): it gets them (the 7th such UPDATE kept its first row's change in
    the connection's cache, and left the journal, when the C code refused to call Python
    with an exception pending)."""
    path = str(tmp_path / "f.db")
    conn = csql.connect(path, keyring=keyring, implementation="c")
    other = csql.connect(path, keyring=keyring, implementation="c")
    conn.execute("CREATE TABLE f(id INTEGER PRIMARY KEY, s TEXT)")
    conn.execute("INSERT INTO f VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    _failing_updates(conn, other, 20)
    assert not os.path.exists(path + "-journal")
    conn.execute("UPDATE f SET s = s || 'y' WHERE id = 1")  # and the connection still writes
    assert other.execute("SELECT s FROM f WHERE id = 1").fetchall() == [("ay",)]
    conn.close()
    other.close()


class _FailingJournalHeaders(_native.NativeVFS):
    """header_for fails to make new journal headers once ``allowed`` batches were made (a
    key provider that went away)."""

    allowed = 1

    def _header_for(self, path, header, segment_size, lead, frame_extra, count=0, attempt=None):
        if header is None and count:
            if self.allowed <= 0:
                raise OSError("the key provider is unreachable")
            self.allowed -= 1
        return super()._header_for(path, header, segment_size, lead, frame_extra, count, attempt)


def test_a_rollback_whose_journal_cannot_be_made_leaves_no_change_behind(tmp_path, keyring):
    """When the journal's header cannot be made during a failed statement's rollback, the
    VFS answers SQLite with an I/O error, which puts its pager in the error state: the
    connection drops the changed pages instead of showing (and building on) a partial
    update that was never committed."""
    import apsw

    vfs = _FailingJournalHeaders(keyring)
    path = str(tmp_path / "g.db")
    conn = apsw.Connection(path, vfs=vfs.vfs_name)
    other = csql.connect(path, keyring=keyring, implementation="c")
    conn.execute("CREATE TABLE f(id INTEGER PRIMARY KEY, s TEXT)")
    conn.execute("INSERT INTO f VALUES (1, 'a'), (2, 'b'), (3, 'c')")
    _failing_updates(conn, other, 10)  # the journals after the first 8 cannot be made
    with pytest.raises(OSError, match="unreachable"):  # a write that needs one says why
        conn.execute("UPDATE f SET s = 'z' WHERE id = 1")
    assert other.execute("SELECT s FROM f ORDER BY id").fetchall() == [("a",), ("b",), ("c",)]
    conn.close()
    other.close()


def _page_record(conn, path: str, table: str) -> int:
    """Where the record of ``table``'s root page is in the database file."""
    ((root,),) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?",
                              (table,)).fetchall()
    with open(path, "rb") as f:
        layout = SegmentLayout.of(Header.parse(f.read(4096)))
    return layout.record_offset(root - 1)


def _two_readers(tmp_path, keyring):
    """A database in WAL mode whose ``acc`` pages are all in the database file, a reader of
    it and a writer of another table (each commit makes the reader drop its page cache)."""
    path = str(tmp_path / "r.db")
    reader = csql.connect(path, keyring=keyring, implementation="c")
    reader.execute("PRAGMA journal_mode=WAL")
    _make_bank(reader, 5000)
    reader.execute("CREATE TABLE other(v INTEGER)")
    reader.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    writer = csql.connect(path, keyring=keyring, implementation="c")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    return path, reader, writer


def test_unchanged_records_read_again_are_not_opened_again(tmp_path, keyring):
    """When another connection's commit made SQLite drop a connection's page cache, the
    records it reads again, unchanged (page 1, the B-tree's root and the rows' leaves),
    come from the plaintexts the VFS kept once it had opened them twice, not from AES-GCM;
    what it reads is the same. A scan of more records than it keeps reuses none."""
    _path, reader, writer = _two_readers(tmp_path, keyring)
    query = "SELECT id, bal FROM acc WHERE id IN (7, 2500, 4999)"
    deltas = []
    for i in range(4):
        writer.execute("INSERT INTO other VALUES(?)", (i,))  # the reader's cache is stale
        before = _native._cvfs.stats()
        assert reader.execute(query).fetchall() == [(7, 0), (2500, 0), (4999, 0)]
        deltas.append(_stats_delta(before))
    touched = deltas[0]["opened"]
    assert touched >= 5  # page 1, the root, three leaves (and the WAL's record of 'other')
    assert [d["reused"] for d in deltas[:2]] == [0, 0]
    for d in deltas[2:]:
        assert d["reused"] >= 5 and d["opened"] + d["reused"] == touched
    before = _native._cvfs.stats()
    for i in range(3):
        writer.execute("INSERT INTO other VALUES(?)", (i,))
        assert reader.execute("SELECT sum(id) FROM acc").fetchall() == [(5000 * 4999 // 2,)]
    scans = _stats_delta(before)
    assert scans["opened"] > 3 * 32 and scans["reused"] < 3 * 5
    reader.close()
    writer.close()


def test_a_kept_record_changed_on_disk_is_opened_and_refused(tmp_path, keyring):
    """A kept plaintext is used only for the very record it came from, byte for byte: a
    byte flipped in that record on disk is refused as it is without the kept copy."""
    path, reader, writer = _two_readers(tmp_path, keyring)
    query = "SELECT bal FROM acc WHERE id = 2500"
    for i in range(3):  # the root page's record is opened twice, then reused
        writer.execute("INSERT INTO other VALUES(?)", (i,))
        before = _native._cvfs.stats()
        assert reader.execute(query).fetchall() == [(0,)]
    assert _stats_delta(before)["reused"] >= 3
    at = _page_record(reader, path, "acc") + 16 + 100  # inside the root page's ciphertext
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 1]))
    writer.execute("INSERT INTO other VALUES(99)")
    with pytest.raises(csql.PageAuthenticationError):
        reader.execute(query).fetchall()
    with open(path, "r+b") as f:  # put back: the kept copy is used again
        f.seek(at)
        f.write(byte)
    writer.execute("INSERT INTO other VALUES(100)")
    before = _native._cvfs.stats()
    assert reader.execute(query).fetchall() == [(0,)]
    assert _stats_delta(before)["reused"] >= 1
    reader.close()
    writer.close()

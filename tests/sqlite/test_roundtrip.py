"""Encrypted SQLite gives the same answers as plain SQLite, in every journal mode and page size."""

from __future__ import annotations

import random

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.format import HEADER_SIZE, Header

from .conftest import files_of

PAGE_SIZES = [512, 1024, 4096, 8192, 65536]


def workload(conn: apsw.Connection, seed: int, rows: int = 400) -> None:
    """Inserts, updates, deletes and an index: enough pages to spill a tiny cache."""
    rnd = random.Random(seed)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v BLOB)")
    conn.execute("CREATE INDEX t_k ON t(k)")
    with conn:
        for i in range(rows):
            conn.execute("INSERT INTO t VALUES(?, ?, ?)",
                         (i, f"key{rnd.randrange(10**6)}", rnd.randbytes(rnd.randrange(1, 700))))
    with conn:
        conn.execute("UPDATE t SET v = zeroblob(300) WHERE id % 3 = 0")
        conn.execute("DELETE FROM t WHERE id % 5 = 0")
    conn.execute("BEGIN")
    conn.execute("DELETE FROM t")  # rolled back: the journal/WAL must restore every page
    conn.execute("ROLLBACK")


def dump(conn: apsw.Connection) -> list:
    return conn.execute("SELECT id, k, v FROM t ORDER BY id").fetchall()


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize(("journal", "sync"), [("delete", "full"), ("wal", "normal"),
                                               ("wal", "full"), ("truncate", "off"),
                                               ("persist", "normal"), ("wal", "off")])
def test_same_as_plain_sqlite(tmp_path, keyring, page_size, journal, sync):
    results = []
    for encrypted in (False, True):
        path = tmp_path / f"{'enc' if encrypted else 'plain'}.db"
        conn = (csql.connect(str(path), keyring=keyring) if encrypted
                else apsw.Connection(str(path)))
        conn.execute(f"PRAGMA page_size={page_size}")
        conn.execute(f"PRAGMA journal_mode={journal}")
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.execute("PRAGMA cache_size=4")  # far smaller than the database
        workload(conn, seed=page_size)
        before = dump(conn)
        conn.close()
        conn = (csql.connect(str(path), keyring=keyring) if encrypted
                else apsw.Connection(str(path)))
        conn.execute("PRAGMA cache_size=4")
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA page_size").fetchall() == [(page_size,)]
        after = dump(conn)
        assert after == before
        results.append(after)
        conn.close()
    assert results[0] == results[1]
    assert len(results[0]) == 320
    # The encrypted file is a cryptdisk mutable file whose segment is one page.
    raw = (tmp_path / "enc.db").read_bytes()
    assert Header.parse(raw[:HEADER_SIZE]).segment_size == page_size


def test_readable_with_the_core_format_reader(tmp_path, keyring):
    """The VFS writes exactly the mutable format: cryptdisk.open decrypts it to a SQLite file."""
    path = tmp_path / "a.db"
    conn = csql.connect(str(path), keyring=keyring)
    workload(conn, seed=1)
    rows = dump(conn)
    conn.close()
    with cryptdisk.open(path, "rb", keyring=keyring) as f:
        plain = f.read()
    assert plain.startswith(b"SQLite format 3\0")
    (tmp_path / "plain.db").write_bytes(plain)
    assert dump(apsw.Connection(str(tmp_path / "plain.db"))) == rows


@pytest.mark.parametrize("page_size", [1024, 4096])
def test_a_database_the_format_wrote_opens_through_the_vfs(tmp_path, keyring, page_size):
    """The reverse: a plain SQLite file written through the format's MutableStore
    (cryptdisk.open 'w+b', a segment per page) is a database each VFS reads and extends."""
    plain = tmp_path / "plain.db"
    conn = apsw.Connection(str(plain))
    conn.execute(f"PRAGMA page_size={page_size}")
    workload(conn, seed=3)
    rows = dump(conn)
    conn.close()
    path = tmp_path / "f.db"
    with cryptdisk.open(path, "w+b", keyring=keyring, segment_size=page_size) as f:
        f.write(plain.read_bytes())
    conn = csql.connect(str(path), keyring=keyring)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert dump(conn) == rows
    conn.execute("INSERT INTO t VALUES(1000, 'new', x'00')")
    conn.close()
    with cryptdisk.open(path, "rb", keyring=keyring) as f:  # and back through the format
        plain.write_bytes(f.read())
    assert dump(apsw.Connection(str(plain)))[-1] == (1000, "new", b"\0")


def test_vacuum_grows_the_page_size(tmp_path, keyring):
    path = tmp_path / "v.db"
    conn = csql.connect(str(path), keyring=keyring)
    conn.execute("PRAGMA page_size=1024")
    workload(conn, seed=2)
    rows = dump(conn)
    conn.execute("PRAGMA page_size=4096")
    conn.execute("VACUUM")
    conn.close()
    conn = csql.connect(str(path), keyring=keyring)
    assert conn.execute("PRAGMA page_size").fetchall() == [(4096,)]
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert dump(conn) == rows
    conn.close()


def _shrink_by_vacuum(conn: apsw.Connection, path: str, keyring: cryptdisk.Keyring) -> None:
    conn.execute("PRAGMA page_size=1024")
    conn.execute("VACUUM")


def _shrink_by_backup(conn: apsw.Connection, path: str, keyring: cryptdisk.Keyring) -> None:
    source = csql.connect(path + ".small", keyring=keyring)
    source.execute("PRAGMA page_size=1024")
    source.execute("CREATE TABLE s(x)")
    try:
        with conn.backup("main", source, "main") as b:
            b.step()
    finally:
        source.close()


@pytest.mark.parametrize("shrink", [_shrink_by_vacuum, _shrink_by_backup])
def test_the_page_size_cannot_shrink_below_the_records(tmp_path, keyring, shrink):
    """A page smaller than the file's records (the page size of its first write) would
    share a record with other pages: writing it rewrites them all, and a write cut by a
    crash would lose pages its journal does not hold. VACUUM (or a backup into it) to a
    smaller page size is refused and changes nothing; VACUUM INTO a new file does it."""
    path = tmp_path / "v.db"
    conn = csql.connect(str(path), keyring=keyring)
    workload(conn, seed=2)
    rows = dump(conn)
    with pytest.raises(csql.PageSizeError, match="4096") as info:
        shrink(conn, str(path), keyring)
    assert isinstance(info.value, cryptdisk.CryptdiskError)
    assert "VACUUM INTO" in str(info.value)
    assert conn.execute("PRAGMA page_size").fetchall() == [(4096,)]
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert dump(conn) == rows
    conn.execute("INSERT INTO t VALUES(1000, 'after', x'01')")  # the connection goes on
    conn.execute("PRAGMA page_size=1024")
    conn.execute(f"VACUUM INTO '{tmp_path / 'small.db'}'")
    conn.close()
    conn = csql.connect(str(path), keyring=keyring)
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert dump(conn) == [*rows, (1000, "after", b"\1")]
    conn.close()
    small = csql.connect(str(tmp_path / "small.db"), keyring=keyring)
    assert small.execute("PRAGMA page_size").fetchall() == [(1024,)]
    assert dump(small) == [*rows, (1000, "after", b"\1")]
    small.execute("INSERT INTO t VALUES(1001, 'small', x'02')")
    small.close()
    raw = (tmp_path / "small.db").read_bytes()
    assert Header.parse(raw[:HEADER_SIZE]).segment_size == 1024


def test_a_database_with_pages_smaller_than_its_records_stays_writable(tmp_path, keyring):
    """Such a file (pages of 1024 bytes in records of 4096, as an older cryptdisk's VACUUM
    left it) opens and takes writes; VACUUM to the record size makes a page a record."""
    plain = tmp_path / "plain.db"
    conn = apsw.Connection(str(plain))
    conn.execute("PRAGMA page_size=1024")
    workload(conn, seed=4)
    rows = dump(conn)
    conn.close()
    path = tmp_path / "f.db"
    with cryptdisk.open(path, "w+b", keyring=keyring, segment_size=4096) as f:
        f.write(plain.read_bytes())
    conn = csql.connect(str(path), keyring=keyring)
    conn.execute("INSERT INTO t VALUES(1000, 'new', x'00')")
    conn.execute("PRAGMA page_size=4096")
    conn.execute("VACUUM")
    conn.close()
    conn = csql.connect(str(path), keyring=keyring)
    assert conn.execute("PRAGMA page_size").fetchall() == [(4096,)]
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert dump(conn) == [*rows, (1000, "new", b"\0")]
    conn.close()


def test_two_connections_see_each_others_commits(tmp_path, keyring):
    path = str(tmp_path / "two.db")
    a = csql.connect(path, keyring=keyring)
    a.execute("PRAGMA journal_mode=WAL")
    a.execute("CREATE TABLE t(x)")
    b = csql.connect(path, keyring=keyring)
    for i in range(50):
        (a if i % 2 else b).execute("INSERT INTO t VALUES(?)", (i,))
    assert a.execute("SELECT count(*), sum(x) FROM t").fetchall() == [(50, 1225)]
    assert b.execute("SELECT count(*), sum(x) FROM t").fetchall() == [(50, 1225)]
    b.close()
    a.close()


def test_temporary_files_and_mmap(tmp_path, keyring):
    """Sorts spilled to temporary files work, and mmap_size cannot bypass decryption."""
    path = str(tmp_path / "tmp.db")
    conn = csql.connect(path, keyring=keyring, temp_store_memory=False)
    conn.execute("PRAGMA cache_size=4")
    conn.execute("PRAGMA temp_store=FILE")
    workload(conn, seed=3)
    conn.execute("CREATE TEMP TABLE scratch AS SELECT * FROM t")
    ordered = conn.execute("SELECT k FROM scratch ORDER BY v, k").fetchall()
    assert len(ordered) == 320
    conn.close()
    conn = csql.connect(path, keyring=keyring)
    conn.execute("PRAGMA mmap_size=100000000")
    assert len(dump(conn)) == 320


def test_no_plaintext_on_disk(tmp_path, keyring):
    """A marker string appears in no file: database, rollback journal, WAL, shm."""
    marker = b"TOP-SECRET-MARKER-4242"
    seen = []
    for journal in ("delete", "wal"):
        path = tmp_path / f"{journal}.db"
        conn = csql.connect(str(path), keyring=keyring)
        conn.execute(f"PRAGMA journal_mode={journal}")
        conn.execute("PRAGMA cache_size=4")
        conn.execute("CREATE TABLE t(x)")
        with conn:
            conn.executemany("INSERT INTO t VALUES(?)",
                             [(marker + b"-%d" % i * 20,) for i in range(300)])
        conn.execute("BEGIN")  # a transaction bigger than the cache: the journal spills
        conn.execute("UPDATE t SET x = x || 'changed'")
        for f in files_of(path):
            seen.append(f.name)
            assert marker not in f.read_bytes(), f
        conn.execute("COMMIT")
        for f in files_of(path):
            assert marker not in f.read_bytes(), f
        conn.close()
    assert "delete.db-journal" in seen and "wal.db-wal" in seen


def test_attach_and_vacuum_into_write_encrypted_files(tmp_path, keyring):
    """ATTACH and VACUUM INTO go through the connection's VFS: no plaintext on disk,
    a plain file is refused at ATTACH, and one attached by URI with vfs=unix stays plain."""
    marker = b"TOP-SECRET-MARKER-4343"
    other = csql.connect(str(tmp_path / "other.db"), keyring=keyring)
    other.execute("CREATE TABLE o(x)")
    other.execute("INSERT INTO o VALUES('from other')")
    other.close()
    plain = apsw.Connection(str(tmp_path / "plain.db"))
    plain.execute("CREATE TABLE p(x)")
    plain.execute("INSERT INTO p VALUES('plain')")
    plain.close()
    conn = csql.connect(str(tmp_path / "main.db"), keyring=keyring,
                        flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
                        | apsw.SQLITE_OPEN_URI)
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES(?)", (marker,))
    conn.execute(f"ATTACH '{tmp_path / 'other.db'}' AS other")
    assert conn.execute("SELECT x FROM other.o").fetchall() == [("from other",)]
    conn.execute(f"ATTACH '{tmp_path / 'new.db'}' AS new")
    conn.execute("CREATE TABLE new.n AS SELECT x FROM t")
    with pytest.raises(cryptdisk.NotEncryptedError):
        conn.execute(f"ATTACH '{tmp_path / 'plain.db'}' AS p")
    conn.execute(f"ATTACH 'file:{tmp_path / 'plain.db'}?vfs=unix' AS p")
    assert conn.execute("SELECT x FROM p.p").fetchall() == [("plain",)]
    conn.execute(f"VACUUM INTO '{tmp_path / 'copy.db'}'")
    conn.close()
    for name in ("main.db", "new.db", "copy.db"):
        raw = (tmp_path / name).read_bytes()
        assert marker not in raw and raw.startswith(cryptdisk.format.MAGIC), name
    for name, table in (("new.db", "n"), ("copy.db", "t")):
        conn = csql.connect(str(tmp_path / name), keyring=keyring)
        assert conn.execute(f"SELECT x FROM {table}").fetchall() == [(marker,)]
        conn.close()
    assert (tmp_path / "plain.db").read_bytes().startswith(b"SQLite format 3\0")


def test_vacuum_into_gives_the_copy_a_new_data_key(tmp_path):
    """The way to new data keys for a database (docs/sqlite.md, after "rotate")."""
    old, new = cryptdisk.Key(1, bytes(range(32))), cryptdisk.Key(2, bytes(range(2, 34)))
    keyring = cryptdisk.Keyring([old, new], current_key_id=2)
    conn = csql.connect(str(tmp_path / "a.db"), keyring=cryptdisk.Keyring([old]))
    workload(conn, seed=5)
    rows = dump(conn)
    conn.close()
    conn = csql.connect(str(tmp_path / "a.db"), keyring=keyring)
    conn.execute(f"VACUUM INTO '{tmp_path / 'b.db'}'")
    conn.close()
    headers = [Header.parse((tmp_path / n).read_bytes()[:HEADER_SIZE]) for n in ("a.db", "b.db")]
    assert [h.key_id for h in headers] == [1, 2]
    assert headers[0].file_id != headers[1].file_id
    deks = [cryptdisk.format.open_header(h, keyring) for h in headers]
    assert deks[0] != deks[1]
    conn = csql.connect(str(tmp_path / "b.db"), keyring=cryptdisk.Keyring([new]))
    assert dump(conn) == rows
    conn.close()


def test_vfs_name_and_repr_hide_the_key(tmp_path):
    key = cryptdisk.Key(7, bytes(range(32)))
    keyring = cryptdisk.Keyring([key])
    vfs = csql.vfs_for(keyring)
    assert csql.vfs_for(keyring) is vfs  # registered once per keyring
    for text in (vfs.vfs_name, repr(vfs), *apsw.vfs_names()):
        assert bytes(range(32)).hex() not in text
        assert "0001020304" not in text
    conn = csql.connect(str(tmp_path / "r.db"), keyring=keyring)
    conn.execute("CREATE TABLE t(x)")
    assert bytes(range(32)).hex() not in conn.vfsname("main")
    if csql.implementation() == "c":  # a shim reports itself over the VFS it wraps
        assert conn.vfsname("main") == f"{vfs.vfs_name}/unix"
    conn.close()


OPS = st.lists(st.tuples(st.sampled_from(["put", "del", "commit", "rollback"]),
                         st.integers(0, 60), st.binary(max_size=900)), max_size=60)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, wal=st.booleans())
def test_random_workloads_match_plain(tmp_path_factory, keyring, ops, wal):
    d = tmp_path_factory.mktemp("hyp")
    conns = [apsw.Connection(str(d / "plain.db")), csql.connect(str(d / "enc.db"), keyring=keyring)]
    for c in conns:
        c.execute(f"PRAGMA journal_mode={'wal' if wal else 'delete'}").fetchall()
        c.execute("PRAGMA cache_size=3")
        c.execute("CREATE TABLE kv(k INTEGER PRIMARY KEY, v BLOB); BEGIN")
    for op, k, v in ops:
        for c in conns:
            if op == "put":
                c.execute("INSERT OR REPLACE INTO kv VALUES(?, ?)", (k, v))
            elif op == "del":
                c.execute("DELETE FROM kv WHERE k = ?", (k,))
            else:
                c.execute(op.upper())
                c.execute("BEGIN")
    for c in conns:
        c.execute("COMMIT")
    got = [c.execute("SELECT * FROM kv ORDER BY k").fetchall() for c in conns]
    assert got[0] == got[1]
    for c in conns:
        c.close()
    again = csql.connect(str(d / "enc.db"), keyring=keyring)
    assert again.execute("SELECT * FROM kv ORDER BY k").fetchall() == got[0]
    assert again.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    again.close()

"""The DB-API 2.0 interface: sqlite3's behaviour, cryptdisk's files."""

from __future__ import annotations

import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.sqlite import dbapi


def test_module_globals_and_round_trip(tmp_path, keyring):
    assert (dbapi.apilevel, dbapi.paramstyle, dbapi.threadsafety) == ("2.0", "qmark", 1)
    path = tmp_path / "d.db"
    with dbapi.connect(path, keyring=keyring) as conn:
        cur = conn.cursor()
        cur.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, score REAL)")
        cur.executemany("INSERT INTO t(name, score) VALUES (?, ?)",
                        [("ada lovelace", 1.5), ("bob", 2.5), ("cy", None)])
        assert cur.rowcount == 3 and cur.description is None
        cur.execute("INSERT INTO t(name) VALUES (:name)", {"name": "dee"})
        assert cur.lastrowid == 4 and cur.rowcount == 1
    conn.close()
    raw = path.read_bytes()
    assert raw[:8] == b"CRYPTDSK" and b"ada lovelace" not in raw  # encrypted at rest
    with dbapi.connect(path, keyring=keyring) as again:
        cur = again.execute("SELECT id, name FROM t ORDER BY id")
        assert [d[0] for d in cur.description] == ["id", "name"]
        assert cur.rowcount == -1
        assert cur.fetchone() == (1, "ada lovelace")
        assert cur.fetchmany(2) == [(2, "bob"), (3, "cy")]
        assert cur.fetchall() == [(4, "dee")]
        assert cur.fetchone() is None
        assert list(again.execute("SELECT count(*) FROM t")) == [(4,)]
        empty = again.execute("SELECT name, score FROM t WHERE id > 99")
        assert [d[0] for d in empty.description] == ["name", "score"]  # even with no rows
        assert empty.fetchall() == []
        assert again.execute("UPDATE t SET score = 0 WHERE id > 99").rowcount == 0
        assert again.execute("UPDATE t SET score = 0 WHERE id > 2").rowcount == 2
    again.close()


def test_implicit_transactions_commit_and_rollback(tmp_path, keyring):
    path = tmp_path / "tx.db"
    conn = dbapi.connect(path, keyring=keyring)
    conn.execute("CREATE TABLE t(v)")
    assert not conn.in_transaction
    conn.execute("INSERT INTO t VALUES (1)")
    assert conn.in_transaction  # begun before the INSERT, as sqlite3 does
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(0,)]
    conn.execute("INSERT INTO t VALUES (2)")
    conn.commit()
    conn.execute("INSERT INTO t VALUES (3)")
    conn.close()  # an open transaction is rolled back at close
    other = dbapi.connect(path, keyring=keyring)
    assert other.execute("SELECT v FROM t").fetchall() == [(2,)]
    with pytest.raises(ZeroDivisionError), other:
        other.execute("INSERT INTO t VALUES (4)")
        raise ZeroDivisionError  # the with block rolls back
    assert other.execute("SELECT v FROM t").fetchall() == [(2,)]
    other.close()
    other.close()  # a second close does nothing


def test_a_write_after_a_comment_begins_the_transaction_too(tmp_path, keyring):
    """sqlite3 skips leading comments when it looks for INSERT/UPDATE/DELETE/REPLACE;
    so does this module, or the write would commit at once and rollback() not undo it."""
    conn = dbapi.connect(tmp_path / "c.db", keyring=keyring)
    conn.execute("CREATE TABLE t(v)")
    for sql in ("-- add one\nINSERT INTO t VALUES (1)",
                "/* a block\n comment */ INSERT INTO t VALUES (1)",
                "  -- two\n  -- lines\n\tinsert into t values (1)"):
        cur = conn.execute(sql)
        assert conn.in_transaction, sql
        assert cur.rowcount == 1, sql
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM t").fetchall() == [(0,)], sql
    conn.close()


def test_errors_are_pep_249_exceptions(tmp_path, keyring):
    conn = dbapi.connect(tmp_path / "e.db", keyring=keyring)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(dbapi.IntegrityError, match="UNIQUE"):
        conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(dbapi.OperationalError, match="no such table"):
        conn.execute("SELECT * FROM missing")
    with pytest.raises(dbapi.ProgrammingError):
        conn.execute("SELECT ?", (1, 2))  # wrong number of parameters
    assert issubclass(dbapi.IntegrityError, dbapi.DatabaseError)
    assert issubclass(dbapi.DatabaseError, dbapi.Error)
    cur = conn.cursor()
    cur.close()
    with pytest.raises(dbapi.ProgrammingError, match="closed cursor"):
        cur.execute("SELECT 1")
    conn.close()
    with pytest.raises(dbapi.ProgrammingError, match="closed connection"):
        conn.execute("SELECT 1")


def test_cryptdisk_errors_pass_through(tmp_path, keyring):
    path = tmp_path / "k.db"
    conn = dbapi.connect(path, keyring=keyring)
    conn.execute("CREATE TABLE t(v)")
    conn.commit()
    conn.close()
    with pytest.raises(cryptdisk.WrongKeyError):
        dbapi.connect(path, keyring=cryptdisk.Keyring([cryptdisk.Key(
            keyring.current_key().key_id, bytes(32))]))
    data = bytearray(path.read_bytes())
    data[200] ^= 1  # a byte of page 1's record
    path.write_bytes(bytes(data))
    with pytest.raises(cryptdisk.AuthenticationError):
        dbapi.connect(path, keyring=keyring).execute("SELECT * FROM t").fetchall()


def test_the_apsw_connection_is_reachable(tmp_path, keyring):
    conn = dbapi.connect(tmp_path / "a.db", keyring=keyring)
    assert conn.apsw.filename.endswith("a.db")
    assert csql.implementation() in csql.IMPLEMENTATIONS
    assert "closed" not in repr(conn)
    conn.close()
    assert "closed" in repr(conn)


def test_executescript_commits_first_then_runs_every_statement(tmp_path, keyring):
    conn = dbapi.connect(tmp_path / "s.db", keyring=keyring)
    conn.execute("CREATE TABLE t(v)")
    conn.execute("INSERT INTO t VALUES (1)")  # an open transaction: committed first
    cur = conn.executescript("""
        CREATE TABLE u(w);
        INSERT INTO u VALUES ('a'); INSERT INTO u VALUES ('b');
        SELECT * FROM u;  -- rows of a script are not returned
    """)
    assert isinstance(cur, dbapi.Cursor)
    assert not conn.in_transaction
    conn.rollback()
    assert conn.execute("SELECT count(*) FROM t").fetchall() == [(1,)]
    assert conn.execute("SELECT w FROM u ORDER BY w").fetchall() == [("a",), ("b",)]
    with pytest.raises(dbapi.OperationalError):
        conn.executescript("INSERT INTO u VALUES ('c'); SELEC 1;")
    assert conn.execute("SELECT count(*) FROM u").fetchall() == [(3,)]  # as sqlite3
    conn.close()


def test_backup_copies_into_another_connection_as_sqlite3_does(tmp_path, keyring):
    """Connection.backup(target, pages=, progress=, name=): SQLite's online backup API,
    into another encrypted database (or any apsw connection), as sqlite3's backup()."""
    src = dbapi.connect(tmp_path / "src.db", keyring=keyring)
    src.execute("CREATE TABLE t(v)")
    src.executemany("INSERT INTO t VALUES (?)", [(b"secret-%d" % i * 50,) for i in range(200)])
    src.commit()
    dst = dbapi.connect(tmp_path / "dst.db", keyring=keyring)
    calls = []
    src.backup(dst, pages=5, progress=lambda status, remaining, total: calls.append(
        (status, remaining, total)))
    assert len(calls) > 2 and calls[-1][1] == 0 and calls[0][2] == calls[-1][2] > 5
    assert [status for status, _, _ in calls] == [0] * (len(calls) - 1) + [101]  # DONE
    assert dst.execute("SELECT count(*) FROM t").fetchall() == [(200,)]
    dst.close()
    assert b"secret-" not in (tmp_path / "dst.db").read_bytes()
    with pytest.raises(TypeError):
        src.backup("dst.db")
    with pytest.raises(ValueError):
        src.backup(src)
    src.close()
    with pytest.raises(dbapi.ProgrammingError):
        src.backup(dst)


def test_pythons_sqlite3_cannot_open_an_encrypted_database(tmp_path, keyring):
    import sqlite3

    conn = dbapi.connect(tmp_path / "e.db", keyring=keyring)
    conn.execute("CREATE TABLE t(v)")
    vfs = csql.vfs_for(keyring).vfs_name
    conn.close()
    plain = sqlite3.connect(tmp_path / "e.db")
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        plain.execute("SELECT * FROM t")
    plain.close()
    with pytest.raises(sqlite3.OperationalError, match="no such vfs"):
        sqlite3.connect(f"file:{tmp_path / 'e.db'}?vfs={vfs}", uri=True)


def test_rowcount_of_a_write_with_returning_counts_once_its_rows_are_read(tmp_path, keyring):
    """As sqlite3: an INSERT/UPDATE/DELETE ... RETURNING finishes as its rows are fetched,
    and rowcount then holds the rows it changed."""
    conn = dbapi.connect(tmp_path / "r.db", keyring=keyring)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v)")
    cur = conn.execute("INSERT INTO t(v) VALUES ('a'), ('b'), ('c') RETURNING id")
    assert cur.fetchall() == [(1,), (2,), (3,)]
    assert cur.rowcount == 3
    cur = conn.execute("UPDATE t SET v = 'z' WHERE id > 1 RETURNING id, v")
    assert cur.fetchone() == (2, "z")
    assert list(cur) == [(3, "z")]
    assert cur.rowcount == 2
    assert conn.execute("DELETE FROM t WHERE id = 1").rowcount == 1
    conn.close()

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
                        [("ada", 1.5), ("bob", 2.5), ("cy", None)])
        assert cur.rowcount == 3 and cur.description is None
        cur.execute("INSERT INTO t(name) VALUES (:name)", {"name": "dee"})
        assert cur.lastrowid == 4 and cur.rowcount == 1
    conn.close()
    raw = path.read_bytes()
    assert raw[:8] == b"CRYPTDSK" and b"ada" not in raw  # encrypted at rest
    with dbapi.connect(path, keyring=keyring) as again:
        cur = again.execute("SELECT id, name FROM t ORDER BY id")
        assert [d[0] for d in cur.description] == ["id", "name"]
        assert cur.rowcount == -1
        assert cur.fetchone() == (1, "ada")
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

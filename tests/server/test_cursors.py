"""Server-side cursors: psycopg's ServerCursor, DECLARE/FETCH/MOVE/CLOSE, on both engines."""

from __future__ import annotations

import psycopg
import pytest

from cryptdisk.server._cursors import move, parse_fetch


@pytest.mark.parametrize("engine_name", ["sqlite_engine", "analytical"])
def test_psycopg_server_cursor_with_hold(start_server, request, engine_name) -> None:
    srv = start_server(request.getfixturevalue(engine_name))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        c.execute("INSERT INTO t SELECT range, 'r' || range FROM range(25)"
                  if engine_name == "analytical" else
                  "WITH RECURSIVE r(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM r WHERE x < 24) "
                  "INSERT INTO t SELECT x, 'r' || x FROM r")
        with c.cursor("big", withhold=True, scrollable=True) as cur:
            cur.itersize = 7
            cur.execute("SELECT a, b FROM t WHERE a >= %s ORDER BY a", (5,))
            assert [d.name for d in cur.description] == ["a", "b"]
            assert cur.fetchone() == (5, "r5")
            assert cur.fetchmany(3) == [(6, "r6"), (7, "r7"), (8, "r8")]
            cur.scroll(-2)
            assert cur.fetchone() == (7, "r7")
            cur.scroll(0, mode="absolute")
            assert [r[0] for r in cur] == list(range(5, 25))  # iterates in itersize batches
        with pytest.raises(psycopg.errors.InvalidCursorName):
            c.execute("FETCH NEXT FROM big")  # closed with the cursor
        # without WITH HOLD a cursor needs a transaction, as in PostgreSQL
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            c.execute("DECLARE x CURSOR FOR SELECT 1")


def test_cursor_in_a_transaction_closes_at_commit(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn) as c:  # psycopg opens a transaction
        c.execute("CREATE TABLE t (a INTEGER)")
        c.execute("INSERT INTO t VALUES (1), (2), (3)")
        c.commit()
        c.execute("DECLARE cur CURSOR FOR SELECT a FROM t ORDER BY a")
        assert c.execute("FETCH 2 FROM cur").fetchall() == [(1,), (2,)]
        assert c.execute("MOVE BACKWARD 1 IN cur").rowcount == 1
        assert c.execute("FETCH ALL FROM cur").fetchall() == [(2,), (3,)]
        assert c.execute("FETCH NEXT FROM cur").fetchall() == []
        c.commit()
        with pytest.raises(psycopg.errors.InvalidCursorName):
            c.execute("FETCH NEXT FROM cur")


def test_cursor_query_is_checked_against_grants(start_server, analytical) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE secret (s VARCHAR)")
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute("DECLARE c CURSOR WITH HOLD FOR SELECT * FROM secret")


def test_move_follows_postgresql_positions() -> None:
    n = 5
    assert move(0, n, parse_fetch("FETCH 2 FROM c")) == ([0, 1], 2)
    assert move(2, n, parse_fetch("FETCH ALL FROM c")) == ([2, 3, 4], 6)
    assert move(6, n, parse_fetch("FETCH BACKWARD 2 FROM c")) == ([4, 3], 4)
    assert move(1, n, parse_fetch("FETCH PRIOR c")) == ([], 0)
    assert move(0, n, parse_fetch("FETCH LAST IN c")) == ([4], 5)
    assert move(3, n, parse_fetch("MOVE RELATIVE -1 FROM c")) == ([1], 2)
    assert move(4, n, parse_fetch("FETCH BACKWARD ALL FROM c")) == ([2, 1, 0], 0)
    assert move(4, n, parse_fetch("FETCH -2 FROM c")) == ([2, 1], 2)


@pytest.mark.parametrize("sql, error", [
    ("FETCH 1 FROM nosuch", psycopg.errors.InvalidCursorName),
    ("MOVE NEXT IN nosuch", psycopg.errors.InvalidCursorName),
    ("CLOSE nosuch", psycopg.errors.InvalidCursorName),
    ("FETCH SIDEWAYS 2 FROM c", psycopg.errors.SyntaxError),
    ("FETCH FORWARD x FROM c", psycopg.errors.SyntaxError),
    ("DECLARE c CURSOR WITH HOLD FOR SELECT 2", psycopg.errors.DuplicateCursor),
    ("DECLARE d CURSOR WITH HOLD FOR CREATE TABLE x (a INTEGER)",
     psycopg.errors.InvalidCursorDefinition),
    ("DECLARE e BINARY CURSOR WITH HOLD FOR SELECT 1", psycopg.errors.FeatureNotSupported),
    ("DECLARE CURSOR FOR", psycopg.errors.SyntaxError),
])
def test_cursor_errors_are_clear(start_server, sqlite_engine, sql, error) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("DECLARE c CURSOR WITH HOLD FOR SELECT 1 UNION ALL SELECT 2")
        with pytest.raises(error):
            c.execute(sql)
        assert c.execute("FETCH ALL FROM c").fetchall() == [(1,), (2,)]  # still usable
        assert c.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'x'").fetchone() \
            == (0,)  # a refused DECLARE ran nothing
        c.execute("CLOSE ALL")
        with pytest.raises(psycopg.errors.InvalidCursorName):
            c.execute("FETCH NEXT FROM c")

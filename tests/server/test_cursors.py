"""Server-side cursors: psycopg's ServerCursor, DECLARE/FETCH/MOVE/CLOSE, on both engines."""

from __future__ import annotations

import random

import psycopg
import pytest

from cryptdisk.server import AnalyticalEngine
from cryptdisk.server._cursors import move, parse_fetch
from cryptdisk.server._rowstream import BATCH_ROWS
from tests.server.test_streaming import _open_streams


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


ROWS = 3 * BATCH_ROWS + 123


@pytest.fixture
def filled(analytical: AnalyticalEngine) -> AnalyticalEngine:
    analytical.db.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
    analytical.db.execute(f"INSERT INTO t SELECT i, 'v' || i FROM range({ROWS}) r(i)")
    return analytical


def test_a_cursor_without_scroll_streams_its_rows_forward(start_server, filled) -> None:
    """psycopg's ServerCursor (no SCROLL, no WITH HOLD) on the analytical engine: FETCH
    reads its rows from the query's stream (open until the cursor closes), the rows
    in order; a move back fails with 55000 and its hint, as a NO SCROLL cursor's in
    PostgreSQL; COMMIT ends the stream."""
    srv = start_server(filled)
    with psycopg.connect(**srv.dsn) as c:
        with c.cursor("big") as cur:
            cur.itersize = 1000
            cur.execute("SELECT i, s FROM t ORDER BY i")
            assert cur.fetchmany(3) == [(0, "v0"), (1, "v1"), (2, "v2")]
            assert _open_streams(srv) == 1
            got = [r[0] for r in cur]
            assert got == list(range(3, ROWS))
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as err:
                cur.scroll(-1)
            assert "SCROLL" in (err.value.diag.message_hint or "")
        c.rollback()
        assert _open_streams(srv) == 0
        c.execute("DECLARE c NO SCROLL CURSOR FOR SELECT i FROM t ORDER BY i")
        assert c.execute("FETCH 2 FROM c").fetchall() == [(0,), (1,)]
        assert _open_streams(srv) == 1
        c.execute(f"MOVE {2 * BATCH_ROWS} IN c")
        assert c.execute("FETCH 3 FROM c").fetchall() == [(i,) for i in range(
            2 * BATCH_ROWS + 2, 2 * BATCH_ROWS + 5)]
        (session,) = srv.server.sessions
        held = session.portals["c"].result.stream.pending
        assert len(held) <= BATCH_ROWS and held[0] == (2 * BATCH_ROWS + 5,)  # the rest unread
        c.commit()
        assert _open_streams(srv) == 0
        with pytest.raises(psycopg.errors.InvalidCursorName):
            c.execute("FETCH 1 FROM c")
        c.rollback()
        # a result of two batches or less is held whole; the cursor still moves forward only
        c.execute("DECLARE small CURSOR FOR SELECT 1 UNION ALL SELECT 2")
        assert c.execute("FETCH 2 FROM small").fetchall() == [(1,), (2,)]
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            c.execute("FETCH PRIOR FROM small")
        c.rollback()
        # SCROLL (and WITH HOLD) cursors hold their rows and move both ways
        c.execute("DECLARE s SCROLL CURSOR FOR SELECT i FROM t ORDER BY i")
        assert c.execute("FETCH LAST FROM s").fetchall() == [(ROWS - 1,)]
        assert c.execute("FETCH BACKWARD 2 FROM s").fetchall() == [(ROWS - 2,), (ROWS - 3,)]
        assert _open_streams(srv) == 0
        c.execute("CLOSE s")


FORWARD_MOVES = ["FETCH 1", "FETCH 7", "FETCH NEXT", f"FETCH {BATCH_ROWS + 3}",
                 "MOVE FORWARD 500", f"MOVE {2 * BATCH_ROWS}", "FETCH RELATIVE 3",
                 "MOVE RELATIVE 9000", "FETCH FORWARD 0"]


def test_forward_fetches_of_a_streamed_cursor_match_a_held_one(start_server, filled) -> None:
    """Random forward FETCHes and MOVEs (counts around the batch size, RELATIVE,
    ABSOLUTE ahead, LAST, ALL) on a streamed cursor: the rows and tags that
    PostgreSQL's moves over the whole result give (_cursors.move); the stream is let go
    when the cursor closes."""
    rng = random.Random(7)
    srv = start_server(filled)
    with psycopg.connect(**srv.dsn) as c:
        for _ in range(4):
            c.execute("DECLARE c CURSOR FOR SELECT i FROM t ORDER BY i")
            pos = 0
            while pos <= ROWS:
                choices = [*FORWARD_MOVES, f"FETCH ABSOLUTE {pos + rng.randrange(1, 9000)}"]
                if pos > ROWS / 2:
                    choices += ["FETCH LAST", "FETCH ALL"]
                sql = rng.choice(choices)
                if sql == "FETCH FORWARD 0" and pos:
                    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
                        c.execute(f"{sql} FROM c")
                    c.rollback()
                    break
                picked, moved = move(pos, ROWS, parse_fetch(f"{sql} c"))
                cur = c.execute(f"{sql} FROM c")
                if sql.startswith("FETCH"):
                    assert cur.fetchall() == [(i,) for i in picked], (sql, pos)
                    assert cur.statusmessage == f"FETCH {len(picked)}"
                else:
                    assert cur.statusmessage == f"MOVE {len(picked)}"
                pos = moved
                if sql in ("FETCH LAST", "FETCH ALL"):
                    break
            else:
                c.execute("CLOSE c")
            c.rollback()
            assert _open_streams(srv) == 0


def test_the_statement_timeout_ends_a_fetch_and_closes_its_cursor(start_server,
                                                                 filled) -> None:
    """FETCH ALL of an endless streamed cursor: 57014 (statement timeout); the cursor and
    its stream are gone, and the session goes on after ROLLBACK."""
    srv = start_server(filled)
    with psycopg.connect(**srv.dsn) as c:
        c.execute("SET statement_timeout = 300")
        c.execute("DECLARE c CURSOR FOR SELECT x.i, y.i FROM t x, t y")
        assert len(c.execute("FETCH 5 FROM c").fetchall()) == 5
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            c.execute("FETCH ALL FROM c")
        assert _open_streams(srv) == 0
        c.rollback()
        with pytest.raises(psycopg.errors.InvalidCursorName):
            c.execute("FETCH 1 FROM c")
        c.rollback()
        assert c.execute("SELECT count(*) FROM t").fetchone() == (ROWS,)


def test_a_zero_count_move_of_a_forward_cursor_only_tells_whether_it_is_on_a_row(
        start_server, filled) -> None:
    """MOVE 0 (FORWARD 0, BACKWARD 0, RELATIVE 0) of a cursor without SCROLL reads no row
    again: as PostgreSQL's NO SCROLL cursor, it says MOVE 1 on a row, MOVE 0 before the
    first or after the last, and fails on none; FETCH BACKWARD 0 off a row returns no row
    (FETCH 0 on a row would read it again: 55000)."""
    srv = start_server(filled)
    with psycopg.connect(**srv.dsn) as c:
        c.execute("DECLARE c NO SCROLL CURSOR FOR SELECT i FROM t ORDER BY i")
        for zero in ("MOVE 0", "MOVE FORWARD 0", "MOVE BACKWARD 0", "MOVE RELATIVE 0",
                     "FETCH BACKWARD 0", "FETCH 0"):
            assert c.execute(f"{zero} FROM c").statusmessage.endswith(" 0"), zero
        assert c.execute(f"FETCH {BATCH_ROWS + 5} FROM c").statusmessage == \
            f"FETCH {BATCH_ROWS + 5}"
        for zero in ("MOVE 0", "MOVE FORWARD 0", "MOVE BACKWARD 0", "MOVE RELATIVE 0"):
            assert c.execute(f"{zero} FROM c").statusmessage == "MOVE 1", zero
        assert c.execute("FETCH 2 FROM c").fetchall() == [(BATCH_ROWS + 5,), (BATCH_ROWS + 6,)]
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState):
            c.execute("FETCH 0 FROM c")
        c.rollback()
        c.execute("DECLARE c CURSOR FOR SELECT i FROM t ORDER BY i")
        (session,) = srv.server.sessions
        held = len(session.portals["c"].result.stream.pending)  # (the rows read as it began)
        c.execute(f"MOVE {held} FROM c")  # none held now
        assert c.execute("MOVE 0 FROM c").statusmessage == "MOVE 1"
        assert c.execute("FETCH 1 FROM c").fetchall() == [(held,)]
        c.execute("MOVE ALL FROM c")
        for zero in ("MOVE 0", "MOVE BACKWARD 0", "FETCH BACKWARD 0", "FETCH RELATIVE 0"):
            assert c.execute(f"{zero} FROM c").statusmessage.endswith(" 0"), zero
        c.rollback()
        assert _open_streams(srv) == 0


def test_a_move_over_a_streamed_cursor_holds_no_rows_it_skips(start_server,
                                                              analytical) -> None:
    """MOVE n, MOVE ALL, FETCH LAST and FETCH ABSOLUTE far ahead read the rows they pass
    and let them go batch by batch (PostgreSQL's MOVE holds none): the session's Python
    memory while they run stays far below the rows' (tracemalloc's peak), and the rows
    after them are still there."""
    import tracemalloc

    n = 40 * BATCH_ROWS
    analytical.db.execute(f"CREATE TABLE w AS SELECT i, repeat('x', 100) || i AS s "
                          f"FROM range({n}) r(i)")
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn) as c:
        tracemalloc.start()
        try:
            for sql, then in [(f"MOVE {n - 10} FROM c", [(n - 10,)]),
                              (f"FETCH ABSOLUTE {n - 5} FROM c", [(n - 5,)]),
                              ("FETCH LAST FROM c", []), ("MOVE ALL FROM c", [])]:
                c.execute("DECLARE c CURSOR FOR SELECT i, s FROM w ORDER BY i")
                tracemalloc.reset_peak()
                c.execute(sql)
                peak = tracemalloc.get_traced_memory()[1]
                assert peak < 16 << 20, f"{sql}: {peak >> 20} MB"  # the rows: > 60 MB
                assert [r[:1] for r in c.execute("FETCH 1 FROM c").fetchall()] == then
                c.rollback()
        finally:
            tracemalloc.stop()
        assert _open_streams(srv) == 0

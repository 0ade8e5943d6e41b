"""A statement that waits (for the analytical engine's turn, for SQLite's write lock) is
bounded by the statement timeout and ended by a CancelRequest, like one that runs, and
ending it never stops another session's statement; the analytical engine's queries run
side by side, its other statements alone. Real servers, real clients, TLS."""

from __future__ import annotations

import ssl
import threading
import time
from typing import Any

import pg8000.native
import psycopg
import pytest

from tests.server.conftest import ENDLESS, PASSWORD, USER

#: statement_timeout of the server whose sessions wait (seconds)
TIMEOUT = 1.0
#: how much later than the timeout a waiting statement may end on a loaded machine
MARGIN = 2.5
#: a statement that holds the analytical engine alone until it is cancelled (SET VARIABLE
#: runs its query; not a query, it runs on the database's connection)
ALONE = "SET VARIABLE endless = (" + ENDLESS + ")"


def pg(srv: Any, **kw: Any) -> psycopg.Connection[Any]:
    return psycopg.connect(**{**srv.dsn, **kw})


class Running:
    """``sql`` run on ``conn`` in a thread: what it raised (or returned), and when it ended."""

    def __init__(self, conn: Any, sql: str) -> None:
        self.conn, self.error, self.rows = conn, None, None
        self.ended = 0.0
        self.started = time.monotonic()
        self.thread = threading.Thread(target=self._run, args=(sql,))
        self.thread.start()

    def _run(self, sql: str) -> None:
        try:
            cur = self.conn.execute(sql)
            self.rows = cur.fetchall() if cur.description is not None else None
        except BaseException as exc:
            self.error = exc
        self.ended = time.monotonic()

    def stop(self) -> None:
        """Cancel it until it ends (a cancel that lands before it starts is a no-op)."""
        for _ in range(120):
            if not self.thread.is_alive():
                return
            self.conn.cancel_safe()
            self.thread.join(1)
        raise AssertionError("the statement did not end")


def busy(srv: Any, count: int) -> None:
    """Wait until ``count`` of the server's sessions are running a statement."""
    for _ in range(3000):
        if sum(s.busy for s in list(srv.server.sessions)) >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} sessions never became busy")


def holding(srv: Any, engine: Any) -> None:
    """Wait until the server's one busy session holds the analytical engine's turn."""
    busy(srv, 1)
    for _ in range(3000):
        if engine.turns.held:
            return
        time.sleep(0.01)
    raise AssertionError("the statement never took its turn")


def waiting(engine: Any, count: int) -> None:
    for _ in range(3000):
        if engine.turns.waiting >= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"{count} sessions never waited for their turn")


@pytest.fixture
def two_servers(start_server: Any, analytical: Any) -> tuple[Any, Any]:
    """The analytical engine served twice: ``long`` without a statement timeout (its
    statement holds the engine as long as the test wants), ``timed`` with TIMEOUT."""
    return start_server(analytical), start_server(analytical, statement_timeout=TIMEOUT)


def test_the_statement_timeout_ends_a_statement_waiting_for_the_engine(two_servers,
                                                                        analytical) -> None:
    long, timed = two_servers
    with pg(long, autocommit=True) as a, pg(timed, autocommit=True) as b:
        a.execute("CREATE TABLE t (i BIGINT)")
        holder = Running(a, ENDLESS)  # a query: a write waits for it to end
        try:
            holding(long, analytical)
            start = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled) as e:
                b.execute("INSERT INTO t VALUES (42)")
            took = time.monotonic() - start
            assert "statement timeout" in str(e.value)
            assert TIMEOUT * 0.9 <= took < TIMEOUT + MARGIN, took
            assert analytical.turns.waiting == 0  # it left the queue
            # the other session's statement was not interrupted: it is still running
            holder.thread.join(0.5)
            assert holder.thread.is_alive() and holder.error is None
        finally:
            holder.stop()
        assert isinstance(holder.error, psycopg.errors.QueryCanceled)
        assert "user request" in str(holder.error)
        # both sessions go on working; the write that timed out wrote nothing
        assert b.execute("SELECT count(*) FROM t").fetchone() == (0,)
        assert a.execute("SELECT 7").fetchone() == (7,)


def test_a_cancel_ends_a_waiting_statement_and_not_the_running_one(start_server,
                                                                    analytical) -> None:
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as a, pg(srv, autocommit=True) as b:
        holder = Running(a, ALONE)
        try:
            holding(srv, analytical)
            waiter = Running(b, "SELECT 42")  # a query waits for a statement running alone
            waiting(analytical, 1)
            b.cancel_safe()  # one cancel: it is waiting, so it ends the wait
            waiter.thread.join(MARGIN)
            assert not waiter.thread.is_alive()
            assert isinstance(waiter.error, psycopg.errors.QueryCanceled)
            assert "user request" in str(waiter.error)
            holder.thread.join(0.5)
            assert holder.thread.is_alive() and holder.error is None  # left alone
            assert analytical.turns.waiting == 0
        finally:
            holder.stop()
        assert isinstance(holder.error, psycopg.errors.QueryCanceled)
        assert b.execute("SELECT 42").fetchone() == (42,)


def test_waits_are_served_in_order_and_a_cancel_leaves_the_rest_in_line(start_server,
                                                                         analytical) -> None:
    """Behind a long query wait a write, a query and a write, in that order. The query
    waits for the first write (no overtaking); when that write is cancelled the query
    runs at once, beside the long one, and the last write still waits for it."""
    srv = start_server(analytical)
    conns = [pg(srv, autocommit=True) for _ in range(4)]
    try:
        conns[0].execute("CREATE TABLE t (i BIGINT)")
        holder = Running(conns[0], ENDLESS)
        try:
            holding(srv, analytical)
            waiters = []
            for i, (c, sql) in enumerate(zip(conns[1:], ("INSERT INTO t VALUES (1)",
                                                         "SELECT 2",
                                                         "INSERT INTO t VALUES (3)"),
                                             strict=True)):
                waiters.append(Running(c, sql))
                waiting(analytical, i + 1)
            time.sleep(0.3)
            assert analytical.turns.waiting == 3  # the query waits behind the write
            conns[1].cancel_safe()
            waiters[0].thread.join(MARGIN)
            assert isinstance(waiters[0].error, psycopg.errors.QueryCanceled)
            waiters[1].thread.join(MARGIN)  # runs beside the long query
            assert waiters[1].error is None and waiters[1].rows == [(2,)]
            assert holder.thread.is_alive() and waiters[2].thread.is_alive()
            assert analytical.turns.waiting == 1
        finally:
            holder.stop()
        waiters[2].thread.join(60)
        assert waiters[2].error is None
        assert conns[0].execute("SELECT i FROM t").fetchall() == [(3,)]
    finally:
        for c in conns:
            c.close()


def test_describe_copy_and_catalog_waits_are_bounded_by_the_timeout(two_servers,
                                                                    analytical) -> None:
    """Describe (a prepared statement's columns), COPY FROM STDIN and a pg_catalog query
    each wait for the engine too: the statement timeout ends each wait with 57014."""
    long, timed = two_servers
    with pg(long, autocommit=True) as a:
        a.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
        holder = Running(a, ALONE)
        try:
            holding(long, analytical)
            tls = ssl.create_default_context(cafile=timed.dsn["sslrootcert"])
            native = pg8000.native.Connection(user=USER, password=PASSWORD,
                                              host="localhost", port=timed.port,
                                              ssl_context=tls)
            try:
                start = time.monotonic()
                with pytest.raises(pg8000.native.DatabaseError) as e:
                    native.prepare("SELECT i, s FROM t WHERE i = :i")  # Parse + Describe
                assert e.value.args[0]["C"] == "57014"
                assert "statement timeout" in e.value.args[0]["M"]
                assert time.monotonic() - start < TIMEOUT + MARGIN
            finally:
                native.close()
            with pg(timed, autocommit=True) as b:
                start = time.monotonic()
                with pytest.raises(psycopg.errors.QueryCanceled) as e2:
                    with b.cursor().copy("COPY t FROM STDIN") as copy:
                        copy.write_row((1, "x"))
                assert "statement timeout" in str(e2.value)
                assert TIMEOUT * 0.9 <= time.monotonic() - start < TIMEOUT + MARGIN
                start = time.monotonic()
                with pytest.raises(psycopg.errors.QueryCanceled):
                    b.execute("SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c "
                              "WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' ORDER BY 2, 3")
                assert TIMEOUT * 0.9 <= time.monotonic() - start < TIMEOUT + MARGIN
                assert holder.thread.is_alive() and holder.error is None
        finally:
            holder.stop()
        assert analytical.turns.waiting == 0
        assert a.execute("SELECT count(*) FROM t").fetchone() == (0,)  # no COPY row landed


def test_sqlite_copy_waiting_for_the_write_lock_is_bounded_by_the_timeout(
        start_server, sqlite_engine) -> None:
    """COPY FROM STDIN in a transaction waits for the write lock another session holds:
    the statement timeout ends the wait (57014), not the lock timeout (55P03, 30 s)."""
    long = start_server(sqlite_engine)
    timed = start_server(sqlite_engine, statement_timeout=TIMEOUT)
    with pg(long) as a, pg(timed) as b:
        a.execute("CREATE TABLE t (i INTEGER, s TEXT)")
        a.commit()
        a.execute("INSERT INTO t VALUES (0, 'held')")  # holds the write lock
        start = time.monotonic()
        with pytest.raises(psycopg.errors.QueryCanceled) as e:
            with b.cursor().copy("COPY t FROM STDIN") as copy:
                copy.write_row((1, "x"))
        assert "statement timeout" in str(e.value)
        assert TIMEOUT * 0.9 <= time.monotonic() - start < TIMEOUT + MARGIN
        b.rollback()
        a.commit()  # the holder's transaction was left alone
        with b.cursor().copy("COPY t FROM STDIN") as copy:
            copy.write_row((1, "x"))
        b.commit()
        assert a.execute("SELECT i, s FROM t ORDER BY i").fetchall() == [(0, "held"),
                                                                         (1, "x")]


SLOW = "SELECT count(*), sum(hash(a.i * b.i) % 7) FROM t a, t b"


def test_two_sessions_queries_overlap(start_server, analytical) -> None:
    """Two sessions' long reads of one table run at the same time (each starts before
    the other ends) and both are right."""
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as c:
        c.execute("CREATE TABLE t (i BIGINT) ORDER BY i")
        c.execute("INSERT INTO t SELECT range FROM range(6000)")
        expected = c.execute(SLOW).fetchall()
    conns = [pg(srv, autocommit=True) for _ in range(2)]
    try:
        for c in conns:
            c.execute("SELECT 1")  # logged in, reader made
        spans: list[tuple[float, float]] = []
        results: list[Any] = []
        go = threading.Barrier(2)

        def read(c: Any) -> None:
            go.wait()
            t0 = time.monotonic()
            results.append(c.execute(SLOW).fetchall())
            spans.append((t0, time.monotonic()))

        threads = [threading.Thread(target=read, args=(c,)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == [expected, expected]
        assert max(s for s, _ in spans) < min(e for _, e in spans), spans
    finally:
        for c in conns:
            c.close()


def test_readers_see_whole_inserts_while_a_session_inserts(start_server,
                                                          analytical) -> None:
    """One session inserts batches of 500 rows (COPY and INSERT) while two others read:
    each count is a whole number of batches, and never goes back."""
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as c:
        c.execute("CREATE TABLE t (i BIGINT, batch BIGINT) ORDER BY i")
    stop = threading.Event()
    seen: list[list[tuple[int, int]]] = [[], []]
    errors: list[BaseException] = []

    def read(n: int) -> None:
        try:
            with pg(srv, autocommit=True) as c:
                while not stop.is_set():
                    seen[n].append(c.execute("SELECT count(i), count(DISTINCT batch) "
                                             "FROM t WHERE i >= 0").fetchone())
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read, args=(n,)) for n in range(2)]
    for t in readers:
        t.start()
    try:
        with pg(srv, autocommit=True) as w:
            for b in range(1, 9):
                if b % 2:
                    w.execute(f"INSERT INTO t SELECT 1000 * {b} + range, {b} FROM range(500)")
                else:
                    with w.cursor().copy("COPY t FROM STDIN") as copy:
                        for i in range(500):
                            copy.write_row((1000 * b + i, b))
    finally:
        stop.set()
        for t in readers:
            t.join(60)
    assert errors == []
    for rows in seen:
        assert rows
        assert all(count == 500 * batches for count, batches in rows), rows
        assert [c for c, _ in rows] == sorted(c for c, _ in rows)
    with pg(srv, autocommit=True) as c:
        assert c.execute("SELECT count(*), count(DISTINCT batch) FROM t").fetchone() == \
            (4000, 8)


def test_a_sessions_set_reaches_its_own_queries_only(start_server, analytical) -> None:
    """A SET of a connection-local DuckDB setting reaches the session's queries (which run
    on its own reader's cursor), made before or after the SET, and not another
    session's; RESET undoes it."""
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as a, pg(srv, autocommit=True) as b:
        assert a.execute("SELECT 7 / 2").fetchone() == (3,)  # a's reader made before
        a.execute("SET integer_division = false")
        assert a.execute("SELECT 7 / 2").fetchone() == (3.5,)
        assert b.execute("SELECT 7 / 2").fetchone() == (3,)
        a.execute("RESET integer_division")
        assert a.execute("SELECT 7 / 2").fetchone() == (3,)
    with pg(srv, autocommit=True) as c:
        c.execute("SET integer_division = false")  # before its first query: no reader yet
        assert c.execute("SELECT 7 / 2").fetchone() == (3.5,)

@pytest.fixture
def with_policies(analytical: Any, tmp_path: Any) -> Any:
    from cryptdisk.server import PolicyStore

    analytical.policies = PolicyStore(tmp_path / "a.policies", analytical.keyring, analytical)
    return analytical


def policies_of(conn: Any) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT * FROM system.policy_references").fetchall()


#: policy statements that read the engine (the table's columns, a type's name, the
#: body's parse) before they change anything: each waits for a statement running alone
WAITING_POLICY_STATEMENTS = [
    "CREATE MASKING POLICY m2 AS (v VARCHAR) RETURNS VARCHAR -> '***'",
    "CREATE OR REPLACE ROW ACCESS POLICY r2 AS (x VARCHAR) RETURNS BOOLEAN -> x <> 'EU'",
    "ALTER TABLE t ALTER COLUMN s SET MASKING POLICY m3",
    "ALTER TABLE t ALTER s UNSET MASKING POLICY",
    "ALTER TABLE t ADD ROW ACCESS POLICY r ON (s)",
]


@pytest.mark.parametrize("sql", WAITING_POLICY_STATEMENTS)
def test_a_policy_statement_waiting_for_the_engine_obeys_timeout_and_cancel(
        start_server: Any, with_policies: Any, sql: str) -> None:
    """A masking or row access policy statement waiting for the engine (a statement runs
    alone) ends with 57014 at the statement timeout ('statement timeout') and at a
    CancelRequest ('user request'), changes nothing, and leaves the running statement
    alone; once it ends, the same statement runs."""
    engine = with_policies
    long = start_server(engine)
    timed = start_server(engine, statement_timeout=TIMEOUT)
    with pg(long, autocommit=True) as a, pg(timed, autocommit=True) as b, \
            pg(long, autocommit=True) as c:
        a.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
        a.execute("GRANT APPLY POLICY TO u")
        a.execute("CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> '***'")
        a.execute("CREATE ROW ACCESS POLICY r AS (x VARCHAR) RETURNS BOOLEAN -> x <> 'EU'")
        a.execute("CREATE MASKING POLICY m3 AS (v VARCHAR) RETURNS VARCHAR -> 'x'")
        a.execute("ALTER TABLE t ALTER COLUMN s SET MASKING POLICY m")
        before = (policies_of(a), a.execute("SELECT * FROM system.policies").fetchall())
        holder = Running(a, ALONE)
        try:
            holding(long, engine)
            start = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled) as e:
                b.execute(sql)
            assert "statement timeout" in str(e.value)
            assert TIMEOUT * 0.9 <= time.monotonic() - start < TIMEOUT + MARGIN
            waiter = Running(c, sql)  # no timeout: a CancelRequest ends its wait
            waiting(engine, 1)
            c.cancel_safe()
            waiter.thread.join(MARGIN)
            assert not waiter.thread.is_alive()
            assert isinstance(waiter.error, psycopg.errors.QueryCanceled)
            assert "user request" in str(waiter.error)
            assert engine.turns.waiting == 0
            holder.thread.join(0.5)
            assert holder.thread.is_alive() and holder.error is None  # left alone
        finally:
            holder.stop()
        assert isinstance(holder.error, psycopg.errors.QueryCanceled)
        assert (policies_of(b), b.execute("SELECT * FROM system.policies").fetchall()) == \
            before  # the statements that ended changed nothing
        b.execute(sql)  # and they run once the engine is free
        assert (policies_of(b), b.execute("SELECT * FROM system.policies").fetchall()) != \
            before


def test_a_policy_statement_waiting_for_anothers_change_obeys_the_timeout(
        start_server: Any, with_policies: Any) -> None:
    """A policy statement waits for another session's policy change (one at a time); the
    statement timeout ends that wait too (57014), and the other's change goes on."""
    engine = with_policies
    long = start_server(engine)
    timed = start_server(engine, statement_timeout=TIMEOUT)
    with pg(long, autocommit=True) as a, pg(long, autocommit=True) as b, \
            pg(timed, autocommit=True) as c:
        a.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
        a.execute("GRANT APPLY POLICY TO u")
        a.execute("CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> '***'")
        a.execute("CREATE ROW ACCESS POLICY r AS (x VARCHAR) RETURNS BOOLEAN -> x <> 'EU'")
        holder = Running(a, ALONE)
        try:
            holding(long, engine)
            # the row policy's change reads the table's columns: it waits for the engine
            # while it holds the policies
            changing = Running(b, "ALTER TABLE t ADD ROW ACCESS POLICY r ON (s)")
            waiting(engine, 1)
            start = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled) as e:
                c.execute("DROP MASKING POLICY m")
            assert "statement timeout" in str(e.value)
            assert TIMEOUT * 0.9 <= time.monotonic() - start < TIMEOUT + MARGIN
            assert changing.thread.is_alive() and changing.error is None
        finally:
            holder.stop()
        changing.thread.join(60)
        assert changing.error is None  # the other session's change was not interrupted
        assert policies_of(c) == [("t", "s", "r", "row access")]
        assert [r[0] for r in c.execute("SELECT * FROM system.policies").fetchall()] == \
            ["m", "r"]  # the DROP that timed out dropped nothing


def test_a_subject_sessions_query_runs_beside_a_long_query(start_server,
                                                           with_policies) -> None:
    """A query of a session subject to policies reads the table's columns for its rewrite
    beside other sessions' queries (it does not wait for a long one to end)."""
    engine = with_policies
    srv = start_server(engine)
    with pg(srv, autocommit=True) as a:
        a.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
        a.execute("INSERT INTO t VALUES (1, 'US'), (2, 'EU')")
        a.execute("CREATE USER bob PASSWORD 'bob pw'")
        a.execute("GRANT SELECT ON t TO bob")
        a.execute("GRANT APPLY POLICY TO u")
        a.execute("CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> '***'")
        a.execute("ALTER TABLE t ALTER COLUMN s SET MASKING POLICY m")
        with pg(srv, autocommit=True, user="bob", password="bob pw") as bob:
            assert bob.execute("SELECT i, s FROM t ORDER BY i").fetchall() == \
                [(1, "***"), (2, "***")]
            holder = Running(a, ENDLESS)  # a query: others run beside it
            try:
                holding(srv, engine)
                reader = Running(bob, "SELECT s, i FROM t ORDER BY i")
                reader.thread.join(30)
                assert not reader.thread.is_alive()
                assert reader.error is None and reader.rows == [("***", 1), ("***", 2)]
                assert holder.thread.is_alive()
            finally:
                holder.stop()
                reader.stop()


def test_a_sessions_set_reaches_its_own_writes_only(start_server, analytical) -> None:
    """A session's SET ran on the database's connection too, where every session's writes
    run: after one session's ``SET integer_division = false``, another session's
    ``INSERT ... SELECT 7 / 2`` wrote 3.5 (PostgreSQL's ``/``: 3). Now the SET is the
    session's own, for its queries and its writes, and RESET undoes it."""
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as a, pg(srv, autocommit=True) as b:
        a.execute("CREATE TABLE q (who VARCHAR, v DOUBLE)")
        a.execute("SET integer_division = false")
        b.execute("INSERT INTO q SELECT 'b', 7 / 2")
        a.execute("INSERT INTO q SELECT 'a', 7 / 2")
        b.execute("INSERT INTO q SELECT 'b2', 7 / 2")  # the server's again after a's write
        a.execute("RESET integer_division")
        a.execute("INSERT INTO q SELECT 'a2', 7 / 2")
        assert b.execute("SELECT who, v FROM q ORDER BY who").fetchall() == \
            [("a", 3.5), ("a2", 3.0), ("b", 3.0), ("b2", 3.0)]
        assert b.execute("SELECT 7 / 2").fetchone() == (3,)


def test_a_sessions_variables_are_its_own(start_server, analytical) -> None:
    """``SET VARIABLE`` ran on the database's connection, where every session's writes
    run: another session's write read the variable (``INSERT ... SELECT getvariable('x')``),
    and a second session's SET of the same name changed it for the first one's writes. Now
    a session's variables are its own, for its queries and its writes, of their type,
    and RESET VARIABLE drops them."""
    srv = start_server(analytical)
    with pg(srv, autocommit=True) as a, pg(srv, autocommit=True) as b, \
            pg(srv, autocommit=True) as c:
        a.execute("CREATE TABLE v (who VARCHAR, x INTEGER, n INTEGER)")
        a.execute("SET VARIABLE x = 1")
        a.execute("SET VARIABLE l = [10, 20, 30]")
        b.execute("SET VARIABLE x = 2")
        assert a.execute("SELECT getvariable('x'), len(getvariable('l'))").fetchone() == (1, 3)
        assert b.execute("SELECT getvariable('x'), len(getvariable('l'))").fetchone() == \
            (2, None)
        assert c.execute("SELECT getvariable('x')").fetchone() == (None,)
        a.execute("INSERT INTO v SELECT 'a', getvariable('x'), len(getvariable('l'))")
        b.execute("INSERT INTO v SELECT 'b', getvariable('x'), len(getvariable('l'))")
        c.execute("INSERT INTO v SELECT 'c', getvariable('x'), len(getvariable('l'))")
        a.execute("RESET VARIABLE x")
        a.execute("INSERT INTO v SELECT 'a2', getvariable('x'), len(getvariable('l'))")
        b.execute("INSERT INTO v SELECT 'b2', getvariable('x'), len(getvariable('l'))")
        assert c.execute("SELECT who, x, n FROM v ORDER BY who").fetchall() == \
            [("a", 1, 3), ("a2", None, 3), ("b", 2, None), ("b2", 2, None),
             ("c", None, None)]
        assert a.execute("SELECT getvariable('x'), getvariable('l')[2]").fetchone() == \
            (None, 20)

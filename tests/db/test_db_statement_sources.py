"""What a statement reads: each table's scan, put before DuckDB for that statement alone
(a source in the connection's registry named by a leading WITH, or a temporary view),
never seen by a later statement, another reader's, or a forked child."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import warnings
import weakref

import duckdb
import pytest

import cryptdisk
from cryptdisk.errors import DatabaseError

N = 5000


@pytest.fixture
def db(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        d = cryptdisk.connect(tmp_path / "db")
    d.sql("CREATE TABLE t (i BIGINT, s VARCHAR, f DOUBLE) ORDER BY i")
    d.sql(f"INSERT INTO t SELECT range, CAST(range AS VARCHAR), range / 2 FROM range({N})")
    yield d
    d.close()


class _NoRegistry:
    """A DuckDB connection without the source registry: statements get temporary views."""

    def __init__(self, con):
        self._con = con

    def __getattr__(self, name):
        if name == "_register_source":
            raise AttributeError(name)
        return getattr(self._con, name)


QUERIES = [
    "SELECT count(*), sum(i) FROM t WHERE i BETWEEN 10 AND 99",
    "SELECT i, s, f FROM t WHERE i = 17",
    "SELECT s FROM t ORDER BY i DESC LIMIT 3",
    "FROM t SELECT max(f)",
    "WITH x AS (SELECT i FROM t WHERE i < 10) SELECT sum(i) FROM x",
    "WITH t AS (SELECT i FROM t WHERE i < 3) SELECT count(*) AS c FROM t",
    "SELECT (SELECT count(*) FROM (WITH t AS (SELECT 1 AS i) SELECT * FROM t)) AS inner_t, "
    "count(*) AS n FROM t",
    "SELECT a.i, b.i FROM t a JOIN t b USING (i) WHERE a.i < 2 ORDER BY 1",
    "/* a comment */ SELECT count(*) FROM t",
    "-- a comment\n/* and another */ SELECT max(s) FROM t WHERE i < 10",
    "SELECT count(*) AS c FROM system.parts",
    "SELECT count(*) FROM t WHERE s = 'x' OR i IN (SELECT i FROM t WHERE i < 5)",
    "EXPLAIN SELECT count(*) FROM t",
]


def _answers(db):
    out = []
    for q in QUERIES:
        got = db.sql(q)
        if q.startswith("EXPLAIN"):  # (the plan names the source: only that it ran)
            out.append(got.num_rows > 0)
        else:
            out.append((got.schema.names, [c.to_pylist() for c in got.columns]))
    return out


def test_statements_answer_alike_through_the_registry_and_through_views(db):
    fast = _answers(db)
    real = db.con
    db.con = _NoRegistry(real)
    try:
        views = _answers(db)
        assert db._handles == [] and db._registered == set()
    finally:
        db.con = real
    assert fast == views
    named = dict(zip(QUERIES, fast, strict=True))
    assert named[QUERIES[5]] == (["c"], [[3]])  # the statement's own t shadows the table
    assert named[QUERIES[6]] == (["inner_t", "n"], [[1], [N]])
    assert named[QUERIES[7]][1] == [[0, 1], [0, 1]]
    assert named[QUERIES[1]] == (["i", "s", "f"], [[17], ["17"], [8.5]])


@pytest.mark.parametrize("registry", [True, False])
def test_a_statement_leaves_nothing_behind(db, registry):
    real = db.con
    if not registry:
        db.con = _NoRegistry(real)
    exposed = []
    expose = db._expose

    def record(name, source):
        exposed.append(weakref.ref(source))
        expose(name, source)

    db._expose = record
    try:
        assert db.sql("SELECT s FROM t WHERE i = 1").to_pylist() == [{"s": "1"}]
        assert db.sql("SELECT sum(i) AS x FROM t").to_pylist() == [{"x": N * (N - 1) // 2}]
    finally:
        db.con = real
        del db._expose
    assert len(exposed) == 2
    gc.collect()
    assert all(r() is None for r in exposed)  # no registry or view holds a scan
    assert db._handles == [] and db._registered == set() and db._exposed == {}
    with pytest.raises(duckdb.CatalogException):
        db.con.sql("SELECT * FROM t").fetchall()
    assert db.con.sql("SELECT count(*) FROM duckdb_views() WHERE NOT internal"
                      ).fetchall() == [(0,)]


def test_readers_and_the_database_interleave_statements_on_one_table(db):
    queries = {"SELECT sum(i) AS v FROM t WHERE i < 100": [{"v": 4950}],
               "SELECT s AS v FROM t WHERE i = 4321": [{"v": "4321"}],
               "SELECT max(f) AS v FROM t": [{"v": (N - 1) / 2}],
               "SELECT count(*) AS v FROM t WHERE s LIKE '9%'": [{"v": 1 + 10 + 100}]}
    order = list(queries)
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def run(k, execute):
        try:
            start.wait()
            for n in range(40):
                q = order[(n + k) % len(order)]
                got = execute(q).to_pylist()
                assert got == queries[q], (q, got)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    readers = [db.reader(), db.reader()]
    threads = [threading.Thread(target=run, args=(k, r.execute)) for k, r in enumerate(readers)]
    threads.append(threading.Thread(target=run, args=(2, db.sql)))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for r in readers:
        r.close()
    assert errors == []


def test_a_failed_or_interrupted_statement_is_followed_by_right_answers(db):
    r = db.reader()
    try:
        for execute in (db.sql, r.execute):
            with pytest.raises(DatabaseError, match=r"(?i)conver"):
                execute("SELECT sum(CAST('x' || s AS INTEGER)) FROM t")
            assert execute("SELECT sum(i) AS x FROM t WHERE i < 10").to_pylist() == [{"x": 45}]
            assert execute("SELECT s FROM t WHERE i = 3").to_pylist() == [{"s": "3"}]
        # (hours uninterrupted: interrupted every 20 ms until it stops)
        slow = "SELECT count(*) FROM t a, t b, t c WHERE (a.i * b.i + c.i) % 7 = 3"
        done = threading.Event()

        def interrupt():
            while not done.wait(0.02):
                r.interrupt()

        th = threading.Thread(target=interrupt)
        th.start()
        try:
            with pytest.raises(DatabaseError, match=r"(?i)interrupt"):
                r.execute(slow)
        finally:
            done.set()
            th.join()
        assert r.execute("SELECT f FROM t WHERE i = 9").to_pylist() == [{"f": 4.5}]
    finally:
        r.close()


def test_a_table_dropped_or_replaced_between_statements(db):
    r = db.reader()
    try:
        assert r.execute("SELECT count(*) AS c FROM t WHERE i >= 0").to_pylist() == [{"c": N}]
        db.sql("DROP TABLE t")
        for execute in (db.sql, r.execute):
            with pytest.raises(DatabaseError):
                execute("SELECT count(*) FROM t WHERE i >= 0")
        db.sql("CREATE TABLE t (i VARCHAR, z BIGINT)")
        db.sql("INSERT INTO t VALUES ('a', 1), ('b', 2)")
        for execute in (db.sql, r.execute):
            assert execute("SELECT i, z FROM t ORDER BY z").to_pylist() == [
                {"i": "a", "z": 1}, {"i": "b", "z": 2}]
        db.sql("TRUNCATE TABLE t")
        db.sql("INSERT INTO t VALUES ('c', 3)")
        for execute in (db.sql, r.execute):
            assert execute("SELECT i FROM t WHERE z > 0").to_pylist() == [{"i": "c"}]
    finally:
        r.close()


def test_a_child_forked_while_a_statement_holds_its_sources(tmp_path):
    script = textwrap.dedent(f"""
        import os, sys, threading, time
        import cryptdisk
        db = cryptdisk.connect({str(tmp_path / "a")!r})
        db.sql("CREATE TABLE t (i BIGINT) ORDER BY i")
        db.sql("INSERT INTO t SELECT range FROM range(6000)")
        holding = threading.Event()
        result = []

        def query():
            r = db.reader()
            expose = r._bind_exposed
            def bound(sql):
                out = expose(sql)
                holding.set()
                return out
            object.__setattr__(r, "_bind_exposed", bound)  # (the reader's own)
            result.append(r.execute(
                "SELECT count(*) FROM t a, t b WHERE a.i * b.i % 7 = 3").column(0)[0].as_py())
            r.close()

        th = threading.Thread(target=query)
        th.start()
        holding.wait()
        time.sleep(0.05)  # DuckDB is running the statement
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: the interpreter frees what it holds
        _, status = os.waitpid(pid, 0)
        th.join()
        print("child", status)
        print("parent", result[0] > 0, db.sql("SELECT count(*) FROM t").column(0)[0].as_py())
        db.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["child", "0", "parent", "True", "6000"], \
        out.stdout + out.stderr


def test_which_statements_read_through_the_registry(db):
    through_registry = ["SELECT i FROM t", "FROM t", "  /* c */ -- d\n SELECT i FROM t",
                        "SELECT t.i FROM t"]
    through_views = ["WITH x AS (SELECT 1) SELECT i FROM t", "EXPLAIN SELECT i FROM t",
                     "SELECT i FROM main.t", 'SELECT i FROM "temp"."t"',
                     "/* a /* nested */ SELECT */ SELECT i FROM t", "-- only a comment"]
    source = db.sql("SELECT i FROM t WHERE i < 3")
    try:
        for sql in through_registry + through_views:
            db._expose("t", source)
            out = db._bind_exposed(sql)
            if sql in through_registry:
                assert out.startswith('WITH "t" AS NOT MATERIALIZED') and out.endswith(sql)
                assert len(db._handles) == 1 and db._registered == set(), sql
            else:
                assert out == sql and db._registered == {"t"} and db._handles == [], sql
            db._release()
    finally:
        db._release()

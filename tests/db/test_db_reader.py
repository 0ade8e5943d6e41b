"""Database.reader(): queries on their own DuckDB cursor, beside each other and the
database's own statements; whole inserts only; parts a query started from outlive it."""

from __future__ import annotations

import threading
import time
import warnings

import pytest

import cryptdisk
from cryptdisk.db import Reader
from cryptdisk.errors import DatabaseError

#: a query that takes a while (36M pairs): long enough for two to be seen overlapping
SLOW = "SELECT count(*), sum(hash(a.i * b.i) % 7) FROM t a, t b"


@pytest.fixture
def db(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        database = cryptdisk.connect(tmp_path / "db")
    database.sql("CREATE TABLE t (i BIGINT, batch BIGINT) ORDER BY i")
    database.sql("INSERT INTO t SELECT range, 0 FROM range(6000)")
    yield database
    database.close()


def test_a_reader_answers_as_the_database_does_and_runs_queries_only(db):
    r = db.reader()
    try:
        for q in ("SELECT count(*), sum(i) FROM t", "SELECT i FROM t WHERE i = 17",
                  "SELECT min(i), max(i) FROM t", "SELECT i FROM t ORDER BY i DESC LIMIT 3",
                  "SELECT count(*) FROM system.parts", "FROM t SELECT max(batch)",
                  "WITH x AS (SELECT i FROM t WHERE i < 10) SELECT sum(i) FROM x"):
            assert r.execute(q).to_pylist() == db.sql(q).to_pylist(), q
            assert r.execute(q).to_pylist() == db.sql(q).to_pylist(), q  # warm
        assert r.last_scans["t"]["row_groups_read"] >= 0
        for stmt in ("INSERT INTO t VALUES (1, 1)", "CREATE TABLE u (a BIGINT)",
                     "SET threads = 1", "DROP TABLE t"):
            with pytest.raises(DatabaseError, match="a reader runs queries"):
                r.execute(stmt)
        assert db.sql("SELECT count(*) FROM t").to_pylist() == [{"count_star()": 6000}]
    finally:
        r.close()
    with pytest.raises(DatabaseError, match="closed"):
        r.execute("SELECT 1")


def test_a_reader_describes_shows_and_explains_as_the_database_does(db):
    """DESCRIBE, SHOW, SUMMARIZE and EXPLAIN of a query read tables as a query does: a
    reader runs them on its cursor (EXPLAIN of a statement other than a query stays the
    database's)."""
    db.sql("CREATE TEMP TABLE scratch (x INTEGER)")
    r = db.reader()
    try:
        for q in ("DESCRIBE t", "SHOW t", "show main.t", "DESCRIBE SELECT i FROM t",
                  "SUMMARIZE t", "SHOW TABLES", "SHOW ALL TABLES"):
            assert Reader.runs(q), q
            got = r.execute(q)
            if q == "SHOW TABLES":  # the database's tables, and DuckDB's of each cursor
                assert got.to_pylist() == [{"name": "t"}]
                assert db.sql(q).to_pylist() == [{"name": "scratch"}, {"name": "t"}]
            elif q != "SHOW ALL TABLES":
                assert got.to_pylist() == db.sql(q).to_pylist(), q
        assert [row["column_name"] for row in r.execute("SHOW t").to_pylist()] == [
            "i", "batch"]
        for q in ("EXPLAIN SELECT sum(i) FROM t", "EXPLAIN ANALYZE SELECT sum(i) FROM t",
                  "explain (format json) SELECT sum(i) FROM t"):
            assert Reader.runs(q), q
            assert r.execute(q).num_rows >= 1, q
        assert not Reader.runs("EXPLAIN INSERT INTO t VALUES (1, 1)")
        with pytest.raises(DatabaseError, match="a reader runs queries"):
            r.execute("EXPLAIN INSERT INTO t VALUES (1, 1)")
        assert db.sql("SELECT count(*) FROM t").to_pylist() == [{"count_star()": 6000}]
    finally:
        r.close()


def test_two_readers_queries_overlap_and_are_right(db):
    expected = db.sql(SLOW).to_pylist()
    spans, results, errors = [], [], []
    start = threading.Barrier(2)

    def query():
        r = db.reader()
        try:
            start.wait()
            t0 = time.monotonic()
            results.append(r.execute(SLOW).to_pylist())
            spans.append((t0, time.monotonic()))
        except BaseException as exc:
            errors.append(exc)
        finally:
            r.close()

    threads = [threading.Thread(target=query) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and results == [expected, expected]
    # each started before the other ended: they ran at the same time
    assert max(s for s, _ in spans) < min(e for _, e in spans), spans


def test_readers_see_whole_inserts_only_while_a_writer_inserts(db):
    """A writer inserts batches of 1000 rows (several parts each) while readers count:
    every count is a whole number of batches, and each reader's counts never go back."""
    stop = threading.Event()
    seen: list[list[tuple[int, int]]] = [[], []]
    errors: list[BaseException] = []

    def read(n):
        r = db.reader()
        try:
            while not stop.is_set():
                got = r.execute("SELECT count(i), count(DISTINCT batch) FROM t WHERE i >= 0")
                seen[n].append(tuple(got.to_pylist()[0].values()))
        except BaseException as exc:
            errors.append(exc)
        finally:
            r.close()

    readers = [threading.Thread(target=read, args=(n,)) for n in range(2)]
    for t in readers:
        t.start()
    try:
        for b in range(1, 9):
            db.sql(f"INSERT INTO t SELECT 100000 * {b} + range, {b} FROM range(1000)")
    finally:
        stop.set()
        for t in readers:
            t.join(60)
    assert errors == []
    for rows in seen:
        assert rows
        for count, batches in rows:
            assert count == 6000 + 1000 * (batches - 1), (count, batches)
        assert [c for c, _ in rows] == sorted(c for c, _ in rows)
    r = db.reader()
    assert r.execute("SELECT count(*) FROM t WHERE i >= 0").to_pylist() == \
        [{"count_star()": 14000}]
    r.close()


def test_parts_a_query_started_from_stay_until_it_ends(db, tmp_path):
    """OPTIMIZE merges the parts (deleting the old ones) while a reader's query over them
    runs: the query's answer is whole, and the old files go when it ends."""
    for b in range(1, 4):
        db.sql(f"INSERT INTO t SELECT 100000 * {b} + range, {b} FROM range(1000)")

    def files():
        return list((tmp_path / "db" / "data").rglob("*.parquet"))

    parts = len(files())
    assert parts >= 4
    expected = db.sql(SLOW).to_pylist()
    r = db.reader()
    got, errors = [], []

    def query():
        try:
            got.append(r.execute(SLOW).to_pylist())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=query)
    t.start()
    while db._readers_running == 0 and t.is_alive():  # its tables are taken
        time.sleep(0.001)
    db.sql("OPTIMIZE TABLE t")
    with db._mutex:  # (a reader ends under it)
        if db._readers_running:
            assert len(files()) == parts + 1  # the old parts wait for the query
    t.join(120)
    r.close()
    assert errors == [] and got == [expected]
    assert db._doomed_parts == [] and db._readers_running == 0
    assert db.query("SELECT count(*) FROM system.parts") == [(1,)]
    assert len(files()) == 1
    assert db.sql(SLOW).to_pylist() == expected


def test_a_reader_has_the_connection_hooks_functions_and_macros(tmp_path):
    """cryptdisk.fields' functions: its Python functions are the DuckDB instance's, its
    macros (mask_full, tokenize, ...) are made again on each reader's cursor."""
    import cryptdisk.fields  # its connection hook

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        database = cryptdisk.connect(tmp_path / "f")
    try:
        database.sql("CREATE TABLE p (email VARCHAR)")
        database.sql("INSERT INTO p VALUES ('alice@example.com'), ('bob@example.org')")
        r = database.reader()
        for q in ("SELECT mask_full(email), mask_email(email) FROM p ORDER BY email",
                  "SELECT mask_last4('4111111111111111')"):
            assert r.execute(q).to_pylist() == database.sql(q).to_pylist(), q
        r.close()
    finally:
        database.close()


def test_configure_sets_a_connection_local_setting_on_the_reader_only(tmp_path) -> None:
    """A reader's configure() reaches its queries, not the database's own; anything but
    SET and RESET is refused with a clear error."""
    from cryptdisk.db import connect
    from cryptdisk.errors import DatabaseError

    with connect(str(tmp_path / "db")) as db:
        r = db.reader()
        r.configure("SET integer_division = true")
        assert r.execute("SELECT 7 / 2").column(0).to_pylist() == [3]
        assert db.query("SELECT 7 / 2") == [(3.5,)]
        r.configure("RESET integer_division")
        assert r.execute("SELECT 7 / 2").column(0).to_pylist() == [3.5]
        with pytest.raises(DatabaseError, match="one SET or RESET"):
            r.configure("DROP TABLE x")
        with pytest.raises(DatabaseError, match="one SET or RESET"):
            r.configure("SET integer_division = true; CREATE TABLE x (i INTEGER)")
        assert r.execute("SELECT 7 / 2").column(0).to_pylist() == [3.5]  # nothing ran
        with pytest.raises(DatabaseError):
            r.configure("SET no_such_setting = 1")
        r.close()
        with pytest.raises(DatabaseError, match="closed"):
            r.configure("SET integer_division = true")


def _header_keys(root) -> dict[str, int]:
    """The key id in the header of every encrypted file of the database ``root`` (its
    parts and its catalog), read from the files themselves."""
    from cryptdisk.format import read_header

    found = {}
    for path in [*root.rglob("*.parquet"), root / "catalog"]:
        with open(path, "rb") as f:
            found[str(path)] = read_header(f).key_id
    return found


def test_a_rotation_while_a_reader_streams_leaves_nothing_under_the_old_key(tmp_path):
    """A reader's query has opened its parts and is streaming them when OPTIMIZE replaces
    them (they wait on disk for the query) and the database rotates to a new key: every
    file on disk, the replaced parts too, is under the new key when the rotation returns
    (as its check says), the old key can be removed, and the query ends with every row."""
    import os

    from cryptdisk.keys import Key

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        db = cryptdisk.connect(tmp_path / "db")
    try:
        db.sql("CREATE TABLE t (i BIGINT, s VARCHAR) ORDER BY i")
        for b in range(6):
            db.sql(f"INSERT INTO t SELECT {b} * 100000 + range, 'v' || range "
                   "FROM range(20000)")
        expected = db.sql("SELECT i, s FROM t ORDER BY i")
        r = db.reader()
        started, go = threading.Event(), threading.Event()

        def gate(values):  # holds the stream at its first batch (no annotations: DuckDB
            # reads them)
            started.set()
            go.wait(120)
            return values

        r.con.create_function("gate", gate, ["BIGINT"], "BIGINT", type="arrow")
        got, errors = [], []

        def query():
            try:
                got.append(r.execute("SELECT gate(i) AS i, s FROM t"))
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=query)
        t.start()
        try:
            assert started.wait(60)
            db.sql("OPTIMIZE TABLE t FINAL")
            assert len(_header_keys(tmp_path / "db")) == 6 + 1 + 1  # the old parts wait
            assert set(_header_keys(tmp_path / "db").values()) == {1}
            db.rotate_keys(new_key=Key(2, os.urandom(32)))
            assert t.is_alive() and db._readers_running == 1  # the query still streams
            keys = _header_keys(tmp_path / "db")
            assert len(keys) == 8 and set(keys.values()) == {2}, keys
            assert db.files_under_key(1) == []
            db.remove_key(1)
        finally:
            go.set()
            t.join(120)
        r.close()
        assert errors == []
        assert got[0].sort_by("i") == expected
        keys = _header_keys(tmp_path / "db")
        assert len(keys) == 2 and set(keys.values()) == {2}  # the old parts went with it
        assert db.query("SELECT id, files FROM system.keys") == [(2, 2)]
    finally:
        db.close()


def test_another_readers_statement_does_not_make_a_query_evict_its_own_entries(tmp_path):
    """A scan larger than the decoded-column cache never evicts what it kept or used
    itself (repeats answer those row groups from the cache). Another reader's statement
    that starts while it streams does not change that: what the query had used when the
    other started is still in the cache when it ends."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        db = cryptdisk.connect(tmp_path / "db", cache_bytes=8 << 20)
    try:  # 2 columns of 46 row groups of 512 KiB: the cache holds 16 of the 92
        db.sql("CREATE TABLE t (i BIGINT, pad BIGINT) ORDER BY i")
        db.sql("INSERT INTO t SELECT range, range * 7 FROM range(3000000)")
        query = "SELECT sum(gate(i) + pad) AS s FROM t"
        expected = db.query("SELECT sum(i + pad) AS s FROM t")[0][0]
        a, b = db.reader(), db.reader()
        started, go = threading.Event(), threading.Event()

        def gate(values):  # (no annotations: DuckDB reads them)
            started.set()
            go.wait(120)
            return values

        a.con.create_function("gate", gate, ["BIGINT"], "BIGINT", type="arrow")
        go.set()
        for _ in range(2):  # offered once, then kept up to the bound
            assert a.execute(query).to_pylist() == [{"s": expected}]
        assert db.cache._items and db.cache.size <= db.cache.bound
        go.clear()
        started.clear()
        got, errors = [], []

        def run():
            try:
                got.append(a.execute(query).to_pylist())
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=run)
        t.start()
        try:
            assert started.wait(60)
            mine = db.cache.statement  # the query's statement: the last one started
            used = {k for k, item in list(db.cache._items.items()) if item[2] == mine}
            assert used  # the row groups it has read from the cache so far
            assert b.execute("SELECT 1 AS x").to_pylist() == [{"x": 1}]  # starts meanwhile
        finally:
            go.set()
            t.join(120)
        assert errors == [] and got == [[{"s": expected}]]
        assert used <= set(db.cache._items), len(used - set(db.cache._items))
        assert db.cache.size <= db.cache.bound
        a.close()
        b.close()
    finally:
        db.close()


def test_a_readers_sql_and_query_run_on_its_own_cursor_and_refuse_writes(db):
    r = db.reader()
    try:
        # a connection-local setting on the reader's cursor only: r.sql must use that cursor
        r.configure("SET integer_division = true")
        assert r.query("SELECT 7 / 2 AS q") == [(3,)]
        assert db.query("SELECT 7 / 2 AS q") == [(3.5,)]
        got = r.sql("SELECT count(*) AS n FROM t; SELECT max(i) AS m FROM t")
        assert got.to_pylist() == [{"m": 5999}]
        assert r.query("SELECT count(*) FROM t WHERE i < 10") == [(10,)]
        # a write (alone, or after a query in the same text) runs nothing through a reader
        for text in ("INSERT INTO t VALUES (1, 1)",
                     "SELECT 1; INSERT INTO t VALUES (1, 1)"):
            with pytest.raises(DatabaseError, match="a reader runs queries"):
                r.sql(text)
        assert db.query("SELECT count(*) FROM t") == [(6000,)]
    finally:
        r.close()


def test_a_reader_prepares_and_executes_queries_on_its_own_cursor(db):
    r = db.reader()
    try:
        assert r.runs("PREPARE p AS SELECT max(i) FROM t WHERE i < $1")
        assert r.runs("EXECUTE p(5)") and r.runs("DEALLOCATE p")
        assert not r.runs("PREPARE w AS INSERT INTO t VALUES ($1, 0)")
        r.execute("PREPARE p AS SELECT max(i) FROM t WHERE i < $1")
        assert r.query("EXECUTE p(5)") == [(4,)]
        db.sql("INSERT INTO t VALUES (-7, 1)")
        assert r.query("EXECUTE p(0)") == [(-7,)]
        with pytest.raises(DatabaseError, match="p"):  # the database's own connection
            db.sql("EXECUTE p(5)")                     # has its own names
        r.execute("DEALLOCATE p")
        with pytest.raises(DatabaseError, match="p"):
            r.execute("EXECUTE p(5)")
        with pytest.raises(DatabaseError, match="reader runs queries"):
            r.execute("PREPARE w AS INSERT INTO t VALUES ($1, 0)")
    finally:
        r.close()


@pytest.mark.parametrize(("sql", "message"), [
    ("WITH q AS (SELECT 7 AS i, 0 AS batch) INSERT INTO t SELECT * FROM q",
     "put the WITH after INSERT"),
    ("WITH q AS (SELECT 1) DELETE FROM t", "WITH ... DELETE t"),
    ("WITH q AS (SELECT 1) UPDATE t SET i = 2", "WITH ... UPDATE t"),
])
def test_a_reader_refuses_what_the_database_refuses_on_a_tables_view(db, sql, message):
    """A reader sent these to DuckDB, which said 't is not an table' (the database's own
    connection refused them with a hint)."""
    r = db.reader()
    try:
        for run in (r.execute, r.sql, db.sql):
            with pytest.raises(DatabaseError, match=message) as e:
                run(sql)
            assert e.value.hint
        assert r.query("SELECT count(*) FROM t") == [(6000,)]
    finally:
        r.close()


def test_a_reader_of_a_closed_database_says_the_database_is_closed(tmp_path):
    """A reader whose database was closed answered DuckDB's "Connection Error: Connection
    has already been closed"."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = cryptdisk.connect(tmp_path / "db")
    r = db.reader()
    db.close()
    for call in (lambda: r.query("SELECT 1"), lambda: r.configure("SET threads = 1")):
        with pytest.raises(DatabaseError, match=r"database .* is closed") as e:
            call()
        assert "Connection" not in str(e.value)


def test_a_read_only_connection_in_a_transaction_block_says_it_is_read_only(tmp_path):
    cryptdisk.connect(tmp_path / "db").close()
    with cryptdisk.connect(tmp_path / "db", read_only=True) as ro:
        ro.sql("BEGIN")
        with pytest.raises(DatabaseError, match="open read-only"):
            ro.sql("CREATE TABLE t (k BIGINT)")


def test_a_variable_leaves_the_fast_paths_on(tmp_path) -> None:
    """``SET VARIABLE`` (a value ``getvariable()`` reads, kept for each connection) names
    no column and no table: after it on a reader (or the database), count(*) and min/max
    of the key still come from the catalog, count(DISTINCT) outside DuckDB, a point query
    on the key still skips parts, and a filter on getvariable() answers as DuckDB does."""
    import pyarrow as pa

    from cryptdisk.db import connect
    from cryptdisk.db._distinct import DistinctCount

    with connect(str(tmp_path / "db")) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        for start in range(0, 40000, 10000):  # four parts, each its own key range
            db.sql(f"INSERT INTO t SELECT i, 'v' || (i % 7) FROM range({start}, "
                   f"{start + 10000}) r(i)")
        db.execute("SET VARIABLE y = 1")  # on the database's connection
        assert db._names_certain()
        r = db.reader()
        try:
            r.configure("SET VARIABLE x = 14242")
            assert r._names_certain() and db._names_certain()
            assert r.query("SELECT k, s FROM t WHERE k = getvariable('x')") == [
                (14242, "v4")]
            assert r.query("SELECT count(*) FROM t WHERE k BETWEEN getvariable('x') AND "
                           "getvariable('x') + 9") == [(10,)]
            assert r.query("SELECT getvariable('y')") == [(None,)]  # the database's own
            assert r.query("SELECT count(*) AS N FROM t") == [(40000,)]
            assert r.last_scans["t"]["parts_from_index"] == 4  # the catalog's counts
            assert r.last_scans["t"]["row_groups_read"] == 0
            assert isinstance(r._prepare("SELECT min(k) AS Lo, max(k) AS Hi FROM t"),
                              pa.Table)  # from the catalog, DuckDB not asked
            if DistinctCount.available():
                assert isinstance(r._prepare("SELECT count(DISTINCT s) FROM t"),
                                  DistinctCount)
            assert r.query("SELECT s FROM t WHERE k = 14242") == [("v4",)]
            assert r.last_scans["t"]["parts_skipped"] == 3
            r.configure("RESET VARIABLE x")
            assert r.query("SELECT getvariable('x')") == [(None,)]
            assert r._names_certain() and db._names_certain()
            r.configure("SET preserve_identifier_case = false")  # a setting still counts
            assert not r._names_certain()
        finally:
            r.close()


def test_arrow_lossless_keeps_the_readers_own_setting(db):
    """A reader's own arrow_lossless_conversion (configure) is what its cursor has after
    a query that arrow_lossless set it for: on stays on, off stays off; it was reset to
    DuckDB's default (off) after each such query."""
    sql = "SELECT '12:34:56+05:30'::TIMETZ AS v"
    setting = "SELECT current_setting('arrow_lossless_conversion')"
    r = db.reader()
    try:
        r.arrow_lossless = True
        r.configure("SET SESSION arrow_lossless_conversion = true")
        for _ in range(2):
            kind = r.execute(sql).schema.field("v").type
            assert (kind.extension_name, kind.type_name) == ("arrow.opaque", "time_tz")
            assert r.con.execute(setting).fetchone() == (True,)
        r.stream(sql).read_all()
        r.configure("SET SESSION arrow_lossless_conversion = false")
        assert r.con.execute(setting).fetchone() == (False,)
        kind = r.execute(sql).schema.field("v").type  # (on for the query alone)
        assert (kind.extension_name, kind.type_name) == ("arrow.opaque", "time_tz")
        assert r.con.execute(setting).fetchone() == (False,)
        r.configure("SET SESSION arrow_lossless_conversion = true")
        r.execute(sql)
        assert r.con.execute(setting).fetchone() == (True,)
    finally:
        r.close()


def test_arrow_lossless_is_for_the_queries_results_only(db):
    """With arrow_lossless a reader's query result (execute, stream) is DuckDB's lossless
    Arrow export (a TIMETZ with its offset); its cursor has the default export between
    queries, and a reader without it, or after it is turned off, gets the default."""
    sql = "SELECT '12:34:56+05:30'::TIMETZ AS v, true AS b, count(*) AS n FROM t"
    r = db.reader()
    try:
        assert str(r.execute(sql).schema.field("v").type) == "time64[us]"
        r.arrow_lossless = True
        got = r.execute(sql)
        kind = got.schema.field("v").type
        assert (kind.extension_name, kind.type_name) == ("arrow.opaque", "time_tz")
        bits = int.from_bytes(got.column("v")[0].as_py(), "little")
        assert (bits >> 24, 57599 - (bits & 0xFFFFFF)) == (45296 * 10**6, 19800)
        assert got.column("n").to_pylist() == [6000]
        setting = "SELECT current_setting('arrow_lossless_conversion')"
        assert r.con.execute(setting).fetchone() == (False,)  # (after the query)
        stream = r.stream(sql)
        assert stream.schema.field("v").type == kind
        assert stream.read_all().column("n").to_pylist() == [6000]
        # a query whose text can make no TIMETZ keeps the default export (no SET/RESET)
        plain = r.execute("SELECT true AS b, count(*) AS n FROM t")
        assert str(plain.schema.field("b").type) == "bool"
        db.execute("CREATE VIEW zoned AS SELECT '01:02:03-08'::TIMETZ AS z")
        kind = r.execute("SELECT z FROM zoned").schema.field("z").type  # (views written out)
        assert (kind.extension_name, kind.type_name) == ("arrow.opaque", "time_tz")
        r.arrow_lossless = False
        assert str(r.execute(sql).schema.field("v").type) == "time64[us]"
        assert str(db.sql(sql).schema.field("v").type) == "time64[us]"
    finally:
        r.close()

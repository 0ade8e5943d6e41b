"""The scan's fast paths against DuckDB on the same rows: random tables (several inserts,
so several parts, empty inserts, NULLs, NaN, -0.0, duplicates, unicode, composite and
nullable ORDER BY keys) and random queries of the shapes the engine answers its own way
(the sparse index's pruning, LIMIT [OFFSET] from the first granules, top-N, count(*) and
min/max of the key from the catalog, the decoded-column cache), each compared with
DuckDB's answer over a plain in-memory table holding the same rows: cold, warm, after
another insert, in statements that read the table twice, and from readers while an
insert runs."""

import collections
import math
import threading

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _parts
from cryptdisk.errors import DatabaseError

_STRINGS = ["a", "b", "é", "e\u0301", "ß", "日本", "😀", "", "a'b", "Z", "zz", "A "]
_FLOATS = [math.nan, -0.0, 0.0, 1.5, -1.5, math.inf, -math.inf, 2.25, -7.0]
#: the first key column's types, each with how a small integer becomes its literal
_KEY_TYPES = {
    "BIGINT": str,
    "INTEGER": str,
    "UBIGINT": lambda v: f"{abs(v)}::UBIGINT",
    "DATE": lambda v: f"(DATE '2020-01-01' + {v})",
    "TIMESTAMP": lambda v: f"(TIMESTAMP '2020-01-01' + to_seconds({v * 1000}))",
    "TIMESTAMP_S": lambda v: f"CAST(TIMESTAMP '2020-01-01' + to_seconds({v * 1000}) "
                             "AS TIMESTAMP_S)",
    "DECIMAL(9,3)": lambda v: f"CAST({v} / 8 AS DECIMAL(9,3))",
    "DOUBLE": None,
    "VARCHAR": None,
}
_ORDERS = [["k"], ["k", "s"], ["s", "k"], ["f"], ["s"], ["i", "k"], []]
_COLUMNS = ["k", "s", "f", "i"]


def _lit(value, typ: str) -> str:
    if value is None:
        return "NULL"
    if typ == "VARCHAR":
        return "'" + value.replace("'", "''") + "'"
    if typ == "DOUBLE":
        if math.isnan(value):
            return "'NaN'::DOUBLE"
        if math.isinf(value):
            return f"'{'-' if value < 0 else ''}inf'::DOUBLE"
        return f"'{value!r}'::DOUBLE"  # '-0.0' keeps its sign
    return _KEY_TYPES[typ](value)


def _norm(row):
    """A row comparable with ==: NaN as a marker (-0.0 == 0.0 as DuckDB has it)."""
    return tuple("NaN" if isinstance(x, float) and math.isnan(x) else x for x in row)


def _bag(rows):
    return collections.Counter(_norm(r) for r in rows)


class _Pair:
    """A cryptdisk table and a DuckDB table given the same statements."""

    def __init__(self, path, key_type: str, order: list[str], cache: bool):
        self.types = {"k": key_type, "s": "VARCHAR", "f": "DOUBLE", "i": "INTEGER"}
        self.db = cryptdisk.connect(path, cache_bytes=(64 << 20) if cache else 0)
        self.ref = duckdb.connect()
        cols = ", ".join(f"{c} {self.types[c]}" for c in _COLUMNS)
        by = f" ORDER BY ({', '.join(order)})" if order else ""
        self.db.sql(f"CREATE TABLE t ({cols}){by}")
        self.ref.execute(f"CREATE TABLE t ({cols})")
        self.rows: list[tuple] = []

    def insert(self, rows):
        if rows:
            values = ", ".join("(" + ", ".join(_lit(v, self.types[c]) for v, c in
                                               zip(r, _COLUMNS, strict=True)) + ")"
                               for r in rows)
            sql = f"INSERT INTO t VALUES {values}"
        else:  # an insert of no rows
            sql = "INSERT INTO t SELECT * FROM t WHERE false"
        self.db.sql(sql)
        self.ref.execute(sql)
        self.rows.extend(rows)

    def both(self, sql: str):
        """(cryptdisk's rows or its error, DuckDB's rows or its error)."""
        try:
            got = self.db.query(sql)
        except DatabaseError as exc:
            got = exc
        try:
            want = self.ref.execute(sql).fetchall()
        except duckdb.Error as exc:
            want = exc
        return got, want

    def close(self):
        self.db.close()
        self.ref.close()


@st.composite
def _tables(draw):
    key_type = draw(st.sampled_from(sorted(_KEY_TYPES)))
    order = draw(st.sampled_from(_ORDERS))
    nulls = draw(st.booleans())
    types = {"k": key_type, "s": "VARCHAR", "f": "DOUBLE", "i": "INTEGER"}
    inserts = draw(st.lists(st.lists(st.tuples(*[_column(types[c], nulls) for c in _COLUMNS]),
                                     max_size=40), min_size=1, max_size=4))
    return key_type, order, nulls, inserts, draw(st.booleans())


def _column(typ: str, nulls: bool):
    if typ == "VARCHAR":
        values = st.sampled_from(_STRINGS)
    elif typ == "DOUBLE":
        values = st.sampled_from(_FLOATS)
    elif typ == "INTEGER":
        values = st.integers(-3, 8)
    else:
        values = st.integers(-5, 30)
    return st.one_of(st.none(), values) if nulls else values


def _constant(data, pair: _Pair, column: str) -> str:
    """A constant for ``column``: often one of its values, else any of its type."""
    typ = pair.types[column]
    present = [r[_COLUMNS.index(column)] for r in pair.rows]
    present = [v for v in present if v is not None]
    if present and data.draw(st.booleans()):
        return _lit(data.draw(st.sampled_from(present)), typ)
    return _lit(data.draw(_column(typ, False)), typ)


def _filter(data, pair: _Pair, order: list[str], depth: int = 0) -> str:
    column = data.draw(st.sampled_from(order + _COLUMNS if order else _COLUMNS))
    kinds = ["=", "<", "<=", ">", ">=", "!=", "between", "in", "is null", "is not null",
             "not between", "not in"] + (["and", "or"] if depth < 2 else [])
    kind = data.draw(st.sampled_from(kinds))

    def c():
        return _constant(data, pair, column)
    if kind in ("and", "or"):
        return (f"({_filter(data, pair, order, depth + 1)} {kind.upper()} "
                f"{_filter(data, pair, order, depth + 1)})")
    if kind in ("between", "not between"):
        return f"{column} {kind.upper()} {c()} AND {c()}"
    if kind in ("in", "not in"):
        n = data.draw(st.integers(1, 4))
        return f"{column} {kind.upper()} ({', '.join(c() for _ in range(n))})"
    if kind in ("is null", "is not null"):
        return f"{column} {kind.upper()}"
    return f"{column} {kind} {c()}"


def _build(tmp_path_factory, table):
    key_type, order, nulls, inserts, cache = table
    pair = _Pair(tmp_path_factory.mktemp("vs") / "db", key_type, order, cache)
    for rows in inserts:
        pair.insert(rows)
    return pair, order, nulls


_SETTINGS = settings(max_examples=10, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture,
                                            HealthCheck.data_too_large])


@pytest.fixture(autouse=True)
def _small_granules(monkeypatch):
    """Granules of 4 rows, row groups of 16: a few dozen rows span several of each."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 4)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 16)


def _agree(pair: _Pair, sql: str, how: str = "bag"):
    got, want = pair.both(sql)
    if isinstance(want, Exception) or isinstance(got, Exception):
        assert isinstance(got, Exception) and isinstance(want, Exception), (sql, got, want)
        return
    if how == "ordered":
        assert [_norm(r) for r in got] == [_norm(r) for r in want], sql
    else:
        assert _bag(got) == _bag(want), sql


@_SETTINGS
@given(table=_tables(), data=st.data())
def test_filters_on_the_key_and_other_columns(tmp_path_factory, table, data):
    pair, order, nulls = _build(tmp_path_factory, table)
    try:
        for _ in range(4):
            cols = data.draw(st.sampled_from(["*", "k, s", "f, k", "s", "i, f"]))
            sql = f"SELECT {cols} FROM t WHERE {_filter(data, pair, order)}"
            _agree(pair, sql)
            _agree(pair, sql)  # warm: kept, or from the cache
        pair.insert(data.draw(st.lists(st.tuples(*[_column(pair.types[c], nulls)
                                                   for c in _COLUMNS]), max_size=10)))
        _agree(pair, sql)  # after another insert
    finally:
        pair.close()


@_SETTINGS
@given(table=_tables(), data=st.data())
def test_limit_and_offset(tmp_path_factory, table, data):
    pair, order, _nulls = _build(tmp_path_factory, table)
    try:
        for _ in range(4):
            cols = data.draw(st.sampled_from(["*", "k", "s, f", "i, k"]))
            limit = data.draw(st.sampled_from([0, 1, 2, 4, 5, 16, 17, 33, 1000]))
            offset = data.draw(st.one_of(st.none(), st.integers(0, 200)))
            sql = f"SELECT {cols} FROM t LIMIT {limit}"
            if offset is not None:
                sql += f" OFFSET {offset}"
            where = data.draw(st.booleans())
            if where:
                sql = sql.replace(" LIMIT", f" WHERE {_filter(data, pair, order)} LIMIT")
            every = pair.ref.execute(sql.split(" LIMIT")[0]).fetchall()
            start = offset or 0
            first = None
            if not where:  # the table's first rows, in its order
                con = duckdb.connect()
                con.register("t", pair.db.arrow_table("t"))
                first = [_norm(r) for r in con.execute(sql).fetchall()]
            for _ in range(3):  # cold, kept, from the cache
                got = pair.db.query(sql)
                assert len(got) == len(every[start:start + limit]), sql
                assert not _bag(got) - _bag(every), sql  # rows of the table, none made up
                assert first is None or [_norm(r) for r in got] == first, sql
    finally:
        pair.close()


@_SETTINGS
@given(table=_tables(), data=st.data())
def test_top_n_with_ties(tmp_path_factory, table, data):
    """ORDER BY ... LIMIT, selecting the ORDER BY's columns only, so that ties cannot
    differ; and all columns ordered by all of them."""
    pair, order, nulls = _build(tmp_path_factory, table)
    try:
        for _ in range(4):
            keys = data.draw(st.lists(st.sampled_from(_COLUMNS), min_size=1, max_size=3,
                                      unique=True))
            if order and data.draw(st.booleans()):
                keys = order[:data.draw(st.integers(1, len(order)))]
            if data.draw(st.booleans()):  # every column: rows tie only when equal
                keys += [c for c in _COLUMNS if c not in keys]
            terms = [k + data.draw(st.sampled_from(["", " DESC", " ASC"]))
                     + data.draw(st.sampled_from(["", " NULLS FIRST", " NULLS LAST"]))
                     for k in keys]
            sql = f"SELECT {', '.join(keys)} FROM t"
            if data.draw(st.integers(0, 3)) == 0:
                sql += f" WHERE {_filter(data, pair, order)}"
            limit = data.draw(st.sampled_from([1, 2, 3, 10, 50]))
            sql += f" ORDER BY {', '.join(terms)} LIMIT {limit}"
            if data.draw(st.integers(0, 3)) == 0:
                sql += f" OFFSET {data.draw(st.integers(0, 30))}"
            for _ in range(3):
                _agree(pair, sql, "ordered")
        pair.insert(data.draw(st.lists(st.tuples(*[_column(pair.types[c], nulls)
                                                   for c in _COLUMNS]), max_size=10)))
        _agree(pair, sql, "ordered")
    finally:
        pair.close()


@_SETTINGS
@given(table=_tables(), data=st.data())
def test_count_and_extremes(tmp_path_factory, table, data):
    pair, order, nulls = _build(tmp_path_factory, table)
    key = order[0] if order else "k"
    shapes = [f"SELECT min({key}), max({key}) FROM t", f"SELECT max({key}) FROM t",
              "SELECT count(*) FROM t", f"SELECT min({key}) AS lo FROM t",
              f"SELECT count(*) AS n, min({key}) FROM t",
              "SELECT count(*), count(k), min(k), max(k), min(s), max(s), min(i), max(i) FROM t"]
    try:
        for _ in range(4):
            sql = data.draw(st.sampled_from(shapes))
            if data.draw(st.booleans()):
                sql += f" WHERE {_filter(data, pair, order)}"
            _agree(pair, sql, "ordered")
            _agree(pair, sql, "ordered")
        pair.insert(data.draw(st.lists(st.tuples(*[_column(pair.types[c], nulls)
                                                   for c in _COLUMNS]), max_size=10)))
        _agree(pair, sql, "ordered")
    finally:
        pair.close()


@_SETTINGS
@given(table=_tables(), data=st.data())
def test_statements_reading_the_table_twice(tmp_path_factory, table, data):
    pair, order, _nulls = _build(tmp_path_factory, table)
    try:
        for _ in range(3):
            f1, f2 = _filter(data, pair, order), _filter(data, pair, order)
            n = data.draw(st.integers(0, 20))
            sql = data.draw(st.sampled_from([
                f"WITH x AS (SELECT * FROM t WHERE {f1}) "
                f"SELECT count(*), min(x.k) FROM x, t WHERE x.k = t.k",
                f"WITH t AS (SELECT * FROM t WHERE {f1}) SELECT k, s FROM t",
                f"SELECT k, s FROM t WHERE {f1} UNION ALL SELECT k, s FROM t WHERE {f2}",
                f"SELECT k, s FROM t WHERE {f1} UNION SELECT k, s FROM t WHERE {f2}",
                f"SELECT a.k, b.s FROM t a JOIN t b ON a.s = b.s WHERE a.{f1}",
                f"SELECT count(*) FROM (SELECT k FROM t ORDER BY k LIMIT {n}) "
                f"WHERE k IN (SELECT k FROM t WHERE {f1})",
                f"SELECT (SELECT count(*) FROM t WHERE {f1}), (SELECT max(k) FROM t)",
                f"SELECT count(*) FROM (SELECT * FROM t LIMIT {n}) a, "
                f"(SELECT * FROM t WHERE {f2}) b",
            ]))
            _agree(pair, sql)
            _agree(pair, sql)
    finally:
        pair.close()


def test_readers_while_inserts_run(tmp_path, monkeypatch):
    """Each reader's answer is that of the table before some insert or after it: one of
    the states the inserts went through, never a mix or rows made up."""
    db = cryptdisk.connect(tmp_path / "db", cache_bytes=64 << 20)
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t SELECT i, i::VARCHAR FROM range(0, 100) r(i)")
    answers = {
        "SELECT count(*) FROM t": lambda n: [(n,)],
        "SELECT min(k), max(k) FROM t": lambda n: [(0, n - 1)],
        "SELECT k FROM t ORDER BY k DESC LIMIT 3": lambda n: [(n - 1,), (n - 2,), (n - 3,)],
        "SELECT count(*), max(k) FROM t WHERE k BETWEEN 50 AND 5000":
            lambda n: [(n - 50, n - 1)],
        "SELECT k FROM t LIMIT 5 OFFSET 98": lambda n: [(k,) for k in range(98, min(n, 103))],
        "SELECT count(*) FROM t a JOIN t b USING (k)": lambda n: [(n,)],
        "SELECT k FROM t WHERE k = 150": lambda n: [(150,)] if n > 150 else [],
    }
    done = [100]  # rows committed so far; a query sees one count between its start and end
    wrong: list = []
    stop = threading.Event()

    def run(reader):
        while not stop.is_set():
            for sql, want in answers.items():
                low = done[-1]
                got = reader.query(sql)
                high = done[-1] + 10  # an insert may be committing
                if all(got != want(n) for n in range(low, high + 1, 10)):
                    wrong.append((sql, got, low, high))
    threads = [threading.Thread(target=run, args=(db.reader(),)) for _ in range(2)]
    for th in threads:
        th.start()
    try:
        for n in range(100, 300, 10):
            db.sql(f"INSERT INTO t SELECT i, i::VARCHAR FROM range({n}, {n + 10}) r(i)")
            done.append(n + 10)
            if n == 200:
                db.sql("OPTIMIZE TABLE t FINAL")
    finally:
        stop.set()
        for th in threads:
            th.join()
        db.close()
    assert not wrong


@pytest.mark.parametrize("sql", [
    "SELECT k FROM t LIMIT 1 + 2", "SELECT k FROM t LIMIT 0", "SELECT k FROM t LIMIT 0 OFFSET 5",
    "SELECT k FROM t LIMIT 3 OFFSET 1000", "SELECT k FROM t OFFSET 85", "SELECT k FROM t LIMIT -1",
    "SELECT k FROM t LIMIT 2 OFFSET -1", "SELECT k FROM t ORDER BY k LIMIT -3",
    "SELECT k FROM t LIMIT (SELECT 2)", "SELECT k FROM t LIMIT 10%", "SELECT k FROM t LIMIT 2.5",
    "SELECT k FROM t LIMIT NULL", "SELECT k FROM t LIMIT 'x'",
    "SELECT k FROM t LIMIT 3 OFFSET 2 + 2",
    "SELECT k FROM t LIMIT $1", "SELECT k FROM t LIMIT ?", "SELECT k FROM t LIMIT ALL OFFSET 85",
    "SELECT k FROM t LIMIT 9223372036854775807", "SELECT k FROM t LIMIT 18446744073709551615",
    "SELECT k FROM t LIMIT 3 OFFSET 9223372036854775807", "SELECT k FROM t LIMIT 2 OFFSET 89",
    "SELECT k FROM t OFFSET 2 ROWS FETCH FIRST 3 ROWS ONLY", "SELECT k FROM t LIMIT 3::BIGINT",
    "SELECT * FROM (SELECT k FROM t LIMIT 3)",
    "SELECT count(*) FROM (SELECT k FROM t LIMIT 3 OFFSET 88)",
    "SELECT k FROM t ORDER BY k DESC LIMIT 3 OFFSET 1000", "SELECT count(*) FROM t LIMIT 0",
    "SELECT min(k) FROM t OFFSET 1", "SELECT sum(k) OVER () FROM t LIMIT 1 OFFSET 5",
    "SELECT k, lag(k) OVER () FROM t LIMIT 2 OFFSET 40",
    "SELECT k FROM t LIMIT 3 OFFSET 2 LIMIT 2",
])
def test_limits_odd_and_bad(db, monkeypatch, sql):
    """DuckDB's answer, or an error where DuckDB gives one (a DatabaseError)."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 4)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 16)
    ref = duckdb.connect()
    for run, sort in ((db.sql, " ORDER BY k"), (ref.execute, "")):
        run("CREATE TABLE t (k BIGINT, s VARCHAR)" + sort)
        for start in (0, 30, 60):
            run(f"INSERT INTO t SELECT i, i::VARCHAR FROM range({start}, {start + 30}) r(i)")
    try:
        want = ref.execute(sql).fetchall()
    except duckdb.Error:
        with pytest.raises(DatabaseError):
            db.query(sql)
        return
    for _ in range(3):
        assert db.query(sql) == want  # the rows are in k's order in both

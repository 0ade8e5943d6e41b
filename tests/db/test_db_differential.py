"""The engine against DuckDB, adversarially: random tables of every key type the engine
sorts by (BIGINT and UBIGINT extremes, DOUBLE with NaN, -0.0 and infinities, VARCHAR with
empty, long and non-ASCII strings, REAL, DATE, TIMESTAMP, DECIMAL, BOOLEAN), encrypted and
plain, written as several parts (key-disjoint through Arrow inserts of sorted slices, or
overlapping through SQL inserts), merged by OPTIMIZE and changed by DELETE and UPDATE, then
queried with filters whose constants are of another type than their column (``i = 2.5``,
``i > '10'``, ``d = '2024-01-01'``), NULL, NOT and OR; ORDER BY ... LIMIT ... OFFSET with
ties; LIMIT without ORDER BY; count, min and max (from the catalog or the parts);
count(DISTINCT) of every type; GROUP BY; joins of an encrypted and a plain table; PREPARE
and EXECUTE, and ``?`` parameters. Every answer is compared with DuckDB's over an
in-memory table of the same rows (errors too: where DuckDB refuses a statement, cryptdisk
raises a ``DatabaseError``). ``test_db_scan_vs_duckdb.py`` covers the shortcuts' own
shapes on small values; this file the types, constants and table histories around them.

``CRYPTDISK_DIFF_EXAMPLES`` (default 20) sets each property's examples;
``CRYPTDISK_DIFF_SHRINK=0`` reports a failing example as found (a long campaign).
"""

from __future__ import annotations

import collections
import itertools
import math
import os
import re
from collections.abc import Iterator
from typing import Any

import duckdb
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _parts
from cryptdisk.errors import DatabaseError

EXAMPLES = int(os.environ.get("CRYPTDISK_DIFF_EXAMPLES", "20"))

_I64 = 1 << 63
_LONG = "x" * 5000  # past Parquet's statistics size: a row group without string bounds
#: each type's values, as SQL literals (the same text goes to both databases)
_VALUES: dict[str, list[str]] = {
    "BIGINT": [str(v) for v in (-_I64, -_I64 + 1, -2, -1, 0, 1, 2, 3, 7, 10, 2**31,
                                _I64 - 2, _I64 - 1)],
    "INTEGER": [str(v) for v in (-2**31, -1, 0, 1, 2, 3, 10, 2**31 - 1)],
    "SMALLINT": [str(v) for v in (-32768, -1, 0, 1, 2, 10, 32767)],
    "UBIGINT": [str(v) for v in (0, 1, 2, 10, _I64 - 1, _I64, _I64 + 1, 2 * _I64 - 1)],
    "DOUBLE": ["'NaN'::DOUBLE", "'-0.0'::DOUBLE", "0.0", "'inf'::DOUBLE", "'-inf'::DOUBLE",
               "1.5", "-1.5", "2.5", "1e308", "-1e308", "5e-324", "10.0",
               "9007199254740993", "2"],
    "REAL": ["0.1", "0.2", "-0.1", "1.5", "'NaN'::REAL", "'-0.0'::REAL", "'inf'::REAL",
             "16777216", "16777217", "3.4e38", "1e-45", "0.30000001"],
    "VARCHAR": ["''", "'a'", "'b'", "'é'", "'e\u0301'", "'日本'", "'😀'", "'a''b'", "'10'",
                "'2'", "'NaN'", "'A '", f"'{_LONG}'", f"'{_LONG}é'", "'\x7f'"],
    "DATE": ["DATE '0001-01-01'", "DATE '1970-01-01'", "DATE '2024-01-01'",
             "DATE '2024-02-29'", "DATE '2024-01-02'", "DATE '9999-12-31'"],
    "TIMESTAMP": ["TIMESTAMP '2024-01-01 00:00:00'", "TIMESTAMP '2024-01-01 00:00:00.000001'",
                  "TIMESTAMP '1970-01-01'", "TIMESTAMP '0001-01-01'",
                  "TIMESTAMP '9999-12-31 23:59:59.999999'", "TIMESTAMP '2024-01-01 12:00'"],
    "DECIMAL(18,3)": ["0", "-0.001", "0.001", "1.5", "2.500", "10", "999999999999999.999",
                      "-999999999999999.999"],
    "BOOLEAN": ["true", "false"],
}
#: constants of other types than the column's, as a user writes them
_ODD: dict[str, list[str]] = {
    "BIGINT": ["2.5", "'10'", "'-1'", "1e19", "9223372036854775808", "-9223372036854775809",
               "2.0", "'2.5'", "1.5e0", "'abc'", "CAST(3 AS DOUBLE)"],
    "INTEGER": ["2.5", "'10'", "3000000000", "-3000000000", "2.0", "'x'"],
    "SMALLINT": ["2.5", "'10'", "40000", "1.0"],
    "UBIGINT": ["-1", "2.5", "'10'", "18446744073709551616", "-9223372036854775808"],
    "DOUBLE": ["'1.5'", "'nan'", "'-inf'", "2", "-0", "'abc'", "9223372036854775807",
               "1.5::FLOAT"],
    "REAL": ["0.1::DOUBLE", "'0.1'", "0.1000000015", "1e39", "16777217::BIGINT", "'nan'"],
    "VARCHAR": ["'1'", "''", "'A'", "'日'", "'😀😀'", f"'{_LONG}'"],
    "DATE": ["'2024-01-01'", "'2024-01-01 00:00:00'", "TIMESTAMP '2024-01-01 00:00:01'",
             "TIMESTAMP '2024-01-01'", "'not a date'", "'2024-1-1'"],
    "TIMESTAMP": ["'2024-01-01'", "DATE '2024-01-01'", "'2024-01-01 00:00:00.000001'",
                  "'garbage'"],
    "DECIMAL(18,3)": ["1.5e0", "'1.5'", "2", "1.5000", "0.0005", "'-0.001'", "1e30"],
    "BOOLEAN": ["'true'", "'t'", "1", "0", "'yes'", "'maybe'"],
}
_KEYS = ["BIGINT", "INTEGER", "SMALLINT", "UBIGINT", "DOUBLE", "REAL", "VARCHAR", "DATE",
         "TIMESTAMP", "DECIMAL(18,3)", "BOOLEAN"]
#: the columns besides the key ``k`` (whose type varies)
_OTHER = {"i": "BIGINT", "f": "DOUBLE", "s": "VARCHAR", "d": "DATE", "b": "BOOLEAN",
          "m": "DECIMAL(18,3)", "r": "REAL"}
_ORDERS = [["k"], ["k"], ["k", "s"], ["k", "i"], []]
_names = itertools.count()


def _norm(x: Any, strict: bool) -> Any:
    """``x`` comparable with ==: NaN equal to NaN; -0.0 apart from 0.0 when ``strict``."""
    if isinstance(x, float):
        if math.isnan(x):
            return "NaN"
        if strict and x == 0.0 and math.copysign(1.0, x) < 0:
            return "-0.0"
    return x


def _rows(rows: list[tuple[Any, ...]], strict: bool) -> list[tuple[Any, ...]]:
    return [tuple(_norm(x, strict) for x in r) for r in rows]


class Table:
    """A table made the same way in cryptdisk (``t<N>``) and in DuckDB (same name)."""

    def __init__(self, env: Env, key: str, order: list[str], plain: bool):
        self.env, self.key, self.order, self.plain = env, key, order, plain
        self.name = f"t{next(_names)}"
        self.types = {"k": key, **_OTHER}
        cols = ", ".join(f"{c} {t}" for c, t in self.types.items())
        by = f" ORDER BY ({', '.join(order)})" if order else ""
        policy = " SETTINGS storage_policy = 'plain'" if plain else ""
        env.db.sql(f"CREATE TABLE {self.name} ({cols}){by}{policy}")
        env.ref.execute(f"CREATE TABLE {self.name} ({cols})")

    def values(self, rows: list[tuple[str, ...]]) -> str:
        return ", ".join("(" + ", ".join(r) + ")" for r in rows)

    def insert_sql(self, rows: list[tuple[str, ...]]) -> None:
        """One SQL insert on both (an empty one writes no part)."""
        sql = (f"INSERT INTO {self.name} VALUES {self.values(rows)}" if rows else
               f"INSERT INTO {self.name} SELECT * FROM {self.name} WHERE false")
        self.env.db.sql(sql)
        self.env.ref.execute(sql)

    def insert_sorted(self, rows: list[tuple[str, ...]], pieces: int) -> None:
        """The rows in key order as ``pieces`` Arrow inserts: parts with disjoint key
        ranges (but for ties at their edges)."""
        if not rows:
            return
        scratch = f"{self.name}_load"
        cols = ", ".join(f"{c} {t}" for c, t in self.types.items())
        self.env.ref.execute(f"CREATE TEMP TABLE {scratch} ({cols})")
        try:
            self.env.ref.execute(f"INSERT INTO {scratch} VALUES {self.values(rows)}")
            self.env.ref.execute(f"INSERT INTO {self.name} SELECT * FROM {scratch}")
            whole = self.env.ref.sql(f"SELECT * FROM {scratch} ORDER BY k").to_arrow_table()
        finally:
            self.env.ref.execute(f"DROP TABLE {scratch}")
        step = -(-len(rows) // pieces)
        for start in range(0, len(rows), step):
            self.env.db.insert(self.name, whole.slice(start, step))

    def drop(self) -> None:
        self.env.db.sql(f"DROP TABLE {self.name}")
        self.env.ref.execute(f"DROP TABLE {self.name}")


class Env:
    """One cryptdisk database and one DuckDB connection shared by every example."""

    def __init__(self, path: Any):
        self.db = cryptdisk.connect(path, cache_bytes=64 << 20)
        self.ref = duckdb.connect()
        self.examples = 0
        self.statements = 0

    def both(self, sql: str, params: list[Any] | None = None) -> tuple[Any, Any]:
        """(cryptdisk's rows or its DatabaseError, DuckDB's rows or its error); any other
        exception from cryptdisk propagates (a traceback is a finding)."""
        self.statements += 1
        try:
            want: Any = self.ref.execute(sql, params).fetchall() if params is not None \
                else self.ref.execute(sql).fetchall()
        except duckdb.Error as exc:
            want = exc
        try:
            got: Any = self.db.query(sql, params)
        except DatabaseError as exc:
            got = exc
        return got, want


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """Granules of 4 rows, row groups of 16: a few dozen rows span several of each."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_parts, "GRANULE_ROWS", 4)
        mp.setattr(_parts, "ROW_GROUP_ROWS", 16)
        e = Env(tmp_path_factory.mktemp("diff") / "db")
        try:
            yield e
        finally:
            e.db.close()
            e.ref.close()


def _as_it_runs(result: Any) -> bool:
    """Whether ``result`` is a cast that failed as DuckDB ran the statement (``k NOT
    BETWEEN 'x' AND 1``): whether DuckDB gets there depends on its plan and the rows it
    is handed (none past an empty join side, fewer after skipped row groups), so it
    fails over one source and answers over another."""
    return isinstance(result, Exception) and "Conversion Error" in str(result)


def agree(env: Env, sql: str, how: str = "bag", params: list[Any] | None = None,
          runs: int = 2) -> None:
    """cryptdisk answers ``sql`` as DuckDB does, on each of ``runs`` runs (cold, then
    warm): the same rows (``bag``: as multisets, -0.0 apart from 0.0; ``loose``: as
    multisets, -0.0 equal to 0.0; ``ordered``: in order), or both an error."""
    for _ in range(runs):
        got, want = env.both(sql, params)
        if isinstance(want, Exception) or isinstance(got, Exception):
            assert (isinstance(got, Exception) and isinstance(want, Exception)) \
                or _as_it_runs(got) or _as_it_runs(want), (sql, params, got, want)
            continue
        if how == "ordered":
            assert _rows(got, False) == _rows(want, False), (sql, params)
        else:
            strict = how == "bag"
            assert collections.Counter(_rows(got, strict)) == \
                collections.Counter(_rows(want, strict)), (sql, params)


# -- strategies ---------------------------------------------------------------------------

def _value(typ: str, nulls: bool) -> st.SearchStrategy[str]:
    values = st.sampled_from(_VALUES[typ])
    return st.one_of(st.just("NULL"), values, values) if nulls else values


@st.composite
def tables(draw: Any, key: str | None = None) -> dict[str, Any]:
    key = key or draw(st.sampled_from(_KEYS))
    types = {"k": key, **_OTHER}
    nulls = {c: draw(st.booleans()) for c in types}
    row = st.tuples(*[_value(t, nulls[c]) for c, t in types.items()])
    size = draw(st.sampled_from([0, 1, 3, 20, 40, 70]))  # (0: an empty table)
    rows = draw(st.lists(row, min_size=size, max_size=size))
    sorted_pieces = draw(st.sampled_from([0, 0, 1, 2, 3]))  # 0: SQL inserts
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    return {"key": key, "order": draw(st.sampled_from(_ORDERS)), "plain": draw(st.booleans()),
            "rows": rows, "sorted": sorted_pieces, "cuts": cuts}


def build(env: Env, spec: dict[str, Any]) -> Table:
    t = Table(env, spec["key"], spec["order"], spec["plain"])
    rows, cuts = spec["rows"], spec["cuts"]
    if spec["sorted"]:
        t.insert_sorted(rows, spec["sorted"])
    else:
        for a, b in zip([0, *cuts], [*cuts, len(rows)], strict=True):
            t.insert_sql(rows[a:b])
    return t


def constant(data: Any, typ: str) -> str:
    """A constant to compare a column of ``typ`` with: mostly of its type, else another."""
    pick = data.draw(st.integers(0, 9))
    if pick == 0:
        return "NULL"
    if pick <= 2:
        return data.draw(st.sampled_from(_ODD[typ]))
    return data.draw(st.sampled_from(_VALUES[typ]))


def condition(data: Any, t: Table, depth: int = 0, prefix: str = "") -> str:
    """A random WHERE condition on ``t``'s columns (qualified by ``prefix``)."""
    cols = list(t.types)
    col = data.draw(st.sampled_from(["k", "k", *t.order, *cols]))
    typ = t.types[col]
    ref = prefix + col
    kinds = ["=", "<", "<=", ">", ">=", "<>", "between", "in", "not in", "is null",
             "is not null", "distinct"]
    if depth < 2:
        kinds += ["and", "and", "or", "not"]
    kind = data.draw(st.sampled_from(kinds))
    if kind in ("and", "or"):
        return (f"({condition(data, t, depth + 1, prefix)} {kind.upper()} "
                f"{condition(data, t, depth + 1, prefix)})")
    if kind == "not":
        return f"NOT ({condition(data, t, depth + 1, prefix)})"
    if kind == "between":
        word = data.draw(st.sampled_from(["BETWEEN", "NOT BETWEEN"]))
        return f"{ref} {word} {constant(data, typ)} AND {constant(data, typ)}"
    if kind in ("in", "not in"):
        n = data.draw(st.integers(1, 4))
        return f"{ref} {kind.upper()} ({', '.join(constant(data, typ) for _ in range(n))})"
    if kind in ("is null", "is not null"):
        return f"{ref} {kind.upper()}"
    if kind == "distinct":
        word = data.draw(st.sampled_from(["IS DISTINCT FROM", "IS NOT DISTINCT FROM"]))
        return f"{ref} {word} {constant(data, typ)}"
    c = constant(data, typ)
    return f"{c} {kind} {ref}" if data.draw(st.booleans()) else f"{ref} {kind} {c}"


_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                     phases=list(Phase) if os.environ.get("CRYPTDISK_DIFF_SHRINK", "1") != "0"
                     else [Phase.explicit, Phase.generate],
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.function_scoped_fixture])


def _history(data: Any, env: Env, t: Table) -> None:
    """Maybe OPTIMIZE, DELETE or UPDATE the table (the same rows changed in DuckDB)."""
    for _ in range(data.draw(st.integers(0, 2))):
        what = data.draw(st.sampled_from(["optimize", "delete", "update", "insert"]))
        if what == "optimize":
            env.db.sql(f"OPTIMIZE TABLE {t.name}" + data.draw(st.sampled_from(["", " FINAL"])))
        elif what == "insert":
            row = st.tuples(*[_value(typ, True) for typ in t.types.values()])
            t.insert_sql(data.draw(st.lists(row, max_size=10)))
        else:
            col = data.draw(st.sampled_from([c for c in t.types if c not in t.order]))
            new = data.draw(_value(t.types[col], True))
            sql = (f"DELETE FROM {t.name} WHERE {condition(data, t)}" if what == "delete" else
                   f"UPDATE {t.name} SET {col} = {new} WHERE {condition(data, t)}")
            got, want = env.both(sql)
            if isinstance(want, Exception) or isinstance(got, Exception):
                assert isinstance(got, Exception) and isinstance(want, Exception), \
                    (sql, got, want)
            else:
                assert got == want, sql


# -- properties ---------------------------------------------------------------------------

@_SETTINGS
@given(spec=tables(), data=st.data())
def test_filters_aggregates_and_groups(env, spec, data):
    """WHERE with odd constants, NOT, OR and NULL; count, min and max (from the catalog
    and from the parts), count(DISTINCT) of every column, GROUP BY."""
    t = build(env, spec)
    try:
        _history(data, env, t)
        n = t.name
        for _ in range(6):
            cols = data.draw(st.sampled_from(["*", "k", "k, s", "f, i, k", "d, b, m"]))
            where = f" WHERE {condition(data, t)}"
            col = data.draw(st.sampled_from(list(t.types)))
            other = data.draw(st.sampled_from(list(t.types)))
            maybe = where if data.draw(st.booleans()) else ""
            sql, how = data.draw(st.sampled_from([
                (f"SELECT {cols} FROM {n}{where}", "bag"),
                (f"SELECT count(*) FROM {n}{maybe}", "bag"),
                (f"SELECT min(k), max(k) FROM {n}{maybe}", "loose"),
                (f"SELECT max(k) AS hi FROM {n}", "loose"),
                (f"SELECT count(*), count({col}), min({col}), max({col}) FROM {n}{maybe}",
                 "loose"),
                (f"SELECT count(DISTINCT {col}) FROM {n}", "bag"),
                (f"SELECT count(DISTINCT {col}) AS x FROM {n}{maybe}", "bag"),
                (f"SELECT {col}, count(*), min({other}), max({other}) FROM {n}{maybe} "
                 f"GROUP BY {col}", "loose"),
                (f"SELECT count(*) FROM {n} WHERE {col} IN (SELECT {col} FROM {n}{maybe})",
                 "bag"),
                # a subquery passing renamed columns on: its WHERE reaches the table
                (f"SELECT * FROM (SELECT k AS kk, * EXCLUDE (k) FROM {n}) AS x"
                 + re.sub(r"\bk\b", "kk", where), "bag"),
                (f"SELECT * FROM (SELECT * FROM {n}{maybe}) AS x(a, b, c){where}", "bag"),
            ]))
            agree(env, sql, how)
    finally:
        t.drop()


@_SETTINGS
@given(spec=tables(), data=st.data())
def test_order_by_limit_offset(env, spec, data):
    """ORDER BY ... [DESC] [NULLS FIRST|LAST] LIMIT n [OFFSET m], selecting the ORDER BY's
    columns (ties cannot differ) or ordered by every column; LIMIT without ORDER BY (the
    count and that each row is one of the table's)."""
    t = build(env, spec)
    try:
        _history(data, env, t)
        n = t.name
        for _ in range(5):
            limit = data.draw(st.sampled_from([0, 1, 2, 3, 5, 16, 17, 40, 1000]))
            tail = f" LIMIT {limit}"
            if data.draw(st.booleans()):
                tail += f" OFFSET {data.draw(st.sampled_from([0, 1, 3, 15, 16, 33, 500]))}"
            where = f" WHERE {condition(data, t)}" if data.draw(st.integers(0, 2)) == 0 \
                else ""
            shape = data.draw(st.integers(0, 5))
            if shape <= 1:  # no ORDER BY; or every column by one (rows may tie)
                cols = data.draw(st.sampled_from(["*", "k", "s, k", "f"]))
                sql = f"SELECT {cols} FROM {n}{where}{tail}"
                if shape == 1:
                    by = data.draw(st.sampled_from(list(t.types)))
                    cols = f"{by}, *"
                    term = by + data.draw(st.sampled_from(["", " DESC"])) + \
                        data.draw(st.sampled_from(["", " NULLS FIRST", " NULLS LAST"]))
                    sql = f"SELECT {cols} FROM {n}{where} ORDER BY {term}{tail}"
                got, want = env.both(sql)
                _, every = env.both(f"SELECT {cols} FROM {n}{where}")
                if isinstance(want, Exception):
                    assert isinstance(got, Exception), (sql, got)
                    continue
                assert not isinstance(got, Exception), (sql, got)
                assert len(got) == len(want), sql
                if shape == 1:  # the ORDER BY column's values in order
                    assert _rows([r[:1] for r in got], False) == \
                        _rows([r[:1] for r in want], False), sql
                assert not collections.Counter(_rows(got, True)) - \
                    collections.Counter(_rows(every, True)), sql
                continue
            keys = data.draw(st.lists(st.sampled_from(list(t.types)), min_size=1, max_size=3,
                                      unique=True))
            if t.order and data.draw(st.booleans()):
                keys = t.order[:data.draw(st.integers(1, len(t.order)))]
            if data.draw(st.booleans()):
                keys += [c for c in t.types if c not in keys]
            terms = [k + data.draw(st.sampled_from(["", " DESC", " ASC"]))
                     + data.draw(st.sampled_from(["", " NULLS FIRST", " NULLS LAST"]))
                     for k in keys]
            sql = f"SELECT {', '.join(keys)} FROM {n}{where} ORDER BY {', '.join(terms)}{tail}"
            agree(env, sql, "ordered", runs=3)
    finally:
        t.drop()


@_SETTINGS
@given(pair=st.sampled_from(_KEYS).flatmap(lambda k: st.tuples(tables(k), tables(k))),
       data=st.data())
def test_joins_and_parameters(env, pair, data):
    """An encrypted and a plain table joined (inner, outer, comma) on columns of one type
    (the same key type: a comparison that casts values as it runs, such as VARCHAR with
    DOUBLE, fails or not by the plan DuckDB picks), conditions on either; PREPARE/EXECUTE
    and ``?`` parameters."""
    spec, other = pair
    spec = dict(spec, plain=False)
    other = dict(other, plain=True, rows=other["rows"][:20])
    a, b = build(env, spec), build(env, other)
    try:
        _history(data, env, a)
        for _ in range(4):
            on = data.draw(st.sampled_from(["a.k = b.k", "a.i = b.i", "a.s = b.s",
                                            "a.k = b.k AND a.s = b.s", "a.d = b.d",
                                            "a.f = b.f", "a.m = b.m", "a.r = b.r"]))
            join = data.draw(st.sampled_from(["JOIN", "LEFT JOIN", "RIGHT JOIN",
                                              "FULL JOIN"]))
            where = []
            for _ in range(data.draw(st.integers(0, 2))):
                side = data.draw(st.sampled_from([(a, "a."), (b, "b.")]))
                where.append(condition(data, side[0], 1, side[1]))
            w = f" WHERE {' AND '.join(where)}" if where else ""
            if data.draw(st.integers(0, 3)) == 0:
                sql = f"SELECT count(*), min(a.k), max(b.s) FROM {a.name} a, {b.name} b " \
                      f"WHERE {on}" + (f" AND {' AND '.join(where)}" if where else "")
            else:
                sql = f"SELECT a.k, a.s, b.i, b.f FROM {a.name} a {join} {b.name} b ON {on}{w}"
            agree(env, sql, "bag")
        for _ in range(3):
            col = data.draw(st.sampled_from(list(a.types)))
            op = data.draw(st.sampled_from(["=", "<", ">=", "<>"]))
            arg = constant(data, a.types[col])
            cols = data.draw(st.sampled_from(["*", "k, s", "count(*)"]))
            prepared = f"SELECT {cols} FROM {a.name} WHERE {col} {op} $1"
            for run in (env.db.sql, env.ref.execute):
                run(f"PREPARE diffq_p AS {prepared}")
            try:
                agree(env, f"EXECUTE diffq_p({arg})", "bag")
            finally:
                for run in (env.db.sql, env.ref.execute):
                    run("DEALLOCATE diffq_p")
            try:  # the constant's Python value, as DuckDB gives it, as a ? parameter
                value = env.ref.execute(f"SELECT {arg}").fetchone()[0]
            except duckdb.Error:
                continue
            agree(env, f"SELECT {cols} FROM {a.name} WHERE {col} {op} ?", "bag", [value])
    finally:
        a.drop()
        b.drop()


# -- what the properties found, as plain tests ---------------------------------------------

@pytest.mark.parametrize("plain", [False, True])
def test_a_real_column_compared_with_a_constant_rounded_to_real(db, monkeypatch, plain):
    """DuckDB compares a REAL column with a numeric constant rounded to REAL (``r = 0.1``
    holds for the REAL 0.1, which is 0.10000000149..., and ``r = 16777217`` for 16777216):
    the key range, the row groups' statistics and the granule bounds skipped those rows
    (their slack was a DOUBLE's), in a query, through a join and in a DELETE."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 4)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 16)
    ref = duckdb.connect()
    policy = " SETTINGS storage_policy = 'plain'" if plain else ""
    rows = ", ".join(f"({v}, {v})" for v in ["0.1", "0.2", "16777216", "1.5", "-0.1",
                                              "3.4e38"] * 6)
    for run, tail in ((db.sql, f" ORDER BY k{policy}"), (ref.execute, "")):
        run("CREATE TABLE t (k REAL, r REAL)" + tail)
        run(f"INSERT INTO t VALUES {rows}")
        run("CREATE TABLE u (k REAL)" + tail)
        run("INSERT INTO u VALUES (0.1), (16777216)")
    queries = ["SELECT count(*) FROM t WHERE k = 0.1", "SELECT count(*) FROM t WHERE r = 0.1",
               "SELECT count(*) FROM t WHERE k = 16777217", "SELECT count(*) FROM t WHERE "
               "r <= 0.1 AND r > -0.1", "SELECT count(*) FROM t WHERE k IN (0.2, 1.5)",
               "SELECT count(*) FROM t WHERE r BETWEEN 0.2 AND 0.2",
               "SELECT count(*) FROM t JOIN u ON t.k = u.k WHERE u.k <= 0.1",
               "SELECT count(*) FROM t JOIN u ON t.k = u.k WHERE u.k = 0.1"]
    for sql in queries:
        want = ref.execute(sql).fetchall()
        assert want != [(0,)], sql  # (rows match)
        for _ in range(2):
            assert db.query(sql) == want, sql
    assert db.query("DELETE FROM t WHERE k = 0.1") == ref.execute(
        "DELETE FROM t WHERE k = 0.1").fetchall() == [(6,)]
    assert db.query("SELECT count(*) FROM t WHERE k < 0.15") == [(6,)]

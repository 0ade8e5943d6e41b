"""Query parameters (db/_params.py) through Database.execute / sql / query / executemany
and Reader: every value type, every statement kind, hostile strings, clear errors."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import uuid

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import python_rows
from cryptdisk.db._params import bind, sql_literal
from cryptdisk.errors import DatabaseError

HOSTILE = [
    "'", "''", "'; DROP TABLE t; --", "\\'; DROP TABLE t; --", "\\", "a\\nb", "x' OR '1'='1",
    "$$; DROP TABLE t; $$", "*/ DROP TABLE t; /*", '"; DROP TABLE t; --', "é😀\u202e",
    "a\0b", "?", "$1", "E'\\''", "\n'\n",
]
TZ = dt.timezone(dt.timedelta(hours=5, minutes=30))
VALUES = [
    0, -1, 2 ** 31, -2 ** 63, 2 ** 63, 2 ** 64, -2 ** 127, 2 ** 128 - 1, 1.5, -0.0,
    float("nan"), float("inf"), -float("inf"), 5e-324, decimal.Decimal("1.23"),
    decimal.Decimal("-0.001"), decimal.Decimal("1E+2"), decimal.Decimal("1E+50"),
    decimal.Decimal("NaN"), *HOSTILE, b"", b"\x00\xff'\\", True, False, None,
    dt.date(1, 1, 1), dt.date(9999, 12, 31), dt.datetime(2020, 1, 2, 3, 4, 5, 6),
    dt.datetime(2020, 1, 2, 3, 4, 5, 6, tzinfo=TZ), dt.time(23, 59, 59, 999999),
    dt.time(1, 2, 3, tzinfo=TZ), dt.timedelta(days=-1, seconds=3, microseconds=7),
    uuid.UUID(int=2 ** 128 - 1), [1, 2], [], [None], [["a"], ["b", None]],
    {"a": 1, "it's": "x"}, (1, 2), bytearray(b"ab"),
]


def _same(a, b) -> bool:
    """Equal values, NaN equal to NaN, -0.0 not equal to 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a)
                                                      == math.copysign(1, b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_literal_is_what_duckdb_binds(value):
    """Each literal is the value, of the type, that DuckDB's own binding of the Python
    value as a parameter gives."""
    con = duckdb.connect()
    literal = sql_literal(value)
    mine = con.execute(f"SELECT ({literal}), typeof(({literal}))").fetchall()
    theirs = con.execute("SELECT ?, typeof(?)", [value, value]).fetchall()
    assert _same(mine, theirs), (literal, mine, theirs)


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_parameter_comes_back_from_a_select(db, value):
    """The rows DuckDB's own fetchall gives (a HUGEINT as an int, not a Decimal)."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")  # (the database's)
    theirs = con.execute("SELECT ?", [value]).fetchall()
    assert _same(db.query("SELECT ?", [value]), theirs)


def test_placeholders_in_strings_names_and_comments_are_not_parameters():
    sql = "SELECT ?, '?', $$?$$, $t$ $1 $t$, \"?\", E'\\'?', `?`, ? -- ?\n /* ? /* ? */ */ FROM x"
    assert bind(sql, [1, "'"]) == ("SELECT (1), '?', $$?$$, $t$ $1 $t$, \"?\", E'\\'?', `?`, "
                                   "('''') -- ?\n /* ? /* ? */ */ FROM x")
    assert bind("SELECT ?1, ?2, ?1", ["a", "b"]) == "SELECT ('a'), ('b'), ('a')"
    assert bind("SELECT $a, $B, a$b", {"A": "x", "b": 2}) == "SELECT ('x'), (2), a$b"
    # a literal never joins the text around it: E before it, a string or a minus
    assert bind("SELECT 1-?", [-5]) == "SELECT 1-(-5)"
    assert duckdb.execute(bind("SELECT 1-?", [-5])).fetchall() == [(6,)]


def _table(db):
    db.execute("CREATE TABLE t (k BIGINT, s VARCHAR, b BLOB) ORDER BY k")


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_strings_stay_values_in_every_statement_kind(db, hostile):
    _table(db)
    db.execute("INSERT INTO t VALUES (?, ?, ?)", [1, hostile, hostile.encode()])
    db.execute("INSERT INTO t SELECT ?, ?, ?", [2, hostile, None])
    assert db.query("SELECT k, s, b FROM t WHERE s = ? ORDER BY k", [hostile]) == [
        (1, hostile, hostile.encode()), (2, hostile, None)]
    db.execute("UPDATE t SET s = ? || ? WHERE k = ?", [hostile, hostile, 2])
    assert db.query("SELECT s FROM t WHERE k = $1", [2]) == [(hostile * 2,)]
    db.execute("CREATE TABLE u AS SELECT ? AS s, $$?$$ AS q", [hostile])
    assert db.query("FROM u") == [(hostile, "?")]
    db.execute("DELETE FROM t WHERE s = ?", [hostile])
    assert db.query("SELECT k FROM t") == [(2,)]
    assert sorted(db.catalog.tables) == ["t", "u"]  # nothing dropped


def test_numbered_named_and_question_mark_parameters(db):
    _table(db)
    db.execute("INSERT INTO t VALUES ($1, $2, NULL), ($3, $2, NULL)", [1, "a", 2])
    db.execute("INSERT INTO t (s, k) VALUES ($s, $K)", {"k": 3, "S": "b"})
    db.execute("INSERT INTO t VALUES (?2, ?1, NULL)", ["c", 4])
    assert db.query("SELECT k, s FROM t ORDER BY k") == [(1, "a"), (2, "a"), (3, "b"), (4, "c")]
    assert db.query("SELECT count(*) FROM t WHERE s = $s OR k = $k", {"s": "a", "k": 4}) == [(3,)]
    assert db.sql("SELECT ? + ? AS n", (1, 2)).to_pylist() == [{"n": 3}]


def test_a_key_lookup_with_a_parameter_skips_parts_as_its_literal_does(db):
    _table(db)
    for start in (0, 100, 200):
        db.execute(f"INSERT INTO t SELECT range, 'x', NULL FROM range({start}, {start + 100})")
    assert db.query("SELECT s FROM t WHERE k = ?", [150]) == [("x",)]
    bound = db.last_scans["t"]
    assert db.query("SELECT s FROM t WHERE k = 150") == [("x",)]
    assert bound == db.last_scans["t"] and bound["parts_skipped"] == 2


@pytest.mark.parametrize(("sql", "parameters", "error"), [
    ("SELECT ?", [1, 2], "has 1 parameter and 2 were given"),
    ("SELECT ?, ?", [1], "has 2 parameters and 1 was given"),
    ("SELECT 1", [1], "has 0 parameters and 1 was given"),
    ("SELECT $1, ?", [1, 2], "mixes them"),
    ("SELECT $1, $3", [1, 2, 3], "none uses $2"),
    ("SELECT $2", [1, 2], "none uses $1"),
    ("SELECT $0", [1], "numbered from $1"),
    ("SELECT $a", [1], "pass a mapping"),
    ("SELECT ?", {"a": 1}, "need $name placeholders"),
    ("SELECT $a", {"b": 1}, "no value given for parameter $a"),
    ("SELECT $a", {"a": 1, "b": 2}, "no parameter $b"),
    ("SELECT $a", {"a": 1, "A": 2}, "given twice"),
    ("SELECT ?", "x", "not str"),
    ("SELECT ?", 5, "not int"),
    ("SELECT ?", [object()], "type object cannot be bound"),
    ("SELECT ?", [2 ** 128], "does not fit in 128 bits"),
    ("SELECT ?", ["\ud800"], "not valid Unicode"),
    ("SELECT ?", [{"a": object()}], "type object cannot be bound"),
    ("SELECT 1; SELECT ?", [1], "holds 2"),
])
def test_a_wrong_parameter_is_a_clear_error(db, sql, parameters, error):
    with pytest.raises(DatabaseError, match=None) as info:
        db.sql(sql, parameters)
    assert error in str(info.value)
    if "holds" not in error:
        with pytest.raises(DatabaseError):
            db.execute(sql, parameters)


def _parts(db, table="t"):
    return db.query('SELECT count(*) FROM system.parts WHERE "table" = ?', [table])[0][0]


def test_executemany_inserts_every_set_as_one_insert(db):
    _table(db)
    rows = [(i, f"it's {i}", bytes([i % 256])) for i in range(3000)]
    db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    assert _parts(db) == 1
    assert db.query("SELECT * FROM t ORDER BY k") == rows
    db.executemany("INSERT INTO t (s, k) VALUES ($s, $k), ($s, $k + 1)",
                   [{"k": 5000, "s": "a"}, {"k": 6000, "s": "b"}])
    assert _parts(db) == 2
    assert db.query("SELECT k, s FROM t WHERE k >= 5000 ORDER BY k") == [
        (5000, "a"), (5001, "a"), (6000, "b"), (6001, "b")]


def test_executemany_computes_each_row_as_the_statement_writes_it(db):
    """The sets' values go through the row's expressions, a numbered one each time it is
    named; values that Arrow cannot hold as one column (a UUID, a list, mixed types) are
    written as literals, still one insert."""
    _table(db)
    db.executemany("INSERT INTO t VALUES ($1, upper($2) || $1::VARCHAR, NULL)",
                   [(1, "a"), (2, "b")])
    db.executemany("INSERT INTO t (k, s) VALUES (?, ?)",
                   [(3, uuid.UUID(int=3)), (4.0, [1, 2]), (5, None)])
    assert _parts(db) == 2
    assert db.query("SELECT k, s FROM t ORDER BY k") == [
        (1, "A1"), (2, "B2"), (3, str(uuid.UUID(int=3))), (4, "[1, 2]"), (5, None)]


def test_executemany_takes_default_in_its_row(db):
    db.execute("CREATE TABLE d (k BIGINT NOT NULL, s VARCHAR DEFAULT 'none')")
    db.executemany("INSERT INTO d VALUES (?, DEFAULT)", [(1,), (2,)])
    db.executemany("INSERT INTO d VALUES (?, 'default')", [(3,)])
    assert db.query("SELECT * FROM d ORDER BY k") == [(1, "none"), (2, "none"), (3, "default")]
    with pytest.raises(DatabaseError):
        db.executemany("INSERT INTO d VALUES (?, ?)", [(4, "x"), (None, "y")])
    assert db.query("SELECT count(*) FROM d") == [(3,)]


def test_executemany_stores_aware_datetimes_as_execute_does(db):
    """A zone whose offset is finer than a second, and sets in different zones: the same
    instants as one execute per set (Arrow dropped the 1 us offset: 00:00 for 23:59:59.999999)."""
    db.execute("CREATE TABLE z (k BIGINT, ts TIMESTAMPTZ, naive TIMESTAMP) ORDER BY k")
    fine = dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(microseconds=1)))
    east = dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    db.executemany("INSERT INTO z VALUES (?, ?, ?)", [(1, fine, fine), (2, east, east)])
    for k, v in ((3, fine), (4, east)):
        db.execute("INSERT INTO z VALUES (?, ?, ?)", [k, v, v])
    rows = db.query("SELECT k, ts, naive FROM z ORDER BY k")
    assert rows[0][1:] == rows[2][1:] and rows[1][1:] == rows[3][1:]
    assert rows[0][1] == fine and rows[1][1] == east
    assert rows[0][2] == dt.datetime(1999, 12, 31, 23, 59, 59, 999999)


def test_executemany_inserts_nothing_when_one_set_fails(db):
    _table(db)
    with pytest.raises(DatabaseError):
        db.executemany("INSERT INTO t (k) VALUES (?)", [[1], ["not a number"]])
    with pytest.raises(DatabaseError, match="INSERT INTO t"):
        db.executemany("INSERT INTO t (k) VALUES (?)", [["1"], ["not a number"]])
    with pytest.raises(DatabaseError, match="has 1 parameter and 2 were given"):
        db.executemany("INSERT INTO t (k) VALUES (?)", [[1], [2, 3]])
    assert db.query("SELECT count(*) FROM t") == [(0,)]


def test_executemany_runs_other_statements_once_per_set(db):
    _table(db)
    db.execute("INSERT INTO t SELECT range, 'x', NULL FROM range(10)")
    db.executemany("DELETE FROM t WHERE k = ?", [[1], [2], [3]])
    db.executemany("UPDATE t SET s = $2 WHERE k = $1", [(4, "four"), (5, "five")])
    db.executemany("INSERT INTO t SELECT ?, ?, NULL", [(20, "a"), (21, "b")])
    db.executemany("INSERT INTO t VALUES (1, 'x', NULL)", [])  # no sets: nothing runs
    assert db.query("SELECT k, s FROM t WHERE s <> 'x' ORDER BY k") == [
        (4, "four"), (5, "five"), (20, "a"), (21, "b")]
    assert db.query("SELECT count(*) FROM t") == [(9,)]
    for bad in ("abc", 5, {"a": 1}, [1]):
        with pytest.raises(DatabaseError):
            db.executemany("INSERT INTO t (k) VALUES (?)", bad)


def test_bytes_that_do_not_convert_are_a_database_error(db):
    """DuckDB's message about bytes that are no UUID quotes them, and its Python module
    raises UnicodeDecodeError decoding it: a DatabaseError here."""
    db.execute("CREATE TABLE u (id UUID)")
    with pytest.raises(DatabaseError, match="not valid UTF-8"):
        db.execute("INSERT INTO u VALUES (?)", [b"\x80"])
    with pytest.raises(DatabaseError, match="not valid UTF-8"):
        db.execute("SELECT CAST(? AS UUID)", [b"\x80"])
    r = db.reader()
    try:
        with pytest.raises(DatabaseError, match="not valid UTF-8"):
            r.execute("SELECT CAST(? AS UUID)", [b"\x80"])
    finally:
        r.close()
    assert db.query("SELECT count(*) FROM u") == [(0,)]


def test_a_reader_takes_parameters(db):
    _table(db)
    db.execute("INSERT INTO t VALUES (?, ?, NULL)", [1, "a'b"])
    r = db.reader()
    try:
        assert r.query("SELECT s FROM t WHERE k = ?", [1]) == [("a'b",)]
        assert r.sql("SELECT k FROM t WHERE s = $s", {"s": "a'b"}).to_pylist() == [{"k": 1}]
        with pytest.raises(DatabaseError, match="has 1 parameter and 0 were given"):
            r.execute("SELECT ?", [])
        with pytest.raises(DatabaseError, match="a reader runs queries"):
            r.execute("DELETE FROM t WHERE k = ?", [1])
    finally:
        r.close()


# -- the property: a value bound as a parameter is stored as DuckDB stores it ---------

COLUMNS = {
    "i": ("BIGINT", st.integers(-2 ** 63, 2 ** 63 - 1)),
    # (a part holds a HUGEINT as DECIMAL(38,0): more digits fail the insert, see test_db_rows)
    "h": ("HUGEINT", st.integers(-10 ** 38 + 1, 10 ** 38 - 1)),
    "f": ("DOUBLE", st.floats()),
    "r": ("REAL", st.floats(width=32)),
    "d": ("DECIMAL(18,4)", st.decimals(min_value=-10 ** 13, max_value=10 ** 13,
                                       allow_nan=False)),
    "s": ("VARCHAR", st.text()),
    "b": ("BLOB", st.binary()),
    "t": ("BOOLEAN", st.booleans()),
    "dd": ("DATE", st.dates()),
    "ts": ("TIMESTAMP", st.datetimes()),
    "tz": ("TIMESTAMPTZ", st.datetimes(
        min_value=dt.datetime(1000, 1, 1), max_value=dt.datetime(9000, 1, 1),
        timezones=st.builds(dt.timezone, st.timedeltas(min_value=dt.timedelta(hours=-23),
                                                      max_value=dt.timedelta(hours=23))))),
    "tm": ("TIME", st.times()),
    "u": ("UUID", st.uuids()),
    "l": ("INTEGER[]", st.lists(st.none() | st.integers(-2 ** 31, 2 ** 31 - 1), max_size=4)),
    "m": ("STRUCT(a INTEGER, b VARCHAR)", st.fixed_dictionaries(
        {"a": st.none() | st.integers(-2 ** 31, 2 ** 31 - 1), "b": st.none() | st.text()})),
    # a value of another type, cast by the INSERT as DuckDB casts it
    "x": ("DECIMAL(9,2)", st.floats(-1e6, 1e6) | st.integers(-10 ** 6, 10 ** 6)
          | st.decimals(-10 ** 6, 10 ** 6, allow_nan=False)),
}
ROW = st.fixed_dictionaries({c: st.none() | strategy for c, (_t, strategy) in COLUMNS.items()})


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    """The same table in cryptdisk and in DuckDB itself."""
    ddl = "CREATE TABLE p (id BIGINT, " + ", ".join(
        f"{c} {t}" for c, (t, _s) in COLUMNS.items()) + ")"
    db = cryptdisk.connect(tmp_path_factory.mktemp("params") / "db")
    db.execute(ddl + " ORDER BY id")
    con = duckdb.connect()
    con.execute(ddl)
    yield db, con
    db.close()
    con.close()


_ids = iter(range(10 ** 9))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=ROW)
def test_a_parameter_round_trips_as_duckdb_binds_it(both, row):
    db, con = both
    key = next(_ids)
    names = ", ".join(row)
    marks = ", ".join("?" for _ in row)
    values = [key, *row.values()]
    insert = f"INSERT INTO p (id, {names}) VALUES (?, {marks})"
    select = f"SELECT {names} FROM p WHERE id = ?"
    try:
        con.execute(insert, values)
    except duckdb.Error:
        with pytest.raises(DatabaseError):
            db.execute(insert, values)
        return
    db.execute(insert, values)
    mine = db.query(select, [key])
    theirs = python_rows(con.sql(select, params=[key]).to_arrow_table())  # (converted alike)
    assert _same(mine, theirs), (mine, theirs)


@st.composite
def _sets(draw):
    """Rows of a few of the columns (so that most draws make Arrow columns, and some
    literals: a UUID, a list or a struct among them)."""
    names = draw(st.lists(st.sampled_from([c for c in COLUMNS if c != "x"]), min_size=1,
                          max_size=4, unique=True))
    return draw(st.lists(st.fixed_dictionaries(
        {c: st.none() | COLUMNS[c][1] for c in names}), min_size=1, max_size=5))


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_sets())
def test_executemany_stores_what_duckdb_stores_for_each_set(both, rows):
    """Each set cast as DuckDB casts its own parameters, whether the sets make Arrow
    columns or literals ("x", whose values mix types, is left out: there the rows of one
    VALUES take a common type first)."""
    db, con = both
    key = next(_ids)
    columns = list(rows[0])
    names = ", ".join(columns)
    marks = ", ".join("?" for _ in columns)
    sets = [[key, *(row[c] for c in columns)] for row in rows]
    insert = f"INSERT INTO p (id, {names}) VALUES (?, {marks})"
    select = f"SELECT {names} FROM p WHERE id = ? ORDER BY ALL"
    try:
        for one in sets:  # (not con.executemany, which decodes a BLOB after a NULL as text)
            con.execute(insert, one)
    except duckdb.Error:
        con.execute("DELETE FROM p WHERE id = ?", [key])
        with pytest.raises(DatabaseError):
            db.executemany(insert, sets)
        return
    db.executemany(insert, sets)
    mine = db.query(select, [key])
    theirs = python_rows(con.sql(select, params=[key]).to_arrow_table())
    assert _same(mine, theirs), (mine, theirs)

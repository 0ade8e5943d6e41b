"""Python rows of a query's result (``Database.query``, ``Reader.query``, ``cryptdisk
sql``): every column kept, also those that share a name, and values Python's types hold
only as DuckDB converts them (infinite dates and timestamps), as DuckDB's ``fetchall``
gives them."""

import json
from decimal import Decimal

import duckdb
import pytest

from cryptdisk.db import python_rows
from cryptdisk.errors import DatabaseError

from .test_db_cli import run

_EDGES = ("SELECT 'infinity'::DATE, '-infinity'::DATE, 'infinity'::TIMESTAMP, "
          "'-infinity'::TIMESTAMP, TIMESTAMP '0001-01-01', 'infinity'::TIMESTAMPTZ, 1 AS x")


@pytest.mark.parametrize("sql", [
    "SELECT 1 AS a, 2 AS a, 'x' AS A",
    "SELECT * FROM t, t AS u ORDER BY t.k, u.k",
    "SELECT t.k, u.k, t.s, u.s FROM t JOIN t AS u ON t.k < u.k ORDER BY 1, 2",
    "SELECT * FROM t WHERE false",
    _EDGES,
    "SELECT d FROM t, (SELECT 'infinity'::DATE AS d UNION ALL SELECT NULL) ORDER BY k, d",
])
def test_query_rows_are_duckdbs(db, sql):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1, 'a'), (2, NULL), (3, '')")
    ref = duckdb.connect()
    ref.execute("CREATE TABLE t (k BIGINT, s VARCHAR)")
    ref.execute("INSERT INTO t VALUES (1, 'a'), (2, NULL), (3, '')")
    want = ref.execute(sql).fetchall()
    assert db.query(sql) == want
    reader = db.reader()
    try:
        assert reader.query(sql) == want
    finally:
        reader.close()
    table = db.sql(sql)
    assert python_rows(table) == want
    assert all(len(r) == table.num_columns for r in python_rows(table))


def test_cli_prints_every_column_and_infinite_dates(tmp_path):
    db = str(tmp_path / "db")
    csv_out = run("sql", db, "--create", "-q", "SELECT 1 AS a, 2 AS a, 3 AS b",
                  "--format", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    assert csv_out.stdout == "a,a,b\n1,2,3\n"
    table = run("sql", db, "-q", "SELECT 1 AS a, 2 AS a")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[2].split() == ["1", "|", "2"]
    edges = run("sql", db, "-q", _EDGES, "--format", "json")
    assert edges.returncode == 0 and "Traceback" not in edges.stderr, edges.stderr
    (row,) = json.loads(edges.stdout)
    assert list(row.values())[:3] == ["9999-12-31", "0001-01-01", "9999-12-31 23:59:59.999999"]


@pytest.mark.parametrize("key", ["DATE", "TIMESTAMP", "TIMESTAMPTZ"])
def test_infinite_dates_and_timestamps_are_stored_keyed_and_merged(db, key):
    """'infinity' and '-infinity' in an ORDER BY key and in other columns: the insert,
    OPTIMIZE and filtered queries answer as DuckDB does. pyarrow cannot make Python values
    of their statistics (a date past year 9999), which failed the insert and OPTIMIZE with
    an OverflowError."""
    ref = duckdb.connect()
    statements = [
        f"CREATE TABLE t (k {key}, d DATE, n INT) ORDER BY k",
        "INSERT INTO t VALUES ('infinity', '-infinity', 1), ('2024-01-01', 'infinity', 2),"
        " ('-infinity', '2024-01-01', 3), (NULL, NULL, 4)",
        f"INSERT INTO t SELECT ('2000-01-01'::{key}) + INTERVAL (i) DAY,"
        " DATE '2000-01-01' + i::INT, i + 10 FROM range(3000) r(i)",
        "INSERT INTO t VALUES ('infinity', 'infinity', 5)",
    ]
    for statement in statements:
        db.sql(statement)
        ref.execute(statement.replace(" ORDER BY k", ""))
    queries = [
        "SELECT n FROM t WHERE k > '3000-01-01' ORDER BY n",
        "SELECT n FROM t WHERE k < '1000-01-01' ORDER BY n",
        "SELECT n FROM t WHERE d > '3000-01-01' ORDER BY n",
        "SELECT n FROM t ORDER BY k DESC NULLS LAST, n LIMIT 3",
        "SELECT count(*), min(k)::VARCHAR, max(k)::VARCHAR, max(d)::VARCHAR FROM t",
    ]
    for q in queries:
        assert db.query(q) == ref.execute(q).fetchall(), q
    db.sql("OPTIMIZE TABLE t FINAL")
    assert db.query("SELECT parts FROM system.tables") == [(1,)]
    for q in queries:
        assert db.query(q) == ref.execute(q).fetchall(), q


#: a value of every DuckDB type (and nested ones) whose Python value pyarrow's conversion
#: of DuckDB's Arrow would change: each comes back from ``query`` as DuckDB's ``fetchall``
_TYPED = {
    "hugeint": "170141183460469231731687303715884105727::HUGEINT",
    "hugeint_min": "(-170141183460469231731687303715884105727::HUGEINT - 1)",
    "uhugeint": "340282366920938463463374607431768211455::UHUGEINT",
    "ubigint": "18446744073709551615::UBIGINT",
    "decimal": "-12.3400::DECIMAL(38,4)",
    "uuid": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::UUID",
    "interval": "INTERVAL '1 year 2 months 3 days 04:05:06.789'",
    "time": "'12:34:56.123456'::TIME",
    "timetz": "'12:34:56+02:30'::TIMETZ",
    "timestamp_ns": "'2024-01-02 03:04:05.123456789'::TIMESTAMP_NS",
    "timestamp_s": "'2024-01-02 03:04:05'::TIMESTAMP_S",
    "timestamp_ms": "'2024-01-02 03:04:05.123'::TIMESTAMP_MS",
    "timestamptz": "'2024-01-02 03:04:05+05'::TIMESTAMPTZ",
    "enum": "'b'::ENUM('a', 'b')",
    "union": "union_value(num := 2)::UNION(num INTEGER, str VARCHAR)",
    "map": "MAP {'a': 1, 'b': NULL}",
    "map_nested": "MAP {1: [INTERVAL '1 day'], 2: []}",
    "struct": "{'x': 1::HUGEINT, 'y': 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::UUID}",
    "list": "[1::HUGEINT, NULL]",
    "array": "[1, 2, 3]::INTEGER[3]",
    "bit": "'0101'::BIT",
    "bignum": "-123456789012345678901234567890123456789012::BIGNUM",
    "json": "'{\"a\": [1]}'::JSON",
    "blob": "'\\xAA\\x00'::BLOB",
    "variant": "[1, 2]::VARIANT",
    "null_hugeint": "NULL::HUGEINT",
}


@pytest.mark.parametrize("expr", _TYPED.values(), ids=_TYPED.keys())
@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata"])
def test_query_values_of_every_type_are_duckdbs_fetchall(db, expr, zone):
    """Computed by a query, and read from a table where the type can be stored (as the
    type ``DESCRIBE`` names: UUID as VARCHAR, HUGEINT as DECIMAL(38,0)), a value is what
    DuckDB's own fetchall gives, in the connection's ``TimeZone``; through a reader too."""
    ref = duckdb.connect()
    ref.execute(f"SET TimeZone = '{zone}'")
    db.execute(f"SET TimeZone = '{zone}'")
    sql = f"SELECT {expr} AS v, 1 AS v"
    want = ref.execute(sql).fetchall()
    assert db.query(sql) == want
    reader = db.reader()
    try:
        reader.configure(f"SET TimeZone = '{zone}'")
        assert reader.query(sql) == want
        assert reader.query(f"PREPARE p AS {sql}; EXECUTE p") == want
    finally:
        reader.close()
    assert db.query(f"PREPARE p AS {sql}; EXECUTE p") == want
    try:
        db.execute(f"CREATE TABLE t AS SELECT {expr} AS v")
    except DatabaseError:
        return  # (a type Parquet cannot store: see test_db_types)
    (stored,), = db.query("SELECT column_type FROM (DESCRIBE t)")
    try:
        want = ref.execute(f"SELECT CAST({expr} AS {stored})").fetchall()
    except duckdb.Error:  # (none such was stored: see test_a_uhugeint_...)
        pytest.fail(f"{expr} stored as {stored}, which cannot hold it")
    assert db.query("SELECT v FROM t") == want
    assert db.query("SELECT * FROM t WHERE v IS NOT DISTINCT FROM v") == want


@pytest.mark.parametrize("statement", [
    "INSERT INTO h (u) VALUES (340282366920938463463374607431768211455)",
    "INSERT INTO h (v) SELECT 170141183460469231731687303715884105727::HUGEINT",
    "INSERT INTO h (l) VALUES ([100000000000000000000000000000000000000::HUGEINT])",
    "UPDATE h SET u = 170141183460469231731687303715884105728::UHUGEINT",
    "CREATE TABLE c AS SELECT 340282366920938463463374607431768211455::UHUGEINT AS v",
])
def test_a_wide_integer_beyond_38_digits_is_refused_not_stored_wrapped(db, statement):
    """A HUGEINT or UHUGEINT column is a DECIMAL(38,0) in its parts: a value it cannot hold
    fails the statement (a UHUGEINT above 2^127 - 1 was stored as a negative number, a
    HUGEINT beyond 38 digits as one DuckDB then failed to read with an internal error)."""
    db.execute("CREATE TABLE h (v HUGEINT, u UHUGEINT, l HUGEINT[])")
    most = 10 ** 38 - 1
    db.execute(f"INSERT INTO h VALUES ({most}, {most}, [-{most}])")
    with pytest.raises(DatabaseError, match="DECIMAL\\(38,0\\)"):
        db.execute(statement)
    assert db.query("SELECT v, u, l, v::VARCHAR FROM h") == [(most, most, [-most], str(most))]
    assert "c" not in db.catalog.tables


def test_cli_prints_values_as_duckdb_gives_them(tmp_path):
    """``cryptdisk sql`` prints a BIT as its bits, a BIGNUM as its number, a TIMETZ with
    its offset, a UUID as text and a MAP as a JSON object (it printed DuckDB's internal
    bytes as hex for the first two, and dropped the offset)."""
    db = str(tmp_path / "db")
    sql = ("SELECT '0101'::BIT AS b, -12::BIGNUM AS n, '12:00:00+02'::TIMETZ AS z, "
           "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::UUID AS u, MAP {2: 'x'} AS m, "
           "[1, 2]::INTEGER[2] AS a")
    out = run("sql", db, "--create", "-q", sql, "--format", "json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [{"b": "0101", "n": "-12", "z": "12:00:00+02:00",
                                       "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
                                       "m": {"2": "x"}, "a": [1, 2]}]
    out = run("sql", db, "-q", sql, "--format", "csv")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == \
        '0101,-12,12:00:00+02:00,a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,"{""2"": ""x""}",' \
        '"[1, 2]"'


def test_db_insert_takes_python_ints_beyond_64_bits_as_duckdb_casts_them(db):
    """Rows and columns of Python ints beyond 64 bits: a HUGEINT column takes them (up to
    38 digits), a BIGINT one fails with DuckDB's conversion error, more digits with a
    DatabaseError naming the value (pyarrow's OverflowError came out as it was)."""
    db.execute("CREATE TABLE h (v HUGEINT, b BIGINT)")
    assert db.insert("h", {"v": [2 ** 70, None, -5]}) == 3
    assert db.insert("h", [{"v": -(10 ** 38 - 1), "b": 1}]) == 1
    for data in ({"b": [2 ** 64]}, [{"b": 2 ** 63}]):
        with pytest.raises(DatabaseError, match="Conversion Error"):
            db.insert("h", data)
    with pytest.raises(DatabaseError, match="more than 38 digits"):
        db.insert("h", {"v": [10 ** 38]})
    with pytest.raises(DatabaseError, match="beyond 64 bits"):
        db.insert("h", {"v": [2 ** 70, "x"]})
    assert db.query("SELECT v, b FROM h ORDER BY v NULLS LAST") == [
        (-(10 ** 38 - 1), 1), (-5, None), (2 ** 70, None), (None, None)]


_UMAX = 340282366920938463463374607431768211455  # 2^128 - 1: DuckDB's Arrow export gives -1


def test_arrow_results_hold_a_uhugeint_as_its_value(db):
    """``sql``/``execute`` (the Arrow table) and a reader's ``execute``: a UHUGEINT above
    2^127 - 1, alone, in a list or in a struct, is its value (a DECIMAL(39,0)), not the
    negative number DuckDB's Arrow export wraps it to; a HUGEINT is left as it is."""
    db.execute("CREATE TABLE t (u UHUGEINT)")
    db.execute("INSERT INTO t VALUES (5)")
    q = (f"SELECT {_UMAX}::UHUGEINT AS u, [{_UMAX}::UHUGEINT, NULL] AS l, "
         f"{{'a': {_UMAX}::UHUGEINT, 'b': 2::HUGEINT}} AS s, u AS c, 3::HUGEINT AS h FROM t")
    want = [{"u": Decimal(_UMAX), "l": [Decimal(_UMAX), None],
             "s": {"a": Decimal(_UMAX), "b": Decimal(2)}, "c": Decimal(5), "h": Decimal(3)}]
    assert db.sql(q).to_pylist() == want
    assert db.execute("SELECT ?::UHUGEINT AS u", [_UMAX]).to_pylist() == [{"u": Decimal(_UMAX)}]
    reader = db.reader()
    try:
        assert reader.execute(q).to_pylist() == want
    finally:
        reader.close()
    assert db.query(q) == [(_UMAX, [_UMAX, None], {"a": _UMAX, "b": 2}, Decimal(5), 3)]


def test_arrow_results_hold_a_uhugeint_in_a_map_as_its_value(db):
    """A MAP's UHUGEINT keys and values (a MAP alone, in a struct or a list, or holding a
    list or struct) came out of ``sql``/``execute`` as DuckDB's Arrow export wrapped them:
    2^128 - 1 as -1 (has_wide and exact_table left MAP types alone). Now they are their
    values (DECIMAL(39,0)), as ``query`` and DuckDB's fetchall give them, a NULL map and
    a map's NULL value kept; a HUGEINT's map is left as it is."""
    db.execute("CREATE TABLE t (k INTEGER, m MAP(VARCHAR, UHUGEINT))")
    db.execute("INSERT INTO t VALUES (1, MAP {'a': 7}), (2, NULL), (3, MAP {'b': NULL})")
    u = f"{_UMAX}::UHUGEINT"
    q = (f"SELECT MAP {{'a': {u}, 'b': 2::UHUGEINT}} AS m, MAP {{{u}: 1}} AS k, "
         f"{{'s': MAP {{'x': {u}}}}} AS s, [MAP {{'x': {u}}}, NULL] AS l, "
         f"MAP {{'x': [{u}, NULL]}} AS ml, MAP {{'x': {{'f': {u}}}}} AS ms, "
         f"MAP {{'h': -2::HUGEINT}} AS h")
    want = [{"m": [("a", Decimal(_UMAX)), ("b", Decimal(2))], "k": [(Decimal(_UMAX), 1)],
             "s": {"s": [("x", Decimal(_UMAX))]}, "l": [[("x", Decimal(_UMAX))], None],
             "ml": [("x", [Decimal(_UMAX), None])], "ms": [("x", {"f": Decimal(_UMAX)})],
             "h": [("h", Decimal(-2))]}]
    assert db.sql(q).to_pylist() == want
    reader = db.reader()
    try:
        assert reader.execute(q).to_pylist() == want
    finally:
        reader.close()
    import duckdb

    assert db.query(q) == duckdb.sql(q).fetchall()
    rows = db.sql(f"SELECT k, m FROM (VALUES (1, MAP {{'a': {u}}}), (2, NULL), "
                  "(3, MAP {'b': NULL::UHUGEINT})) v(k, m) ORDER BY k").to_pylist()
    assert rows == [{"k": 1, "m": [("a", Decimal(_UMAX))]}, {"k": 2, "m": None},
                    {"k": 3, "m": [("b", None)]}]
    assert db.sql("SELECT m FROM t ORDER BY k").to_pylist() == [  # (stored: DECIMAL(38,0))
        {"m": [("a", Decimal(7))]}, {"m": None}, {"m": [("b", None)]}]

"""Values keep their PostgreSQL types through the server: numeric scale and precision on
SQLite tables, ..."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import psycopg
import pytest

from tests.server.conftest import USER


def test_sqlite_numeric_keeps_its_declared_scale(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (a NUMERIC(10,3), b DECIMAL(8, 2), c NUMERIC(5), d NUMERIC)")
        conn.execute("INSERT INTO n VALUES (1.5, 0.125, 4.6, 3.5)")
        conn.execute("INSERT INTO n VALUES (%s, %s, %s, %s)",
                     (Decimal("1.234"), Decimal("0.1"), 7, Decimal("2.25")))
        rows = conn.execute("SELECT a, b, c, d FROM n ORDER BY a").fetchall()
        assert [[str(v) for v in r] for r in rows] == [
            ["1.234", "0.10", "7", "2.25"], ["1.500", "0.13", "5", "3.5"]]


@pytest.mark.parametrize("value", [Decimal("123456789012345.12345"), Decimal("NaN"),
                                   Decimal("12345678901234567890")])
def test_sqlite_refuses_a_numeric_parameter_it_would_change(start_server, sqlite_engine,
                                                            value) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INTEGER, b NUMERIC(25,5))")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("INSERT INTO n VALUES (1, %s)", (value,))
        assert info.value.sqlstate == "22003"
        assert "analytical engine" in str(info.value)
        assert conn.execute("SELECT count(*) FROM n").fetchone()[0] == 0
        conn.execute("INSERT INTO n VALUES (2, %s)", (Decimal("1234567.125"),))
        assert conn.execute("SELECT b FROM n").fetchone()[0] == Decimal("1234567.125")


@pytest.fixture(params=["analytical", "sqlite"])
def srv(request, start_server):
    return start_server(request.getfixturevalue(
        "analytical" if request.param == "analytical" else "sqlite_engine"))


@pytest.mark.parametrize("prepare", [False, True])
def test_a_parameter_column_is_named_as_postgresql_names_it(srv, prepare) -> None:
    """``SELECT $1`` is ``?column?`` (not the value, which DuckDB named it after: a
    parameter's value in every client's column names), ``$1::int`` ``int4``."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("SELECT %s, %s::int, %s AS x, 1 AS one, %s::varchar(5)",
                    ("secret", 6, 7, "v"), prepare=prepare)
        assert cur.fetchall() == [("secret", 6, 7, 1, "v")]
        assert [d.name for d in cur.description] == ["?column?", "int4", "x", "one", "varchar"]


#: 2^128 - 1: UHUGEINT's largest value, which DuckDB's Arrow export wraps to -1
UMAX = 340282366920938463463374607431768211455


def test_uhugeint_in_structs_and_lists_is_its_value(start_server, analytical) -> None:
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT {{'a': {UMAX}::UHUGEINT, 'b': 5::HUGEINT}}, [{UMAX}::UHUGEINT, NULL, 2], "
            f"[{{'x': [{UMAX}::UHUGEINT]}}], {UMAX}::UHUGEINT").fetchone()
        # (a list: a numeric[]; of structs: a text[] of their JSON)
        assert row == (f'{{"a": "{UMAX}", "b": "5"}}', [Decimal(UMAX), None, Decimal(2)],
                       [f'{{"x": ["{UMAX}"]}}'], Decimal(UMAX))
        rows = conn.execute(f"SELECT x FROM (VALUES ([1::UHUGEINT]), (NULL), "
                            f"([{UMAX}::UHUGEINT, 3])) v(x) ORDER BY x NULLS FIRST").fetchall()
        assert rows == [(None,), ([Decimal(1)],), ([Decimal(UMAX), Decimal(3)],)]


def test_uhugeint_in_a_map_is_its_value(start_server, analytical) -> None:
    """A MAP's UHUGEINT keys and values are sent as their values, as alone or in a list
    (the MAP's text was made of DuckDB's Arrow export, which wraps 2^128 - 1 to -1)."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT map([1, 2], [{UMAX}::UHUGEINT, 7]), "
            f"MAP {{{UMAX - 1}::UHUGEINT: 'x'}}, map([1], [5::UHUGEINT])").fetchone()
        assert row == (f"{{1={UMAX}, 2=7}}", f"{{{UMAX - 1}=x}}", "{1=5}")
        rows = conn.execute(f"SELECT m FROM (VALUES (NULL), (map(['a'], [{UMAX}::UHUGEINT])))"
                            " v(m) ORDER BY m NULLS FIRST").fetchall()
        assert rows == [(None,), (f"{{a={UMAX}}}",)]


def test_uhugeint_in_a_map_in_a_struct_or_list_is_its_value(start_server, analytical) -> None:
    """A MAP in a struct or a list, or holding a list or struct, with UHUGEINT keys or
    values: they are sent as their values (the MAP's text showed DuckDB's Arrow export of
    2^128 - 1, -1, where the MAP was not the column itself)."""
    srv = start_server(analytical)
    u = f"{UMAX}::UHUGEINT"
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT {{'s': MAP {{'x': {u}}}}}, [MAP {{{u}: 1}}, NULL], "
            f"MAP {{'l': [{u}, NULL]}}, MAP {{'f': {{'u': {u}}}}}").fetchone()
        assert all(str(UMAX) in v and "-1" not in v for v in row), row
        assert row[1] == f"[{{{UMAX}=1}}, NULL]"


def test_a_map_timestamptz_is_in_the_session_time_zone(start_server, analytical) -> None:
    """As in a list, a struct, or alone (DuckDB's text of the MAP was made in UTC)."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'America/New_York'")
        ts = "TIMESTAMPTZ '2024-01-01 12:00:00+00'"
        row = conn.execute(f"SELECT MAP {{'k': {ts}}}, {ts}::VARCHAR").fetchone()
        assert row == ("{k='2024-01-01 07:00:00-05'}", "2024-01-01 07:00:00-05")
        res = conn.pgconn.exec_(f"SELECT [{ts}]".encode())  # (a timestamptz[])
        assert res.get_value(0, 0) == b'{"2024-01-01 07:00:00-05"}' and res.ftype(0) == 1185


def test_sqlite_text_copy_refuses_a_numeric_it_would_change(start_server, sqlite_engine) -> None:
    """COPY's text of a number SQLite's NUMERIC affinity would store as a float of
    another value fails (22003), no row is stored; a TEXT column takes the same text."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INTEGER, b NUMERIC(25,5), s TEXT)")
        cur = conn.cursor()
        with pytest.raises(psycopg.Error) as info:
            with cur.copy("COPY n FROM STDIN") as copy:
                copy.write_row((1, "2.5", "a"))
                copy.write_row((2, "123456789012345.12345", "b"))
        assert info.value.sqlstate == "22003"
        with cur.copy("COPY n (s, b, id) FROM STDIN") as copy:
            copy.write_row(("123456789012345.12345", "1.25", 3))
        assert conn.execute("SELECT id, b, s FROM n").fetchall() == [
            (3, Decimal("1.25000"), "123456789012345.12345")]


@pytest.mark.parametrize("value", [Decimal("1234567890123456789"), Decimal("9007199254740993"),
                                   Decimal("-9223372036854775808"), Decimal("1.2E+17")])
def test_sqlite_stores_a_whole_numeric_parameter_as_its_integer(start_server, sqlite_engine,
                                                                 value) -> None:
    """A whole number in SQLite's 64-bit INTEGER range is held exactly (bound as that
    integer), into a NUMERIC and a BIGINT column alike: JDBC's setBigDecimal and psycopg's
    Decimal send ids and amounts in cents as numeric, and they were refused with 22003
    (no float holds them exactly)."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (a NUMERIC, b NUMERIC(20,2), c BIGINT)")
        conn.execute("INSERT INTO n VALUES (%s, %s, %s)", (value, value, value))
        assert conn.execute("SELECT a, b, c FROM n").fetchone() == (value, value, int(value))
        assert str(conn.execute("SELECT b FROM n").fetchone()[0]).endswith(".00")
        assert conn.execute("SELECT count(*) FROM n WHERE c = %s", (value,)).fetchone()[0] == 1


def test_sqlite_text_copy_of_a_whole_number_is_exact(start_server, sqlite_engine) -> None:
    """COPY's text of digits alone in INTEGER's range is stored as that integer (SQLite
    reads it so); the same number written with a decimal point is read by SQLite as a
    float first (1234567890123456789.0 stored 1234567890123456768): 22003, no row."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INTEGER, b NUMERIC(25,5))")
        cur = conn.cursor()
        with cur.copy("COPY n FROM STDIN") as copy:
            copy.write_row((1, "1234567890123456789"))
            copy.write_row((2, " -9223372036854775808"))
        with pytest.raises(psycopg.Error) as info:
            with cur.copy("COPY n FROM STDIN") as copy:
                copy.write_row((3, "1234567890123456789.0"))
        assert info.value.sqlstate == "22003"
        assert conn.execute("SELECT id, b FROM n ORDER BY id").fetchall() == [
            (1, Decimal("1234567890123456789")), (2, Decimal("-9223372036854775808"))]


@pytest.mark.parametrize("literal", ["123456789012345.12345", "9223372036854775808",
                                     "12345678901234567.0"])
def test_sqlite_refuses_a_number_literal_it_would_change(start_server, sqlite_engine,
                                                         literal) -> None:
    """SQLite reads such a literal as a float of another value (PostgreSQL: an exact
    numeric): the statement fails (22003) rather than storing or comparing that."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INTEGER, b NUMERIC(25,5))")
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"INSERT INTO n VALUES (1, {literal})")
        assert info.value.sqlstate == "22003"
        assert literal in str(info.value)
        conn.execute("INSERT INTO n VALUES (2, 1234567.125)")
        assert conn.execute("SELECT 9223372036854775807, -9223372036854775808, "
                            "'12345678901234567890.5', b FROM n").fetchall() == [
            (9223372036854775807, -9223372036854775808, "12345678901234567890.5",
             Decimal("1234567.12500"))]


def test_sqlite_refuses_a_numeric_string_literal_it_would_change(start_server,
                                                                 sqlite_engine) -> None:
    """A string literal a NUMERIC column gives its type (PostgreSQL: an exact numeric)
    that SQLite's affinity would make a float of another value fails (22003); a TEXT
    column, or a value a float holds, takes it."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INTEGER, b NUMERIC(25,5), s TEXT)")
        for sql in ("INSERT INTO n VALUES (1, '123456789012345.12345', 'x')",
                    "INSERT INTO n (s, b) VALUES ('x', '123456789012345.12345')",
                    "UPDATE n SET b = '123456789012345.12345'"):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert info.value.sqlstate == "22003", sql
        conn.execute("INSERT INTO n VALUES (2, '1.25', '123456789012345.12345')")
        assert conn.execute("SELECT id, b, s FROM n").fetchall() == [
            (2, Decimal("1.25000"), "123456789012345.12345")]


@pytest.mark.parametrize("prepare", [False, True])
def test_an_expression_of_a_parameter_is_named_as_postgresql_names_it(srv, prepare) -> None:
    """A select-list expression holding a parameter, without an alias, is named as
    PostgreSQL names it (the function, ``case``, ``?column?`` for an operator), not
    after the value: DuckDB named them ``upper('S3CR3T')``, ``('S3CR3T' || 'x')``."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        cur = conn.cursor()
        cur.execute("SELECT upper(%s), %s || 'x', coalesce(%s, 'a'), "
                    "CASE WHEN true THEN %s END, (%s), CAST(%s AS int), 1 + %s::int, "
                    "%s::int + 1, upper(%s) AS u, lower(%s) l",
                    ("s3cr3t",) * 5 + (7, 1, 2, "v", "W"), prepare=prepare)
        assert cur.fetchall() == [("S3CR3T", "s3cr3tx", "s3cr3t", "s3cr3t", "s3cr3t", 7,
                                   2, 3, "V", "w")]
        assert [d.name for d in cur.description] == [
            "upper", "?column?", "coalesce", "case", "?column?", "int4", "?column?",
            "?column?", "u", "l"]


@pytest.mark.parametrize("prepare", [False, True])
def test_an_expression_without_a_parameter_is_named_as_postgresql_names_it(
        srv, prepare) -> None:
    """``SELECT 1`` is ``?column?``, as every select-list expression PostgreSQL names so
    (a literal, an operator), a cast its type's name, a function call the function's: the
    engines named them after their text (``1``, ``(1 + 1)``, ``count_star()``)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
        conn.execute("INSERT INTO t VALUES (2)")
        cur = conn.cursor()
        cur.execute("SELECT 1", prepare=prepare)
        assert cur.fetchall() == [(1,)]
        assert [d.name for d in cur.description] == ["?column?"]
        cur.execute("SELECT 1, 'x', a + 1, -a, CAST(2 AS int), CAST(a * 2 AS bigint), lower('A'), "
                    "count(*), a, t.a, 3 AS b, 4 c FROM t GROUP BY a", prepare=prepare)
        assert cur.fetchall() == [(1, "x", 3, -2, 2, 4, "a", 1, 2, 2, 3, 4)]
        assert [d.name for d in cur.description] == [
            "?column?", "?column?", "?column?", "?column?", "int4", "int8", "lower", "count",
            "a", "a", "b", "c"]


@pytest.mark.parametrize("prepare", [False, True])
def test_a_cast_of_a_column_or_a_call_keeps_its_name(srv, prepare) -> None:
    """A cast is named after what it casts when that has a name, as PostgreSQL's
    FigureColname does: ``CAST(a AS text)`` is ``a``, ``CAST(count(*) AS int)`` is
    ``count``; only a cast of a literal, a parameter or an operator is its type's name
    (the server named ``count(*)::int`` ``int4``, so a client reading ``row["count"]`` or
    ``row["id"]`` of ``id::text`` found no such column)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute('CREATE TABLE t (a INTEGER, "B" TEXT)')
        conn.execute("INSERT INTO t VALUES (2, 'x')")
        cur = conn.cursor()
        cur.execute('SELECT CAST(a AS text), CAST(count(*) AS bigint), CAST(t."B" AS text), '
                    "CAST(CAST(a AS bigint) AS text), CAST(CAST(1 AS int) AS text), "
                    "CAST(a + 1 AS text) FROM t GROUP BY a, \"B\"", prepare=prepare)
        assert cur.fetchall() == [("2", 1, "x", "2", "1", "3")]
        assert [d.name for d in cur.description] == ["a", "count", "B", "a", "text", "text"]
        cur.execute("SELECT a::text, count(*)::int, (a)::text, upper(\"B\")::varchar(3), "
                    "a::bigint::text, (a + 1)::text, 1::int, a::int IS NULL "
                    "FROM t GROUP BY a, \"B\"", prepare=prepare)
        assert [d.name for d in cur.description] == [
            "a", "count", "a", "upper", "a", "text", "int4", "?column?"]


@pytest.mark.parametrize("prepare", [False, True])
def test_constants_subqueries_and_case_are_named_as_postgresql_names_them(
        srv, prepare) -> None:
    """PostgreSQL 15's FigureColname: ``true`` and ``NULL`` are
    ``?column?``, ``EXISTS (...)`` ``exists``, a scalar subquery its column's name
    (``(SELECT 1)`` ``?column?``, ``(SELECT a FROM t)`` ``a``), ``CASE`` its ``ELSE``'s
    name where that is a column or a call, else ``case``; the engines named them after
    their text (``true``, ``NULL``, ``EXISTS(SELECT 1 FROM t)``, ``(SELECT a FROM t)``)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, s TEXT)")
        conn.execute("INSERT INTO t VALUES (2, 'x')")
        cur = conn.cursor()
        cur.execute("SELECT true, false, NULL, (true), true AS x", prepare=prepare)
        assert [d.name for d in cur.description] == ["?column?"] * 4 + ["x"]
        cur.execute("SELECT EXISTS (SELECT 1 FROM t), NOT EXISTS (SELECT 1 FROM t), "
                    "(SELECT 1), (SELECT a FROM t), (SELECT a AS z FROM t), "
                    "(SELECT count(*) FROM t), (SELECT a + 1 FROM t), (SELECT 1) + 1",
                    prepare=prepare)
        assert [tuple(bool(v) if i < 2 else v for i, v in enumerate(r))
                for r in cur.fetchall()] == [(True, False, 1, 2, 2, 1, 3, 2)]
        assert [d.name for d in cur.description] == [
            "exists", "?column?", "?column?", "a", "z", "count", "?column?", "?column?"]
        cur.execute("SELECT CASE WHEN a > 1 THEN 'y' ELSE 'n' END, "
                    "CASE WHEN a > 1 THEN 'y' ELSE s END, "
                    "CASE WHEN a > 1 THEN 'y' ELSE upper(s) END, "
                    "CASE WHEN a > 1 THEN 'y' ELSE CASE WHEN a > 2 THEN 'z' ELSE s END END, "
                    "CASE a WHEN 1 THEN 'y' END, coalesce(a, 0), nullif(a, 1) FROM t",
                    prepare=prepare)
        assert cur.fetchall() == [("y", "y", "y", "y", None, 2, 2)]
        assert [d.name for d in cur.description] == [
            "case", "s", "upper", "s", "case", "coalesce", "nullif"]


@pytest.mark.parametrize("prepare", [False, True])
def test_not_of_a_column_and_distinct_from_are_named_as_postgresql_names_them(
        srv, prepare) -> None:
    """``NOT ok`` of a boolean column is ``?column?`` (the server took ``ok`` for an alias
    and sent the engine's ``NOT ok``), and the items after ``a IS DISTINCT FROM b`` are
    named too (its ``FROM`` ended the select list). The names PostgreSQL 15 gave the same
    query."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x INTEGER, ok BOOLEAN)")
        conn.execute("INSERT INTO t VALUES (1, true)")
        cur = conn.cursor()
        cur.execute("SELECT NOT ok, NOT t.ok, -x, x + 1, x::text, NOT ok AND ok, NOT NOT ok, "
                    "ok IS NOT DISTINCT FROM ok, x IN (1), NOT ok o FROM t", prepare=prepare)
        assert [d.name for d in cur.description] == [
            "?column?", "?column?", "?column?", "?column?", "x", "?column?", "?column?",
            "?column?", "?column?", "o"]
        assert cur.fetchall() == [(False, False, -1, 2, "1", False, True, True, True, False)]


@pytest.mark.parametrize("prepare", [False, True])
def test_star_of_a_subquery_has_its_columns_named_as_postgresql_names_them(
        srv, prepare) -> None:
    """``SELECT * FROM (SELECT count(*) FROM t) s``: the subquery's columns, named as
    PostgreSQL names them (``count``; DuckDB's ``count_star()``, SQLite's ``count(*)``);
    a column list of the alias names them itself."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
        conn.execute("INSERT INTO t VALUES (2)")
        cur = conn.cursor()
        cur.execute("SELECT * FROM (SELECT count(*) FROM t) s", prepare=prepare)
        assert cur.fetchall() == [(1,)]
        assert [d.name for d in cur.description] == ["count"]
        cur.execute("SELECT * FROM (SELECT a + 1, 1, a, upper('x'), a AS b FROM t) AS s "
                    "WHERE true ORDER BY 1", prepare=prepare)
        assert cur.fetchall() == [(3, 1, 2, "X", 2)]
        assert [d.name for d in cur.description] == ["?column?", "?column?", "a", "upper",
                                                     "b"]


@pytest.mark.parametrize("prepare", [False, True])
def test_a_cast_of_a_subquery_case_or_array_keeps_their_name(srv, prepare) -> None:
    """FigureColname keeps a scalar subquery's name, a ``CASE``'s ``ELSE`` name and
    ``ARRAY``'s and ``ROW``'s over a cast's type (``(SELECT a FROM t)::text`` is ``a``,
    ``ARRAY[1, 2]::text`` ``array``), and names a ``CASE`` without one after the type
    (``CASE ... END::text`` is ``text``): the server named them ``text``, and the
    ``CASE`` ``case``."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
        conn.execute("INSERT INTO t VALUES (2)")
        cur = conn.cursor()
        cur.execute("SELECT (SELECT a FROM t)::text, CASE WHEN a > 5 THEN 1 ELSE a END::text, "
                    "CASE WHEN a > 1 THEN 1 END::text, CASE WHEN a > 1 THEN 1 END FROM t",
                    prepare=prepare)
        assert cur.fetchall() == [("2", "2", "1", 1)]
        assert [d.name for d in cur.description] == ["a", "a", "text", "case"]
        if srv.server.engine.__class__.__name__ == "SQLiteEngine":
            return  # (SQLite has no arrays nor rows)
        cur.execute("SELECT ARRAY[1, 2]::text, ROW(1, 2)::text", prepare=prepare)
        assert [d.name for d in cur.description] == ["array", "row"]


@pytest.mark.parametrize("prepare", [False, True])
def test_a_with_query_names_its_columns_as_postgresql_names_them(srv, prepare) -> None:
    """``WITH ... SELECT`` kept the engine's names (``count_star()``, ``(n + 1)``): its
    select list is named as a ``SELECT``'s, and a ``SELECT *`` of one of its queries has
    that query's names; a column list names the columns itself."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
        conn.execute("INSERT INTO t VALUES (2)")
        cur = conn.cursor()
        cur.execute("WITH c AS (SELECT count(*), a + 1 FROM t GROUP BY a) SELECT * FROM c",
                    prepare=prepare)
        assert cur.fetchall() == [(1, 3)]
        assert [d.name for d in cur.description] == ["count", "?column?"]
        cur.execute("WITH RECURSIVE c AS (SELECT 1 AS n), d (x) AS (SELECT 2) "
                    "SELECT n + 1, upper('a'), x FROM c, d", prepare=prepare)
        assert cur.fetchall() == [(2, "A", 2)]
        assert [d.name for d in cur.description] == ["?column?", "upper", "x"]
        cur.execute("WITH d (x) AS (SELECT count(*) FROM t) SELECT * FROM d AS e",
                    prepare=prepare)
        assert [d.name for d in cur.description] == ["x"]


@pytest.mark.parametrize("prepare", [False, True])
def test_double_colon_casts_and_dollar_strings_run_on_both_engines(srv, prepare) -> None:
    """``x::type`` of a column, a call, an expression or a cast, and dollar-quoted strings,
    on both engines: SQLite has neither (``a::text`` was its syntax error "unrecognized
    token", ``$$ab$$`` "there is no parameter $1", SQLite reading ``$x`` as a named
    parameter); a ``::`` inside a string stays text."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, s TEXT)")
        conn.execute("INSERT INTO t VALUES (2, '7')")
        cur = conn.cursor()
        cur.execute("SELECT a::text, (a + 1)::text, count(*)::int, a::bigint::text, "
                    "s::int + 1, '5'::int, CASE WHEN a > 1 THEN a END::text, "
                    "coalesce(NULL::text, 'n'), t.a::double precision, s::varchar(3) "
                    "FROM t GROUP BY a, s", prepare=prepare)
        assert cur.fetchall() == [("2", "3", 1, "2", 8, 5, "2", "n", 2.0, "7")]
        assert [d.name for d in cur.description][:6] == [
            "a", "text", "count", "a", "?column?", "int4"]
        cur.execute("SELECT 'it''s::int', $$a::b$$, $x$it's $$ x$x$, E'c::d'",
                    prepare=prepare)
        assert cur.fetchall() == [("it's::int", "a::b", "it's $$ x", "c::d")]
        conn.execute("INSERT INTO t VALUES ($$3$$::int, $q$it's$q$)")
        assert conn.execute("SELECT s FROM t WHERE a::text = '3'").fetchall() == [("it's",)]


def test_sqlite_refuses_a_cast_it_cannot_run_as_postgresql(start_server, sqlite_engine) -> None:
    """On SQLite, ``x::date`` of a timestamp and ``5::bool`` are refused with 0A000 and a
    hint, not answered with the operand unchanged (the cast dropped: a timestamp where
    PostgreSQL gives a date, 5 where it gives true); a parameter's cast still runs."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE ts (t TEXT)")
        conn.execute("INSERT INTO ts VALUES ('2026-01-01 10:00')")
        for sql in ("SELECT t::date FROM ts", "SELECT 5::bool", "SELECT t::timestamp FROM ts"):
            with pytest.raises(psycopg.errors.FeatureNotSupported) as err:
                conn.execute(sql)
            assert "cannot cast an expression to" in str(err.value)
            assert err.value.diag.message_hint
        # (SQLite holds a date as its ISO text; the parameter's cast is dropped, and the
        # column is a date, as PostgreSQL describes it)
        assert conn.execute("SELECT %s::date", (dt.date(2026, 1, 2),)).fetchone() == (
            dt.date(2026, 1, 2),)


def test_psql_names_a_literal_column_as_postgresql(srv, certs) -> None:
    from tests.server.test_psql_catalog import psql

    out = psql(srv, certs, "SELECT 1, current_user")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == ["?column?|current_user", f"1|{USER}"]


def test_sqlite_integer_casts_answer_as_postgresql(start_server, sqlite_engine) -> None:
    """On SQLite, ``x::int`` is not SQLite's CAST (which truncates 3.7 to 3 and reads
    '3.7' as 3): a float8 rounds half to even (rint), a numeric literal half away from
    zero, text is PostgreSQL's integer input, integers stay exact past 2**53."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE f (id INTEGER, r REAL, t TEXT, b BOOLEAN, i BIGINT)")
        conn.execute("INSERT INTO f VALUES (1, 3.7, '  42 ', TRUE, 9007199254740993), "
                     "(2, 2.5, '+7', FALSE, 9223372036854775807), "
                     "(3, -2.5, '-0012', NULL, -9223372036854775807), "
                     "(4, NULL, NULL, NULL, NULL)")
        rows = conn.execute("SELECT r::int, t::int4, b::int, i::bigint, (i - 1)::int8::text, "
                            "r::smallint FROM f ORDER BY id").fetchall()
        assert rows == [(4, 42, 1, 9007199254740993, "9007199254740992", 4),
                        (2, 7, 0, 9223372036854775807, "9223372036854775806", 2),
                        (-2, -12, None, -9223372036854775807, "-9223372036854775808", -2),
                        (None, None, None, None, None, None)]
        assert conn.execute("SELECT 2.5::int, 3.5::int2, 0.5::bigint, 1.4999::integer, "
                            "'  42 '::int, '-7'::smallint, 3000000000::bigint, NULL::int"
                            ).fetchone() == (3, 4, 1, 1, 42, -7, 3000000000, None)


def test_sqlite_integer_casts_fail_as_postgresql(start_server, sqlite_engine) -> None:
    """What PostgreSQL refuses (22P02, 22003) is refused, not SQLite's 0 or a clamped
    value."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE f (id INTEGER, r REAL, t TEXT, i BIGINT)")
        conn.execute("INSERT INTO f VALUES (1, 1e30, '3.7', 3000000000), (2, 40000, 'abc', 5)")
        for sql, code, message in [
                ("SELECT '3.7'::int", "22P02", 'invalid input syntax for type integer: "3.7"'),
                ("SELECT 'abc'::int", "22P02", 'invalid input syntax for type integer: "abc"'),
                ("SELECT ''::bigint", "22P02", 'invalid input syntax for type bigint: ""'),
                ("SELECT '1 2'::int", "22P02", 'invalid input syntax for type integer: "1 2"'),
                ("SELECT '99999'::int2", "22003",
                 'value "99999" is out of range for type smallint'),
                ("SELECT '9223372036854775808'::int8", "22003",
                 'value "9223372036854775808" is out of range for type bigint'),
                ("SELECT 1e30::bigint", "22003", "bigint out of range"),
                ("SELECT 3000000000::int4", "22003", "integer out of range"),
                ("SELECT 32767.5::smallint", "22003", "smallint out of range"),
                ("SELECT r::bigint FROM f WHERE id = 1", "22003", "bigint out of range"),
                ("SELECT r::int2 FROM f WHERE id = 2", "22003", "smallint out of range"),
                ("SELECT i::int FROM f WHERE id = 1", "22003", "integer out of range"),
                ("SELECT t::int FROM f WHERE id = 1", "22P02",
                 'invalid input syntax for type integer: "3.7"'),
                ("SELECT (t || '')::int FROM f WHERE id = 2", "22P02",
                 'invalid input syntax for type integer: "abc"'),
                ("SELECT '\\x01'::bytea::int", "42846", "cannot cast type bytea to integer")]:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert (info.value.sqlstate, str(info.value).strip()) == (code, message), sql
        assert conn.execute("SELECT i::int FROM f WHERE id = 2").fetchone() == (5,)

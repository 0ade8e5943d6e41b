"""Answers of the analytical engine's server that PostgreSQL 15 gives otherwise than a
first guess would: the catalog's int2vector and name collation, TIMETZ values, COPY's
unknown columns, errors while a result is encoded, and ``TimeZone``. Each expected value
was read from a real PostgreSQL 15 (noted beside it)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from typing import Any

import asyncpg
import psycopg
import pytest


@pytest.fixture
def srv(start_server: Any, analytical: Any) -> Any:
    return start_server(analytical)


def _asyncpg(srv: Any, body: Any) -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(
            host="localhost", port=srv.port, user=srv.dsn["user"],
            password=srv.dsn["password"], database="db",
            ssl=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))
        try:
            return await asyncio.wait_for(body(conn), 60)
        finally:
            await conn.close()

    return asyncio.run(go())


def test_int2vector_and_name_in_pg_type(srv) -> None:
    """int2vector (22) is in pg_type as PostgreSQL has it, so asyncpg's lookup resolves
    it and reads a value as a list; name's collation is "C" (950), text's "default"."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        # PostgreSQL 15: (22, int2vector, A, 21, 1006, 0), (1006, _int2vector, A, 22, 0, 0),
        # name and _name 950, text 100
        rows = conn.execute(
            "SELECT oid, typname, typcategory, typelem, typarray, typcollation FROM pg_type "
            "WHERE typname IN ('int2vector', '_int2vector', 'name', '_name', 'text') "
            "ORDER BY oid").fetchall()
        assert rows == [(19, "name", "S", 0, 1003, 950), (22, "int2vector", "A", 21, 1006, 0),
                        (25, "text", "S", 0, 1009, 100), (1003, "_name", "A", 19, 0, 950),
                        (1006, "_int2vector", "A", 22, 0, 0)]
        # int2vectorsend's bytes (PostgreSQL 15: '1 2'::int2vector, ''::int2vector)
        res = conn.pgconn.exec_params(
            b"SELECT '1 2' AS indoption FROM pg_type WHERE oid = 22", [], result_format=1)
        assert res.ftype(0) == 22
        assert res.get_value(0, 0).hex() == \
            "0000000100000000000000150000000200000000000000020001000000020002"
        res = conn.pgconn.exec_params(
            b"SELECT '' AS indoption FROM pg_type WHERE oid = 22", [], result_format=1)
        assert res.get_value(0, 0).hex() == "0000000100000000000000150000000000000000"

    async def body(conn: asyncpg.Connection) -> Any:
        return await conn.fetch("SELECT '0 3' AS indoption FROM pg_type WHERE oid = 22")

    assert [tuple(r) for r in _asyncpg(srv, body)] == [([0, 3],)]  # PostgreSQL: [0, 3]


def test_timetz_in_pg_type(srv) -> None:
    """timetz (1266) and its array type (1270) are in pg_type as PostgreSQL 15 has them,
    so a client that looks a type up (psycopg's TypeInfo.fetch) finds them; they were
    missing (TypeInfo.fetch: None)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        # PostgreSQL 15: (1266, timetz, 12, f, D, 0, 1270, d), (1270, _timetz, -1, f, A,
        # 1266, 0, d)
        rows = conn.execute(
            "SELECT oid, typname, typlen, typbyval, typcategory, typelem, typarray, typalign "
            "FROM pg_type WHERE oid IN (1266, 1270) ORDER BY oid").fetchall()
        assert rows == [(1266, "timetz", 12, False, "D", 0, 1270, "d"),
                        (1270, "_timetz", -1, False, "A", 1266, 0, "d")]
        info = psycopg.types.TypeInfo.fetch(conn, "timetz")
        assert info is not None and (info.oid, info.array_oid) == (1266, 1270)


def _sqlstate(conn: psycopg.Connection, sql: str) -> tuple[str | None, str]:
    with pytest.raises(psycopg.Error) as info:
        if " FROM STDIN" in sql:
            with conn.cursor().copy(sql) as copy:
                copy.write(b"1\n")
        else:
            with conn.cursor().copy(sql) as copy:
                list(copy)
    return info.value.sqlstate, info.value.diag.message_primary or ""


@pytest.mark.parametrize("fmt", ["", " (FORMAT csv)", " (FORMAT binary)"])
def test_copy_names_a_column_the_table_lacks(srv, fmt) -> None:
    """COPY FROM and TO with a column list naming a column the table lacks: 42703 naming
    it; a column named twice: 42701 (PostgreSQL 15's answers and messages); the connection
    goes on."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
        for direction in ("FROM STDIN", "TO STDOUT"):
            assert _sqlstate(conn, f"COPY t (nope) {direction}{fmt}") == \
                ("42703", 'column "nope" of relation "t" does not exist')
            assert _sqlstate(conn, f"COPY t (a, nope, a) {direction}{fmt}") == \
                ("42703", 'column "nope" of relation "t" does not exist')
            assert _sqlstate(conn, f"COPY t (a, b, a) {direction}{fmt}") == \
                ("42701", 'column "a" specified more than once')
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
        # a user without a grant on t: refused, whatever the columns (none is named)
        conn.execute("CREATE USER bob PASSWORD 'bob pw'")
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True) as bob:
        for direction in ("FROM STDIN", "TO STDOUT"):
            for columns in ("nope", "a", "a, a"):
                assert _sqlstate(bob, f"COPY t ({columns}) {direction}{fmt}")[0] == "42501"
            assert _sqlstate(bob, f"COPY nosuch {direction}{fmt}")[0] == "42501"


def _zone(conn: psycopg.Connection) -> tuple[Any, ...]:
    """(SHOW timezone's column and value, current_setting('TimeZone'), the TimeZone
    ParameterStatus, the text of an instant)."""
    cur = conn.execute("SHOW timezone")
    shown = (cur.description[0].name, cur.fetchone()[0])
    setting = conn.execute("SELECT current_setting('TimeZone')").fetchone()[0]
    res = conn.pgconn.exec_(b"SELECT '2024-01-01 00:00:00+00'::TIMESTAMPTZ")
    return (*shown, setting, conn.info.parameter_status("TimeZone"), res.get_value(0, 0))


def test_set_time_zone_is_shown_and_followed(srv) -> None:
    """SET TimeZone / SET TIME ZONE: SHOW, current_setting and the ParameterStatus give
    the zone set (PostgreSQL's name of it), and timestamptz values are written in it
    (PostgreSQL 15's answers); RESET and DISCARD ALL go back to UTC."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert _zone(conn) == ("TimeZone", "UTC", "UTC", "UTC", b"2024-01-01 00:00:00+00")
        conn.execute("SET TimeZone = 'europe/paris'")
        assert _zone(conn) == ("TimeZone", "Europe/Paris", "Europe/Paris", "Europe/Paris",
                               b"2024-01-01 01:00:00+01")
        # psycopg reads timestamptz values in the zone the ParameterStatus gave
        value = conn.execute("SELECT '2024-07-01 00:00:00+00'::TIMESTAMPTZ").fetchone()[0]
        assert (value.isoformat(), str(value.tzinfo)) == \
            ("2024-07-01T02:00:00+02:00", "Europe/Paris")
        conn.execute("SET TIME ZONE 'America/New_York'")
        assert _zone(conn) == ("TimeZone", "America/New_York", "America/New_York",
                               "America/New_York", b"2023-12-31 19:00:00-05")
        conn.execute("RESET TimeZone")
        assert _zone(conn) == ("TimeZone", "UTC", "UTC", "UTC", b"2024-01-01 00:00:00+00")
        conn.execute("SET timezone TO 'Asia/Kolkata'")
        assert _zone(conn)[1:] == ("Asia/Kolkata", "Asia/Kolkata", "Asia/Kolkata",
                                   b"2024-01-01 05:30:00+05:30")
        conn.execute("DISCARD ALL")
        assert _zone(conn) == ("TimeZone", "UTC", "UTC", "UTC", b"2024-01-01 00:00:00+00")
        # a zone that does not exist (PostgreSQL 15: 22023, its message)
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SET TimeZone = 'Nowhere/X'")
        assert (info.value.sqlstate, info.value.diag.message_primary) == \
            ("22023", 'invalid value for parameter "TimeZone": "Nowhere/X"')
        assert _zone(conn)[1] == "UTC"


def test_a_value_that_cannot_be_sent_fails_its_statement_only(srv) -> None:
    """A result held whole (here a pg_catalog query's) with a value its type cannot be
    sent as: an ErrorResponse for the statement (2202E for a list of lists that is no
    array, 22000 for a date binary cannot hold) and ReadyForQuery; the connection goes on,
    in the simple and the extended protocol, in a query of several statements too."""
    ragged = "SELECT [[1, 2], [3]] AS x FROM pg_type LIMIT 1"
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        for sql in (ragged, f"SELECT 1; {ragged}"):
            res = conn.pgconn.exec_(sql.encode())
            assert res.status == psycopg.pq.ExecStatus.FATAL_ERROR
            assert res.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"2202E"
            assert conn.pgconn.status == psycopg.pq.ConnStatus.OK
            assert conn.execute("SELECT 2").fetchone() == (2,)
        res = conn.pgconn.exec_params(
            b"SELECT DATE '5881580-07-10' AS d FROM pg_type LIMIT 1", [], result_format=1)
        assert res.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"22000"
        assert conn.execute("SELECT 3").fetchone() == (3,)


#: (DuckDB's value, PostgreSQL 15's text and binary timetz_send of it)
TIMETZ = [("'12:34:56+05:30'::TIMETZ", "12:34:56+05:30", "0000000a8bda1c00ffffb2a8"),
          ("'00:00:00+00'::TIMETZ", "00:00:00+00", "000000000000000000000000"),
          ("'12:34:56.123-08'::TIMETZ", "12:34:56.123-08", "0000000a8bdbfc7800007080"),
          ("'24:00:00-15:59'::TIMETZ", "24:00:00-15:59", "000000141dd760000000e0c4"),
          ("'12:34:56+05:30:15'::TIMETZ", "12:34:56+05:30:15", "0000000a8bda1c00ffffb299")]


@pytest.mark.parametrize(("duckdb", "text", "binary"), TIMETZ, ids=[t for _, t, _ in TIMETZ])
def test_timetz_keeps_its_offset(srv, duckdb, text, binary) -> None:
    """A TIMETZ value is sent as timetz (1266) with its offset, as PostgreSQL writes it in
    text (simple and extended protocol, COPY) and binary (DataRow, binary COPY), in a
    query and in a view's column, beside a NULL, and before it runs (a Describe)."""
    from tests.server.test_pg_arrays_datetimes import _binary_copy
    from tests.server.test_text_format import _texts

    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        sql = f"SELECT {duckdb} AS v"
        got = _texts(conn, sql)
        assert got == {k: [(text,)] for k in ("simple", "extended", "copy", "csv")}
        res = conn.pgconn.exec_params(sql.encode(), [], result_format=1)
        assert (res.ftype(0), res.get_value(0, 0).hex()) == (1266, binary)
        assert [f.hex() for f in _binary_copy(conn, sql)] == [binary]
        conn.execute(f"CREATE VIEW w AS SELECT 1 AS i, {duckdb} AS v UNION ALL SELECT 2, NULL")
        res = conn.pgconn.exec_(b"SELECT i, v FROM w ORDER BY i")
        assert (res.ftype(1), [res.get_value(r, 1) for r in range(2)]) == \
            (1266, [text.encode(), None])
        conn.pgconn.prepare(b"st", sql.encode())
        assert conn.pgconn.describe_prepared(b"st").ftype(0) == 1266


def test_timetz_in_a_list_or_struct_keeps_its_offset(srv) -> None:
    """A TIMETZ in a list is a timetz[] (1270) whose elements keep their offsets, as
    PostgreSQL 15 writes ARRAY['12:34:56+05:30'::timetz, NULL] (text: simple, extended,
    COPY; binary; psycopg and asyncpg read times with offsets), and one in a struct keeps
    it in the struct's text; a list's was a time[] without offsets, a struct's a time."""
    from tests.server.test_text_format import _texts

    kolkata = dt.timezone(dt.timedelta(hours=5, minutes=30))
    sql = ("SELECT ['12:34:56+05:30'::TIMETZ, NULL] AS v, [['12:34:56-08'::TIMETZ]] AS w, "
           "{'t': '12:34:56+05:30'::TIMETZ} AS x")
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert _texts(conn, sql) == {k: [("{12:34:56+05:30,NULL}", "{{12:34:56-08}}",
                                          '{"t": "12:34:56+05:30"}')]
                                     for k in ("simple", "extended", "copy", "csv")}
        res = conn.pgconn.exec_(sql.encode())
        assert [res.ftype(i) for i in range(3)] == [1270, 1270, 25]
        # binary: array_send of timetz_send's elements (PostgreSQL 15's bytes)
        res = conn.pgconn.exec_params(sql.encode(), [], result_format=1)
        assert res.get_value(0, 0).hex() == (
            "0000000100000001000004f200000002000000010000000c0000000a8bda1c00ffffb2a8ffffffff")
        want = [dt.time(12, 34, 56, tzinfo=kolkata), None]
        assert conn.execute(sql).fetchone()[0] == want
        assert conn.cursor(binary=True).execute(sql).fetchone()[0] == want
        with conn.transaction(), conn.cursor("c") as cur:  # (a server-side cursor's rows)
            assert cur.execute(sql).fetchone()[0] == want
        # a prepared statement's EXECUTE (PostgreSQL 15: 12:34:56+05:30 | {01:02:03-08})
        conn.execute("PREPARE p AS SELECT '12:34:56+05:30'::TIMETZ AS t, "
                     "['01:02:03-08'::TIMETZ] AS l")
        res = conn.pgconn.exec_(b"EXECUTE p")
        assert [(res.ftype(i), res.get_value(0, i)) for i in range(2)] == \
            [(1266, b"12:34:56+05:30"), (1270, b"{01:02:03-08}")]

    async def body(conn: asyncpg.Connection) -> Any:
        return (await conn.fetchrow(sql))["v"]

    assert _asyncpg(srv, body) == want


def test_users_arrow_lossless_conversion_is_kept(srv) -> None:
    """A session's own SET SESSION arrow_lossless_conversion (DuckDB's) stays what it set
    across queries with a TIMETZ, which the server reads through DuckDB's lossless export
    (it was reset to off after each); the values sent are the same either way."""
    sql = "SELECT '12:34:56+05:30'::TIMETZ AS v, ['01:02:03-08'::TIMETZ] AS l, true AS b"
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        want = conn.execute(sql).fetchone()
        for value in ("true", "false", "true"):
            conn.execute(f"SET SESSION arrow_lossless_conversion = {value}")
            for _ in range(2):
                assert conn.execute(sql).fetchone() == want
                assert conn.execute("SHOW arrow_lossless_conversion").fetchone() == \
                    (value == "true",)


def test_timetz_as_drivers_read_it(srv) -> None:
    """psycopg (text and binary) and asyncpg (binary) read a TIMETZ as a time with its
    offset, as they read PostgreSQL's."""
    want = dt.time(12, 34, 56, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30)))
    sql = "SELECT '12:34:56+05:30'::TIMETZ AS v, TIME '01:02:03' AS t"
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert conn.execute(sql).fetchone() == (want, dt.time(1, 2, 3))
        assert conn.cursor(binary=True).execute(sql).fetchone() == (want, dt.time(1, 2, 3))

    async def body(conn: asyncpg.Connection) -> Any:
        return tuple(await conn.fetchrow(sql))

    assert _asyncpg(srv, body) == (want, dt.time(1, 2, 3))


def test_set_time_zone_after_a_comment_is_followed(srv) -> None:
    """A SET TimeZone (or RESET ALL) that comments begin is DuckDB's SET all the same:
    SHOW, current_setting and the ParameterStatus follow it (PostgreSQL 15 answers as
    without the comments)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("/* app */ SET TimeZone = 'Asia/Tokyo'")
        assert _zone(conn) == ("TimeZone", "Asia/Tokyo", "Asia/Tokyo", "Asia/Tokyo",
                               b"2024-01-01 09:00:00+09")
        conn.execute("-- app\n/* a\n b */ SET TIME ZONE 'Europe/Paris'")
        assert _zone(conn)[1:] == ("Europe/Paris", "Europe/Paris", "Europe/Paris",
                                   b"2024-01-01 01:00:00+01")
        conn.execute("/* SET TimeZone = 'Asia/Tokyo' */ SELECT 1")
        assert _zone(conn)[1] == "Europe/Paris"


def _fails(conn: psycopg.Connection, sql: str) -> tuple[str | None, str]:
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql)
    return info.value.sqlstate, info.value.diag.message_primary or ""


def test_set_local_in_a_transaction_block_is_not_supported(srv) -> None:
    """DuckDB's SET LOCAL is not implemented: 0A000 in a transaction block (it was XX000,
    an internal error), and the block rolls back. Outside one, SET LOCAL TimeZone (SET
    LOCAL TIME ZONE) changes nothing and says so, as in PostgreSQL 15 (it was 0A000)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for sql in ("SET LOCAL TimeZone = 'Asia/Tokyo'", "SET LOCAL TIME ZONE 'Asia/Tokyo'"):
            assert conn.execute(sql).statusmessage == "SET"
            assert _zone(conn)[1:4] == ("UTC", "UTC", "UTC")
        assert notices == ["SET LOCAL can only be used in transaction blocks"] * 2
        conn.execute("BEGIN")
        for sql in ("SET LOCAL TimeZone = 'Asia/Tokyo'", "SET LOCAL threads = 1"):
            assert _fails(conn, sql) == ("0A000", "Not implemented Error: SET LOCAL is "
                                            "not implemented.")
            conn.execute("ROLLBACK")
            conn.execute("BEGIN")
        conn.execute("ROLLBACK")
        assert _zone(conn)[1] == "UTC"


def test_timetz_in_a_query_ending_in_a_comment(srv) -> None:
    """A query with a TIMETZ column whose text ends in a -- comment (as a tool appends
    one) keeps its offset, as in PostgreSQL 15, in the simple and the extended protocol
    and a server-side cursor (it failed with 42601: the comment ate what the server
    wrapped the query in)."""
    import datetime as dt

    want = [(dt.time(12, 34, 56, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))), 1)]
    sql = "SELECT '12:34:56+05:30'::TIMETZ AS v, 1 AS n -- app: report"
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        res = conn.pgconn.exec_(sql.encode())
        assert (res.ftype(0), res.get_value(0, 0)) == (1266, b"12:34:56+05:30")
        assert conn.execute(sql, prepare=True).fetchall() == want
        with conn.transaction(), conn.cursor("c") as cur:
            cur.execute(sql)
            assert cur.fetchall() == want


def test_set_global_time_zone_is_refused(srv) -> None:
    """DuckDB's SET GLOBAL TimeZone (an admin's) is refused with 0A000: it changed the
    zone every other session wrote timestamptz in while their SHOW, current_setting and
    ParameterStatus still said UTC (PostgreSQL has no SET GLOBAL: 42601)."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn, \
            psycopg.connect(**srv.dsn, autocommit=True) as other:
        for sql in ("SET GLOBAL TimeZone = 'Asia/Tokyo'", "SET GLOBAL TIME ZONE 'Asia/Tokyo'",
                    "/* app */ SET GLOBAL timezone TO 'Asia/Tokyo'", "RESET GLOBAL TimeZone"):
            assert _fails(conn, sql)[0] == "0A000", sql
        for c in (conn, other):
            assert _zone(c) == ("TimeZone", "UTC", "UTC", "UTC", b"2024-01-01 00:00:00+00")
        conn.execute("SET TimeZone = 'Asia/Tokyo'")  # (the session's own: taken)
        assert _zone(conn)[1] == "Asia/Tokyo"
        assert _zone(other)[1:] == ("UTC", "UTC", "UTC", b"2024-01-01 00:00:00+00")


def test_timetz_query_runs_once(srv) -> None:
    """A query with a TIMETZ column runs once, in the simple and extended protocol, held
    whole and streamed: its sequence advances by one a row, as PostgreSQL's does."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE s")
        sql = "SELECT nextval('s') AS n, '12:00:00+01'::TIMETZ AS v"
        assert conn.execute(sql).fetchone() == (1, dt.time(12, tzinfo=dt.timezone(
            dt.timedelta(hours=1))))
        res = conn.pgconn.exec_(sql.encode())
        assert [res.get_value(0, i) for i in range(2)] == [b"2", b"12:00:00+01"]
        res = conn.pgconn.exec_params(sql.encode(), [], result_format=1)
        assert res.get_value(0, 0) == (3).to_bytes(8, "big")
        got = conn.execute("SELECT nextval('s'), '12:00:00+01'::TIMETZ FROM range(5000)")
        assert [r[0] for r in got.fetchall()] == list(range(4, 5004))  # (streamed)
        assert conn.execute("SELECT currval('s')").fetchone() == (5003,)


#: results whose lossless Arrow export differs from DuckDB's default one
LOSSLESS = [
    "SELECT true AS v, NULL::BOOLEAN AS w, [true, false, NULL] AS x, {'b': false} AS y",
    "SELECT '00000000-0000-0000-0000-000000000001'::UUID AS v, NULL::UUID AS w",
    "SELECT (-170141183460469231731687303715884105728)::HUGEINT AS v, NULL::HUGEINT AS w",
    "SELECT 340282366920938463463374607431768211455::UHUGEINT AS v, 5::UHUGEINT AS w",
    "SELECT '101'::BIT AS v, '{\"a\": 1}'::JSON AS w, 5::VARINT AS x, INTERVAL 1 DAY AS y",
    "SELECT {'a': gen_random_uuid() IS NULL, 'b': 1::HUGEINT, 'c': [1::UHUGEINT]} AS v",
    "SELECT MAP {'00000000-0000-0000-0000-000000000001'::UUID: [1::HUGEINT]} AS v",
    "SELECT ['00000000-0000-0000-0000-000000000001'::UUID, NULL]::UUID[2] AS v",
    "SELECT union_value(u := '00000000-0000-0000-0000-000000000001'::UUID)"
    "::UNION(u UUID, i INT) AS v",
    "SELECT CASE WHEN i % 2 = 0 THEN NULL ELSE {'u': i::HUGEINT} END AS v FROM range(5) t(i)"]


@pytest.mark.parametrize("sql", LOSSLESS)
def test_lossless_export_read_as_the_default_one(sql) -> None:
    """lossy_result gives what DuckDB's default Arrow export gives (a UHUGEINT exact, as
    exact_result makes it), empty or not."""
    import duckdb

    from cryptdisk.db._rows import exact_table
    from cryptdisk.server import _types

    con = duckdb.connect()
    for limit in ("", " LIMIT 0"):
        rel = con.sql(f"SELECT * FROM ({sql}){limit}")
        want = exact_table(rel.to_arrow_table(), [str(t) for t in rel.types])
        con.execute("SET arrow_lossless_conversion = true")
        table = con.sql(f"SELECT * FROM ({sql}){limit}").to_arrow_table()
        con.execute("RESET arrow_lossless_conversion")
        assert not table.schema.equals(want.schema)
        got = _types.lossy_result(table)
        assert got.schema.equals(want.schema) and got.to_pylist() == want.to_pylist()
        assert _types.lossy_schema(table.schema).equals(want.schema)


def test_timetz_text_is_duckdbs() -> None:
    """Each TIMETZ's text from the lossless export is DuckDB's (PostgreSQL's) text of it,
    at the ends of its range and with an offset of hours, minutes and seconds."""
    import random

    import duckdb

    from cryptdisk.server import _types

    rnd = random.Random(7)
    values = ["24:00:00-15:59:59", "00:00:00+15:59:59", "12:34:56.000001-00:00:01"]
    for _ in range(500):
        us, east = rnd.randrange(86_400_000_001), rnd.randrange(-57599, 57600)
        east = int(east / 3600) * 3600 if rnd.random() < 0.3 else east
        s, a = us // 1_000_000, abs(east)
        values.append(f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}.{us % 10**6:06d}"
                      f"{'-' if east < 0 else '+'}{a // 3600:02d}:{a // 60 % 60:02d}:{a % 60:02d}")
    con = duckdb.connect()
    con.execute("SET arrow_lossless_conversion = true")
    table = con.sql("SELECT v::TIMETZ AS z, CAST(v::TIMETZ AS VARCHAR) AS t "
                    "FROM unnest(?) AS x(v)", params=[[*values, None]]).to_arrow_table()
    got = _types.lossy_result(table)
    assert _types.zoned_field(got.schema.field("z"))
    assert got.column("z").to_pylist() == got.column("t").to_pylist()
    assert got.column("z").to_pylist()[-1] is None


def test_startup_time_zone_is_the_sessions(srv, monkeypatch) -> None:
    """A TimeZone in the startup packet (JDBC sends the JVM's; libpq PGTZ's, options'
    -c TimeZone=) is the session's zone from its start: SHOW, current_setting, the
    ParameterStatus and timestamptz text give it, and RESET, SET TIME ZONE LOCAL and
    DISCARD ALL go back to it (PostgreSQL 15's answers); a startup parameter counts
    before options, as PostgreSQL takes them."""
    kolkata = ("TimeZone", "Asia/Kolkata", "Asia/Kolkata", "Asia/Kolkata",
               b"2024-01-01 05:30:00+05:30")
    with psycopg.connect(**srv.dsn, autocommit=True,
                         options="-c TimeZone=asia/kolkata") as conn:
        assert _zone(conn) == kolkata
        value = conn.execute("SELECT '2024-07-01 00:00:00+00'::TIMESTAMPTZ").fetchone()[0]
        assert value.isoformat() == "2024-07-01T05:30:00+05:30"
        for reset in ("RESET TimeZone", "SET TIME ZONE LOCAL", "SET timezone TO DEFAULT",
                      "RESET ALL", "DISCARD ALL"):
            conn.execute("SET TimeZone = 'Europe/Paris'")
            assert _zone(conn)[1] == "Europe/Paris"
            conn.execute(reset)
            assert _zone(conn) == kolkata, reset
        conn.execute("CREATE USER bob PASSWORD 'bob pw'")
    # a user without grants too (the zone is set before the user's privileges apply)
    with psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"},
                         autocommit=True, options="-c TimeZone=asia/kolkata") as bob:
        assert _zone(bob) == kolkata
    monkeypatch.setenv("PGTZ", "europe/paris")  # (libpq: a "timezone" startup parameter)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert _zone(conn) == ("TimeZone", "Europe/Paris", "Europe/Paris", "Europe/Paris",
                               b"2024-01-01 01:00:00+01")
    with psycopg.connect(**srv.dsn, autocommit=True, options="-c timezone=Asia/Tokyo") as c:
        assert _zone(c)[1] == "Europe/Paris"  # (PostgreSQL 15: Europe/Paris)
    monkeypatch.delenv("PGTZ")
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:  # (none given: UTC)
        assert _zone(conn) == ("TimeZone", "UTC", "UTC", "UTC", b"2024-01-01 00:00:00+00")


def test_set_time_zone_in_a_read_only_session(srv) -> None:
    """With default_transaction_read_only on (or SET SESSION CHARACTERISTICS AS TRANSACTION
    READ ONLY), a session still SETs and RESETs its TimeZone, an admin's and a user's
    without grants alike, as in PostgreSQL 15 (it was 25006 "cannot execute SET in a
    read-only transaction"); writes and DuckDB's global settings stay 25006."""
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
    for dsn in (srv.dsn, {**srv.dsn, "user": "bob", "password": "bob pw"}):
        for read_only in ("SET default_transaction_read_only = on",
                          "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY"):
            with psycopg.connect(**dsn, autocommit=True) as conn:
                conn.execute(read_only)
                conn.execute("SET TimeZone = 'Asia/Tokyo'")
                assert _zone(conn)[1:] == ("Asia/Tokyo", "Asia/Tokyo", "Asia/Tokyo",
                                           b"2024-01-01 09:00:00+09")
                for reset in ("RESET TimeZone", "SET TIME ZONE LOCAL"):
                    conn.execute("SET TIME ZONE 'Europe/Paris'")
                    assert _zone(conn)[1] == "Europe/Paris"
                    conn.execute(reset)
                    assert _zone(conn)[1] == "UTC"
                for sql in ("CREATE TABLE t (a INTEGER)", "SET threads = 1"):
                    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
                        conn.execute(sql)


def test_startup_time_zone_unknown_is_refused(srv) -> None:
    """A startup TimeZone that does not exist refuses the connection with PostgreSQL
    15's FATAL 22023 and its message."""
    with pytest.raises(psycopg.OperationalError,
                       match='invalid value for parameter "TimeZone": "Nowhere/X"'):
        psycopg.connect(**srv.dsn, options="-c TimeZone=Nowhere/X")

    async def connect() -> Any:
        return await asyncpg.connect(
            host="localhost", port=srv.port, user=srv.dsn["user"],
            password=srv.dsn["password"], database="db",
            server_settings={"TimeZone": "Nowhere/X"},
            ssl=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))

    with pytest.raises(asyncpg.PostgresError) as info:
        asyncio.run(connect())
    assert (info.value.sqlstate, str(info.value)) == \
        ("22023", 'invalid value for parameter "TimeZone": "Nowhere/X"')
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:  # (the server goes on)
        assert _zone(conn)[1] == "UTC"

"""asyncpg against the server on both engines, over TLS with SCRAM: asyncpg uses the
extended protocol only, encodes each parameter in binary by the type the server's
ParameterDescription gives it (so untyped ``$n`` must get their context's type), reads
results in binary, and has its own COPY and cursor calls."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import io
import ssl
from typing import Any

import asyncpg
import pytest

ENGINES = ["analytical", "sqlite_engine"]
CREATE = {
    "analytical": "CREATE TABLE t (a BIGINT, b VARCHAR, c DOUBLE, d DATE, n DECIMAL(10,2), "
                  "flag BOOLEAN)",
    "sqlite_engine": "CREATE TABLE t (a INTEGER, b TEXT, c REAL, d DATE, n NUMERIC, "
                     "flag BOOLEAN)",
}
ROWS = [(1, "x", 1.5, dt.date(2024, 1, 2), decimal.Decimal("1.25"), True),
        (2, "y", 2.5, dt.date(2024, 2, 3), decimal.Decimal("2.50"), False)]


def run(srv: Any, body: Any, user: str = "u", password: str = "pw") -> Any:
    async def go() -> Any:
        conn = await asyncpg.connect(
            host="localhost", port=srv.port, user=user, password=password, database="db",
            ssl=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))
        try:
            return await body(conn)
        finally:
            await conn.close()

    return asyncio.run(go())


def start(start_server: Any, request: Any, engine: str) -> Any:
    srv = start_server(request.getfixturevalue(engine))

    async def create(conn: asyncpg.Connection) -> None:
        await conn.execute(CREATE[engine])

    run(srv, create)
    return srv


@pytest.mark.parametrize("engine", ENGINES)
def test_parameters_by_their_context(start_server, request, engine) -> None:
    srv = start(start_server, request, engine)

    async def body(conn: asyncpg.Connection) -> None:
        # INSERT ... VALUES ($1, ...): each parameter has its column's type
        await conn.executemany("INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6)", ROWS)
        rows = await conn.fetch("SELECT * FROM t WHERE a = $1", 2)
        assert [tuple(r) for r in rows] == [ROWS[1]]
        assert await conn.fetchval("SELECT b FROM t WHERE a > $1 AND d < $2",
                                   1, dt.date(2025, 1, 1)) == "y"
        assert await conn.fetchval("SELECT count(*) FROM t WHERE a IN ($1, $2)", 1, 2) == 2
        assert await conn.fetchval("SELECT a FROM t WHERE n BETWEEN $1 AND $2",
                                   decimal.Decimal("1"), decimal.Decimal("2")) == 1
        assert await conn.fetchval("SELECT a FROM t WHERE b LIKE $1", "y%") == 2
        assert await conn.fetchval("SELECT a FROM t ORDER BY a LIMIT $1 OFFSET $2", 1, 1) == 2
        assert await conn.execute("UPDATE t SET c = $1 WHERE flag = $2", 9.5, False) \
            == "UPDATE 1"
        assert await conn.fetchval("SELECT c FROM t WHERE a = 2") == 9.5
        assert await conn.fetchval("SELECT a FROM t WHERE flag = $1 AND c * 2 > $2",
                                   True, 2.5) == 1
        st = await conn.prepare("SELECT a, b FROM t WHERE a >= $1 AND b <> $2 ORDER BY a")
        assert [p.name for p in st.get_parameters()] == ["int8", "text"]
        assert [(a.name, a.type.name) for a in st.get_attributes()] == \
            [("a", "int8"), ("b", "text")]
        assert [r["a"] for r in await st.fetch(1, "z")] == [1, 2]
        assert await st.fetchval(2, "z") == 2
        # a parameter asyncpg sends typed by a cast
        assert await conn.fetchval("SELECT a FROM t WHERE a = $1::int", 1) == 1
        with pytest.raises(asyncpg.DataError):  # int8 wants an int, as from PostgreSQL
            await conn.fetch("SELECT a FROM t WHERE a = $1", "1")

    run(srv, body)


def test_binary_values_on_the_analytical_engine(start_server, analytical) -> None:
    srv = start_server(analytical)

    async def body(conn: asyncpg.Connection) -> None:
        assert await conn.fetchval("SELECT $1::int + 1", 41) == 42
        stamp = dt.datetime(2024, 1, 1, 1, 2, 3, 456000)
        assert await conn.fetchval("SELECT $1::timestamp", stamp) == stamp
        aware = stamp.replace(tzinfo=dt.UTC)
        assert await conn.fetchval("SELECT $1::timestamptz", aware) == aware
        assert await conn.fetchval("SELECT $1::interval", dt.timedelta(days=1, seconds=3)) \
            == dt.timedelta(days=1, seconds=3)
        assert await conn.fetchval("SELECT $1::bytea", b"\x00\xff") == b"\x00\xff"
        assert await conn.fetchval("SELECT $1::date + 1", dt.date(2024, 2, 28)) == \
            dt.date(2024, 2, 29)
        assert await conn.fetchval("SELECT $1::numeric * 2", decimal.Decimal("1.25")) == \
            decimal.Decimal("2.50")

    run(srv, body)


@pytest.mark.parametrize("engine", ENGINES)
def test_copy(start_server, request, engine) -> None:
    srv = start(start_server, request, engine)

    async def body(conn: asyncpg.Connection) -> None:
        assert await conn.copy_records_to_table("t", records=ROWS) == "COPY 2"
        assert await conn.copy_records_to_table(
            "t", records=[(3, "z")], columns=["a", "b"]) == "COPY 1"
        assert await conn.copy_to_table("t", source=io.BytesIO(b"4\tw\n"),
                                        columns=["a", "b"]) == "COPY 1"
        out = io.BytesIO()
        assert await conn.copy_from_query("SELECT a, b FROM t WHERE a > $1 ORDER BY a", 1,
                                          output=out) == "COPY 3"
        assert out.getvalue() == b"2\ty\n3\tz\n4\tw\n"
        out = io.BytesIO()
        assert await conn.copy_from_table("t", columns=["a", "d"], output=out,
                                          format="csv") == "COPY 4"
        assert out.getvalue().splitlines()[:2] == [b"1,2024-01-02", b"2,2024-02-03"]
        rows = await conn.fetch("SELECT * FROM t WHERE a <= 2 ORDER BY a")
        assert [tuple(r) for r in rows] == ROWS

    run(srv, body)


@pytest.mark.parametrize("engine", ENGINES)
def test_cursors_in_a_transaction(start_server, request, engine) -> None:
    srv = start(start_server, request, engine)

    async def body(conn: asyncpg.Connection) -> None:
        await conn.copy_records_to_table("t", records=[(i, f"r{i}") for i in range(1, 8)],
                                         columns=["a", "b"])
        async with conn.transaction():
            seen = [r["a"] async for r in conn.cursor("SELECT a FROM t ORDER BY a",
                                                      prefetch=3)]
            assert seen == list(range(1, 8))
            cur = await conn.cursor("SELECT a, b FROM t WHERE a > $1 ORDER BY a", 2)
            assert [r["a"] for r in await cur.fetch(2)] == [3, 4]
            await cur.forward(1)
            row = await cur.fetchrow()
            assert row is not None and tuple(row) == (6, "r6")
        with pytest.raises(asyncpg.NoActiveSQLTransactionError):
            await conn.cursor("SELECT a FROM t")

    run(srv, body)


@pytest.mark.parametrize("engine", ENGINES)
def test_parameter_types_look_only_at_readable_tables(start_server, request, engine) -> None:
    srv = start(start_server, request, engine)

    async def admin(conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE TABLE secret (s TEXT, hidden BIGINT)")
        await conn.execute("CREATE USER bob PASSWORD 'bob pw'")
        await conn.execute("GRANT SELECT ON t TO bob")
        st = await conn.prepare("SELECT s FROM secret WHERE hidden = $1")
        assert [p.name for p in st.get_parameters()] == ["int8"]

    async def bob(conn: asyncpg.Connection) -> None:
        st = await conn.prepare("SELECT a FROM t WHERE a = $1")
        assert [p.name for p in st.get_parameters()] == ["int8"]
        # the type of a column bob may not read is not told; the query is refused
        if engine == "sqlite_engine":  # SQLite checks the statement as it prepares it
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.prepare("SELECT s FROM secret WHERE hidden = $1")
            return
        st = await conn.prepare("SELECT s FROM secret WHERE hidden = $1")
        assert [p.name for p in st.get_parameters()] == ["text"]
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await st.fetch("7")

    run(srv, admin)
    run(srv, bob, "bob", "bob pw")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_failing_statement_answers_before_sync(start_server, request, engine) -> None:
    srv = start(start_server, request, engine)

    async def body(conn: asyncpg.Connection) -> None:
        # asyncpg prepares with Parse, Describe, Flush and waits: the error must come then
        with pytest.raises(asyncpg.PostgresError):
            await asyncio.wait_for(conn.fetch("SELECT no_such_function($1)", 1), 20)
        assert await conn.fetchval("SELECT count(*) FROM t") == 0

    run(srv, body)


@pytest.mark.parametrize("engine", ENGINES)
def test_pg_catalog_functions_and_types(start_server, request, engine) -> None:
    srv = start(start_server, request, engine)

    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute("INSERT INTO t (a, b) VALUES (1, 'MiXed')")
        assert await conn.fetchval("SELECT pg_catalog.lower(b) FROM t") == "mixed"
        assert await conn.fetchval('SELECT "pg_catalog".upper(b) FROM public.t') == "MIXED"
        assert await conn.fetchval("SELECT a FROM t WHERE a = $1::pg_catalog.int8", 1) == 1
        assert await conn.fetchval("SELECT quote_literal(b) FROM t") == "'MiXed'"

    run(srv, body)


def test_sqlite_computed_columns_are_typed_before_they_run(start_server, sqlite_engine) -> None:
    """On SQLite a computed column has no declared type: the Describe (by which asyncpg
    decodes the rows) reads it off the text (casts, aggregates, arithmetic over typed
    operands, literals), and the rows are sent in that type."""
    srv = start_server(sqlite_engine)

    async def body(conn: Any) -> Any:
        await conn.execute(CREATE["sqlite_engine"])
        await conn.executemany("INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6)", ROWS)
        got = [
            await conn.fetchval("SELECT $1::int + 1", 41),
            await conn.fetchval("SELECT count(*) + 1 FROM t"),
            await conn.fetchval("SELECT count(*) FROM t WHERE a > 5"),
            await conn.fetchrow("SELECT a * 2 AS doubled, c + 1, avg(a), sum(a), max(d), "
                                "'x' || b, 7, 2.5, CAST('3' AS INTEGER) FROM t"),
            await conn.fetchval("SELECT avg(a) FROM t WHERE a > 5"),  # NULL: still float8
            await conn.fetchval("SELECT n + 1 FROM t WHERE a = 1"),
        ]
        stmt = await conn.prepare("SELECT count(*) + 1 AS n, a > 1 FROM t")
        types = [(a.name, a.type.name) for a in stmt.get_attributes()]
        with pytest.raises(asyncpg.NumericValueOutOfRangeError):  # SQLite made it a float
            await conn.fetchval("SELECT 9223372036854775807 + $1::int", 1)
        return got, types

    got, types = run(srv, body)
    assert got[:3] == [42, 3, 0]
    assert tuple(got[3]) == (4, 3.5, 1.5, 3, dt.date(2024, 2, 3), "xy", 7, 2.5, 3)
    assert got[4] is None and got[5] == decimal.Decimal("2.25")
    assert types == [("n", "int8"), ("?column?", "bool")]  # a comparison: bool


def test_sqlite_computed_columns_psycopg_and_pg8000(start_server, sqlite_engine) -> None:
    import pg8000.native
    import psycopg

    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (a INTEGER, r REAL)")
        conn.execute("INSERT INTO t VALUES (1, 0.5), (2, 1.5)")
        cur = conn.execute("SELECT %s::int + 1, sum(r), count(*) FROM t", [41], prepare=True,
                           binary=True)
        assert cur.fetchall() == [(42, 2.0, 2)]
        assert [d.type_code for d in cur.description] == [20, 701, 20]
    conn8 = pg8000.native.Connection(
        "u", host="localhost", port=srv.port, password="pw", database="db",
        ssl_context=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))
    try:
        assert conn8.run("SELECT count(*) + 1 FROM t") == [[3]]
        assert conn8.run("SELECT max(r) * 2 FROM t") == [[3.0]]
    finally:
        conn8.close()


@pytest.mark.parametrize("engine_name", ENGINES)
def test_uuid_results_and_parameters(start_server, request, engine_name) -> None:
    """A UUID column (and, on the analytical engine, a UUID expression) is uuid (2950) in
    results, text and binary, so asyncpg and psycopg give uuid.UUID; uuid parameters bind."""
    import uuid

    import psycopg

    srv = start_server(request.getfixturevalue(engine_name))
    ids = [uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"), uuid.uuid4()]

    async def body(conn: Any) -> Any:
        await conn.execute("CREATE TABLE ids (id UUID, n INTEGER)")
        await conn.executemany("INSERT INTO ids VALUES ($1, $2)", [(ids[0], 1), (ids[1], 2)])
        got = [await conn.fetchval("SELECT id FROM ids WHERE n = 1"),
               await conn.fetchval("SELECT n FROM ids WHERE id = $1", ids[1]),
               [tuple(r) for r in await conn.fetch("SELECT * FROM ids ORDER BY n")],
               await conn.fetchval("SELECT i.id AS x FROM ids i WHERE n = 2")]
        if engine_name == "analytical":
            got.append(await conn.fetchval(f"SELECT '{ids[0]}'::UUID"))
            got.append(isinstance(await conn.fetchval("SELECT gen_random_uuid()"), uuid.UUID))
        return got

    got = run(srv, body)
    assert got[:4] == [ids[0], 2, [(ids[0], 1), (ids[1], 2)], ids[1]]
    if engine_name == "analytical":
        assert got[4:] == [ids[0], True]
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        for binary in (False, True):
            cur = conn.execute("SELECT id, n FROM ids WHERE id = %s", [ids[0]], binary=binary)
            assert cur.fetchall() == [(ids[0], 1)]
            assert cur.description[0].type_code == 2950
        assert conn.execute("SELECT id FROM ids ORDER BY n").fetchall() == [(ids[0],),
                                                                            (ids[1],)]
        third = uuid.uuid4()
        with conn.cursor() as cur:  # binary COPY reads and writes the column as uuid
            with cur.copy("COPY ids (id, n) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["uuid", "int4"])
                copy.write_row([third, 3])
            with cur.copy("COPY (SELECT id FROM ids WHERE n = 3) TO STDOUT (FORMAT BINARY)") \
                    as copy:
                copy.set_types(["uuid"])
                assert list(copy.rows()) == [(third,)]


def test_lists_as_arrays(start_server, request) -> None:
    """asyncpg looks each array type up in pg_catalog (pg_type, pg_range; the lookup's own
    OID arrays are oid[], which it decodes itself) and reads the analytical engine's lists
    as lists: each element type, NULL elements, an empty list, a rectangular nested list."""
    srv = start(start_server, request, "analytical")

    async def body(conn: asyncpg.Connection) -> None:
        cases = [
            ("[1, NULL, 3]::BIGINT[]", "int8[]", [1, None, 3]),
            ("[1, 2]::INTEGER[]", "int4[]", [1, 2]),
            ("[1.5, NULL]::DOUBLE[]", "float8[]", [1.5, None]),
            ("[true, NULL, false]::BOOLEAN[]", "bool[]", [True, None, False]),
            ("['2024-01-02'::DATE, NULL]", "date[]", [dt.date(2024, 1, 2), None]),
            ("['2024-01-02 03:04:05'::TIMESTAMP]", "timestamp[]",
             [dt.datetime(2024, 1, 2, 3, 4, 5)]),
            ("['a b', NULL, 'c\"d']::VARCHAR[]", "text[]", ["a b", None, 'c"d']),
            ("[]::BIGINT[]", "int8[]", []),
            ("[[1, 2], [3, NULL]]::BIGINT[][]", "int8[]", [[1, 2], [3, None]]),
        ]
        for sql, type_name, expected in cases:
            st = await asyncio.wait_for(conn.prepare(f"SELECT {sql} AS x"), 30)
            assert [a.type.name for a in st.get_attributes()] == [type_name], sql
            assert st.get_attributes()[0].type.kind == "array", sql
            assert await asyncio.wait_for(st.fetchval(), 30) == expected, sql
        rows = await conn.fetch("SELECT [i, i + 1] AS x FROM range(3) r(i) ORDER BY i")
        assert [r["x"] for r in rows] == [[0, 1], [1, 2], [2, 3]]
        # indoption's int2vector: asyncpg's lookup finds it in pg_type
        assert await asyncio.wait_for(conn.fetch("SELECT indoption FROM pg_index"), 30) == []
        # the lookup's own OID arrays are oid[], which asyncpg reads itself
        assert await conn.fetchval(
            "SELECT array_agg(oid ORDER BY oid) FROM pg_type WHERE typname IN "
            "('_int8', 'int8')") == [20, 1016]
        # the array types' rows as PostgreSQL 15 has them
        rows = await conn.fetch(
            "SELECT typname, typelem, typcategory, typdelim, typalign, typinput, typoutput "
            "FROM pg_type WHERE typname IN ('_int4', '_int8', '_interval', '_text') "
            "ORDER BY typname")
        assert [tuple(r) for r in rows] == [
            ("_int4", 23, "A", ",", "i", "array_in", "array_out"),
            ("_int8", 20, "A", ",", "d", "array_in", "array_out"),
            ("_interval", 1186, "A", ",", "d", "array_in", "array_out"),
            ("_text", 25, "A", ",", "i", "array_in", "array_out")]

    run(srv, body)

"""SQLAlchemy 2 (psycopg and pg8000) and pandas against the server, as users run them: the
first connection's questions, reflection through pg_catalog (filtered by the grants),
read_sql / to_sql, and the analytical engine's transaction blocks of queries."""

from __future__ import annotations

import ssl

import pandas as pd
import pg8000.native
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from cryptdisk.server._paramtypes import sqlite_casts
from cryptdisk.server._sqltext import drop_casts
from tests.server.test_grants import admin_and_bob

ENGINES = ["analytical", "sqlite_engine"]
DRIVERS = ["psycopg", "pg8000"]
SETUP = ["CREATE TABLE open_t (a BIGINT, b VARCHAR, p DECIMAL(10,2))",
         "CREATE TABLE secret (s VARCHAR, hidden_column BIGINT)",
         "INSERT INTO open_t VALUES (1, 'x', 1.5), (2, 'y', 2.25)",
         "INSERT INTO secret VALUES ('hidden', 7)"]


def make_engine(srv, driver: str, user: str = "u", password: str = "pw",
                **options) -> sa.Engine:
    ca = srv.dsn["sslrootcert"]
    if driver == "psycopg":
        return sa.create_engine(f"postgresql+psycopg://{user}:{password}@localhost:{srv.port}"
                                f"/db?sslmode=verify-full&sslrootcert={ca}", **options)
    return sa.create_engine(f"postgresql+pg8000://{user}:{password}@localhost:{srv.port}/db",
                            connect_args={"ssl_context": ssl.create_default_context(cafile=ca)},
                            **options)


def setup(srv) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for st in SETUP:
            c.execute(st)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("engine", ENGINES)
def test_sqlalchemy_reflects_and_reads(start_server, request, engine, driver) -> None:
    srv = start_server(request.getfixturevalue(engine))
    setup(srv)
    eng = make_engine(srv, driver)  # SQLAlchemy's defaults: a transaction on every connection
    try:
        insp = sa.inspect(eng)
        assert insp.get_table_names() == ["open_t", "secret"]
        assert insp.has_table("open_t") and not insp.has_table("nope")
        assert insp.get_schema_names() == ["information_schema", "public"]
        columns = {c["name"]: c for c in insp.get_columns("open_t")}
        assert list(columns) == ["a", "b", "p"]
        assert isinstance(columns["a"]["type"], sa.BigInteger)
        assert isinstance(columns["p"]["type"], sa.Numeric)
        assert (columns["p"]["type"].precision, columns["p"]["type"].scale) == (10, 2)
        assert insp.get_pk_constraint("open_t")["constrained_columns"] == []
        assert insp.get_foreign_keys("open_t") == [] and insp.get_indexes("open_t") == []
        table = sa.Table("open_t", sa.MetaData(), autoload_with=eng)
        with eng.connect() as c:
            assert c.execute(sa.select(table.c.a).order_by(table.c.a)).scalars().all() == [1, 2]
            assert c.execute(sa.text("select pg_catalog.version()")).scalar().startswith(
                "PostgreSQL 15")
        frame = pd.read_sql_table("open_t", eng)
        assert frame["a"].tolist() == [1, 2] and frame["b"].tolist() == ["x", "y"]
        frame = pd.read_sql_query(sa.text("SELECT a FROM public.open_t WHERE a > :n"), eng,
                                  params={"n": 1})
        assert frame["a"].tolist() == [2]
    finally:
        eng.dispose()


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("engine", ENGINES)
def test_pandas_to_sql_appends(start_server, request, engine, driver) -> None:
    srv = start_server(request.getfixturevalue(engine))
    setup(srv)
    # the analytical engine cannot undo a write: it writes in autocommit mode
    options = {"isolation_level": "AUTOCOMMIT"} if engine == "analytical" else {}
    eng = make_engine(srv, driver, **options)
    try:
        frame = pd.DataFrame({"a": [10, 11], "b": ["p", "q"]})
        frame.to_sql("open_t", eng, if_exists="append", index=False)
        frame.assign(a=[12, 13]).to_sql("open_t", eng, if_exists="append", index=False,
                                        method="multi")
        with eng.connect() as c:
            assert c.execute(sa.text("SELECT a FROM open_t ORDER BY a")).scalars().all() == \
                [1, 2, 10, 11, 12, 13]
    finally:
        eng.dispose()


def test_sqlalchemy_orm_on_sqlite(start_server, sqlite_engine) -> None:
    class Base(DeclarativeBase):
        pass

    class Item(Base):
        __tablename__ = "item"
        id: Mapped[int] = mapped_column(primary_key=True)
        name: Mapped[str]

    srv = start_server(sqlite_engine)
    eng = make_engine(srv, "psycopg")
    try:
        Base.metadata.create_all(eng)  # (reflection first: has_table)
        with Session(eng) as s:  # INSERTs with $1::INTEGER casts, in a transaction
            s.add_all([Item(id=i, name=f"n{i}") for i in range(3)])
            s.commit()
            item = s.get(Item, 2)
            assert item is not None and item.name == "n2"
            item.name = "two"
            s.commit()
        with eng.connect() as c:
            assert c.execute(sa.text("SELECT name FROM item ORDER BY id")).scalars().all() == \
                ["n0", "n1", "two"]
    finally:
        eng.dispose()


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("engine", ENGINES)
def test_catalog_shows_only_what_the_user_may_read(start_server, request, engine,
                                                  driver) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with admin_and_bob(srv, [*SETUP, "GRANT SELECT ON open_t TO bob"]) as bob:
        assert bob.execute("SELECT relname FROM pg_catalog.pg_class ORDER BY 1").fetchall() \
            == [("open_t",)]
        assert bob.execute("SELECT count(*) FROM pg_attribute WHERE attname = "
                           "'hidden_column'").fetchone() == (0,)
        # pg_catalog's tables live in a database of their own: the engine's are not there
        with pytest.raises(psycopg.errors.UndefinedTable):
            bob.execute("SELECT * FROM pg_catalog.pg_class, secret")
        with pytest.raises(psycopg.errors.UndefinedTable):
            bob.execute("SELECT * FROM pg_catalog.pg_class, public.secret")
    eng = make_engine(srv, driver, user="bob", password="bob pw")
    try:
        insp = sa.inspect(eng)
        assert insp.get_table_names() == ["open_t"]
        assert not insp.has_table("secret")
        with pytest.raises(sa.exc.NoSuchTableError):
            insp.get_columns("secret")
        with pytest.raises(sa.exc.NoSuchTableError):
            sa.Table("secret", sa.MetaData(), autoload_with=eng)
        assert pd.read_sql_table("open_t", eng)["a"].tolist() == [1, 2]
        with pytest.raises(pd.errors.DatabaseError, match="permission denied"):
            pd.read_sql_query("SELECT * FROM public.secret", eng)
    finally:
        eng.dispose()


@pytest.mark.parametrize("engine", ENGINES)
def test_session_functions_and_settings(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        row = c.execute("SELECT pg_catalog.version(), current_schema(), current_database() "
                        "AS db").fetchone()
        assert row[0].startswith("PostgreSQL 15.0") and row[1:] == ("public", "db")
        assert c.execute("SHOW standard_conforming_strings").fetchone() == ("on",)
        level = "serializable" if engine == "sqlite_engine" else "read committed"
        assert c.execute("SHOW TRANSACTION ISOLATION LEVEL").fetchone() == (level,)
        assert c.execute("SHOW search_path").fetchone() == ('"$user", public',)
        assert c.execute("SELECT typname FROM pg_type WHERE oid = to_regtype(%s)",
                         ("int8",)).fetchall() == [("int8",)]
        assert c.execute("SELECT typname FROM pg_type WHERE oid = to_regtype(%s)",
                         ("hstore",)).fetchall() == []  # psycopg's TypeInfo: no hstore
    con = pg8000.native.Connection(srv.dsn["user"], host="localhost", port=srv.port,
                                   password=srv.dsn["password"],
                                   ssl_context=ssl.create_default_context(
                                       cafile=srv.dsn["sslrootcert"]))
    try:  # (a prepared statement: Describe, then Execute)
        assert con.run("select current_schema()") == [["public"]]
        assert con.run("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                       "WHERE attname = :n", n="nothing") == []
    finally:
        con.close()


def test_analytical_transaction_blocks_hold_queries(start_server, analytical) -> None:
    srv = start_server(analytical)
    setup(srv)
    with psycopg.connect(**srv.dsn) as c:  # psycopg opens a transaction before the first
        assert c.execute("SELECT count(*) FROM open_t").fetchone() == (2,)
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        c.commit()
        with c.cursor("big", scrollable=False) as cur:  # a cursor without WITH HOLD
            cur.execute("SELECT a FROM open_t ORDER BY a")
            assert cur.fetchall() == [(1,), (2,)]
        c.rollback()
        c.execute("SELECT 1")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="holds queries only"):
            c.execute("INSERT INTO open_t VALUES (3, 'z', 0)")
        assert c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            c.execute("SELECT 1")
        c.rollback()
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            with c.cursor().copy("COPY open_t FROM STDIN") as copy:
                copy.write_row((4, "w", 0))
        c.rollback()
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            c.execute("CREATE TABLE t2 (a BIGINT)")
        c.rollback()
        with pytest.raises(psycopg.errors.SyntaxError):  # 42601 in a block too (was 0A000)
            c.execute("SELEC 1")
        c.rollback()
        with pytest.raises(psycopg.errors.SyntaxError):  # (it parses no further than that)
            c.execute("CREATE TABLE t2 (a BIGINT")
        c.rollback()
        c.autocommit = True
        c.execute("INSERT INTO open_t VALUES (3, 'z', 0)")
        assert c.execute("SELECT count(*) FROM open_t").fetchone() == (3,)
        c.execute("BEGIN")
        c.execute("SAVEPOINT s")
        c.execute("ROLLBACK TO SAVEPOINT s")
        c.execute("COMMIT")
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            c.execute("SAVEPOINT s")


@pytest.mark.parametrize("engine", ENGINES)
def test_transaction_read_only_and_user_statements_in_a_block(start_server, request,
                                                              engine) -> None:
    """An analytical block holds queries only: it says it is read-only, and refuses user,
    role and grant changes as it refuses writes; SQLite's blocks read and write."""
    srv = start_server(request.getfixturevalue(engine))
    setup(srv)
    analytical = engine == "analytical"
    with psycopg.connect(**srv.dsn) as c:  # psycopg opens a transaction before the first
        assert c.execute("SHOW transaction_read_only").fetchone() == \
            ("on" if analytical else "off",)
        assert [r[0] for r in c.execute("SELECT * FROM system.users")] == ["u"]
        c.execute("SET ROLE u")
        c.execute("RESET ROLE")
        for change in ("CREATE USER zed PASSWORD 'pw'", "CREATE ROLE readers",
                       "GRANT SELECT ON open_t TO u", "DROP USER IF EXISTS nobody"):
            if analytical:
                with pytest.raises(psycopg.errors.FeatureNotSupported,
                                   match="read-only") as info:
                    c.execute(change)
                assert "autocommit" in (info.value.diag.message_hint or "")
                assert c.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
                c.rollback()
            else:
                c.execute(change)
        c.commit()
        assert c.execute("SHOW transaction_read_only").fetchone() == \
            ("on" if analytical else "off",)
        c.rollback()
        c.autocommit = True
        assert c.execute("SHOW transaction_read_only").fetchone() == ("off",)
        users = {r[0] for r in c.execute("SELECT * FROM system.users")}
        assert users == ({"u"} if analytical else {"u", "zed"})
        c.execute("CREATE USER later PASSWORD 'pw'")  # in autocommit mode: applies


@pytest.mark.parametrize("engine", ENGINES)
def test_deallocate(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True, prepare_threshold=0) as c:
        c.prepared_max = 2  # psycopg DEALLOCATEs the oldest when it prepares a third
        for n in range(5):
            assert c.execute(f"SELECT {n} + %s", (1,)).fetchone() == (n + 1,)
        c.execute("DEALLOCATE ALL")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            c.execute("DEALLOCATE nope")


@pytest.mark.parametrize(("text", "expected"), [
    ("INSERT INTO t (a, b) VALUES ($1::BIGINT, $2::VARCHAR)", "INSERT INTO t (a, b) VALUES "
     "($1, $2)"),
    ("SELECT $1::TIMESTAMP WITHOUT TIME ZONE, $2::NUMERIC(10, 2), $3::INTEGER[]",
     "SELECT $1, $2, $3"),
    ("SELECT 'r'::VARCHAR, '1'::INTEGER, '2.5'::DOUBLE PRECISION",
     "SELECT 'r', cryptdisk_int('1', 4, 0), 2.5"),  # (read as PostgreSQL reads a float)
    ("SELECT a::int, '::x', \"q\"::text FROM t -- $1::int", "SELECT a::int, '::x', \"q\"::text "
     "FROM t -- $1::int"),
])
def test_drop_casts(text: str, expected: str) -> None:
    assert drop_casts(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("SELECT a::text, (a + 1)::int8, f(x)::real FROM t",
     "SELECT CAST(a AS TEXT), cryptdisk_int((a + 1), 8, 0), CAST(f(x) AS REAL) FROM t"),
    ("SELECT a::bigint::text, CASE WHEN c THEN 1 END::text",
     "SELECT CAST(cryptdisk_int(a, 8, 0) AS TEXT), CAST(CASE WHEN c THEN 1 END AS TEXT)"),
    # PostgreSQL's cast to an integer type (a numeric literal's halves away from zero)
    ("SELECT 2.5::int2, 7::int, 1e3::integer, -x::smallint",
     "SELECT cryptdisk_int(2.5, 2, 1), cryptdisk_int(7, 4, 0), cryptdisk_int(1e3, 4, 1), "
     "-cryptdisk_int(x, 2, 0)"),
    ("SELECT x::bytea, NULL::bytea", "SELECT CAST(x AS BLOB), CAST(NULL AS BLOB)"),
    # a type not known here, an array, a typed literal, quoted text: left alone
    ("SELECT 'x'::regclass, a::int[], date '2026-01-01'::text, '::x', \"q::r\" -- a::b",
     "SELECT 'x'::regclass, a::int[], date '2026-01-01'::text, '::x', \"q::r\" -- a::b"),
])
def test_sqlite_casts(text: str, expected: str) -> None:
    assert sqlite_casts(text) == expected


@pytest.mark.parametrize("text", [
    "SELECT d::date FROM t", "SELECT 5::bool", "SELECT (a + 1)::numeric(10, 2) FROM t",
    "SELECT f(x)::timestamp with time zone", "SELECT a::text::uuid FROM t",
    "SELECT CASE WHEN c THEN 1 END::json",
])
def test_sqlite_casts_refuse_a_type_sqlite_cannot_cast_to(text: str) -> None:
    """SQLite has no CAST to these types: dropping the cast answered with the operand as it
    was (a timestamp for ``x::date``, 5 for ``5::bool``), a wrong answer with no error."""
    from cryptdisk.server._paramtypes import CastRefused

    with pytest.raises(CastRefused):
        sqlite_casts(text)


def test_sqlite_casts_read_the_statement_once(monkeypatch) -> None:
    """A statement of many casts (a bulk INSERT of ``'...'::text, c::text`` rows) is read
    once: the text was read again for each cast, about 36 s of CPU for 1000 casts in a
    39 KB statement (2000 casts: minutes), on the server's thread, before the statement
    began (so no statement_timeout or cancel stopped it)."""
    from cryptdisk.server import _paramtypes

    reads = []
    real = _paramtypes._tokens
    monkeypatch.setattr(_paramtypes, "_tokens", lambda sql: reads.append(1) or real(sql))
    rows = ", ".join(f"({i}, '2026-01-01'::text, (c{i}::int + d::int)::text::varchar(5), "
                     f"x::int[], CASE WHEN c THEN 1 END::int)" for i in range(300))
    got = sqlite_casts(f"INSERT INTO t VALUES {rows}")
    assert len(reads) == 1
    assert got == "INSERT INTO t VALUES " + ", ".join(
        f"({i}, CAST('2026-01-01' AS TEXT), CAST(CAST((cryptdisk_int(c{i}, 4, 0) + "
        f"cryptdisk_int(d, 4, 0)) AS TEXT) AS TEXT), x::int[], "
        f"cryptdisk_int(CASE WHEN c THEN 1 END, 4, 0))" for i in range(300))


def test_sqlite_booleans_read_as_booleans(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE flags (b BOOLEAN, n INTEGER)")
        c.execute("INSERT INTO flags VALUES (%s, 1), (%s, 2), (true, 3), (false, 4), "
                  "(NULL, 5)", (True, False))
        expected = [(True,), (False,), (True,), (False,), (None,)]
        # SQLite holds 1 and 0: in text format they must be t and f (psycopg read 1 as False)
        assert c.execute("SELECT b FROM flags ORDER BY n").fetchall() == expected
        assert c.execute("SELECT b FROM flags ORDER BY n", binary=True).fetchall() == expected
        with c.cursor().copy("COPY flags (b) TO STDOUT") as copy:
            assert [r[0] for r in copy.rows()] == ["t", "f", "t", "f", None]
    con = pg8000.native.Connection(srv.dsn["user"], host="localhost", port=srv.port,
                                   password=srv.dsn["password"],
                                   ssl_context=ssl.create_default_context(
                                       cafile=srv.dsn["sslrootcert"]))
    try:
        assert con.run("SELECT b FROM flags WHERE n < :n ORDER BY n", n=3) == [[True], [False]]
    finally:
        con.close()


def test_analytical_insert_reports_its_rows(start_server, analytical) -> None:
    srv = start_server(analytical)
    setup(srv)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        cur = c.execute("INSERT INTO open_t VALUES (3, 'z', 0), (4, 'w', 0)")
        assert (cur.statusmessage, cur.rowcount) == ("INSERT 0 2", 2)
        assert c.execute("INSERT INTO public.open_t SELECT * FROM open_t WHERE a > 3"
                         ).rowcount == 1
        assert c.execute("INSERT INTO open_t SELECT * FROM open_t WHERE false").rowcount == 0
        cur = c.cursor()
        cur.executemany("INSERT INTO open_t (a) VALUES (%s)", [(10,), (11,), (12,)])
        assert cur.rowcount == 3
    eng = make_engine(srv, "pg8000", isolation_level="AUTOCOMMIT")
    try:
        assert pd.DataFrame({"a": [20, 21]}).to_sql("open_t", eng, if_exists="append",
                                                    index=False) == 2
    finally:
        eng.dispose()


def test_pg8000_counts_on_sqlite_are_numbers(start_server, sqlite_engine) -> None:
    """pg8000 reads a result by the types a Describe gave before the statement ran."""
    srv = start_server(sqlite_engine)
    setup(srv)
    con = pg8000.native.Connection(srv.dsn["user"], host="localhost", port=srv.port,
                                   password=srv.dsn["password"],
                                   ssl_context=ssl.create_default_context(
                                       cafile=srv.dsn["sslrootcert"]))
    try:
        assert con.run("SELECT count(*), avg(a), total(a), length(b), 1 FROM open_t "
                       "WHERE a = :a", a=1) == [[1, 1.0, 1.0, 1, 1]]
    finally:
        con.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_pg_catalog_functions_without_from(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        assert c.execute("SELECT pg_catalog.format_type(20, -1), pg_catalog.format_type("
                         "1700, 655366)").fetchone() == ("bigint", "numeric(10,2)")


#: (type oid, typmod, PostgreSQL 15's format_type), checked against PostgreSQL 15
FORMAT_TYPES = [(1266, -1, "time with time zone"), (1270, -1, "time with time zone[]"),
                (1083, -1, "time without time zone"), (1183, -1, "time without time zone[]"),
                (1184, -1, "timestamp with time zone"), (1007, -1, "integer[]"),
                (1015, -1, "character varying[]"), (1042, -1, "bpchar"),
                (1042, None, "character"), (1014, -1, "bpchar[]"), (25, -1, "text"),
                (22, -1, "int2vector"), (1266, None, "time with time zone"),
                (None, -1, None), (999999, -1, "???"),
                (1083, 3, "time(3) without time zone"), (1266, 3, "time(3) with time zone"),
                (1114, 0, "timestamp(0) without time zone"),
                (1270, 2, "time(2) with time zone[]"), (1231, 655366, "numeric(10,2)[]"),
                (1015, 14, "character varying(10)[]"), (1042, 14, "character(10)"),
                (1043, 3, "character varying"), (23, 5, "integer")]


@pytest.mark.parametrize("engine", ENGINES)
def test_format_type_names_types_as_postgresql(start_server, request, engine) -> None:
    """``format_type`` (qualified or not: DuckDB's own named types as DuckDB does, timetz
    for time with time zone) gives PostgreSQL 15's names, of the array types too, with a
    typmod's precision or length."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for qualifier in ("", "pg_catalog."):
            got = c.execute("SELECT " + ", ".join(
                f"{qualifier}format_type({'NULL' if t is None else t}, "
                f"{'NULL' if m is None else m})" for t, m, _ in FORMAT_TYPES)).fetchone()
            assert list(got) == [name for _, _, name in FORMAT_TYPES], qualifier


@pytest.mark.parametrize("engine", ENGINES)
def test_current_setting_of_a_session_setting(start_server, request, engine) -> None:
    """``SELECT current_setting('server_version_num')`` (how JDBC tools and ORMs read the
    version) answers as SHOW does, on both engines (DuckDB knew no such parameter, SQLite
    no such function); with a cast to integer it is an int4, as drivers read it."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        assert c.execute("SELECT current_setting('server_version_num')").fetchone() == \
            ("150000",)
        cur = c.execute("SELECT current_setting('server_version_num')::integer AS v, "
                        "pg_catalog.current_setting('search_path', true), version()")
        row = cur.fetchone()
        assert row[:2] == (150000, '"$user", public') and row[2].startswith("PostgreSQL")
        assert [d.name for d in cur.description][:2] == ["v", "current_setting"]
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            c.execute("SELECT current_setting('server_encoding')::int")
        assert c.execute("SELECT current_setting('server_version_num')", prepare=True
                         ).fetchone() == ("150000",)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_name_cast_to_regclass_or_regtype_is_its_oid(start_server, request, engine) -> None:
    """``'t'::regclass`` (DBeaver's and psql's way to name a relation in a catalog query)
    is the relation's OID, as in PostgreSQL, not a failed cast of the text to a number."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE reg_t (a INTEGER, b TEXT)")
        assert c.execute("SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = "
                         "'reg_t'::regclass AND attnum > 0 ORDER BY attnum").fetchall() == \
            [("a",), ("b",)]
        assert c.execute("SELECT count(*) FROM pg_attribute WHERE attrelid = "
                         "'public.reg_t'::pg_catalog.regclass").fetchone() == (2,)
        assert c.execute("SELECT typname FROM pg_type WHERE oid = 'int8'::regtype"
                         ).fetchone() == ("int8",)


def test_sqlite_declared_types_read_alike_by_describe_and_by_execution(start_server,
                                                                       sqlite_engine) -> None:
    """pg8000 reads a result by the types a Describe gave before the statement ran,
    psycopg by the RowDescription of its execution (text and binary): on SQLite both are
    the column's declared type, whatever the values, so both read the same Python values."""
    import datetime as dt
    import decimal

    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE typed (p DECIMAL(10,2), n NUMERIC, d DATE, ts TIMESTAMP, "
                  "tz TIMESTAMPTZ, b BOOLEAN, r REAL, t TEXT, x BLOB, i INTEGER)")
        c.execute("INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                  (decimal.Decimal("1.25"), 3, dt.date(2024, 2, 29),
                   dt.datetime(2024, 2, 29, 13, 14, 15, 16),
                   dt.datetime(2024, 2, 29, 13, 14, 15, tzinfo=dt.UTC), True, 0.5, "x",
                   b"\x00\xff", 7))
        c.execute("INSERT INTO typed VALUES (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                  "NULL, NULL)")
    expected = [decimal.Decimal("1.25"), decimal.Decimal(3), dt.date(2024, 2, 29),
                dt.datetime(2024, 2, 29, 13, 14, 15, 16),
                dt.datetime(2024, 2, 29, 13, 14, 15, tzinfo=dt.UTC), True, 0.5, "x",
                b"\x00\xff", 7]
    oids = [1700, 1700, 1082, 1114, 1184, 16, 701, 25, 17, 20]
    query = "SELECT p, n, d, ts, tz, b, r, t, x, i FROM typed ORDER BY i"
    con = pg8000.native.Connection(srv.dsn["user"], host="localhost", port=srv.port,
                                   password=srv.dsn["password"],
                                   ssl_context=ssl.create_default_context(
                                       cafile=srv.dsn["sslrootcert"]))
    try:
        rows = con.run(query)
        assert [c["type_oid"] for c in con.columns] == oids
        assert rows == [expected, [None] * 10]  # (NULL last, as in PostgreSQL)
        assert con.run("SELECT d, p FROM typed WHERE i = :i", i=7) == [[expected[2],
                                                                         expected[0]]]
    finally:
        con.close()
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for binary in (False, True):
            cur = c.cursor(binary=binary)
            assert cur.execute(query).fetchall() == [tuple(expected), (None,) * 10]
            assert [d.type_code for d in cur.description] == oids
            cur.execute(query, prepare=True)  # Parse, Describe, Execute
            assert cur.fetchall() == [tuple(expected), (None,) * 10]
            assert [d.type_code for d in cur.description] == oids
    # a value its declared type cannot read is a clear error, not a garbled one
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("INSERT INTO typed (d, i) VALUES ('not a date', 8)")
        with pytest.raises(psycopg.errors.InvalidDatetimeFormat, match="not a date"):
            c.execute("SELECT d FROM typed WHERE i = 8").fetchall()


def test_sqlite_bytea_column_is_bytea(start_server, sqlite_engine) -> None:
    """A column declared with PostgreSQL's name ``BYTEA`` (SQLAlchemy's ``LargeBinary`` and
    pandas' ``to_sql`` of bytes write it so) is bytea, as ``BLOB`` is: its values come back
    as bytes, not as their text form ``\\x00ff``, in text and binary, and the catalogs say so."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE files (name TEXT, body BYTEA)")
        c.execute("INSERT INTO files VALUES (%s, %s)", ("a", b"\x00\xff"))
        c.execute("INSERT INTO files VALUES (%s, %b)", ("b", b"\x01"))
        for binary in (False, True):
            cur = c.cursor(binary=binary)
            assert cur.execute("SELECT body FROM files ORDER BY name").fetchall() == \
                [(b"\x00\xff",), (b"\x01",)]
            assert cur.description[0].type_code == 17
        assert c.execute("SELECT data_type FROM information_schema.columns "
                         "WHERE table_name = 'files' AND column_name = 'body'"
                         ).fetchall() == [("bytea",)]
        assert c.execute("SELECT name FROM files WHERE body = %s", (b"\x01",)).fetchall() \
            == [("b",)]

"""Real PostgreSQL client libraries (SQLAlchemy over psycopg and pg8000, pandas, psql) used
as their users use them, on both engines: what each of them sends is answered."""

from __future__ import annotations

import datetime as dt
import ssl
import struct

import pandas as pd
import pg8000.native
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.automap import automap_base
from sqlalchemy.orm import Session

from cryptdisk.errors import ProtocolError
from cryptdisk.server import _pgtables
from cryptdisk.server._sqltext import quote_index_names
from cryptdisk.server._types import PgArray, decode_param, encode_value
from tests.server.test_grants import admin_and_bob
from tests.server.test_orm_clients import DRIVERS, make_engine
from tests.server.test_psql_catalog import psql


def pg8000_connect(srv) -> pg8000.native.Connection:
    return pg8000.native.Connection(srv.dsn["user"], host="localhost", port=srv.port,
                                    password=srv.dsn["password"],
                                    ssl_context=ssl.create_default_context(
                                        cafile=srv.dsn["sslrootcert"]))


@pytest.mark.parametrize("driver", DRIVERS)
def test_sqlite_reflection_of_a_column_with_a_default(start_server, sqlite_engine,
                                                      driver) -> None:
    """SQLAlchemy's constraint and index queries read pg_attribute without pg_attrdef."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER, b TEXT NOT NULL, p NUMERIC(10,2) DEFAULT 0)")
    eng = make_engine(srv, driver)
    try:
        insp = sa.inspect(eng)
        assert [(c["name"], c["nullable"], c["default"]) for c in insp.get_columns("t")] == \
            [("a", True, None), ("b", False, None), ("p", True, "0")]
        assert insp.get_pk_constraint("t")["constrained_columns"] == []
        assert insp.get_indexes("t") == [] and insp.get_unique_constraints("t") == []
        table = sa.Table("t", sa.MetaData(), autoload_with=eng)
        with eng.begin() as c:
            c.execute(table.insert(), {"a": 1, "b": "x"})  # p: its default
            c.execute(table.insert(), [{"a": 2, "b": "y", "p": 1}, {"a": 3, "b": "z", "p": 2}])
            assert c.execute(sa.select(table.c.a, table.c.p).order_by(table.c.a)).all() == \
                [(1, 0), (2, 1), (3, 2)]
    finally:
        eng.dispose()


def test_an_internal_error_in_describe_keeps_the_connection(start_server, sqlite_engine,
                                                            monkeypatch) -> None:
    """A bug met while describing a statement is an ErrorResponse (XX000), not a dropped
    connection: the client goes on with its session."""
    def broken(*args, **kwargs):
        raise KeyError("bug")

    srv = start_server(sqlite_engine)
    monkeypatch.setattr(_pgtables, "query", broken)
    con = pg8000_connect(srv)
    try:
        with pytest.raises(pg8000.native.DatabaseError) as caught:
            con.prepare("SELECT relname FROM pg_catalog.pg_class")  # Parse, Describe
        assert caught.value.args[0]["C"] == "XX000"
        assert "internal error: KeyError" in caught.value.args[0]["M"]
        assert con.run("SELECT 1") == [[1]]
    finally:
        con.close()


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_psycopg_time_parameters(start_server, request, engine) -> None:
    """psycopg sends a datetime.time in binary (time, or timetz when it has a zone)."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE times (n INTEGER, t TIME)")
        c.execute("INSERT INTO times VALUES (1, %s), (2, %s)",
                  (dt.time(1, 2, 3), dt.time(23, 59, 59, 250000)))
        assert c.execute("SELECT t FROM times WHERE t > %s ORDER BY n",
                         (dt.time(1, 2, 3),)).fetchall() == [(dt.time(23, 59, 59, 250000),)]
        assert c.execute("SELECT count(*) FROM times WHERE t = %s",
                         (dt.time(1, 2, 3),)).fetchone() == (1,)
        if engine == "analytical":  # (SQLite has no time zones)
            zone = dt.timezone(dt.timedelta(hours=-5, minutes=-30))
            assert c.execute("SELECT CAST(%s AS VARCHAR)", (dt.time(4, 5, 6, tzinfo=zone),)
                             ).fetchone() == ("04:05:06-05:30",)


@pytest.mark.parametrize("oid, data, text", [
    (1083, struct.pack("!q", 3_723_000_001), "01:02:03.000001"),
    (1083, struct.pack("!q", 0), "00:00:00"),
    (1266, struct.pack("!qi", 3_723_500_000, -7200), "01:02:03.5+02:00"),
    (1266, struct.pack("!qi", 0, 19_800 + 30), "00:00:00-05:30:30"),
])
def test_binary_time_parameters_read_as_text(oid, data, text) -> None:
    assert decode_param(oid, data, 1) == text


@pytest.mark.parametrize("oid, data", [(1083, b"\0" * 4), (1266, b"\0" * 8),
                                       (1083, struct.pack("!q", -1))])
def test_malformed_binary_time_parameters(oid, data) -> None:
    with pytest.raises(ProtocolError):
        decode_param(oid, data, 1)


def _oid_array(items: list[int | None]) -> bytes:
    head = struct.pack("!iiIii", 1, None in items, 26, len(items), 1)
    return head + b"".join(struct.pack("!i", -1) if i is None else struct.pack("!iI", 4, i)
                           for i in items)


def test_oid_array_parameters() -> None:
    """oid[] (asyncpg's type lookup's $1::oid[]) in binary and text; malformed ones refused."""
    assert decode_param(1028, _oid_array([1016, None, 4294967295]), 1) == [1016, None, 4294967295]
    assert decode_param(1028, struct.pack("!iiI", 0, 0, 26), 1) == []
    assert decode_param(1028, b"{1016, 25,NULL}", 0) == [1016, 25, None]
    assert decode_param(1028, b"{}", 0) == []
    for data, fmt in [(_oid_array([1])[:-2], 1), (_oid_array([1]) + b"x", 1),
                      (struct.pack("!iiIii", 1, 0, 20, 0, 1), 1), (b"1,2", 0), (b"{a}", 0)]:
        with pytest.raises(ProtocolError):
            decode_param(1028, data, fmt)


@pytest.mark.parametrize("driver", DRIVERS)
def test_analytical_insert_returning_is_refused(start_server, analytical, driver) -> None:
    """An INSERT cannot return its rows on the analytical engine: refused (0A000, nothing
    inserted), not an INSERT that returns no rows or a binder error."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE r (a BIGINT, b VARCHAR)")
        cur = c.cursor()
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="RETURNING"):
            cur.executemany("INSERT INTO r VALUES (%s, %s) RETURNING a", [(1, "x"), (2, "y")],
                            returning=True)
    eng = make_engine(srv, driver, isolation_level="AUTOCOMMIT")
    try:
        table = sa.Table("r", sa.MetaData(), autoload_with=eng)
        with eng.connect() as c:
            with pytest.raises(sa.exc.DBAPIError, match=r"RETURNING is not supported"):
                c.execute(table.insert().returning(table.c.a), [{"a": 3, "b": "z"}])
            assert c.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0
    finally:
        eng.dispose()


@pytest.mark.parametrize("driver", DRIVERS)
def test_pandas_to_sql_with_its_index_on_sqlite(start_server, sqlite_engine, driver) -> None:
    """pandas names its index column ``index`` and indexes it; PostgreSQL does not reserve
    the word, so SQLAlchemy leaves it bare, and SQLite reads it as its keyword."""
    srv = start_server(sqlite_engine)
    eng = make_engine(srv, driver)
    try:
        frame = pd.DataFrame({"v": [1.5, 2.5]}, index=[10, 20])
        frame.to_sql("f", eng)  # CREATE TABLE f (index BIGINT, ...), CREATE INDEX ... (index)
        frame.to_sql("f", eng, if_exists="append")
        frame.to_sql("g", eng, if_exists="replace")
        back = pd.read_sql_table("f", eng, index_col="index")
        assert back.index.tolist() == [10, 20, 10, 20] and back["v"].tolist() == [1.5, 2.5] * 2
        with eng.connect() as c:
            assert c.execute(sa.text("SELECT g.index FROM g WHERE index > :n"),
                             {"n": 10}).scalars().all() == [20]
            assert c.execute(sa.text("SELECT 'index', \"index\" FROM g WHERE index = 10")
                             ).all() == [("index", 10)]
    finally:
        eng.dispose()


def test_analytical_create_index_is_refused_clearly(start_server, analytical) -> None:
    srv = start_server(analytical)
    eng = make_engine(srv, "psycopg", isolation_level="AUTOCOMMIT")
    try:
        with pytest.raises(sa.exc.NotSupportedError, match="CREATE INDEX is not supported") \
                as caught:
            pd.DataFrame({"v": [1.5]}).to_sql("f", eng, if_exists="replace")
        assert "index=False" in caught.value.orig.diag.message_hint
        pd.DataFrame({"v": [1.5]}).to_sql("f", eng, if_exists="replace", index=False)
        assert pd.read_sql_table("f", eng)["v"].tolist() == [1.5]
    finally:
        eng.dispose()


@pytest.mark.parametrize("sql, expected", [
    ("CREATE TABLE t (index BIGINT, x TEXT)", 'CREATE TABLE t ("index" BIGINT, x TEXT)'),
    ("CREATE INDEX ix_t_index ON t (index)", 'CREATE INDEX ix_t_index ON t ("index")'),
    ("create unique index if not exists ix on t(Index)",
     'create unique index if not exists ix on t("index")'),
    ("DROP INDEX ix_t_index", "DROP INDEX ix_t_index"),
    ("SELECT t.index, 'index', \"index\" FROM t -- index",
     "SELECT t.\"index\", 'index', \"index\" FROM t -- index"),
    ("SELECT reindex, indexes FROM t", "SELECT reindex, indexes FROM t"),
])
def test_quote_index_names(sql, expected) -> None:
    assert quote_index_names(sql) == expected


KEYS_SETUP = [
    "CREATE TABLE parent (id INTEGER PRIMARY KEY, code TEXT UNIQUE, x INT, y INT, "
    "UNIQUE (x, y))",
    "CREATE TABLE child (id INTEGER, pid INTEGER REFERENCES parent(id) ON DELETE CASCADE, "
    "code TEXT, PRIMARY KEY (id, code), FOREIGN KEY (code) REFERENCES parent(code))",
    "CREATE INDEX child_pid ON child (pid) WHERE pid > 0",
    "CREATE UNIQUE INDEX child_u ON child (code, pid)",
    "CREATE INDEX child_expr ON child (lower(code))",  # (an expression: not listed)
    "CREATE TABLE hidden (id INTEGER PRIMARY KEY)",
    "CREATE TABLE shown (h INTEGER REFERENCES hidden(id), p INTEGER REFERENCES parent)",
]


@pytest.mark.parametrize("driver", DRIVERS)
def test_sqlalchemy_reflects_sqlite_keys_and_indexes(start_server, sqlite_engine,
                                                     driver) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for st in KEYS_SETUP:
            c.execute(st)
    eng = make_engine(srv, driver)
    try:
        insp = sa.inspect(eng)
        assert insp.get_pk_constraint("parent") == {
            "constrained_columns": ["id"], "name": "parent_pkey", "comment": None,
            "dialect_options": {"postgresql_include": []}}
        assert insp.get_pk_constraint("child")["constrained_columns"] == ["id", "code"]
        assert [(u["name"], u["column_names"]) for u in insp.get_unique_constraints(
            "parent")] == [("parent_code_key", ["code"]), ("parent_x_y_key", ["x", "y"])]
        indexes = {i["name"]: i for i in insp.get_indexes("child")}
        assert list(indexes) == ["child_pid", "child_u"]
        assert (indexes["child_pid"]["unique"], indexes["child_pid"]["column_names"]) == \
            (False, ["pid"])
        assert indexes["child_pid"]["dialect_options"]["postgresql_where"] == "pid > 0"
        assert (indexes["child_u"]["unique"], indexes["child_u"]["column_names"]) == \
            (True, ["code", "pid"])
        fks = {f["name"]: f for f in insp.get_foreign_keys("child")}
        assert (fks["child_pid_fkey"]["referred_table"], fks["child_pid_fkey"]["referred_columns"],
                fks["child_pid_fkey"]["options"]) == ("parent", ["id"], {"ondelete": "CASCADE"})
        assert (fks["child_code_fkey"]["constrained_columns"],
                fks["child_code_fkey"]["referred_columns"]) == (["code"], ["code"])
        # REFERENCES parent without columns: its primary key
        assert [(f["referred_table"], f["referred_columns"])
                for f in insp.get_foreign_keys("shown")] == [("hidden", ["id"]),
                                                             ("parent", ["id"])]
        # a reflected table has its primary key: the ORM maps it, Session.get finds rows
        metadata = sa.MetaData()
        metadata.reflect(eng, only=["parent", "child"])
        child = metadata.tables["child"]
        assert [c.name for c in child.primary_key] == ["id", "code"]
        assert {fk.target_fullname for fk in child.foreign_keys} == {"parent.id",
                                                                     "parent.code"}
        with eng.begin() as c:
            c.execute(metadata.tables["parent"].insert(), [{"id": 1, "code": "a"}])
        Base = automap_base(metadata=metadata)
        Base.prepare()
        with Session(eng) as s:
            assert s.get(Base.classes.parent, 1).code == "a"
    finally:
        eng.dispose()


def test_keys_and_indexes_only_of_tables_the_user_may_read(start_server,
                                                           sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with admin_and_bob(srv, [*KEYS_SETUP, "GRANT SELECT ON shown TO bob",
                             "GRANT SELECT ON parent TO bob"]) as bob:
        rows = bob.execute("SELECT c.relname, i.indisprimary FROM pg_catalog.pg_index i "
                           "JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid "
                           "ORDER BY 1").fetchall()
        assert rows == [("parent_code_key", False), ("parent_pkey", True),
                        ("parent_x_y_key", False)]
        # shown's key to hidden names a table bob may not read: not listed
        assert bob.execute("SELECT conname, pg_catalog.pg_get_constraintdef(oid) "
                           "FROM pg_catalog.pg_constraint WHERE contype = 'f'").fetchall() \
            == [("shown_p_fkey", "FOREIGN KEY (p) REFERENCES parent(id)")]
    eng = make_engine(srv, "psycopg", user="bob", password="bob pw")
    try:
        insp = sa.inspect(eng)
        assert [f["referred_table"] for f in insp.get_foreign_keys("shown")] == ["parent"]
        with pytest.raises(sa.exc.NoSuchTableError):
            insp.get_indexes("child")
    finally:
        eng.dispose()


def test_catalog_arrays_are_postgresql_arrays() -> None:
    values = PgArray(["a", "b c", None, 'x"y', "null", "", "back\\slash"], 25)
    assert encode_value(1009, values, 0) == \
        b'{a,"b c",NULL,"x\\"y","null","","back\\\\slash"}'
    assert encode_value(1005, PgArray([1, 2], 21), 1) == struct.pack(
        "!iiIiiihih", 1, 0, 21, 2, 1, 2, 1, 2, 2)
    assert encode_value(1005, PgArray([], 21), 1) == struct.pack("!iiI", 0, 0, 21)
    assert encode_value(1005, PgArray([], 21), 0) == b"{}"


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_psql_copy_with_the_old_option_syntax(start_server, request, engine, certs,
                                              tmp_path) -> None:
    """psql's \\copy passes its options on as written: users write CSV HEADER."""
    srv = start_server(request.getfixturevalue(engine))
    (tmp_path / "in.csv").write_text("a;b\n1;x\n2;\n")
    out = psql(srv, certs, "CREATE TABLE c (a BIGINT, b VARCHAR)",
               f"\\copy c FROM '{tmp_path / 'in.csv'}' WITH CSV HEADER DELIMITER AS ';'",
               f"\\copy c TO '{tmp_path / 'out.csv'}' csv header",
               f"\\copy (SELECT a, b FROM c ORDER BY a) TO '{tmp_path / 'out.txt'}' "
               "DELIMITER ',' NULL 'none'")
    assert out.returncode == 0, out.stderr
    assert sorted((tmp_path / "out.csv").read_text().splitlines()) == ["1,x", "2,", "a,b"]
    assert (tmp_path / "out.txt").read_text() == "1,x\n2,none\n"
    refused = psql(srv, certs, f"\\copy c TO '{tmp_path / 'q.csv'}' CSV FORCE QUOTE *")
    assert "COPY option FORCE is not supported" in refused.stderr


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_sqlalchemy_isolation_level_on_pg8000(start_server, request, engine) -> None:
    """SQLAlchemy's isolation_level and postgresql_readonly on pg8000 send SET SESSION
    CHARACTERISTICS AS TRANSACTION ...: a transaction's options, ignored as BEGIN's are."""
    srv = start_server(request.getfixturevalue(engine))
    for level in ("SERIALIZABLE", "REPEATABLE READ", "READ COMMITTED"):
        eng = make_engine(srv, "pg8000", isolation_level=level)
        try:
            with eng.connect() as c:
                assert c.execute(sa.text("SELECT 1")).scalar() == 1
            with eng.connect().execution_options(postgresql_readonly=True) as c:
                assert c.execute(sa.text("SELECT 2")).scalar() == 2
        finally:
            eng.dispose()


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_the_settings_set_to_the_servers_value_are_shown(start_server, request,
                                                          engine) -> None:
    """SHOW and current_setting answer each setting a client may SET only to the server's
    value, as PostgreSQL 15 does (bytea_output failed: 42P01 on the analytical engine,
    42704 on SQLite)."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        for name, value in (("bytea_output", "hex"), ("client_encoding", "UTF8"),
                            ("DateStyle", "ISO, MDY"), ("IntervalStyle", "postgres"),
                            ("standard_conforming_strings", "on")):
            c.execute(f"SET {name} = '{value}'")
            cur = c.execute(f"SHOW {name}")
            assert (cur.description[0].name, cur.fetchall()) == (name, [(value,)])
            assert c.execute(f"SELECT current_setting('{name}')").fetchall() == [(value,)]


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_session_settings_clients_set(start_server, request, engine) -> None:
    """SET of the settings JDBC drivers and BI tools send: application_name and the like
    taken; a value the server cannot have refused clearly (0A000)."""
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("SET application_name = 'report tool'")
        assert c.execute("SHOW application_name").fetchone() == ("report tool",)
        assert c.info.parameter_status("application_name") == "report tool"
        for st in ("SET extra_float_digits = 3", "SET client_min_messages TO warning",
                   "SET datestyle = 'ISO, MDY'", "SET client_encoding TO 'UTF-8'",
                   "SET standard_conforming_strings = on", "SET bytea_output = 'hex'",
                   "SET intervalstyle = postgres", "RESET extra_float_digits",
                   "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
                   "SET TRANSACTION READ ONLY"):
            assert c.execute(st).statusmessage in ("SET", "RESET"), st
        c.execute("RESET application_name")
        assert c.execute("SHOW application_name").fetchone() == ("",)
        for st in ("SET bytea_output = escape", "SET client_encoding = 'LATIN1'",
                   "SET datestyle = 'SQL, DMY'", "SET IntervalStyle = 'iso_8601'",
                   "SET intervalstyle TO SQL_STANDARD"):
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="only"):
                c.execute(st)
        # a value PostgreSQL 15 does not take: its 22023, message and hint
        for st, value, hint in (
                ("SET IntervalStyle = 'bogus'", '"intervalstyle": "bogus"',
                 "postgres, postgres_verbose, sql_standard, iso_8601"),
                ("SET intervalstyle TO ''", '"intervalstyle": ""', "postgres, postgres_"),
                ("SET bytea_output = base64", '"bytea_output": "base64"', "escape, hex")):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                c.execute(st)
            assert err.value.diag.message_primary == f"invalid value for parameter {value}"
            assert f"Available values: {hint}" in (err.value.diag.message_hint or "")
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="only one argument"):
            c.execute("SET IntervalStyle = postgres, iso_8601")
        if engine == "sqlite_engine":  # (the analytical engine's DuckDB takes its own)
            c.execute("SET TIME ZONE 'UTC'")
            c.execute("SET search_path = '$user', public")
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="'UTC' only"):
                c.execute("SET TIME ZONE 'Europe/Berlin'")
        c.execute("SET application_name = 'x'", prepare=True)  # (the extended protocol)
        assert c.execute("SHOW application_name").fetchone() == ("x",)
        with pytest.raises(psycopg.errors.SyntaxError):  # as PostgreSQL: no parameters
            c.execute("SET application_name = %s", ("bound",))


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_what_clients_send_that_the_server_refuses_clearly(start_server, request,
                                                            engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE n (a BIGINT)")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="array parameters"):
            c.execute("SELECT a FROM n WHERE a = ANY(%s)", ([1, 2],))
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="array parameters"):
            c.execute("SELECT a FROM n WHERE a IN (%s) OR a = ANY(%s::bigint[])", (1, [1]))
        for st in ("LISTEN ch", "NOTIFY ch"):
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="notifications"):
                c.execute(st)
        assert c.execute("UNLISTEN *").statusmessage == "UNLISTEN"
        assert c.execute("SELECT count(*) FROM n").fetchone() == (0,)  # the session goes on


def test_command_tags_of_create_with_modifiers(start_server, sqlite_engine) -> None:
    """PostgreSQL's tag names what was created (psql prints it; drivers read it)."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE m (a INTEGER)")
        assert c.execute("CREATE UNIQUE INDEX m_a ON m (a)").statusmessage == "CREATE INDEX"
        assert c.execute("CREATE TEMP TABLE tm (a INTEGER)").statusmessage == "CREATE TABLE"


def test_psql_describe_lists_sqlite_indexes_and_foreign_keys(start_server, sqlite_engine,
                                                             certs) -> None:
    srv = start_server(sqlite_engine)
    with admin_and_bob(srv, [*KEYS_SETUP, "GRANT SELECT ON shown TO bob"]):
        pass
    out = psql(srv, certs, "\\d child", unaligned=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("Indexes:\n")[1].splitlines() == [
        '    "child_pkey" PRIMARY KEY, btree (id, code)',
        '    "child_pid" btree (pid) WHERE (pid > 0)',
        '    "child_u" UNIQUE, btree (code, pid)',
        "Foreign-key constraints:",
        '    "child_code_fkey" FOREIGN KEY (code) REFERENCES parent(code)',
        '    "child_pid_fkey" FOREIGN KEY (pid) REFERENCES parent(id) ON DELETE CASCADE',
        ""]
    out = psql(srv, certs, "\\d parent", unaligned=False)
    assert '"parent_code_key" UNIQUE CONSTRAINT, btree (code)' in out.stdout
    # bob may read shown, not hidden or parent: neither key of shown is listed to him
    out = psql(srv, certs, "\\d shown", user="bob", password="bob pw", unaligned=False)
    assert out.returncode == 0, out.stderr
    assert "Foreign-key" not in out.stdout and "hidden" not in out.stdout


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_psql_commands_over_catalogs_the_server_lacks(start_server, request, engine,
                                                      certs) -> None:
    """\\ddp, \\dy, \\des, ... read catalogs the server does not hold: 42P01 naming
    the catalog (not DuckDB's 'Did you mean', the engine's table list or SQLite's text).
    \\dconfig reads pg_settings, which lists no setting changed from its default."""
    srv = start_server(request.getfixturevalue(engine))
    for command, relation in (("\\ddp", "pg_default_acl"), ("\\dy", "pg_event_trigger"),
                              ("\\des", "pg_foreign_server"), ("\\do", "pg_operator")):
        out = psql(srv, certs, "\\set VERBOSITY verbose", command)
        assert f'ERROR:  42P01: relation "pg_catalog.{relation}" does not exist' in out.stderr
    out = psql(srv, certs, "\\dconfig")
    assert out.returncode == 0, out.stderr
    assert "(0 rows)" in out.stdout
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.errors.UndefinedTable,
                           match=r'"information_schema\.key_column_usage" does not exist'):
            c.execute("SELECT * FROM information_schema.key_column_usage")


def test_analytical_set_is_a_command(start_server, analytical) -> None:
    """A SET DuckDB takes (TimeZone) answers as PostgreSQL's does: tag SET, no rows (a
    result of a column 'Success' and no rows made psycopg's fetch and psql print a table)."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        cur = c.execute("SET TIME ZONE 'UTC'")
        assert (cur.statusmessage, cur.description) == ("SET", None)

"""Real clients in other languages against a real server, on both engines: the PostgreSQL
JDBC driver (Java: extended protocol, server-side prepared statements past its
prepareThreshold, binary results, its startup parameters and metadata queries) and
node-postgres (SCRAM-SHA-256-PLUS, Buffers sent binary, named statements), on TLS with
verify-full. Each runs the steps a test gives it (tests/server/clients) and prints one line
a step. CI installs both (.ci/run: Debian's libpostgresql-jdbc-java and a JDK, ``npm
install`` in tests/server/clients); a missing one fails there and is skipped elsewhere."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import PASSWORD, USER

CLIENTS = Path(__file__).parent / "clients"
JAR = Path("/usr/share/java/postgresql.jar")  # Debian's libpostgresql-jdbc-java
NODE_MODULES = CLIENTS / "node_modules"
ENGINES = ["sqlite_engine", "analytical"]
#: a statement that runs until it is cancelled
ENDLESS = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
           "SELECT count(*) FROM n")

Steps = Callable[..., list[str]]


def _missing(what: str) -> None:
    if os.environ.get("CI"):  # .ci/run installs it: missing on CI is a failure
        pytest.fail(f"{what} is not installed (.ci/run installs it)")
    pytest.skip(f"{what} is not installed (.ci/run installs it)")


def _runner(command: list[str], env: dict[str, str] | None = None) -> Steps:
    def run(srv: Any, *steps: tuple[str, ...], options: list[str] | None = None) -> list[str]:
        text = "".join("\t".join(step) + "\n" for step in steps)
        proc = subprocess.run([*command[:1], *(options or []), *command[1:], str(srv.port),
                               srv.dsn["sslrootcert"]], input=text, capture_output=True,
                              text=True, timeout=180, env=env)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) == len(steps), proc.stdout + proc.stderr
        return lines
    return run


@pytest.fixture(scope="session")
def jdbc(tmp_path_factory: Any) -> Steps:
    """run(srv, *steps, options=JVM options): JdbcSteps.java's output lines (compiled once)."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if java is None or javac is None or not JAR.exists():
        _missing("the PostgreSQL JDBC driver and a JDK")
    assert java is not None and javac is not None
    classes = tmp_path_factory.mktemp("jdbc")
    subprocess.run([javac, "-d", str(classes), "-cp", str(JAR),
                    str(CLIENTS / "JdbcSteps.java")], check=True, timeout=300)
    return _runner([java, "-cp", f"{JAR}{os.pathsep}{classes}", "JdbcSteps"])


@pytest.fixture(scope="session")
def node() -> Steps:
    """run(srv, *steps): node_steps.js's output lines."""
    exe = shutil.which("node")
    if exe is None or not (NODE_MODULES / "pg" / "package.json").exists():
        _missing("node and node-postgres (npm install in tests/server/clients)")
    assert exe is not None
    return _runner([exe, str(CLIENTS / "node_steps.js")],
                   env={**os.environ, "NODE_PATH": str(NODE_MODULES)})


ADMIN = ("connect", USER, PASSWORD)


TABLE = ("CREATE TABLE t (id INTEGER, name TEXT, amount NUMERIC(12,2), ts TIMESTAMP, "
         "tz TIMESTAMPTZ, d DATE, b BYTEA, f DOUBLE PRECISION, ok BOOLEAN, big BIGINT)")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo"])
def test_jdbc_parameters_and_results_of_each_type(start_server, request, jdbc, engine,
                                                  zone) -> None:
    """Every type through PreparedStatement's setters, the first executions unnamed and
    the later ones server-side prepared statements, and back through getObject, in a JVM
    at UTC and at +09:00. setDate sends ``2024-02-29 +09`` untyped: it was stored as that
    text on SQLite (read back: 22007) and refused by the analytical engine (22P02).
    setTimestamp sends ``2024-01-02 03:04:05.123456+09``: a timestamp column keeps the
    time of day, as PostgreSQL ignores the zone (it was converted to UTC, 18:04 the day
    before, once the statement was server-side prepared, and on SQLite always)."""
    srv = start_server(request.getfixturevalue(engine))
    insert = "INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    values = ("str:o'k é", "dec:12345.67", "ts:2024-01-02 03:04:05.123456",
              "odt:2024-01-02T03:04:05+02:00", "date:2024-02-29", "bytes:0001ff27",
              "double:1.5", "bool:true", "long:1099511627776")
    nulls = ("null:VARCHAR", "null:NUMERIC", "null:TIMESTAMP", "null:TIMESTAMP_WITH_TIMEZONE",
             "null:DATE", "null:BINARY", "null:DOUBLE", "null:BOOLEAN", "null:BIGINT")
    out = jdbc(srv, ADMIN, ("update", TABLE),
               ("repeat", "7", insert, "int:1", *values),  # 7 > prepareThreshold (5)
               ("update", insert, "int:2", *values),
               ("repeat", "7", insert, "int:3", *nulls),
               ("repeat", "7", "SELECT name, amount, ts, tz, d, b, f, ok, big FROM t "
                "WHERE id = ? LIMIT 1", "int:1"),
               ("query", "SELECT count(*) FROM t WHERE d = ? AND b = ? AND amount = ?",
                "date:2024-02-29", "bytes:0001ff27", "dec:12345.67"),
               ("query", "SELECT name, amount, d, b FROM t WHERE id = ? LIMIT 1", "int:3"),
               ("query", "SELECT count(*) FROM t WHERE name IS NULL"),
               options=[f"-Duser.timezone={zone}"])
    assert out[:5] == ["ok connected", "ok 0", "ok 1", "ok 1", "ok 1"]
    tz_shown = "2024-01-02 10:04:05.0" if zone == "Asia/Tokyo" else "2024-01-02 01:04:05.0"
    assert out[5] == ("ok String:o'k é | BigDecimal:12345.67 | "
                      "Timestamp:2024-01-02 03:04:05.123456 | "
                      f"Timestamp:{tz_shown} | Date:2024-02-29 | byte[]:0001ff27 | "
                      "Double:1.5 | Boolean:true | Long:1099511627776")
    assert out[6] == "ok Long:8"
    assert out[7] == "ok null | null | null | null"
    assert out[8] == "ok Long:7"


def test_jdbc_session_starts_in_the_jvm_time_zone(start_server, analytical, jdbc) -> None:
    """JDBC sends the JVM's zone as the startup packet's TimeZone: on the analytical
    engine the session starts in it, as on PostgreSQL 15 (SHOW TimeZone: Asia/Kolkata,
    a timestamptz's text in it); it was UTC whatever the JVM's zone."""
    srv = start_server(analytical)
    out = jdbc(srv, ADMIN, ("query", "SHOW TimeZone"),
               ("query", "SELECT current_setting('TimeZone')"),
               ("query", "SELECT CAST(TIMESTAMPTZ '2024-01-01 00:00:00+00' AS TEXT)"),
               options=["-Duser.timezone=Asia/Kolkata"])
    assert out == ["ok connected", "ok String:Asia/Kolkata", "ok String:Asia/Kolkata",
                   "ok String:2024-01-01 05:30:00+05:30"]


@pytest.mark.parametrize("engine", ENGINES)
def test_jdbc_errors_transactions_and_cancel(start_server, request, jdbc, engine) -> None:
    """SQLSTATEs of errors, a failed transaction (autocommit off) until its rollback, a
    statement cancelled by Statement.cancel() and by setQueryTimeout, each followed by a
    working statement. A syntax error in the analytical engine's transaction block was
    0A000 (a refused write), not 42601."""
    srv = start_server(request.getfixturevalue(engine))
    out = jdbc(srv, ADMIN, ("update", "CREATE TABLE e (a INTEGER)"),
               ("query", "SELEC 1"), ("query", "SELECT * FROM nosuch"),
               ("autocommit", "false"), ("query", "SELECT count(*) FROM e"),
               ("query", "SELEC 1"), ("query", "SELECT 1"), ("rollback",),
               ("query", "SELECT count(*) FROM e"), ("commit",), ("autocommit", "true"),
               ("cancel", "300", ENDLESS), ("query", "SELECT 2"),
               ("timeout", "1", ENDLESS), ("query", "SELECT 3"))
    assert out[2].startswith("err 42601 ") and out[3].startswith("err 42P01 ")
    assert out[5] == "ok Long:0"
    assert out[6].startswith("err 42601 ")
    assert out[7].startswith("err 25P02 ERROR: current transaction is aborted")
    assert out[8:12] == ["ok rollback", "ok Long:0", "ok commit", "ok autocommit"]
    assert out[12].startswith("err 57014 ERROR: canceling statement due to user request")
    assert out[13] in ("ok Long:2", "ok Integer:2")
    assert out[14].startswith("err 57014 ")
    assert out[15] in ("ok Long:3", "ok Integer:3")


def test_jdbc_sqlite_transactions_commit_and_roll_back(start_server, sqlite_engine,
                                                       jdbc) -> None:
    srv = start_server(sqlite_engine)
    out = jdbc(srv, ADMIN, ("update", "CREATE TABLE x (a INTEGER PRIMARY KEY)"),
               ("autocommit", "false"), ("update", "INSERT INTO x VALUES (?)", "int:1"),
               ("rollback",), ("update", "INSERT INTO x VALUES (?)", "int:2"),
               ("update", "INSERT INTO x VALUES (?)", "int:2"), ("rollback",),
               ("batch", "INSERT INTO x VALUES (?)", "int:3", "int:4"), ("commit",),
               ("query", "SELECT a FROM x ORDER BY a"))
    assert out[6].startswith("err 23505 ")
    assert out[8:] == ["ok [1, 1]", "ok commit", "ok Long:3 ; Long:4"]  # (SQLite: int8)


@pytest.mark.parametrize("engine", ENGINES)
def test_jdbc_users_grants_and_a_denied_read(start_server, request, jdbc, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    bob = ("connect", "bob", "bob pw")
    out = jdbc(srv, ADMIN, ("update", "CREATE TABLE g (a INTEGER)"),
               ("update", "INSERT INTO g VALUES (?)", "int:7"),
               ("update", "CREATE USER bob PASSWORD 'bob pw'"),
               bob, ("query", "SELECT a FROM g"),
               ("update", "INSERT INTO g VALUES (?)", "int:8"),
               ADMIN, ("update", "GRANT SELECT ON g TO bob"),
               bob, ("query", "SELECT a FROM g"),
               ("update", "INSERT INTO g VALUES (?)", "int:8"),
               ("connect", "bob", "wrong"))
    assert out[5].startswith("err 42501 ") and out[6].startswith("err 42501 ")
    assert out[10] in ("ok Integer:7", "ok Long:7")
    assert out[11].startswith("err 42501 ")
    assert out[12].startswith('err 28P01 FATAL: password authentication failed for user "bob"')


@pytest.mark.parametrize("engine", ENGINES)
def test_jdbc_database_metadata(start_server, request, jdbc, engine) -> None:
    """What DatabaseMetaData reads from pg_catalog (tools list tables, columns and keys
    so). getPrimaryKeys and getIndexInfo failed (42P01: no function _pg_expandarray),
    getImportedKeys and getExportedKeys too (no pg_settings), and getTypeInfo (no
    array_upper), on both engines; an analytical table has no keys to list."""
    srv = start_server(request.getfixturevalue(engine))
    sqlite = engine == "sqlite_engine"
    out = jdbc(srv, ADMIN, ("update", "CREATE TABLE m (id INTEGER NOT NULL, label TEXT)"),
               ("meta", "product"), ("meta", "getTables", "m"), ("meta", "getColumns", "m"),
               ("meta", "getSchemas"), ("meta", "getTypeInfo"))
    assert out[2] == "ok PostgreSQL 15"
    assert out[3].startswith("ok null | String:public | String:m | String:TABLE | ")
    columns = [row.split(" | ") for row in out[4].removeprefix("ok ").split(" ; ")]
    assert [(c[3], c[5], c[10]) for c in columns] == [
        ("String:id", "String:int8" if sqlite else "String:int4", "Integer:0"),
        ("String:label", "String:text", "Integer:1")]
    assert "String:public" in out[5]
    types = {row.split(" | ")[0] for row in out[6].removeprefix("ok ").split(" ; ")}
    assert {"String:int4", "String:text", "String:timestamptz", "String:bytea"} <= types
    keys = ("CREATE TABLE p (a INTEGER, b TEXT UNIQUE, PRIMARY KEY (b, a))",
            "CREATE TABLE c (x INTEGER, pa INTEGER, pb TEXT, FOREIGN KEY (pb, pa) "
            "REFERENCES p (b, a) ON DELETE CASCADE)") if sqlite else (
            "CREATE TABLE p (a INTEGER, b TEXT)", "CREATE TABLE c (x INTEGER)")
    out = jdbc(srv, ADMIN, *(("update", k) for k in keys), ("meta", "getPrimaryKeys", "p"),
               ("meta", "getIndexInfo", "p"), ("meta", "getImportedKeys", "c"),
               ("meta", "getExportedKeys", "p"))
    if not sqlite:
        assert out[3:] == ["ok "] * 4
        return
    assert out[3] == ("ok null | String:public | String:p | String:b | Long:1 | String:p_pkey ; "
                      "null | String:public | String:p | String:a | Long:2 | String:p_pkey")
    index = [r.split(" | ") for r in out[4].removeprefix("ok ").split(" ; ")]
    assert sorted((i[5], i[7], i[8], i[3]) for i in index) == [
        ("String:p_b_key", "Long:1", "String:b", "Boolean:false"),
        ("String:p_pkey", "Long:1", "String:b", "Boolean:false"),
        ("String:p_pkey", "Long:2", "String:a", "Boolean:false")]
    assert out[5] == out[6]  # the one foreign key, seen from both tables
    fks = [r.split(" | ") for r in out[5].removeprefix("ok ").split(" ; ")]
    assert [(f[2], f[3], f[6], f[7], f[8], f[10], f[11], f[12]) for f in fks] == [
        ("String:p", pk, "String:c", fk, seq, "Integer:0", "String:c_pb_pa_fkey",
         "String:p_pkey") for pk, fk, seq in (("String:b", "String:pb", "Long:1"),
                                              ("String:a", "String:pa", "Long:2"))]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("binding", ["true", "false"])
def test_node_postgres_logs_in_with_and_without_channel_binding(start_server, request, node,
                                                                engine, binding) -> None:
    """SCRAM-SHA-256-PLUS (enableChannelBinding) and SCRAM-SHA-256, on verify-full TLS; a
    wrong password is 28P01 and a certificate that does not name the host is refused."""
    srv = start_server(request.getfixturevalue(engine))
    options = f'{{"enableChannelBinding": {binding}}}'
    out = node(srv, ("connect", USER, PASSWORD, options), ("query", "SELECT $1::int + 1",
                                                           "int:41"),
               ("connect", USER, "wrong", options),
               ("connect", USER, PASSWORD,
                '{"host": "127.0.0.1", "ssl": {"servername": "other.example"}}'))
    assert out[0] == "ok connected"
    assert out[1] == ("ok string:42" if engine == "sqlite_engine" else "ok number:42")  # int8
    assert out[2] == f'err 28P01 password authentication failed for user "{USER}"'
    assert out[3].startswith("err ")  # (ssl replaced: no CA either, refused all the same)


@pytest.mark.parametrize("engine", ENGINES)
def test_node_postgres_parameters_of_each_type(start_server, request, node, engine) -> None:
    """Buffers (node-postgres sends them binary, untyped: they were refused with 22P02,
    'utf-8' codec can't decode), Dates, NULLs, strings and numbers, unnamed and named."""
    srv = start_server(request.getfixturevalue(engine))
    insert = "INSERT INTO n VALUES ($1, $2, $3, $4, $5, $6)"
    out = node(srv, ("connect", USER, PASSWORD, '{"enableChannelBinding": true}'),
               ("simple", "CREATE TABLE n (id INTEGER, name TEXT, b BYTEA, "
                "tz TIMESTAMPTZ, amount NUMERIC(10,2), f DOUBLE PRECISION)"),
               ("query", insert, "int:1", "str:o'k", "bytes:00ff27",
                "date:2024-01-02T03:04:05.123Z", "str:10.25", "double:0.25"),
               ("named", "ins", insert, "int:2", "null:", "bytes:ff", "null:", "null:",
                "null:"),
               ("named", "ins", insert, "int:3", "str:x", "bytes:", "null:", "null:", "null:"),
               ("query", "SELECT id, name, b, tz, amount, f FROM n ORDER BY id"),
               ("query", "SELECT id FROM n WHERE b = $1", "bytes:00ff27"),
               ("query", "SELECT $1", "bytes:00ff"))
    assert out[2:5] == ["ok INSERT 1"] * 3
    number = "number" if engine == "analytical" else "string"  # (SQLite's INTEGER: int8)
    assert out[5] == ("ok " + " ; ".join([
        f"{number}:1 | string:o'k | Buffer:00ff27 | Date:2024-01-02T03:04:05.123Z | "
        "string:10.25 | number:0.25",
        f"{number}:2 | null | Buffer:ff | null | null | null",
        f"{number}:3 | string:x | Buffer: | null | null | null"]))
    assert out[6] == f"ok {number}:1"
    assert out[7] == "ok Buffer:00ff"


@pytest.mark.parametrize("engine", ENGINES)
def test_node_postgres_errors_and_grants(start_server, request, node, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    out = node(srv, ("connect", USER, PASSWORD), ("simple", "CREATE TABLE g (a INTEGER)"),
               ("simple", "CREATE USER carol PASSWORD 'carol pw'"),
               ("query", "SELEC $1", "int:1"), ("simple", "BEGIN"), ("simple", "SELEC 1"),
               ("simple", "SELECT 1"), ("simple", "ROLLBACK"),
               ("connect", "carol", "carol pw", '{"enableChannelBinding": true}'),
               ("query", "SELECT a FROM g WHERE a = $1", "int:1"))
    assert out[3].startswith("err 42601 ") and out[5].startswith("err 42601 ")
    assert out[6].startswith("err 25P02 ") and out[7] == "ok ROLLBACK "
    assert out[8] == "ok connected" and out[9].startswith("err 42501 permission denied")


def test_jdbc_numerics_of_more_than_28_digits_are_exact(start_server, analytical,
                                                        jdbc) -> None:
    """setBigDecimal sends a binary numeric: one of more than 28 digits was summed in
    decimal's default context and refused (22P02, ``[<class 'decimal.InvalidOperation'>]``);
    it is read exactly, and one DuckDB cannot hold is DuckDB's clear error."""
    srv = start_server(analytical)
    out = jdbc(srv, ADMIN, ("query", "SELECT CAST(? AS TEXT), ? * 2",
                            "dec:1234567890123456789012345678.5", "dec:-0.000012300"),
               ("query", "SELECT ?", "dec:123456789012345678901234567890.123456789"))
    assert out[1] == "ok String:1234567890123456789012345678.5 | BigDecimal:-0.000024600"
    assert out[2].startswith("err 22P02 ") and "DECIMAL(38,9)" in out[2]


@pytest.mark.parametrize("engine", ENGINES)
def test_node_postgres_statement_timeout(start_server, request, node, engine) -> None:
    """node-postgres's statement_timeout (a startup parameter), ``options=-c
    statement_timeout=...`` and ``SET statement_timeout`` limit the session's statements
    (57014), as in PostgreSQL: the server ignored the startup parameter (the statement
    ran on) and refused the SET (a syntax error on SQLite, an unknown setting on the
    analytical engine)."""
    srv = start_server(request.getfixturevalue(engine))
    out = node(srv, ("connect", USER, PASSWORD, '{"statement_timeout": 300}'),
               ("simple", "SHOW statement_timeout"), ("simple", ENDLESS),
               ("simple", "SET statement_timeout = '2s'"), ("simple", "SHOW statement_timeout"),
               ("simple", "SET statement_timeout TO 'soon'"),
               ("simple", "RESET statement_timeout"), ("simple", "SHOW statement_timeout"),
               ("connect", USER, PASSWORD, '{"options": "-c statement_timeout=200"}'),
               ("simple", ENDLESS), ("simple", "SET statement_timeout = 100"),
               ("query", ENDLESS), ("query", "SELECT $1::int", "int:1"))
    assert out[1] == "ok string:300ms"
    assert out[2] == "err 57014 canceling statement due to statement timeout"
    assert out[3:5] == ["ok SET ", "ok string:2s"]  # (as PostgreSQL shows it)
    assert out[5] == 'err 22023 invalid value for parameter "statement_timeout": "soon"'
    # RESET goes back to the startup packet's value, as in PostgreSQL 15
    assert out[6:8] == ["ok RESET ", "ok string:300ms"]
    assert out[9] == out[11] == "err 57014 canceling statement due to statement timeout"
    assert out[12] in ("ok number:1", "ok string:1")


def test_a_session_statement_timeout_does_not_lift_the_servers(start_server, sqlite_engine,
                                                               node) -> None:
    srv = start_server(sqlite_engine, statement_timeout=0.3)
    out = node(srv, ("connect", USER, PASSWORD), ("simple", "SET statement_timeout = '1h'"),
               ("simple", "SHOW statement_timeout"), ("simple", ENDLESS))
    assert out[2] == "ok string:300ms"
    assert out[3] == "err 57014 canceling statement due to statement timeout"

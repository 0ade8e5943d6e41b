"""Parameters a client sends untyped (OID 0, in text), as pg8000 sends every one: each
gets the type its context gives (see _paramtypes), and where the analytical engine cannot
tell it the error says so with PostgreSQL's SQLSTATE, not a generic failure."""

from __future__ import annotations

import ssl

import pg8000.native
import psycopg
import pytest

ENGINES = ["analytical", "sqlite_engine"]


def connect(srv) -> pg8000.native.Connection:
    return pg8000.native.Connection(
        "u", host="localhost", port=srv.port, password="pw", database="db",
        ssl_context=ssl.create_default_context(cafile=str(srv.dsn["sslrootcert"])))


@pytest.mark.parametrize("engine", ENGINES)
def test_untyped_parameters_take_their_context_type(start_server, request, engine) -> None:
    srv = start_server(request.getfixturevalue(engine))
    c = connect(srv)
    try:
        c.run("CREATE TABLE t (c_int INTEGER, s VARCHAR, d DATE)")
        c.run("INSERT INTO t VALUES (5, 'x', DATE '2024-01-01')" if engine == "analytical"
              else "INSERT INTO t VALUES (5, 'x', '2024-01-01')")
        assert c.run("SELECT s FROM t WHERE c_int = :v", v="5") == [["x"]]
        assert c.run("SELECT s FROM t WHERE c_int = :v", v=5) == [["x"]]
        assert c.run("SELECT s FROM t WHERE c_int + :v = 6", v="1") == [["x"]]
        assert c.run("SELECT s FROM t WHERE :v * 2 = c_int * 2", v=5) == [["x"]]
        if engine == "analytical":  # (SQLite's Describe types an expression as text)
            assert c.run("SELECT :v + 1", v="5") == [[6]]
            assert c.run("SELECT c_int * :v FROM t", v=2) == [[10]]
        assert c.run("SELECT s FROM t WHERE d > :v", v="2023-12-31") == [["x"]]
        with pytest.raises(pg8000.native.DatabaseError) as info:
            c.run("SELECT s FROM t WHERE c_int = :v", v="x")
        assert info.value.args[0]["C"] == "22P02"
        integer = "integer" if engine == "analytical" else "bigint"  # SQLite's INTEGER
        assert info.value.args[0]["M"] == f'invalid input syntax for type {integer}: "x"'
    finally:
        c.close()


def test_undeterminable_parameter_types_are_42p18(start_server, analytical) -> None:
    srv = start_server(analytical)
    c = connect(srv)
    try:
        c.run("CREATE TABLE t (c_int INTEGER, s VARCHAR, d DATE)")
        c.run("INSERT INTO t VALUES (1, 'a', DATE '2024-01-01')")
        with pytest.raises(pg8000.native.DatabaseError) as info:
            c.run("SELECT abs(:v)", v=5)  # abs of what: integer, double, ...?
        err = info.value.args[0]
        assert err["C"] == "42P18" and "could not determine the data type" in err["M"]
        assert "$1::BIGINT" in err["H"]
        assert c.run("SELECT abs(CAST(:v AS INTEGER))", v=-5) == [[5]]  # as the hint says
    finally:
        c.close()
    with psycopg.connect(**srv.dsn, autocommit=True) as pc:
        with pytest.raises(psycopg.errors.DatatypeMismatch):  # 42804
            pc.execute("SELECT c_int FROM t WHERE d = c_int")
        with pytest.raises(psycopg.errors.UndefinedFunction):  # 42883
            pc.execute("SELECT c_int + s FROM t")

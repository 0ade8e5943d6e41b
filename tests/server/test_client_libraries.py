"""Real PostgreSQL client libraries (SQLAlchemy over psycopg and pg8000, pandas, psql) used
as their users use them, on both engines: what each of them sends is answered."""

from __future__ import annotations

import ssl

import pg8000.native
import psycopg
import pytest
import sqlalchemy as sa

from cryptdisk.server import _pgtables
from tests.server.test_orm_clients import DRIVERS, make_engine


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

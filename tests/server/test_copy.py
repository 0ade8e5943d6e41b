"""COPY FROM STDIN / TO STDOUT with psycopg and psql, on both engines."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from tests.server.conftest import PASSWORD, USER
from tests.server.rawclient import Raw, cstr, msg, sqlstate


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_copy_in_and_out_with_psycopg(start_server, engine, request) -> None:
    srv = start_server(request.getfixturevalue(engine))
    rows = [(1, "plain"), (2, "tab\there, newline\nthere, back\\slash"), (3, None)]
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR)")
        with c.cursor() as cur:
            with cur.copy("COPY t (a, b) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            assert cur.rowcount == 3
            assert c.execute("SELECT a, b FROM t ORDER BY a").fetchall() == rows
            with cur.copy("COPY (SELECT a, b FROM t ORDER BY a) TO STDOUT") as copy:
                assert list(copy.rows()) == [("1", r[1]) if r[0] == 1 else (str(r[0]), r[1])
                                             for r in rows]
            with cur.copy("COPY t TO STDOUT WITH (FORMAT csv, HEADER)") as copy:
                text = b"".join(bytes(b) for b in copy).decode()
            assert text.splitlines()[0] == "a,b" and len(text.splitlines()) == 5


def test_copy_csv_with_psql_and_a_failed_copy(start_server, sqlite_engine, certs,
                                              tmp_path) -> None:
    srv = start_server(sqlite_engine)
    data = tmp_path / "in.csv"
    data.write_text("id,name\n1,\"a, b\"\n2,\n")
    conninfo = (f"host=localhost port={srv.port} user={USER} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    out = subprocess.run(["psql", conninfo, "-Atc", "CREATE TABLE p (id INTEGER, name TEXT)",
                          "-c", f"\\copy p FROM '{data}' WITH (FORMAT csv, HEADER)",
                          "-c", "SELECT id, coalesce(name, 'NULL') FROM p ORDER BY id"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-3:-1] == ["1|a, b", "2|NULL"]
    with psycopg.connect(**srv.dsn, autocommit=True) as c:  # a CopyFail leaves nothing
        with pytest.raises(RuntimeError):
            with c.cursor().copy("COPY p FROM STDIN") as copy:
                copy.write_row((9, "never"))
                raise RuntimeError("client gives up")  # psycopg sends CopyFail
        assert c.execute("SELECT count(*) FROM p").fetchone() == (2,)


def test_disconnect_mid_copy_inserts_nothing(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine, secure=False)
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="d",
                         sslmode="disable", autocommit=True) as c:
        c.execute("CREATE TABLE t (a INTEGER)")
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    r.send(msg(b"d", b"1\n2\n"))
    r.close()  # gone before CopyDone
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("SELECT count(*) FROM t")))
    got = r.until(b"Z")
    assert (b"D", b"\x00\x01\x00\x00\x00\x010") in got
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    r.send(msg(b"Q", cstr("SELECT 1")))  # not a COPY message: a protocol violation
    rest = r.rest()
    assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "08P01"

"""A COPY FROM STDIN into an analytical table that fails (a bad row, a cancel, the
statement timeout, the client gone) leaves no part file on disk: the parts its insert had
written (and published, each block of a sorted table its own part) are removed with it,
not left encrypted until the next writer's open."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator

import psycopg
import pytest

from cryptdisk.server import AnalyticalEngine
from tests.server.rawclient import Raw, cstr, msg

#: about 9 MB: DuckDB's cast of the COPY's rows hands over the first parts' rows before
#: the end
ROWS = 600_000


def _files(root: str) -> set[str]:
    """The database's data files: parts, and parts being written (``.cdtmp``)."""
    data = os.path.join(root, "data")
    return {os.path.relpath(os.path.join(r, f), data) for r, _d, fs in os.walk(data)
            for f in fs}


def _data(rows: int = ROWS) -> Iterator[bytes]:
    """Rows out of key order (a part per block) in pieces of about 100 KB."""
    for start in range(0, rows, 5_000):
        yield b"".join(b"%d\tname %d\n" % ((i * 7919) % rows, i)
                       for i in range(start, min(rows, start + 5_000)))


@pytest.fixture
def srv(start_server, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        engine = AnalyticalEngine(tmp_path / "a.db", insert_block_bytes=1 << 16)
    srv = start_server(engine, secure=False)  # (plaintext: the raw client's too)
    srv.dsn = {"host": "127.0.0.1", "port": srv.port, "user": "u", "dbname": "db",
               "sslmode": "disable"}
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (a BIGINT, b VARCHAR) ORDER BY a")
        c.execute("INSERT INTO t VALUES (1, 'before')")
    srv.root = str(tmp_path / "a.db")
    return srv


def _parts_written(srv, before: set[str]) -> None:
    """Wait until the COPY's insert has written parts (of the rows sent so far)."""
    for _ in range(400):
        if _files(srv.root) - before:
            return
        time.sleep(0.05)
    raise AssertionError("the COPY wrote no part")


def _unchanged(srv, before: set[str]) -> None:
    assert _files(srv.root) == before
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM t").fetchone() == (1,)


def test_a_copy_failing_at_its_last_row_leaves_no_part(srv) -> None:
    before = _files(srv.root)
    assert len(before) == 1
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.errors.BadCopyFileFormat, match=f"row {ROWS + 1}\\b"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                for piece in _data():
                    copy.write(piece)
                _parts_written(srv, before)
                copy.write(b"1\t2\t3\n")
    _unchanged(srv, before)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:  # (a COPY that ends: its parts)
        with c.cursor().copy("COPY t FROM STDIN") as copy:
            for piece in _data(20_000):
                copy.write(piece)
        assert len(_files(srv.root)) > len(before)


def test_a_cancel_or_the_statement_timeout_mid_copy_leaves_no_part(srv) -> None:
    before = _files(srv.root)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                for piece in _data():
                    copy.write(piece)
                _parts_written(srv, before)
                c.cancel()
                time.sleep(0.5)
                copy.write(b"1\tmore\n")
        _unchanged(srv, before)
        c.execute("SET statement_timeout = '6s'")  # (parts are written before it passes)
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                start = time.monotonic()
                for piece in _data():
                    copy.write(piece)
                _parts_written(srv, before)
                time.sleep(max(0.0, 6.5 - (time.monotonic() - start)))
                copy.write(b"1\tmore\n")
    _unchanged(srv, before)


def test_a_client_gone_mid_copy_leaves_no_part(srv) -> None:
    before = _files(srv.root)
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    for piece in _data():
        r.send(msg(b"d", piece))
    _parts_written(srv, before)
    r.sock.close()
    for _ in range(600):  # (the server ends the COPY once it sees the socket closed)
        if _files(srv.root) == before and not any(s.busy for s in srv.server.sessions):
            break
        time.sleep(0.05)
    _unchanged(srv, before)

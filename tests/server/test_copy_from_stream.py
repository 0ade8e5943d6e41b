"""COPY ... FROM STDIN is streamed (server/_session.py's _copy_in, server/_copyin.py): a
real server process takes a COPY of over 200 MB with its peak RSS growing by a bounded
amount, on both engines; a COPY that fails at its last row, or whose client goes away
mid-COPY, leaves the table as it was and the server serving."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import psycopg
import pytest

from tests.server.rawclient import Raw, cstr, msg
from tests.server.test_streaming import _hwm

#: a server process of either engine (argv: engine, path), the analytical one with a
#: 64 MB memory_limit; it prints its port
_SERVER = textwrap.dedent("""
    import asyncio, sys
    from cryptdisk.keys import Key, Keyring
    from cryptdisk.server import AnalyticalEngine, Server, SQLiteEngine, new_event_loop
    if sys.argv[1] == "analytical":
        engine = AnalyticalEngine(sys.argv[2], memory_limit="64MB", insert_block_bytes=8 << 20)
    else:
        engine = SQLiteEngine(sys.argv[2], Keyring([Key(1, bytes(range(32)))]))
    server = Server(engine, host="127.0.0.1", port=0, plaintext_loopback=True)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(server.serve(asyncio.Event(),
                                         ready=lambda a: print(a[1], flush=True)))
""")

DDL = {"analytical": "CREATE TABLE t (a BIGINT, b VARCHAR, c DOUBLE, d VARCHAR)",
       "sqlite": "CREATE TABLE t (a INTEGER, b TEXT, c REAL, d TEXT)"}
#: the rows of the large COPY: about 110 bytes each, 2M of them: 220 MB
ROWS = 2_000_000
#: how much the COPYs of the memory test may grow the server's peak RSS: the analytical
#: engine's insert holds (2 x threads + 1) x insert_block_bytes (8 MiB here) of blocks and
#: DuckDB's memory_limit (64 MB) whatever the input's size, and the COPY a batch of rows
#: being converted. Measured on 2 cores: the 44 MB COPY grew it by 151-161 MB (analytical) and
#: 24-25 MB (SQLite), the 220 MB one after it by 0-16 MB and 0 MB more.
BOUND = {"analytical": 256 << 20, "sqlite": 96 << 20}
GROWTH = 32 << 20


def _line(i: int) -> bytes:
    return b"%d\tname %d %s\t%d.5\t%s\n" % (i, i, b"x" * 80, i % 1000, b"tab\\there" if i % 7
                                           else b"\\N")


def _data(rows: int, last: bytes | None = None, first: int = 0) -> Iterator[bytes]:
    """The COPY's text of rows ``first`` .. ``first + rows - 1`` in pieces of 100,003 bytes
    (lines span them), ``last`` instead of the last row if given."""
    pending = b""
    step = 20_000
    for start in range(first, first + rows, step):
        end = min(first + rows, start + step)
        chunk = b"".join(_line(i) for i in range(start, end))
        if last is not None and end == first + rows:
            chunk = chunk[:chunk.rstrip(b"\n").rfind(b"\n") + 1] + last
        pending += chunk
        while len(pending) >= 100_003:
            yield pending[:100_003]
            pending = pending[100_003:]
    if pending:
        yield pending


@pytest.fixture(params=["analytical", "sqlite"])
def server(request, tmp_path) -> Iterator[tuple[str, int, int]]:
    """(engine, port, pid) of a server process on a new database with table ``t``."""
    engine = request.param
    if engine == "analytical":
        subprocess.run([sys.executable, "-m", "cryptdisk", "sql", str(tmp_path / "db"),
                        "--create", "-q", "SELECT 1"], check=True, capture_output=True,
                       timeout=120)
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, engine, str(tmp_path / "db")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with _connect(port) as c:
            c.execute(DDL[engine])
        yield engine, port, proc.pid
    finally:
        proc.terminate()
        proc.wait(60)
        proc.stdout.close()  # type: ignore[union-attr]


def _connect(port: int) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=port, user="u", dbname="d",
                           sslmode="disable", autocommit=True)


def _summary(c: psycopg.Connection) -> tuple[int, int]:
    count, total = c.execute("SELECT count(*), sum(a) FROM t").fetchone()  # type: ignore[misc]
    return int(count), int(total or 0)


def test_a_copy_of_220_mb_is_streamed_in_bounded_memory(server) -> None:
    """A COPY of 400K rows (44 MB), then one of 2M rows (220 MB of text), sent in CopyData
    of 100,003 bytes: the table holds exactly them (count, sum, sampled rows); the second,
    5x the first, grows the server's peak RSS by less than GROWTH more (its memory does not
    depend on the COPY's size), and both by less than BOUND[engine]."""
    engine, port, pid = server
    small = 400_000
    with _connect(port) as c:
        c.execute("SELECT count(*) FROM t").fetchall()  # (warm: the session's thread)
        start = _hwm(pid)
        with c.cursor().copy("COPY t FROM STDIN") as copy:
            for piece in _data(small):
                copy.write(piece)
        middle = _hwm(pid)
        with c.cursor().copy("COPY t FROM STDIN") as copy:
            for piece in _data(ROWS, first=small):
                copy.write(piece)
        end = _hwm(pid)
        total = small + ROWS
        assert _summary(c) == (total, total * (total - 1) // 2)
        for i in (0, 1, 6, 7, 16_383, 16_384, 399_999, 400_000, 1_999_999, total - 1):
            row = c.execute("SELECT a, b, c, d FROM t WHERE a = %s", (i,)).fetchall()
            assert row == [(i, f"name {i} {'x' * 80}", i % 1000 + 0.5,
                            "tab\there" if i % 7 else None)], (engine, i)
    mb = 1 << 20
    print(f"{engine}: the 44 MB COPY grew the peak RSS by {(middle - start) / mb:.0f} MB, "
          f"the 220 MB one by {(end - middle) / mb:.0f} MB more")
    assert end - middle < GROWTH, f"{engine}: {(end - middle) >> 20} MB more"
    assert end - start < BOUND[engine], f"{engine}: {(end - start) >> 20} MB"


def test_a_copy_failing_at_its_last_row_leaves_the_table_as_it_was(server) -> None:
    """300,000 rows (19 batches) whose last has a field too many: 22P04 naming that row,
    and not one row of the COPY in the table; the session goes on."""
    _engine, port, _pid = server
    rows = 300_000
    with _connect(port) as c:
        c.execute("INSERT INTO t VALUES (1, 'before', 0.5, NULL)")
        with pytest.raises(psycopg.errors.BadCopyFileFormat, match=f"row {rows}\\b"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                for piece in _data(rows, last=b"1\t2\t3\t4\t5\n"):
                    copy.write(piece)
        assert _summary(c) == (1, 1)
        with c.cursor().copy("COPY t FROM STDIN") as copy:
            copy.write(b"2\tafter\t1.5\t\\N\n")
        assert _summary(c) == (2, 3)


def test_a_client_gone_mid_copy_leaves_the_table_as_it_was(server) -> None:
    """A client sends 30 MB of a COPY (several batches inserted) and closes its socket: no
    row of it is in the table, and the server takes the next COPY."""
    _engine, port, _pid = server
    r = Raw(port)
    r.startup()
    r.send(msg(b"Q", cstr("COPY t FROM STDIN")))
    assert r.read()[0] == b"G"
    sent = 0
    for piece in _data(ROWS):
        r.send(msg(b"d", piece))
        sent += len(piece)
        if sent > 30 << 20:
            break
    r.close()
    with _connect(port) as c:  # (its COPY waits until the server rolled the other back)
        with c.cursor().copy("COPY t FROM STDIN") as copy:
            copy.write(b"7\tnext\t1.5\t\\N\n")
        assert _summary(c) == (1, 7)


def test_a_cancel_or_the_statement_timeout_mid_copy_leaves_the_table_as_it_was(
        server) -> None:
    """A CancelRequest while the client is still sending, or the statement timeout passing
    then: 57014 once more data comes, no row of the COPY in the table."""
    _engine, port, _pid = server
    with _connect(port) as c:
        pieces = _data(200_000)
        with pytest.raises(psycopg.errors.QueryCanceled, match="user request"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                for i, piece in enumerate(pieces):
                    copy.write(piece)
                    if i == 40:  # (4 MB: batches were inserted)
                        c.cancel()
                        time.sleep(0.5)
        c.execute("SET statement_timeout = '1s'")
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            with c.cursor().copy("COPY t FROM STDIN") as copy:
                for i, piece in enumerate(_data(200_000)):
                    copy.write(piece)
                    if i == 40:
                        time.sleep(1.5)
        c.execute("SET statement_timeout = 0")
        assert _summary(c) == (0, 0)

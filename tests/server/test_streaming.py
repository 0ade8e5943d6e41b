"""The analytical engine's SELECTs are streamed (server/_rowstream.py): rows go out a
batch at a time, an Execute's row limit suspends the portal and the next Execute goes on
with the same stream, errors and cancels mid-stream come after the rows sent, a client
gone mid-stream frees what its stream held, and a server's memory stays bounded by a
batch, not by the result."""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cryptdisk.db import _partread
from cryptdisk.format import HEADER_SIZE
from cryptdisk.server import AccessLog, AnalyticalEngine
from cryptdisk.server._rowstream import BATCH_ROWS
from tests.server.conftest import masked_reader
from tests.server.rawclient import Raw, cstr, msg, sqlstate
from tests.server.test_access_log import lines

ROWS = 3 * BATCH_ROWS + 123


@pytest.fixture
def filled(analytical: AnalyticalEngine) -> AnalyticalEngine:
    analytical.db.execute("CREATE TABLE t (a BIGINT, b VARCHAR, c DOUBLE)")
    analytical.db.execute(f"INSERT INTO t SELECT i, 'v' || (i % 977), i / 7.0 "
                          f"FROM range({ROWS}) r(i)")
    return analytical


def _open_streams(srv: Any) -> int:
    """The server's streamed results still open (in every session)."""
    return sum(len(getattr(s.engine, "_streams", ())) for s in list(srv.server.sessions))


def _wait_for(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_streamed_rows_equal_the_buffered_result(start_server, filled) -> None:
    """Random queries (filters, limits around the batch size, orders, joins, aggregates),
    by simple query and by the extended protocol (text and binary): row for row what the
    embedded API's buffered query gives, and CommandComplete's SELECT n."""
    srv = start_server(filled, secure=False)
    rng = random.Random(15)
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="x",
                         autocommit=True) as c:
        for _ in range(25):
            limit = rng.choice([0, 1, BATCH_ROWS - 1, BATCH_ROWS, BATCH_ROWS + 1,
                                2 * BATCH_ROWS + 5, ROWS + 10])
            low = rng.randrange(0, ROWS // 2)
            order = rng.choice(["a", "b, a", "c DESC", "a % 13, a"])
            sql = (f"SELECT a, b, c FROM t WHERE a >= {low} ORDER BY {order}"
                   + (f" LIMIT {limit}" if limit else ""))
            expected = filled.db.query(sql)
            cur = c.execute(sql)
            assert cur.fetchall() == expected, sql
            assert cur.statusmessage == f"SELECT {len(expected)}"
            binary = rng.random() < 0.5
            got = c.execute(sql.replace("%", "%%").replace(f">= {low}", ">= %s"), (low,),
                            binary=binary)
            assert got.fetchall() == expected, (sql, binary)
        joined = "SELECT x.b, count(*), sum(y.a) FROM t x JOIN t y USING (a) GROUP BY x.b " \
            "ORDER BY x.b"
        assert c.execute(joined).fetchall() == filled.db.query(joined)
        assert c.execute("SELECT count(*) FROM t").fetchall() == [(ROWS,)]
    assert _open_streams(srv) == 0


def _execute(raw: Raw, portal: str, max_rows: int) -> list[tuple[bytes, bytes]]:
    raw.send(msg(b"E", cstr(portal) + struct.pack("!i", max_rows)) + msg(b"H"))
    out = []
    while True:
        m = raw.read()
        assert m is not None
        out.append(m)
        if m[0] in (b"s", b"C", b"E"):
            return out


def test_execute_with_a_row_limit_suspends_and_goes_on_with_the_same_stream(
        start_server, filled) -> None:
    """Execute(max_rows) gives that many rows and PortalSuspended, each next Execute the
    next rows of the same stream (the rows in order, none twice), CommandComplete with the
    total at the end; a Close of a portal suspended mid-stream closes its stream."""
    srv = start_server(filled, secure=False)
    raw = Raw(srv.port)
    raw.startup()
    raw.send(msg(b"Q", cstr("BEGIN")))
    raw.until(b"Z")
    raw.send(msg(b"P", cstr("s") + cstr("SELECT a FROM t ORDER BY a") + struct.pack("!h", 0))
             + msg(b"B", cstr("p") + cstr("s") + struct.pack("!hhh", 0, 0, 0)))
    step = BATCH_ROWS // 2 + 7  # (batches end mid-Execute and mid-batch)
    values: list[int] = []
    suspended = 0
    while True:
        out = _execute(raw, "p", step)
        values += [int(body[6:]) for kind, body in out if kind == b"D"]
        if out[-1][0] == b"s":
            suspended += 1
            assert _open_streams(srv) == 1
            continue
        assert out[-1] == (b"C", b"SELECT %d\0" % ROWS)
        break
    assert values == list(range(ROWS))
    assert suspended == -(-ROWS // step) - (ROWS % step == 0) or suspended == ROWS // step
    _wait_for(lambda: _open_streams(srv) == 0, "the stream ended")
    # a portal closed mid-stream ends its stream; the session goes on
    raw.send(msg(b"B", cstr("q") + cstr("s") + struct.pack("!hhh", 0, 0, 0)))
    assert _execute(raw, "q", 10)[-1][0] == b"s"
    assert _open_streams(srv) == 1
    raw.send(msg(b"C", b"P" + cstr("q")) + msg(b"S"))
    raw.until(b"Z")
    _wait_for(lambda: _open_streams(srv) == 0, "Close ended the stream")
    raw.send(msg(b"Q", cstr("COMMIT; SELECT count(*) FROM t")))
    assert [b for k, b in raw.until(b"Z") if k == b"D"] == [b"\0\x01\0\0\0\x05%d" % ROWS]
    raw.close()


def test_psycopg_server_side_cursor_and_other_statements_between_fetches(
        start_server, filled) -> None:
    """A portal suspended mid-stream while the session runs other queries (each on a
    reader of its own) and a SET: both go on, the rows as the buffered query's."""
    srv = start_server(filled, secure=False)
    raw = Raw(srv.port)
    raw.startup()
    raw.send(msg(b"P", cstr("s") + cstr("SELECT a, b FROM t ORDER BY a DESC")
                 + struct.pack("!h", 0))
             + msg(b"B", cstr("p") + cstr("s") + struct.pack("!hhh", 0, 0, 0)))
    first = [m for m in _execute(raw, "p", 100) if m[0] == b"D"]
    raw.send(msg(b"Q", cstr("SET threads = 1")))
    assert raw.until(b"Z")[-1][0] == b"Z"
    raw.send(msg(b"Q", cstr("SELECT max(a) FROM t")))
    assert next(b for k, b in raw.until(b"Z") if k == b"D").endswith(b"%d" % (ROWS - 1))
    rest = [m for m in _execute(raw, "p", 0) if m[0] == b"D"]
    assert len(first) + len(rest) == ROWS
    raw.send(msg(b"S"))
    raw.until(b"Z")
    raw.close()


def _flip_in_place(path: Path, index: int, segment: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        at = HEADER_SIZE + index * (segment + 16) + 9
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 1]), at)
    finally:
        os.close(fd)


def _read_until_ready(raw: Raw) -> tuple[dict[bytes, int], bytes | None]:
    """Read up to ReadyForQuery: how many messages of each kind, the ErrorResponse's body."""
    buf = bytearray(raw.buf)
    counts: dict[bytes, int] = {}
    error = None
    pos = 0
    while True:
        while pos + 5 <= len(buf):
            (length,) = struct.unpack_from("!i", buf, pos + 1)
            if pos + 1 + length > len(buf):
                break
            kind = bytes(buf[pos:pos + 1])
            counts[kind] = counts.get(kind, 0) + 1
            if kind == b"E":
                error = bytes(buf[pos + 5:pos + 1 + length])
            pos += 1 + length
            if kind == b"Z":
                raw.buf = bytes(buf[pos:])
                return counts, error
        del buf[:pos]
        pos = 0
        chunk = raw.sock.recv(1 << 16)
        assert chunk, "the server closed the connection"
        buf += chunk


def test_a_part_tampered_with_mid_stream_ends_it_with_an_error_after_the_rows(
        start_server, tmp_path, monkeypatch) -> None:
    """A byte of the last row group changes after the first rows went out: the client gets
    rows, then ErrorResponse XX001 (data_corrupted), never CommandComplete; the stream is
    released, the access log says so, and the session goes on."""
    from cryptdisk.db import _parts

    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 2_000)  # (far past the read-ahead)
    engine = AnalyticalEngine(tmp_path / "db", cache_bytes=0)
    try:
        engine.db.execute("CREATE TABLE t (a BIGINT, s VARCHAR)")
        engine.db.execute("INSERT INTO t SELECT i, repeat('s', 20) || i FROM range(400000) r(i)")
        part = engine.db.table("t").parts[0]
        op = _partread.open_part(engine.db.config.disks[part.disk], part)
        try:
            last = op.num_row_groups - 1
            seg = op._segment
            start, end, _compressed = op._chunk_info(last, op._index["s"])
        finally:
            op.close()
        log_path = tmp_path / "access.log"
        srv = start_server(engine, secure=False, access_log=AccessLog(log_path))
        raw = Raw(srv.port)
        raw.startup()
        raw.send(msg(b"Q", cstr("SET threads = 1")))
        raw.until(b"Z")
        raw.send(msg(b"Q", cstr("SELECT a, s FROM t")))
        assert raw.read() is not None  # RowDescription: the stream has started
        _flip_in_place(tmp_path / "db" / "data" / part.path, (start + end) // 2 // seg, seg)
        counts, error = _read_until_ready(raw)
        assert 0 < counts.get(b"D", 0) < 400_000 and b"C" not in counts
        assert error is not None and sqlstate(error) == "XX001"
        _wait_for(lambda: _open_streams(srv) == 0, "the stream was released")
        raw.send(msg(b"Q", cstr("SELECT 1")))
        assert [k for k, _ in raw.until(b"Z")] == [b"T", b"D", b"C", b"Z"]
        raw.close()
        srv.stop()
        entries = [e for e in lines(log_path.read_bytes()) if e["kind"] == "SELECT"]
        assert entries[0]["sqlstate"] == "XX001" and entries[-1]["rows"] == 1
    finally:
        engine.close()


def test_a_cancel_mid_stream_ends_it_with_57014_after_the_rows(start_server, filled) -> None:
    """A CancelRequest while a slow client reads: the rows sent, then 57014."""
    srv = start_server(filled, secure=False)
    raw = Raw(srv.port)
    start = raw.startup()
    pid, key = struct.unpack("!ii", next(b for k, b in start if k == b"K"))
    raw.send(msg(b"Q", cstr("SELECT x.a, y.a FROM t x, t y")))  # (10^9 rows)
    got = 0
    while got < 1000:
        m = raw.read()
        assert m is not None
        got += m[0] == b"D"
    cancel = socket.create_connection(("127.0.0.1", srv.port))
    cancel.sendall(struct.pack("!iiii", 16, 80877102, pid, key))
    cancel.close()
    out = raw.until(b"Z")
    assert out[-2][0] == b"E" and sqlstate(out[-2][1]) == "57014"
    _wait_for(lambda: _open_streams(srv) == 0, "the stream was released")
    raw.close()


_CLIENT = textwrap.dedent("""
    import socket, struct, sys
    sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=60)
    def m(kind, body): return kind + struct.pack("!i", len(body) + 4) + body
    body = struct.pack("!i", 196608) + b"user\\0u\\0\\0"
    sock.sendall(struct.pack("!i", len(body) + 4) + body)
    sock.sendall(m(b"Q", b"SELECT x.a, y.b FROM t x, t y\\0"))
    got = 0
    while got < 1 << 20:
        got += len(sock.recv(65536))
    print("reading", flush=True)
    sys.stdin.read()
""")


def test_a_client_killed_mid_stream_frees_its_stream(start_server, filled) -> None:
    """A client process killed (SIGKILL) after the first megabyte of an endless result:
    its session ends, its stream and the parts it held are released, writers and other
    sessions go on."""
    srv = start_server(filled, secure=False)
    child = subprocess.Popen([sys.executable, "-c", _CLIENT, str(srv.port)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "reading"
        assert _open_streams(srv) == 1
        with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="x",
                             autocommit=True) as c:  # a writer is not blocked meanwhile
            c.execute("INSERT INTO t VALUES (-1, 'w', 0)")
            assert c.execute("SELECT count(*) FROM t").fetchall() == [(ROWS + 1,)]
    finally:
        child.kill()
        child.wait()
        child.stdin.close()  # type: ignore[union-attr]
        child.stdout.close()  # type: ignore[union-attr]
    _wait_for(lambda: _open_streams(srv) == 0 and not srv.server.sessions,
              "the session and its stream ended")
    assert filled.db._readers_running == 0
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="x") as c:
        assert c.execute("SELECT count(*) FROM t").fetchall() == [(ROWS + 1,)]


def test_masking_and_the_access_log_apply_to_a_streamed_result(start_server, filled,
                                                               tmp_path) -> None:
    """A reader's masking policy rewrites the streamed query (every row masked); the
    access-log line is written as the stream ends, with its row count."""
    from cryptdisk.server import PolicyStore

    filled.policies = PolicyStore(tmp_path / "a.policies", filled.keyring, filled)
    log_path = tmp_path / "access.log"
    srv = start_server(filled, access_log=AccessLog(log_path))
    bob_dsn = masked_reader(srv, "t", "b")
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        assert {r[0] for r in c.execute("SELECT b FROM t").fetchall()} != {"***"}
    with psycopg.connect(**bob_dsn, autocommit=True) as bob:
        rows = bob.execute("SELECT a, b FROM t ORDER BY a").fetchall()
        assert len(rows) == ROWS and {b for _, b in rows} == {"***"}
        rows = bob.execute("SELECT b FROM t WHERE a < %s", (BATCH_ROWS + 5,)).fetchall()
        assert len(rows) == BATCH_ROWS + 5 and {b for (b,) in rows} == {"***"}
    srv.stop()
    bobs = [(e["kind"], e["rows"], e.get("sqlstate")) for e in lines(log_path.read_bytes())
            if e["user"] == "bob"]
    assert bobs == [("SELECT", ROWS, None), ("SELECT", BATCH_ROWS + 5, None)]


_SERVER = textwrap.dedent("""
    import asyncio, sys
    from cryptdisk.server import AnalyticalEngine, Server, new_event_loop
    engine = AnalyticalEngine(sys.argv[1], memory_limit="64MB")
    server = Server(engine, host="127.0.0.1", port=0, plaintext_loopback=True)
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(server.serve(asyncio.Event(),
                                         ready=lambda a: print(a[1], flush=True)))
""")


def _hwm(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def read_messages(port: int, sql: str, kind: bytes = b"D") -> tuple[int, int, bytes]:
    """Run ``sql`` by simple query on a bare socket; (the messages of ``kind`` it answered,
    DataRows by default, CopyData with ``b"d"``; their bytes; the tag)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    body = struct.pack("!i", 196608) + cstr("user") + cstr("u") + b"\0"
    sock.sendall(struct.pack("!i", len(body) + 4) + body)
    buf = bytearray()
    pos = 0
    ready = 0
    count = size = 0
    tag = b""
    sent = False
    while True:
        while pos + 5 <= len(buf):
            got = buf[pos:pos + 1]
            (length,) = struct.unpack_from("!i", buf, pos + 1)
            if pos + 1 + length > len(buf):
                break
            if got == kind:
                count += 1
                size += length + 1
            elif got == b"C":
                tag = bytes(buf[pos + 5:pos + length])
            elif got == b"E":
                raise AssertionError(bytes(buf[pos:pos + 1 + length]))
            elif got == b"Z":
                ready += 1
            pos += 1 + length
        del buf[:pos]
        pos = 0
        if ready == 1 and not sent:
            sock.sendall(msg(b"Q", cstr(sql)))
            sent = True
        if ready == 2:
            sock.close()
            return count, size, tag
        chunk = sock.recv(1 << 16)
        assert chunk, "the server closed the connection"
        buf += chunk


def peak_growth(tmp_path: Path, warm: str, sql: str,
                kind: bytes = b"D") -> tuple[int, int, bytes, int]:
    """A real server process (memory_limit 64MB, :data:`_SERVER`) on a new database runs
    ``warm`` then ``sql`` for a bare-socket client (:func:`read_messages`); ``sql``'s
    messages of ``kind``, their bytes, its tag, and how much it grew the server's peak
    RSS (VmHWM) above where ``warm`` left it."""
    subprocess.run([sys.executable, "-m", "cryptdisk", "sql", str(tmp_path / "db"),
                    "--create", "-q", "SELECT 1"], check=True, capture_output=True,
                   timeout=120)
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(tmp_path / "db")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        read_messages(port, warm, kind)
        before = _hwm(proc.pid)
        count, size, tag = read_messages(port, sql, kind)
        return count, size, tag, _hwm(proc.pid) - before
    finally:
        proc.terminate()
        proc.wait(60)
        proc.stdout.close()  # type: ignore[union-attr]


#: 1,000,000 rows of about 270 bytes: 270 MB of DataRows, over 4x the server's 64 MB
BIG = "SELECT i, repeat('x', 250) || i AS pad FROM range(1000000) r(i)"


def test_memory_of_a_large_result_stays_bounded_in_a_server_process(tmp_path) -> None:
    """A real server process (memory_limit 64MB) sends a 270 MB result: its peak RSS grows
    by far less than the result (a buffered result grew it by over 1 GB)."""
    rows, size, tag, grew = peak_growth(
        tmp_path, "SELECT i, repeat('x', 250) || i FROM range(10000) r(i)", BIG)
    assert (rows, tag) == (1_000_000, b"SELECT 1000000") and size > 4 * 64 << 20
    assert grew < 100 << 20, f"the peak RSS grew by {grew >> 20} MB"


def test_fetch_and_move_name_a_streamed_portal(start_server, filled) -> None:
    """A portal Execute streamed part of, then named by MOVE and FETCH (asyncpg's
    cursor.forward): the rest of its rows, in order; back into the streamed rows: 55000."""
    srv = start_server(filled, secure=False)
    raw = Raw(srv.port)
    raw.startup()
    raw.send(msg(b"P", cstr("s") + cstr("SELECT a FROM t ORDER BY a") + struct.pack("!h", 0))
             + msg(b"B", cstr("p") + cstr("s") + struct.pack("!hhh", 0, 0, 0)))
    assert len([m for m in _execute(raw, "p", 10) if m[0] == b"D"]) == 10
    raw.send(msg(b"Q", cstr("MOVE FORWARD 5 p")))
    assert (b"C", b"MOVE 5\0") in raw.until(b"Z")
    raw.send(msg(b"Q", cstr("FETCH 2 p")))
    assert [b[6:] for k, b in raw.until(b"Z") if k == b"D"] == [b"15", b"16"]
    raw.send(msg(b"Q", cstr("FETCH BACKWARD 10 p")))
    out = raw.until(b"Z")
    assert sqlstate(next(b for k, b in out if k == b"E")) == "55000"
    assert _open_streams(srv) == 0
    raw.close()

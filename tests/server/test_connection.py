"""The server's sockets (cryptdisk.server._conn): TLS records, back-pressure, hangups."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import ssl
import struct
import time

import psycopg
import pytest

from cryptdisk.server import server_context
from tests.server.rawclient import Raw, cstr, msg, sqlstate


def _fill(conn: psycopg.Connection, rows: int, width: int) -> None:
    conn.execute("CREATE TABLE big (i INTEGER, s TEXT)")
    with conn.transaction(), conn.cursor() as cur:  # one commit, not one per row
        cur.executemany("INSERT INTO big VALUES (%s, %s)",
                        [(i, f"{i:08d}" * (width // 8)) for i in range(rows)])


@pytest.mark.parametrize("plain_asyncio", [False, True], ids=["loop", "asyncio-loop"])
def test_results_larger_than_the_socket_buffers_over_tls(start_server, sqlite_engine,
                                                         plain_asyncio) -> None:
    """Megabytes of rows over TLS: SSL_write meets a full socket, waits, goes on, loses
    nothing; then the same session answers the next query. On the server's event loop
    (uvloop's where installed) and on asyncio's own."""
    srv = start_server(sqlite_engine, plain_asyncio=plain_asyncio)
    assert isinstance(srv.loop, asyncio.BaseEventLoop) == (
        plain_asyncio or importlib.util.find_spec("uvloop") is None)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        _fill(conn, 4000, 2000)
        rows = conn.execute("SELECT i, s FROM big ORDER BY i").fetchall()
        assert [r[0] for r in rows] == list(range(4000))
        assert all(s == f"{i:08d}" * 250 for i, s in rows)
        assert conn.execute("SELECT count(*) FROM big").fetchone() == (4000,)
        assert conn.info.pgconn.ssl_in_use
        # a message many times the server's read-ahead, in 16 KiB TLS records
        text = "".join(f"{i:07d}," for i in range(250_000))
        assert conn.execute(f"SELECT length('{text}')").fetchone() == (len(text),)


@pytest.mark.parametrize("plain_asyncio", [False, True], ids=["loop", "asyncio-loop"])
def test_a_client_that_does_not_read_holds_the_server_back(start_server, sqlite_engine,
                                                           plain_asyncio) -> None:
    """Pipelined queries whose answers the client reads only at the end: the server stops
    sending while the socket is full, and every answer arrives, in order."""
    srv = start_server(sqlite_engine, secure=False, plain_asyncio=plain_asyncio)
    raw = Raw(srv.port)
    raw.startup()
    raw.send(msg(b"Q", cstr("CREATE TABLE t (s TEXT); "
                            "INSERT INTO t VALUES (replace(hex(zeroblob(30000)), '0', 'x'))")))
    assert raw.until(b"Z")[-1] == (b"Z", b"I")
    n = 200  # about 12 MB of answers
    raw.send(b"".join(msg(b"Q", cstr(f"SELECT {i}, s FROM t")) for i in range(n)))
    seen = []
    for _ in range(n):
        for kind, body in raw.until(b"Z"):
            if kind == b"D":
                first = struct.unpack("!i", body[2:6])[0]
                second = body[10 + first:]
                assert second == b"x" * 60000
                seen.append(int(body[6:6 + first]))
            assert kind != b"E", sqlstate(body)
    assert seen == list(range(n))
    raw.close()


def _tls_raw(port: int, ca: str) -> Raw:
    """A Raw client over TLS (SSLRequest, then the handshake with the test CA)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(struct.pack("!ii", 8, 80877103))
    assert sock.recv(1) == b"S"
    raw = Raw.__new__(Raw)
    raw.sock = ssl.create_default_context(cafile=ca).wrap_socket(
        sock, server_hostname="localhost")
    raw.buf = b""
    return raw


def test_a_client_gone_mid_result_leaves_the_server_serving(start_server, sqlite_engine,
                                                           certs) -> None:
    """Clients that hang up (no close_notify) while megabytes are queued for them."""
    ca, cert, key = certs
    srv = start_server(sqlite_engine, secure=False, ssl_context=server_context(cert, key))
    raw = _tls_raw(srv.port, str(ca))
    raw.startup()
    raw.send(msg(b"Q", cstr("CREATE TABLE big AS WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL "
                            "SELECT i + 1 FROM n WHERE i < 1999) SELECT i, "
                            "replace(hex(zeroblob(1000)), '0', 'x') AS s FROM n")))
    assert raw.until(b"Z")[-1] == (b"Z", b"I")
    raw.close()
    for _ in range(3):
        raw = _tls_raw(srv.port, str(ca))
        raw.startup()
        raw.send(msg(b"Q", cstr("SELECT i, s FROM big")))
        assert raw.sock.recv(1)
        raw.sock.close()  # no close_notify, most of the answer unread
    raw = _tls_raw(srv.port, str(ca))
    raw.startup()
    raw.send(msg(b"Q", cstr("SELECT count(*), min(length(s)) FROM big")))
    rows = [body for kind, body in raw.until(b"Z") if kind == b"D"]
    assert rows == [b"\0\x02\0\0\0\x042000\0\0\0\x042000"]
    raw.close()


def test_plaintext_bytes_sent_with_the_ssl_request_are_refused(start_server,
                                                               sqlite_engine) -> None:
    """Bytes that follow an SSLRequest before the handshake could be injected by anyone
    on the path: the server refuses them instead of reading them as the client's."""
    srv = start_server(sqlite_engine)
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    body = struct.pack("!i", 196608) + cstr("user") + cstr("u") + b"\0"
    sock.sendall(struct.pack("!ii", 8, 80877103) + struct.pack("!i", len(body) + 4) + body)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    sock.close()
    assert data[:1] == b"S" and data[1:2] == b"E" and b"C08P01" in data


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_listens_on_each_address_of_the_host(start_server, sqlite_engine, host) -> None:
    if host == "::1" and not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        srv = start_server(sqlite_engine, secure=False, host=host)
    except OSError as exc:  # a machine without an IPv6 loopback
        pytest.skip(f"cannot listen on {host}: {exc}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(30)
    sock.connect(("::1" if family == socket.AF_INET6 else "127.0.0.1", srv.port))
    raw = Raw.__new__(Raw)
    raw.sock, raw.buf = sock, b""
    raw.startup()
    raw.send(msg(b"Q", cstr("SELECT 41 + 1")))
    assert [body for kind, body in raw.until(b"Z") if kind == b"D"] == [b"\0\x01\0\0\0\x0242"]
    raw.close()


def test_tls_renegotiation_is_off(certs) -> None:
    """As in PostgreSQL: with no TLS 1.2 renegotiation a send never waits for a read."""
    _, cert, key = certs
    assert server_context(cert, key).options & ssl.OP_NO_RENEGOTIATION


class _Records:
    """The socket side of a TLS client on memory BIOs: the test decides how the records
    it writes are cut into TCP segments (``chop`` bytes at a time, or all at once)."""

    def __init__(self, sock: socket.socket, ca: str) -> None:
        self.sock, self.pending = sock, b""
        self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = ssl.create_default_context(cafile=ca).wrap_bio(
            self.inc, self.out, server_hostname="localhost")
        while True:
            try:
                self.tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self.sock.sendall(self.out.read())
                self.inc.write(self.sock.recv(65536))
        self.sock.sendall(self.out.read())

    def record(self, data: bytes) -> None:
        """``data`` as one TLS record, held until :meth:`flush`."""
        self.tls.write(data)
        self.pending += self.out.read()

    def flush(self, chop: int = 0) -> None:
        data, self.pending = self.pending, b""
        if not chop:
            self.sock.sendall(data)
            return
        for i in range(0, len(data), chop):
            self.sock.sendall(data[i:i + chop])
            time.sleep(0.002)  # each piece its own segment: a record arrives in parts

    def sendall(self, data: bytes) -> None:
        self.record(data)
        self.flush()

    def recv(self, n: int) -> bytes:
        while True:
            try:
                return self.tls.read(n)
            except ssl.SSLWantReadError:
                data = self.sock.recv(65536)
                if not data:
                    return b""
                self.inc.write(data)

    def close(self) -> None:
        self.sock.close()


def _records_raw(port: int, ca: str) -> tuple[Raw, _Records]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(struct.pack("!ii", 8, 80877103))
    assert sock.recv(1) == b"S"
    records = _Records(sock, ca)
    raw = Raw.__new__(Raw)
    raw.sock, raw.buf = records, b""  # type: ignore[assignment]
    return raw, records


def test_many_tls_records_in_one_segment_are_all_answered(start_server, sqlite_engine,
                                                          certs) -> None:
    """Fifty queries, each its own TLS record, reach the server in one send: one recv
    brings them all, and every one is decrypted and answered without the socket
    becoming readable again."""
    ca, cert, key = certs
    srv = start_server(sqlite_engine, secure=False, ssl_context=server_context(cert, key))
    raw, records = _records_raw(srv.port, str(ca))
    raw.startup()
    for i in range(50):
        records.record(msg(b"Q", cstr(f"SELECT {i} * 2")))
    records.flush()
    seen = [body for i in range(50) for kind, body in raw.until(b"Z") if kind == b"D"]
    assert seen == [b"\0\x01\0\0\0" + bytes([len(str(2 * i))]) + str(2 * i).encode()
                    for i in range(50)]
    raw.close()


def test_tls_records_cut_into_small_segments(start_server, sqlite_engine, certs) -> None:
    """Records that arrive 7 bytes at a time (header split from body, body in pieces),
    and a query cut across two records: the server waits for the rest, then answers."""
    ca, cert, key = certs
    srv = start_server(sqlite_engine, secure=False, ssl_context=server_context(cert, key))
    raw, records = _records_raw(srv.port, str(ca))
    raw.startup()
    query = msg(b"Q", cstr("SELECT 'split across records'"))
    records.record(query[:9])
    records.record(query[9:])
    records.flush(chop=7)
    rows = [body for kind, body in raw.until(b"Z") if kind == b"D"]
    assert rows == [b"\0\x01\0\0\0\x14split across records"]
    records.sendall(msg(b"Q", cstr("SELECT 1")))
    assert [body for kind, body in raw.until(b"Z") if kind == b"D"] == [b"\0\x01\0\0\0\x011"]
    raw.close()


def test_a_client_close_notify_ends_the_session(start_server, sqlite_engine, certs) -> None:
    """The client's close_notify, sent after a query in the same segment: the server
    answers the query, reads the close_notify as the end of the stream, answers with its
    own and closes the connection; the session is gone."""
    ca, cert, key = certs
    srv = start_server(sqlite_engine, secure=False, ssl_context=server_context(cert, key))
    raw, records = _records_raw(srv.port, str(ca))
    raw.startup()
    records.record(msg(b"Q", cstr("SELECT 40 + 2")))
    try:
        records.tls.unwrap()
    except ssl.SSLWantReadError:  # the server's close_notify has not come yet
        pass
    records.pending += records.out.read()
    records.flush()
    assert [body for kind, body in raw.until(b"Z") if kind == b"D"] == [b"\0\x01\0\0\0\x0242"]
    data = b""
    while chunk := records.sock.recv(65536):  # to the server's FIN
        data += chunk
    records.inc.write(data)
    records.tls.unwrap()  # the server's close_notify, then nothing: no SSLWantReadError
    deadline = time.monotonic() + 10
    while srv.server.sessions and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not srv.server.sessions
    raw.close()


def _messages(data: bytes) -> list[tuple[bytes, bytes]]:
    """The backend messages ``data`` holds, which must end on a message's end."""
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("!i", data, pos + 1)
        assert pos + 1 + length <= len(data), "a message cut at the record's end"
        out.append((data[pos:pos + 1], data[pos + 5:pos + 1 + length]))
        pos += 1 + length
    return out


def _next_record(records: _Records) -> list[tuple[bytes, bytes]]:
    """The messages in the next TLS record from the server that carries application data
    (TLS 1.3's session tickets carry none), read from the socket one record at a time."""

    def exactly(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = records.sock.recv(n - len(data))
            assert chunk, "the server closed the connection"
            data += chunk
        return data

    while True:
        head = exactly(5)
        records.inc.write(head + exactly(struct.unpack("!H", head[3:])[0]))
        plain = b""
        with contextlib.suppress(ssl.SSLWantReadError):
            while chunk := records.tls.read(65536):
                plain += chunk
        if plain:
            return _messages(plain)


def _tls_session(start_server, engine, certs) -> _Records:
    ca, cert, key = certs
    srv = start_server(engine, secure=False, ssl_context=server_context(cert, key))
    raw, records = _records_raw(srv.port, str(ca))
    raw.startup()
    assert not raw.buf
    return records


def test_each_response_is_one_tls_record(start_server, sqlite_engine, certs) -> None:
    """Every message of a query's response (CommandComplete, ReadyForQuery, the rows) goes
    out in one write: one TLS record, not one per message, each sent before the server
    waits for the next query."""
    records = _tls_session(start_server, sqlite_engine, certs)
    answers = []
    for sql in ("CREATE TABLE t (a INTEGER)", "BEGIN", "INSERT INTO t VALUES (1), (2), (3)",
                "UPDATE t SET a = a + 10 WHERE a > 1", "SELECT a FROM t ORDER BY a", "COMMIT"):
        records.sendall(msg(b"Q", cstr(sql)))
        answers.append(_next_record(records))
    assert [[kind for kind, _ in answer] for answer in answers] == [
        [b"C", b"Z"], [b"C", b"Z"], [b"C", b"Z"], [b"C", b"Z"],
        [b"T", b"D", b"D", b"D", b"C", b"Z"], [b"C", b"Z"]]
    assert [answer[-1][1] for answer in answers] == [b"I", b"T", b"T", b"T", b"T", b"I"]
    assert answers[3][0][1] == b"UPDATE 2\0"
    assert [body for kind, body in answers[4] if kind == b"D"] == [
        b"\0\x01\0\0\0\x011", b"\0\x01\0\0\0\x0212", b"\0\x01\0\0\0\x0213"]
    records.close()


def test_pipelined_extended_queries_are_answered_in_order_in_one_record(
        start_server, sqlite_engine, certs) -> None:
    """Three statements' Parse, Bind, Describe and Execute and one Sync in one segment:
    their answers come in the order asked, all in one TLS record that ends with
    ReadyForQuery."""
    records = _tls_session(start_server, sqlite_engine, certs)
    records.sendall(msg(b"Q", cstr("CREATE TABLE t (a INTEGER)")))
    assert [kind for kind, _ in _next_record(records)] == [b"C", b"Z"]
    pipeline = b""
    for sql, value in (("INSERT INTO t VALUES ($1)", b"7"), ("SELECT a * 2 FROM t WHERE a = $1",
                                                             b"7"),
                       ("UPDATE t SET a = a + $1", b"1")):
        pipeline += (msg(b"P", cstr("") + cstr(sql) + struct.pack("!h", 0))
                     + msg(b"B", cstr("") + cstr("") + struct.pack("!hhi", 0, 1, len(value))
                           + value + struct.pack("!h", 0))
                     + msg(b"D", b"P" + cstr("")) + msg(b"E", cstr("") + struct.pack("!i", 0)))
    records.sendall(pipeline + msg(b"S"))
    answer = _next_record(records)
    assert [kind for kind, _ in answer] == [b"1", b"2", b"n", b"C",
                                            b"1", b"2", b"T", b"D", b"C",
                                            b"1", b"2", b"n", b"C", b"Z"]
    assert [body for kind, body in answer if kind in (b"C", b"D")] == [
        b"INSERT 0 1\0", b"\0\x01\0\0\0\x0214", b"SELECT 1\0", b"UPDATE 1\0"]
    records.close()


def test_a_flush_sends_the_answers_held_until_then(start_server, sqlite_engine,
                                                   certs) -> None:
    """Extended-query answers wait for Sync or Flush (as in PostgreSQL); a Flush sends
    them at once, in one record, without ReadyForQuery, and the Sync after it sends
    ReadyForQuery alone."""
    records = _tls_session(start_server, sqlite_engine, certs)
    records.sendall(msg(b"P", cstr("") + cstr("SELECT 6 * 7") + struct.pack("!h", 0))
                    + msg(b"B", cstr("") + cstr("") + struct.pack("!hhh", 0, 0, 0))
                    + msg(b"E", cstr("") + struct.pack("!i", 0)) + msg(b"H"))
    assert _next_record(records) == [(b"1", b""), (b"2", b""), (b"D", b"\0\x01\0\0\0\x0242"),
                                     (b"C", b"SELECT 1\0")]
    records.sendall(msg(b"S"))
    assert _next_record(records) == [(b"Z", b"I")]
    records.close()

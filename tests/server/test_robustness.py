"""Malformed, truncated and oversized input: an error and a closed connection, never a crash."""

from __future__ import annotations

import struct

import pytest

from tests.server.rawclient import Raw, cstr, msg, sqlstate


def still_serves(port: int) -> None:
    r = Raw(port)
    assert r.startup()[-1] == (b"Z", b"I")
    r.send(msg(b"Q", cstr("SELECT 7")))
    got = r.until(b"Z")
    assert (b"D", struct.pack("!hi", 1, 1) + b"7") in got
    r.close()


def bind(params: list[bytes]) -> bytes:
    body = cstr("") + cstr("") + struct.pack("!hh", 0, len(params))
    body += b"".join(struct.pack("!i", len(p)) + p for p in params) + struct.pack("!h", 0)
    return msg(b"B", body)


@pytest.mark.parametrize("bad", [
    b"P" + struct.pack("!i", 1 << 30),                          # oversized: refused unread
    msg(b"B", cstr("") + cstr("") + struct.pack("!hhi", 0, 1, 1000)),  # length past the end
    msg(b"Q", b"SELECT 1"),                                     # no NUL
    msg(b"d", b"copy data out of the blue"),                    # COPY: not implemented
    b"Q" + struct.pack("!i", 2),                                # length below 4
    msg(b"Z"),                                                  # a backend message type
])
def test_bad_message_gets_fatal_error_and_close(start_server, analytical, bad) -> None:
    srv = start_server(analytical, secure=False, max_message_size=1 << 16)
    r = Raw(srv.port)
    r.startup()
    r.send(bad)
    rest = r.rest()  # the server closes the connection
    assert [k for k, _ in rest] == [b"E"]
    assert sqlstate(rest[0][1]) == "08P01"
    assert b"SFATAL" in rest[0][1]
    still_serves(srv.port)


def test_truncated_message_then_hangup(start_server, analytical) -> None:
    srv = start_server(analytical, secure=False)
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"Q", cstr("SELECT 1"))[:7])
    r.close()
    still_serves(srv.port)


@pytest.mark.parametrize("startup", [
    struct.pack("!i", 3),                                       # length below 8
    struct.pack("!i", 1 << 20),                                 # over 10,000
    struct.pack("!ii", 12, 1234 << 16) + b"\0\0\0\0",          # unknown protocol
])
def test_bad_startup_packets(start_server, analytical, startup) -> None:
    srv = start_server(analytical, secure=False)
    r = Raw(srv.port)
    r.send(startup)
    rest = r.rest()
    assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "08P01"
    still_serves(srv.port)


def test_execute_in_batches_suspends_the_portal(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine, secure=False)
    r = Raw(srv.port)
    r.startup()
    sql = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) " \
          "SELECT i FROM n"
    r.send(msg(b"P", cstr("") + cstr(sql) + struct.pack("!h", 0)) + bind([])
           + msg(b"E", cstr("") + struct.pack("!i", 2)) + msg(b"E", cstr("") + struct.pack("!i", 2))
           + msg(b"E", cstr("") + struct.pack("!i", 2)) + msg(b"S"))
    kinds = [k for k, _ in r.until(b"Z")]
    assert kinds == [b"1", b"2", b"D", b"D", b"s", b"D", b"D", b"s", b"D", b"C", b"Z"]
    r.close()


def test_error_in_extended_query_skips_to_sync(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine, secure=False)
    r = Raw(srv.port)
    r.startup()
    r.send(msg(b"P", cstr("") + cstr("SELECT $1") + struct.pack("!h", 0))
           + bind([b"a", b"b"])                                 # two values for one parameter
           + msg(b"E", cstr("") + struct.pack("!i", 0)) + msg(b"S"))
    got = r.until(b"Z")
    assert [k for k, _ in got] == [b"1", b"E", b"Z"]
    assert sqlstate(got[1][1]) == "08P01"
    r.send(msg(b"Q", cstr("SELECT 1")))  # the session goes on
    assert [k for k, _ in r.until(b"Z")] == [b"T", b"D", b"C", b"Z"]
    r.close()


def test_plaintext_refused_unless_allowed(start_server, analytical) -> None:
    import ssl

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # TLS offered, plaintext not allowed
    srv = start_server(analytical, secure=False, ssl_context=ctx, plaintext_loopback=False)
    r = Raw(srv.port)
    r.send(struct.pack("!i", 8 + 5 + 2 + 1) + struct.pack("!i", 196608) + cstr("user")
           + cstr("u") + b"\0")
    rest = r.rest()
    assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "28000"


def test_silent_client_is_dropped_at_the_login_timeout(start_server, analytical) -> None:
    srv = start_server(analytical, secure=False, login_timeout=0.5)
    r = Raw(srv.port)
    r.send(struct.pack("!i", 100))  # a slowloris: announces a startup packet, never sends it
    rest = r.rest()  # returns once the server closes the connection
    assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "08006"
    still_serves(srv.port)


def test_a_thousand_wrong_passwords(start_server, analytical, caplog) -> None:
    import base64
    import logging

    import psycopg

    from cryptdisk.server import ScramAuthenticator, UserStore
    from tests.server.conftest import PASSWORD, USER

    store = UserStore(analytical.db.path + ".users", analytical.keyring, iterations=4096)
    store.set_user(USER, PASSWORD, admin=True, create=True)
    srv = start_server(analytical, secure=False,
                       authenticator=ScramAuthenticator(store, delay=0, max_delay=0))
    caplog.set_level(logging.WARNING, "cryptdisk.server")
    proof = base64.b64encode(bytes(32)).decode()
    for _ in range(1000):
        r = Raw(srv.port)
        body = struct.pack("!i", 196608) + cstr("user") + cstr(USER) + b"\0"
        r.send(struct.pack("!i", len(body) + 4) + body)
        assert r.read()[0] == b"R"
        first = b"n,,n=,r=abcdefghijklmnop"
        r.send(msg(b"p", cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first))
        _, data = r.read()
        nonce = data[4:].decode().split(",")[0][2:]
        r.send(msg(b"p", f"c=biws,r={nonce},p={proof}".encode()))
        rest = r.rest()
        assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "28P01"
    assert "(failure 1000)" in caplog.text
    with psycopg.connect(host="127.0.0.1", port=srv.port, user=USER, password=PASSWORD,
                         dbname="d", sslmode="disable", autocommit=True) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_stop_lets_the_running_statement_finish(start_server, sqlite_engine) -> None:
    import threading

    import psycopg

    srv = start_server(sqlite_engine)
    results: list[object] = []
    stopped = threading.Event()

    def run() -> None:
        with psycopg.connect(**srv.dsn, autocommit=True) as c:
            results.append(c.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
                "WHERE i < 3000000) SELECT count(*) FROM n").fetchone())
            stopped.wait(120)
            try:
                c.execute("SELECT 1")
            except psycopg.OperationalError as exc:  # then the session was closed
                results.append(type(exc))

    worker = threading.Thread(target=run)
    worker.start()
    while not any(s.busy for s in list(srv.server.sessions)):
        worker.join(0.01)
    srv.stop()  # drains: the statement in flight finishes and its client gets the rows
    stopped.set()
    worker.join(120)
    assert results == [(3000000,), psycopg.errors.AdminShutdown]
    with pytest.raises(psycopg.OperationalError):  # and nothing listens any more
        psycopg.connect(**srv.dsn)


def test_idle_and_statement_timeouts(start_server, sqlite_engine) -> None:
    import psycopg

    srv = start_server(sqlite_engine, idle_timeout=0.5, statement_timeout=0.5)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            c.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) "
                      "SELECT count(*) FROM n")
        assert c.execute("SELECT 1").fetchone() == (1,)
        while srv.server.sessions:  # the server closes the idle session by itself
            srv.thread.join(0.05)
        with pytest.raises(psycopg.OperationalError, match="idle-session timeout"):
            c.execute("SELECT 1")


def test_max_connections(start_server, analytical) -> None:
    srv = start_server(analytical, secure=False, max_connections=2)
    first, second = Raw(srv.port), Raw(srv.port)
    first.startup()
    second.startup()
    third = Raw(srv.port)
    rest = third.startup()  # refused once its startup message is read, as PostgreSQL does
    assert third.rest() == []  # and closed
    assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "53300"
    first.close()
    second.close()


def test_max_connections_over_tls_says_why_and_still_takes_a_cancel(start_server,
                                                                     analytical) -> None:
    """At the limit a TLS client is refused after the handshake, so libpq shows the
    server's message (not 'server sent an error response during SSL exchange'), and a
    CancelRequest, which needs a connection of its own, still reaches a running query."""
    import threading

    import psycopg

    from tests.server.conftest import ENDLESS

    srv = start_server(analytical, max_connections=2)
    with psycopg.connect(**srv.dsn, autocommit=True) as first, \
            psycopg.connect(**srv.dsn, autocommit=True):
        with pytest.raises(psycopg.OperationalError, match="too many clients already"):
            psycopg.connect(**srv.dsn)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                first.execute(ENDLESS)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        for _ in range(120):
            first.cancel_safe()
            thread.join(1)
            if not thread.is_alive():
                break
        assert not thread.is_alive()
        assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.QueryCanceled)


def test_a_flood_of_idle_sockets_past_twice_max_connections_is_refused_at_once(
        start_server, analytical) -> None:
    """Past max_connections a client waits for its startup message (up to login_timeout)
    to be refused after TLS; past twice the limit one is refused at once, as PostgreSQL
    does past its limit of children, so sockets that say nothing hold no descriptors: a
    flood of them held one each for login_timeout, without bound."""
    import socket

    import psycopg

    srv = start_server(analytical, max_connections=1, login_timeout=600)
    with psycopg.connect(**srv.dsn, autocommit=True) as first:
        with socket.create_connection(("localhost", srv.port)) as waiting, \
                socket.create_connection(("localhost", srv.port)) as flood:
            flood.settimeout(60)  # (the refusal comes at once; 600 s without the fix)
            got = b""
            while chunk := flood.recv(4096):
                got += chunk
            assert got[:1] == b"E" and b"53300" in got and b"too many clients" in got
            waiting.setblocking(False)  # the one within twice the limit is still open
            with pytest.raises(BlockingIOError):
                waiting.recv(1)
        assert first.execute("SELECT 1").fetchall() == [(1,)]

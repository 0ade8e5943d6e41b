"""TLS (psql and psycopg with verify-full against a CA the tests make) and SCRAM-SHA-256 logins."""

from __future__ import annotations

import base64
import logging
import os
import socket
import ssl
import struct
import subprocess

import pg8000.native
import psycopg
import pytest

from cryptdisk.errors import LoginError, ServerError
from cryptdisk.server import (
    DEFAULT_ITERATIONS,
    ScramServer,
    UserStore,
    Verifier,
    end_point_hash,
    make_verifier,
    self_signed,
    server_context,
)
from tests.server.conftest import PASSWORD, USER
from tests.server.rawclient import Raw, cstr, msg, sqlstate

# RFC 7677 section 3
NONCE = "rOprNGfwEbeRWgbNEkqO"
SNONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
PROOF = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="


def rfc7677_exchange(verifier: Verifier, proof: str = PROOF) -> bytes:
    server = ScramServer(verifier, make_verifier("x", 4096), None, server_nonce=SNONCE)
    first = server.first("SCRAM-SHA-256", f"n,,n=user,r={NONCE}".encode())
    assert first == f"r={NONCE}{SNONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096".encode()
    return server.final(f"c=biws,r={NONCE}{SNONCE},p={proof}".encode())


def test_scram_rfc7677_vector() -> None:
    verifier = make_verifier("pencil", 4096, salt=SALT)
    assert rfc7677_exchange(verifier) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_wrong_proof_and_unknown_user_fail_alike() -> None:
    verifier = make_verifier("pencil", 4096, salt=SALT)
    bad = bytearray(base64.b64decode(PROOF))
    bad[0] ^= 1
    with pytest.raises(LoginError):
        rfc7677_exchange(verifier, base64.b64encode(bytes(bad)).decode())
    fake = make_verifier("pencil", 4096, salt=SALT)  # even the right proof fails for no user
    server = ScramServer(None, fake, None, server_nonce=SNONCE)
    server.first("SCRAM-SHA-256", f"n,,n=user,r={NONCE}".encode())
    with pytest.raises(LoginError):
        server.final(f"c=biws,r={NONCE}{SNONCE},p={PROOF}".encode())


def test_verifier_holds_no_password() -> None:
    v = make_verifier("correct horse", 4096)
    text = str(v)
    assert text.startswith("SCRAM-SHA-256$4096:") and "correct horse" not in text
    assert Verifier.parse(text) == v
    assert make_verifier("correct horse", 4096).salt != v.salt  # salted afresh
    assert DEFAULT_ITERATIONS == 600_000
    with pytest.raises(ValueError):
        make_verifier("pw", 1000)


def test_user_file_is_sealed(tmp_path, keyring) -> None:
    store = UserStore(tmp_path / "users", keyring, iterations=4096)
    store.set_user("alice", "hunter2hunter2", admin=True, create=True)
    raw = (tmp_path / "users").read_bytes()
    assert b"alice" not in raw and b"SCRAM" not in raw and b"hunter2" not in raw
    again = UserStore(tmp_path / "users", keyring)
    assert again.is_admin("alice") and str(again.verifier("alice")) == \
        str(store.verifier("alice"))


def test_psycopg_verify_full_and_channel_binding(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, channel_binding="require") as c:
        assert c.pgconn.ssl_in_use
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_a_client_that_does_not_trust_the_certificate_is_no_server_error(
        start_server, sqlite_engine, tmp_path, caplog) -> None:
    """A client refusing the certificate (another CA in its sslrootcert) ends its own
    handshake: the server logs one line at INFO, not 'session failed' with a traceback."""
    from tests.server.certs import make_ca_and_server

    caplog.set_level(logging.INFO, "cryptdisk")
    srv = start_server(sqlite_engine)
    other_ca, _cert, _key = make_ca_and_server(tmp_path)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(**{**srv.dsn, "sslrootcert": str(other_ca)})
    with psycopg.connect(**srv.dsn, autocommit=True) as c:  # the server goes on
        assert c.execute("SELECT 1").fetchone() == (1,)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "Traceback" not in caplog.text
    assert any("TLS with 127.0.0.1 failed" in r.getMessage() for r in caplog.records)


def test_tls13_preferred_and_tls12_accepted(start_server, sqlite_engine, certs) -> None:
    srv = start_server(sqlite_engine)
    for cap, expected in ((None, "TLSv1.3"), (ssl.TLSVersion.TLSv1_2, "TLSv1.2")):
        ctx = ssl.create_default_context(cafile=str(certs[0]))
        if cap:
            ctx.maximum_version = cap
        with socket.create_connection(("127.0.0.1", srv.port)) as s:
            s.sendall(struct.pack("!ii", 8, 80877103))
            assert s.recv(1) == b"S"
            with ctx.wrap_socket(s, server_hostname="localhost") as tls:
                assert tls.version() == expected
    assert server_context(certs[1], certs[2]).minimum_version == ssl.TLSVersion.TLSv1_2


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_3, ssl.TLSVersion.TLSv1_2])
def test_no_session_ticket_is_issued(start_server, sqlite_engine, certs, version) -> None:
    """As PostgreSQL: no session to resume, so every connection makes a full handshake
    with its certificate checks (TLS 1.3 would send two tickets after each handshake)."""
    srv = start_server(sqlite_engine)
    ctx = ssl.create_default_context(cafile=str(certs[0]))
    ctx.maximum_version = ctx.minimum_version = version
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(struct.pack("!ii", 8, 80877103))
        assert s.recv(1) == b"S"
        with ctx.wrap_socket(s, server_hostname="localhost") as tls:
            body = struct.pack("!i", 196608) + b"user\0nobody\0\0"
            tls.sendall(struct.pack("!i", len(body) + 4) + body)
            assert tls.recv(1) == b"R"  # the SCRAM request: TLS 1.3's tickets came before it
            assert tls.session is not None and not tls.session.has_ticket


def test_wrong_password_and_unknown_user_look_the_same(start_server, sqlite_engine,
                                                       caplog) -> None:
    srv = start_server(sqlite_engine)
    messages = []
    caplog.set_level(logging.WARNING, "cryptdisk.server")
    for user, password in ((USER, "wrong"), ("nobody", PASSWORD), (USER, "")):
        with pytest.raises(psycopg.OperationalError) as err:
            psycopg.connect(**{**srv.dsn, "user": user, "password": password or "x"})
        messages.append(str(err.value).replace(f'"{user}"', '"?"'))
    assert len(set(messages)) == 1 and "password authentication failed" in messages[0]
    assert "wrong" not in caplog.text and PASSWORD not in caplog.text.replace("pw'", "")
    assert "(failure 3)" in caplog.text  # the address's failures add up: the delay grows
    with psycopg.connect(**srv.dsn) as c:  # the right password still works
        assert c.execute("SELECT 1").fetchone() == (1,)


def test_only_scram_is_offered_and_cleartext_is_refused(start_server, analytical) -> None:
    srv = start_server(analytical, plaintext_loopback=True)
    r = Raw(srv.port)
    body = struct.pack("!i", 196608) + cstr("user") + cstr(USER) + b"\0"
    r.send(struct.pack("!i", len(body) + 4) + body)
    kind, data = r.read()
    assert kind == b"R" and struct.unpack("!i", data[:4])[0] == 10  # AuthenticationSASL
    assert data[4:] == b"SCRAM-SHA-256\0\0"  # no -PLUS without TLS, never MD5/cleartext
    r.send(msg(b"p", cstr(PASSWORD)))  # a cleartext password message
    rest = r.rest()
    assert [k for k, _ in rest] == [b"E"] and sqlstate(rest[0][1]) == "08P01"


def test_create_role_with_login_and_encrypted_password_as_admin_tools_write_them(
        start_server, analytical) -> None:
    """pgAdmin and DBeaver make a user with ``CREATE ROLE name WITH LOGIN PASSWORD '...'``
    and change its password with ``ALTER ROLE name [WITH] ENCRYPTED PASSWORD '...'``, as
    PostgreSQL takes them; both were syntax errors. ``CREATE ROLE`` without a password
    stays a role that cannot log in."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("CREATE ROLE carl WITH LOGIN PASSWORD 'carl pw'")
        admin.execute("CREATE ROLE readers NOLOGIN")
        assert admin.execute("SELECT name, is_admin FROM system.users WHERE name = 'carl'"
                             ).fetchall() == [("carl", False)]
        assert admin.execute("SELECT role FROM system.roles").fetchall() == [("readers",)]
    with psycopg.connect(**{**srv.dsn, "user": "carl", "password": "carl pw"},
                         autocommit=True) as carl:
        carl.execute("ALTER ROLE carl WITH ENCRYPTED PASSWORD 'new pw'")  # its own: allowed
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("ALTER USER carl ENCRYPTED PASSWORD 'newer pw'")
        with pytest.raises(psycopg.errors.SyntaxError):
            admin.execute("CREATE ROLE dora WITH LOGIN")  # a login needs a password here
    with psycopg.connect(**{**srv.dsn, "user": "carl", "password": "newer pw"}) as carl:
        assert carl.execute("SELECT current_user").fetchone() == ("carl",)


def test_a_quoted_login_is_a_role_name_not_the_login_option(start_server, sqlite_engine) -> None:
    """``"login"`` is an identifier: ``CREATE ROLE "login" PASSWORD '...'`` (no LOGIN
    option) makes no user that can log in, and ``CREATE ROLE "login"`` a role of that name.
    The quoted name was taken as the LOGIN option, making a user named login."""
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        with pytest.raises(psycopg.errors.SyntaxError):
            admin.execute("CREATE ROLE \"login\" PASSWORD 'login pw'")
        assert admin.execute("SELECT name FROM system.users WHERE name = 'login'"
                             ).fetchall() == []
        admin.execute('CREATE ROLE "login"')
        assert admin.execute("SELECT role FROM system.roles").fetchall() == [("login",)]
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**{**srv.dsn, "user": "login", "password": "login pw"})


def test_load_tls_reads_the_certificate_once(certs, tmp_path, monkeypatch) -> None:
    """The channel-binding hash load_tls gives is the one of the certificate its context
    serves, even when the file is replaced while it loads (a renewal): it read the file a
    second time for the hash, so SCRAM-SHA-256-PLUS would bind to a certificate no client
    was shown."""
    from cryptdisk.server import _tls
    from tests.server.certs import make_ca_and_server

    ca, cert, key = certs
    (tmp_path / "other").mkdir()
    _, other_cert, _ = make_ca_and_server(tmp_path / "other")
    real = _tls.server_context

    def replaced_after_loading(*args, **kwargs):
        ctx = real(*args, **kwargs)
        cert.write_bytes(other_cert.read_bytes())  # renewed right after the context loaded
        return ctx

    monkeypatch.setattr(_tls, "server_context", replaced_after_loading)
    ctx, binding = _tls.load_tls(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    served: list[bytes] = []

    def accept() -> None:
        conn, _ = listener.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)

    import threading
    worker = threading.Thread(target=accept)
    worker.start()
    client = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(listener.getsockname()) as raw, \
            client.wrap_socket(raw, server_hostname="localhost") as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        served.append(der)
        tls.sendall(b"x")
    worker.join(10)
    listener.close()
    assert binding == end_point_hash(served[0])
    with pytest.raises(ServerError, match="cannot load the TLS certificate"):
        _tls.load_tls(tmp_path / "missing.pem", key)


def test_user_statements(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("CREATE USER bob WITH PASSWORD 'b''s pw'")
        with pytest.raises(psycopg.errors.DuplicateObject):
            admin.execute("CREATE USER bob PASSWORD 'x'")
        rows = admin.execute("SELECT * FROM system.users").fetchall()
        assert rows == [("bob", False, "SCRAM-SHA-256", 4096), (USER, True, "SCRAM-SHA-256", 4096)]
        admin.execute("CREATE ROLE analysts")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**{**srv.dsn, "user": "analysts", "password": "x"})  # roles never log in
    native = pg8000.native.Connection(user=USER, password=PASSWORD, host="localhost",
                                      port=srv.port, ssl_context=ssl.create_default_context(
                                          cafile=srv.dsn["sslrootcert"]))
    try:  # pg8000 describes the prepared statement before it binds: the same columns
        assert native.run("SELECT * FROM system.users")[0] == ["bob", False, "SCRAM-SHA-256",
                                                              4096]
    finally:
        native.close()
    bob = {**srv.dsn, "user": "bob", "password": "b's pw"}
    with psycopg.connect(**bob, autocommit=True) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("CREATE USER eve PASSWORD 'x'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(f"ALTER USER {USER} PASSWORD 'taken over'")
        c.execute("ALTER USER bob PASSWORD 'new pw'")
    with psycopg.connect(**{**bob, "password": "new pw"}, autocommit=True) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("DROP USER bob")
        with pytest.raises(psycopg.errors.UndefinedObject):
            admin.execute("DROP USER bob")
        admin.execute("DROP USER IF EXISTS bob")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(**{**bob, "password": "new pw"})


def test_psql_verify_full(start_server, sqlite_engine, certs, tmp_path) -> None:
    srv = start_server(sqlite_engine)
    env = {**os.environ, "PGPASSWORD": PASSWORD, "PGCONNECT_TIMEOUT": "20"}
    conninfo = (f"host=localhost port={srv.port} user={USER} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    out = subprocess.run(["psql", conninfo, "-Atc", "CREATE TABLE t (a INTEGER, b TEXT); "
                          "INSERT INTO t VALUES (1, 'one'); SELECT a, b FROM t"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["CREATE", "TABLE", "INSERT", "0", "1", "1|one"]
    # a certificate the client's CA did not sign is refused by verify-full
    self_signed(tmp_path / "other.pem", tmp_path / "other.key")
    bad = conninfo.replace(str(certs[0]), str(tmp_path / "other.pem"))
    out = subprocess.run(["psql", bad, "-Atc", "SELECT 1"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "certificate verify failed" in out.stderr


def test_client_certificate_required_per_user(start_server, sqlite_engine, certs,
                                              tmp_path) -> None:
    from tests.server.certs import make_ca_and_server, make_client

    ca, cert, key = certs
    srv = start_server(sqlite_engine, ssl_context=server_context(cert, key, client_ca=ca))
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("CREATE USER dora PASSWORD 'dora pw' CLIENTCERT")
        assert ("dora", False, "SCRAM-SHA-256 + client certificate", 4096) in \
            admin.execute("SELECT * FROM system.users").fetchall()
    dora = {**srv.dsn, "user": "dora", "password": "dora pw"}
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**dora)                                   # no certificate
    other_cert, other_key = make_client(tmp_path, "eve", ca.parent)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(**dora, sslcert=str(other_cert), sslkey=str(other_key))  # not hers
    (tmp_path / "rogue").mkdir()
    make_ca_and_server(tmp_path / "rogue")                        # a CA the server does not know
    rogue_cert, rogue_key = make_client(tmp_path / "rogue", "dora", tmp_path / "rogue")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(**dora, sslcert=str(rogue_cert), sslkey=str(rogue_key))
    dora_cert, dora_key = make_client(tmp_path, "dora", ca.parent)
    with psycopg.connect(**dora, sslcert=str(dora_cert), sslkey=str(dora_key)) as c:
        assert c.execute("SELECT 1").fetchone() == (1,)
    with psycopg.connect(**srv.dsn) as c:  # users without CLIENTCERT need no certificate
        assert c.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_psql_dt_lists_tables(start_server, engine, request, certs) -> None:
    srv = start_server(request.getfixturevalue(engine))
    env = {**os.environ, "PGPASSWORD": PASSWORD}
    conninfo = (f"host=localhost port={srv.port} user={USER} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    setup = ["CREATE TABLE zeta (a INTEGER)", "CREATE TABLE alpha (b INTEGER)"]
    if engine == "sqlite_engine":
        setup.append("CREATE VIEW beta AS SELECT a FROM zeta")
    args = ["psql", conninfo, "-At"]
    for st in setup:
        args += ["-c", st]
    out = subprocess.run([*args, "-c", "\\dt", "-c", "\\dt al*"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = [line for line in out.stdout.splitlines() if line.startswith("public|")]
    assert listed == ["public|alpha|table|cryptdisk", "public|zeta|table|cryptdisk",
                      "public|alpha|table|cryptdisk"]

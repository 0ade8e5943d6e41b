"""``cryptdisk serve`` end to end: users, a self-signed certificate, psql, SIGTERM."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding


def cryptdisk(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, timeout=120, env=env, **kw)


@pytest.fixture
def env() -> dict:
    return {**os.environ, "CRYPTDISK_PASSWORD": "pw of alice"}


def start(args: list[str], env: dict, cwd) -> tuple[subprocess.Popen, int, list[str]]:
    proc = subprocess.Popen([sys.executable, "-m", "cryptdisk", "serve", *args,
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        if m:
            return proc, int(m[1]), lines
    proc.wait(30)
    raise AssertionError(f"server did not start: {lines} {proc.stderr.read()}")


def test_serve_self_signed_psql_and_sigterm(tmp_path, env) -> None:
    db = str(tmp_path / "sales.db")
    out = cryptdisk("serve", db, env=env)  # no database: refused with the way out
    assert out.returncode == 1 and "no cryptdisk database" in out.stderr, out.stderr
    assert f"cryptdisk sql {db} --create" in out.stderr and os.listdir(tmp_path) == []
    out = cryptdisk("sql", db, "--create", "-q", "SELECT 1", env=env)
    assert out.returncode == 0, out.stderr
    out = cryptdisk("serve", db, env=env)  # no users yet: refused with the way out
    assert out.returncode == 1 and "no users" in out.stderr and "--add-user" in out.stderr
    out = cryptdisk("serve", db, "--add-user", "alice", "--admin", env=env)
    assert out.returncode == 0, out.stderr
    assert "pw of alice" not in out.stdout + out.stderr
    proc, port, lines = start([db, "--self-signed"], env, tmp_path)
    try:
        cert = tmp_path / "sales.db.server.pem"
        der = x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(Encoding.DER)
        assert hashlib.sha256(der).digest().hex(":").upper() in lines[0]
        pg_env = {**os.environ, "PGPASSWORD": "pw of alice"}
        conninfo = (f"host=localhost port={port} user=alice dbname=sales sslmode=verify-full "
                    f"sslrootcert={cert}")
        q = subprocess.run(["psql", conninfo, "-Atc", "SELECT 40 + 2"], env=pg_env,
                           capture_output=True, text=True, timeout=60)
        assert (q.returncode, q.stdout.strip()) == (0, "42"), q.stderr
        q = subprocess.run(["psql", conninfo.replace("verify-full", "disable"), "-Atc",
                            "SELECT 1"], env=pg_env, capture_output=True, text=True, timeout=60)
        assert q.returncode != 0 and "TLS connections only" in q.stderr
        idle = psycopg.connect(conninfo, password="pw of alice", autocommit=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert "stopped" in proc.stdout.read()
        with pytest.raises(psycopg.OperationalError):  # the idle session was closed
            idle.execute("SELECT 1")
        idle.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_serve_sqlite_needs_keys(tmp_path) -> None:
    out = cryptdisk("serve", str(tmp_path / "app.db"), "--sqlite",
                    env={k: v for k, v in os.environ.items() if k != "CRYPTDISK_KEYRING"})
    assert out.returncode == 1 and "no key given" in out.stderr


def test_serve_sqlite_with_a_server_section(tmp_path) -> None:
    import ssl

    import pg8000.native

    from tests.server.certs import sqlite_serve_config

    ca, cert, config = sqlite_serve_config(tmp_path, "cryptdisk.toml", "ab" * 32,
                                           "statement_timeout = 30\n")
    env = {**os.environ, "CRYPTDISK_PASSWORD": "pw of alice"}
    db = str(tmp_path / "app.db")
    out = cryptdisk("serve", db, "--sqlite", "--config", str(config), "--add-user", "alice",
                    "--admin", env=env)
    assert out.returncode == 0 and "4096 iterations" in out.stdout, out.stderr
    out = cryptdisk("serve", db, "--sqlite", "--config", str(config), "--check", env=env)
    assert out.returncode == 0 and "1 user(s)" in out.stdout and str(cert) in out.stdout
    config.write_text(config.read_text() + "listen_on = 'x'\n")
    out = cryptdisk("serve", db, "--sqlite", "--config", str(config), "--check", env=env)
    assert out.returncode == 1 and "unknown [server] setting(s) listen_on" in out.stderr
    config.write_text(config.read_text().replace("listen_on = 'x'\n", ""))
    proc, port, _ = start([db, "--sqlite", "--config", str(config)], env, tmp_path)
    try:
        conn = pg8000.native.Connection(user="alice", password="pw of alice", host="localhost",
                                        port=port, ssl_context=ssl.create_default_context(
                                            cafile=str(ca)))
        conn.run("CREATE TABLE t (a INTEGER)")
        conn.run("INSERT INTO t VALUES (:a)", a=7)
        assert conn.run("SELECT a FROM t") == [[7]]
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        proc.stdout.close()
        proc.stderr.close()


def test_sigterm_as_soon_as_it_serves_stops_every_worker_cleanly(tmp_path) -> None:
    """SIGTERM sent the moment ``serve`` says it serves reaches workers that may still be
    starting: each drains and exits 0 (none is killed by the signal before its handler
    is in place), and so does serve."""
    from tests.server.certs import sqlite_serve_config

    _ca, _cert, config = sqlite_serve_config(tmp_path, "cryptdisk.toml", "ab" * 32)
    env = {**os.environ, "CRYPTDISK_PASSWORD": "pw of alice"}
    db = str(tmp_path / "app.db")
    out = cryptdisk("serve", db, "--sqlite", "--config", str(config), "--add-user", "alice",
                    env=env)
    assert out.returncode == 0, out.stderr
    for _ in range(3):
        proc, _port, lines = start([db, "--sqlite", "--config", str(config), "--workers",
                                    "3"], env, tmp_path)
        try:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(60)
            rest = proc.stdout.read()
            errors = proc.stderr.read()
            assert code == 0, (lines, rest, errors)
            assert "stopped: every worker drained" in rest
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()


@pytest.mark.parametrize("engine_args", [["--sqlite", "--workers", "2"], []])
def test_sighup_reloads_the_certificate_and_reopens_the_access_log(tmp_path,
                                                                   engine_args) -> None:
    """SIGHUP (logrotate's postrotate, a renewed certificate) reloads instead of killing
    the server: every worker takes the certificate now in the files (SCRAM's channel
    binding follows it), a plain access log moved away is written anew, and a certificate
    that does not load leaves the one loaded before in use."""
    import time

    from tests.server.certs import make_ca_and_server, sqlite_serve_config

    log_path = tmp_path / "access.log"
    ca, cert, config = sqlite_serve_config(tmp_path, "cryptdisk.toml", "ab" * 32,
                                           f'access_log = "{log_path}"\n')
    key = cert.with_name("server.key")
    if not engine_args:  # the analytical database: its tables' storage too
        config.write_text(config.read_text() + '[disks.local]\ntype = "local"\n'
                          f'path = "{tmp_path / "data"}"\n[policies.default]\n'
                          'volumes = [{ name = "main", disks = ["local"] }]\n')
    env = {**os.environ, "CRYPTDISK_PASSWORD": "pw of alice"}
    db = str(tmp_path / "app.db")
    if not engine_args:
        out = cryptdisk("sql", db, "--create", "-c", str(config), "-q", "SELECT 1")
        assert out.returncode == 0, out.stderr
    out = cryptdisk("serve", db, *engine_args, "--config", str(config), "--add-user", "alice",
                    env=env)
    assert out.returncode == 0, out.stderr
    proc, port, _ = start([db, *engine_args, "--config", str(config)], env, tmp_path)

    def connect(root_ca) -> psycopg.Connection:
        return psycopg.connect(host="localhost", port=port, user="alice",
                               password="pw of alice", sslmode="verify-full",
                               sslrootcert=str(root_ca), channel_binding="require",
                               autocommit=True)

    try:
        with connect(ca) as c:
            assert c.execute("SELECT 1").fetchall() == [(1,)]
        os.rename(log_path, tmp_path / "access.log.1")
        cert.write_text("not a certificate")  # a reload that fails keeps the old one
        proc.send_signal(signal.SIGHUP)
        for _ in range(200):  # reopened at the reload
            if log_path.exists():
                break
            time.sleep(0.05)
        for _ in range(3):
            with connect(ca) as c:
                assert c.execute("SELECT 2").fetchall() == [(2,)]
        (tmp_path / "tls2").mkdir()
        ca2, cert2, key2 = make_ca_and_server(tmp_path / "tls2")
        cert.write_bytes(cert2.read_bytes())
        key.write_bytes(key2.read_bytes())
        proc.send_signal(signal.SIGHUP)
        held: list[psycopg.Connection] = []
        for _ in range(200):  # each worker reloads as it gets the signal
            try:
                while len(held) < 4:  # held open: spread over the workers
                    held.append(connect(ca2))
                break
            except psycopg.OperationalError:
                for c in held:
                    c.close()
                held = []
                time.sleep(0.05)
        assert len(held) == 4
        for c in held:
            assert c.execute("SELECT 3").fetchall() == [(3,)]
            c.close()
        with pytest.raises(psycopg.OperationalError, match="SSL error"):
            connect(ca)  # the old CA does not sign the certificate now served
        assert proc.poll() is None  # still serving
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        errors = proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
    assert code == 0, errors
    assert "cannot load the TLS certificate" in errors
    old = (tmp_path / "access.log.1").read_text().splitlines()
    new = log_path.read_text().splitlines()
    assert len(old) == 1 and len(new) >= 3  # SELECT 1 before the move, the rest after


@pytest.mark.parametrize("line, setting", [
    ('max_connections = "lots"', "max_connections"),      # was an internal error
    ("max_connections = 0", "max_connections"),           # was a server refusing everyone
    ('statement_timeout = "abc"', "statement_timeout"),   # was an internal error
    ("idle_timeout = -5", "idle_timeout"),
    ("login_timeout = 0", "login_timeout"),               # was every login timing out
    ("max_copy_size = 1.5", "max_copy_size"),
    ('access_log_encrypted = "yes"', "access_log_encrypted"),
])
def test_check_refuses_a_bad_number_in_the_server_section(tmp_path, line, setting) -> None:
    from tests.server.certs import sqlite_serve_config

    _ca, _cert, config = sqlite_serve_config(tmp_path, "cryptdisk.toml", "ab" * 32, line + "\n")
    out = cryptdisk("serve", str(tmp_path / "app.db"), "--sqlite", "--config", str(config),
                    "--check")
    assert out.returncode == 1
    assert f"[server] {setting} must be" in out.stderr and "internal error" not in out.stderr


def test_a_sqlite_server_takes_a_key_promoted_by_another_process(tmp_path, env) -> None:
    """``cryptdisk keys add`` + ``keys promote`` in another process while ``serve --sqlite
    -c C`` runs: the server reads the rewrapped user file and database with the new key
    and writes them under it, so ``keys retire`` of the old key goes through after it
    wrote, and logins go on (it kept its start-up keyring: 'no key with id 2')."""
    import sqlite3

    assert cryptdisk("keygen", "-o", str(tmp_path / "k1.key")).returncode == 0
    config = tmp_path / "c.toml"
    config.write_text('[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\n'
                      f'file = "{tmp_path / "k1.key"}"\n')
    plain = sqlite3.connect(tmp_path / "p.sqlite")
    plain.execute("CREATE TABLE t (a)")
    plain.commit()
    plain.close()
    db, users = str(tmp_path / "app.db"), str(tmp_path / "app.db.users")
    c = ("-c", str(config))
    assert cryptdisk("sqlite", "encrypt", str(tmp_path / "p.sqlite"), db, *c).returncode == 0
    out = cryptdisk("serve", db, "--sqlite", *c, "--add-user", "alice", "--admin", env=env)
    assert out.returncode == 0, out.stderr
    proc, port, _ = start([db, "--sqlite", *c, "--plaintext-loopback", "--workers", "1"],
                          env, tmp_path)
    try:
        def connect(user: str, password: str) -> psycopg.Connection:
            return psycopg.connect(host="127.0.0.1", port=port, user=user,
                                   password=password, sslmode="disable", autocommit=True)

        with connect("alice", "pw of alice") as conn:
            conn.execute("INSERT INTO t VALUES (1)")
            out = cryptdisk("keys", "add", "2", *c, "--generate", str(tmp_path / "k2.key"))
            assert out.returncode == 0, out.stderr
            out = cryptdisk("keys", "promote", "2", *c, db, users)
            assert out.returncode == 0, out.stdout + out.stderr
        with connect("alice", "pw of alice") as conn:  # the user file is under key 2
            conn.execute("CREATE USER bob PASSWORD 'pw of bob'")  # writes the user file
            conn.execute("INSERT INTO t VALUES (2)")
        out = cryptdisk("keys", "retire", "1", *c, db, users)
        assert out.returncode == 0, out.stdout + out.stderr
        with connect("bob", "pw of bob") as conn:
            assert conn.execute("SELECT 1").fetchall() == [(1,)]
        with connect("alice", "pw of alice") as conn:
            assert conn.execute("SELECT a FROM t ORDER BY a").fetchall() == [(1,), (2,)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        proc.stdout.close()
        proc.stderr.close()


def _key_id(path) -> int:
    from cryptdisk.format import HEADER_SIZE, Header

    with open(path, "rb") as f:
        return Header.parse(f.read(HEADER_SIZE), str(path)).key_id


def test_system_rotate_keys_finishing_a_rotation_makes_the_server_write_under_the_new_key(
        tmp_path, env) -> None:
    """A `cryptdisk rotate --new-key` stopped after it staged the key, then `cryptdisk
    serve`; a client's SYSTEM ROTATE KEYS finishes the rotation: from then on the server
    writes its user file (and the parts) under the new key, and reads on (it kept its
    start-up keyring for the user file: CREATE USER wrote it under key 1 again, after the
    rotation had reported success and rewrapped it under key 2)."""
    from cryptdisk.db._keyfiles import stage_current_key
    from cryptdisk.keys import Key

    db = tmp_path / "s.db"
    out = cryptdisk("sql", str(db), "--create", "-q",
                    "CREATE TABLE t (a INT); INSERT INTO t VALUES (1)", env=env)
    assert out.returncode == 0, out.stderr
    out = cryptdisk("serve", str(db), "--add-user", "alice", "--admin", env=env)
    assert out.returncode == 0, out.stderr
    assert stage_current_key(str(db), Key(2, os.urandom(32)))  # the stopped rotation
    proc, port, _ = start([str(db), "--plaintext-loopback", "--workers", "1"], env, tmp_path)
    try:
        def connect(user: str, password: str) -> psycopg.Connection:
            return psycopg.connect(host="127.0.0.1", port=port, user=user,
                                   password=password, sslmode="disable", autocommit=True)

        with connect("alice", "pw of alice") as conn:
            conn.execute("SYSTEM ROTATE KEYS")
            assert _key_id(f"{db}.users") == 2
            conn.execute("INSERT INTO t VALUES (2)")
            conn.execute("CREATE USER bob PASSWORD 'pw of bob'")  # writes the user file
            assert _key_id(f"{db}.users") == 2
            keys = conn.execute("SELECT id, is_current, files FROM system.keys "
                                "ORDER BY id").fetchall()
            assert [(int(i), c, n) for i, c, n in keys] == [(1, False, 0), (2, True, 5)]
        with connect("bob", "pw of bob") as conn:  # the user file read under key 2
            assert conn.execute("SELECT 1").fetchall() == [(1,)]
        with connect("alice", "pw of alice") as conn:
            assert conn.execute("SELECT a FROM t ORDER BY a").fetchall() == [(1,), (2,)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        proc.stdout.close()
        proc.stderr.close()
    for part in (db / "data").rglob("*.parquet"):
        assert _key_id(part) == 2


def test_system_rotate_keys_rewraps_to_the_key_another_process_made_current_in_the_config(
        tmp_path, env) -> None:
    """`cryptdisk keys add` + `keys promote` (no --db: the server holds the database) in
    another process while `serve -c C` runs, then a client's SYSTEM ROTATE KEYS: every file
    is rewrapped under key 2 and the server writes under it from then on (it rotated to
    the start-up keyring's key 1: the rotation reported success, every file stayed under
    key 1, and new parts and the user file were written under it)."""
    assert cryptdisk("keygen", "-o", str(tmp_path / "k1.key")).returncode == 0
    config = tmp_path / "c.toml"
    config.write_text(
        f'[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\nfile = "{tmp_path}/k1.key"\n'
        f'[disks.raw]\ntype = "local"\npath = "{tmp_path}/data"\n'
        '[disks.secure]\ntype = "encrypted"\ndisk = "raw"\n'
        '[policies.default]\nvolumes = [{ name = "main", disks = ["secure"] }]\n')
    db, c = tmp_path / "s.db", ("-c", str(config))
    out = cryptdisk("sql", str(db), *c, "--create", "-q",
                    "CREATE TABLE t (a INT); INSERT INTO t VALUES (1)", env=env)
    assert out.returncode == 0, out.stderr
    out = cryptdisk("serve", str(db), *c, "--add-user", "alice", "--admin", env=env)
    assert out.returncode == 0, out.stderr
    proc, port, _ = start([str(db), *c, "--plaintext-loopback", "--workers", "1"], env,
                          tmp_path)
    try:
        with psycopg.connect(host="127.0.0.1", port=port, user="alice",
                             password="pw of alice", sslmode="disable",
                             autocommit=True) as conn:
            out = cryptdisk("keys", "add", "2", *c, "--generate", str(tmp_path / "k2.key"))
            assert out.returncode == 0, out.stderr
            out = cryptdisk("keys", "promote", "2", *c)
            assert out.returncode == 0, out.stderr
            conn.execute("SYSTEM ROTATE KEYS")
            assert _key_id(f"{db}.users") == 2 and _key_id(db / "catalog") == 2
            conn.execute("INSERT INTO t VALUES (2)")
            conn.execute("CREATE USER bob PASSWORD 'pw of bob'")
            keys = conn.execute("SELECT id, is_current, files FROM system.keys "
                                "ORDER BY id").fetchall()
            assert [(int(i), cur, n) for i, cur, n in keys] == [(1, False, 0), (2, True, 5)]
            assert conn.execute("SELECT a FROM t ORDER BY a").fetchall() == [(1,), (2,)]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        proc.stdout.close()
        proc.stderr.close()
    assert _key_id(f"{db}.users") == 2
    parts = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert len(parts) == 2 and all(_key_id(p) == 2 for p in parts)
    out = cryptdisk("keys", "retire", "1", *c, "--db", str(db))  # nothing is under key 1
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("kind", ["analytical", "sqlite"])
def test_serve_run_in_process_closes_what_it_opened(tmp_path, monkeypatch, kind) -> None:
    """``cryptdisk serve --add-user`` (and ``--check``) run by cryptdisk.cli.main in a
    process that goes on: each left its engine and its user store open until collected,
    so a second --add-user in the same process failed with "open for writing by another
    connection in this process" (the analytical database's lock) and descriptors grew
    (the store's lock file, twice; a SQLite server's write-lock file, which the engine's
    close left open). Now every way out of the command closes them: the descriptors are
    back where they were, the collector kept from running."""
    import gc

    from cryptdisk.cli import main
    from tests.server.certs import sqlite_serve_config

    monkeypatch.setenv("CRYPTDISK_PASSWORD", "pw of alice")
    if kind == "sqlite":
        _ca, _cert, config = sqlite_serve_config(tmp_path, "cryptdisk.toml", "ab" * 32, "")
        args = [str(tmp_path / "app.db"), "--sqlite", "--config", str(config)]
    else:
        db = str(tmp_path / "sales.db")
        assert cryptdisk("sql", db, "--create", "-q", "SELECT 1").returncode == 0
        args = [db, "--self-signed"]

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    def fdmap() -> dict[str, str]:
        out = {}
        for f in os.listdir("/proc/self/fd"):
            try:
                out[f] = os.readlink(f"/proc/self/fd/{f}")
            except OSError:
                pass
        return out

    assert main(["serve", *args, "--add-user", "alice", "--admin"]) == 0  # (files made)
    gc.collect()
    gc.disable()
    try:
        before = descriptors()
        first = fdmap()
        for name in ("bob", "carol", "dave"):
            assert main(["serve", *args, "--add-user", name]) == 0
            assert main(["serve", *args, "--check"]) == 0
            assert descriptors() == before, {k: v for k, v in fdmap().items() if k not in first}
    finally:
        gc.enable()
    out = cryptdisk("serve", *args, "--check")
    assert out.returncode == 0 and "4 user(s)" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("encrypted", [False, True])
def test_check_creates_no_access_log(tmp_path, env, encrypted) -> None:
    """``serve --check`` creates and changes no file, but with ``[server] access_log`` it
    opened the access log for appending, which created it (empty, or an encrypted header).
    Now --check checks that its directory exists (and that an encrypted log there opens
    under the keys) and creates nothing; the server makes the log when it starts."""
    from tests.server.certs import sqlite_serve_config

    line = f'access_log = "{tmp_path / "logs" / "access.log"}"\n' + (
        "access_log_encrypted = true\n" if encrypted else "")
    _ca, _cert, config = sqlite_serve_config(tmp_path, "cryptdisk.toml", "ab" * 32, line)
    db = str(tmp_path / "app.db")
    serve = ["serve", db, "--sqlite", "--config", str(config)]
    out = cryptdisk(*serve, "--add-user", "alice", "--admin", env=env)
    assert out.returncode == 0, out.stderr
    (tmp_path / "logs").mkdir()
    out = cryptdisk(*serve, "--check", env=env)
    assert out.returncode == 0 and out.stdout.startswith("ok: "), out.stdout + out.stderr
    assert os.listdir(tmp_path / "logs") == []
    (tmp_path / "logs").rmdir()  # where the server could not make it: said, by its path
    out = cryptdisk(*serve, "--check", env=env)
    assert out.returncode == 1 and str(tmp_path / "logs") in out.stderr, out.stderr
    (tmp_path / "logs").mkdir()
    if encrypted:  # a log there under other keys: refused as the server would refuse it
        from cryptdisk import Keyring
        from cryptdisk.format import open_log

        with open_log(tmp_path / "logs" / "access.log", keys=Keyring.generate()) as f:
            f.write(b"{}\n")
        out = cryptdisk(*serve, "--check", env=env)
        assert out.returncode == 1 and "access.log" in out.stderr, out.stdout + out.stderr


def test_a_log_that_cannot_be_opened_is_named_before_the_server_listens(tmp_path, env) -> None:
    """An access log (or the analytical database's audit log) in a missing directory, under
    a file, or at a directory gave the bare OSError (`/x/y.log: No such file or directory`),
    saying neither which log nor which setting. Now it is one error naming the log, its
    path, why and the [server] setting, and the server never starts."""
    from tests.server.certs import sqlite_serve_config

    _ca, _cert, config = sqlite_serve_config(tmp_path, "c.toml", "ab" * 32,
                                             "plaintext = \"loopback\"\n")
    db = str(tmp_path / "app.db")
    serve = ["serve", db, "--sqlite", "--config", str(config), "--listen", "127.0.0.1:0",
             "--workers", "1"]
    out = cryptdisk(*serve, "--add-user", "alice", "--admin", env=env)
    assert out.returncode == 0, out.stderr
    text = config.read_text()
    (tmp_path / "file").write_text("x")
    for where, why in [(tmp_path / "no" / "dir" / "x.log",
                        f"its directory {tmp_path / 'no' / 'dir'} does not exist"),
                       (tmp_path / "file" / "x.log",
                        f"its directory {tmp_path / 'file'} is not a directory"),
                       (tmp_path, "cannot open it: Is a directory")]:
        config.write_text(text + f'access_log = "{where}"\n')
        out = cryptdisk(*serve, env=env)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert out.stderr.splitlines()[0] == f"cryptdisk: error: the access log {where}: {why}"
        assert "[server] access_log" in out.stderr and "serving" not in out.stdout
    config = tmp_path / "a.toml"
    config.write_text(
        f'[keyring]\n[[keyring.keys]]\nid = 1\nhex = "{"cd" * 32}"\n'
        f'[disks.raw]\ntype = "local"\npath = "{tmp_path}/data"\n'
        '[policies.default]\nvolumes = [{ name = "main", disks = ["raw"] }]\n'
        f'[server]\nplaintext = "loopback"\nscram_iterations = 4096\n'
        f'audit_log = "{tmp_path}/gone/s.audit"\n')
    out = cryptdisk("sql", str(tmp_path / "s.db"), "-c", str(config), "--create", "-q",
                    "SELECT 1", env=env)
    assert out.returncode == 0, out.stderr
    out = cryptdisk("serve", str(tmp_path / "s.db"), "-c", str(config), "--add-user", "alice",
                    env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[0] == (f"cryptdisk: error: the audit log {tmp_path}/gone/"
                                          f"s.audit: its directory {tmp_path}/gone does not "
                                          "exist")


def test_serve_sqlite_on_a_directory_or_check_on_no_file_is_a_clear_error(tmp_path,
                                                                           env) -> None:
    """`serve DIR --sqlite` was an internal error (apsw's CantOpenError, 'this is a bug'),
    and `serve MISSING --sqlite --check`, which creates nothing, created an empty MISSING.
    Both are now one error, and --check leaves no file."""
    from tests.server.certs import sqlite_serve_config

    _ca, _cert, config = sqlite_serve_config(tmp_path, "c.toml", "ab" * 32)
    (tmp_path / "d").mkdir()
    out = cryptdisk("serve", str(tmp_path / "d"), "--sqlite", "-c", str(config), "--check",
                    env=env)
    assert out.returncode == 1 and "internal error" not in out.stderr, out.stderr
    assert out.stderr.splitlines()[0] == (f"cryptdisk: error: {tmp_path / 'd'} is a "
                                          "directory, not an encrypted SQLite file")
    missing = tmp_path / "missing.db"
    out = cryptdisk("serve", str(missing), "--sqlite", "-c", str(config), "--check", env=env)
    assert out.returncode == 1 and out.stderr.splitlines()[0] == (
        f"cryptdisk: error: no SQLite database at {missing}"), out.stderr
    assert not missing.exists()


def test_serve_sqlite_on_no_file_and_no_users_creates_nothing(tmp_path, env) -> None:
    """`serve MISSING --sqlite` (no --add-user, no users file) created an empty encrypted
    MISSING (and its key material's first use) and then stopped at 'no users': a mistyped
    path left a database behind. Now it stops first, with the error --check gives."""
    from tests.server.certs import sqlite_serve_config

    _ca, _cert, config = sqlite_serve_config(tmp_path, "c.toml", "ab" * 32)
    missing = tmp_path / "missing.db"
    before = sorted(p.name for p in tmp_path.iterdir())
    out = cryptdisk("serve", str(missing), "--sqlite", "-c", str(config), env=env)
    assert out.returncode == 1 and out.stderr.splitlines()[0] == (
        f"cryptdisk: error: no SQLite database at {missing}"), out.stderr
    assert "--add-user" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_serve_on_an_address_in_use_names_the_address(tmp_path, env) -> None:
    """One server process (--workers 1) on a port another socket holds said only
    'cryptdisk: error: Address already in use', naming no address (the supervisor of
    several workers named it). Both now say which address could not be listened on."""
    import socket

    import cryptdisk as cd

    db = str(tmp_path / "sales.db")
    cd.connect(db).close()
    assert cryptdisk("serve", db, "--add-user", "alice", "--admin", env=env).returncode == 0
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = cryptdisk("serve", db, "--self-signed", "--listen", f"127.0.0.1:{port}",
                        env=env)
    assert out.returncode == 1, out
    assert out.stderr == (f"cryptdisk: error: cannot listen on 127.0.0.1:{port}: Address "
                          "already in use\n"), out.stderr  # 'Address already in use' before


def test_a_bad_listen_address_is_refused_before_the_self_signed_pair_is_made(
        tmp_path, env) -> None:
    """`serve --self-signed --listen 127.0.0.1:notaport` made the certificate and its key
    (and printed the fingerprint), then said --listen was wrong: a bad argument left files
    behind. --listen is now read first."""
    import cryptdisk as cd

    db = str(tmp_path / "sales.db")
    cd.connect(db).close()
    assert cryptdisk("serve", db, "--add-user", "alice", "--admin", env=env).returncode == 0
    out = cryptdisk("serve", db, "--self-signed", "--listen", "127.0.0.1:notaport", env=env)
    assert out.returncode == 1 and out.stdout == "", out  # the fingerprint before
    assert out.stderr == ("cryptdisk: error: --listen '127.0.0.1:notaport': expected "
                          "HOST:PORT (e.g. 127.0.0.1:5432)\n"), out.stderr
    assert not os.path.exists(db + ".server.pem") and not os.path.exists(db + ".server.key")

"""The kmip provider against PyKMIP's server, started on loopback with mutual TLS."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag

import cryptdisk
from cryptdisk.bench.key_servers import free_port, make_kmip_certs, start_kmip, stop_kmip
from cryptdisk.bench.key_servers import kmip_server as kmip_server_at
from cryptdisk.errors import ConfigError, KeyProviderError
from cryptdisk.keys import Keyring, ProviderKey
from cryptdisk.keys.providers import create_kmip_key, kmip_client

from .conftest import SECURE_STORE, assert_a_database_round_trips, write

HERE = Path(__file__).parent
AD = bytes(range(48))


@dataclass(frozen=True)
class Server:
    root: Path
    port: int


@pytest.fixture(scope="module")
def kmip_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("kmip")
    with kmip_server_at(root) as port:
        yield Server(root, port)


@dataclass(frozen=True)
class OwnServer(Server):
    """A KMIP server of one test's own, which the test stops and starts again on its port."""

    running: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self) -> None:
        self.running.append(start_kmip(self.root, self.port))

    def stop(self) -> None:
        stop_kmip(self.running.pop())


@pytest.fixture
def own_kmip_server(tmp_path: Path) -> Iterator[OwnServer]:
    """A running KMIP server for one test (certificates in ``tmp_path/kmip``); whatever of
    it runs when the test ends is stopped."""
    root = tmp_path / "kmip"
    root.mkdir()
    make_kmip_certs(root)
    server = OwnServer(root, free_port())
    server.start()
    try:
        yield server
    finally:
        while server.running:
            server.stop()


def _client(server: Server, prefix: str = ""):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from kmip.core import enums
    client = kmip_client("127.0.0.1", server.port, cert=str(server.root / f"{prefix}client.pem"),
                         key=str(server.root / f"{prefix}client.key"),
                         ca=str(server.root / "ca.pem"))
    return client, enums


def _make_key(server: Server, name: str, *, activate: bool = True) -> str:
    return create_kmip_key("127.0.0.1", server.port, name,
                           cert=str(server.root / "client.pem"),
                           key=str(server.root / "client.key"), ca=str(server.root / "ca.pem"),
                           activate=activate)


def _entry(server: Server, key: str, key_id: int = 7, prefix: str = "", extra: str = "") -> str:
    r = server.root
    return (f'[[keyring.keys]]\nid = {key_id}\nsource = "kmip"\nhost = "127.0.0.1"\n'
            f'port = {server.port}\nkey = "{key}"\nclient_cert = "{r}/{prefix}client.pem"\n'
            f'client_key = "{r}/{prefix}client.key"\nca = "{r}/ca.pem"\ntimeout = 5\n{extra}')


def _env(**extra: str) -> dict[str, str]:
    """The environment of a cryptdisk child process: this checkout's package first."""
    return dict(os.environ, **extra, PYTHONPATH=os.pathsep.join(
        [str(HERE.parent.parent.parent / "src"), os.environ.get("PYTHONPATH", "")]))


def _ring(tmp_path: Path, server: Server, key: str, **kw) -> Keyring:
    return Keyring.from_config(write(tmp_path, "[keyring]\n" + _entry(server, key, **kw)))


def test_seal_and_open_run_on_the_server_in_aes_gcm(tmp_path, kmip_server, request):
    label = "kek-" + request.node.name
    uid = _make_key(kmip_server, label)
    key = _ring(tmp_path, kmip_server, label).current_key()
    assert isinstance(key, ProviderKey) and key.source == "kmip"
    dek = os.urandom(32)
    blob = key.wrap(dek, AD)
    assert len(blob) == 12 + 32 + 16
    client, enums = _client(kmip_server)  # the server's own key opens the slot: it sealed it
    with contextlib.closing(client):
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        raw = client.get(uid).value  # PyKMIP hands its owner the key (no non-extractable keys)
        _, mac = client.mac(b"cryptdisk key check v1", uid,
                            algorithm=enums.CryptographicAlgorithm.HMAC_SHA256)
    assert AESGCM(bytes(raw)).decrypt(blob[:12], blob[12:], AD) == dek
    assert key.check_value == bytes(mac)[:8]
    key.cache.clear()
    assert key.unwrap(blob, AD) == dek
    with pytest.raises(InvalidTag):
        key.unwrap(blob, AD[:-1] + b"\0")
    with pytest.raises(InvalidTag):
        key.unwrap(blob[:-1] + bytes([blob[-1] ^ 1]), AD)


def test_a_file_and_a_database_under_a_kmip_key(tmp_path, kmip_server, request):
    label = "kek-" + request.node.name
    _make_key(kmip_server, label)
    ring = _ring(tmp_path, kmip_server, label)
    path = tmp_path / "f.cdk"
    with cryptdisk.open(path, "wb", keyring=ring) as f:
        f.write(b"kmip" * 999)
    ring.close()
    with cryptdisk.open(path, "rb", keyring=_ring(tmp_path, kmip_server, label)) as f:
        assert f.read() == b"kmip" * 999
    cfg = write(tmp_path, "[keyring]\n" + _entry(kmip_server, label) + SECURE_STORE)
    assert_a_database_round_trips(tmp_path, cfg, rows=100, key_id=7)


def test_mutual_tls_and_key_problems_are_clear_errors(tmp_path, kmip_server, request):
    label = "kek-" + request.node.name
    _make_key(kmip_server, label + "-inactive", activate=False)
    with pytest.raises(KeyProviderError, match="cannot connect"):
        _ring(tmp_path, kmip_server, label, prefix="other-")  # a client the server's CA did
    with pytest.raises(KeyProviderError, match="0 keys have that name"):  # not sign
        _ring(tmp_path, kmip_server, "no-such-key")
    with pytest.raises(KeyProviderError, match="not active"):
        _ring(tmp_path, kmip_server, label + "-inactive")
    (kmip_server.root / "client.key").chmod(0o644)
    try:
        with pytest.raises(KeyProviderError, match="accessible by group or others"):
            _ring(tmp_path, kmip_server, label)
    finally:
        (kmip_server.root / "client.key").chmod(0o600)
    with pytest.raises(ConfigError, match="does not take password"):
        _ring(tmp_path, kmip_server, label, extra='password = "x"\n')


def test_an_unreachable_server_fails_within_the_timeout(tmp_path, kmip_server):
    text = "[keyring]\n" + _entry(kmip_server, "k").replace(f"port = {kmip_server.port}",
                                                             f"port = {free_port()}")
    with pytest.raises(KeyProviderError, match="cannot connect"):
        Keyring.from_config(write(tmp_path, text))


def test_destroy_revokes_and_destroys_a_retired_key_on_the_server(tmp_path, kmip_server,
                                                                   request):
    from cryptdisk.keys import Key, write_key_file

    label = "kek-" + request.node.name[-30:]
    _make_key(kmip_server, label)
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    entry = _entry(kmip_server, label, key_id=7).replace('source = "kmip"',
                                                         'state = "retired"\nsource = "kmip"')
    cfg = write(tmp_path, '[keyring]\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n' + entry)
    (tmp_path / "empty").mkdir()
    env = _env()
    done = subprocess.run([sys.executable, "-m", "cryptdisk", "keys", "destroy", "7", "-c", cfg,
                           str(tmp_path / "empty")], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "revoked and destroyed kmip" in done.stdout
    client, enums = _client(kmip_server)
    with contextlib.closing(client):
        name = client.attribute_factory.create_attribute(enums.AttributeType.NAME, label)
        assert client.locate(attributes=[name]) == []
    assert "id = 7" not in (tmp_path / "cryptdisk.toml").read_text()


def test_a_rotation_stopped_by_the_server_going_away_reports_and_resumes(tmp_path,
                                                                         own_kmip_server):
    """The KMIP server is killed while ``cryptdisk keys promote`` rewraps files into it: the
    command stops, names what it did not do and exits 1; with the server back, the same
    command finishes. The child pauses at its 4th file's header write; the server is
    stopped there."""
    from cryptdisk.format import Header
    from cryptdisk.keys import Key, write_key_file

    server = own_kmip_server
    _make_key(server, "kek-rotate")
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg = write(tmp_path, '[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\n'
                'file = "k1.hex"\n' + _entry(server, "kek-rotate", key_id=7,
                                              extra="retries = 2\nretry_seconds = 0.1\n"))
    data = tmp_path / "data"
    data.mkdir()
    ring = Keyring.from_config(cfg)
    for i in range(10):
        with cryptdisk.open(data / f"f{i:02}", "wb", keyring=ring) as f:
            f.write(b"%d" % i * 500)
    ring.close()
    env = _env(CHILD_RESUME="1")
    # calls counted by the child: per file a pwrite and an fsync of its header, after
    # the config's write, fsync, replace and directory fsync (the audit log is off):
    # pause before the 4th file's pwrite
    child = subprocess.Popen([sys.executable, str(HERE.parent / "lifecycle_child.py"),
                              str(4 + 2 * 3 + 1), "keys", "promote", "7", "-c", cfg,
                              str(data)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None and child.stdin is not None
    shown = []
    for line in child.stdout:
        if line.startswith(("paused", "finished")):
            break
        shown.append(line)
    assert line.startswith("paused 11 pwrite"), (shown, line)
    server.stop()
    child.stdin.write("go\n")
    child.stdin.flush()
    out, err = child.communicate(timeout=120)
    assert "finished 1" in out, (out, err)
    assert "stopped at a provider fault; 5 file(s) not done" in err
    assert "gave up after 3 attempts" in err
    assert "rewrapped 4 file(s) under key 7" in out
    ids = [Header.parse((data / f"f{i:02}").read_bytes()[:128]).key_id for i in range(10)]
    assert ids == [7] * 4 + [1] * 6  # the 5th failed, 6..10 not tried: all under key 1

    server.start()  # the server is back: the same command finishes
    again = subprocess.run([sys.executable, "-m", "cryptdisk", "keys", "promote", "7",
                            "-c", cfg, str(data)], capture_output=True, text=True, env=env,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    assert "rewrapped 6 file(s) under key 7; 4 already under it" in again.stdout
    ring = Keyring.from_config(cfg)
    for i in range(10):
        with cryptdisk.open(data / f"f{i:02}", "rb", keyring=ring) as f:
            assert f.read() == b"%d" % i * 500
    ring.close()


def test_a_call_retried_while_the_server_restarts_succeeds(tmp_path, own_kmip_server):
    """Unwrapping with the server down: the key retries with backoff; the server is started
    again once the audit log shows the first failed attempt, and the unwrap succeeds."""
    import json
    import threading
    import time

    from cryptdisk.keys import AUDIT_ENV

    server = own_kmip_server
    log = tmp_path / "audit.jsonl"
    os.environ[AUDIT_ENV] = str(log)
    try:
        _make_key(server, "kek-retry")
        key = _ring(tmp_path, server, "kek-retry",
                    extra="retries = 8\nretry_seconds = 0.5\n").current_key()
        blob = key.wrap(b"d" * 32, AD)
        key.cache.clear()
        server.stop()

        def restart() -> None:
            while not log.exists() or '"fault"' not in log.read_text():
                time.sleep(0.05)
            server.start()

        helper = threading.Thread(target=restart)
        helper.start()
        assert key.unwrap(blob, AD) == b"d" * 32
        helper.join()
        faults = [json.loads(x) for x in log.read_text().splitlines()
                  if '"fault"' in x]
        assert faults and faults[0]["operation"] == "open" and faults[0]["key_id"] == 7
        assert "kek-retry" in faults[0]["error"] and "client.key" not in faults[0]["error"]
        key.close()
        uses = [json.loads(x) for x in log.read_text().splitlines() if '"use"' in x]
        assert uses[-1]["wraps"] == 1 and uses[-1]["unwraps"] == 1
        assert uses[-1]["provider_calls"] == 2
    finally:
        del os.environ[AUDIT_ENV]


def test_a_wrapped_keyring_key_makes_a_cold_scan_one_server_call(tmp_path, kmip_server,
                                                                  request):
    from cryptdisk.keys import create_wrapped_key

    label = "kek-" + request.node.name[-30:]
    _make_key(kmip_server, label)
    r = kmip_server.root
    create_wrapped_key(tmp_path / "k7.kmip", {
        "id": 7, "source": "kmip", "host": "127.0.0.1", "port": kmip_server.port,
        "key": label, "client_cert": f"{r}/client.pem", "client_key": f"{r}/client.key",
        "ca": f"{r}/ca.pem"})
    cfg = write(tmp_path, "[keyring]\n" + _entry(kmip_server, label,
                                                   extra='wrapped_key = "k7.kmip"\n'))
    ring = Keyring.from_config(cfg)
    for i in range(10):
        with cryptdisk.open(tmp_path / f"f{i}", "wb", keyring=ring) as f:
            f.write(b"w" * 100)
    ring.close()
    ring = Keyring.from_config(cfg)
    for i in range(10):
        with cryptdisk.open(tmp_path / f"f{i}", "rb", keyring=ring) as f:
            assert f.read() == b"w" * 100
    key = ring.current_key()
    assert key.uses["unwraps"] == 10 and key.provider.unwraps == 1
    ring.close()


def test_promoting_a_key_whose_server_is_down_changes_nothing(tmp_path, kmip_server):
    from cryptdisk.keys import Key, write_key_file

    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    entry = _entry(kmip_server, "any", key_id=7, extra="retries = 1\nretry_seconds = 0.01\n")
    cfg = write(tmp_path, '[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\n'
                'file = "k1.hex"\n' + entry.replace(f"port = {kmip_server.port}",
                                                     f"port = {free_port()}"))
    before = Path(cfg).read_text()
    env = _env()
    done = subprocess.run([sys.executable, "-m", "cryptdisk", "keys", "promote", "7", "-c", cfg],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1
    assert "cannot connect" in done.stderr and "gave up after 2 attempts" in done.stderr
    assert Path(cfg).read_text() == before


def test_a_database_rotation_stopped_by_the_server_going_away_reports_and_resumes(
        tmp_path, own_kmip_server):
    """As above for ``keys promote --db``: the child pauses before its second part's header
    write (its data key already sealed), the server is stopped there; the command names the
    files not done and exits 1, and finishes when run again with the server back."""
    from cryptdisk.keys import Key, write_key_file

    from .conftest import SECURE_STORE

    server = own_kmip_server
    _make_key(server, "kek-db")
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg = write(tmp_path, '[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\n'
                'file = "k1.hex"\n' + _entry(server, "kek-db", key_id=7,
                                              extra="retries = 1\nretry_seconds = 0.1\n")
                + SECURE_STORE)
    db = tmp_path / "sales.db"
    with cryptdisk.connect(db, cfg) as conn:
        conn.sql("CREATE TABLE t (x BIGINT)")
        for i in range(4):
            conn.sql(f"INSERT INTO t SELECT range FROM range({i * 10}, {(i + 1) * 10})")
    env = _env(CHILD_RESUME="1")
    # the config's write, fsync, replace, directory fsync; then per part a header pwrite
    # and fsync: pause before the second part's pwrite
    child = subprocess.Popen([sys.executable, str(HERE.parent / "lifecycle_child.py"),
                              str(4 + 2 + 1), "keys", "promote", "7", "-c", cfg, "--db",
                              str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None and child.stdin is not None
    for line in child.stdout:
        if line.startswith(("paused", "finished")):
            break
    assert line.startswith("paused 7 pwrite"), line
    server.stop()
    child.stdin.write("go\n")
    child.stdin.flush()
    out, err = child.communicate(timeout=120)
    assert "finished 1" in out, (out, err)
    # the second part was sealed before the pause: two done, the third failed
    assert "stopped after 2 file(s)" in err and "gave up after 2 attempts" in err, err
    assert "An error occurred" not in err  # PyKMIP's own log records stay quiet
    assert "stopped at a provider fault; 3 file(s) not done" in err  # 2 parts, catalog
    assert f"{db}/catalog" in err and err.count("(table t, disk 'secure')") == 2

    server.start()
    again = subprocess.run([sys.executable, "-m", "cryptdisk", "keys", "promote", "7",
                            "-c", cfg, "--db", str(db)], capture_output=True, text=True,
                           env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "all its files are under key 7" in again.stdout
    with cryptdisk.connect(db, cfg) as conn:
        assert conn.sql("SELECT count(*) AS n, sum(x) AS s FROM t").to_pylist() == [
            {"n": 40, "s": 780}]
        assert conn.sql("SELECT id, files FROM system.keys ORDER BY id").to_pylist() == [
            {"id": 1, "files": 0}, {"id": 7, "files": 5}]


def test_a_revoked_or_deactivated_key_is_named_by_its_state(tmp_path, kmip_server, request):
    """Revoked keys: loading names the state and does not tell the operator to activate a
    key that KMIP cannot make active again; a key revoked while in use fails its calls with
    the server's reason."""
    import time

    label = "kek-" + request.node.name[-30:]
    compromised = _make_key(kmip_server, label + "-c")
    ring = _ring(tmp_path, kmip_server, label + "-c", extra="retries = 0\n")
    path = tmp_path / "f.cdk"
    with cryptdisk.open(path, "wb", keyring=ring) as f:
        f.write(b"x")
    ring.current_key().cache.clear()
    deactivated = _make_key(kmip_server, label + "-d")
    _make_key(kmip_server, label + "-p", activate=False)
    client, enums = _client(kmip_server)
    with contextlib.closing(client):
        client.revoke(enums.RevocationReasonCode.KEY_COMPROMISE, compromised,
                      compromise_occurrence_date=int(time.time()))
        client.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, deactivated)
    with pytest.raises(KeyProviderError, match=r"Decrypt failed: .*Active state"):
        with cryptdisk.open(path, "rb", keyring=ring) as f:
            f.read()
    ring.close()
    for suffix, state, hint in (("-c", "compromised (revoked), not active", "exposed"),
                                ("-d", "deactivated (revoked or past its deactivation date)",
                                 "cannot be made active again"),
                                ("-p", "pre-active (never activated)", "activate it")):
        with pytest.raises(KeyProviderError) as info:
            _ring(tmp_path, kmip_server, label + suffix)
        assert f"key '{label}{suffix}': the key is {state}" in str(info.value)
        assert hint in (info.value.hint or "")


@contextlib.contextmanager
def _stalling_tls_server(root: Path) -> Iterator[tuple[int, list[int]]]:
    """A server that completes the mutual TLS handshake with the KMIP server's certificate,
    then reads requests and never answers (an overloaded or stopped server past the
    handshake); yields its port and the number of handshakes done so far."""
    import socket
    import ssl
    import threading

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(root / "server.pem"), str(root / "server.key"))
    context.load_verify_locations(str(root / "ca.pem"))
    context.verify_mode = ssl.CERT_REQUIRED
    listener = socket.create_server(("127.0.0.1", 0))
    handshakes = [0]
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                tls = context.wrap_socket(sock, server_side=True)
            except (OSError, ssl.SSLError):
                sock.close()
                continue
            handshakes[0] += 1
            held.append(tls)  # read nothing back: the client's request stays unanswered

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], handshakes
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for s in held:
            with contextlib.suppress(OSError):
                s.close()


def test_a_server_that_stops_answering_after_the_handshake_is_retried_at_load(
        tmp_path, kmip_server, monkeypatch):
    """A request at config load (Locate, Get Attributes, MAC) that times out is a server
    that did not answer, as docs/keys.md's Provider faults says, and is tried again; it
    was reported at once as a permanent error ('TimeoutError: The read operation timed
    out', no retry), so a KMIP server stalled for a moment failed every process starting."""
    audit = tmp_path / "audit.log"
    monkeypatch.setenv("CRYPTDISK_KEY_AUDIT_LOG", str(audit))
    with _stalling_tls_server(kmip_server.root) as (port, handshakes):
        text = "[keyring]\n" + _entry(
            kmip_server, "k", extra="retries = 2\nretry_seconds = 0.05\n").replace(
            f"port = {kmip_server.port}", f"port = {port}").replace("timeout = 5",
                                                                    "timeout = 1")
        with pytest.raises(KeyProviderError, match=r"gave up after 3 attempts") as info:
            Keyring.from_config(write(tmp_path, text))
        assert info.value.transient
        assert handshakes[0] == 3
    faults = [line for line in audit.read_text().splitlines() if '"fault"' in line]
    assert len(faults) == 2


def test_destroy_retries_a_server_that_stops_answering_as_loading_does(
        tmp_path, kmip_server, monkeypatch):
    """`keys destroy` of a KMIP key whose server times out is tried again (retries = 2: three
    attempts, two audited faults) and then fails transient, leaving the entry in place; it
    was one attempt and a permanent error, while loading retried (docs/keys.md, Provider
    faults)."""
    from cryptdisk.keys import Key, KeyConfig, write_key_file

    audit = tmp_path / "audit.log"
    monkeypatch.setenv("CRYPTDISK_KEY_AUDIT_LOG", str(audit))
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    with _stalling_tls_server(kmip_server.root) as (port, handshakes):
        entry = _entry(kmip_server, "k", extra="retries = 2\nretry_seconds = 0.05\n").replace(
            f"port = {kmip_server.port}", f"port = {port}").replace(
            "timeout = 5", "timeout = 1").replace('source = "kmip"',
                                                  'state = "retired"\nsource = "kmip"')
        cfg = write(tmp_path, '[keyring]\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n' + entry)
        with pytest.raises(KeyProviderError, match=r"destroying the key failed: .*gave up "
                           r"after 3 attempts") as info:
            KeyConfig(cfg).destroy(7)
        assert info.value.transient
        assert handshakes[0] == 3
    faults = [line for line in audit.read_text().splitlines() if '"fault"' in line]
    assert len(faults) == 2 and all('"destroy"' in line for line in faults), faults
    assert "id = 7" in (tmp_path / "cryptdisk.toml").read_text()


def test_the_docs_create_kmip_key_example_runs_as_written(tmp_path, kmip_server):
    """docs/keys.md's create_kmip_key snippet, with the server's address and this test's
    certificates put in for the docs' placeholders, makes a key the docs' entry loads,
    and a second key of the same name makes that entry refused, as the docs say."""
    from ...test_readme import readme_blocks

    root = kmip_server.root
    blocks = [b for b in readme_blocks((HERE.parents[2] / "docs" / "keys.md").read_text())
              if b.language == "python" and "create_kmip_key(" in b.code]
    assert len(blocks) == 1 and blocks[0].skip and "test_kmip.py" in blocks[0].skip
    code = blocks[0].code
    for placeholder, value in (('"kms.internal", 5696', f'"127.0.0.1", {kmip_server.port}'),
                               ('"tls/client.pem"', repr(str(root / "client.pem"))),
                               ('"tls/client.key"', repr(str(root / "client.key"))),
                               ('"tls/ca.pem"', repr(str(root / "ca.pem")))):
        assert placeholder in code
        code = code.replace(placeholder, value)
    name = "cryptdisk-kek-7"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=_env(), timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("created ") and done.stdout.split()[1]
    ring = _ring(tmp_path, kmip_server, name)
    with cryptdisk.open(tmp_path / "f.cd", "wb", keyring=ring) as f:
        f.write(b"under the new key")
    with cryptdisk.open(tmp_path / "f.cd", "rb", keyring=ring) as f:
        assert f.read() == b"under the new key"
    ring.close()
    # the same name again: refused before creating (a second key of that name was created
    # and the config refused the ambiguous name only when it loaded: "2 keys have that name")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=_env(), timeout=120, cwd=tmp_path)
    assert again.returncode == 1, again.stderr
    assert f"KeyProviderError: kmip 127.0.0.1:{kmip_server.port}: a key named {name!r} " \
        "exists already" in again.stderr, again.stderr
    assert "nothing was created" in again.stderr
    ring = _ring(tmp_path, kmip_server, name)  # still one key of that name
    with cryptdisk.open(tmp_path / "f.cd", "rb", keyring=ring) as f:
        assert f.read() == b"under the new key"
    ring.close()


def test_a_server_rotating_again_and_again_keeps_one_connection_to_the_kmip_server(
        tmp_path, kmip_server, request):
    """`cryptdisk serve` with a kmip key: each SYSTEM ROTATE KEYS loads the config's keys
    again (new connection) and the keyring took the new keys without closing the old
    ones, so the server held two TLS connections to the KMIP server after the first
    rotation (the dropped key's closed only when it happened to be collected). Now the
    replaced key is closed: the serve process holds one connection throughout."""
    import re
    import signal

    import psutil
    import psycopg

    label = "kek-serve-" + request.node.name[-30:]
    _make_key(kmip_server, label)
    config = tmp_path / "c.toml"
    config.write_text("[keyring]\n" + _entry(kmip_server, label) + SECURE_STORE)
    db, c = tmp_path / "s.db", ("-c", str(config))
    env = _env(CRYPTDISK_PASSWORD="pw of alice")

    def cli(*argv: str) -> None:
        done = subprocess.run([sys.executable, "-m", "cryptdisk", *argv], capture_output=True,
                              text=True, env=env, timeout=120, cwd=tmp_path)
        assert done.returncode == 0, done.stderr

    cli("sql", str(db), *c, "--create", "-q", "CREATE TABLE t (a INT); INSERT INTO t VALUES (1)")
    cli("serve", str(db), *c, "--add-user", "alice", "--admin")
    proc = subprocess.Popen([sys.executable, "-m", "cryptdisk", "serve", str(db), *c,
                             "--plaintext-loopback", "--workers", "1", "--listen",
                             "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        port = next(int(m[1]) for line in proc.stdout
                    if (m := re.search(r"on 127\.0\.0\.1:(\d+)", line)))

        def kmip_connections() -> int:
            return sum(1 for conn in psutil.Process(proc.pid).net_connections("tcp")
                       if conn.raddr and conn.raddr.port == kmip_server.port
                       and conn.status == psutil.CONN_ESTABLISHED)

        with psycopg.connect(host="127.0.0.1", port=port, user="alice",
                             password="pw of alice", sslmode="disable",
                             autocommit=True) as conn:
            assert kmip_connections() == 1
            counts = []
            for i in range(4):
                conn.execute("SYSTEM ROTATE KEYS")
                conn.execute("INSERT INTO t VALUES (%s)", (i + 2,))
                counts.append(kmip_connections())
            assert counts == [1, 1, 1, 1]
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (5,)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        proc.stdout.close()
        proc.stderr.close()


def test_two_creators_of_one_name_at_the_same_time_leave_one_key(kmip_server, monkeypatch,
                                                                  request):
    """create_kmip_key checked that the name was free, then created: two callers that both
    checked before either created both made a key of that name and both returned (the
    name then ambiguous: a kmip entry refuses it). Now each looks the name up after its
    create; the later key is destroyed and its caller gets 'exists already', so exactly
    one caller returns, and the server holds one key of that name: that caller's, active."""
    import threading

    from cryptdisk.keys.providers import _kmip

    name = "race-" + request.node.name[-30:]
    checked = threading.Barrier(2, timeout=60)
    real = _kmip.kmip_client

    def client_checking_together(*args, **kwargs):
        client = real(*args, **kwargs)
        locate, calls = client.locate, []

        def locate_then_wait(*a, **k):
            found = locate(*a, **k)
            if not calls:  # the check before the create: both callers pass it first
                calls.append(found)
                checked.wait()
            return found

        client.locate = locate_then_wait
        return client

    monkeypatch.setattr(_kmip, "kmip_client", client_checking_together)
    results: list[object] = [None, None]

    def create(i: int) -> None:
        try:
            results[i] = _make_key(kmip_server, name)
        except BaseException as exc:  # (looked at below)
            results[i] = exc

    threads = [threading.Thread(target=create, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    made = [r for r in results if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, KeyProviderError)]
    assert len(made) == 1 and len(refused) == 1, results
    assert f"a key named {name!r} exists already (unique id {made[0]}" in str(refused[0])
    assert "nothing was created" in str(refused[0])
    client, enums = _client(kmip_server)
    try:
        found = client.locate(attributes=[client.attribute_factory.create_attribute(
            enums.AttributeType.NAME, name)])
        assert [str(u) for u in found] == made
        state = client.get_attributes(made[0], ["State"])[1][0].attribute_value.value
        assert state == enums.State.ACTIVE
    finally:
        client.close()
    monkeypatch.undo()
    tmp = Path(str(kmip_server.root)) / f"{name}.toml"
    ring = Keyring.from_config(write(tmp.parent, "[keyring]\n" + _entry(kmip_server, name),
                                     tmp.name))
    try:
        dek = os.urandom(32)
        key = ring.current_key()
        assert key.unwrap(key.wrap(dek, AD), AD) == dek  # the name loads: one key
    finally:
        ring.close()


class _UuidServer:
    """A KMIP server as create_kmip_key sees it whose unique ids are random UUIDs (not
    PyKMIP's counter) and whose Initial Date is in whole seconds: keys made in one second
    cannot be told apart by age (a fake: no server here gives such ids)."""

    SECOND = 1_765_000_000

    def __init__(self) -> None:
        self.keys: dict[str, dict[str, object]] = {}  # uid -> name, date, state
        self.created: list[str] = []

    def client(self, uids: list[str], before_first_locate=None):
        server = self

        class Attr:
            def __init__(self, value: object) -> None:
                self.attribute_value = type("V", (), {"value": value})()

        class Client:
            attribute_factory = type("F", (), {
                "create_attribute": staticmethod(lambda kind, value: value)})()

            def __init__(self) -> None:
                self.located = 0

            def locate(self, attributes):
                found = [u for u, k in server.keys.items() if k["name"] == attributes[0]]
                self.located += 1
                if self.located == 1 and before_first_locate is not None:
                    before_first_locate()  # another caller runs now: this one checked
                return found

            def create(self, algorithm, length, name, cryptographic_usage_mask):
                uid = uids.pop(0)
                server.keys[uid] = {"name": name, "date": server.SECOND, "state": "pre"}
                server.created.append(uid)
                return uid

            def get_attributes(self, uid, names):
                return uid, [Attr(server.keys[uid]["date"])]

            def activate(self, uid):
                server.keys[uid]["state"] = "active"

            def destroy(self, uid):
                del server.keys[uid]

            def close(self) -> None:
                pass

        return Client()


def test_a_create_in_the_same_second_on_a_server_of_random_uuids_loses_to_a_returned_key(
        monkeypatch) -> None:
    """Two creators in one second on a server of random UUIDs: the first checks, creates
    and looks the name up seeing only its key, so it returns it; the second checked before
    the first created and sees both. Ages tie (whole seconds) and the tie was broken by the
    smaller UUID, which made the second's key 'first': it kept it, and both returned, the
    name ambiguous. A UUID says nothing of age: now a tie is no win, the second destroys
    its key and gets 'exists already' naming the first's, the only key left."""
    from cryptdisk.keys.providers import _kmip

    server = _UuidServer()
    first_uid = "f0000000-0000-4000-8000-000000000000"
    second_uid = "00000000-0000-4000-8000-000000000000"  # smaller: 'first' by the old tie-break
    made: list[str] = []
    clients = [server.client([second_uid], lambda: made.append(_kmip.create_kmip_key(
        "127.0.0.1", 1, "race", cert="c", key="k", ca="a"))), server.client([first_uid])]
    monkeypatch.setattr(_kmip, "kmip_client", lambda *a, **k: clients.pop(0))
    with pytest.raises(KeyProviderError, match=f"exists already \\(unique id {first_uid}"):
        _kmip.create_kmip_key("127.0.0.1", 1, "race", cert="c", key="k", ca="a")
    assert made == [first_uid]
    assert server.keys == {first_uid: {"name": "race", "date": server.SECOND,
                                       "state": "active"}}


def test_creators_tied_in_the_same_second_withdraw_and_one_key_is_made_again(
        monkeypatch) -> None:
    """Two creators in one second on a server of random UUIDs that both check, both create,
    then both see both keys: no key is older, so neither keeps its key (each destroys it),
    and each tries again after a random pause, from the check: one key of the name is
    left, active, and its caller returns it; the other finds it and gets 'exists
    already'."""
    import threading

    from cryptdisk.keys.providers import _kmip

    server = _UuidServer()
    together = threading.Barrier(2, timeout=60)
    uids = iter(f"{i:08x}-0000-4000-8000-000000000000" for i in range(100))

    def client_in_step(*args, **kwargs):
        client = server.client([next(uids) for _ in range(10)])
        locate, create, calls = client.locate, client.create, []

        def locate_in_step(*a, **k):
            calls.append("locate")
            if calls == ["locate", "create", "locate"]:
                together.wait()  # both created before either looks the name up
            return locate(*a, **k)

        def create_in_step(*a, **k):
            calls.append("create")
            if calls == ["locate", "create"]:
                together.wait()  # both checked before either creates
            return create(*a, **k)

        destroy = client.destroy

        def destroy_in_step(uid):
            calls.append("destroy")
            if calls.count("destroy") == 1:
                together.wait()  # both saw both keys before either destroys
            destroy(uid)
            if calls.count("destroy") == 1:
                together.wait()  # and both destroyed before either looks again

        client.locate, client.create, client.destroy = \
            locate_in_step, create_in_step, destroy_in_step
        return client

    monkeypatch.setattr(_kmip, "kmip_client", client_in_step)
    results: list[object] = [None, None]

    def make(i: int) -> None:
        try:
            results[i] = _kmip.create_kmip_key("127.0.0.1", 1, "tie", cert="c", key="k",
                                               ca="a")
        except BaseException as exc:  # (looked at below)
            results[i] = exc

    threads = [threading.Thread(target=make, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(server.keys) == 1, (server.keys, results)
    (uid, key), = server.keys.items()
    assert key["state"] == "active"
    assert [r for r in results if isinstance(r, str)] == [uid], results
    assert len(server.created) >= 3, (server.created, results)  # the tied two, one again
    refused = [r for r in results if isinstance(r, KeyProviderError)]
    assert len(refused) == 1 and f"exists already (unique id {uid}" in str(refused[0])

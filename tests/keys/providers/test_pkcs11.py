"""The pkcs11 provider against a real SoftHSM2 token: the key stays in the token."""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path
from typing import Any

import pkcs11
import pytest
from cryptography.exceptions import InvalidTag
from pkcs11 import Attribute, KeyType, ObjectClass

import cryptdisk
from cryptdisk.config import load_config
from cryptdisk.errors import (
    ConfigError,
    HeaderAuthenticationError,
    KeyFileError,
    KeyProviderError,
    KeySourceError,
    WrongKeyError,
)
from cryptdisk.format import Header
from cryptdisk.keys import Keyring, ProviderKey, export_key_material
from cryptdisk.keys.providers import generate_pkcs11_key

from .conftest import SECURE_STORE, Token, assert_parts_sealed_under, entry_toml, write

AD = bytes(range(48))


@pytest.fixture
def pin_env(softhsm: Token, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("CD_TEST_PIN", softhsm.pin)
    return softhsm.pin


def _label(request: pytest.FixtureRequest) -> str:
    return "kek-" + request.node.name[-40:]


@pytest.fixture
def key_label(softhsm: Token, request: pytest.FixtureRequest) -> str:
    label = _label(request)
    generate_pkcs11_key(softhsm.module, softhsm.label, label, pin=softhsm.pin)
    return label


def _ring(tmp_path: Path, token: Token, label: str, **kw: Any) -> Keyring:
    return Keyring.from_config(write(tmp_path, "[keyring]\n" + entry_toml(token, label, **kw)))


def _token_key(token: Token, label: str) -> tuple[object, object]:
    tok = pkcs11.lib(token.module).get_token(token_label=token.label)
    try:
        session = tok.open(user_pin=token.pin)
    except pkcs11.exceptions.UserAlreadyLoggedIn:  # this process logged in already
        session = tok.open()
    return session, session.get_key(object_class=ObjectClass.SECRET_KEY, label=label)


def test_the_generated_key_is_sensitive_and_never_leaves_the_token(softhsm, key_label):
    session, key = _token_key(softhsm, key_label)
    try:
        assert key[Attribute.EXTRACTABLE] is False
        assert key[Attribute.SENSITIVE] is True
        with pytest.raises(pkcs11.exceptions.AttributeSensitive):
            key[Attribute.VALUE]
    finally:
        session.close()


def test_wrap_runs_in_the_token_and_writes_the_usual_key_slot(tmp_path, softhsm, key_label,
                                                              pin_env):
    ring = _ring(tmp_path, softhsm, key_label)
    key = ring.current_key()
    assert isinstance(key, ProviderKey) and key.key_id == 1 and key.source == "pkcs11"
    dek = os.urandom(32)
    blob = key.wrap(dek, AD)
    assert len(blob) == 12 + 32 + 16  # nonce || ciphertext || tag, as a local key writes
    # the token itself opens it with AES-GCM under the token key: the wrap ran there
    session, token_key = _token_key(softhsm, key_label)
    try:
        opened = token_key.decrypt(blob[12:], mechanism=pkcs11.Mechanism.AES_GCM,
                                   mechanism_param=pkcs11.GCMParams(blob[:12], AD, 128))
    finally:
        session.close()
    assert bytes(opened) == dek
    key.cache.clear()
    assert key.unwrap(blob, AD) == dek
    with pytest.raises(InvalidTag):
        key.unwrap(blob, AD[:-1] + b"\xff")  # other associated data: no cache hit, token says no
    tampered = blob[:20] + bytes([blob[20] ^ 1]) + blob[21:]
    with pytest.raises(InvalidTag):
        key.unwrap(tampered, AD)


def test_the_key_has_no_material_and_cannot_be_pickled(tmp_path, softhsm, key_label, pin_env):
    key = _ring(tmp_path, softhsm, key_label).current_key()
    with pytest.raises(KeySourceError, match="held by a key provider"):
        export_key_material(key)
    with pytest.raises(cryptdisk.errors.KeyringError, match="derives no subkeys"):
        key.derive(b"names")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)


def test_files_written_under_the_token_key_read_back_and_detect_tampering(
        tmp_path, softhsm, key_label, pin_env):
    ring = _ring(tmp_path, softhsm, key_label)
    path = tmp_path / "f.cdk"
    with cryptdisk.open(path, "wb", keyring=ring) as f:
        f.write(b"hello from the token" * 1000)
    header = Header.parse(path.read_bytes()[:128])
    assert header.key_id == 1 and header.key_check == ring.current_key().check_value
    ring.current_key().cache.clear()
    misses = ring.current_key().cache.misses
    for _ in range(3):
        with cryptdisk.open(path, "rb", keyring=ring) as f:
            assert f.read() == b"hello from the token" * 1000
    cache = ring.current_key().cache
    assert cache.misses == misses + 1 and cache.hits >= 2  # one token call for three opens
    raw = bytearray(path.read_bytes())
    raw[60] ^= 1  # inside the key slot
    path.write_bytes(bytes(raw))
    cache.clear()
    with pytest.raises(HeaderAuthenticationError):
        with cryptdisk.open(path, "rb", keyring=ring) as f:
            f.read()


def test_another_token_key_under_the_same_id_is_a_wrong_key(tmp_path, softhsm, key_label,
                                                           pin_env):
    other = key_label[:-1] + "X"
    generate_pkcs11_key(softhsm.module, softhsm.label, other, pin=softhsm.pin)
    path = tmp_path / "f.cdk"
    with cryptdisk.open(path, "wb", keyring=_ring(tmp_path, softhsm, key_label)) as f:
        f.write(b"x")
    with pytest.raises(WrongKeyError):
        with cryptdisk.open(path, "rb", keyring=_ring(tmp_path, softhsm, other)) as f:
            f.read()


def test_an_extractable_key_is_refused(tmp_path, softhsm, request, pin_env):
    label = _label(request)
    tok = pkcs11.lib(softhsm.module).get_token(token_label=softhsm.label)
    try:
        session = tok.open(user_pin=softhsm.pin, rw=True)
    except pkcs11.exceptions.UserAlreadyLoggedIn:
        session = tok.open(rw=True)
    with session:
        session.generate_key(KeyType.AES, 256, label=label, store=True, template={
            Attribute.EXTRACTABLE: True, Attribute.SENSITIVE: False})
    with pytest.raises(KeyProviderError, match="extractable"):
        _ring(tmp_path, softhsm, label)


def test_bad_entries_fail_at_load_naming_the_entry_never_the_pin(tmp_path, softhsm, key_label,
                                                                 pin_env, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    errors: list[Exception] = []
    monkeypatch.setenv("CD_WRONG_PIN", "wrong-" + softhsm.pin)
    for kw, exc_type, text in (
            ({"pin_env": "CD_WRONG_PIN"}, KeyProviderError, "PIN was refused"),
            ({"pin_env": "CD_UNSET_PIN"}, KeyProviderError, "CD_UNSET_PIN"),
            # the PIN itself where its variable's name belongs: refused, never quoted
            ({"pin_env": softhsm.pin}, KeyProviderError, "pin_env takes the NAME"),
    ):
        with pytest.raises(exc_type, match=text) as info:
            _ring(tmp_path, softhsm, key_label, **kw)
        assert "cryptdisk.toml" in str(info.value)
        errors.append(info.value)
    with pytest.raises(KeyProviderError, match="the token has no AES secret key") as info:
        _ring(tmp_path, softhsm, "no-such-label")
    errors.append(info.value)
    inline = "[keyring]\n" + entry_toml(softhsm, key_label).replace(
        'pin_env = "CD_TEST_PIN"', f'pin = "{softhsm.pin}"')
    with pytest.raises(ConfigError, match="does not take pin") as info:
        Keyring.from_config(write(tmp_path, inline))
    errors.append(info.value)
    both = "[keyring]\n" + entry_toml(softhsm, key_label, extra='pin_file = "p"\n')
    with pytest.raises(ConfigError, match="exactly one of pin_env and pin_file") as info:
        Keyring.from_config(write(tmp_path, both))
    errors.append(info.value)
    ring = _ring(tmp_path, softhsm, key_label)
    shown = [str(e) for e in errors] + [repr(e) for e in errors] + [
        repr(ring), repr(ring.current_key()), repr(ring.current_key().provider), caplog.text]
    assert not [s for s in shown if softhsm.pin in s]


def test_the_pin_from_a_file_must_be_private(tmp_path, softhsm, key_label):
    pin_file = tmp_path / "pin"
    pin_file.write_text(softhsm.pin + "\n")
    pin_file.chmod(0o644)
    text = "[keyring]\n" + entry_toml(softhsm, key_label).replace(
        'pin_env = "CD_TEST_PIN"', 'pin_file = "pin"')
    with pytest.raises(KeyProviderError, match="accessible by group or others"):
        Keyring.from_config(write(tmp_path, text))
    pin_file.chmod(0o600)
    key = Keyring.from_config(write(tmp_path, text)).current_key()
    assert key.unwrap(key.wrap(b"k" * 32, AD), AD) == b"k" * 32


def test_a_database_whose_key_is_in_the_token(tmp_path, softhsm, key_label, pin_env):
    cfg = write(tmp_path, "[keyring]\ncurrent_key_id = 7\n" + entry_toml(
        softhsm, key_label, key_id=7) + SECURE_STORE)
    assert isinstance(load_config(cfg).keyring.current_key(), ProviderKey)
    path = tmp_path / "db"
    with cryptdisk.connect(path, cfg) as db:
        db.sql("CREATE TABLE t (i BIGINT, s VARCHAR)")
        db.sql("INSERT INTO t SELECT i, 'row ' || i FROM range(1000) r(i)")
    with cryptdisk.connect(path, cfg) as db:
        got = db.sql("SELECT count(*) AS n, sum(i) AS s, max(s) AS m FROM t").to_pylist()
        keys = db.sql("SELECT * FROM system.keys").to_pylist()
    assert got == [{"n": 1000, "s": 499500, "m": "row 999"}]
    assert any(row["id"] == 7 for row in keys)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert_parts_sealed_under(tmp_path, 7)
    assert not [p for p in written if softhsm.pin.encode() in p.read_bytes()]


def test_encrypted_sqlite_whose_key_is_in_the_token(tmp_path, softhsm, key_label, pin_env):
    import cryptdisk.sqlite

    ring = _ring(tmp_path, softhsm, key_label)
    path = str(tmp_path / "app.db")
    db = cryptdisk.sqlite.connect(path, keyring=ring)
    db.execute("CREATE TABLE t (i INTEGER, s TEXT)")
    db.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) "
               "INSERT INTO t SELECT i, 'v' || i FROM n")
    db.close()
    ring.close()
    again = _ring(tmp_path, softhsm, key_label)
    db = cryptdisk.sqlite.connect(path, keyring=again)
    assert db.execute("SELECT count(*), max(s) FROM t").fetchall() == [(300, "v99")]
    db.close()
    assert Header.parse(Path(path).read_bytes()[:128]).key_check == again.current_key().check_value


def test_rotation_moves_files_from_a_key_file_into_the_token(tmp_path, softhsm, key_label,
                                                             pin_env):
    from cryptdisk.keys import Key, rewrap_tree, write_key_file

    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    both = Keyring.from_config(write(tmp_path, "[keyring]\ncurrent_key_id = 2\n"
                                     "[[keyring.keys]]\nid = 1\nfile = \"k1.hex\"\n"
                                     + entry_toml(softhsm, key_label, key_id=2)))
    data = tmp_path / "data"
    data.mkdir()
    for i in range(5):
        with cryptdisk.open(data / f"f{i}", "wb", keyring=both.with_current(1)) as f:
            f.write(b"row %d" % i)
    summary = rewrap_tree([data], both)
    assert summary.rewrapped == 5
    token_only = _ring(tmp_path, softhsm, key_label, key_id=2)
    for i in range(5):
        assert Header.parse((data / f"f{i}").read_bytes()[:128]).key_id == 2
        with cryptdisk.open(data / f"f{i}", "rb", keyring=token_only) as f:
            assert f.read() == b"row %d" % i


def test_a_hung_module_call_fails_within_the_timeout_and_later_calls_work(tmp_path, softhsm,
                                                                          pin_env, key_label):
    """A call that hangs in the module (here: another thread holds the module's lock, as a
    call stuck in C_Decrypt would) makes the caller fail within ``timeout`` per attempt
    with a transient error; when it returns, the key works again."""
    import threading

    key = _ring(tmp_path, softhsm, key_label,
                extra="timeout = 0.3\nretries = 1\nretry_seconds = 0.01\ncache_entries = 0\n"
                ).current_key()
    blob = key.wrap(b"h" * 32, AD)
    provider = key.provider
    held, release = threading.Event(), threading.Event()

    def hang() -> None:
        with provider._lock:
            held.set()
            release.wait(60)

    hung = threading.Thread(target=hang)
    hung.start()
    held.wait(10)
    try:
        with pytest.raises(KeyProviderError, match=r"did not answer within 0.3 s .*gave up "
                           r"after 2 attempts") as info:
            key.unwrap(blob, AD)
        assert info.value.transient
    finally:
        release.set()
        hung.join()
    assert key.unwrap(blob, AD) == b"h" * 32
    key.close()


def _cold_scan(tmp_path: Path, cfg: str, files: int) -> ProviderKey:
    """Write ``files`` files under the config's key, then read them all with a new keyring
    (a cold cache, as a new process has); the key that read them."""
    ring = Keyring.from_config(cfg)
    for i in range(files):
        with cryptdisk.open(tmp_path / f"f{i}", "wb", keyring=ring) as f:
            f.write(b"%d" % i * 100)
    ring.close()
    ring = Keyring.from_config(cfg)
    for i in range(files):
        with cryptdisk.open(tmp_path / f"f{i}", "rb", keyring=ring) as f:
            assert f.read() == b"%d" % i * 100
    return ring.current_key()  # type: ignore[return-value]


def test_a_wrapped_keyring_key_makes_a_cold_scan_one_token_call_per_key(
        tmp_path, softhsm, pin_env, key_label):
    from cryptdisk.keys import create_wrapped_key

    entry = {"id": 1, "source": "pkcs11", "module": softhsm.module, "token": softhsm.label,
             "key": key_label, "pin_env": "CD_TEST_PIN"}
    create_wrapped_key(tmp_path / "k1.p11", entry)
    assert (tmp_path / "k1.p11").stat().st_mode & 0o777 == 0o600
    direct = write(tmp_path, "[keyring]\n" + entry_toml(softhsm, key_label), "direct.toml")
    wrapped = write(tmp_path, "[keyring]\n" + entry_toml(
        softhsm, key_label, extra='wrapped_key = "k1.p11"\nkek_seconds = 600\n'),
        "wrapped.toml")

    (tmp_path / "a").mkdir()
    key = _cold_scan(tmp_path / "a", direct, 20)
    assert key.uses["provider_calls"] == 20  # one token call per file opened
    key.close()

    (tmp_path / "b").mkdir()
    key = _cold_scan(tmp_path / "b", wrapped, 20)
    assert key.uses["unwraps"] == 20 and key.provider.unwraps == 1  # one token call in all
    assert key.provider.inner.describe() in key.provider.describe()
    # the file is bound to its key and id: under another id the token does not open it
    other = write(tmp_path, "[keyring]\n" + entry_toml(
        softhsm, key_label, key_id=2, extra='wrapped_key = "k1.p11"\n'), "other.toml")
    with pytest.raises(KeyProviderError, match="does not open under"):
        Keyring.from_config(other)
    key.close()
    assert key.provider._kek is None


def test_a_wrapped_key_into_a_missing_directory_is_named_before_the_token_is_asked(
        tmp_path, softhsm, pin_env, key_label):
    from cryptdisk.keys import create_wrapped_key

    entry = {"id": 1, "source": "pkcs11", "module": softhsm.module, "token": softhsm.label,
             "key": key_label, "pin_env": "CD_TEST_PIN"}
    target = tmp_path / "keys" / "k1.p11"
    with pytest.raises(KeyFileError) as err:
        create_wrapped_key(target, entry)
    assert str(err.value) == (f"cannot write the wrapped key file {target}: the directory "
                              f"{tmp_path / 'keys'} does not exist")
    assert "mkdir -m 700" in (err.value.hint or "")
    (tmp_path / "keys").mkdir()
    create_wrapped_key(target, entry)
    with pytest.raises(KeyProviderError, match="already exists; refusing to overwrite"):
        create_wrapped_key(target, entry)


DOCS_RUN = """\
import runpy, sys
for name in sys.argv[1:]:
    runpy.run_path(name)
"""


def test_the_docs_examples_run_as_written(tmp_path):
    """docs/keys.md's two PKCS#11 snippets, in order, against a SoftHSM2 token labelled as
    they say (its own SOFTHSM2_CONF, so in a child: SoftHSM2 reads it once per process)."""
    import shutil
    import subprocess
    import sys

    from ...test_readme import readme_blocks

    root = Path(__file__).resolve().parents[3]
    blocks = [b for b in readme_blocks((root / "docs" / "keys.md").read_text())
              if b.language == "python" and ("pkcs11_key(" in b.code or
                                             "create_wrapped_key(" in b.code)]
    assert [("generate" in b.code) for b in blocks] == [True, False]
    assert os.path.exists("/usr/lib/softhsm/libsofthsm2.so"), "the path the docs name"
    (tmp_path / "tokens").mkdir()
    conf = tmp_path / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tmp_path / 'tokens'}\n"
                    "objectstore.backend = file\nlog.level = ERROR\n")
    env = dict(os.environ, SOFTHSM2_CONF=str(conf), CRYPTDISK_PIN="1234-docs",
               PYTHONPATH=os.pathsep.join([str(root / "src"), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([shutil.which("softhsm2-util"), "--init-token", "--free", "--label",
                    "cryptdisk", "--pin", "1234-docs", "--so-pin", "so-1"], env=env,
                   check=True, capture_output=True)
    scripts = []
    for i, block in enumerate(blocks):
        scripts.append(tmp_path / f"snippet{i}.py")
        scripts[-1].write_text(block.code)
    done = subprocess.run([sys.executable, "-c", DOCS_RUN, *map(str, scripts)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert oct((tmp_path / "keys" / "k5.p11").stat().st_mode & 0o777) == "0o600"
    check = ("from cryptdisk.keys import Keyring\n"
             "ring = Keyring.from_config('cryptdisk.toml')\n"
             "print(ring.current_key().key_id)\n")
    (tmp_path / "cryptdisk.toml").write_text(
        '[keyring]\n[[keyring.keys]]\nid = 5\nsource = "pkcs11"\n'
        'module = "/usr/lib/softhsm/libsofthsm2.so"\ntoken = "cryptdisk"\nkey = "kek-5"\n'
        'pin_env = "CRYPTDISK_PIN"\nwrapped_key = "keys/k5.p11"\n')
    loaded = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0 and loaded.stdout == "5\n", loaded.stderr


_TOKEN_REMOVED_CHILD = """
import json, subprocess, sys
import cryptdisk
from cryptdisk.keys import Keyring
from cryptdisk.keys.providers import generate_pkcs11_key
module, pin, cfg, path = sys.argv[1:5]
generate_pkcs11_key(module, "removable", "kek-r", pin=pin)
ring = Keyring.from_config(cfg)
with cryptdisk.open(path, "wb", keyring=ring) as f:
    f.write(b"under the token")
ring.current_key().cache.clear()
subprocess.run(["softhsm2-util", "--delete-token", "--token", "removable"], check=True,
               capture_output=True)
try:
    with cryptdisk.open(path, "rb", keyring=ring) as f:
        f.read()
except Exception as exc:
    print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
"""


def test_a_token_removed_while_its_key_is_in_use_is_said_to_be_gone(tmp_path, softhsm):
    """The token is deleted under a running process (a token pulled out): the read fails
    with an error naming the token and what went away, never a bare handle error or the
    PIN. Its own SoftHSM2 directory: a removed token upsets the module for the process."""
    import json
    import shutil
    import subprocess
    import sys

    (tmp_path / "tokens").mkdir()
    conf = tmp_path / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tmp_path / 'tokens'}\nobjectstore.backend = "
                    "file\nlog.level = ERROR\n")
    env = dict(os.environ, SOFTHSM2_CONF=str(conf), CD_TEST_PIN=softhsm.pin,
               PYTHONPATH=str(Path(__file__).resolve().parents[3] / "src"))
    util = shutil.which("softhsm2-util")
    assert util
    subprocess.run([util, "--init-token", "--free", "--label", "removable", "--pin",
                    softhsm.pin, "--so-pin", "so-0815"], check=True, capture_output=True,
                   env=env)
    token = Token(softhsm.module, "removable", softhsm.pin, str(conf))
    cfg = write(tmp_path, "[keyring]\n" + entry_toml(token, "kek-r", extra="retry_seconds = 0\n"))
    done = subprocess.run([sys.executable, "-c", _TOKEN_REMOVED_CHILD, softhsm.module,
                           softhsm.pin, cfg, str(tmp_path / "f.cdk")], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["type"] == "KeyProviderError"
    assert "pkcs11 token 'removable' key 'kek-r'" in got["message"]
    assert "the key is no longer in the token (CKR_OBJECT_HANDLE_INVALID: the token was " \
        "removed" in got["message"]
    assert softhsm.pin not in got["message"] + done.stderr


def test_a_module_that_cannot_initialise_hints_at_its_configuration(tmp_path, softhsm,
                                                                     key_label):
    """SoftHSM2 with SOFTHSM2_CONF naming no file, or a config whose token directory is
    missing, fails C_Initialize (GeneralError): the error says so and the hint names what
    to check, never the PIN. In a child: SoftHSM2 reads its config once per process."""
    import subprocess
    import sys

    cfg = write(tmp_path, "[keyring]\n" + entry_toml(softhsm, key_label))
    (tmp_path / "p.txt").write_text("x")
    missing = tmp_path / "nowhere" / "softhsm2.conf"
    bad = tmp_path / "bad.conf"
    bad.write_text(f"directories.tokendir = {tmp_path / 'no-tokens'}\n"
                   "objectstore.backend = file\n")
    src = str(Path(__file__).resolve().parents[3] / "src")
    for conf, hint in (
            (missing, f"SOFTHSM2_CONF names {missing}, which does not exist"),
            (bad, f"SOFTHSM2_CONF names {bad}, whose token directory "
                  f"{tmp_path / 'no-tokens'} does not exist")):
        env = dict(os.environ, SOFTHSM2_CONF=str(conf), CD_TEST_PIN=softhsm.pin,
                   PYTHONPATH=src)
        r = subprocess.run([sys.executable, "-m", "cryptdisk", "encrypt",
                            str(tmp_path / "p.txt"), str(tmp_path / "p.cd"), "-c", cfg],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 1, r.stderr
        assert f"PKCS#11 module {softhsm.module} cannot be loaded" in r.stderr
        assert f"cryptdisk: hint: {hint}" in r.stderr, r.stderr
        assert softhsm.pin not in r.stderr + r.stdout and "Traceback" not in r.stderr

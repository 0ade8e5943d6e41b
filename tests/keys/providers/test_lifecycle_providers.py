"""``cryptdisk keys`` with provider-held keys: added, promoted, retired and destroyed in the
token or on the server, through the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pkcs11

import cryptdisk
from cryptdisk.format import Header
from cryptdisk.keys import Key, Keyring, write_key_file
from cryptdisk.keys.providers import generate_pkcs11_key

from .conftest import Token

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "src")


def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
               **extra)
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def _objects(token: Token, label: str) -> int:
    tok = pkcs11.lib(token.module).get_token(token_label=token.label)
    try:
        session = tok.open(user_pin=token.pin)
    except pkcs11.exceptions.UserAlreadyLoggedIn:
        session = tok.open()
    with session:
        return len(list(session.get_objects({pkcs11.Attribute.LABEL: label})))


def test_a_token_key_is_added_promoted_retired_and_destroyed_in_the_token(tmp_path, softhsm):
    label = "kek-lifecycle"
    generate_pkcs11_key(softhsm.module, softhsm.label, label, pin=softhsm.pin)
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keyring]\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n')
    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        with cryptdisk.open(data / f"f{i}", "wb", keyring=Keyring.from_config(cfg)) as f:
            f.write(b"x" * 1000)
    pin = {"CD_TEST_PIN": softhsm.pin}
    added = run("keys", "add", "2", "-c", str(cfg), "--source", "pkcs11",
                "--set", f"module={softhsm.module}", "--set", f"token={softhsm.label}",
                "--set", f"key={label}", "--set", "pin_env=CD_TEST_PIN", **pin)
    assert added.returncode == 0, added.stderr
    assert softhsm.pin not in cfg.read_text() and softhsm.pin not in added.stdout + added.stderr
    promoted = run("keys", "promote", "2", "-c", str(cfg), str(data), **pin)
    assert promoted.returncode == 0, promoted.stderr
    assert {Header.parse((data / f"f{i}").read_bytes()[:128]).key_id for i in range(3)} == {2}
    assert run("keys", "retire", "1", "-c", str(cfg), str(data), **pin).returncode == 0
    assert run("keys", "destroy", "1", "-c", str(cfg), str(data), **pin).returncode == 0

    # now the other way: the token key goes, after the files move to a new local key
    assert run("keys", "add", "3", "-c", str(cfg), "--generate", str(tmp_path / "k3.hex"),
               **pin).returncode == 0
    assert run("keys", "promote", "3", "-c", str(cfg), str(data), **pin).returncode == 0
    assert run("keys", "retire", "2", "-c", str(cfg), str(data), **pin).returncode == 0
    assert _objects(softhsm, label) == 1
    destroyed = run("keys", "destroy", "2", "-c", str(cfg), str(data), **pin)
    assert destroyed.returncode == 0, destroyed.stderr
    assert f"destroyed pkcs11 token {softhsm.label!r} key {label!r} in the token" in \
        destroyed.stdout
    assert _objects(softhsm, label) == 0
    with cryptdisk.open(data / "f0", "rb", keyring=Keyring.from_config(cfg)) as f:
        assert f.read() == b"x" * 1000


def test_a_wrong_pin_stops_destroy_with_the_key_kept(tmp_path, softhsm):
    label = "kek-kept"
    generate_pkcs11_key(softhsm.module, softhsm.label, label, pin=softhsm.pin)
    cfg = tmp_path / "c.toml"
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg.write_text(f'[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n'
                   f'[[keyring.keys]]\nid = 2\nstate = "retired"\nsource = "pkcs11"\n'
                   f'module = "{softhsm.module}"\ntoken = "{softhsm.label}"\nkey = "{label}"\n'
                   f'pin_env = "CD_TEST_PIN"\n')
    (tmp_path / "empty").mkdir()
    refused = run("keys", "destroy", "2", "-c", str(cfg), str(tmp_path / "empty"),
                  CD_TEST_PIN="0000-wrong")
    assert refused.returncode == 1 and "the PIN was refused" in refused.stderr
    assert "0000-wrong" not in refused.stderr
    assert _objects(softhsm, label) == 1 and 'key = "kek-kept"' in cfg.read_text()


def test_destroying_a_wrapped_key_deletes_its_file_and_keeps_the_token_key(tmp_path, softhsm):
    from cryptdisk.keys import create_wrapped_key

    label = "kek-wrapping"
    generate_pkcs11_key(softhsm.module, softhsm.label, label, pin=softhsm.pin)
    entry = {"id": 2, "source": "pkcs11", "module": softhsm.module, "token": softhsm.label,
             "key": label, "pin_env": "CD_TEST_PIN"}
    os.environ["CD_TEST_PIN"] = softhsm.pin
    try:
        create_wrapped_key(tmp_path / "k2.p11", entry)
    finally:
        del os.environ["CD_TEST_PIN"]
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n'
                   '[[keyring.keys]]\nid = 2\nstate = "retired"\nsource = "pkcs11"\n'
                   f'module = "{softhsm.module}"\ntoken = "{softhsm.label}"\nkey = "{label}"\n'
                   'pin_env = "CD_TEST_PIN"\nwrapped_key = "k2.p11"\n')
    (tmp_path / "empty").mkdir()
    done = run("keys", "destroy", "2", "-c", str(cfg), str(tmp_path / "empty"),
               CD_TEST_PIN=softhsm.pin)
    assert done.returncode == 0, done.stderr
    assert f"deleted wrapped key file {tmp_path / 'k2.p11'}" in done.stdout
    assert not (tmp_path / "k2.p11").exists() and _objects(softhsm, label) == 1
    assert "id = 2" not in cfg.read_text()


def test_a_token_key_that_cannot_be_found_is_said_in_a_sentence_naming_the_key_once(
        tmp_path, softhsm):
    """A missing token or key label: one 'key N:', the token and key named, and what is
    wrong in words (not python-pkcs11's search template, a dict of attributes)."""
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keyring]\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n')
    before = cfg.read_text()
    pin = {"CD_TEST_PIN": softhsm.pin}
    for token, label, what in (
            (softhsm.label, "kek-not-there", "the token has no AES secret key with that label"),
            ("no-such-token", "kek-x", "the module has no token with that label")):
        added = run("keys", "add", "2", "-c", str(cfg), "--source", "pkcs11",
                    "--set", f"module={softhsm.module}", "--set", f"token={token}",
                    "--set", f"key={label}", "--set", "pin_env=CD_TEST_PIN", **pin)
        assert added.returncode == 1
        assert added.stderr == (f"cryptdisk: error: {cfg}: key 2: pkcs11 token {token!r} key "
                                f"{label!r}: {what}\n")
        assert cfg.read_text() == before

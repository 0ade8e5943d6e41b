"""A field key is not an at-rest key: a config whose field key has the material of its
keyring's key (the same bytes or the same file) is refused when it loads."""

import os
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import cryptdisk
import cryptdisk.fields  # the SQL functions and their config hook
from cryptdisk.errors import ConfigError
from cryptdisk.fields import FieldKeys
from cryptdisk.keys import RemoteKeyProvider, _provider, register_key_provider
from tests.fields.conftest import AT_REST, CARDS, CONFIG

SRC = str(Path(cryptdisk.__file__).resolve().parents[1])


def _config(tmp_path, fields):
    path = tmp_path / "cryptdisk.toml"
    path.write_text(CONFIG.split("[fields.keys.cards]")[0] + fields)
    return path


def test_a_field_key_with_the_at_rest_keys_bytes_is_refused(tmp_path):
    path = _config(tmp_path, f'[[fields.keys.cards]]\nid = 1\nhex = "{CARDS}"\n'
                             f'[[fields.keys.cards]]\nid = 7\nhex = "{AT_REST.upper()}"\n')
    with pytest.raises(ConfigError) as info:
        FieldKeys.from_config(path)
    text = str(info.value)
    assert "field key 'cards' version 7 is the at-rest key 1" in text
    assert str(path) in text and "[fields.keys.cards]" in text
    assert "cryptdisk keygen" in (info.value.hint or "")
    assert AT_REST not in text.lower() and CARDS not in text.lower()
    # the database refuses it when it opens, before any statement
    with pytest.raises(ConfigError, match="version 7 is the at-rest key 1"):
        cryptdisk.connect(tmp_path / "db", str(path))


def test_a_field_key_naming_the_at_rest_keys_file_is_refused(tmp_path):
    (tmp_path / "rest.key").write_text(AT_REST + "\n")
    (tmp_path / "rest.key").chmod(0o600)
    path = tmp_path / "cryptdisk.toml"
    path.write_text(CONFIG.replace(f'hex = "{AT_REST}"', 'file = "rest.key"', 1)
                    .replace(f'hex = "{CARDS}"', 'file = "rest.key"'))
    src = tmp_path / "in.csv"
    src.write_text("pan\n4111111111111111\n")
    env = {**os.environ, "PYTHONPATH": SRC, "CRYPTDISK_TEST_EMAILS_KEY": "ab" * 32}
    run = subprocess.run(
        [sys.executable, "-m", "cryptdisk", "protect", str(src), str(tmp_path / "o.csv"),
         "-c", str(path), "-r", "pan=fpe_encrypt:cards"],
        capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "field key 'cards' version 1 is the at-rest key 1" in run.stderr
    assert AT_REST not in run.stderr.lower() and not (tmp_path / "o.csv").exists()


def test_field_keys_of_their_own_load(tmp_path, monkeypatch):
    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    path = _config(tmp_path, f'[fields.keys.cards]\nhex = "{CARDS}"\n')
    assert list(FieldKeys.from_config(path)) == ["cards"]
    with cryptdisk.connect(tmp_path / "db", str(path)) as db:
        assert db.sql("SELECT decrypt(encrypt('x', 'cards'), 'cards') AS v").to_pylist() == [
            {"v": "x"}]


class _FakeKms(RemoteKeyProvider):
    """A provider-held at-rest key whose closing is recorded."""

    name = "fake-kms-fields"
    label = "fake"
    fields: ClassVar[frozenset[str]] = frozenset({"key"})
    required: ClassVar[frozenset[str]] = frozenset({"key"})
    closed: ClassVar[list[str]] = []

    def connect(self, what: str, key_id: int) -> int:
        self.aead = AESGCM(bytes(32))
        return 32

    def check_value(self) -> bytes:
        return self.aead.encrypt(bytes(12), b"", b"check")[:8]

    def seal(self, nonce: bytes, dek: bytes, associated_data: bytes) -> bytes:
        return self.aead.encrypt(nonce, dek, associated_data)

    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        return self.aead.decrypt(nonce, sealed, associated_data)

    def close(self) -> None:
        self.closed.append(self.value["key"])


def test_the_at_rest_keys_loaded_for_a_failed_check_are_closed(tmp_path, monkeypatch):
    """FieldKeys.from_config loaded the config's at-rest keys to compare them and closed
    none: when the check failed, a provider-held one kept its session (PKCS#11, KMIP) and
    unwrap cache for as long as anything held the exception (its traceback holds the
    keys). Now they are closed once compared, whatever the check says."""
    import gc

    monkeypatch.setattr(_provider, "_KNOWN", dict(_provider._KNOWN))
    monkeypatch.setattr(_provider, "_loaded", dict(_provider._loaded))
    monkeypatch.setattr(_provider, "_SOURCES", set(_provider._SOURCES))
    register_key_provider("fake-kms-fields", _FakeKms, source=True)
    _FakeKms.closed.clear()
    config = (CONFIG.split("[fields.keys.cards]")[0]
              .replace("[keyring]\n", "[keyring]\ncurrent_key_id = 1\n", 1)
              .replace(f'hex = "{AT_REST}"\n', f'hex = "{AT_REST}"\n[[keyring.keys]]\nid = 2\n'
                       'source = "fake-kms-fields"\nkey = "k"\n', 1)
              + f'[[fields.keys.cards]]\nid = 1\nhex = "{AT_REST}"\n')
    path = tmp_path / "cryptdisk.toml"
    path.write_text(config)
    gc.disable()  # no collection may close them for the check
    try:
        with pytest.raises(ConfigError, match="version 1 is the at-rest key 1") as info:
            FieldKeys.from_config(path)
        assert _FakeKms.closed == ["k"]
    finally:
        gc.enable()
    assert info.value is not None  # (held, with its traceback, throughout)

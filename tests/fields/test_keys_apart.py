"""A field key is not an at-rest key: a config whose field key has the material of its
keyring's key (the same bytes or the same file) is refused when it loads."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.fields  # the SQL functions and their config hook
from cryptdisk.errors import ConfigError
from cryptdisk.fields import FieldKeys
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

"""A SoftHSM2 token made for the test session in a temporary SOFTHSM2_CONF directory."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

MODULE_CANDIDATES = ("/usr/lib/softhsm/libsofthsm2.so",
                     "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
                     "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so")


@dataclass(frozen=True)
class Token:
    module: str
    label: str
    pin: str
    conf: str


@pytest.fixture(scope="session")
def softhsm(tmp_path_factory: pytest.TempPathFactory) -> Token:
    """One initialised token for the session (SoftHSM2 reads its config once per process)."""
    util = shutil.which("softhsm2-util")
    module = next((m for m in MODULE_CANDIDATES if os.path.exists(m)), None)
    assert util and module, "SoftHSM2 is needed: apt-get install softhsm2 (.ci/run does)"
    root = tmp_path_factory.mktemp("softhsm")
    (root / "tokens").mkdir()
    conf = root / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {root / 'tokens'}\nobjectstore.backend = file\n"
                    "log.level = ERROR\n")
    os.environ["SOFTHSM2_CONF"] = str(conf)
    pin = "4711-test-pin-do-not-leak"
    subprocess.run([util, "--init-token", "--free", "--label", "cryptdisk-test", "--pin", pin,
                    "--so-pin", "so-0815"], check=True, capture_output=True)
    return Token(module, "cryptdisk-test", pin, str(conf))


def entry_toml(token: Token, key_label: str, key_id: int = 1, *, pin_env: str = "CD_TEST_PIN",
               extra: str = "") -> str:
    return (f'[[keyring.keys]]\nid = {key_id}\nsource = "pkcs11"\nmodule = "{token.module}"\n'
            f'token = "{token.label}"\nkey = "{key_label}"\npin_env = "{pin_env}"\n{extra}')


def write(tmp_path: Path, text: str, name: str = "cryptdisk.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


#: Config lines after a keyring: the default policy stores parts on an encrypted disk over
#: ``store/secure``.
SECURE_STORE = "\n".join([
    "[disks.secure_local]", 'type = "local"', 'path = "store/secure"',
    "[disks.secure]", 'type = "encrypted"', 'disk = "secure_local"',
    "[policies.default]", 'volumes = [{ name = "main", disks = ["secure"] }]', ""])


def assert_parts_sealed_under(tmp_path: Path, key_id: int) -> None:
    """Every file below ``tmp_path/store`` is a cryptdisk file under key ``key_id``."""
    from cryptdisk.format import Header

    parts = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert parts and all(Header.parse(p.read_bytes()[:128]).key_id == key_id for p in parts)


def assert_a_database_round_trips(tmp_path: Path, cfg: str, rows: int, key_id: int) -> None:
    """A table of ``rows`` rows written under ``cfg`` reads back after reopening, and its parts
    are sealed under key ``key_id``."""
    import cryptdisk

    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        db.sql("CREATE TABLE t (i BIGINT)")
        db.sql(f"INSERT INTO t SELECT i FROM range({rows}) r(i)")
    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        assert db.sql("SELECT sum(i) AS s FROM t").to_pylist() == [{"s": rows * (rows - 1) // 2}]
    assert_parts_sealed_under(tmp_path, key_id)

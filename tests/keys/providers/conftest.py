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

"""Shared by the field tests: a database config with an at-rest keyring and two field
keys (``cards`` by hex, ``emails`` version 3 from the environment), and its fixture."""

import pytest

AT_REST = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
CARDS = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
CONFIG = f"""
[keyring]
[[keyring.keys]]
id = 1
hex = "{AT_REST}"

[policies.default]
[[policies.default.volumes]]
name = "main"
disks = ["secure"]

[disks.secure]
type = "encrypted"
disk = "raw"
keys = [1]

[disks.raw]
type = "local"
path = "data"

[fields.keys.cards]
hex = "{CARDS}"

[[fields.keys.emails]]
id = 3
from_env = "CRYPTDISK_TEST_EMAILS_KEY"
"""


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    path = tmp_path / "cryptdisk.toml"
    path.write_text(CONFIG)
    return path

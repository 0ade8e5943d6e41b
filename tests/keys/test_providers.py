"""Key providers: the registry (built in, registered, entry points), the one entry parser."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cryptdisk.config import load_config
from cryptdisk.errors import ConfigError, InvalidKeyError, KeySourceError
from cryptdisk.keys import (
    ENTRY_POINT_GROUP,
    Key,
    KeyProvider,
    Keyring,
    _provider,
    export_key_material,
    get_key_provider,
    key_provider_names,
    parse_key_entry,
    register_key_provider,
    write_key_file,
)

HEX = "00112233445566778899aabbccddeeff" * 2
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    """Each test registers into a copy of the registry, so none leaks into another."""
    monkeypatch.setattr(_provider, "_KNOWN", dict(_provider._KNOWN))
    monkeypatch.setattr(_provider, "_loaded", dict(_provider._loaded))


class ReversedHex(KeyProvider):
    """A test provider: the key is the hex string written backwards."""

    name = "reversed_hex"
    label = "reversed"

    def __init__(self, value: Any, *, base: str) -> None:
        if not isinstance(value, str):
            raise TypeError("must be a string")
        super().__init__(value, base=base)

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        return bytes.fromhex(self.value[::-1])


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cryptdisk.toml"
    path.write_text(text)
    return str(path)


def test_builtin_providers_are_registered_in_order():
    assert key_provider_names()[:6] == ["hex", "from_env", "file", "command", "raw",
                                        "raw_from_env"]
    assert get_key_provider("from_env").label == "env"
    with pytest.raises(LookupError, match="no key provider named 'nope'"):
        get_key_provider("nope")


def test_a_registered_provider_serves_the_keyring_and_the_disks(tmp_path):
    register_key_provider("reversed_hex", ReversedHex)
    with pytest.raises(ValueError, match="already registered"):
        register_key_provider("reversed_hex", ReversedHex)
    k2 = "22" * 32
    cfg = load_config(_write(tmp_path, f"""
[keyring]
[[keyring.keys]]
id = 1
reversed_hex = "{HEX[::-1]}"
[disks.raw]
type = "local"
path = "raw"
[disks.e]
type = "encrypted"
disk = "raw"
keys = [{{ id = 2, reversed_hex = "{k2}" }}]
"""))
    assert cfg.keyring is not None
    key = cfg.keyring.current_key()
    assert key.source == "reversed" and key == Key(1, bytes.fromhex(HEX))
    assert cfg.cryptdisk_keys()[-1] == Key(2, bytes.fromhex(k2))


def test_a_lazy_provider_that_cannot_import_gives_its_install_hint(tmp_path):
    register_key_provider("vault", "cryptdisk_vault_missing:VaultKey",
                          errtxt="pip install cryptdisk-vault")
    path = _write(tmp_path, "[keyring]\n[[keyring.keys]]\nid = 1\nvault = 'secret/k1'\n")
    with pytest.raises(KeySourceError, match="'vault' cannot be imported") as info:
        Keyring.from_config(path)
    assert info.value.hint == "pip install cryptdisk-vault"
    assert path in str(info.value) and "line 2" in str(info.value)


def test_register_refuses_what_is_not_a_provider():
    with pytest.raises(TypeError, match="KeyProvider subclass"):
        register_key_provider("thing", object)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="identifier"):
        register_key_provider("id", ReversedHex)


def test_an_entry_point_provider_is_found_by_name(tmp_path):
    """A third-party package declares ``[cryptdisk.key_providers] name = module:Class``."""
    site = tmp_path / "site"
    dist = site / "cryptdisk_fake_provider-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cryptdisk-fake-provider\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nfake_hex = cryptdisk_fake_provider:FakeHex\n")
    (site / "cryptdisk_fake_provider.py").write_text(textwrap.dedent("""
        from cryptdisk.keys import KeyProvider

        class FakeHex(KeyProvider):
            name = "fake_hex"
            label = "fake"

            def load(self, what, sizes):
                return bytes.fromhex(self.value)
    """))
    config = _write(tmp_path, f"[keyring]\n[[keyring.keys]]\nid = 7\nfake_hex = '{HEX}'\n")
    code = ("import sys; from cryptdisk import Keyring\n"
            "k = Keyring.from_config(sys.argv[1]).current_key()\n"
            "print(k.key_id, k.source, k.check_value.hex())\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), SRC]))
    r = subprocess.run([sys.executable, "-c", code, config], capture_output=True, text=True,
                       env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["7", "fake", Key(7, bytes.fromhex(HEX)).check_value.hex()]


def test_keyring_and_disk_entries_share_one_parser(tmp_path):
    """The same malformed entry fails the same way in [keyring] and in a disk's keys."""
    in_ring = _write(tmp_path, "[keyring]\n[[keyring.keys]]\nid = 1\nhex = ''\n")
    with pytest.raises(ConfigError) as ring_error:
        Keyring.from_config(in_ring)
    in_disk = _write(tmp_path, "[disks.a]\ntype='local'\npath='x'\n[disks.e]\n"
                     "type='encrypted'\ndisk='a'\n[[disks.e.keys]]\nid=1\nhex=''\n")
    with pytest.raises(ConfigError) as disk_error:
        load_config(in_disk)
    for info in (ring_error, disk_error):
        assert "key 1: hex must be a non-empty string" in str(info.value)


def test_parse_key_entry_keeps_material_out_of_repr_and_pickles():
    entry = parse_key_entry({"id": 3, "hex": HEX}, path=None, where="test")
    assert entry.key_id == 3 and entry.source == "hex" and entry.material == bytes.fromhex(HEX)
    assert HEX[:8] not in repr(entry)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(entry)
    with pytest.raises(ConfigError, match=r"unknown field\(s\) raw"):  # raw: ClickHouse disks
        parse_key_entry({"id": 3, "raw": "x" * 32}, path=None, where="test")
    raw = parse_key_entry({"raw": "x" * 24}, path=None, where="t", sizes=(16, 24, 32),
                          default_id=0, exclude=())
    assert raw.key_id == 0 and raw.material == b"x" * 24
    with pytest.raises(InvalidKeyError, match="key 0 is 5 bytes"):
        parse_key_entry({"raw": "short"}, path=None, where="t", default_id=0, exclude=())


def test_export_key_material_is_the_one_way_out(tmp_path):
    key = Key(4, bytes.fromhex(HEX))
    assert export_key_material(key) == bytes.fromhex(HEX)
    assert not hasattr(key, "_raw_material")
    with pytest.raises(TypeError, match="expected a cryptdisk Key"):
        export_key_material(bytes.fromhex(HEX))  # type: ignore[arg-type]
    path = tmp_path / "k.hex"
    write_key_file(path, key)
    text = path.read_text()
    assert ", id 4)" in text and HEX in text and (path.stat().st_mode & 0o777) == 0o600

"""The key lifecycle over a ClickHouse-compatible disk keyed by the keyring.

A ``clickhouse`` disk's files are AES-CTR under the key itself (ClickHouse's ``ENC``
format, a key fingerprint in the header): they cannot be rewrapped, so a key stays in use
until they are re-encrypted, and retiring it must be refused meanwhile.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptdisk.config import load_config
from cryptdisk.keys import Key, export_key_material, write_key_file

from .test_lifecycle import keyring_section, run

CONFIG = """\
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
file = "k1.hex"

[disks.chlocal]
type = "local"
path = "store/ch"
[disks.ch]
type = "clickhouse"
disk = "chlocal"
algorithm = "AES_256_CTR"

[disks.ownlocal]
type = "local"
path = "store/own"
[disks.own]                       # a disk with a key of its own, outside [keyring]
type = "clickhouse"
disk = "ownlocal"
algorithm = "AES_256_CTR"
[[disks.own.keys]]
id = 9
file = "own.hex"
"""


def _write(cfg: Path, disk: str, name: str) -> None:
    load_config(cfg).disks[disk].write_bytes(name, name.encode() * 50)


def _read(cfg: Path, disk: str, name: str) -> bytes:
    return load_config(cfg).disks[disk].read_bytes(name)


def test_retire_refuses_a_key_whose_clickhouse_files_remain_until_they_are_converted(tmp_path):
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    write_key_file(tmp_path / "own.hex", Key.generate(9))
    cfg = tmp_path / "cryptdisk.toml"
    cfg.write_text(CONFIG)
    _write(cfg, "ch", "a/old.bin")
    _write(cfg, "own", "x.bin")
    assert run("keys", "add", "2", "-c", str(cfg), "--generate", str(tmp_path / "k2.hex")
               ).returncode == 0
    done = run("keys", "promote", "2", "-c", str(cfg), str(tmp_path / "store"))
    assert done.returncode == 0, done.stderr
    assert "2 in ClickHouse's format (encrypted with the key itself, not rewrappable" in \
        done.stdout
    _write(cfg, "ch", "b/new.bin")  # under key 2, the current key

    listed = run("keys", "list", "-c", str(cfg), "--format", "csv", str(tmp_path / "store"))
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1:] == ["1,active,file,k1.hex,1", "2,current,file,k2.hex,1"]

    refused = run("keys", "retire", "1", "-c", str(cfg), str(tmp_path / "store"))
    assert refused.returncode == 1
    assert "key 1 is still used by 1 file(s): " in refused.stderr
    assert "store/ch/a/old.bin" in refused.stderr and "own" not in refused.stderr.split("hint")[0]
    assert "cryptdisk convert" in refused.stderr
    assert keyring_section(str(cfg))["keys"][0].get("state") is None
    assert _read(cfg, "ch", "a/old.bin") == b"a/old.bin" * 50  # still readable

    converted = tmp_path / "converted"
    done = run("convert", str(tmp_path / "store" / "ch"), str(converted), "-c", str(cfg),
               "--to", "clickhouse", "--disk", "ch", "-q")
    assert done.returncode == 0, done.stderr
    done = run("keys", "retire", "1", "-c", str(cfg), str(converted), str(tmp_path / "store/own"))
    assert done.returncode == 0, done.stderr
    assert keyring_section(str(cfg))["keys"][0]["state"] == "retired"


def test_a_clickhouse_file_whose_key_cannot_be_compared_counts_as_possibly_the_key(tmp_path):
    write_key_file(tmp_path / "own.hex", Key.generate(9))
    write_key_file(tmp_path / "k2.hex", Key.generate(2))
    k1 = export_key_material(Key.generate(1)).hex()
    cfg = tmp_path / "cryptdisk.toml"
    cfg.write_text(CONFIG.replace('file = "k1.hex"', 'from_env = "CD_TEST_K1"'))
    os.environ["CD_TEST_K1"] = k1
    try:
        _write(cfg, "ch", "a/old.bin")
    finally:
        del os.environ["CD_TEST_K1"]
    cfg.write_text(cfg.read_text().replace("current_key_id = 1", "current_key_id = 2").replace(
        'from_env = "CD_TEST_K1"\n',
        'from_env = "CD_TEST_K1"\n[[keyring.keys]]\nid = 2\nfile = "k2.hex"\n'))
    # key 1's variable is not set: which key the file uses cannot be told, so it may be 1
    refused = run("keys", "retire", "1", "-c", str(cfg), str(tmp_path / "store" / "ch"))
    assert refused.returncode == 1
    assert "old.bin (ClickHouse format; its key is unknown: a key of the config did not load" \
        in refused.stderr
    refused = run("keys", "retire", "1", "-c", str(cfg), str(tmp_path / "store" / "ch"),
                  CD_TEST_K1=k1)
    assert refused.returncode == 1 and "still used by 1 file(s)" in refused.stderr


def test_destroy_refuses_a_retired_key_whose_clickhouse_files_remain(tmp_path):
    """A key retired by hand (or before ClickHouse files were counted) while such files
    still use it: destroy reads its key file to compare, refuses, and keeps the key."""
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    write_key_file(tmp_path / "k2.hex", Key.generate(2))
    write_key_file(tmp_path / "own.hex", Key.generate(9))
    cfg = tmp_path / "cryptdisk.toml"
    cfg.write_text(CONFIG.replace('file = "k1.hex"\n', 'file = "k1.hex"\n[[keyring.keys]]\n'
                                  'id = 2\nfile = "k2.hex"\n'))
    _write(cfg, "ch", "a/old.bin")
    cfg.write_text(cfg.read_text().replace("current_key_id = 1", "current_key_id = 2").replace(
        'file = "k1.hex"\n', 'file = "k1.hex"\nstate = "retired"\n'))
    refused = run("keys", "destroy", "1", "-c", str(cfg), str(tmp_path / "store"))
    assert refused.returncode == 1
    assert "destroying it would lose them: " in refused.stderr and "old.bin" in refused.stderr
    assert "cryptdisk convert" in refused.stderr
    assert (tmp_path / "k1.hex").exists()
    assert [k["id"] for k in keyring_section(str(cfg))["keys"]] == [1, 2]

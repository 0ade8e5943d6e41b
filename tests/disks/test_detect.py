"""open_any / describe: recognising a file's format by its header and choosing its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryptdisk import Key, Keyring
from cryptdisk.config import load_config
from cryptdisk.disks import EncryptedDisk, LocalDisk, describe, open_any
from cryptdisk.errors import KeyNotFoundError, NotEncryptedError

K1, K2 = "12" * 32, "34" * 16
CH_KEY = "00112233445566778899aabbccddeeff"


@pytest.fixture
def config(tmp_path: Path) -> str:
    p = tmp_path / "c.toml"
    p.write_text(f"""
[keyring]
[[keyring.keys]]
id = 1
hex = "{K1}"
[disks.raw]
type = "local"
path = "raw"
[disks.other]
type = "encrypted"
disk = "raw"
path = "other"
[[disks.other.keys]]
id = 2
hex = "{K2}"
""")
    return str(p)


def test_cryptdisk_files_keys_from_keyring_and_disks(config: str, tmp_path: Path) -> None:
    cfg = load_config(config)
    raw = LocalDisk("raw", tmp_path / "raw")
    EncryptedDisk("a", raw, Keyring([Key(1, bytes.fromhex(K1))])).write_bytes("a", b"A" * 1000)
    cfg.disks["other"].write_bytes("b", b"B" * 10)
    with open_any(tmp_path / "raw" / "a", config=cfg) as f:
        assert f.read() == b"A" * 1000
    with open_any(tmp_path / "raw" / "other" / "b", config=load_config(config)) as f:
        assert f.pread(2, 3) == b"BBB"
    info = describe(tmp_path / "raw" / "other" / "b")
    assert info == {"path": str(tmp_path / "raw" / "other" / "b"), "format": "cryptdisk",
                    "stored_size": info["stored_size"], "version": 1, "kind": "sealed",
                    "algorithm": "aes-128-gcm", "key_id": 2, "segment_size": 65536,
                    "plaintext_size": 10}
    assert K2 not in repr(info) and K1 not in repr(info)


def test_missing_key_names_file_and_id(tmp_path: Path) -> None:
    disk = EncryptedDisk("a", LocalDisk("raw", tmp_path), Keyring([Key.generate(77)]))
    disk.write_bytes("f", b"x")
    with pytest.raises(KeyNotFoundError) as info:
        open_any(tmp_path / "f", keyring=Keyring([Key.generate(3)]))
    assert str(tmp_path / "f") in str(info.value) and "id 77" in str(info.value)
    assert info.value.key_id == 77


def test_plain_files(tmp_path: Path) -> None:
    (tmp_path / "p").write_bytes(b"just text")
    with pytest.raises(NotEncryptedError):
        open_any(tmp_path / "p")
    with open_any(tmp_path / "p", allow_plain=True) as f:
        assert f.read() == b"just text"
    assert describe(tmp_path / "p")["format"] == "plain"


def test_clickhouse_files_by_fingerprint(tmp_path: Path) -> None:
    from cryptdisk.disks import ClickHouseDisk, ClickHouseKey

    p = tmp_path / "c.toml"
    p.write_text(f"[disks.raw]\ntype='local'\npath='raw'\n[disks.ch]\ntype='clickhouse'\n"
                 f"disk='raw'\ncurrent_key_id=5\n[[disks.ch.keys]]\nid=5\nhex='{CH_KEY}'\n")
    cfg = load_config(p)
    disk = cfg.disks["ch"]
    assert isinstance(disk, ClickHouseDisk)
    disk.write_bytes("part/data.bin", b"clickhouse bytes" * 100)
    path = tmp_path / "raw" / "part" / "data.bin"
    assert path.read_bytes()[:3] == b"ENC"
    with open_any(path, config=cfg) as f:
        assert f.read() == b"clickhouse bytes" * 100
    info = describe(path, config=cfg)
    assert info["format"] == "clickhouse" and info["key_id"] == 5
    assert info["key_fingerprint"] == "75264928bd0f327f80f1af4b93f2cd69"
    assert info["plaintext_size"] == 1600 and "AES_128_CTR" in str(info["algorithm"])
    with pytest.raises(KeyNotFoundError, match="75264928bd0f327f80f1af4b93f2cd69"):
        open_any(path, config=None)
    assert ClickHouseKey(5, bytes.fromhex(CH_KEY)).fingerprint.hex() == \
        "75264928bd0f327f80f1af4b93f2cd69"


def test_describe_a_framed_file_and_verify_it(tmp_path: Path) -> None:
    """A SQLite WAL is a framed file (kind 3): its plaintext size follows its own geometry."""
    import cryptdisk
    import cryptdisk.sqlite as csql

    ring = Keyring([Key(1, bytes(range(32)))])
    db = tmp_path / "w.db"
    conn = csql.connect(str(db), keyring=ring)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(v)")
    conn.execute("INSERT INTO t VALUES(randomblob(5000))")
    wal = Path(str(db) + "-wal")
    info = describe(wal)
    with cryptdisk.open(wal, "rb", keyring=ring) as f:
        plain = f.read()
        assert f.verify() == len(plain)
    conn.close()
    assert info["kind"] == "framed" and info["segment_size"] == 4096
    assert info["plaintext_size"] == len(plain) == 32 + (len(plain) - 32) // 4120 * 4120
    assert plain[:4] == bytes.fromhex("377f0682")  # SQLite's WAL magic, decrypted


def test_a_rewrap_between_choosing_the_key_and_opening_still_opens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    old, new = Key.generate(1), Key.generate(2)
    EncryptedDisk("a", LocalDisk("raw", tmp_path), Keyring([old])).write_bytes("f", b"F" * 5000)
    import cryptdisk.disks._detect as detect
    from cryptdisk.keys import rewrap_file

    real_open = detect.open_file

    def rotate_then_open(*args: object, **kwargs: object) -> object:
        # the header open_any chose its key by is replaced before open_file reads it
        assert rewrap_file(tmp_path / "f", Keyring([old, new], current_key_id=2))
        return real_open(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(detect, "open_file", rotate_then_open)
    with open_any(tmp_path / "f", keyring=Keyring([old, new], current_key_id=1)) as f:
        assert f.read() == b"F" * 5000
    assert describe(tmp_path / "f")["key_id"] == 2


def test_keys_sharing_an_id_open_the_file_whose_check_value_matches(tmp_path: Path) -> None:
    a, b = Key.generate(5), Key.generate(5)
    other = Key.generate(6)
    EncryptedDisk("a", LocalDisk("raw", tmp_path), Keyring([b])).write_bytes("f", b"bee")
    ring = Keyring([a, other], current_key_id=5)

    class Cfg:
        path = "c.toml"

        def cryptdisk_keys(self) -> list[Key]:
            return [b, other]

        def clickhouse_keys(self) -> list[object]:
            return []

    with open_any(tmp_path / "f", keyring=ring, config=Cfg()) as f:  # type: ignore[arg-type]
        assert f.read() == b"bee"


def test_clickhouse_keys_of_several_disks_may_share_ids(tmp_path: Path) -> None:
    from cryptdisk.disks import ClickHouseDisk, ClickHouseKey
    from cryptdisk.errors import KeyringError
    from cryptdisk.format.clickhouse import CHAlgorithm, CHHeader, clickhouse_v1_key_hash

    raw = LocalDisk("raw", tmp_path)
    a, b = ClickHouseKey(1, bytes(range(16))), ClickHouseKey(1, bytes(range(1, 17)))
    two = ClickHouseKey(2, bytes(range(2, 18)))
    ClickHouseDisk("x", raw, [a, two], 1, prefix="x").write_bytes("f", b"from x")
    ClickHouseDisk("y", raw, [b], 1, prefix="y").write_bytes("f", b"from y")

    class Cfg:
        path = "c.toml"

        def cryptdisk_keys(self) -> list[Key]:
            return []

        def clickhouse_keys(self) -> list[ClickHouseKey]:
            return [a, two, b]  # disk x's keys, then disk y's: id 1 twice, different keys

    for name, data in (("x", b"from x"), ("y", b"from y")):
        with open_any(tmp_path / name / "f", config=Cfg()) as f:  # type: ignore[arg-type]
            assert f.read() == data
    # A version-1 header names its key by id and a 4-bit hash: with two different keys of
    # that id and hash, which one wrote the file is unknown, and that is the error.
    c = next(ClickHouseKey(1, bytes([n]) * 16) for n in range(256)
             if clickhouse_v1_key_hash(bytes([n]) * 16) == clickhouse_v1_key_hash(bytes(range(16)))
             and bytes([n]) * 16 != bytes(range(16)))
    header = CHHeader(1, CHAlgorithm.AES_128_CTR, None, 1, bytes(16),
                      clickhouse_v1_key_hash(bytes(range(16))))
    (tmp_path / "v1").write_bytes(header.to_bytes() + b"data")

    class Both(Cfg):
        def clickhouse_keys(self) -> list[ClickHouseKey]:
            return [a, c]

    with pytest.raises(KeyringError, match=r"2 different keys .* fit the file's key id 1") as info:
        open_any(tmp_path / "v1", config=Both())  # type: ignore[arg-type]
    assert bytes(range(16)).hex() not in str(info.value)
    with open_any(tmp_path / "v1", config=Cfg()) as f:  # type: ignore[arg-type]
        assert f.read(4)  # key a alone fits it: b's hash differs
    # Within one disk an id names one key.
    with pytest.raises(ValueError, match="two different keys have id 1"):
        ClickHouseDisk("z", raw, [a, b], 1)
    assert ClickHouseDisk("z", raw, [a, ClickHouseKey(1, bytes(range(16)))], 1).keys == {1: a}

"""Encrypted file names (``encrypt_names``): round trips, listing, tampering, what the disk shows.

The conformance suite also runs over name-encrypting disks (``conftest.DISK_KINDS``).
"""

from __future__ import annotations

import os
import pickle
import string
from pathlib import Path

import fsspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cryptdisk import Keyring
from cryptdisk.config import load_config
from cryptdisk.disks import EncryptedDisk, LocalDisk
from cryptdisk.disks._names import MAX_NAME_BYTES, NameCipher
from cryptdisk.errors import (
    ConfigError,
    DiskError,
    DiskFileNotFoundError,
    KeyNotFoundError,
    NameAuthenticationError,
)
from cryptdisk.keys import Key
from tests.configs import encrypted_over_local

KEY_HEX = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
NAMES = ["t/part=a/x.parquet", "t/part=b/y.parquet", "t/part=a/z.parquet", "top secret.txt",
         "ünïcödé/日本語/ファイル"]


def _disk(root: Path, keyring: Keyring | None = None, names_key_id: int | None = 1,
          prefix: str = "enc") -> EncryptedDisk:
    ring = keyring or Keyring([Key(1, bytes.fromhex(KEY_HEX))], 1)
    return EncryptedDisk("n", LocalDisk("raw", root), ring, prefix=prefix, segment_size=4096,
                         names_key_id=names_key_id)


def _stored(root: Path) -> list[str]:
    """Every path below ``root`` (files and directories), relative, as the backing store shows."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_round_trip_and_listing(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    for i, name in enumerate(NAMES):
        disk.write_bytes(name, f"content {i}".encode())
    assert disk.list() == sorted(NAMES)
    assert disk.list("t/") == ["t/part=a/x.parquet", "t/part=a/z.parquet", "t/part=b/y.parquet"]
    assert disk.list("t/part=a") == ["t/part=a/x.parquet", "t/part=a/z.parquet"]
    assert disk.list("t/part=") == disk.list("t/")
    assert disk.list("top") == ["top secret.txt"]
    assert disk.list("nothing/") == [] and disk.list("t/part=c/") == []
    for i, name in enumerate(NAMES):
        assert disk.read_bytes(name) == f"content {i}".encode()
        assert disk.exists(name) and disk.info(name).path == name
    disk.rename("t/part=a/x.parquet", "t/part=c/x.parquet")
    assert disk.list("t/part=c/") == ["t/part=c/x.parquet"]
    disk.remove("t/part=c/x.parquet")
    assert not disk.exists("t/part=c/x.parquet")
    # A second disk object with the same key reads the same names (deterministic).
    assert _disk(tmp_path).list("t/") == ["t/part=a/z.parquet", "t/part=b/y.parquet"]


def test_names_are_not_visible_on_disk(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    for name in NAMES:
        disk.write_bytes(name, b"x")
    stored = _stored(tmp_path / "enc")
    assert len(stored) == 10  # 5 files and 5 directories, each under an encrypted name
    components = {c for name in NAMES for c in name.split("/")}
    words = {w for c in components for w in c.replace("=", ".").split(".") if len(w) >= 4}
    for path in stored:
        assert not components & set(path.split("/")), path
        for word in words | {"part=", "日本語"}:
            assert word not in path, (word, path)
        assert set(path) <= set(string.ascii_letters + string.digits + "-_/")
    # Same name, other directory: another stored name (the parent is associated data).
    a, b = _disk(tmp_path).names.encrypt_path("t/part=a/x"), _disk(tmp_path).names.encrypt_path(
        "t/part=b/x")
    assert a.split("/")[0] == b.split("/")[0] and a.split("/")[2] != b.split("/")[2]


def test_a_changed_stored_name_is_a_clear_error(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    disk.write_bytes("dir/file", b"x")
    (stored,) = [p for p in (tmp_path / "enc").rglob("*") if p.is_file()]
    flipped = stored.name[:5] + ("A" if stored.name[5] != "A" else "B") + stored.name[6:]
    stored.rename(stored.with_name(flipped))
    with pytest.raises(NameAuthenticationError, match="does not authenticate") as info:
        disk.list()
    assert info.value.path is not None and flipped in info.value.path
    with pytest.raises(DiskFileNotFoundError, match="dir/file"):
        disk.read_bytes("dir/file")


def test_a_name_moved_to_another_directory_fails(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    disk.write_bytes("a/f", b"from a")
    disk.write_bytes("b/g", b"from b")
    enc_a = tmp_path / "enc" / disk.names.encrypt_path("a/f")  # type: ignore[union-attr]
    enc_b = tmp_path / "enc" / disk.names.encrypt_path("b/g")  # type: ignore[union-attr]
    enc_a.rename(enc_b.parent / enc_a.name)  # a valid stored name, in the wrong directory
    with pytest.raises(NameAuthenticationError):
        disk.list("b/")


@pytest.mark.parametrize("foreign", ["README", "not base64!", "QUJD"])
def test_a_foreign_file_is_a_clear_error(tmp_path: Path, foreign: str) -> None:
    disk = _disk(tmp_path)
    disk.write_bytes("f", b"x")
    (tmp_path / "enc" / foreign).write_bytes(b"planted")
    with pytest.raises(NameAuthenticationError, match="does not authenticate"):
        disk.list()


def test_another_names_key_cannot_read_the_names(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    disk.write_bytes("f", b"x")
    k1 = Key(1, bytes.fromhex(KEY_HEX))
    other = _disk(tmp_path, Keyring([k1, Key.generate(2)], 1), names_key_id=2)
    assert not other.exists("f")
    with pytest.raises(NameAuthenticationError, match="key id 2"):
        other.list()


def test_rotation_keeps_names(tmp_path: Path) -> None:
    k1, k2 = Key(1, bytes.fromhex(KEY_HEX)), Key.generate(2)
    _disk(tmp_path, Keyring([k1], 1)).write_bytes("p/q", b"old key")
    rotated = _disk(tmp_path, Keyring([k1, k2], 2), names_key_id=1)
    rotated.write_bytes("p/r", b"new key")
    assert rotated.rewrap("p/q") is True
    assert rotated.list() == ["p/q", "p/r"]
    assert rotated.info("p/q").key_id == 2 and rotated.read_bytes("p/q") == b"old key"


def test_long_names(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    longest = "é" * (MAX_NAME_BYTES // 2)  # 160 bytes of UTF-8
    disk.write_bytes(f"d/{longest}", b"fits")  # the temporary name fits too
    assert disk.list("d/") == [f"d/{longest}"]
    assert max(len(p.name) for p in (tmp_path / "enc").rglob("*")) <= 235
    with pytest.raises(DiskError, match=f"at most {MAX_NAME_BYTES} bytes"):
        disk.write_bytes("d/" + "x" * (MAX_NAME_BYTES + 1), b"too long")
    assert disk.list() == [f"d/{longest}"]


def test_names_key_never_leaks(tmp_path: Path) -> None:
    key = Key(1, bytes.fromhex(KEY_HEX))
    derived = key.derive(b"cryptdisk names v1 aes-siv-512", 64)
    disk = _disk(tmp_path)
    disk.write_bytes("f", b"x")
    (tmp_path / "enc" / "junk").write_bytes(b"")
    with pytest.raises(NameAuthenticationError) as info:
        disk.list()
    texts = [repr(disk), repr(disk.names), str(info.value), repr(info.value)]
    for text in texts:
        assert KEY_HEX not in text and derived.hex() not in text
    assert repr(disk.names) == "<NameCipher key_id=1>"
    for obj in (disk, disk.names):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(obj)
    assert not [a for a in dir(disk.names) if not a.startswith("__") and "key" in a.lower()
                and a != "key_id"]


def test_names_key_must_be_one_of_the_disks_keys(tmp_path: Path) -> None:
    with pytest.raises(KeyNotFoundError, match="names_key_id 9"):
        _disk(tmp_path, names_key_id=9)
    with pytest.raises(TypeError):
        NameCipher("not a key")  # type: ignore[arg-type]


# -- config --------------------------------------------------------------------------


def _config(tmp_path: Path, disk_lines: str) -> Path:
    path = tmp_path / "cryptdisk.toml"
    path.write_text(encrypted_over_local(KEY_HEX, disk_lines, current_key_id=True))
    return path


def test_config_turns_it_on(tmp_path: Path) -> None:
    path = _config(tmp_path, "encrypt_names = true\nnames_key_id = 1")
    fs = fsspec.filesystem("cryptdisk", config=str(path), skip_instance_cache=True)
    fs.pipe({"secure/sales/part=emea/0.parquet": b"a", "secure/sales/part=apac/0.parquet": b"b"})
    assert fs.ls("secure/sales", detail=False) == ["secure/sales/part=apac",
                                                   "secure/sales/part=emea"]
    assert fs.cat("secure/sales/part=emea/0.parquet") == b"a"
    assert not any("part=" in p or "sales" in p for p in _stored(tmp_path / "raw"))
    assert isinstance(load_config(path).disks["secure"], EncryptedDisk)


def test_duckdb_hive_partitions_over_encrypted_names(tmp_path: Path) -> None:
    import duckdb

    path = _config(tmp_path, "encrypt_names = true\nnames_key_id = 1")
    con = duckdb.connect()
    con.register_filesystem(fsspec.filesystem("cryptdisk", config=str(path),
                                              skip_instance_cache=True))
    for rest, region in ((0, "apac"), (1, "emea")):
        con.execute(f"COPY (SELECT range AS i FROM range(100) WHERE range % 2 = {rest}) "
                    f"TO 'cryptdisk://secure/sales/region={region}/0.parquet' (FORMAT parquet)")
    got = con.execute("SELECT region, count(*), sum(i) FROM read_parquet("
                      "'cryptdisk://secure/sales/*/*.parquet', hive_partitioning = true) "
                      "GROUP BY region ORDER BY region").fetchall()
    assert got == [("apac", 50, 2450), ("emea", 50, 2500)]
    stored = _stored(tmp_path / "raw")
    assert len(stored) >= 5 and not any("region" in p or "sales" in p for p in stored)


def test_database_tables_on_a_disk_that_encrypts_names(tmp_path: Path) -> None:
    import cryptdisk

    path = _config(tmp_path, "encrypt_names = true\nnames_key_id = 1")
    with path.open("a") as f:
        f.write('[policies.default]\n[[policies.default.volumes]]\nname = "main"\n'
                'disks = ["secure"]\n')
    db = cryptdisk.connect(str(tmp_path / "sales.db"), config=str(path))
    try:
        db.sql("CREATE TABLE t (x BIGINT)")
        db.sql("INSERT INTO t SELECT range FROM range(1000)")
        assert db.query("SELECT count(*), sum(x) FROM t") == [(1000, 499500)]
        (part_path,) = [row[0] for row in db.query("SELECT path FROM system.parts")]
    finally:
        db.close()
    stored = _stored(tmp_path / "raw")
    assert stored and not any(".parquet" in p or "cryptdisk-db" in p for p in stored)
    assert part_path.endswith(".parquet")


@pytest.mark.parametrize(("lines", "message"), [
    ("encrypt_names = true", "encrypt_names needs names_key_id"),
    ("encrypt_names = true\nnames_key_id = 4", "names_key_id = 4 is not one of its key ids"),
    ("encrypt_names = 1\nnames_key_id = 1", "encrypt_names must be true or false"),
    ("names_key_id = 1", "encrypt_names is not true"),
])
def test_config_errors(tmp_path: Path, lines: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_config(_config(tmp_path, lines))
    assert "line" in str(info.value) and KEY_HEX not in str(info.value)


def test_config_refuses_names_on_clickhouse_disks(tmp_path: Path) -> None:
    path = tmp_path / "ch.toml"
    path.write_text("""
[disks.raw]
type = "local"
path = "raw"

[disks.ch]
type = "clickhouse"
disk = "raw"
encrypt_names = true
[[disks.ch.keys]]
id = 0
hex = "00112233445566778899aabbccddeeff"
""")
    with pytest.raises(ConfigError, match="not available for clickhouse disks"):
        load_config(path)


# -- properties ----------------------------------------------------------------------

_component = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\0"),
    min_size=1, max_size=40).filter(lambda s: s not in (".", "..") and len(
        s.encode()) <= MAX_NAME_BYTES)
_path = st.lists(_component, min_size=1, max_size=4).map("/".join)


@settings(max_examples=200, deadline=None)
@given(path=_path, other=_path)
def test_property_names_round_trip(path: str, other: str) -> None:
    cipher = NameCipher(Key(1, bytes.fromhex(KEY_HEX)))
    stored = cipher.encrypt_path(path)
    assert cipher.decrypt_path(stored) == path
    assert cipher.encrypt_path(path) == stored  # deterministic
    assert stored.count("/") == path.count("/")
    assert all(0 < len(p) <= 235 and set(p) <= set(string.ascii_letters + string.digits + "-_")
               for p in stored.split("/"))
    if other != path:
        assert cipher.encrypt_path(other) != stored


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.sets(_path, min_size=1, max_size=6), flip=st.integers(min_value=0))
def test_property_listing_and_tamper(tmp_path: Path, names: set[str], flip: int) -> None:
    root = tmp_path / os.urandom(6).hex()
    disk = _disk(root)
    files = set()
    for name in sorted(names):
        if any(n.startswith(name + "/") or name.startswith(n + "/") for n in files):
            continue  # a name cannot be both a file and a directory
        disk.write_bytes(name, name.encode())
        files.add(name)
    assert disk.list() == sorted(files)
    assert all(disk.read_bytes(n) == n.encode() for n in files)
    # Any one changed character of any stored name is detected.
    stored = sorted(p for p in (root / "enc").rglob("*"))
    victim = stored[flip % len(stored)]
    pos = flip % len(victim.name)
    alphabet = string.ascii_letters + string.digits + "-_"
    new = alphabet[(alphabet.index(victim.name[pos]) + 1 + flip % 60) % len(alphabet)]
    victim.rename(victim.with_name(victim.name[:pos] + new + victim.name[pos + 1:]))
    with pytest.raises(NameAuthenticationError):
        disk.list()

"""What only encrypted disks promise: ciphertext at rest, tamper detection, key semantics."""

from __future__ import annotations

from pathlib import Path

import pytest

from cryptdisk import Key, Keyring
from cryptdisk.disks import EncryptedDisk, FsspecDisk, LocalDisk
from cryptdisk.errors import AuthenticationError, DiskError, KeyNotFoundError, WrongKeyError

from .conftest import BUCKET

SECRET = b"TOP-SECRET-PLAINTEXT " * 5000


def test_backing_store_holds_only_ciphertext(tmp_path: Path) -> None:
    raw = LocalDisk("raw", tmp_path)
    disk = EncryptedDisk("e", raw, Keyring.generate(), prefix="p")
    disk.write_bytes("a/secret.txt", SECRET)
    stored = (tmp_path / "p" / "a" / "secret.txt").read_bytes()
    assert stored.startswith(b"CRYPTDSK") and b"TOP-SECRET" not in stored
    assert raw.list() == ["p/a/secret.txt"]
    assert disk.path == raw.path + "p/"


def test_s3_objects_are_ciphertext(s3_endpoint: str) -> None:
    import s3fs

    inner = FsspecDisk("s3", f"s3://{BUCKET}/enc-check", {"endpoint_url": s3_endpoint})
    disk = EncryptedDisk("e", inner, Keyring.generate())
    disk.write_bytes("x", SECRET)
    fs = s3fs.S3FileSystem(endpoint_url=s3_endpoint, skip_instance_cache=True)
    stored = fs.cat_file(f"{BUCKET}/enc-check/x")
    assert stored.startswith(b"CRYPTDSK") and b"TOP-SECRET" not in stored
    assert disk.read_bytes("x") == SECRET


@pytest.mark.parametrize("where", [200, 5000, -5])
def test_tampering_is_detected(tmp_path: Path, where: int) -> None:
    disk = EncryptedDisk("e", LocalDisk("raw", tmp_path), Keyring.generate(), segment_size=4096)
    disk.write_bytes("f", SECRET)
    path = tmp_path / "f"
    data = bytearray(path.read_bytes())
    data[where] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(AuthenticationError):
        disk.read_bytes("f")


def test_truncation_is_detected(tmp_path: Path) -> None:
    disk = EncryptedDisk("e", LocalDisk("raw", tmp_path), Keyring.generate(), segment_size=4096)
    disk.write_bytes("f", SECRET)
    path = tmp_path / "f"
    path.write_bytes(path.read_bytes()[: 128 + 2 * (4096 + 16)])
    with pytest.raises(AuthenticationError):
        disk.read_bytes("f")


def test_current_key_writes_and_old_keys_still_read(tmp_path: Path) -> None:
    k1, k2 = Key.generate(1), Key.generate(2)
    raw = LocalDisk("raw", tmp_path)
    EncryptedDisk("e", raw, Keyring([k1], 1)).write_bytes("old", b"under key 1")
    rotated = EncryptedDisk("e", raw, Keyring([k1, k2], 2))
    rotated.write_bytes("new", b"under key 2")
    assert rotated.info("old").key_id == 1 and rotated.info("new").key_id == 2
    assert rotated.read_bytes("old") == b"under key 1"
    only_new = EncryptedDisk("e", raw, Keyring([k2], 2))
    with pytest.raises(KeyNotFoundError) as info:
        only_new.read_bytes("old")
    assert "old" in str(info.value) and "id 1" in str(info.value)
    impostor = EncryptedDisk("e", raw, Keyring([Key.generate(1)], 1))
    with pytest.raises(WrongKeyError):
        impostor.read_bytes("old")


def test_algorithm_and_segment_size_apply(tmp_path: Path) -> None:
    disk = EncryptedDisk("e", LocalDisk("raw", tmp_path), Keyring.generate(),
                         algorithm="aes-128-gcm", segment_size=1024)
    disk.write_bytes("f", b"x" * 5000)
    with disk.open_read("f") as f:
        assert f.info["algorithm"] == "aes-128-gcm" and f.info["segment_size"] == 1024
    assert disk.info("f").algorithm == "aes-128-gcm"
    with pytest.raises(ValueError, match="power of two"):
        EncryptedDisk("e", LocalDisk("raw", tmp_path), Keyring.generate(), segment_size=1000)


@pytest.mark.parametrize("encrypted", [False, True])
@pytest.mark.parametrize("child_does", ["abort", "drop", "close"])
def test_a_forked_child_leaves_its_parents_file_being_written_alone(
        tmp_path: Path, encrypted: bool, child_does: str) -> None:
    """A child forked while a file is written (multiprocessing, Dask, a server's workers)
    that aborts, drops (the garbage collector aborts an unclosed writer) or closes its copy
    neither removes nor publishes the parent's temporary file: the parent still publishes
    what it wrote, whole."""
    import gc
    import os

    local = LocalDisk("l", tmp_path / "d")
    disk = EncryptedDisk("e", local, Keyring([Key.generate(1)])) if encrypted else local
    f = disk.open_write("f")
    f.write(b"a" * 10)
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            if child_does == "abort":
                f.abort()
            elif child_does == "drop":
                del f
                gc.collect()
            else:
                try:
                    f.close()
                    code = 3  # published the parent's half-written file
                except DiskError as exc:  # refused: the file is the parent's
                    code = 0 if "not published by a process it forked" in str(exc) else 4
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0
    assert not disk.exists("f")
    f.write(b"b" * 100_000)
    f.close()
    with disk.open_read("f") as back:
        assert back.read() == b"a" * 10 + b"b" * 100_000
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f"]

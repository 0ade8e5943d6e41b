"""The decrypted-segment cache: bounded, keyed by file id, same bytes as uncached reads."""

from __future__ import annotations

import random
from pathlib import Path

from cryptdisk import Keyring
from cryptdisk.disks import EncryptedDisk, LocalDisk
from cryptdisk.disks._cache import SegmentCache


def test_bound_and_lru() -> None:
    cache = SegmentCache(250)
    for i in range(5):
        cache.put((b"f", i), bytes(100))
    assert cache.size <= 250
    assert cache.get((b"f", 0)) is None and cache.get((b"f", 4)) is not None
    cache.put((b"big", 0), bytes(1000))  # larger than the whole cache: not kept
    assert cache.get((b"big", 0)) is None and cache.size <= 250


def test_cached_reads_match_and_rewrites_do_not_go_stale(tmp_path: Path) -> None:
    ring = Keyring.generate()
    disk = EncryptedDisk("e", LocalDisk("r", tmp_path), ring, segment_size=4096,
                         cache_bytes=64 * 4096)
    data = random.Random(1).randbytes(300_000)
    disk.write_bytes("f", data)
    rnd = random.Random(2)
    with disk.open_read("f") as f:
        for _ in range(300):
            off, n = rnd.randrange(len(data)), rnd.randrange(1, 60_000)
            assert f.pread(off, n) == data[off : off + n]
            buf = bytearray(n)
            got = f.preadinto(buf, off)
            assert bytes(buf[:got]) == data[off : off + n]
    assert disk.cache is not None and disk.cache.hits > 0
    assert disk.cache.size <= 64 * 4096
    disk.write_bytes("f", b"new content")  # new file id: old segments are never served
    assert disk.read_bytes("f") == b"new content"


def test_cache_can_be_turned_off(tmp_path: Path) -> None:
    disk = EncryptedDisk("e", LocalDisk("r", tmp_path), Keyring.generate(), cache_bytes=0)
    disk.write_bytes("f", b"x" * 100_000)
    assert disk.cache is None and disk.read_bytes("f") == b"x" * 100_000

"""The cache of decrypted reads: bounded, keyed by file id, same bytes as uncached reads."""

from __future__ import annotations

import random
from pathlib import Path

from cryptdisk import Keyring
from cryptdisk.disks import EncryptedDisk, LocalDisk
from cryptdisk.disks._cache import ReadCache


def test_bound_and_lru() -> None:
    cache = ReadCache(1300)  # three entries of 300 bytes plus overhead
    for i in range(5):
        cache.put((b"f", i, 300), bytes(300))
    assert cache.size <= 1300
    assert cache.get((b"f", 0, 300)) is None and cache.get((b"f", 4, 300)) is not None
    assert cache.get((b"f", 2, 300)) is not None  # now most recent
    cache.put((b"f", 5, 300), bytes(300))
    assert cache.get((b"f", 2, 300)) is not None and cache.get((b"f", 3, 300)) is None
    cache.put((b"big", 0, 5000), bytes(5000))  # larger than the whole cache: not kept
    assert cache.get((b"big", 0, 5000)) is None and cache.size <= 1300


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
    assert disk.cache is not None and disk.cache.size <= 64 * 4096
    with disk.open_read("f") as f:  # a repeated read is served from the cache, same object
        first = f.pread(1000, 50_000)
        hits = disk.cache.hits
        assert f.pread(1000, 50_000) is first and disk.cache.hits == hits + 1
    disk.write_bytes("f", b"new content")  # new file id: old segments are never served
    assert disk.read_bytes("f") == b"new content"


def test_cache_can_be_turned_off(tmp_path: Path) -> None:
    disk = EncryptedDisk("e", LocalDisk("r", tmp_path), Keyring.generate(), cache_bytes=0)
    disk.write_bytes("f", b"x" * 100_000)
    assert disk.cache is None and disk.read_bytes("f") == b"x" * 100_000

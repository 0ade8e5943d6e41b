"""A bounded cache of decrypted segments, so warm scans pay a copy and no AES.

DuckDB (and most engines reading through fsspec) re-reads a file on every
query. :class:`SegmentCache` keeps authenticated plaintext segments keyed by
``(file id, segment index)``; the file id is the random 16-byte id in the
file's authenticated header, so a rewritten file never hits stale entries.
Plaintext lives only in this process's memory (the threat model allows it;
it never reaches disk). Least recently used segments are evicted beyond
``max_bytes``.

:class:`CachedSealedReader` reads a sealed file through the cache: a read
joins slices of cached segments into one ``bytes`` (one copy); misses are
decrypted (in parallel for large reads) into fresh segment buffers.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..format import SealedReader

__all__ = ["CachedSealedReader", "SegmentCache"]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_PARALLEL_MIN = 4


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="cryptdisk-cache")
        return _POOL


class SegmentCache:
    """LRU of decrypted segments bounded by ``max_bytes`` (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("cache size must be >= 0")
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple[bytes, int], bytes | bytearray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[bytes, int]) -> bytes | bytearray | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: tuple[bytes, int], value: bytes | bytearray) -> None:
        if len(value) > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._data[key] = value
            self._bytes += len(value)
            while self._bytes > self.max_bytes:
                _k, dropped = self._data.popitem(last=False)
                self._bytes -= len(dropped)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    @property
    def size(self) -> int:
        return self._bytes

    def __repr__(self) -> str:
        return (f"<SegmentCache {self._bytes}/{self.max_bytes} bytes hits={self.hits} "
                f"misses={self.misses}>")


class CachedSealedReader:
    """A :class:`SealedReader` whose segments go through a :class:`SegmentCache`."""

    def __init__(self, reader: SealedReader, cache: SegmentCache) -> None:
        self._r = reader
        self._cache = cache
        self._file = reader.header.file_id
        self._seg = reader.segment_size
        self.size = reader.size

    def _segment(self, index: int) -> bytes | bytearray:
        key = (self._file, index)
        got = self._cache.get(key)
        if got is None:
            got = self._decrypt(index)
            self._cache.put(key, got)
        return got

    def _decrypt(self, index: int) -> bytearray:
        buf = bytearray(self._r._seg_plain_len(index))
        self._r._decrypt_into(index, memoryview(buf))
        return buf

    def _prefetch(self, first: int, last: int) -> None:
        """Decrypt the missing segments of a large read in parallel."""
        missing = [i for i in range(first, last + 1) if self._cache.get((self._file, i)) is None]
        if len(missing) < _PARALLEL_MIN:
            return
        half = len(missing) // 2
        future = _pool().submit(lambda: [(i, self._decrypt(i)) for i in missing[half:]])
        done = [(i, self._decrypt(i)) for i in missing[:half]] + future.result()
        for i, buf in done:
            self._cache.put((self._file, i), buf)

    def _parts(self, offset: int, n: int) -> list[Any]:
        seg = self._seg
        first, last = offset // seg, (offset + n - 1) // seg
        if last - first + 1 >= _PARALLEL_MIN:
            self._prefetch(first, last)
        parts = []
        for index in range(first, last + 1):
            start = index * seg
            data = self._segment(index)
            lo = max(offset, start) - start
            hi = min(offset + n, start + len(data)) - start
            parts.append(memoryview(data)[lo:hi])
        return parts

    def read_at(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        return b"".join(self._parts(offset, n))

    def readinto_at(self, buf: Any, offset: int) -> int:
        out = memoryview(buf).cast("B")
        n = max(0, min(len(out), self.size - offset))
        pos = 0
        for part in self._parts(offset, n) if n else []:
            out[pos : pos + len(part)] = part
            pos += len(part)
        return n

    def close(self) -> None:
        self._r.close()

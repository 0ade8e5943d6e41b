"""Reading sealed files fast: reused buffers, and a bounded cache of decrypted reads.

Measured with DuckDB through ``cryptdisk://`` (``cryptdisk.bench.fs_scan``):

- A fresh buffer per read costs a page fault per 4 KiB (large allocations come
  from new, zeroed pages), about seven times the AES work itself.
  :class:`BufferedSealedReader` decrypts into a reused per-thread buffer and
  copies once into the ``bytes`` it returns; it calls the format a few segments
  at a time, because the engine's own threads already give the parallelism and
  the format's thread pool would only add hand-offs between them.
- DuckDB re-reads a file on every query, with the same ranges (one per column
  chunk). :class:`ReadCache` keeps the ``bytes`` of recent reads, keyed by
  ``(file id, offset, length)``, so a repeated read returns the very object it
  returned before: no AES and no copy. The file id is the random id in the
  file's authenticated header, so a rewritten file never hits stale entries.
  Caching whole segments instead was tried: a warm read then still pays one
  copy to join the segments, and caching large blocks (to hand out slices)
  thrashes, since one column's chunks lie far apart in a Parquet file.

Plaintext lives only in this process's memory (the threat model allows it;
it never reaches disk). Least recently used reads are evicted beyond
``max_bytes``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ..format import SealedReader, pack_spans

__all__ = ["BufferedSealedReader", "CachedSealedReader", "ReadCache"]

_SERIAL_RUN = 4  # segments per call into SealedReader (below its parallel threshold)
_ENTRY_OVERHEAD = 128  # bytes charged per entry besides its data (key, links)


class ReadCache:
    """LRU of decrypted reads bounded by ``max_bytes`` (thread-safe)."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("cache size must be >= 0")
        self.max_bytes = max_bytes
        self._data: OrderedDict[tuple[bytes, int, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[bytes, int, int]) -> bytes | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: tuple[bytes, int, int], value: bytes) -> None:
        cost = len(value) + _ENTRY_OVERHEAD
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._bytes -= len(old) + _ENTRY_OVERHEAD
            self._data[key] = value
            self._bytes += cost
            while self._bytes > self.max_bytes:
                _k, dropped = self._data.popitem(last=False)
                self._bytes -= len(dropped) + _ENTRY_OVERHEAD

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._bytes = 0

    @property
    def size(self) -> int:
        """Bytes charged to the cache now (data plus a fixed overhead per entry)."""
        return self._bytes

    def __repr__(self) -> str:
        return (f"<ReadCache {self._bytes}/{self.max_bytes} bytes hits={self.hits} "
                f"misses={self.misses}>")


class BufferedSealedReader:
    """A :class:`SealedReader` whose ``read_at`` decrypts into a reused per-thread buffer."""

    def __init__(self, reader: SealedReader) -> None:
        self._r = reader
        self._local = threading.local()
        self.size = reader.size
        self.segment_size = reader.segment_size
        self.readinto_at = reader.readinto_at
        self.readinto_spans = reader.readinto_spans
        self.advise = reader.advise

    def read_at(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            buf = self._local.buf = bytearray(max(n, 1 << 20))
        view = memoryview(buf)[:n]
        step = self.segment_size * _SERIAL_RUN
        pos = 0
        while pos < n:
            end = min(n, (offset + pos) // step * step + step - offset)
            got = self._r.readinto_at(view[pos:end], offset + pos)
            if got == 0:
                break
            pos += got
        return bytes(view[:pos])

    def close(self) -> None:
        self._local = threading.local()
        self._r.close()


class CachedSealedReader(BufferedSealedReader):
    """A :class:`BufferedSealedReader` whose reads go through a :class:`ReadCache`."""

    def __init__(self, reader: SealedReader, cache: ReadCache) -> None:
        super().__init__(reader)
        self._cache = cache
        self._file = reader.header.file_id

    def read_at(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        key = (self._file, offset, n)
        data = self._cache.get(key)
        if data is None:
            data = super().read_at(offset, n)
            self._cache.put(key, data)
        return data

    def readinto_at(self, buf: Any, offset: int, **_options: Any) -> int:
        out = memoryview(buf).cast("B")
        data = self.read_at(offset, len(out))
        out[: len(data)] = data
        return len(data)

    def readinto_spans(self, buf: Any, offset: int, spans: list[tuple[int, int]]) -> int:
        """Through the cache: the range read as :meth:`readinto_at` reads it, then packed."""
        out = memoryview(buf).cast("B")
        if self.readinto_at(out, offset) != len(out):
            raise ValueError(f"[{offset}, {offset + len(out)}) is not inside the file")
        return pack_spans(out, offset, spans)

"""Reading parts: only the column chunks a query needs, decrypted in place, then decoded.

Plain parts on a local disk are memory-mapped and read by pyarrow natively.
Encrypted parts: the footer is decrypted first and checked against the
catalog (part id, rows, size); then only the needed column chunks are
decrypted into a reusable arena, in file order on a background thread, while
pyarrow decodes those already done (decoding one column is single-threaded
in pyarrow, so the second core does the AES-GCM). Every byte read from an
encrypted part has authenticated.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import json
import mmap
import operator
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

from ..disks import Disk
from ..errors import CatalogError, DiskFileNotFoundError, FormatError
from . import _lookup, _waits
from ._catalog import PartMeta
from ._fdlimit import out_of_files, too_many_open_files
from ._granule import (
    PageError,
    PageIndex,
    PageSpan,
    decode_chunk_pages,
    decode_one_width_chunk,
    decode_page_rows,
    decode_pages,
    granule_schema,
    leaf_schema,
    page_spans,
    plain_page_prefix,
    plain_page_problem,
    walked_all,
)
from ._parts import (
    NAN_KEY,
    PAGES_KEY,
    PART_ID_KEY,
    column_granules,
    key_bounds,
    key_granules,
    not_as_recorded,
)
from ._stats import key_range_of, min_max
from ._storage import local_path, open_read

__all__ = ["SPAN_MAX", "OpenPart", "open_part", "read_part"]

#: Row groups read together, their merged whole-segment ranges, and the start and end of
#: those ranges (see ``OpenPart._blocks``).
_Block = tuple[list[int], list[list[int]], int, int]


class _ReadOnlyFile:
    """What pyarrow asks of a Python file besides ``read``, ``seek`` and ``tell``: a
    seekable, read-only file whose ``close`` only marks it closed (the disk file under it
    belongs to the caller)."""

    closed = False

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


class _ZeroCopyFile(_ReadOnlyFile):
    """A read-only view of a disk file for pyarrow: reads fill fresh buffers, no extra copy."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.size = f.size

    def read(self, n: int = -1) -> Any:
        pos = self._f.tell()
        if n is None or n < 0:
            n = self.size - pos
        buf = bytearray(max(0, min(n, self.size - pos)))
        got = self._f.readinto(buf)
        return buf if got == len(buf) else buf[:got]

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._f.seek(offset, whence))

    def tell(self) -> int:
        return int(self._f.tell())


def _decrypt_range(f: Any, view: memoryview, offset: int) -> None:
    """Fill ``view`` with the plaintext at ``offset`` (in place; in parallel from 8 segments).

    Positional, so the background thread and pyarrow's thread may both read.
    """
    if hasattr(f, "preadinto"):
        got = f.preadinto(view, offset)
    else:  # the Disk contract promises pread; preadinto is a bonus
        data = f.pread(offset, len(view))
        view[: len(data)] = data
        got = len(data)
    if got != len(view):
        raise CatalogError(f"short read at offset {offset} of {getattr(f, 'name', 'a part')}")


def _read_exact(f: Any, offset: int, n: int) -> pa.Buffer:
    """``n`` bytes of ``f`` at ``offset``, decrypted straight into a buffer of that size
    (a disk file's ``pread`` first fills a 1 MiB buffer of the calling thread's: about
    0.6 ms the first time a thread reads, which a part's footer would pay), unzeroed:
    every byte is written, or the read raises."""
    out = pa.allocate_buffer(n)
    view = memoryview(out).cast("B")
    try:
        _decrypt_range(f, view, offset)
    finally:
        view.release()
    return out


def _merged(ranges: list[list[int]]) -> list[list[int]]:
    """``[start, end)`` ``ranges`` sorted, those that overlap or touch merged into one."""
    merged: list[list[int]] = []
    for a, b in sorted(ranges):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _chunk_start_end(col: Any) -> tuple[int, int]:
    """Where a column chunk's bytes are, as Arrow computes it (``ComputeColumnChunkRange``).

    The dictionary page, if any, comes first; anything Arrow would refuse is a
    ``FormatError`` here too.
    """
    start = col.data_page_offset
    dictionary = col.dictionary_page_offset
    if col.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
        start = dictionary
    length = col.total_compressed_size
    if start is None or length is None or start < 4 or length < 0:
        raise FormatError(f"a column chunk at offset {start} of length {length}")
    return int(start), int(start) + int(length)


def _copied_type(typ: pa.DataType) -> bool:
    """A flat type that pyarrow decodes by copying out of the page (never a view into it)."""
    t = pa.types
    return bool(t.is_integer(typ) or t.is_floating(typ) or t.is_boolean(typ)
                or t.is_string(typ) or t.is_large_string(typ) or t.is_binary(typ)
                or t.is_large_binary(typ) or t.is_fixed_size_binary(typ) or t.is_decimal(typ)
                or t.is_date(typ) or t.is_time(typ) or t.is_timestamp(typ)
                or t.is_duration(typ))


def _chunk_ranges(meta: pq.FileMetaData, columns: list[str] | None) -> list[tuple[int, int]]:
    """Byte ranges of the column chunks holding ``columns`` (all if None), in file order.

    Overlapping ranges are merged; adjacent ones stay apart, so each chunk is
    handed to pyarrow as soon as it has decrypted.
    """
    ranges = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            if columns is not None and col.path_in_schema.split(".")[0] not in columns:
                continue
            starts = [o for o in (col.dictionary_page_offset, col.data_page_offset)
                      if o is not None and o > 0]
            start = min(starts)
            ranges.append((start, start + col.total_compressed_size))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if merged and a < merged[-1][1]:  # overlapping; adjacent chunks stay apart
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


class _Arena:
    """One reusable, process-wide buffer the needed column chunks are decrypted into.

    Fresh memory costs page faults that cost more than AES-GCM itself (about
    0.6 ms per MB here against 0.15 ms to decrypt), so the compressed
    plaintext lands in memory that stays mapped between reads. It is safe to
    reuse because every chunk read through it is compressed: pyarrow
    decompresses into new buffers and never keeps a reference into it.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._map: mmap.mmap | None = None
        self._buffer: pa.Buffer | None = None

    def _grow(self, n: int) -> mmap.mmap:
        if self._map is None or len(self._map) < n:
            old, self._map, self._buffer = self._map, None, None
            if old is not None:
                with contextlib.suppress(BufferError):  # else it goes with its last view
                    old.close()
            size = max(n, _ARENA_MIN)
            self._map = _anonymous(size + (-size % (1 << 21)))
        return self._map

    def view(self, n: int) -> memoryview:
        return memoryview(self._grow(n))[:n]

    def mapped(self) -> int:
        return 0 if self._map is None else len(self._map)

    def buffer(self, n: int) -> tuple[memoryview, pa.Buffer]:
        """The first ``n`` bytes, writable, and the whole arena as a pyarrow buffer."""
        m = self._grow(n)
        if self._buffer is None:
            self._buffer = pa.py_buffer(m)
        return memoryview(m)[:n], self._buffer


def _anonymous(size: int) -> mmap.mmap:
    """Private anonymous memory of ``size`` bytes (a shared mapping is backed by shmem,
    whose first touch of each page costs about half as much again)."""
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    return mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)


_ARENA = _Arena()
#: How far apart (beyond twice their size) a read's column chunks may lie for the
#: arena to hold them at their file offsets (the gap is address space, touched only
#: by earlier reads of this thread).
_GAP_SLACK = 4 << 20
#: A read may span this much of the file whatever its chunks' share of it: a scan reads
#: a few consecutive row groups of one column at once (see ``_scan``), whose chunks lie
#: one row group apart.
SPAN_MAX = 12 << 20
#: An arena is mapped at the most a scan's reads take (only the pages touched cost
#: memory), so it is not mapped afresh (and faulted in again) when a read outgrows it.
_ARENA_MIN = SPAN_MAX + (2 << 20)
#: An idle arena is kept only up to this size (``_ARENA_MIN`` rounded as mapped).
_ARENA_KEEP = _ARENA_MIN + (-_ARENA_MIN % (1 << 21))
#: Blocks of a read start this far apart in the arena (see ``OpenPart._blocks``).
_ARENA_ALIGN = 4096
_COMPRESSED = {"LZ4", "LZ4_RAW", "SNAPPY", "ZSTD", "GZIP", "BROTLI"}


def _direct_table(arrays: list[list[pa.Array]], fields: list[pa.Field]) -> pa.Table:
    """The table of :meth:`OpenPart._read_direct`: each column's arrays as its chunks (a
    column of one array: that array, with no ``pa.chunked_array`` around it)."""
    return pa.Table.from_arrays(
        [a[0] if len(a) == 1 else pa.chunked_array(a, fld.type)
         for a, fld in zip(arrays, fields, strict=True)], schema=pa.schema(fields))


#: Types whose Parquet PLAIN values are their Arrow buffer (see ``OpenPart._read_direct``).
_FIXED = (pa.int64(), pa.int32(), pa.float64(), pa.float32())
#: Parquet's physical type id of BYTE_ARRAY (VARCHAR's)
_BYTE_ARRAY = 6
#: The encodings a chunk of such a REQUIRED column lists (RLE: its levels, none here).
_PLAIN_ONLY = {"PLAIN", "RLE"}
#: The longest page header taken for one (pyarrow's, with statistics, are under 100 bytes).
_HEADER_MAX = 1024
#: iovecs per ``preadv`` (Linux's IOV_MAX)
_IOV_MAX = 1024
#: A column chunk is read by granule only if it stores at least this many bytes a value
#: (strings, mostly): a chunk of 8-byte numbers decodes whole (a copy) in less time than
#: finding its pages takes, and on an encrypted disk its pages are about a segment each,
#: so walking their headers decrypts the whole chunk anyway.
_GRANULE_MIN_BYTES = 16


class _Decrypting:
    """The needed column chunks of a sealed part, decrypted in file order on another thread.

    pyarrow decodes a column on one thread, so the other core decrypts chunk
    ``k+1`` while chunk ``k`` is decoded, and no further ahead, so pyarrow
    reads plaintext still in the CPU's cache. The first chunk, with nothing
    to overlap, is decrypted on both cores. A chunk becomes readable only once
    every segment of it has authenticated (the format checks each segment
    before writing its plaintext out); a chunk that fails stays unreadable and
    its reader gets the error. :meth:`close` stops and joins the thread before
    the arena may be reused.
    """

    def __init__(self, f: Any, ranges: list[tuple[int, int, int]], arena: memoryview) -> None:
        self._f, self._ranges, self._arena = f, ranges, arena
        self._ready = [threading.Event() for _ in ranges]
        self._ok = [False] * len(ranges)
        self.error: BaseException | None = None
        self._stop = False
        self._wanted = 0  # the highest range a reader has asked for
        self._demand = threading.Condition()
        self._step = int(getattr(f, "info", {}).get("segment_size", 1 << 16)) * _SERIAL_SEGMENTS
        if ranges:  # nothing to decode yet: the first chunk gets both cores (format's pool)
            a, b, off = ranges[0]
            _decrypt_range(f, arena[off : off + b - a], a)
            self._ok[0] = True
            self._ready[0].set()
        self._done = _worker().submit(self._run)

    def _run(self) -> None:
        try:
            for i, (a, b, off) in enumerate(self._ranges[1:], 1):
                with self._demand:  # stay at most _LEAD ranges ahead of the reader
                    while not self._stop and self._wanted < i - _LEAD:
                        self._demand.wait()
                if self._stop:
                    return
                _decrypt_serial(self._f, self._arena[off : off + b - a], a, self._step)
                self._ok[i] = True
                self._ready[i].set()
        except BaseException as exc:  # handed to the reader that waits for this range
            self.error = exc
        finally:
            for event in self._ready:
                event.set()

    def wait(self, first: int, last: int) -> None:
        """Block until ranges ``first..last`` have decrypted; raise if one failed."""
        if last > self._wanted:
            with self._demand:
                self._wanted = max(self._wanted, last)
                self._demand.notify()
        for i in range(first, last + 1):
            _waits.wait(self._ready[i])  # (short waits: a Ctrl-C raises meanwhile)
            if not self._ok[i]:
                raise self.error or CatalogError("reading a part was cancelled")

    def close(self) -> None:
        with self._demand:
            self._stop = True
            self._demand.notify()
        self._done.result()


def _decrypt_serial(f: Any, view: memoryview, offset: int, step: int) -> None:
    """Decrypt ``view`` a few segments per call: one core, leaving the other to pyarrow."""
    pos = 0
    while pos < len(view):
        end = min(len(view), (offset + pos) // step * step + step - offset)
        _decrypt_range(f, view[pos:end], offset + pos)
        pos = end


#: Ranges decrypted ahead of the reader: one keeps the fresh plaintext in the L3
#: cache for pyarrow (measured: no limit is 5-10% slower on 8 MiB chunks).
_LEAD = 1
_SERIAL_SEGMENTS = 4  # below the format's parallel threshold (8 segments)
_WORKER: ThreadPoolExecutor | None = None
_WORKER_LOCK = threading.Lock()


def _worker() -> ThreadPoolExecutor:
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cryptdisk-partread")
        return _WORKER


def _forget_worker() -> None:
    """A forked child has no worker thread: it starts its own when it first reads a part."""
    global _WORKER, _WORKER_LOCK
    _WORKER, _WORKER_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_worker)


class _CompactFile(_ReadOnlyFile):
    """A read-only file for pyarrow: prepared ranges come from the arena, others are decrypted.

    ``ranges`` are ``(start, end, arena_offset)``, sorted and disjoint; adjacent
    ranges are adjacent in the arena too. A read covered by consecutive ranges
    is a zero-copy view of the arena (after ``pending`` has decrypted them, if
    given); anything else (never expected) is decrypted from the sealed file
    into a fresh buffer, so a read is always correct.
    """

    def __init__(self, f: Any, size: int, ranges: list[tuple[int, int, int]],
                 arena: memoryview, pending: _Decrypting | None = None) -> None:
        self._f, self.size, self._ranges, self._arena = f, size, ranges, arena
        self._starts = [a for a, _b, _o in ranges]
        self._pending = pending
        self._pos = 0

    def _covering(self, pos: int, n: int) -> tuple[int, int] | None:
        """Indexes of the first and last ranges covering ``[pos, pos+n)`` without a gap."""
        first = bisect.bisect_right(self._starts, pos) - 1
        if first < 0 or pos >= self._ranges[first][1]:
            return None
        last = first
        while self._ranges[last][1] < pos + n:
            if last + 1 == len(self._ranges) or \
                    self._ranges[last + 1][0] != self._ranges[last][1]:
                return None
            last += 1
        return first, last

    def read(self, n: int = -1) -> Any:
        pos = self._pos
        n = self.size - pos if n is None or n < 0 else max(0, min(n, self.size - pos))
        self._pos += n
        found = self._covering(pos, n) if n else None
        if found is not None:
            if self._pending is not None:
                self._pending.wait(*found)
            a, _b, off = self._ranges[found[0]]
            return self._arena[off + pos - a : off + pos - a + n]
        buf = bytearray(n)
        _decrypt_range(self._f, memoryview(buf), pos)
        return buf

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else (self._pos + offset if whence == 1
                                                else self.size + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


def _read_footer(disk: Disk, part: PartMeta, f: Any) -> tuple[int, pq.FileMetaData]:
    """``(size, footer metadata)`` of the part open as ``f`` on an encrypted disk: the
    footer is decrypted straight into a buffer of its size (:func:`_read_exact`)."""
    size = int(f.size)
    if size < 12 or size != part.bytes:
        _check_identity(disk, part, None, size)
    tail = _read_exact(f, size - 8, 8).to_pybytes()
    footer = int.from_bytes(tail[:4], "little") + 8
    if tail[4:] != b"PAR1" or footer > size - 4:
        raise CatalogError(f"part {part.path} on disk {disk.name!r} is not a Parquet file")
    return size, pq.read_metadata(pa.BufferReader(_read_exact(f, size - footer, footer)))


def _read_encrypted(disk: Disk, part: PartMeta, columns: list[str] | None) -> pa.Table:
    """Decrypt the footer, then the needed column chunks in place while pyarrow decodes."""
    with open_read(disk, part.path) as f:
        size, meta = _read_footer(disk, part, f)
        _check_identity(disk, part, meta, size)
        chunks = _chunk_ranges(meta, columns)
        if not all(c in _COMPRESSED for c in _codecs(meta, columns)):
            pf = pq.ParquetFile(_ZeroCopyFile(f), metadata=meta, pre_buffer=True)
            return pf.read(columns=columns, use_threads=True)
        with _ARENA.lock:
            arena = _ARENA.view(sum(b - a for a, b in chunks))
            ranges, off = [], 0
            for a, b in chunks:
                ranges.append((a, b, off))
                off += b - a
            pending: _Decrypting | None = None
            try:
                pending = _Decrypting(f, ranges, arena)
                pf = pq.ParquetFile(_CompactFile(f, size, ranges, arena, pending), metadata=meta)
                return pf.read(columns=columns, use_threads=True)
            except Exception:
                if pending is not None:
                    pending.close()
                    if pending.error is not None:  # pyarrow may wrap it: raise the real one
                        raise pending.error from None
                raise
            finally:
                if pending is not None:
                    pending.close()
                arena.release()


def _codecs(meta: pq.FileMetaData, columns: list[str] | None) -> set[str]:
    out = set()
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            if columns is None or col.path_in_schema.split(".")[0] in columns:
                out.add(str(col.compression).upper())
    return out


def _check_identity(disk: Disk, part: PartMeta, meta: pq.FileMetaData | None,
                    size: int, kv: dict[bytes, bytes] | None = None,
                    lookup: _lookup.Lookup | None = None) -> None:
    """Raise unless ``meta`` (``kv``: its key-value metadata, if read already), or the
    part's ``lookup`` block, is of the part the catalog recorded: its part id, its rows,
    the file's size."""
    if kv is None and meta is not None:
        kv = meta.metadata or {}
    found = kv.get(PART_ID_KEY) if kv is not None else None
    rows = lookup.rows if lookup is not None else meta.num_rows if meta is not None else None
    if (found != part.id.encode() or rows != part.rows or size != part.bytes):
        raise CatalogError(
            f"part {part.path} on disk {disk.name!r} is not the part the catalog "
            "recorded (replaced, rolled back or truncated)",
            hint="restore the part from a backup, or drop the table",
        )


def _read_lookup(disk: Disk, part: PartMeta, read: Callable[[int, int], Any], size: int
                 ) -> tuple[int, _lookup.Lookup | None]:
    """``(footer length, lookup block)`` of the part of ``size`` bytes that
    ``read(offset, n)`` reads: the footer's length (with its last 8 bytes) from the
    file's tail, and the lookup block before it (:mod:`._lookup`), or None if there is
    none or it does not fit the file (the footer is then parsed instead)."""
    if disk.is_encrypted and (size < 12 or size != part.bytes):
        _check_identity(disk, part, None, size)
    tail = bytes(read(size - 8, 8)) if size >= 12 else b""
    footer = int.from_bytes(tail[:4], "little") + 8
    if len(tail) != 8 or tail[4:] != b"PAR1" or footer > size - 4:
        if not disk.is_encrypted:  # (as pyarrow's reader would find it: not as recorded)
            raise FormatError("not a Parquet file")
        raise CatalogError(f"part {part.path} on disk {disk.name!r} is not a Parquet file")
    if size != part.bytes:
        _check_identity(disk, part, None, size)
    at = size - footer - _lookup.TRAILER  # where the block's trailer would start
    if at < 8:
        return footer, None
    trailer = bytes(read(at, _lookup.TRAILER))
    if trailer[4:] != _lookup.MAGIC:
        return footer, None
    n = int.from_bytes(trailer[:4], "little")
    if n > at - 4:
        return footer, None
    return footer, _lookup.parse(read(at - n, n), at - n)


def _open_parquet(disk: Disk, part: PartMeta, columns: list[str] | None
                  ) -> tuple[pq.ParquetFile, Any, int]:
    lp = local_path(disk, part.path)
    try:
        if lp is not None:
            src = pa.OSFile(lp)  # (read, not mapped: mapped pages stayed in RSS)
            pf = pq.ParquetFile(src)
            _check_identity(disk, part, pf.metadata, src.size())
            return pf, src, src.size()
        f = open_read(disk, part.path)
    except (FileNotFoundError, DiskFileNotFoundError):
        raise CatalogError(f"part {part.path} of the catalog is missing on disk {disk.name!r}",
                           hint="restore the disk from a backup") from None
    size = f.size
    pf = pq.ParquetFile(_ZeroCopyFile(f), pre_buffer=True)
    _check_identity(disk, part, pf.metadata, size)
    return pf, f, size


def read_part(disk: Disk, part: PartMeta, columns: list[str] | None) -> pa.Table:
    """The part's rows (only ``columns`` if given), after checking it is the catalog's part.

    A file that is not what the catalog recorded (plain where it was encrypted,
    not Parquet) raises :class:`~cryptdisk.errors.CatalogError`, never pyarrow's errors.
    """
    try:
        return _read_part(disk, part, columns)
    except MemoryError:
        raise
    except (pa.ArrowException, FormatError) as exc:
        raise not_as_recorded(disk, part, exc) from None
    except OSError as exc:
        if out_of_files(exc):
            raise too_many_open_files(f"reading part {part.path} on disk {disk.name!r}",
                                      exc) from None
        raise


def _read_part(disk: Disk, part: PartMeta, columns: list[str] | None) -> pa.Table:
    if disk.is_encrypted:
        try:
            return _read_encrypted(disk, part, columns)
        except (FileNotFoundError, DiskFileNotFoundError):
            raise CatalogError(f"part {part.path} of the catalog is missing on disk "
                               f"{disk.name!r}", hint="restore the disk from a backup") from None
    pf, handle, _size = _open_parquet(disk, part, columns)
    try:
        return pf.read(columns=columns, use_threads=True)
    finally:
        if handle is not None:
            handle.close()


def _read_row_groups(source: Any, meta: pq.FileMetaData, row_groups: list[int],
                     indices: list[int]) -> pa.Table:
    """``row_groups`` of the Parquet file ``source`` (footer ``meta``), leaf columns
    ``indices``, on this thread: what ``ParquetFile(source, metadata=meta)
    .read_row_groups(...)`` does, without rebuilding its Python-side schema maps on every
    call (a scan reads each row group with a reader of its own)."""
    reader = ParquetReader()
    reader.open(source, metadata=meta, pre_buffer=False, arrow_extensions_enabled=True)
    return reader.read_row_groups(row_groups, column_indices=indices, use_threads=False)


#: Every arena alive, idle or in use (tests scribble over them); weak, so a dropped one
#: is unmapped.
_ARENAS: weakref.WeakSet[_Arena] = weakref.WeakSet()
#: Arenas no read is using, the last given back last: any thread's next read takes one
#: (warm pages) instead of faulting in fresh memory. Not one per thread: the threads that
#: read parts come and go (a statement's insert-source thread, the server's sessions,
#: DuckDB's threads calling back into Python, each call a new thread state): an arena of
#: each kept for the process's life grows its memory without bound, and one freed with
#: its thread state crashes CPython 3.11 (a segfault in PyGILState_Release as a DuckDB
#: thread's call into Python returns).
_IDLE: list[_Arena] = []
#: At most this many arenas are kept idle (as many as reads at once on every core, and
#: a few more); an arena grown past ``_ARENA_MIN`` by a large read is not kept either.
_IDLE_MAX = 2 * (os.cpu_count() or 1) + 2


def _take_arena() -> _Arena:
    """An idle arena, or a new one; hand it back with :func:`_give_back` once nothing
    refers to its memory."""
    try:
        return _IDLE.pop()
    except IndexError:
        arena = _Arena()
        _ARENAS.add(arena)
        return arena


def _give_back(arena: _Arena) -> None:
    if len(_IDLE) < _IDLE_MAX and arena.mapped() <= _ARENA_KEEP:
        _IDLE.append(arena)


class OpenPart:
    """A part whose footer has been read and checked against the catalog, read by row group.

    :meth:`read` may be called from several threads at once: every read is
    positional, and each call builds its own reader over the shared footer.
    On an encrypted disk, only the segments holding the column chunks of the
    requested row groups and columns are decrypted (each authenticating first),
    into the calling thread's reusable arena at their offsets in the file, and
    pyarrow decodes them from there as memory (a Python file object would cost
    a call into Python, under the GIL, for every read it makes).
    """

    def __init__(self, disk: Disk, part: PartMeta) -> None:
        self.disk, self.part = disk, part
        self._handle: Any = None
        self._local: str | None = None
        self._meta: pq.FileMetaData | None = None
        self._meta_lock = threading.Lock()
        info: Any = None
        try:
            if disk.is_encrypted:
                f = self._handle = open_read(disk, part.path)
                size = int(f.size)
                info = getattr(f, "info", None)
                seg = int(info.get("segment_size", 1)) if isinstance(info, dict) else 1
                read: Callable[[int, int], Any] = _SegmentReader(f, size, seg)
            else:
                lp = local_path(disk, part.path)
                if lp is not None:
                    self._local = lp
                    # read with pread, not mapped: a scan's pages of a mapped plain
                    # part stayed in the process's RSS, growing with the table
                    self._handle = pa.OSFile(lp)
                    size = self._handle.size()
                else:
                    with open_read(disk, part.path) as f:
                        size = int(f.size)
                read = self._plain_reader()
            self.size = size
            # the lookup block before the footer (new parts), else the whole footer
            self._footer, self._lookup = _read_lookup(disk, part, read, size)
            if self._lookup is None:
                self._meta = self._read_meta(read)
            if isinstance(read, _SegmentReader):
                read.release()
        except (FileNotFoundError, DiskFileNotFoundError):
            self.close()
            raise CatalogError(f"part {part.path} of the catalog is missing on disk "
                               f"{disk.name!r}", hint="restore the disk from a backup") from None
        except BaseException:
            self.close()
            raise
        lookup = self._lookup
        if lookup is not None:
            self._kv: dict[bytes, bytes] = lookup.kv
            self._num_rows = lookup.rows
            self.num_row_groups = len(lookup.groups)
            self._num_leaves = len(lookup.leaves)
            paths = [leaf[1] for leaf in lookup.leaves]
            created_by = lookup.created_by
        else:
            meta = self.meta
            #: the footer's key-value metadata (pyarrow builds a new dict, copying every
            #: value, on each ``meta.metadata``: read once, for the identity check and the
            #: index)
            self._kv = dict(meta.metadata or {})
            self._num_rows = meta.num_rows
            self.num_row_groups = meta.num_row_groups
            self._num_leaves = meta.num_columns
            paths = [meta.schema.column(j).path for j in range(meta.num_columns)]
            created_by = str(meta.created_by or "")
        try:
            _check_identity(disk, part, self._meta, size, self._kv, lookup)
        except BaseException:
            self.close()
            raise
        self.key_checked = False  # the catalog's key range matched the footer's
        self._chunk: dict[tuple[int, int], tuple[int, int, bool]] = {}
        self._arrow: pa.Schema | None = None
        self._segment = int(info.get("segment_size", 1)) if isinstance(info, dict) else 1
        # cryptdisk's own sealed format: reads take hints and run on the calling thread
        self._sealed = (isinstance(info, dict) and info.get("format") == "cryptdisk"
                        and hasattr(self._handle, "advise"))
        # Arrow pads the chunk ranges of parquet-mr 1.2.8's files; cryptdisk's are pyarrow's
        self._native = self._segment > 0 and created_by.startswith("parquet-cpp")
        self._ranges: dict[str, list[tuple[Any, Any] | None] | None] = {}
        self._all_null: dict[str, set[int]] = {}  # row groups whose column is all NULL
        self._bounded: set[str] = set()  # columns whose ranges came from KEY_BOUNDS_KEY
        self._nulls: dict[str, list[int | None]] = {}  # each row group's null count
        self._sorted: dict[str, tuple[list[Any], list[Any]] | None] = {}
        self._null_free: dict[str, tuple[list[int], list[int]]] = {}
        self._nans: dict[str, set[int]] | None = None
        self._leaves: dict[str, list[int]] = {}  # a nested column has several leaf chunks
        for j, path in enumerate(paths):
            self._leaves.setdefault(path.split(".")[0], []).append(j)
        # statistics only for plain (one-leaf) columns
        self._index = {c: js[0] for c, js in self._leaves.items() if len(js) == 1}
        self._pages: dict[tuple[int, int], list[PageSpan] | None] = {}
        self._described: dict[int, Any] = {}  # leaf -> granule_schema (see described)
        #: VARCHAR leaves a chunk of which held strings of several lengths (see
        #: _read_strings): read through pyarrow
        self._varying: set[int] = set()
        #: (row group, columns) whose ciphertext :meth:`prefetch` asked the OS for and no
        #: read has used yet: that read gives no second hint
        self._advised: set[tuple[int, tuple[str, ...]]] = set()
        self._page_index: PageIndex | bool | None = False  # read from the footer when needed
        #: column -> (granule rows, each row group's rows, minima, maxima, each row group's
        #: first granule)
        self._granules: dict[str, tuple[int, list[int], Sequence[int], Sequence[int],
                                        list[int]] | None] = {}
        #: held while a column's granules are decoded: scan threads that open the part at
        #: once decode them once (the others wait, then find them)
        self._granules_lock = threading.Lock()
        #: row group -> its key column being read ahead of a statement (see OpenParts)
        self.key_reads: dict[int, Any] = {}
        #: column -> its granules' bounds (see :meth:`column_granules`), decoded once
        self._column_granules: dict[str, tuple[list[int], Any, Any, Any, Any, Any, Any]
                                    | None] = {}

    @property
    def meta(self) -> pq.FileMetaData:
        """The part's Parquet footer, parsed on first use when the part was opened by its
        lookup block (:mod:`._lookup`): a query on the key needs none of it."""
        if self._meta is None:
            with self._meta_lock:
                if self._meta is None:
                    self._meta = self._load_meta()
        return self._meta

    @meta.setter
    def meta(self, value: pq.FileMetaData) -> None:
        self._meta = value

    def _load_meta(self) -> pq.FileMetaData:
        try:
            if self.disk.is_encrypted:
                if self._handle is None:
                    raise CatalogError(f"part {self.part.path} was closed")
                reader = _SegmentReader(self._handle, self.size, self._segment)
                meta = self._read_meta(reader)
                reader.release()
            else:
                meta = self._read_meta(self._plain_reader())
            _check_identity(self.disk, self.part, meta, self.size)
        except MemoryError:
            raise
        except (pa.ArrowException, FormatError) as exc:
            raise not_as_recorded(self.disk, self.part, exc) from None
        return meta

    def _read_meta(self, read: Callable[[int, int], Any]) -> pq.FileMetaData:
        """The footer parsed by pyarrow (:meth:`meta`), read through ``read``."""
        footer = self._footer
        raw = read(self.size - footer, footer)
        if len(raw) != footer:
            raise CatalogError(f"part {self.part.path} on disk {self.disk.name!r} is "
                               "not a Parquet file")
        return pq.read_metadata(pa.BufferReader(pa.py_buffer(raw)))

    @property
    def kv(self) -> dict[bytes, bytes]:
        """The footer's key-value metadata (cryptdisk's entries)."""
        return self._kv

    def ranges(self, column: str) -> list[tuple[Any, Any] | None] | None:
        """Per row group, ``(min, max)`` of ``column`` (NaN left out) or None; None if no column.

        Read from the footer once per open part (a point query on a part opened
        earlier pays nothing here): a signed integer key's from the bounds written for it
        (:data:`~._parts.KEY_BOUNDS_KEY`), other columns' from their statistics.
        """
        got = self._ranges.get(column)
        if got is None and column not in self._ranges:
            j = self._index.get(column)
            if j is not None:  # a key's bounds written for it, else the statistics
                got = key_bounds(self.kv, column, self.num_row_groups)
                self._all_null[column] = set()
                if got is not None:  # integers, every row group's: key_range needs no checks
                    self._bounded.add(column)
            if j is not None and got is None:
                got = []
                nulls = self._all_null[column] = set()
                for i in range(self.num_row_groups):
                    rg = self.meta.row_group(i)
                    st = rg.column(j).statistics
                    found = min_max(st) if st is not None and st.has_min_max else None
                    if found is not None:
                        got.append(found)
                        continue
                    got.append(None)
                    if st is not None and st.null_count == rg.num_rows:
                        nulls.add(i)
            self._ranges[column] = got
        return got

    def key_range(self, column: str) -> tuple[Any, Any] | None:
        """The part's (min, max) of ``column`` as :func:`~._stats.key_range_of` computes it,
        from the statistics :meth:`ranges` read (one pass over the footer per column)."""
        found = self.ranges(column)
        if found is None:
            return key_range_of(self.meta, column)  # not a plain one-leaf column
        if column in self._bounded:  # (mapped, not a generator: a cold open's hot loop)
            return (min(map(operator.itemgetter(0), found)),  # type: ignore[arg-type]
                    max(map(operator.itemgetter(1), found)))  # type: ignore[arg-type]
        lo = hi = None
        nulls = self._all_null.get(column, set())
        for i, r in enumerate(found):
            if r is None:
                if i in nulls:
                    continue
                return None
            a, b = r
            if not all(isinstance(v, int | float | str) and not isinstance(v, bool)
                       for v in (a, b)):
                return None
            lo = a if lo is None or a < lo else lo
            hi = b if hi is None or b > hi else hi
        return None if lo is None else (lo, hi)

    def null_free_bounds(self, column: str) -> tuple[list[int], list[int]] | None:
        """Per row group, the minima and maxima of ``column`` when they come from the
        bounds written for a signed integer key without NULL (:data:`~._parts.KEY_BOUNDS_KEY`:
        every row group has them, and no row is NULL); None otherwise."""
        found = self.ranges(column)
        if found is None or column not in self._bounded:
            return None
        got = self._null_free.get(column)
        if got is None:
            got = self._null_free[column] = (
                list(map(operator.itemgetter(0), found)),  # type: ignore[arg-type]
                list(map(operator.itemgetter(1), found)))  # type: ignore[arg-type]
        return got

    def sorted_bounds(self, column: str) -> tuple[list[Any], list[Any]] | None:
        """Per row group, the minima and maxima of ``column``, if every row group has them
        and each row group's maximum is at most the next one's minimum (a part sorted by
        ``column``, such as by its ORDER BY key): both lists ascend, so the row groups a
        range can match are found by bisection. None otherwise."""
        if column in self._sorted:
            return self._sorted[column]
        found = self.ranges(column)
        got: tuple[list[Any], list[Any]] | None = None
        if found is not None and None not in found:
            mins = list(map(operator.itemgetter(0), found))  # type: ignore[arg-type]
            maxs = list(map(operator.itemgetter(1), found))  # type: ignore[arg-type]
            # min0 <= max0 <= min1 <= max1 ...: each pair compared once, in C
            edges = list(itertools.chain.from_iterable(found))  # type: ignore[arg-type]
            try:
                ordered = all(map(operator.le, edges, itertools.islice(edges, 1, None)))
            except TypeError:  # statistics of mixed or unexpected types
                ordered = False
            got = (mins, maxs) if ordered else None
        self._sorted[column] = got
        return got

    def granule_rows(self, rg: int, column: str, keep: Callable[[int, int], bool]
                     ) -> tuple[int, int] | None:
        """``(first, end)``: the rows of row group ``rg`` from the first to the last granule
        whose minimum and maximum of ``column`` (from the footer's
        :data:`~._parts.KEY_GRANULES_KEY`) ``keep(min, max)`` says may hold a wanted
        value; ``(0, 0)`` if none may; None if the part has no such bounds of ``column``."""
        got = self._granule_bounds(rg, column)
        if got is None:
            return None
        g, _groups, mins, maxs, firsts = got
        hits = [k for k in range(firsts[rg], firsts[rg + 1]) if keep(mins[k], maxs[k])]
        if not hits:
            return (0, 0)
        return ((hits[0] - firsts[rg]) * g,
                min(self.rows(rg), (hits[-1] - firsts[rg] + 1) * g))

    def granules(self, rg: int, column: str) -> list[tuple[int, int, int, int]] | None:
        """Row group ``rg``'s granules of ``column`` in row order, each ``(first row, end
        row, minimum, maximum)`` (every row's value within them: the bounds are written
        only for a key without NULL), from the footer's :data:`~._parts.KEY_GRANULES_KEY`;
        None if the part has no such bounds of ``column``."""
        got = self._granule_bounds(rg, column)
        if got is None:
            return None
        g, _groups, mins, maxs, firsts = got
        rows = self.rows(rg)
        return [((k - firsts[rg]) * g, min(rows, (k - firsts[rg] + 1) * g), mins[k], maxs[k])
                for k in range(firsts[rg], firsts[rg + 1])]

    def _granule_bounds(self, rg: int, column: str
                        ) -> tuple[int, list[int], Sequence[int], Sequence[int], list[int]] | None:
        try:  # (no lock once decoded: a dict read is atomic)
            got = self._granules[column]
        except KeyError:
            got = self._decode_granules(column)
        if got is None:
            return None
        if got[1][rg] != self.rows(rg):  # not this part's row groups: not used
            self._granules[column] = None
            return None
        return got

    def _decode_granules(self, column: str
                         ) -> tuple[int, list[int], Sequence[int], Sequence[int], list[int]] | None:
        """Decode ``column``'s granules from the footer into ``_granules``, once per part."""
        with self._granules_lock:
            if column in self._granules:  # another thread decoded them meanwhile
                return self._granules[column]
            found = key_granules(self.kv, column, self.num_row_groups,
                                 self._num_rows)
            got = None
            if found is not None:
                g, groups, mins, maxs = found
                firsts = [0]
                for r in groups:
                    firsts.append(firsts[-1] - (-r // g))
                got = (g, groups, mins, maxs, firsts)
            self._granules[column] = got
            return got

    def column_granules(self, column: str) -> tuple[list[int], Any, Any, Any, Any, Any, Any] | None:
        """``column``'s granule bounds (see :data:`~._parts.COLUMN_GRANULES_KEY`), from the
        part's authenticated footer (or its lookup block), as ``(starts, row groups,
        first rows, end rows, minima, maxima, facts)``: NumPy arrays with one entry per
        granule in row order (``starts[rg]``: the index of row group ``rg``'s first one),
        the bounds without NaN and NULL, the facts saying whether the granule holds a
        NULL, a NaN or no number. None if the part has no such bounds of ``column``."""
        try:  # (no lock: decoding twice gives the same arrays)
            return self._column_granules[column]
        except KeyError:
            pass
        found = column_granules(self.kv, column, self.num_row_groups, self._num_rows)
        got = None
        if found is not None:
            import numpy as np

            g, groups, mins, maxs, facts = found
            if groups != [self.rows(rg) for rg in range(self.num_row_groups)]:
                self._column_granules[column] = None  # not this part's row groups
                return None
            sizes = np.array(groups, dtype=np.int64)
            counts = -(-sizes // g)
            starts = np.concatenate([[0], np.cumsum(counts)])
            rgs = np.repeat(np.arange(len(groups), dtype=np.int64), counts)
            first = (np.arange(int(starts[-1]), dtype=np.int64) - starts[:-1][rgs]) * g
            end = np.minimum(first + g, sizes[rgs])
            got = (starts.tolist(), rgs, first, end, mins, maxs, facts)
        self._column_granules[column] = got
        return got

    def nan_free(self, rg: int, column: str) -> bool:
        """Whether the footer proves row group ``rg`` of floating ``column`` holds no NaN."""
        if self._nans is None:
            self._nans = {}
            raw = self.kv.get(NAN_KEY)
            if raw is not None:
                try:
                    doc = json.loads(raw)
                    if doc.get("row_groups") == self.num_row_groups:
                        self._nans = {c: set(v) for c, v in doc["nan"].items()}
                except (ValueError, TypeError, KeyError, AttributeError):
                    self._nans = {}
        found = self._nans.get(column)
        return found is not None and rg not in found

    def nulls(self, rg: int, column: str) -> int | None:
        """Null count of ``column`` in row group ``rg``, if its statistics say (0 for a key
        with bounds written for it, and for a column the part stores as Parquet REQUIRED,
        which hold no NULL, statistics or not; read once per open part: pyarrow builds a
        statistics object on each access)."""
        got = self._nulls.get(column)
        if got is None:
            j = self._index.get(column)
            if j is None:
                return None
            if (self.ranges(column) is not None and column in self._bounded) or \
                    self.meta.schema.column(j).max_definition_level == 0:
                got = [0] * self.num_row_groups
            else:
                got = []
                for i in range(self.num_row_groups):
                    st = self.meta.row_group(i).column(j).statistics
                    got.append(None if st is None or not st.has_null_count
                               else int(st.null_count))
            self._nulls[column] = got
        return got[rg]

    def stats(self, rg: int, column: str) -> tuple[Any, Any] | None:
        """``(min, max)`` of ``column`` in row group ``rg`` (NaN left out), or None."""
        found = self.ranges(column)
        return None if found is None else found[rg]

    def rows(self, rg: int) -> int:
        if self._lookup is not None:
            return self._lookup.groups[rg]
        return int(self.meta.row_group(rg).num_rows)

    def read(self, row_groups: list[int], columns: list[str], joined: bool = False
             ) -> pa.Table:
        """Rows of ``row_groups`` (consecutive or not), only ``columns``. ``joined``: a
        column stored as its values (see :meth:`_read_direct`) comes as one array over
        one buffer for all the row groups, not one per row group."""
        try:
            return self._read(row_groups, columns, joined)
        except MemoryError:
            raise
        except (pa.ArrowException, FormatError) as exc:
            raise not_as_recorded(self.disk, self.part, exc) from None
        except (OSError, CatalogError):  # (pyarrow's "File too short", a short read)
            self._check_size()
            raise

    def _check_size(self) -> None:
        """Raise the part's :class:`~cryptdisk.errors.CatalogError` if its plain file is
        now shorter than when it was opened: another process truncated it under the read
        (an encrypted part's read raises its ``TruncatedFileError`` itself)."""
        handle = self._handle
        if self._local is None or handle is None:
            return
        try:
            now = os.fstat(handle.fileno()).st_size
        except (OSError, ValueError):
            return
        if now < self.size:
            raise CatalogError(
                f"part {self.part.path} on disk {self.disk.name!r} was cut short to {now} "
                f"bytes while being read (the catalog records {self.size})",
                hint="restore the part from a backup")

    def _read(self, row_groups: list[int], columns: list[str], joined: bool = False
              ) -> pa.Table:
        if not self.disk.is_encrypted:
            if self._local is not None:
                direct = self._read_direct(row_groups, columns, joined)
                if direct is not None:
                    return direct
                return _read_row_groups(self._handle, self.meta, row_groups,
                                        self._indices(columns))
            with open_read(self.disk, self.part.path) as f:
                pf = pq.ParquetFile(_ZeroCopyFile(f), metadata=self.meta)
                return pf.read_row_groups(row_groups, columns=columns, use_threads=False)
        chunks, compressed = self._chunks(row_groups, columns)
        if self._sealed and chunks:
            direct = self._read_direct(row_groups, columns, joined)
            if direct is not None:
                return direct
        if self._native and chunks:
            native = self._read_native(row_groups, columns, chunks,
                                       compressed or self._copied(columns))
            if native is not None:
                return native
        f = self._handle
        ranges: list[tuple[int, int, int]] = []
        off = 0
        for a, b in chunks:
            if ranges and a < ranges[-1][1]:  # overlapping (never expected): merge
                pa_, pb, po = ranges.pop()
                off = po
                a, b = pa_, max(pb, b)
            ranges.append((a, b, off))
            off += b - a
        pooled = _take_arena() if compressed else None
        # pyarrow decompresses into new buffers: a pooled arena can be reused
        arena = memoryview(bytearray(off)) if pooled is None else pooled.view(off)
        try:
            for a, b, o in ranges:
                _decrypt_range(f, arena[o : o + b - a], a)
            return _read_row_groups(_CompactFile(f, self.size, ranges, arena), self.meta,
                                    row_groups, self._indices(columns))
        finally:
            arena.release()
            if pooled is not None:
                _give_back(pooled)

    def by_granule(self, rg: int, column: str) -> bool:
        """Whether :meth:`read_rows` may decode ``column`` of row group ``rg`` by page: a
        column the granule reader describes whose pages were not found unreadable, and
        either the part's page index says where its pages are (:meth:`indexed`) or its
        values are not narrow (:data:`_GRANULE_MIN_BYTES`: a narrow chunk decodes whole in
        less time than walking its page headers takes). From the footer alone (no read);
        the other columns are read whole."""
        j = self._index.get(column)
        if j is None or self.described(j) is None:
            return False
        spans = self._pages.get((rg, j), [])
        if spans is None:
            return False
        if (spans and walked_all(spans, self._chunk_info(rg, j)[1])) or self.indexed(rg, j):
            return True
        start, end, _compressed = self._chunk_info(rg, j)
        return end - start >= _GRANULE_MIN_BYTES * max(1, self._values(rg, j))

    def described(self, j: int) -> Any:
        """:func:`~._granule.granule_schema` of leaf ``j``, found once per open part
        (pyarrow builds the column's schema objects on each look)."""
        if j not in self._described:
            if self._lookup is not None:
                _name, path, physical, logical, level, repeated = self._lookup.leaves[j]
                self._described[j] = leaf_schema(path, physical, logical, level, repeated)
            else:
                self._described[j] = granule_schema(self.meta, j)
        return self._described[j]

    def _values(self, rg: int, j: int) -> int:
        """The number of values of leaf ``j``'s chunk in row group ``rg``."""
        if self._lookup is not None:
            return self._lookup.chunk(rg, j)[2]
        return int(self.meta.row_group(rg).column(j).num_values)

    def indexed(self, rg: int, j: int) -> bool:
        """Whether the part's page index (:data:`~._parts.PAGES_KEY`, in its authenticated
        footer) has the pages of leaf ``j``'s chunk in row group ``rg``; if so, they are
        kept as if their headers had been walked."""
        walked = self._pages.get((rg, j), [])
        if walked is None:
            return False
        if walked and walked_all(walked, self._chunk_info(rg, j)[1]):
            return True
        if self._page_index is False:
            raw = self.kv.get(PAGES_KEY)
            self._page_index = None if raw is None else PageIndex(
                raw, self.num_row_groups, self._num_leaves)
        if self._page_index is None:
            return False
        start, end, _compressed = self._chunk_info(rg, j)
        spans = self._page_index.spans(rg, j, start, end,  # type: ignore[union-attr]
                                       self._values(rg, j))
        if spans is None:
            return False
        self._pages[(rg, j)] = spans
        return True

    def page_index(self, rg: int, column: str, read: Any = None,
                   until: int | None = None) -> tuple[list[PageSpan], bool] | None:
        """The pages of ``column``'s chunk in row group ``rg``, from the part's page index
        (:meth:`indexed`) or else from their headers (each walked once per open part; on
        an encrypted disk each header's segment authenticates first), and whether they are
        all of the chunk's pages; None if
        :meth:`by_granule` says no or the headers are not what this reader understands
        (the chunk is then read whole, which reports any damage).
        ``read(offset, n)``: the reader to use (see :meth:`read_rows`). With ``until``,
        the headers are walked only as far as the page holding row ``until`` (the
        pages after it are neither read nor decrypted); a later call walks on."""
        if not self.by_granule(rg, column):
            return None
        j = self._index[column]
        spans = self._pages.get((rg, j), [])
        if spans is None:
            return None
        start, stop, _compressed = self._chunk_info(rg, j)
        if not walked_all(spans, stop) and (
                until is None or sum(p.rows for p in spans) <= until):
            own = read is None
            if own:
                read = self._page_reader()
            try:
                spans = page_spans(read, start, stop, self._values(rg, j), until, spans)
            except (PageError, pa.ArrowException):
                self._pages[(rg, j)] = None
                return None
            finally:
                if own and isinstance(read, _SegmentReader):
                    read.release()
            self._pages[(rg, j)] = spans
        return spans, walked_all(spans, stop)

    def read_rows(self, rg: int, column: str, first: int, end: int) -> pa.Array | None:
        """Rows ``first..end`` of ``column`` in row group ``rg``, decoding only the pages
        (granules of :data:`~._granule.GRANULE_ROWS` rows) that hold them; None when that
        would decode the whole column chunk anyway, the column's values are narrow
        (:data:`_GRANULE_MIN_BYTES`) and the part has no page index for it, or the column
        is not one the granule reader describes (the caller reads the chunk whole).

        On an encrypted disk only the segments holding the chunk's page headers and
        those pages are decrypted, each authenticating before it is used.
        """
        if end <= first:
            return None
        read = self._page_reader()  # one per read: a segment decrypts once for both uses
        try:
            return self._read_rows(rg, column, first, end, read)
        except (OSError, PageError, CatalogError):
            self._check_size()
            raise
        finally:
            if isinstance(read, _SegmentReader):
                read.release()

    def read_page_rows(self, rg: int, column: str, first: int, end: int) -> pa.Array | None:
        """Rows ``first..end`` of ``column`` in row group ``rg`` when they lie in one
        uncompressed PLAIN data page, decoded from the bytes that hold them only
        (:func:`~._granule.decode_page_rows`: a top-N's few rows of a sorted part); None
        otherwise (then :meth:`read_rows` decodes the pages holding them)."""
        if end <= first:
            return None
        read = self._page_reader()
        try:
            found = self.page_index(rg, column, read, until=end - 1)
            if found is None:
                return None
            j = self._index[column]
            page = next((p for p in found[0] if not p.dictionary
                         and p.first_row <= first and end <= p.first_row + p.rows), None)
            described = self.described(j)
            if page is None or described is None or any(p.dictionary for p in found[0]):
                return None
            compression = (self._lookup.codec(rg, j)[0] if self._lookup is not None
                           else str(self.meta.row_group(rg).column(j).compression))
            try:
                return decode_page_rows(compression, page, read, described[0], described[1],
                                        described[4], first - page.first_row,
                                        end - page.first_row)
            except (PageError, pa.ArrowException):
                return None  # (the pages are decoded whole, which reports any damage)
        finally:
            if isinstance(read, _SegmentReader):
                read.release()

    def _read_rows(self, rg: int, column: str, first: int, end: int, read: Any
                   ) -> pa.Array | None:
        found = self.page_index(rg, column, read, until=end - 1)
        if found is None:
            return None
        spans, complete = found
        j = self._index[column]
        data = [p for p in spans if not p.dictionary]
        wanted = [p for p in data if p.first_row < end and p.first_row + p.rows > first]
        if not wanted or (complete and len(wanted) == len(data)):
            return None
        pages = [p for p in spans if p.dictionary] + wanted
        try:
            if self._lookup is not None:
                compression, encodings = self._lookup.codec(rg, j)
                arr = decode_chunk_pages(self._lookup.leaves[j][0], compression, encodings,
                                         pages, read, self.described(j))
            else:
                arr = decode_pages(self.meta, rg, j, pages, read, self.described(j))
        except (PageError, pa.ArrowException):
            # not pages this reader understands: the whole chunk is read (and any damage
            # reported) as before
            self._pages[(rg, j)] = None
            return None
        if arr is None:
            return None
        return arr.slice(first - wanted[0].first_row, end - first)

    def _page_reader(self) -> Any:
        if self.disk.is_encrypted:
            return _SegmentReader(self._handle, self.size, self._segment)
        return self._plain_reader()

    def _plain_reader(self) -> Any:
        if self._local is not None:
            handle = self._handle
            return lambda offset, n: handle.read_at(n, offset)
        path, disk = self.part.path, self.disk

        def read(offset: int, n: int) -> bytes:
            with open_read(disk, path) as f:
                return bytes(f.pread(offset, n))
        return read

    def _indices(self, columns: list[str]) -> list[int]:
        """The leaf column indexes of ``columns`` (as ``ParquetFile`` maps names)."""
        return [j for c in columns for j in self._leaves[c]]

    def prefetch(self, row_groups: list[int], columns: list[str]) -> None:
        """Ask the OS to start reading the column chunks of a read to come (encrypted
        parts on a local disk; a no-op when the file is in the page cache already, and
        for plain parts, which pyarrow reads through the kernel's own readahead)."""
        if not self._sealed or self._handle is None:
            return
        chunks, _compressed = self._chunks(row_groups, columns)
        with contextlib.suppress(ValueError, OSError):  # a hint; a closed part reads later
            for a, b in chunks:
                self._handle.advise(a, b - a, True)
        wanted = tuple(columns)
        self._advised.update((rg, wanted) for rg in row_groups)

    def span(self, row_groups: list[int], columns: list[str]) -> tuple[int, int]:
        """``(bytes, extent)`` of a read of ``columns`` from ``row_groups``: the bytes of
        their column chunks, and the memory of the blocks a read decrypting them in place
        fills (see :meth:`_blocks`; a reused arena holds one block at a time)."""
        found = self.spans(row_groups, columns)
        return found[-1] if found else (0, 0)

    def spans(self, row_groups: list[int], columns: list[str]) -> list[tuple[int, int]]:
        """:meth:`span` of each prefix of ``row_groups`` (the first row group alone, the
        first two, ...), in one pass over them: a scan grows a run of row groups while its
        span stays within bounds, and asked :meth:`span` once per row group added (a
        quadratic number of row groups' chunks looked at, on the thread DuckDB consumes
        the scan on)."""
        out: list[tuple[int, int]] = []
        size = closed = 0  # chunk bytes so far; extent of the blocks before the last one
        last: list[list[int]] | None = None  # the last block's merged segment ranges
        lo = hi = 0  # ... and its start and end
        for rg in row_groups:
            merged, nbytes = self._group_ranges(rg, columns)
            if not merged:
                out.append((size, closed + (_ARENA_ALIGN + hi - lo if last else 0)))
                continue
            size += nbytes
            end = max(b for _a, b in merged)
            if last is not None and any(a <= r[1] and r[0] <= b
                                        for a, b in merged for r in last):
                last, lo, hi = _merged(last + merged), min(lo, merged[0][0]), max(hi, end)
            else:
                if last is not None:
                    closed += _ARENA_ALIGN + hi - lo
                last, lo, hi = merged, merged[0][0], end
            out.append((size, closed + _ARENA_ALIGN + hi - lo))
        return out

    def _group_ranges(self, rg: int, columns: list[str]) -> tuple[list[list[int]], int]:
        """Row group ``rg``'s whole-segment ranges holding ``columns``' chunks (merged,
        sorted), and the chunks' bytes."""
        seg, size = max(1, self._segment), self.size
        ranges: list[list[int]] = []
        nbytes = 0
        for c in columns:
            for j in self._leaves[c]:
                start, end, _compressed = self._chunk_info(rg, j)
                ranges.append([start // seg * seg, min(size, -(-end // seg) * seg)])
                nbytes += end - start
        return _merged(ranges), nbytes

    def _blocks(self, row_groups: list[int], columns: list[str]) -> list[_Block]:
        """The read's row groups in order, cut where their whole segments stop touching:
        ``(row groups, segment ranges, start, end)`` per block, the ranges merged, sorted
        and within ``[start, end)``. A block is decrypted at its own offsets in the file,
        then decoded by a reader of its own, before the next block is decrypted into the
        same stretch of the arena. So a scan of one column of consecutive row groups (its
        chunks a row group apart in the file) fills only as much arena as one chunk takes,
        and that same memory again for each chunk, instead of a new stretch of the row
        groups' extent: fresh memory costs a page fault and zeroing per 4 KiB, more than
        decrypting into it."""
        blocks: list[_Block] = []
        for rg in row_groups:
            merged, _nbytes = self._group_ranges(rg, columns)
            if not merged:
                continue
            last = blocks[-1] if blocks else None
            if last is not None and any(a <= r[1] and r[0] <= b
                                        for a, b in merged for r in last[1]):
                # shares a segment with the block before, or follows it: one block
                joined = _merged(last[1] + merged)
                blocks[-1] = ([*last[0], rg], joined, min(last[2], merged[0][0]),
                              max(last[3], max(b for _a, b in merged)))
            else:
                blocks.append(([rg], merged, merged[0][0], max(b for _a, b in merged)))
        return blocks

    def _chunks(self, row_groups: list[int], columns: list[str]
                ) -> tuple[list[tuple[int, int]], bool]:
        """The byte ranges of the column chunks to read, sorted; whether all are compressed."""
        chunks, compressed = [], True
        for i in row_groups:
            for c in columns:
                for j in self._leaves[c]:
                    start, end, is_compressed = self._chunk_info(i, j)
                    chunks.append((start, end))
                    compressed = compressed and is_compressed
        chunks.sort()
        return chunks, compressed

    def _chunk_info(self, rg: int, j: int) -> tuple[int, int, bool]:
        """``(start, end, compressed)`` of leaf column ``j``'s chunk in row group ``rg``
        (:func:`_chunk_start_end`; compressed by a codec in ``_COMPRESSED``), kept."""
        got = self._chunk.get((rg, j))
        if got is None:
            if self._lookup is not None:
                start, end, _values = self._lookup.chunk(rg, j)
                got = self._chunk[(rg, j)] = (start, end,
                                              self._lookup.codec(rg, j)[0] in _COMPRESSED)
            else:
                col = self.meta.row_group(rg).column(j)
                got = self._chunk[(rg, j)] = (*_chunk_start_end(col),
                                              str(col.compression).upper() in _COMPRESSED)
        return got

    def _copied(self, columns: list[str]) -> bool:
        """Whether pyarrow copies ``columns`` out of uncompressed pages (flat types whose
        decoders copy values into their builders; checked by a test): then the arena may
        hold those pages too."""
        if self._arrow is None:
            self._arrow = self.meta.schema.to_arrow_schema()
        for c in columns:
            i = self._arrow.get_field_index(c)
            if i < 0 or not _copied_type(self._arrow.field(i).type):
                return False
        return True

    def _fixed_width(self, column: str) -> pa.Field | None:
        """The Arrow field of ``column`` if its values are stored as they are in memory: one
        leaf, REQUIRED, a 4- or 8-byte integer or float with no logical type, read by
        pyarrow as that same type (the footer's Arrow schema decides, as for pyarrow)."""
        j = self._index.get(column)
        if j is None:
            return None
        described = self.described(j)
        if described is None or described[2] is not None or described[3] is not None \
                or described[4] or described[0] not in _FIXED:
            return None
        return self._arrow_field(column, described[0])

    def _arrow_field(self, column: str, typ: pa.DataType) -> pa.Field | None:
        """``column``'s field as pyarrow reads the part's schema, if of type ``typ``.

        A part opened by its lookup block is cryptdisk's own, written from its table's
        Arrow schema, whose types come from DuckDB (never an Arrow-only type such as a
        duration over an INT64 leaf): its column reads as its leaf says
        (:meth:`described`), and the footer is not parsed for it (1.3-2 ms of the first
        scan task of a cold full scan, holding the GIL; scans cast to the table's types
        whatever a part gives)."""
        if self._arrow is None and self._lookup is not None:
            j = self._index.get(column)
            described = self.described(j) if j is not None else None
            if described is None or described[0] != typ:
                return None
            return pa.field(column, typ, nullable=bool(described[4]))
        if self._arrow is None:
            self._arrow = self.meta.schema.to_arrow_schema()
        i = self._arrow.get_field_index(column)
        if i < 0 or self._arrow.field(i).type != typ:
            return None
        return self._arrow.field(i)

    def _fixed_pages(self, rg: int, j: int, width: int) -> list[tuple[int, int]] | None:
        """Where the values of leaf ``j``'s chunk in row group ``rg`` lie, page by page
        (``(start, end)`` in the file), when the chunk is uncompressed and PLAIN encoded
        with no dictionary, and the part's page index (authenticated with it) has its
        pages; None otherwise. A data page of a REQUIRED column has no levels, so its body
        is its values: the last ``rows * width`` bytes before the next page."""
        spans = self._plain_pages(rg, j)
        if spans is None:
            return None
        out, at = [], spans[0].start
        for p in spans:
            body = p.rows * width
            # a page header is a few dozen bytes: anything else is not such a page
            if p.start != at or not 0 < p.end - p.start - body <= _HEADER_MAX:
                return None
            out.append((p.end - body, p.end))
            at = p.end
        return out

    def _plain_pages(self, rg: int, j: int) -> list[PageSpan] | None:
        """The pages of leaf ``j``'s chunk in row group ``rg`` from the part's page index,
        when the chunk is uncompressed and PLAIN encoded with no dictionary, and its pages
        run from the chunk's start to its end holding its rows; None otherwise."""
        if self._lookup is not None:
            codec, encodings = self._lookup.codec(rg, j)
        else:
            col = self.meta.row_group(rg).column(j)
            if col.has_dictionary_page:
                return None
            codec, encodings = str(col.compression).upper(), list(col.encodings)
        if codec != "UNCOMPRESSED" or not set(encodings) <= _PLAIN_ONLY:
            return None
        if not self.indexed(rg, j):
            return None
        spans = self._pages.get((rg, j))
        start, end, _compressed = self._chunk_info(rg, j)
        if not spans or spans[0].start != start or spans[-1].end != end:
            return None
        rows = 0
        for p in spans:
            if p.dictionary:
                return None
            rows += p.rows
        if rows != self.rows(rg) or rows != self._values(rg, j):
            return None
        return spans

    def _one_width_field(self, column: str) -> pa.Field | None:
        """The Arrow field of ``column`` if it is a flat VARCHAR column (REQUIRED or not)
        read by pyarrow as ``string``: its chunks of strings of one length decode through
        :func:`~._granule.decode_one_width_chunk`."""
        j = self._index.get(column)
        if j is None:
            return None
        described = self.described(j)
        if described is None or described[0] != pa.string() or described[1] != _BYTE_ARRAY:
            return None
        return self._arrow_field(column, described[0])

    def _read_direct(self, row_groups: list[int], columns: list[str], joined: bool = False
                     ) -> pa.Table | None:
        """``columns`` of ``row_groups`` with no Parquet reader, when every one is stored
        as its values (:meth:`_fixed_width`, :meth:`_fixed_pages`), and that buffer is
        the Arrow array, or is a VARCHAR column of uncompressed PLAIN pages
        (:meth:`_one_width_field`, :meth:`_plain_pages`) whose chunks' strings each have
        one length. Encrypted, each column chunk is decrypted (every segment
        authenticating before the call returns) into a buffer of its own size, its
        pages' values moved together over their headers; plain (a local file), one
        ``preadv`` per chunk reads each page's values into their place in the buffer and
        its header aside. Decoding through pyarrow cost a Parquet reader per read and a
        copy of every value into fresh memory (a cold ``sum`` of a 10M-row BIGINT
        column: about a fifth of the encrypted scan threads' CPU). A string chunk is
        decrypted (or read) into the thread's arena and its strings copied once into the
        array (:func:`~._granule.decode_one_width_chunk`). None when a column or chunk
        is not such (read as usual). ``joined``: each column stored as its values is one
        buffer for all of ``row_groups`` (allocated once, each chunk's values placed after
        the previous chunk's) and one array, which a scan hands to DuckDB as one batch."""
        fields: list[pa.Field] = []
        plan: list[tuple[int, int, Any]] = []
        for c in columns:
            field = self._fixed_width(c)
            strings = field is None
            if strings:
                field = self._one_width_field(c)
                if field is None:
                    return None
            assert field is not None
            fields.append(field)
            j = self._index[c]
            if strings and j in self._varying:
                return None
            for rg in row_groups:
                pages: Any = (self._plain_pages(rg, j) if strings
                              else self._fixed_pages(rg, j, field.type.bit_width // 8))
                if pages is None:
                    return None
                plan.append((rg, j, pages))
        if not self._sealed:
            return self._read_values(row_groups, fields, plan, joined)
        f = self._handle
        wanted = tuple(columns)
        hinted = [(rg, wanted) for rg in row_groups]
        if all(h in self._advised for h in hinted):  # (prefetch gave the hints)
            self._advised.difference_update(hinted)
        else:
            for rg, j, _pages in plan:
                start, end, _compressed = self._chunk_info(rg, j)
                f.advise(start, end - start, True)
        arrays: list[list[pa.Array]] = [[] for _ in columns]
        lo, hi = self.size, 0
        n = len(row_groups)
        try:
            for i, field in enumerate(fields):
                column = plan[i * n : (i + 1) * n]
                if field.type == pa.string():
                    for rg, j, pages in column:
                        start, end, _compressed = self._chunk_info(rg, j)
                        lo, hi = min(lo, start), max(hi, end)
                        arr = self._read_strings(start, end, pages, field, j)
                        if arr is None:
                            return None
                        arrays[i].append(arr)
                    continue
                if joined and n > 1:
                    arrays[i].append(self._read_joined(column, field))
                    lo = min(lo, self._chunk_info(column[0][0], column[0][1])[0])
                    hi = max(hi, self._chunk_info(column[-1][0], column[-1][1])[1])
                    continue
                for rg, j, pages in column:
                    start, end, _compressed = self._chunk_info(rg, j)
                    lo, hi = min(lo, start), max(hi, end)
                    buf = pa.allocate_buffer(end - start)
                    view = memoryview(buf).cast("B")
                    try:  # the chunk's bytes, every segment authenticated, or an error;
                        # each page's values moved over the headers before it (one C call)
                        at = self._read_packed(view, start, pages)
                    finally:
                        view.release()
                    arrays[i].append(pa.Array.from_buffers(
                        field.type, at * 8 // field.type.bit_width, [None, buf.slice(0, at)],
                        null_count=0))
        finally:  # read (or failed): the mapped ciphertext goes
            if hi > lo:
                f.advise(lo, hi - lo, False)
        return _direct_table(arrays, fields)

    def _read_joined(self, column: list[tuple[int, int, Any]], field: pa.Field) -> pa.Array:
        """The chunks ``column`` (``(rg, leaf, values' spans)`` each, in order) of an
        encrypted part's column stored as its values, as one array over one buffer: each
        chunk decrypted (authenticated) at the end of the values before it and its pages'
        values moved to there, so the buffer holds the values of all, one after another
        (one allocation a read, not one a chunk)."""
        room = at = 0
        for rg, j, pages in column:  # the buffer: the values before each chunk + the chunk
            start, end, _compressed = self._chunk_info(rg, j)
            room = max(room, at + end - start)
            at += sum(b - a for a, b in pages)
        buf = pa.allocate_buffer(room)
        view = memoryview(buf).cast("B")
        at = 0
        try:
            for rg, j, pages in column:
                start, end, _compressed = self._chunk_info(rg, j)
                at += self._read_packed(view[at : at + end - start], start, pages)
        finally:
            view.release()
        return pa.Array.from_buffers(field.type, at * 8 // field.type.bit_width,
                                     [None, buf.slice(0, at)], null_count=0)

    def _read_packed(self, view: memoryview, start: int, pages: list[tuple[int, int]]
                     ) -> int:
        """The encrypted part's bytes at ``start`` into ``view``, every segment
        authenticated (or an error), the ``pages``' values (``(a, b)`` in the file) then
        moved together to its start; returns their bytes. A sealed file does it in one
        call (:meth:`~cryptdisk.format.SealedReader.readinto_spans`: with the C extension
        the GIL released once a chunk)."""
        packed = getattr(self._handle, "preadspans", None)
        if packed is not None:
            if start + len(view) > self.size:
                raise CatalogError(f"short read at offset {start} of {self.part.path}")
            return int(packed(view, start, pages))
        self._read_chunk(view, start)
        at = 0
        for a, b in pages:
            if a - start != at:
                view[at : at + b - a] = view[a - start : b - start]
            at += b - a
        return at

    def _read_chunk(self, view: memoryview, start: int) -> None:
        """The part's bytes at ``start`` into ``view``: on an encrypted disk every segment
        authenticated (or an error), on a plain one read with ``pread``."""
        if self._sealed:
            whole = getattr(self._handle, "preadspans", None)
            if whole is not None and start + len(view) <= self.size:
                # one call (with the C extension the GIL released once), the partial first
                # and last segments included: no spans, so nothing is moved
                whole(view, start, [])
                return
            got = self._handle.preadinto(view, start, advise=False, parallel=False)
        else:
            got = os.preadv(self._handle.fileno(), [view], start)
        if got != len(view):
            raise CatalogError(f"short read at offset {start} of {self.part.path}")

    def _read_strings(self, start: int, end: int, pages: list[PageSpan], field: pa.Field,
                      j: int) -> pa.Array | None:
        """A VARCHAR chunk (``start..end`` in the file, its ``pages``) read into the
        thread's arena (decrypted, authenticated) and decoded from there
        (:func:`~._granule.decode_one_width_chunk` copies every string out: the arena is
        reused); None if its strings are not all of one length (or anything else that
        decoder does not take), and the part's later reads of the column go through
        pyarrow at once."""
        pooled = _take_arena()
        view = pooled.view(end - start)
        try:
            self._read_chunk(view, start)
            arr = decode_one_width_chunk(view, start, pages, field.type,
                                         bool(self.described(j)[4]))
            if arr is None:  # strings of several lengths, most likely in every chunk
                self._varying.add(j)
            return arr
        finally:
            view.release()
            _give_back(pooled)

    def _read_values(self, row_groups: list[int], fields: list[pa.Field],
                     plan: list[tuple[int, int, Any]], joined: bool = False
                     ) -> pa.Table | None:
        """:meth:`_read_direct` of a plain part's local file: per column chunk one
        ``preadv`` puts each page's values at their place in a buffer of the values' size
        (the headers between them into a scratch buffer), so the kernel's copy from the
        page cache is the only one (pyarrow read each chunk into a buffer of its own,
        then copied every value into the array). Each page's header is checked to be the
        header of such a page of those values (the page index of a plain part is not
        authenticated: an offset changed in it would shift the values silently).
        ``joined``: as in :meth:`_read_direct`, the chunks of a column go into one buffer."""
        fd = self._handle.fileno()
        arrays: list[list[pa.Array]] = [[] for _ in fields]
        prefixes: dict[tuple[int, int], bytes] = {}  # (values' bytes, width) -> header start
        n = len(row_groups)
        joint: Any = None  # (buffer, bytes placed) of the column being read joined
        for k, (rg, j, pages) in enumerate(plan):
            start, end, _compressed = self._chunk_info(rg, j)
            field = fields[k // n]
            if field.type == pa.string():  # (each page header parsed and checked)
                arr = self._read_strings(start, end, pages, field, j)
                if arr is None:
                    return None
                arrays[k // n].append(arr)
                continue
            size = sum(b - a for a, b in pages)
            if joined and n > 1:
                if k % n == 0:  # the column's first chunk: one buffer for all of them
                    joint = [pa.allocate_buffer(sum(
                        b - a for _rg, _j, ps in plan[k : k + n] for a, b in ps)), 0]
                whole = memoryview(joint[0]).cast("B")  # (a slice of a buffer is read-only)
                view = whole[joint[1] : joint[1] + size]
                whole.release()
                joint[1] += size
            else:
                buf = pa.allocate_buffer(size)
                view = memoryview(buf).cast("B")
            width = field.type.bit_width // 8
            # the pages' headers, one after another (the bytes between the values)
            scratch = memoryview(bytearray(pages[-1][1] - start - size))
            try:
                at, pos, held, parts, heads = 0, start, 0, [], []
                for a, b in pages:  # the header before each page's values, then the values
                    head = scratch[held : held + a - pos]
                    parts.append(head)
                    heads.append((pos, head, b - a))
                    parts.append(view[at : at + b - a])
                    at, pos, held = at + b - a, b, held + a - pos
                for i in range(0, len(parts), _IOV_MAX):  # (never more than one call here)
                    got = os.preadv(fd, parts[i : i + _IOV_MAX], start)
                    want = sum(len(v) for v in parts[i : i + _IOV_MAX])
                    if got != want:
                        raise CatalogError(f"short read at offset {start} of "
                                           f"{self.part.path}")
                    start += got
                for offset, head, body in heads:
                    prefix = prefixes.get((body, width))
                    if prefix is None:
                        prefix = prefixes[body, width] = plain_page_prefix(body // width, body)
                    if head[: len(prefix)] == prefix:
                        continue  # (the next page's header, or the chunk's end, is where
                        # this page ends: its header is all the bytes before its values)
                    problem = plain_page_problem(head, body // width, body)
                    if problem is not None:
                        raise CatalogError(
                            f"part {self.part.path} on disk {self.disk.name!r} is damaged: "
                            f"column {field.name!r} (row group {rg}) at offset {offset}: "
                            f"{problem}", hint="restore the part from a backup, or drop "
                            "the table")
                for v in parts:
                    v.release()
            finally:
                view.release()
            if joined and n > 1:
                if k % n == n - 1:  # the column's last chunk: its one array
                    arrays[k // n].append(pa.Array.from_buffers(
                        field.type, joint[1] * 8 // field.type.bit_width, [None, joint[0]],
                        null_count=0))
                continue
            arrays[k // n].append(pa.Array.from_buffers(
                field.type, size * 8 // field.type.bit_width, [None, buf], null_count=0))
        return _direct_table(arrays, fields)

    def _read_native(self, row_groups: list[int], columns: list[str],
                     chunks: list[tuple[int, int]], reuse: bool) -> pa.Table | None:
        """Decrypt whole segments into memory at their offsets in the file, and let pyarrow
        decode from there (no Python call per read); None if the chunks are too far apart
        (the caller reads them compacted).

        Each block (see :meth:`_blocks`) is decrypted into its own stretch of that memory,
        and pyarrow sees a buffer that starts the block's offset in the file before it, so
        the file's offsets land in it; it reads exactly the column chunk ranges of the
        footer (:func:`_chunk_start_end` computes them as Arrow does), all inside the
        block. The memory is the thread's arena if ``reuse`` (nothing decoded refers to
        it), else fresh.
        """
        blocks = self._blocks(row_groups, columns)
        sizes = [blk[3] - blk[2] + (-(blk[3] - blk[2]) % _ARENA_ALIGN) for blk in blocks]
        need = sum(b - a for a, b in chunks)
        if sum(sizes) > max(2 * need + _GAP_SLACK, SPAN_MAX):
            return None
        f = self._handle
        hinted: list[tuple[int, tuple[str, ...]]] = []
        if self._sealed:
            # One hint per chunk for the whole read, unless prefetch gave it already
            # (a task queued behind others), and one call at the end that drops the
            # whole read's mapped ciphertext: each madvise costs a system call under
            # the GIL, a dropping one also a TLB flush on every core the process runs
            # on, and a scan of one column gave three per column chunk.
            wanted = tuple(columns)
            hinted = [(rg, wanted) for rg in row_groups]
            if all(h in self._advised for h in hinted):
                self._advised.difference_update(hinted)
            else:
                for blk in blocks:
                    for a, b in blk[1]:
                        f.advise(a, b - a, True)
        tables = []
        try:
            for blk, size in zip(blocks, sizes, strict=True):
                tables.append(self._read_block(blk, size, columns, reuse))
        finally:
            if self._sealed:  # read (or failed): the mapped ciphertext goes, other bytes too
                start = min(blk[1][0][0] for blk in blocks)
                f.advise(start, max(blk[1][-1][1] for blk in blocks) - start, False)
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def _read_block(self, blk: _Block, size: int, columns: list[str], reuse: bool
                    ) -> pa.Table:
        """Decrypt one block's segments (each authenticating first), then decode it: the
        block's plaintext is decoded while it is still in the CPU's cache, and a reused
        arena holds one block, not a whole read (fresh memory costs a page fault and
        zeroing per 4 KiB, more than decrypting into it). pyarrow sees only plaintext
        that has authenticated."""
        pooled = _take_arena() if reuse else None
        if pooled is not None:
            view, whole = pooled.buffer(size)
        else:  # pyarrow may keep slices of uncompressed pages of these types: fresh memory
            fresh = bytearray(size)
            view, whole = memoryview(fresh), pa.py_buffer(fresh)
        try:
            f, lo = self._handle, blk[2]
            if self._sealed:
                for a, b in blk[1]:  # on this thread: the scan's threads are the parallelism
                    if f.preadinto(view[a - lo : b - lo], a, advise=False,
                                   parallel=False) != b - a:
                        raise CatalogError(f"short read at offset {a} of {f.name}")
            else:
                step = self._segment * _SERIAL_SEGMENTS if self._segment > 1 else 1 << 18
                for a, b in blk[1]:
                    _decrypt_serial(f, view[a - lo : b - lo], a, step)
            # every byte of the block has authenticated: only now does pyarrow see any
            source = pa.BufferReader(pa.foreign_buffer(whole.address - lo, blk[3], base=whole))
            return _read_row_groups(source, self.meta, blk[0], self._indices(columns))
        finally:
            view.release()
            if pooled is not None:
                _give_back(pooled)

    def close(self) -> None:
        if self._handle is not None:
            with contextlib.suppress(Exception):
                self._handle.close()
            self._handle = None


class _SegmentReader:
    """Bytes of an encrypted part for one granule read (a chunk's page headers, then the
    pages wanted), each segment decrypted (and authenticated) once.

    Of a file in cryptdisk's sealed format each run is decrypted on this thread with no
    hint to the OS per read (a hint costs two system calls, the dropping one a TLB flush
    on every core the process runs on: about 15 us a read of a few segments);
    :meth:`release` then drops the mapped ciphertext of everything read, once."""

    def __init__(self, f: Any, size: int, segment: int) -> None:
        self._f, self._size = f, size
        self._seg = segment if segment > 1 else 1 << 16
        self._plain: dict[int, memoryview] = {}
        info = getattr(f, "info", None)
        self._sealed = (isinstance(info, dict) and info.get("format") == "cryptdisk"
                        and hasattr(f, "advise"))
        self._lo, self._hi = size, 0  # the extent read (see release)

    def release(self) -> None:
        """Drop the mapped ciphertext of what this reader decrypted (a hint; nothing for
        a file of another format, whose reads give their own)."""
        if self._sealed and self._hi > self._lo:
            with contextlib.suppress(ValueError, OSError):  # a closed part: nothing mapped
                self._f.advise(self._lo, self._hi - self._lo, False)
            self._lo, self._hi = self._size, 0

    def __call__(self, offset: int, n: int) -> memoryview:
        n = max(0, min(n, self._size - offset))
        seg = self._seg
        first, last = offset // seg, (offset + n - 1) // seg
        if n and first == last and first in self._plain:
            a = offset - first * seg
            return self._plain[first][a : a + n]
        lo, hi = first * seg, min(self._size, (last + 1) * seg)
        # (unzeroed: every byte is decrypted into before it is used, or the read raises)
        out = memoryview(pa.allocate_buffer(hi - lo)).cast("B")
        i = first
        while i <= last:  # runs of segments not decrypted yet: one call each
            a = i * seg - lo
            got = self._plain.get(i)
            if got is not None:
                out[a : a + len(got)] = got
                i += 1
                continue
            j = i
            while j < last and j + 1 not in self._plain:
                j += 1
            b = min((j + 1) * seg, hi) - lo
            if self._sealed:  # on this thread, no hints (see release)
                if self._f.preadinto(out[a:b], lo + a, advise=False,
                                     parallel=False) != b - a:
                    raise CatalogError(f"short read at offset {lo + a} of {self._f.name}")
                self._lo, self._hi = min(self._lo, lo + a), max(self._hi, lo + b)
            else:  # a few segments a call (below the format's parallel threshold)
                _decrypt_serial(self._f, out[a:b], lo + a, seg * _SERIAL_SEGMENTS)
            for k in range(i, j + 1):
                self._plain[k] = out[k * seg - lo : min((k + 1) * seg, hi) - lo]
            i = j + 1
        return out[offset - lo : offset - lo + n]


def open_part(disk: Disk, part: PartMeta) -> OpenPart:
    """Open ``part`` for reading by row group, after checking it is the catalog's part.

    A file that is not what the catalog recorded (plain where it was encrypted,
    not Parquet) raises :class:`~cryptdisk.errors.CatalogError`, as its reads do; no
    descriptor left, :func:`._fdlimit.too_many_open_files`'s ``DatabaseError``.
    """
    try:
        return OpenPart(disk, part)
    except MemoryError:
        raise
    except (pa.ArrowException, FormatError) as exc:
        raise not_as_recorded(disk, part, exc) from None
    except OSError as exc:
        if out_of_files(exc):  # (EMFILE: not a damaged part, a limit to raise)
            raise too_many_open_files(f"opening part {part.path} on disk {disk.name!r}",
                                      exc) from None
        raise

"""Streaming table scans: DuckDB pulls Arrow batches; only row groups that can match are read.

A :class:`TableScan` is what DuckDB sees as a table. Each time DuckDB scans it
(``__arrow_c_stream__``, once per scan, so a table used twice in a query is
read twice), a fresh lazy stream starts: parts whose key range (catalog) or row
groups whose statistics (authenticated part footer) cannot match the query's
filters are skipped; the others are read one row group per task on a small pool
of threads (decryption and decoding on all cores), at most a few row groups
ahead of DuckDB, and handed over in table order. So memory stays at a few row
groups per scan whatever the table's size, and a ``LIMIT`` that DuckDB
satisfies early stops the reading. Decoded row groups go through the optional
:class:`~cryptdisk.db._cache.ColumnCache`; a query never waits to fill it.
"""

from __future__ import annotations

import array
import bisect
import collections
import concurrent.futures
import heapq
import itertools
import operator
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import CatalogError
from ._cache import ColumnCache, StatementCache
from ._catalog import PartMeta, TableMeta
from ._derived import DerivedColumn, DerivedFailed, where_name
from ._fdlimit import parts_kept_open, parts_ranked_open
from ._forksafe import track
from ._partread import SPAN_MAX, OpenPart, open_part
from ._parts import GRANULE_EMPTY, GRANULE_NAN, GRANULE_NULL
from ._pushdown import Filter, TopN, may_match, widened
from ._rows import TIME_ZONE
from ._storage import on_local_disk

__all__ = ["OpenParts", "TableScan", "scan_workers", "warm_up"]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
#: The scan pool's threads' names start so (see :func:`_on_pool_thread`).
_THREAD_NAME = "cryptdisk-scan"
_NULL_BATCH = 1 << 20
#: A scan task reads consecutive row groups of a part while their column chunks add up
#: to at most this (see ``_Stream._run``), and at most ``RUN_GROUPS`` of them.
RUN_BYTES = 4 << 20
RUN_GROUPS = 8
#: A top-N's batch of at most this many rows is ranked in Python (see ``_few_integers``)
_FEW_ROWS = 64
#: array.array's type code of each integer type: (bit width, unsigned) -> code.
_ARRAY_CODES = {(8, False): "b", (16, False): "h", (32, False): "i", (64, False): "q",
                (8, True): "B", (16, True): "H", (32, True): "I", (64, True): "Q"}


def integer_array(typ: pa.DataType, values: list[int]) -> pa.Array:
    """An Arrow array of integer type ``typ`` from a buffer (``pa.array`` of Python ints
    imports pandas, most of a second, and a cast imports pyarrow.compute, 40-80 ms)."""
    code = _ARRAY_CODES[(typ.bit_width, pa.types.is_unsigned_integer(typ))]
    buf = array.array(code, values)
    return pa.Array.from_buffers(typ, len(buf), [None, pa.py_buffer(buf)])


def scan_workers() -> int:
    return max(1, os.cpu_count() or 1)


#: The scan pool's threads started as it is made (see :func:`_pool`).
_PRESTART = 4


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            pool = ThreadPoolExecutor(max_workers=scan_workers(),
                                      thread_name_prefix=_THREAD_NAME)
            _prestart(pool, min(scan_workers(), _PRESTART))
            _POOL = pool
        return _POOL


def _prestart(pool: ThreadPoolExecutor, n: int) -> None:
    """Start ``n`` threads of ``pool`` now, idle, waiting for its tasks.

    ThreadPoolExecutor starts a thread at a submit that finds none idle, and that submit
    waits until the new thread runs, which needs the GIL: made by the first statement
    that scans, before any other thread of cryptdisk's runs Python, they start at once;
    started later by a scan thread (a point query's part open submitting its key's read
    ahead while the main thread analyses the statement), the start waited for the GIL and
    the statement for that thread (1-10 ms of a cold point query's wall, 0.3 ms of CPU).
    Started with no task (a task would need the GIL again to end, taking it from the
    statement): each waits in the work queue, and a submit that finds the pool's threads
    all started queues its task for them."""
    start = getattr(pool, "_adjust_thread_count", None)  # (a private step of the executor)
    if start is None:  # (a later Python without it: the threads start at submits, as before)
        return
    for _ in range(n):
        start()  # (a thread each while fewer than max_workers)


def warm_up() -> None:
    """Start the scan pool's threads (idle, see :func:`_prestart`) and make pyarrow's
    memory pool's first allocation, for ``connect``: a process's first query then pays
    neither on its critical path (its part's open waited 0.5 ms for the pool's threads
    to start and 0.3-0.4 ms for that allocation, before any byte was read). No thread
    runs anything: a process forked meanwhile starts its own pool (see
    :func:`_forget_pool`)."""
    _pool()
    pa.allocate_buffer(1 << 16)  # (freed at once: the pool keeps its memory reserved)


def _on_pool_thread() -> bool:
    """Whether this thread is one of the scan pool's: it must not wait for an open queued
    on the pool (a top-N's start runs on the thread that opened its parts, see
    ``_Stream.start_after``; with every pool thread so waiting, nothing would run the
    queued opens), so :meth:`OpenParts.get` opens the part itself there."""
    return threading.current_thread().name.startswith(_THREAD_NAME)


def _forget_pool() -> None:
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


class OpenParts:
    """Parts already opened and checked, by part id, kept for the next queries (LRU).

    Part files are immutable and their ids unique, so an open part (its footer
    checked against the catalog, its key range against the footer) stays valid;
    an entry pushed out is dropped, not closed (a running scan may still read
    it; the file closes when the last reference goes). :meth:`preopen` opens
    parts on the scan pool ahead of a statement; :meth:`get` waits for one in
    flight. ``limit`` (default :func:`._fdlimit.parts_kept_open`: 64, fewer under a
    low ``ulimit -n``) bounds the descriptors kept: a scan holds only the parts it is
    reading beyond those.
    """

    def __init__(self, config: Callable[[], Any], limit: int | None = None) -> None:
        self._config = config  # the current config (keys may reload)
        #: parts kept open between statements at most
        self._limit = parts_kept_open() if limit is None else limit
        self._items: collections.OrderedDict[str, OpenPart] = collections.OrderedDict()
        self._opening: dict[str, tuple[int, Future[OpenPart]]] = {}  # id -> (pid, future)
        self._generation = 0  # clear() drops what is still being opened
        self._key_reads: list[OpenPart] = []  # parts with key columns read ahead
        self._lock = threading.Lock()

    def get(self, part: PartMeta) -> OpenPart:
        with self._lock:
            op = self._items.get(part.id)
            if op is not None and op.part == part:
                self._items.move_to_end(part.id)
                return op
            opening = self._opening.get(part.id)
        if opening is not None and opening[0] == os.getpid() and (
                opening[1].done() or not _on_pool_thread()):
            try:
                op = opening[1].result()
            except Exception:  # opened again below, which raises the error
                op = None
            if op is not None and op.part == part:
                return op
        return self._open(part, None, self._generation, ahead=False)

    def preopen(self, parts: list[PartMeta], key: str | None,
                numbers: set[int] | frozenset[int] = frozenset()) -> bool:
        """Open ``parts`` (those not open yet) on the scan pool, and read the statistics
        of ``key``, without waiting: a statement about to read them opens them while
        DuckDB parses it. An error is left for :meth:`get` to raise.

        Of a part sorted by an integer ``key``, the key's column of the row groups (at
        most 2) that hold one of ``numbers`` (integers written in the statement) is then
        decoded too, on the pool, for the statement's granule reads (see
        :meth:`TableScan._read_granules`); what the statement does not use goes with
        :meth:`drop_key_reads`. Whether it started opening one."""
        with self._lock:
            todo = [p for p in parts if p.id not in self._items and p.id not in self._opening]
            for part in todo:
                self._opening[part.id] = (os.getpid(), _pool().submit(
                    self._open, part, key, self._generation, ahead=True, numbers=numbers))
        return bool(todo)

    def open_few(self, tables: Iterable[TableMeta], most: int, wait: float) -> int:
        """Open the parts of ``tables`` now, on the scan pool, when they are few: each
        table's (in the order given) while they add up to at most ``most`` parts, all on
        local disks, and wait for them for at most ``wait`` seconds. For ``connect``: a
        process's first query on those tables then reads rows at once (a cold point
        query on the key opened its part on its critical path: the file's key, its last
        segment and lookup block, about 1 ms of an encrypted part's 4-6 ms). A part that
        fails to open is left for the statement that reads it, which raises the error.
        How many parts it started opening."""
        chosen: list[tuple[list[PartMeta], str | None]] = []
        left = most
        disks = self._config().disks
        for meta in tables:
            parts = [p for p in meta.parts if p.rows]
            if parts and len(parts) <= left and all(
                    on_local_disk(disks.get(p.disk)) for p in parts):
                chosen.append((parts, meta.key))
                left -= len(parts)
        opening: list[Future[OpenPart]] = []
        for parts, key in chosen:
            self.preopen(parts, key)
            opening += self.in_flight(parts)
        if opening:
            concurrent.futures.wait(opening, timeout=wait)
        return most - left

    def in_flight(self, parts: list[PartMeta]) -> list[Future[OpenPart]]:
        """The opens of ``parts`` (by :meth:`preopen`, in this process) still running."""
        with self._lock:
            found = [self._opening.get(p.id) for p in parts]
        return [f[1] for f in found if f is not None and f[0] == os.getpid()
                and not f[1].done()]

    def drop_key_reads(self) -> None:
        """Forget the key columns read ahead for the statement that ends."""
        with self._lock:
            ops, self._key_reads = self._key_reads, []
        for op in ops:
            for fut in list(op.key_reads.values()):
                fut.cancel()
            op.key_reads.clear()

    def _read_keys_ahead(self, op: OpenPart, key: str, numbers: set[int] | frozenset[int]
                         ) -> None:
        bounds = op.sorted_bounds(key)
        if bounds is None or not numbers:
            return
        mins, maxs = bounds
        if not all(isinstance(v, int) for v in (mins[0], maxs[-1])):
            return
        groups = set()
        for n in sorted(numbers):
            rg = bisect.bisect_left(maxs, n)  # the first row group whose max >= n
            if rg < len(mins) and mins[rg] <= n:
                groups.add(rg)
        for rg in sorted(groups)[:2]:
            op.key_reads[rg] = _pool().submit(_read_key_ahead, op, rg, key, numbers)
        if groups:
            with self._lock:
                self._key_reads.append(op)

    def _open(self, part: PartMeta, key: str | None, generation: int, *,
              ahead: bool, numbers: set[int] | frozenset[int] = frozenset()) -> OpenPart:
        try:
            disk = self._config().disks.get(part.disk)
            if disk is None:
                raise CatalogError(f"part {part.path} is on disk {part.disk!r}, which the "
                                   "config does not define")
            op = open_part(disk, part)
            if key is not None:
                op.key_range(key)  # reads the key's statistics before anyone shares op
                self._read_keys_ahead(op, key, numbers)
            with self._lock:
                if generation == self._generation:
                    self._items[part.id] = op
                    while len(self._items) > self._limit:
                        self._items.popitem(last=False)
            return op
        finally:
            if ahead:  # no longer in flight
                with self._lock:
                    self._opening.pop(part.id, None)

    def forget(self, part_id: str) -> None:
        """Drop part ``part_id`` (the catalog no longer names it): its footer and any key
        column read ahead go with the last scan still holding them."""
        with self._lock:
            self._items.pop(part_id, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._opening.clear()
            self._generation += 1


class TableScan:
    """One table as DuckDB reads it: ``columns`` only, skipping what ``filters`` rule out."""

    def __init__(self, parts: OpenParts, meta: TableMeta, schema: pa.Schema,
                 columns: list[str], filters: list[Filter],
                 cache: ColumnCache | StatementCache | None,
                 top: TopN | None = None, extremes: bool = False,
                 derived: list[DerivedColumn] | None = None, name: str | None = None,
                 where: str | None = None, alias: str = "",
                 head: tuple[int, int] | None = None) -> None:
        self._open_parts, self._meta, self._cache = parts, meta, cache
        self.name = name or meta.name
        self.columns = columns
        #: field functions' values computed per row group (see ._derived), after columns
        self.derived = list(derived or [])
        #: a derived view's WHERE (SQL over ``columns``, qualified by ``alias``): each row
        #: group's rows are kept by it first, and the functions computed for those only
        self.where, self._alias = (where, alias) if derived else (None, "")
        self._filters = filters
        self._top = top if top is not None and top.limit > 0 and top.column in columns else None
        #: ``(rows, blank)``: the query wants only the scan's first ``rows`` rows (a LIMIT
        #: with no ORDER BY), of which the first ``blank`` are never looked at (its OFFSET)
        #: (a LIMIT past the table's rows is a full scan: read as one, in runs)
        self._head = head if (head is not None and columns and not filters and not derived
                              and self._top is None and not extremes
                              and head[0] < meta.rows) else None
        self._types = {f.name: f.type for f in schema}
        self._parts = list(meta.parts)
        self._key = meta.key
        # the query wants only min/max of the (integer) key: parts' key ranges answer
        self._extremes = extremes and columns == [self._key] and not filters and not derived
        if columns or self.derived:
            self.schema = pa.schema([schema.field(c) for c in columns] +
                                    [pa.field(d.name, pa.string()) for d in self.derived])
        else:  # the query reads no column (count(*)): rows come from the catalog
            self.schema = pa.schema([pa.field(schema.names[0], pa.null())])
        self._streams: list[_Stream] = []
        self._primed: _Stream | None = None  # started by prefetch, not yet taken by DuckDB
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self.row_groups_read = 0
        #: row groups of which only the granules the key's filters leave were decoded
        self.granule_reads = 0
        # filters on an integer key, for which a row group's matching rows are found
        key_type = self._types.get(self._key) if self._key is not None else None
        self._key_filters = [  # (a derived view's rows are whole row groups)
            f for f in filters if f.column == self._key and key_type is not None
            and not self.derived
            and pa.types.is_integer(key_type) and f.column in columns
            and all(_plain_int(v) for v in (f.lo, f.hi, *(f.values or ())) if v is not None)]
        self.row_groups_skipped = 0
        self.parts_skipped = 0
        self.parts_from_index = 0
        #: filters on a numeric column but the key, checked against its granule bounds
        #: (:meth:`OpenPart.column_granules`) when the scan reads no derived column (with
        #: the key's filters, a granule is read when both its bounds and the key's may
        #: hold a wanted row)
        self._granule_filters = [
            f for f in filters if f.column != self._key and f.column in columns
            and not self.derived and self.where is None
            and (pa.types.is_integer(self._types[f.column])
                 or pa.types.is_floating(self._types[f.column]))]
        #: (part id, row group) -> the runs of rows ``(first, end)`` of the granules those
        #: filters leave, for a row group of which they leave at most half
        self._sparse: dict[tuple[str, int], list[tuple[int, int]]] = {}
        #: (part id, row group, column) -> a column chunk read whole for granules of it
        #: (:meth:`_whole`): being read, or among the last few read
        self._wholes: collections.OrderedDict[tuple[str, int, str], Future[Any]] = \
            collections.OrderedDict()
        self._wholes_lock = threading.Lock()
        ranked = parts_ranked_open() if self._top is not None else None
        if ranked is not None and len(self._parts) > ranked and sum(
                1 for p in self._parts if p.rows and self._part_may_match(p)) > ranked:
            # a top-N's plan ranks every part's row groups before reading any, holding
            # every part open (a descriptor each): over more parts than a quarter of the
            # limit of open files the scan streams them in table order instead, and DuckDB
            # sorts (OPTIMIZE TABLE merges the parts)
            self._top = None

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.schema, self.batches())
        return reader.__arrow_c_stream__(requested_schema)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """One scan's batches in table order: the stream :meth:`prefetch` started, else a
        new one (stopped by :meth:`close` if not read to its end)."""
        with self._lock:
            stream, self._primed = self._primed, None
            if stream is None:
                stream = _Stream(self)
                self._streams.append(stream)
        return stream.batches()

    def prefetch(self) -> None:
        """Start the first scan now, before DuckDB asks for it: plan it and set its first
        row groups reading on the pool while DuckDB binds and plans the query (a point
        query's one row group decodes meanwhile). DuckDB's first scan of the table takes
        this stream; a stream nobody takes is stopped by :meth:`close`."""
        if not self.columns and not self.derived:
            return  # no part to read (count(*)): rows come from the catalog
        stream = _Stream(self)
        with self._lock:
            self._streams.append(stream)
            self._primed = stream
        opening = self._open_parts.in_flight(self._parts) if self._top is not None else []
        if opening:  # a top-N: planned and read once its parts open, on the opening thread
            stream.start_after(opening)
        else:
            stream.start()

    def close(self) -> None:
        """Stop every stream still running (a LIMIT, an error)."""
        with self._lock:
            streams, self._streams, self._primed = self._streams, [], None
        for s in streams:
            s.close()

    def cached_table(self) -> pa.Table | None:
        """The scan's rows as one Arrow table if every row group it needs is in the cache.

        DuckDB scans a table on all its threads (a stream has one producer), so
        a warm query gets it; None when anything is missing (the scan streams).
        """
        cache = self._cache
        if cache is None or not len(cache) or not (self.columns or self.derived) \
                or self._extremes:
            return None  # (an empty cache: no part is opened to find that out)
        if self._head is not None:
            return self._cached_head(cache)
        if self._top is not None and not self.derived and self.where is None:
            return self._cached_top()
        wanted = [(c, c) for c in self.columns] + [(d.name, d.cache_name) for d in self.derived]
        chunks: dict[str, list[Any]] = {c: [] for c, _k in wanted}
        for part in self._parts:
            if not self._part_may_match(part):
                continue
            op = self._open_parts.get(part)
            for rg in self._row_groups(op):
                key = f"{part.id}/{rg}"
                keep = None
                if self.where is not None:  # the rows the WHERE keeps, as the stream gives
                    keep = cache.get(key, where_name(self.where))
                    if keep is None:
                        return None
                    keep = _one(keep)
                got = {}
                for c, k in wanted:
                    arr = cache.get(key, k)
                    if arr is None:
                        return None
                    if keep is not None and c in self.columns:
                        arr = arr.filter(keep)
                    got[c] = arr
                span = None
                if self._key_filters and self._key in got:  # the rows the key's filters
                    got[self._key] = _one(got[self._key])      # may keep, not the row group
                    span = _key_span(got[self._key], self._key_filters)
                for c, arr in got.items():
                    if span is not None:
                        arr = arr.slice(span[0], span[1] - span[0])
                    chunks[c].extend(arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr])
        return _table(chunks, self.schema)

    def _cached_head(self, cache: ColumnCache | StatementCache) -> pa.Table | None:
        """A LIMIT's first rows as one Arrow table (slices of cached row groups, no copy)
        if every row group they come from is cached; None otherwise."""
        assert self._head is not None
        need = self._head[0]
        chunks: dict[str, list[Any]] = {c: [] for c in self.columns}
        before = 0
        for part in self._parts:
            if before >= need:
                break
            if not part.rows:
                continue
            op = self._open_parts.get(part)
            for rg in self._row_groups(op):
                if before >= need:
                    break
                n = op.rows(rg)
                key = f"{part.id}/{rg}"
                for c in self.columns:
                    arr = cache.get(key, c)
                    if arr is None:
                        return None
                    chunks[c].append(_one(arr).slice(0, min(n, need - before)))
                before += n
        return _table(chunks, self.schema)

    def _cached_top(self) -> pa.Table | None:
        """A top-N's rows as one Arrow table if every row group it reads is cached: the
        scan's own plan (:meth:`_Stream._top_tasks`, row groups beaten by the statistics
        or by the rows seen skipped) run here, each row group trimmed as the stream
        trims it (on a part sorted by the column, the first ``n`` rows: slices, no
        copy); None, and nothing counted, when one is missing (the scan streams)."""
        top = self._top
        assert top is not None
        counts = (self.parts_skipped, self.row_groups_skipped, self.row_groups_read)
        stream = _Stream(self)
        batches = []
        for op, rg, (bound, span) in stream._top_tasks(top):
            if bound is not None and stream._beaten(bound, top):
                if span is None:
                    self.row_groups_skipped += 1
                continue
            if not self.cached(op, rg):
                self.parts_skipped, self.row_groups_skipped, self.row_groups_read = counts
                return None
            batch = self._read_group(op, rg, {})
            if span is None:
                batch = stream._trim(batch, top)
                self.row_groups_read += 1
            else:  # rows of a row group ranked by its granules
                batch = batch.slice(span[0], span[1] - span[0])
                stream._touch(op, rg)
            stream._see(batch, top)
            batches.append(batch)
        stream._settle()
        return pa.Table.from_batches(batches, schema=self.schema)

    def blank(self, rows: int) -> list[pa.RecordBatch]:
        """``rows`` rows of NULLs in the scan's schema, in batches: rows a LIMIT's OFFSET
        drops, handed over without reading them."""
        out = []
        for start in range(0, rows, _NULL_BATCH):
            n = min(_NULL_BATCH, rows - start)
            out.append(pa.RecordBatch.from_arrays([pa.nulls(n, f.type) for f in self.schema],
                                                  schema=self.schema))
        return out

    def read_head(self, op: OpenPart, rg: int, blank: int, end: int) -> list[pa.RecordBatch]:
        """Rows ``0..end`` of row group ``rg`` for a LIMIT, of which the first ``blank`` are
        NULLs (its OFFSET drops them) and the others decoded from the pages that hold them
        (:meth:`OpenPart.read_rows`). A column cached, or read before in this statement's
        cache view, or one the granule reader does not describe, is taken from its whole
        column chunk (through the cache, as any read)."""
        cache = self._cache
        ckey = f"{op.part.id}/{rg}"
        if cache is not None and (self.cached(op, rg) or any(
                cache.offered(ckey, c) for c in self.columns)):
            # decoded already, or read before: read whole so the cache keeps it for repeats
            return [self._read_group(op, rg, {}).slice(0, end)]
        arrays, paged = [], 0
        for field in self.schema:
            c = field.name
            col = op.read_rows(rg, c, blank, end)
            if col is None:  # not by page (narrow and not indexed, or not described)
                whole = cache.get(ckey, c) if cache is not None else None
                if whole is None:
                    whole = op.read([rg], [c]).column(c)
                    if cache is not None:
                        cache.put(ckey, c, whole)
                col = _one(whole).slice(blank, end - blank)
            else:
                paged += 1
                if cache is not None:
                    cache.offer(ckey, c)
            if col.type != field.type:
                col = col.cast(field.type)
            arrays.append(col)
        if paged:
            self.granule_reads += 1
        rows = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        return [*self.blank(blank), rows] if blank else [rows]

    def stats(self) -> dict[str, int]:
        """Parts skipped by their key range, or answered by it (min/max of the key); row
        groups read and skipped, and of those read, how many only in the granules that
        the key's filters leave (all scans so far)."""
        return {"parts_skipped": self.parts_skipped, "row_groups_read": self.row_groups_read,
                "row_groups_skipped": self.row_groups_skipped,
                "parts_from_index": self.parts_from_index, "granule_reads": self.granule_reads}

    def to_table(self) -> pa.Table:
        stream = _Stream(self)
        try:
            return pa.Table.from_batches(list(stream.batches()), schema=self.schema)
        finally:
            stream.close()

    # -- planning -------------------------------------------------------------------

    def _part_may_match(self, part: PartMeta) -> bool:
        lo, hi = getattr(part, "key_min", None), getattr(part, "key_max", None)
        if self._key is None or lo is None or hi is None:
            return True
        typ = self._types[self._key]
        return all(may_match(f, typ, lo, hi) for f in self._filters if f.column == self._key)

    def _row_groups(self, op: OpenPart) -> list[int]:
        part = op.part
        if (self._key is not None and getattr(part, "key_min", None) is not None
                and not op.key_checked):
            found = op.key_range(self._key)
            if found is None or tuple(found) != (part.key_min, part.key_max):
                raise CatalogError(
                    f"part {part.path} on disk {op.disk.name!r}: its key range in the catalog "
                    f"({part.key_min!r}..{part.key_max!r}) does not match the part's own "
                    "index (tampered with, or a different part)",
                    hint="restore the database from a backup")
            op.key_checked = True
        if not self._filters:
            return list(self._candidates(op))
        grains, mask, by_granule = None, None, set()
        for f in self._granule_filters:  # (their columns' granule bounds: no footer parse)
            got = op.column_granules(f.column)
            if got is None:
                continue
            found = _granules_may_match(f, self._types[f.column], got)
            if found is None:
                continue
            grains, mask = got, found if mask is None else mask & found
            by_granule.add(id(f))
        keep = []
        for rg in self._candidates(op):
            ok = True
            for f in self._filters:
                if id(f) in by_granule:
                    continue
                st = op.stats(rg, f.column)
                if st is not None and not may_match(f, self._types[f.column], *st):
                    ok = False
                    break
            if ok and grains is not None and mask is not None:
                starts, _rgs, first, end = grains[:4]
                a, b = starts[rg], starts[rg + 1]
                hits = np.flatnonzero(mask[a:b] & self._key_granules(op, rg, first[a:b])) + a
                if not len(hits):
                    ok = False
                elif 2 * int((end[hits] - first[hits]).sum()) <= op.rows(rg):
                    runs: list[tuple[int, int]] = []
                    for i in hits.tolist():
                        lo, hi = int(first[i]), int(end[i])
                        if runs and runs[-1][1] == lo:
                            runs[-1] = (runs[-1][0], hi)
                        else:
                            runs.append((lo, hi))
                    self._sparse[(op.part.id, rg)] = runs
            if ok:
                keep.append(rg)
        return keep

    def _key_granules(self, op: OpenPart, rg: int, firsts: Any) -> Any:
        """Which of row group ``rg``'s granules (first rows ``firsts``, as
        :meth:`OpenPart.column_granules` cuts them) the key's filters may keep by the key's
        granule bounds: a NumPy boolean array (all True without key filters, or when the
        key's granules are not known or not cut so)."""
        if not self._key_filters:
            return True
        found = op.granules(rg, self._key) if self._key is not None else None
        if found is None or [g[0] for g in found] != firsts.tolist():
            return True
        return np.array([self._may_keep(lo, hi) for _first, _end, lo, hi in found],
                        dtype=bool)

    def _candidates(self, op: OpenPart) -> range:
        """The row groups that filters on a column the part is sorted by leave (bisection;
        the others are then checked one by one)."""
        first, end = 0, op.num_row_groups
        for f in self._filters:
            typ = self._types[f.column]
            if not (pa.types.is_integer(typ) or pa.types.is_string(typ)
                    or pa.types.is_large_string(typ)):
                continue  # floating: NaN and the comparison slack, see may_match
            bounds = op.sorted_bounds(f.column)
            if bounds is None:
                continue
            mins, maxs = bounds
            try:
                if f.lo is not None:  # a row group can match only if its max >= lo
                    first = max(first, bisect.bisect_left(maxs, f.lo))
                if f.hi is not None:  # ... and its min <= hi
                    end = min(end, bisect.bisect_right(mins, f.hi))
            except TypeError:  # a filter value of another type: may_match decides
                continue
        return range(first, max(first, end))

    def cached(self, op: OpenPart, rg: int) -> bool:
        key = f"{op.part.id}/{rg}"
        where = [where_name(self.where)] if self.where is not None else []
        return self._cache is not None and all(
            self._cache.contains(key, c)
            for c in self.columns + [d.cache_name for d in self.derived] + where)

    def uncached(self, op: OpenPart, rg: int) -> bool:
        """Whether no column of the scan's (stored or derived) is cached for row group ``rg``."""
        key = f"{op.part.id}/{rg}"
        return self._cache is None or not any(
            self._cache.contains(key, c)
            for c in self.columns + [d.cache_name for d in self.derived])

    def read_columns(self) -> list[str]:
        """The stored columns a read of the scan decodes: its own, then the base columns
        of its derived ones (computed from, not handed to DuckDB nor cached)."""
        out = list(self.columns)
        for d in self.derived:
            if d.column not in out:
                out.append(d.column)
        return out

    def read_groups(self, op: OpenPart, groups: list[int]) -> list[pa.RecordBatch]:
        """Consecutive row groups of ``op`` none of whose columns is cached, read at once
        (one decryption pass and one Parquet reader for all), a batch per row group; each
        row group goes through the cache as :meth:`read_group` would put it, and its
        derived columns are computed from its own rows."""
        if len(groups) == 1:
            return [self.read_group(op, groups[0])]
        cache = self._cache
        keys = [f"{op.part.id}/{rg}" for rg in groups]
        # One batch for the run when no row group of it is kept by the cache (a first
        # offer only remembers it: a cold scan) and nothing is computed per row group:
        # each column stored as its values is then one buffer (see OpenPart.read), the
        # run one batch for DuckDB, and the Python per row group (slices, batches, the
        # stream's hand-over) is paid once a run.
        joined = not self.derived and self.where is None and (cache is None or not any(
            cache.offered(k, c) for k in keys for c in self.columns))
        table = op.read(groups, self.read_columns(), joined)
        if joined and all(col.num_chunks == 1 for col in table.columns):
            if cache is not None:
                for k in keys:
                    for c in self.columns:
                        cache.offer(k, c)
            return [self._batch({c: table.column(c) for c in table.column_names})]
        out, start = [], 0
        for rg in groups:
            n = op.rows(rg)
            part = table.slice(start, n)
            start += n
            got = {}
            for c in part.column_names:
                arr = part.column(c)
                if self._cache is not None and c in self.columns:
                    self._cache.put(f"{op.part.id}/{rg}", c, arr)
                got[c] = arr
            out.append(self._finish(f"{op.part.id}/{rg}", got))
        return out

    def read_group(self, op: OpenPart, rg: int) -> pa.RecordBatch:
        """Row group ``rg`` of ``op``, the scan's columns, through the cache; only the rows
        the key's filters leave when they leave few (see :meth:`_read_granules`)."""
        got: dict[str, Any] = {}
        runs = self._sparse.get((op.part.id, rg)) if self._sparse else None
        if runs is not None:
            found = self._read_runs(op, rg, runs)
            if found is not None:
                return found
        if self._key_filters and len(self.columns) > 1:
            found = self._read_granules(op, rg, got)
            if found is not None:
                return found
        if self._top is not None and self._top.column == self._key:
            found = self._read_top_granules(op, rg)
            if found is not None:
                return found
        return self._read_group(op, rg, got)

    def _read_top_granules(self, op: OpenPart, rg: int) -> pa.RecordBatch | None:
        """For ``ORDER BY key LIMIT n``: the rows of row group ``rg`` from the first to the
        last granule that may hold one of the row group's ``n`` first keys in that order,
        decoding only those pages of each column; None when that is more than half the
        row group (or the part has no granule bounds of the key, or the row group was read
        before), and the row group is read whole.

        The granules taken best-first by their key bound until they hold ``n`` rows have
        every key within the worst of their bounds, so a granule whose every key is
        strictly worse has at least ``n`` rows ahead of each of its rows in this row group
        alone and cannot reach the result. On a part sorted by the key that is its first
        granule (its last for a descending order)."""
        top, key, cache = self._top, self._key, self._cache
        assert top is not None and key is not None
        if self.derived or self.where is not None:
            return None
        ckey = f"{op.part.id}/{rg}"
        if cache is not None and any(
                cache.offered(ckey, c) or cache.contains(ckey, c) for c in self.columns):
            return None  # read before: read whole (the cache keeps it for warm repeats)
        granules = op.granules(rg, key)  # (only for a key without NULL)
        if not granules:
            return None
        desc = top.descending
        ranked = sorted(granules, key=lambda g: -g[3] if desc else g[2])
        worst, taken = None, 0
        for first, end, lo, hi in ranked:
            edge = lo if desc else hi
            worst = edge if worst is None else (min(worst, edge) if desc else max(worst, edge))
            taken += end - first
            if taken >= top.limit:
                break
        else:
            return None  # fewer rows than the limit: all of them may be wanted
        kept = [g for g in granules if (g[3] >= worst if desc else g[2] <= worst)]
        first, end = kept[0][0], kept[-1][1]
        edge = max(g[3] for g in kept) if desc else min(g[2] for g in kept)
        found = self._top_rows(op, rg, first, end, edge)
        if found is not None:
            return found
        if 2 * (end - first) > op.rows(rg):
            return None
        return self._paged_rows(op, rg, first, end)

    def _top_rows(self, op: OpenPart, rg: int, first: int, end: int, edge: int
                  ) -> pa.RecordBatch | None:
        """Of rows ``first..end`` of row group ``rg`` (the granules that may reach an
        ``ORDER BY key LIMIT n``), the ``n`` that do: a part holds its rows in key order,
        so they are the span's first ``n`` (its last ``n`` when descending), decoded from
        the bytes that hold them only (:meth:`OpenPart.read_page_rows`; a LIMIT 10
        decrypts one segment of each column, not the granule's pages). The key's ``n + 1``
        rows are read first: they must ascend from the span's bound ``edge`` and the one
        past the cut sort strictly after the ``n``-th (a tie there, and anything else, is
        None: the granules are read whole, and DuckDB picks among the tied rows)."""
        top, key = self._top, self._key
        assert top is not None and key is not None
        n = top.limit
        if end - first <= n + 1:
            return None
        a, b = (end - n - 1, end) if top.descending else (first, first + n + 1)
        keys = op.read_page_rows(rg, key, a, b)
        if keys is None or keys.null_count or len(keys) != b - a:
            return None
        values = _few_integers(keys)  # (not NumPy: see _few_integers)
        if values is None or not all(map(operator.le, values, values[1:])):
            return None
        if top.descending:
            if values[-1] != edge or values[0] == values[1]:
                return None
            a, keys = a + 1, keys.slice(1)
        else:
            if values[0] != edge or values[-1] == values[-2]:
                return None
            b, keys = b - 1, keys.slice(0, n)
        cache = self._cache
        ckey = f"{op.part.id}/{rg}"
        arrays = []
        for field in self.schema:
            c = field.name
            col = keys if c == key else op.read_page_rows(rg, c, a, b)
            if col is None:  # not one page of PLAIN values: the pages holding the rows
                col = op.read_rows(rg, c, a, b)
                if col is None:  # narrow and not indexed, or not by page: the chunk, sliced
                    col = _one(self._whole(op, rg, c).slice(a, b - a))
            if cache is not None:
                cache.offer(ckey, c)  # (its next read is whole, and kept)
            if col.type != field.type:
                col = col.cast(field.type)
            arrays.append(col)
        self.granule_reads += 1
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _read_runs(self, op: OpenPart, rg: int, runs: list[tuple[int, int]]
                   ) -> pa.RecordBatch | None:
        """The rows of row group ``rg`` in ``runs`` (the granules that the filters on
        columns but the key may keep, by their bounds), decoding only those pages; None
        when the row group was read before (read whole: the cache keeps it). DuckDB
        applies the whole WHERE again, so a superset of the matching rows is enough."""
        if self._read_before(op, rg):
            return None
        batches = [self._paged_rows(op, rg, first, end) for first, end in runs]
        if len(batches) == 1:
            return batches[0]
        return pa.RecordBatch.from_arrays(
            [pa.concat_arrays([b.column(j) for b in batches]) for j in range(len(self.schema))],
            schema=self.schema)

    def _read_before(self, op: OpenPart, rg: int) -> bool:
        """Whether row group ``rg`` is cached or one of the scan's columns of it was read
        before (offered to the cache): then it is read whole, so the cache keeps it."""
        cache = self._cache
        ckey = f"{op.part.id}/{rg}"
        return cache is not None and (self.cached(op, rg) or any(
            cache.offered(ckey, c) for c in self.columns))

    def read_span(self, op: OpenPart, rg: int, first: int, end: int) -> list[pa.RecordBatch]:
        """Rows ``first..end`` of row group ``rg`` (a top-N's granule): decoded from the
        pages that hold them (:meth:`_paged_rows`), or sliced from the whole row group
        when it is cached or was read before (read whole then, so the cache keeps it for
        warm repeats, as :meth:`_read_top_granules` does)."""
        if self._read_before(op, rg):
            batch = self._read_group(op, rg, {})
            return [batch if first == 0 and end == batch.num_rows
                    else batch.slice(first, end - first)]
        return [self._paged_rows(op, rg, first, end)]

    def _paged_rows(self, op: OpenPart, rg: int, first: int, end: int) -> pa.RecordBatch:
        """Rows ``first..end`` of row group ``rg``, the scan's columns, decoding only the
        pages that hold them (a column that cannot be read so is read whole and sliced);
        each column is offered to the cache (its next read is whole, and kept)."""
        cache = self._cache
        ckey = f"{op.part.id}/{rg}"
        arrays = []
        paged = _read_rows_at_once(op, rg, self.schema.names, first, end)
        for field in self.schema:
            c = field.name
            col = paged[c]
            if col is None:  # narrow and not indexed, or not by page: the chunk, sliced
                col = _one(self._whole(op, rg, c).slice(first, end - first))
            elif cache is not None:
                cache.offer(ckey, c)
            if col.type != field.type:
                col = col.cast(field.type)
            arrays.append(col)
        self.granule_reads += 1
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _whole(self, op: OpenPart, rg: int, column: str) -> Any:
        """Column chunk ``column`` of row group ``rg``, whole, for granules of it
        (:meth:`_paged_rows`): from the cache, else decoded once for the scan: a granule
        of the same row group in flight on another thread (a top-N's, or a filter's next
        run) takes the chunk that thread reads (waiting for its decode, never for the
        cache) instead of decoding it again. The last few chunks (one per row group in
        flight) stay with the scan."""
        key = (op.part.id, rg, column)
        with self._wholes_lock:
            found = self._wholes.get(key)
            if found is None:
                mine: Future[Any] = Future()
                self._wholes[key] = mine
                while len(self._wholes) > 2 * scan_workers():
                    self._wholes.popitem(last=False)
        if found is not None:
            return found.result()
        cache, ckey = self._cache, f"{op.part.id}/{rg}"
        try:
            whole = cache.get(ckey, column) if cache is not None else None
            if whole is None:
                whole = op.read([rg], [column]).column(column)
                if cache is not None:
                    cache.put(ckey, column, whole)
        except BaseException as exc:
            with self._wholes_lock:
                if self._wholes.get(key) is mine:
                    del self._wholes[key]
            mine.set_exception(exc)
            raise
        mine.set_result(whole)
        return whole

    def _read_granules(self, op: OpenPart, rg: int,
                       got: dict[str, Any]) -> pa.RecordBatch | None:
        """The rows of row group ``rg`` that the filters on the key may keep, decoding the
        key's column chunk whole and, of the other columns, only the pages (granules)
        holding those rows; None when the key's filters keep more than half the rows (or
        cannot be checked here), and the row group is read whole.

        While the key's column is read, the columns read whole either way (narrow ones,
        and those the granule reader does not describe) are read on another scan thread
        and the page headers of the others are walked, so a point query's reads overlap.

        DuckDB applies the whole WHERE again, so handing it a superset of the matching
        rows is enough. The key's column goes through the cache like any column; the
        granules of the others are not kept (the cache holds whole row groups), but count
        as a first offer: the row group's next read is whole, and the cache keeps it
        (a query's third run answers from the cache as before).
        """
        key = self._key
        assert key is not None
        cache = self._cache
        ckey = f"{op.part.id}/{rg}"
        others = [c for c in self.columns if c != key]
        if cache is not None and any(cache.offered(ckey, c) for c in others):
            return None  # read before: read whole, so the cache keeps it for warm repeats
        if cache is not None and all(cache.contains(ckey, c) for c in self.columns):
            return self._cached_span(ckey)  # all decoded already
        wholes: dict[str, Any] = {}  # columns read whole: cached, or read beside the key
        for c in others:
            arr = cache.get(ckey, c) if cache is not None else None
            if arr is not None:
                wholes[c] = arr
        paged = [c for c in others if c not in wholes and op.by_granule(rg, c)]
        unpaged = [c for c in others if c not in wholes and c not in paged]
        side = _pool().submit(op.read, [rg], unpaged) if unpaged else None
        try:
            return self._granules(op, rg, got, paged, wholes, unpaged, side)
        finally:
            if side is not None and not side.cancel():
                side.exception()  # (never left running: a failed read raised above)

    def _cached_span(self, ckey: str) -> pa.RecordBatch | None:
        """Of a row group whose columns are all cached, the rows from the first to the last
        that the key's filters may keep (slices, no copy); None if one went meanwhile."""
        assert self._cache is not None and self._key is not None
        got: dict[str, Any] = {}
        for c in self.columns:
            arr = self._cache.get(ckey, c)
            if arr is None:
                return None
            got[c] = _one(arr)
        span = _key_span(got[self._key], self._key_filters)
        if span is None:
            return None
        return self._batch({c: a.slice(span[0], span[1] - span[0]) for c, a in got.items()})

    def _granules(self, op: OpenPart, rg: int, got: dict[str, Any], paged: list[str],
                  wholes: dict[str, Any], unpaged: list[str],
                  side: Future[pa.Table] | None) -> pa.RecordBatch | None:
        key = self._key
        assert key is not None
        cache = self._cache
        ckey = f"{op.part.id}/{rg}"
        arr = cache.get(ckey, key) if cache is not None else None
        rows = op.rows(rg)
        base = 0  # the row of the row group that arr starts at
        # the rows of the granules whose key bounds the filters may keep
        need = None if arr is not None else op.granule_rows(rg, key, self._may_keep)
        ahead = op.key_reads.pop(rg, None)  # read while DuckDB parsed the statement
        # the other columns' pages of the granules the key's bounds leave, decoded while the
        # key is read (the rows the key keeps lie in them): need[0] -> column -> rows
        narrow = need is not None and need != (0, 0) and 2 * (need[1] - need[0]) <= rows
        early: dict[str, pa.Array] = {}
        # (one not started yet is read here: a pool thread never waits for a queued task)
        if arr is None and ahead is not None and not ahead.cancel():
            if not ahead.done() and narrow:  # the key is still being read: decode meanwhile
                assert need is not None
                for c in paged:
                    if ahead.done():
                        break
                    col = op.read_rows(rg, c, need[0], need[1])
                    if col is not None:
                        early[c] = col
            elif not ahead.done():  # find the pages meanwhile
                until = _row_estimate(op.stats(rg, key), rows, self._key_filters)
                for c in paged:
                    op.page_index(rg, c, until=until)
            found = ahead.result()
            if found is not None and found[0] == 0 and len(found[1]) == rows:
                arr = found[1]  # the whole chunk
                if cache is not None:
                    cache.put(ckey, key, arr)
            elif found is not None and need is not None and need != (0, 0) and \
                    found[0] <= need[0] < found[0] + len(found[1]):
                # granules read ahead for a number the statement names; a range reaching
                # past them (BETWEEN a AND b, b in a later granule) reads the rest only
                base, arr = found
                stop = base + len(arr)
                if need[1] > stop:
                    rest = op.read_rows(rg, key, stop, need[1])
                    arr = None if rest is None else pa.concat_arrays([arr, rest])
        if arr is None:
            base = 0
        if arr is None and need == (0, 0):  # no granule may hold a wanted key
            arr = pa.array([], self._types[key])
        elif arr is None and need is not None:  # the key's pages of those granules only
            if narrow and paged:  # the others' pages of them decode on the pool meanwhile
                assert need is not None
                todo = [c for c in paged if c not in early]
                got_all = _read_rows_at_once(op, rg, [key, *todo], need[0], need[1])
                arr = got_all.pop(key)
                early.update((c, col) for c, col in got_all.items() if col is not None)
            else:
                arr = op.read_rows(rg, key, need[0], need[1])
            base = need[0] if arr is not None else 0
        if arr is None:
            arr = op.read([rg], [key]).column(key)
            if cache is not None:
                cache.put(ckey, key, arr)
        if base == 0 and len(arr) == rows:
            got[key] = arr  # a row group read whole after all does not decode it again

        def take_side() -> None:  # the columns read whole beside the key, cached as usual
            if side is None:
                return
            table = side.result() if not side.cancel() else op.read([rg], unpaged)
            for c in unpaged:
                wholes[c] = table.column(c)
                if cache is not None:
                    cache.put(ckey, c, wholes[c])

        if isinstance(arr, pa.ChunkedArray):
            arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
        span = _key_span(arr, self._key_filters)
        if span is None or 2 * (span[1] - span[0]) > rows:
            take_side()
            got.update(wholes)  # read whole: not decoded again
            return None
        first, end = span[0] + base, span[1] + base
        pages: dict[str, Any] = {}  # this thread decodes pages while the other reads
        if end > first:
            todo = []
            for c in paged:
                col = early.get(c)
                if col is not None and need is not None and need[0] <= first and \
                        end <= need[0] + len(col):
                    pages[c] = col.slice(first - need[0], end - first)
                else:
                    todo.append(c)
            for c, col in _read_rows_at_once(op, rg, todo, first, end).items():
                if col is not None:
                    pages[c] = col
            take_side()
        arrays = []
        for field in self.schema:
            c = field.name
            if c == key:
                col = arr.slice(first - base, end - first)
            elif end == first:
                col = pa.nulls(0, field.type)
            elif c in pages:
                col = pages[c]
            else:  # cached, or narrow, or not a column the granule reader describes
                whole = wholes.get(c)
                if whole is None:
                    whole = op.read([rg], [c]).column(c)
                    if cache is not None:
                        cache.put(ckey, c, whole)
                col = whole.slice(first, end - first)
            if isinstance(col, pa.ChunkedArray):
                col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            if col.type != field.type:
                col = col.cast(field.type)
            arrays.append(col)
        if cache is not None:
            for c in pages:
                cache.offer(ckey, c)
            if key not in got:  # the key's granules only: its next read is whole, and kept
                cache.offer(ckey, key)
        if pages or end == first:
            self.granule_reads += 1
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _may_keep(self, lo: int, hi: int) -> bool:
        """Whether the key's filters may keep a key between ``lo`` and ``hi``."""
        for f in self._key_filters:
            if f.values is not None:
                if not any(lo <= v <= hi for v in f.values):
                    return False
            elif (f.lo is not None and hi < f.lo) or (f.hi is not None and lo > f.hi):
                return False
        return True

    def _read_group(self, op: OpenPart, rg: int, got: dict[str, Any]) -> pa.RecordBatch:
        missing = []
        cache = self._cache
        key = f"{op.part.id}/{rg}"
        for c in self.columns:
            arr = got.get(c)
            if arr is None and cache is not None:
                arr = cache.get(key, c)
            if arr is None:
                missing.append(c)
            else:
                got[c] = arr
        todo = []
        for d in self.derived:
            arr = cache.get(key, d.cache_name) if cache is not None else None
            if arr is None:
                todo.append(d)
                if d.column not in got and d.column not in missing:
                    missing.append(d.column)
            else:
                got[d.name] = arr
        if missing:
            table = op.read([rg], missing)
            for c in missing:
                arr = table.column(c)
                if cache is not None and c in self.columns:  # (not one read only for
                    cache.put(key, c, arr)                   # a derived column's values)
                got[c] = arr
        return self._finish(key, got)

    def _finish(self, key: str, got: dict[str, Any]) -> pa.RecordBatch:
        """Row group ``key``'s batch from its stored columns in ``got``: the rows the
        WHERE keeps (if any), then the derived columns computed for those rows."""
        if self.where is not None:
            keep = self._kept(key, got)
            for c in self.read_columns():
                if c in got:
                    got[c] = _one(got[c]).filter(keep)
        self._derive(key, self.derived, got)
        return self._batch(got)

    def _kept(self, key: str, got: dict[str, Any]) -> pa.Array:
        """The rows of row group ``key`` its WHERE keeps (a boolean mask), through the
        cache; evaluated by this thread's own DuckDB connection on the stored columns."""
        assert self.where is not None
        cache, name = self._cache, where_name(self.where)
        keep = cache.get(key, name) if cache is not None else None
        if keep is not None:
            return _one(keep)
        table = pa.table({c: _one(got[c]) for c in self.columns})
        try:
            keep = _rows_kept(table, self.where, self._alias)
        except Exception as exc:  # the statement runs again without derived columns
            raise DerivedFailed(f"{self.name}: the scan could not apply the WHERE: "
                                f"{type(exc).__name__}") from exc
        if cache is not None:
            cache.put(key, name, pa.chunked_array([keep]))
        return keep

    def _derive(self, key: str, derived: list[DerivedColumn], got: dict[str, Any]) -> None:
        """Put ``derived``'s values for row group ``key`` into ``got`` (which holds their
        base columns): from the cache, else computed and offered to it."""
        cache = self._cache
        for d in derived:
            arr = cache.get(key, d.cache_name) if cache is not None else None
            if arr is None:
                base = got[d.column]
                if isinstance(base, pa.ChunkedArray):
                    base = base.chunk(0) if base.num_chunks == 1 else base.combine_chunks()
                try:
                    arr = d.compute(base)
                except Exception as exc:  # the statement runs again without derived columns
                    raise DerivedFailed(f"{self.name}: a field function failed in the scan: "
                                        f"{type(exc).__name__}") from exc
                if cache is not None:
                    cache.put(key, d.cache_name, pa.chunked_array([arr]))
            got[d.name] = arr

    def _batch(self, got: dict[str, Any]) -> pa.RecordBatch:
        arrays = []
        for field in self.schema:
            arr = got[field.name]
            if arr.type != field.type:
                arr = arr.cast(field.type)
            if isinstance(arr, pa.ChunkedArray):  # (combine_chunks copies even one chunk)
                arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
            arrays.append(arr)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def _table(chunks: dict[str, list[Any]], schema: pa.Schema) -> pa.Table:
    """A table of ``schema`` from each column's chunks, cast where a cached column is kept
    as read (a TIMESTAMP_S column reads back as timestamp[ms]), as the stream casts it."""
    return pa.Table.from_arrays(
        [pa.chunked_array([c if c.type == f.type else c.cast(f.type) for c in chunks[f.name]],
                          type=f.type) for f in schema], schema=schema)


def _one(arr: Any) -> pa.Array:
    """One Arrow array from an array or a chunked one."""
    if isinstance(arr, pa.ChunkedArray):
        return arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    return arr


_LOCAL = threading.local()


def _rows_kept(table: pa.Table, where: str, alias: str) -> pa.Array:
    """Which rows of ``table`` the SQL condition ``where`` keeps (TRUE; NULL and FALSE
    drop), as a boolean array, by a DuckDB connection of the calling thread's own: one
    thread, nothing in it but ``table`` while it runs (the conditions it gets are plain,
    see ``_derived._plain_where``)."""
    import duckdb

    con = getattr(_LOCAL, "con", None)
    if con is None:
        con = _LOCAL.con = track(duckdb.connect(config={"threads": 1}))
        con.execute(f"SET TimeZone = '{TIME_ZONE}'")  # as the query's: '2024-01-01' < tstz
    con.register("__cd_rows", table)
    try:
        quoted = '"' + alias.replace('"', '""') + '"'  # the query's own WHERE, as DuckDB
        sql = f"SELECT COALESCE(({where}), FALSE) FROM __cd_rows AS {quoted}"  # prints it
        got = con.sql(sql).to_arrow_table()
    finally:
        con.unregister("__cd_rows")
    keep = _one(got.column(0)) if got is not None else None
    if keep is None or len(keep) != table.num_rows or keep.type != pa.bool_():
        raise DerivedFailed("the WHERE did not give one boolean per row")
    return keep


def _plain_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _read_key_ahead(op: OpenPart, rg: int, key: str, numbers: set[int] | frozenset[int]
                    ) -> tuple[int, pa.Array] | None:
    """``(first row, values)`` of ``key`` in row group ``rg``, read ahead of a statement
    naming ``numbers``: the key's pages of the granules (see
    :meth:`OpenPart.granule_rows`) from the first to the last that may hold one of them,
    else the whole column chunk (``(0, all of it)``); None if no granule may."""
    need = op.granule_rows(rg, key, lambda lo, hi: any(lo <= n <= hi for n in numbers))
    if need == (0, 0):
        return None
    if need is not None:
        got = op.read_rows(rg, key, need[0], need[1])
        if got is not None:
            return need[0], got
    col = op.read([rg], [key]).column(key)
    return 0, col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _read_rows_at_once(op: OpenPart, rg: int, columns: list[str], first: int, end: int
                       ) -> dict[str, pa.Array | None]:
    """``op.read_rows(rg, c, first, end)`` of each of ``columns``: the first on this thread,
    the others meanwhile on the scan pool (a point query's columns decode on both cores).
    One the pool has not started by the time this thread is done is read here (a pool
    thread never waits for a queued task); none is left running when this returns or
    raises."""
    futures = [(c, _pool().submit(op.read_rows, rg, c, first, end)) for c in columns[1:]]
    out: dict[str, pa.Array | None] = {}
    try:
        if columns:
            out[columns[0]] = op.read_rows(rg, columns[0], first, end)
        for c, fut in futures:
            out[c] = fut.result() if not fut.cancel() else op.read_rows(rg, c, first, end)
    finally:
        for _c, fut in futures:
            if not fut.cancel():
                fut.exception()  # (a failed read raised above, or is raised by its retry)
    return out


def _row_estimate(stats: tuple[Any, Any] | None, rows: int, filters: list[Filter]
                  ) -> int | None:
    """The row of a row group with integer key statistics ``stats`` where the last value
    ``filters`` may keep would be if its keys were spread evenly between their min and max
    (a guess, for walking page headers while the key decodes: a walk that stops short
    walks on when the rows are known); None (walk them all) without a bound."""
    if stats is None or not all(isinstance(v, int) for v in stats):
        return None
    top = None
    for f in filters:
        if f.values is not None:
            ints = [v for v in f.values if isinstance(v, int)]
            bound = max(ints) if ints and len(ints) == len(f.values) else None
        else:
            bound = f.hi
        if isinstance(bound, int) and (top is None or bound < top):
            top = bound
    lo, hi = stats
    if top is None or hi <= lo:
        return None
    share = min(1.0, max(0.0, (top - lo) / (hi - lo)))
    return min(rows - 1, int(share * rows))


def _key_span(col: pa.Array, filters: list[Filter]) -> tuple[int, int] | None:
    """``(first, end)``: the rows of integer array ``col`` from the first to the last
    that ``filters`` may keep (every one between them is handed on); ``(0, 0)`` if none.
    No filter of the pushdown (comparisons, ranges, IN) keeps a NULL. None if ``col``
    is not an integer array.
    """
    typ = col.type
    if not pa.types.is_integer(typ):
        return None
    kind = "i" if pa.types.is_signed_integer(typ) else "u"
    dtype = np.dtype(kind + str(typ.bit_width // 8))
    data = col.buffers()[1]
    n, offset = len(col), col.offset
    if data is None or n == 0:
        return (0, 0)
    values = np.frombuffer(data, dtype=dtype, count=offset + n)[offset:]
    info = np.iinfo(dtype)
    keep = np.ones(n, dtype=bool)
    for f in filters:
        if f.values is not None:
            wanted = [v for v in f.values if info.min <= v <= info.max]
            keep &= np.isin(values, np.array(wanted, dtype=dtype))
            continue
        if f.lo is not None:
            if f.lo > info.max:
                return (0, 0)
            if f.lo > info.min:
                keep &= values >= dtype.type(f.lo)
        if f.hi is not None:
            if f.hi < info.min:
                return (0, 0)
            if f.hi < info.max:
                keep &= values <= dtype.type(f.hi)
    if col.null_count:
        valid = np.unpackbits(np.frombuffer(col.buffers()[0], dtype=np.uint8),
                              bitorder="little")[offset : offset + n].astype(bool)
        keep &= valid
    found = np.flatnonzero(keep)
    return (0, 0) if not len(found) else (int(found[0]), int(found[-1]) + 1)


def _granules_may_match(f: Filter, typ: pa.DataType, grains: tuple[Any, ...]) -> Any:
    """Which granules of a part (``grains``: :meth:`OpenPart.column_granules`) may hold a
    row passing ``f``, as a NumPy boolean array; None if that cannot be told here. NULL
    passes no filter of the pushdown; NaN passes a lower bound only (DuckDB orders it
    above every number), so a granule holding one is kept for a filter without an upper
    bound (and for ``IN`` on a floating column)."""
    _starts, _rgs, _first, _end, mins, maxs, facts = grains
    floating = pa.types.is_floating(typ)
    try:
        keep = (facts & GRANULE_EMPTY) == 0
        if f.lo is not None:
            keep &= ~(maxs < widened(f.lo, typ, False))
        if f.hi is not None:
            keep &= ~(mins > widened(f.hi, typ, True))
        if f.values is not None and not floating:
            hit = np.zeros(len(mins), dtype=bool)
            for v in f.values:
                hit |= (mins <= v) & (maxs >= v)
            keep &= hit
        if floating and (f.hi is None or f.values is not None):
            keep |= (facts & GRANULE_NAN) != 0
    except (TypeError, ValueError, OverflowError):
        return None
    return keep


def _ranked_granules(blocks: list[tuple[OpenPart, Any, Any, Any, Any, Any, Any]], top: TopN
                     ) -> tuple[Iterator[tuple[Any, OpenPart, int, Any]], Any]:
    """The granules of ``blocks`` (see ``_Stream._granule_tasks``) best-first by their
    bound, as :meth:`_Stream._top_tasks` hands them out (made one by one as they are
    taken), and a value the ``limit``-th best row is at least as good as from their
    bounds alone (see ``_Stream._bound_from_statistics``; None if they hold fewer rows
    within their bounds)."""
    ops = [b[0] for b in blocks]
    bound, edge, exact, rgs, first, end = (np.concatenate([b[k] for b in blocks])
                                           for k in range(1, 7))
    which = np.repeat(np.arange(len(blocks)), [len(b[1]) for b in blocks])
    order = np.argsort(bound, kind="stable")
    if top.descending:
        order = order[::-1]
    static = None
    if len(order):
        exact_sorted = exact[order]
        rows = np.cumsum(np.where(exact_sorted, (end - first)[order], 0))
        j = int(np.searchsorted(rows, top.limit))
        if j < len(rows):
            edges = edge[order[: j + 1]][exact_sorted[: j + 1]]
            static = (edges.min() if top.descending else edges.max()).item()

    def plan() -> Iterator[tuple[Any, OpenPart, int, Any]]:
        for i in order.tolist():
            yield (bound[i].item(), ops[which[i]], int(rgs[i]),
                   (int(first[i]), int(end[i]), edge[i].item(), bool(exact[i])))

    return plan(), static


def _few_integers(col: pa.Array) -> list[int] | None:
    """The values of an integer array without NULLs as Python ints, None for another
    type: for a few values (a top-N's rows), where NumPy's first calls in a process cost
    a cold query more (about 0.1 ms each) than the values' work."""
    typ = col.type
    code = _ARRAY_CODES.get((typ.bit_width, pa.types.is_unsigned_integer(typ))) \
        if pa.types.is_integer(typ) else None
    data = col.buffers()[1]
    if code is None or data is None or col.null_count:
        return None
    values: list[int] = memoryview(data).cast(code)[  # type: ignore[call-overload]
        col.offset : col.offset + len(col)].tolist()
    return values


def _numbers(col: pa.Array) -> Any:
    """The non-null values of an integer or floating array as numpy, NaN left out; else None."""
    typ = col.type
    if pa.types.is_integer(typ):
        kind = "i" if pa.types.is_signed_integer(typ) else "u"
        dtype = np.dtype(kind + str(typ.bit_width // 8))
    elif pa.types.is_floating(typ):
        dtype = np.dtype("f" + str(typ.bit_width // 8))
    else:
        return None
    validity, data = col.buffers()[:2]
    n, offset = len(col), col.offset
    if data is None or n == 0:
        return np.empty(0, dtype)
    values = np.frombuffer(data, dtype=dtype, count=offset + n)[offset:]
    if col.null_count:
        bits = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")
        values = values[bits[offset : offset + n].astype(bool)]
    if dtype.kind == "f":
        values = values[~np.isnan(values)]
    return values


class _Stream:
    """One scan's batches in table order, read ahead by at most ``window`` row groups."""

    def __init__(self, scan: TableScan) -> None:
        self.scan = scan
        self.window = 2 * scan_workers()
        self._pending: collections.deque[Future[list[pa.RecordBatch]]] = collections.deque()
        #: taken from _todo, not submitted yet (handed out again first, in order)
        self._held: collections.deque[tuple[OpenPart, int, Any]] = collections.deque()
        self._tasks_submitted = 0
        self._best: Any = None  # top-N: the best sort values read so far
        self._threshold: Any = None
        self._static: Any = None  # top-N: a bound of the best rows from statistics alone
        #: top-N by granules: the row groups ranked by theirs, and those read (part id, rg)
        self._granule_groups = 0
        self._touched: set[tuple[str, int]] = set()
        self._todo: Iterator[tuple[OpenPart, int, Any]] | None = None  # row groups to submit
        self._started = False
        self._closed = False
        #: set once :meth:`start_after`'s start ran (or will not), and what it raised
        self._ready: threading.Event | None = None
        self._start_error: BaseException | None = None
        self._start_lock = threading.Lock()
        top = scan._top
        #: whether :meth:`_trim` may cut batches (an integer sort column)
        self._trims = top is not None and pa.types.is_integer(scan._types[top.column])

    def _tasks(self) -> Iterator[tuple[OpenPart, int]]:
        for op, groups in self._part_groups():
            for rg in groups:
                yield op, rg

    def _part_groups(self) -> Iterator[tuple[OpenPart, list[int]]]:
        """Each part the scan reads, opened, with the row groups its filters leave."""
        scan = self.scan
        for part in scan._parts:
            if not scan._part_may_match(part):
                scan.parts_skipped += 1
                continue
            if scan._extremes and (part.key_min is not None or not part.rows):
                continue  # answered from its key range (see batches)
            op = scan._open_parts.get(part)
            groups = scan._row_groups(op)
            scan.row_groups_skipped += op.num_row_groups - len(groups)
            yield op, groups

    def _head_tasks(self, need: int, blank: int
                    ) -> Iterator[tuple[OpenPart | None, int, Any]]:
        """A LIMIT's row groups in table order until they hold its ``need`` rows, each
        with ``(blank, end)``: its rows ``0..end`` are handed over, the first ``blank`` of
        them as NULLs (rows its OFFSET drops). A part wholly within the OFFSET is not
        opened (``(None, rows, None)``: that many NULL rows); parts past the LIMIT are
        skipped."""
        scan = self.scan
        before = 0
        for part in scan._parts:
            if before >= need:
                scan.parts_skipped += 1
                continue
            if not part.rows:
                continue
            if before + part.rows <= blank:
                scan.parts_skipped += 1
                before += part.rows
                yield None, part.rows, None
                continue
            op = scan._open_parts.get(part)
            groups = scan._row_groups(op)
            for i, rg in enumerate(groups):
                if before >= need:  # (not one by one: a footer lookup each)
                    scan.row_groups_skipped += len(groups) - i
                    break
                n = op.rows(rg)
                if before + n <= blank:
                    scan.row_groups_skipped += 1
                    yield None, n, None
                else:
                    yield op, rg, (min(n, max(0, blank - before)), min(n, need - before))
                before += n

    def _top_tasks(self, top: TopN) -> Iterator[tuple[OpenPart, int, Any]]:
        """Row groups, or granules of them, best-first by the sort column's bound; those
        without one first. Each comes with ``(bound, span)``: ``span`` None for a whole
        row group ranked by its statistics, else ``(first, end, edge, exact)``: rows
        ``first..end`` of the row group (a granule; the whole row group when it was read
        before, so the cache keeps it), ranked by its granules' bounds
        (:meth:`OpenPart.column_granules`), ``edge`` the worst of them and ``exact``
        whether every row lies within them (no NULL, no NaN). The plan ends at the first
        ranked one that the statistics' bound or the rows seen so far beat (every later
        one is beaten as well). With NULLs last (:attr:`TopN.nulls_first`), one holding
        NULLs is ranked by its values, and those holding nothing but NULLs come after the
        plan, read only when no ``limit`` rows with a value are known (NULLs first: each
        one holding a NULL may hold the top rows, and is read first)."""
        scan = self.scan
        typ = scan._types[top.column]
        floating = pa.types.is_floating(typ)
        desc = top.descending
        granular = not scan.derived and scan.where is None
        ranked: list[tuple[Any, OpenPart, int, Any]] = []
        blocks: list[tuple[OpenPart, Any, Any, Any, Any, Any, Any]] = []
        #: NULLs last: row groups or granules holding NULLs only (see the docstring)
        nulls: list[tuple[OpenPart, int, Any]] = []
        for op, groups in self._part_groups():
            # (granule bounds first: the column's statistics are in the Parquet footer,
            # which a part opened by its lookup block then need not parse; the key has
            # none, its bounds come with the part: not looked for, 0.1 ms cold)
            grains = op.column_granules(top.column) \
                if granular and top.column != scan._key else None
            if grains is not None:
                yield from self._granule_tasks(op, groups, grains, top, floating, ranked,
                                               blocks, nulls)
                continue
            bounds = op.null_free_bounds(top.column)
            if bounds is not None:  # a key's bounds: every row group ranked, in C
                edges = bounds[1] if desc else bounds[0]
                ranked += zip(map(edges.__getitem__, groups), itertools.repeat(op), groups,
                              itertools.repeat(None))
                continue
            for rg in groups:
                st = op.stats(rg, top.column)
                usable = (st is not None
                          and (not top.nulls_first or op.nulls(rg, top.column) == 0)
                          and not (floating and desc and not op.nan_free(rg, top.column)))
                if st is None and not top.nulls_first \
                        and op.nulls(rg, top.column) == op.rows(rg):
                    nulls.append((op, rg, (None, None)))
                elif st is None or not usable:
                    yield op, rg, (None, None)
                else:
                    ranked.append((st[1] if desc else st[0], op, rg, None))
        ranked.sort(key=operator.itemgetter(0), reverse=desc)
        static = self._bound_from_statistics(ranked, top, floating)
        plan: Iterator[tuple[Any, OpenPart, int, Any]] = iter(ranked)
        if blocks:  # granules, ranked in NumPy, merged with the row groups
            granules, bound = _ranked_granules(blocks, top)
            if bound is not None and (static is None or (
                    bound > static if desc else bound < static)):
                static = bound
            plan = heapq.merge(ranked, granules, key=operator.itemgetter(0), reverse=desc)
        self._static = static
        # whole row groups not yet handed out
        left = sum(1 for r in ranked if r[3] is None) + sum(1 for r in nulls if r[2][1] is None)
        for bound, op, rg, span in plan:
            if self._beaten(bound, top):
                # ranked best-first: every one after this one is beaten as well
                scan.row_groups_skipped += left
                return
            if span is None:
                left -= 1
            yield op, rg, (bound, span)
        if self._static is not None or self._threshold is not None:
            scan.row_groups_skipped += left  # limit rows with a value: NULLs come after
            return
        yield from nulls

    def _granule_tasks(self, op: OpenPart, groups: list[int], grains: tuple[Any, ...],
                       top: TopN, floating: bool, ranked: list[tuple[Any, OpenPart, int, Any]],
                       blocks: list[tuple[OpenPart, Any, Any, Any, Any, Any, Any]],
                       nulls: list[tuple[OpenPart, int, Any]]
                       ) -> Iterator[tuple[OpenPart, int, Any]]:
        """The granules of ``op``'s row groups ``groups`` for :meth:`_top_tasks`: those
        without a bound yielded, the others added to ``blocks`` (NumPy arrays: the part,
        bounds, worst edges, whether exact, row groups, first and end rows), those holding
        only NULLs that sort last to ``nulls``. A row group read before (cached, or offered
        to the cache by a granule read) is one task, read whole, added to ``ranked``."""
        scan, desc = self.scan, top.descending
        starts, rgs, first, end, mins, maxs, facts = grains
        cache = scan._cache
        self._granule_groups += len(groups)
        if len(groups) == op.num_row_groups:
            wanted = np.ones(len(rgs), dtype=bool)
        else:
            wanted = np.zeros(len(rgs), dtype=bool)
            for rg in groups:
                wanted[starts[rg] : starts[rg + 1]] = True
        # NULLs last: a granule of NULLs only comes after every value; else a NULL may
        # be among the top rows
        empty = (facts & GRANULE_EMPTY) != 0 if not top.nulls_first \
            else np.zeros(len(facts), dtype=bool)
        unbounded = (facts & (GRANULE_NULL | GRANULE_EMPTY)) != 0 if top.nulls_first \
            else np.zeros(len(facts), dtype=bool)
        if floating and desc:  # NaN sorts above every number
            unbounded |= (facts & GRANULE_NAN) != 0
        exact = (facts & (GRANULE_NAN | GRANULE_NULL)) == 0
        if cache is not None and (len(cache) or cache.offers()):
            for rg in groups:
                if not (scan.cached(op, rg) or any(
                        cache.offered(f"{op.part.id}/{rg}", c) for c in scan.columns)):
                    continue
                a, b = starts[rg], starts[rg + 1]
                wanted[a:b] = False
                rows = int(end[b - 1])
                valued = ~empty[a:b]
                if unbounded[a:b].any():
                    yield op, rg, (None, (0, rows, None, False))
                    continue
                if not valued.any():
                    nulls.append((op, rg, (None, (0, rows, None, False))))
                    continue
                lo, hi = mins[a:b][valued], maxs[a:b][valued]
                ranked.append(((hi.max() if desc else lo.min()).item(), op, rg,
                               (0, rows, (lo.min() if desc else hi.max()).item(),
                                bool(exact[a:b].all()))))
        for i in np.flatnonzero(unbounded & wanted).tolist():  # may hold the best rows
            yield op, int(rgs[i]), (None, (int(first[i]), int(end[i]), None, False))
        for i in np.flatnonzero(empty & wanted & ~unbounded).tolist():
            nulls.append((op, int(rgs[i]), (None, (int(first[i]), int(end[i]), None, False))))
        keep = wanted & ~unbounded & ~empty
        blocks.append((op, (maxs if desc else mins)[keep], (mins if desc else maxs)[keep],
                       exact[keep], rgs[keep], first[keep], end[keep]))

    def _bound_from_statistics(self, ranked: list[tuple[Any, OpenPart, int, Any]], top: TopN,
                               floating: bool) -> Any:
        """A value the ``limit``-th best row is at least as good as, from statistics alone.

        Row groups (or granules) taken best-first whose every row has a value within their
        min/max (no NULL, and no NaN for a floating column: the footer says) hold at least
        ``limit`` rows no worse than the worst bound among them; so a row group whose
        every row is strictly worse cannot reach the top, and is skipped before anything
        is read (on a part sorted by the column, ``ORDER BY key LIMIT n`` reads the first
        row groups). None if those row groups hold fewer rows.
        """
        rows, worst = 0, None
        for _bound, op, rg, span in ranked:
            if span is not None:
                first, end, edge, exact = span
                if not exact:
                    continue
                n = end - first
            else:
                if (floating and not op.nan_free(rg, top.column)) \
                        or op.nulls(rg, top.column) != 0:
                    continue
                st = op.stats(rg, top.column)
                if st is None:  # (ranked row groups have statistics)
                    continue
                edge = st[0] if top.descending else st[1]
                n = op.rows(rg)
            if worst is None or (edge < worst if top.descending else edge > worst):
                worst = edge
            rows += n
            if rows >= top.limit:
                return worst
        return None

    def _see(self, batch: pa.RecordBatch, top: TopN) -> None:
        """Keep the ``limit`` best sort values read so far (NaN and NULL never help)."""
        col = batch.column(batch.schema.get_field_index(top.column))
        few = _few_integers(col) if len(col) <= _FEW_ROWS and (
            self._best is None or isinstance(self._best, list)) else None
        if few is not None:  # (a top-N's rows: Python ints, see _few_integers)
            k = top.limit
            best = sorted(few if self._best is None else self._best + few)
            best = best[max(0, len(best) - k):] if top.descending else best[:k]
            self._best = best
            if len(best) >= k:
                self._threshold = best[0] if top.descending else best[-1]
            return
        values = _numbers(col)
        if values is not None:  # numpy: pyarrow.compute costs a cold query ~50 ms to import
            if isinstance(self._best, list):
                self._best = np.array(self._best, dtype=values.dtype)
            if self._best is not None:
                values = np.concatenate([self._best, values])
            k = top.limit
            if len(values) > k:
                values = (np.partition(values, len(values) - k)[len(values) - k:]
                          if top.descending else np.partition(values, k - 1)[:k])
            self._best = values
            if len(values) >= k:
                self._threshold = (values.min() if top.descending else values.max()).item()
            return
        import pyarrow.compute as pc

        col = col.drop_null()
        if self._best is not None:
            col = pa.concat_arrays([self._best, col.cast(self._best.type)])
        order = "descending" if top.descending else "ascending"
        idx = pc.select_k_unstable(pa.table({"v": col}), k=top.limit, sort_keys=[("v", order)])
        self._best = col.take(idx)
        if len(self._best) >= top.limit:
            self._threshold = self._best[top.limit - 1].as_py()

    def _trim(self, batch: pa.RecordBatch, top: TopN) -> pa.RecordBatch:
        """``batch`` without the rows that sort strictly after the ``limit`` best values
        seen so far (this batch's included), when its sort column is an integer column
        without NULL whose values ascend (a part sorted by it): those rows are a tail (a
        head when descending), cut off without a copy, and DuckDB (and :meth:`_see`) sort
        the rest only."""
        if not self._trims or not batch.num_rows:
            return batch
        col = batch.column(batch.schema.get_field_index(top.column))
        if not pa.types.is_integer(col.type) or col.null_count:
            return batch
        few = _few_integers(col) if batch.num_rows <= _FEW_ROWS else None
        if few is not None:  # (a top-N's rows: Python ints, see _few_integers)
            if not all(map(operator.le, few, few[1:])):
                return batch
            k = min(top.limit, len(few))
            t = self._threshold
            if top.descending:
                edge = few[len(few) - k]
                t = edge if t is None or edge > t else t
                start = bisect.bisect_left(few, t)
                return batch.slice(start) if start else batch
            edge = few[k - 1]
            t = edge if t is None or edge < t else t
            end = bisect.bisect_right(few, t)
            return batch.slice(0, end) if end < batch.num_rows else batch
        values = _numbers(col)
        if values is None or len(values) != batch.num_rows:
            return batch
        if len(values) > 1 and not bool(np.all(values[:-1] <= values[1:])):
            return batch
        k = min(top.limit, len(values))
        t = self._threshold
        if top.descending:
            edge = values[len(values) - k].item()  # the batch's k-th largest
            t = edge if t is None or edge > t else t
            start = int(np.searchsorted(values, t, side="left"))
            return batch.slice(start) if start else batch
        edge = values[k - 1].item()  # the batch's k-th smallest
        t = edge if t is None or edge < t else t
        end = int(np.searchsorted(values, t, side="right"))
        return batch.slice(0, end) if end < batch.num_rows else batch

    def _beaten(self, bound: Any, top: TopN) -> bool:
        """Whether every row of a row group bounded by ``bound`` sorts after the top rows."""
        for t in (self._static, self._threshold):
            if t is not None and (bound < t if top.descending else bound > t):
                return True
        return False

    def _extremes(self) -> Iterator[pa.RecordBatch]:
        """Each part's minimum and maximum key as two rows (the query wants only those).

        The range is the sealed catalog's (checked against the part's authenticated
        footer whenever the part is read); parts without one are read as usual.
        """
        scan = self.scan
        lows, highs = [], []
        for part in scan._parts:
            if part.key_min is not None:
                lows.append(part.key_min)
                highs.append(part.key_max)
                scan.parts_from_index += 1
        if lows:
            arr = integer_array(scan.schema.field(0).type, lows + highs)
            yield pa.RecordBatch.from_arrays([arr], schema=scan.schema)

    def batches(self) -> Iterator[pa.RecordBatch]:
        scan = self.scan
        top = scan._top
        try:
            if not scan.columns and not scan.derived:
                for part in scan._parts:
                    for start in range(0, part.rows, _NULL_BATCH):
                        n = min(_NULL_BATCH, part.rows - start)
                        yield pa.RecordBatch.from_arrays([pa.nulls(n)], schema=scan.schema)
                return
            if scan._extremes:
                yield from self._extremes()
            if self._ready is not None:  # started once its parts open (start_after)
                self._ready.wait()
                if self._start_error is not None:
                    raise self._start_error
            self.start()
            while True:
                self._fill()
                if not self._pending:
                    break
                for batch in self._pending.popleft().result():
                    if top is not None:
                        batch = self._trim(batch, top)
                        if self._todo is not None or self._trims:  # row groups left to skip,
                            self._see(batch, top)                  # or batches to cut
                    yield batch
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                scan.error = scan.error or exc
            raise
        finally:
            self.close()

    def start_after(self, opening: list[Future[OpenPart]]) -> None:
        """:meth:`start` once the parts being opened (``opening``) are open, on the thread
        that opens the last of them, not on the statement's, which goes on to DuckDB's
        bind and plan meanwhile (a top-N waited for its part's open there, and its first
        read for the GIL the statement then held); :meth:`batches` waits for it."""
        self._ready = ready = threading.Event()
        left = [len(opening)]
        count = threading.Lock()

        def go(_done: Future[OpenPart]) -> None:
            with count:
                left[0] -= 1
                if left[0]:
                    return
            try:
                with self._start_lock:
                    if not self._closed:
                        self.start()
            except BaseException as exc:  # (raised to DuckDB by batches)
                self._start_error = exc
            finally:
                ready.set()

        for fut in opening:
            fut.add_done_callback(go)

    def start(self) -> None:
        """Plan the scan and set its first row groups (up to the window) reading."""
        if self._todo is None and not self._started:
            self._started = True
            top, head = self.scan._top, self.scan._head
            if head is not None:
                rows, blank = head
                self._todo = self._head_tasks(rows, min(blank, rows))  # type: ignore[assignment]
            else:
                self._todo = (self._top_tasks(top) if top is not None
                              else ((op, rg, None) for op, rg in self._tasks()))
            self._fill()

    def _fill(self) -> None:
        """Submit row groups until ``window`` are in flight or none is left.

        Top-N keeps one row group per scan thread in flight and stops while a finished
        one waits to be seen, so each row group is checked against the freshest
        threshold (the best-ranked one usually sets the final threshold).
        """
        scan, top = self.scan, self.scan._top
        window = self.window if top is None else scan_workers()
        done: Future[list[pa.RecordBatch]]
        while self._todo is not None and len(self._pending) < window:
            if top is not None and self._pending and self._pending[0].done():
                break
            item = self._next()
            if item is None:
                self._todo = None
                break
            op, rg, bound = item
            if scan._head is not None:
                self._pending.append(self._head_read(op, rg, bound))
                continue
            span = None
            if top is not None:
                bound, span = bound
            if top is not None and bound is not None and self._beaten(bound, top):
                if span is None:
                    scan.row_groups_skipped += 1  # all its rows sort after the top ones
                continue
            if span is not None:  # rows of a row group ranked by its granules
                self._touch(op, rg)
                if scan.cached(op, rg):  # decoded already: no thread hand-off
                    done = Future()
                    done.set_result(scan.read_span(op, rg, span[0], span[1]))
                    self._pending.append(done)
                    continue
                self._pending.append(_pool().submit(scan.read_span, op, rg, span[0], span[1]))
                continue
            if scan.cached(op, rg):  # decoded already: no thread hand-off
                done = Future()
                done.set_result([scan.read_group(op, rg)])
                self._pending.append(done)
                scan.row_groups_read += 1
                continue
            # The first window's tasks read one row group each: a LIMIT that the first
            # batches satisfy reads no more than before; a longer scan then reads runs
            # (not one filtered on the key, whose row groups may read granules only).
            groups = ([rg] if top is not None or scan._key_filters
                      or self._tasks_submitted < window or (op.part.id, rg) in scan._sparse
                      else self._run(op, rg))
            if self._pending:  # queued behind others: its bytes start coming from disk now
                op.prefetch(groups, scan.read_columns())
            self._pending.append(_pool().submit(scan.read_groups, op, groups))
            self._tasks_submitted += 1
            scan.row_groups_read += len(groups)

    def _touch(self, op: OpenPart, rg: int) -> None:
        """Count row group ``rg`` of ``op`` read (once, however many of its granules are)."""
        if (op.part.id, rg) not in self._touched:
            self._touched.add((op.part.id, rg))
            self.scan.row_groups_read += 1

    def _settle(self) -> None:
        """Count the row groups ranked by their granules of which none was read skipped."""
        self.scan.row_groups_skipped += self._granule_groups - len(self._touched)
        self._granule_groups = len(self._touched)

    def _head_read(self, op: OpenPart | None, rg: int, span: Any
                   ) -> Future[list[pa.RecordBatch]]:
        """A LIMIT's read of one row group (``span``: see :meth:`_head_tasks`)."""
        scan = self.scan
        if op is None:  # ``rg`` rows within the OFFSET: NULLs, nothing read
            done: Future[list[pa.RecordBatch]] = Future()
            done.set_result(scan.blank(rg))
            return done
        blank, end = span
        scan.row_groups_read += 1
        if scan.cached(op, rg):  # decoded already: no thread hand-off
            done = Future()
            done.set_result(scan.read_head(op, rg, blank, end))
            return done
        if self._pending:
            op.prefetch([rg], scan.read_columns())
        return _pool().submit(scan.read_head, op, rg, blank, end)

    def _next(self) -> tuple[OpenPart, int, Any] | None:
        if self._held:
            return self._held.popleft()
        return next(self._todo, None) if self._todo is not None else None

    def _run(self, op: OpenPart, rg: int) -> list[int]:
        """``rg`` and the row groups after it in the plan that one task reads with it: the
        next ones of the same part, none of their columns cached, while their column chunks
        stay within ``RUN_BYTES`` (a scan of one 8-byte column reads 7 row groups a task,
        of every column one), so the per-read costs (a Parquet reader, the decryption's
        calls) are paid per task, not per row group. The candidates' spans are computed
        in one pass (:meth:`OpenPart.spans`); those left out are handed out next."""
        scan = self.scan
        if not scan.uncached(op, rg):
            return [rg]
        candidates: list[tuple[OpenPart, int, Any]] = []
        while len(candidates) + 1 < RUN_GROUPS:
            item = self._next()
            if item is None:
                break
            nop, nrg, _bound = item
            last = candidates[-1][1] if candidates else rg
            if nop is not op or nrg != last + 1 or not scan.uncached(op, nrg) \
                    or (op.part.id, nrg) in scan._sparse:
                self._held.appendleft(item)
                break
            candidates.append(item)
        if not candidates:
            return [rg]
        groups = [rg] + [c[1] for c in candidates]
        spans = op.spans(groups, scan.read_columns())
        take = 1
        while take < len(groups) and spans[take][0] <= RUN_BYTES and spans[take][1] <= SPAN_MAX:
            take += 1
        self._held.extendleft(reversed(candidates[take - 1:]))
        return groups[:take]

    def close(self) -> None:
        with self._start_lock:  # (not while start_after's start runs)
            if self._closed:
                return
            self._closed = True
        self._settle()
        while self._pending:  # running tasks finish (one row group each); queued ones go
            fut = self._pending.popleft()
            if not fut.cancel():
                try:
                    fut.result()
                except Exception:  # noqa: S110 - the query has its answer or its error
                    pass

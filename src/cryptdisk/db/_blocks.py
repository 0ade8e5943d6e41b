"""An insert's rows as sorted parts, one block of rows at a time, on several threads.

The rows stream in (from DuckDB, in the input's order) and are cut into blocks of
about ``block_bytes`` of Arrow data (whole row groups). Each block is checked for
order on the table's ``ORDER BY`` (one vectorised comparison of neighbouring keys):

- a block already in order whose first key is at least the last key of the part
  being written goes on at the end of that part (so an input already sorted by the
  key becomes parts of up to ``max_rows`` rows whose key ranges do not overlap,
  with no sort at all);
- any other block is sorted and starts a new part: a key of numbers, dates or times
  without NULLs by :func:`_packed_sort_indices` (one sort of plain 64-bit integers, about
  twice as fast as an argsort), other keys by Arrow's ``sort_indices``.

Parts are written by up to ``workers`` threads at once (the same threads for all the
insert's parts, see :class:`_Pool`), each sorting, encoding and (on another thread)
encrypting (plain: hashing) its own part, so both cores work; while fewer than
``workers`` parts are being encoded, a part's next row group is taken in key order on a
taker thread (see :func:`_ahead`) as its thread encodes the one before. At
most ``workers`` parts are being encoded, each holding the block it encodes and one queued
block, and one block is being gathered (a part being finished holds no block: its thread
writes the footer and takes the next part, while the part is published, fsynced and
renamed, on a publishing thread): an insert holds about
``(2 * workers + 1) * block_bytes`` of rows, whatever its size (one block more for a
moment while a block's chunks are combined into the one contiguous copy that is then
taken in key order a row group at a time, each row group encoded as it is taken).
Unsorted input yields one part per block, whose key
ranges overlap; ``OPTIMIZE`` merges them.

All parts are published (each an atomic rename) before the caller commits the
catalog once for all of them; on an error the parts being written are discarded
and the ones already published removed (a crash leaves them to the next writer).
"""

from __future__ import annotations

import collections
import importlib
import queue
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from ..disks import Disk
from . import _parts, _waits
from ._catalog import PartMeta
from ._numpy import arrow_indices, numpy_values
from ._parts import (
    _PartWriter,
    _Prefetch,
    column_compression,
    dictionary_columns,
    fits_schema,
    null_free_schema,
    statistics_columns,
)

__all__ = ["PUBLISHERS", "load_compute", "sortable", "write_sorted_parts"]

#: Most parts of one insert being published (fsynced and renamed) at once.
PUBLISHERS = 16

try:  # the C radix sort (csrc/cryptdisk_db/csort.c), which has no type stubs (Any)
    _csort: Any = importlib.import_module(f"{__package__}._csort")
except ImportError:  # pragma: no cover - not built (setup.py says why): numpy sorts
    _csort = None


def _sort_u64(values: Any, low: int = 0) -> None:
    """Sort ``values`` (a C-contiguous numpy uint64 array of distinct values) in place, its
    ``low`` bits already ascending where the bits above are equal (positions): a radix sort
    of the bits above ``low`` only, without the GIL (10 ms for 590K values with 20 bits of
    positions, where sorting all 64 bits took 17 ms, and numpy's sort 37-46 ms), or
    numpy's sort where the extension is not built. Either way the result is ascending."""
    if _csort is None:
        values.sort()
        return
    try:
        _csort.sort_u64(values, low)
    except TypeError:  # a build of the extension from before ``low``: all 64 bits
        _csort.sort_u64(values)


def _plainly_sortable(t: pa.DataType) -> bool:
    """Whether Arrow sorts and compares type ``t`` for certain (numbers but half floats,
    text and bytes but views, dates, times, timestamps, durations, decimals, booleans):
    known without asking Arrow's compute functions."""
    types = pa.types
    return (types.is_integer(t) or types.is_float32(t) or types.is_float64(t)
            or types.is_string(t) or types.is_large_string(t) or types.is_binary(t)
            or types.is_large_binary(t) or types.is_fixed_size_binary(t)
            or (types.is_temporal(t) and not types.is_interval(t))
            or types.is_decimal(t) or types.is_boolean(t))


def sortable(schema: pa.Schema, order: list[str]) -> bool:
    """Whether Arrow can sort and compare the ``order`` columns of ``schema``.

    Types it plainly sorts are answered at once; others are tried on empty arrays with
    Arrow's compute functions, whose module takes 40-100 ms to import (see
    :func:`load_compute`)."""
    if all(n in schema.names and _plainly_sortable(schema.field(n).type) for n in order):
        return True
    import pyarrow.compute as pc  # not at import: a reader never pays it
    try:
        for name in order:
            empty = pa.nulls(0, schema.field(name).type)  # (pa.array imports pandas)
            pc.sort_indices(empty)
            pc.greater_equal(empty, empty)
    except (pa.ArrowException, KeyError):
        return False
    return True


def load_compute() -> None:
    """Import ``pyarrow.compute`` on a thread of its own unless it is imported already.

    Its import builds a wrapper and a docstring for each of Arrow's 280-odd functions:
    40-100 ms of Python, holding the GIL, which a process's first insert paid before
    DuckDB started reading. Started as the insert begins, it overlaps DuckDB's reading of
    the first block; the first use of the module waits for it (the import lock)."""
    if "pyarrow.compute" in sys.modules:
        return

    def load() -> None:
        import pyarrow.compute  # noqa: F401

    threading.Thread(target=load, name="cryptdisk-import", daemon=True).start()


def _in_order(block: pa.Table, order: list[str]) -> bool:
    """Whether ``block`` is sorted by ``order``: checked on the first column only, strictly
    increasing when there are more (ties would need the next columns), no NULL or NaN."""
    import pyarrow.compute as pc  # not at import: a reader never pays it
    key = block.column(order[0])
    n = block.num_rows
    if key.null_count or n < 2:
        return not key.null_count
    cmp = pc.greater if len(order) > 1 else pc.greater_equal
    # NaN compares false, so a key with NaN is never found in order
    return bool(pc.all(cmp(key.slice(1), key.slice(0, n - 1))).as_py())


def _clean_range(block: pa.Table, key: str, ordered: bool) -> tuple[Any, Any] | None:
    """The block's (min, max) key, or None if it has NULL or NaN or a value Python cannot
    hold (no chaining then)."""
    import pyarrow.compute as pc  # not at import: a reader never pays it
    col = block.column(key)
    if col.null_count or not block.num_rows:
        return None
    if pa.types.is_floating(col.type) and pc.any(pc.is_nan(col)).as_py():
        return None
    try:  # 'infinity'::DATE and TIMESTAMPs past year 9999 have no Python value
        if ordered:
            return col[0].as_py(), col[-1].as_py()
        mm = pc.min_max(col)
        return mm["min"].as_py(), mm["max"].as_py()
    except (OverflowError, ValueError):
        return None


def _order_bits(key: pa.Array) -> Any:
    """The key as a new numpy uint64 array that orders as ``key`` does (NaN above every
    number, -0.0 equal to 0.0), or None: the key has NULLs or is not a number, date or time."""
    import numpy as np

    if key.null_count:
        return None
    t = key.type
    if pa.types.is_temporal(t) and not pa.types.is_interval(t):
        width = pa.int32() if t.bit_width == 32 else pa.int64() if t.bit_width == 64 else None
        if width is None:
            return None
        key, t = key.view(width), width
    if pa.types.is_unsigned_integer(t):
        return numpy_values(key).astype(np.uint64)  # a copy: the caller may overwrite it
    if pa.types.is_signed_integer(t):
        return numpy_values(key).astype(np.int64, copy=False).view(np.uint64) ^ \
            np.uint64(1 << 63)
    if t in (pa.float32(), pa.float64()):
        x = numpy_values(key).astype(np.float64) + 0.0  # -0.0 + 0.0 is 0.0
        x[np.isnan(x)] = np.nan  # one NaN, with its sign bit clear
        bits = x.view(np.uint64)
        negative = bits >= np.uint64(1 << 63)
        bits |= np.uint64(1 << 63)
        np.invert(bits, out=bits, where=negative)  # where it was set: all bits flipped
        return bits
    return None


_CHUNK = 1 << 16


def _ties(packed: Any, limit: Any) -> Any:
    """The positions ``i`` of sorted ``packed`` where ``packed[i + 1] ^ packed[i]`` is
    below ``limit`` (the two share their top bits), or None if there are none; worked
    out :data:`_CHUNK` rows at a time, so without an array the size of ``packed``."""
    import numpy as np

    n = len(packed)
    found = []
    buf = np.empty(min(max(n - 1, 0), _CHUNK), dtype=np.uint64)
    for start in range(0, n - 1, _CHUNK):
        stop = min(n - 1, start + _CHUNK)
        x = buf[:stop - start]
        np.bitwise_xor(packed[start + 1:stop + 1], packed[start:stop], out=x)
        hit = np.flatnonzero(x < limit)
        if len(hit):
            found.append(hit + start)
    return np.concatenate(found) if found else None


def _packed_sort_indices(key: pa.Array) -> Any:
    """The stable ascending sort order of ``key`` as int64 positions, or None where
    :func:`_order_bits` has no order for it.

    Each key's bits (:func:`_order_bits`), less the minimum, go into the high bits of one
    uint64 and its position into the low ``b`` bits (``b`` bits hold every position), so
    one sort of plain integers (about twice as fast as an argsort) yields the order, ties
    broken by position. When the keys span more than the ``64 - b`` bits left, their top
    bits are packed and the runs of equal top bits are sorted again by the whole key.
    Works in place: 8 bytes a row (the runs are found a chunk of rows at a time).
    """
    import numpy as np

    packed = _order_bits(key)
    if packed is None:
        return None
    n = len(packed)
    b = max(1, (n - 1).bit_length())
    lo = packed.min()
    shift = max(0, int(packed.max() - lo).bit_length() + b - 64)
    packed -= lo
    if shift:
        packed >>= np.uint64(shift)
    packed <<= np.uint64(b)
    for start in range(0, n, _CHUNK):  # the positions, without an array of all of them
        packed[start:start + _CHUNK] |= np.arange(start, min(n, start + _CHUNK),
                                                  dtype=np.uint64)
    _sort_u64(packed, b)  # (the positions are ascending: sorted by the bits above)
    ties = _ties(packed, np.uint64(1 << b)) if shift else None
    packed &= np.uint64((1 << b) - 1)
    idx = packed.view(np.int64)
    if ties is not None:  # neighbours with the same top bits: sorted again by the whole key
        pos = np.union1d(ties, ties + 1)
        del ties
        sub = idx[pos]
        idx[pos] = sub[np.argsort(_order_bits(key.take(arrow_indices(sub))), kind="stable")]
    return idx


def _sort_order(block: pa.Table, order: list[str]) -> Any:
    """The stable order of ``block``'s rows by ``order`` (NULLs last, NaN above every
    number, as DuckDB): positions, as a numpy or Arrow integer array.

    One key column of numbers, dates or times without NULLs is sorted by
    :func:`_packed_sort_indices`; other keys by Arrow's sort. Both are stable.
    """
    import pyarrow.compute as pc  # not at import: a reader never pays it
    if len(order) == 1:  # one contiguous key column: a plain array sort, no chunk merging
        col = block.column(order[0])
        key = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
        idx = _packed_sort_indices(key) if len(key) > 1 else None
        if idx is None:
            idx = pc.array_sort_indices(key, null_placement="at_end")
        return idx
    return pc.sort_indices(block.combine_chunks(),
                           sort_keys=[(c, "ascending", "at_end") for c in order])


def _sorted(block: pa.Table, order: list[str]) -> pa.Table:
    """``block`` sorted by ``order`` (see :func:`_sort_order`)."""
    return block.combine_chunks().take(arrow_indices(_sort_order(block, order)))


def _equal_width(col: pa.Array) -> int:
    """The byte length of every value of ``col``, a string or binary array without NULLs
    whose values all have that length (> 0), else 0."""
    import numpy as np

    t = col.type
    if col.null_count or not len(col) or not (
            pa.types.is_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_string(t) or pa.types.is_large_binary(t)):
        return 0
    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    offsets = np.frombuffer(col.buffers()[1], dtype=np.int64 if wide else np.int32,
                            count=len(col) + 1, offset=col.offset * (8 if wide else 4))
    width, rest = divmod(int(offsets[-1]) - int(offsets[0]), len(col))
    if rest or width <= 0:
        return 0
    lengths = np.diff(offsets)
    return width if int(lengths.min()) == width == int(lengths.max()) else 0


def _as_fixed(col: pa.Array, width: int) -> pa.Array:
    """``col`` (see :func:`_equal_width`) as fixed-size binary values of ``width`` bytes,
    over the same bytes (no copy)."""
    import numpy as np

    wide = pa.types.is_large_string(col.type) or pa.types.is_large_binary(col.type)
    start = int(np.frombuffer(col.buffers()[1], dtype=np.int64 if wide else np.int32,
                              count=1, offset=col.offset * (8 if wide else 4))[0])
    data = col.buffers()[2].slice(start, width * len(col))
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(col), [None, data])


def _from_fixed(col: pa.Array, t: pa.DataType) -> pa.Array:
    """Fixed-size binary ``col`` (no NULLs) as an array of string or binary type ``t``:
    its bytes as they are, with new offsets."""
    import numpy as np

    wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    width, n = col.type.byte_width, len(col)
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64 if wide else np.int32)
    data = col.buffers()[1].slice(col.offset * width, n * width)
    return pa.Array.from_buffers(t, n, [None, pa.py_buffer(offsets), data], null_count=0)


def _sorted_pieces(block: pa.Table, order: list[str], rows: int) -> Iterable[pa.Table]:
    """``block`` sorted by ``order`` (see :func:`_sort_order`), ``rows`` rows at a time
    (the last piece may be shorter).

    Each piece is taken from the block when it is asked for, so the sorted rows are
    never all in memory (one piece is, beside the block's one contiguous copy), and a
    piece is still in the CPU's cache when the writer encodes it: taking the whole
    block at once wrote the sorted rows to fresh memory (page faults) and read them back
    from RAM, which cost as much as the take itself.

    A string or binary column whose values in the block all have one byte length
    (hashes, UUIDs, codes) is taken as fixed-size binary values over the same bytes and
    given offsets again: Arrow's take of variable-length values in random order costs
    about 5x that of fixed-width ones (one dependent offset lookup and copy per value).
    """
    import pyarrow.compute as pc  # not at import: a reader never pays it
    if any(c.num_chunks != 1 for c in block.columns):  # combine_chunks copies even one
        block = block.combine_chunks()
    idx = arrow_indices(_sort_order(block, order))
    fixed: dict[int, pa.DataType] = {}
    for i, c in enumerate(block.columns):
        width = _equal_width(c.chunk(0)) if c.num_chunks == 1 else 0
        if width:
            fixed[i] = c.type
            block = block.set_column(i, block.field(i).with_type(pa.binary(width)),
                                     _as_fixed(c.chunk(0), width))
    schema = block.schema
    for start in range(0, block.num_rows, rows):
        # the positions are a permutation of the block's rows: no bounds check of each
        piece = pc.take(block, idx.slice(start, rows), boundscheck=False)
        if fixed:
            piece = piece.combine_chunks() if any(
                piece.column(i).num_chunks != 1 for i in fixed) else piece
            for i, t in fixed.items():
                piece = piece.set_column(i, schema.field(i).with_type(t),
                                         _from_fixed(piece.column(i).chunk(0), t))
        yield piece


class _Pool:
    """The insert's part threads: each runs its jobs (parts) one after another.

    A thread per part would give every part fresh memory: Arrow's allocator (mimalloc)
    keeps a heap per thread, so the blocks a new thread combines, sorts and encodes
    came from pages the kernel had to fault in and zero (combining a block's chunks
    cost 4-6x the CPU on a new thread). Threads start as jobs find none idle, up to
    ``threads``: an insert of one small part starts one. :meth:`close` ends and joins
    the threads.
    """

    def __init__(self, threads: int) -> None:
        self._jobs: collections.deque[_Job | _Next | _Publish | None] = collections.deque()
        self._most = threads
        self._threads: list[_waits.Worker] = []
        self._idle = 0  # threads waiting for a job (each takes the next one queued)
        self._cond = threading.Condition()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.popleft()
                self._idle -= 1
            if job is None:
                return
            job.run()
            del job

    def submit(self, job: _Job | _Next | _Publish) -> None:
        with self._cond:
            self._jobs.append(job)
            if len(self._jobs) > self._idle and len(self._threads) < self._most:
                t = _waits.Worker(self._loop, "cryptdisk-insert-part")
                # listed before it starts: a Ctrl-C as start() returns lost it (close()
                # never ended it, and it waited for a job for good)
                self._threads.append(t)
                t.start()
            self._cond.notify()

    @property
    def started(self) -> int:
        """How many threads have started."""
        return len(self._threads)

    def close(self) -> None:
        with self._cond:
            self._jobs.extend([None] * len(self._threads))
            self._cond.notify_all()
        for t in self._threads:
            if t.thread.ident is not None:  # (one a Ctrl-C stopped from starting: no wait)
                t.join()


class _Next:
    """The next item of an iterator, computed on a :class:`_Pool` thread (None at its end)."""

    def __init__(self, it: Iterator[pa.Table]) -> None:
        self._it = it
        self.item: pa.Table | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.item = next(self._it, None)
        except BaseException as exc:  # re-raised by the thread that asked
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> pa.Table | None:
        _waits.wait(self.done)
        if self.error is not None:
            raise self.error
        item, self.item = self.item, None
        return item


def _ahead(pieces: Iterable[pa.Table], pool: _Pool,
           spare: Callable[[], bool]) -> Iterator[pa.Table]:
    """``pieces`` in order; while ``spare()`` (a core would otherwise idle), each next one
    is computed on ``pool`` while the caller works on the one before (a part's next row
    group taken in key order while its thread encodes the last)."""
    it = iter(pieces)
    pending: _Next | None = None
    try:
        while True:
            item = pending.result() if pending is not None else next(it, None)
            pending = None
            if item is None:
                return
            if spare():
                pending = _Next(it)
                pool.submit(pending)
            yield item
            del item
    finally:
        if pending is not None:  # the iterator is not left running when the caller goes on
            _waits.wait(pending.done)


class _Job:
    """One part, written by a thread of the :class:`_Pool`: blocks come through a queue,
    sorted there if asked. The pool has a thread for every part that is not done, or
    waits for one to finish its part (few: at most ``workers`` parts are being encoded)."""

    def __init__(self, writer: _PartWriter, order: list[str],
                 on_rows: Callable[[int], None] | None, lock: threading.Lock,
                 takers: _Pool, spare: Callable[[], bool], publishers: _Pool) -> None:
        self.writer = writer
        self._takers, self._spare = takers, spare
        self._publishers = publishers
        self.rows = 0  # rows handed to it
        self.last: Any = None  # the largest key handed to it (None: unknown, no chaining)
        self.ended = False
        self._order = order
        self._on_rows, self._lock = on_rows, lock
        self._queue: queue.Queue[tuple[pa.Table, bool] | None] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.stop = False  # set by the inserting thread when the insert fails elsewhere
        self.part: PartMeta | None = None
        self._done = threading.Event()
        #: set when every block handed over is encoded (or the job failed): the part's
        #: finish (footer, fsync, rename) holds no block, so another part may start
        self.encoded = threading.Event()

    def put(self, block: pa.Table, sort: bool) -> None:
        self.rows += block.num_rows
        _waits.put(self._queue, (block, sort), self._done.is_set)

    def run(self) -> None:
        """Write the blocks handed over until :meth:`end` and seal the part, on the pool's
        thread; its publish (``fsync``, rename) goes to a publishing thread, so this one
        encodes the next part meanwhile (or discard the part)."""
        handed = False
        try:
            handed = self._write()
        finally:
            self.encoded.set()
            if not handed:
                self._done.set()

    def publish(self) -> None:
        """Publish the sealed part (or discard it when the insert failed meanwhile); on a
        publishing thread."""
        try:
            if self.stop:
                self.writer.abort()
            else:
                self.part = self.writer.publish()
        except BaseException as exc:  # re-raised by the inserting thread
            self.error = exc
            self.writer.abort()
        finally:
            self._done.set()

    def _write(self) -> bool:
        """Encode and seal the part; whether its publish was handed to a publishing
        thread (which then ends the job)."""
        ended = handed = False
        try:
            while (item := self._queue.get()) is not None:
                if self.stop:
                    continue
                block, sort = item
                del item
                rows = block.num_rows
                if sort:
                    # a row group at a time, each one a row group of the part; the block's
                    # contiguous copy replaces it (no reference to it is kept here); a
                    # block of one row group has no next one to take ahead
                    pieces = _sorted_pieces(block, self._order, _parts.ROW_GROUP_ROWS)
                    if rows > _parts.ROW_GROUP_ROWS:
                        pieces = _ahead(pieces, self._takers, self._spare)
                    del block
                    for piece in pieces:
                        self.writer.write(piece)
                        del piece
                    del pieces
                else:
                    self.writer.write(block)
                    del block
                if self._on_rows is not None:
                    with self._lock:
                        self._on_rows(rows)
            ended = True
            self.encoded.set()
            if not self.stop:
                self.writer.seal()
                self._publishers.submit(_Publish(self))
                handed = True
        except BaseException as exc:  # re-raised by the inserting thread
            self.error = exc
        finally:
            if not handed and (self.error is not None or self.stop):
                self.writer.abort()
            while not ended:  # take what the inserting thread still hands over
                ended = self._queue.get() is None
        return handed

    def end(self) -> None:
        """No more blocks: the thread finishes the part (see :meth:`join`)."""
        if not self.ended:
            # (marked only once put: a Ctrl-C in the put leaves the next call to put it)
            _waits.put(self._queue, None, self._done.is_set)
            self.ended = True

    def join(self) -> None:
        self.end()
        _waits.wait(self._done)


class _Publish:
    """A sealed part's publish, run by a publishing thread of a :class:`_Pool`."""

    def __init__(self, job: _Job) -> None:
        self._job = job

    def run(self) -> None:
        self._job.publish()


def _blocks(source: _Prefetch, block_bytes: int, max_rows: int,
            on_sample: Callable[[pa.Table], None] | None = None,
            sample_rows: int = 0) -> Iterable[pa.Table]:
    """The source's batches gathered into tables of about ``block_bytes`` (at least one
    batch) and at most ``max_rows`` rows, cut at a multiple of :data:`._parts.ROW_GROUP_ROWS`
    rows where they hold one; the rest starts the next.

    ``on_sample`` is called with the first ``sample_rows`` rows as soon as they are held,
    before the first table is complete, if they come before it (not at all otherwise)."""
    held: list[pa.RecordBatch] = []
    size = rows = 0
    while True:
        batch = source.next()
        if batch is not None and not batch.num_rows:
            continue
        if batch is not None:
            held.append(batch)
            size += batch.nbytes
            rows += batch.num_rows
            if on_sample is not None and rows >= sample_rows:
                on_sample(pa.Table.from_batches(held).slice(0, sample_rows))
                on_sample = None
        while held and (batch is None or size >= block_bytes or rows >= max_rows):
            on_sample = None  # (a first table shorter than the sample: judged on it)
            table = pa.Table.from_batches(held)
            cut = min(rows, max_rows)
            if batch is not None and cut >= _parts.ROW_GROUP_ROWS:
                cut -= cut % _parts.ROW_GROUP_ROWS
            yield table.slice(0, cut)
            rest = table.slice(cut)
            held = rest.to_batches() if rest.num_rows else []
            rows = rest.num_rows
            size = rest.nbytes if rows else 0
            del table, rest
        if batch is None:
            return


def write_sorted_parts(disk: Disk, prefix: str, batches: Iterable[pa.RecordBatch],
                       schema: pa.Schema, *, version: int, max_rows: int, block_bytes: int,
                       order: list[str], workers: int,
                       on_rows: Callable[[int], None] | None = None) -> list[PartMeta]:
    """Write ``batches`` (in ``schema``) as parts sorted by ``order`` (see the module).

    ``order`` empty: the rows keep their order, in parts of up to ``max_rows`` rows
    (one thread encodes, as :func:`._parts.write_parts`). ``version`` names the parts
    (the catalog's next version). Returns the parts, published but not in the catalog.
    """
    source = _Prefetch(batches)
    # a thread for each part being encoded and one for a part writing its footer beside
    # them; not more: each thread's heap keeps memory (with 2 x workers threads, a
    # 3M-row insert of 8 MiB blocks peaked 20-30 MB higher)
    pool = _Pool(max(1, workers) + 1)
    # while fewer than `workers` parts are being encoded (the insert's first block, its
    # last parts), a part's next row group is taken in key order on one of these threads
    # as the part's thread encodes the one before, so a lone part uses two cores
    takers = _Pool(max(1, workers))
    # a sealed part's publish (its fsync waits for the disk: 60-280 ms for a 33 MB part on
    # a busy disk, seconds on a host whose CPUs are all taken) on threads of its own, not
    # on a part thread: waiting there, it held up the next parts' encoding (the part
    # threads all waiting for fsyncs). Up to PUBLISHERS at once: a sealed part holds no
    # block, and fsyncs waiting together share the file system's journal commits, where
    # workers + 1 threads queued the last parts' publishes behind slow ones
    publishers = _Pool(max(PUBLISHERS, workers + 1))

    def spare() -> bool:
        return sum(not j.encoded.is_set() for j in jobs[-max(1, workers):]) < max(1, workers)

    jobs: list[_Job] = []  # in the order started; the last one may take more blocks
    lock = threading.Lock()
    key = order[0] if order else None
    settings: tuple[Any, Any, Any] | None = None

    def judge(rows: pa.Table) -> None:
        """The parts' encodings, judged on the insert's first rows (as write_parts does)."""
        nonlocal settings
        sample = rows.combine_chunks().to_batches()[0]
        dictionary = dictionary_columns(sample, schema)
        settings = (column_compression(sample, schema, dictionary), dictionary,
                    statistics_columns(sample, schema, dictionary, order))

    try:
        # judged as the first rows come, while DuckDB produces the rest of the first block:
        # judged on the whole block, its 30 ms of CPU held up the first part's start, and
        # DuckDB stopped once two batches waited
        early = judge if max_rows >= _parts._SAMPLE_ROWS else None
        for block in _blocks(source, block_bytes, max_rows, early, _parts._SAMPLE_ROWS):
            if settings is None:  # a first block shorter than the sample
                judge(block.slice(0, _parts._SAMPLE_ROWS))
            assert settings is not None  # (judge set it)
            ordered = not order or _in_order(block, order)
            span = _clean_range(block, key, ordered) if key else (None, None)
            current = jobs[-1] if jobs and not jobs[-1].ended else None
            if not (current is not None and ordered and span is not None
                    and current.rows + block.num_rows <= max_rows
                    and fits_schema(current.writer.schema, block)
                    and (not order or (current.last is not None and (
                        span[0] > current.last if len(order) > 1
                        else span[0] >= current.last)))):
                if current is not None:
                    current.end()
                # at most `workers` parts encoding at once; a part being finished (its
                # fsync) no longer holds a block, and the next one starts beside it
                busy = [j for j in jobs if not j.encoded.is_set()]
                while len(busy) >= max(1, workers):
                    _waits.wait(busy.pop(0).encoded)
                _raise_any(jobs)
                # the columns this block has no NULL in are REQUIRED in its part
                current = _Job(_PartWriter(disk, prefix, null_free_schema(schema, block),
                                           version=version,
                                           compression=settings[0], dictionary=settings[1],
                                           key=key, statistics=settings[2]),
                               order, on_rows, lock, takers, spare, publishers)
                jobs.append(current)
                pool.submit(current)
            current.put(block, sort=not ordered)
            current.last = span[1] if span is not None else None
            del block
            _raise_any(jobs)
        for job in jobs:  # the last part too is sealed as it is encoded, not once the
            job.end()      # parts before it are published (joined in order below)
        for job in jobs:
            job.join()
        _raise_any(jobs)
        return [j.part for j in jobs if j.part is not None]
    except BaseException:
        for job in jobs:
            job.stop = True
        for job in jobs:
            job.join()
        _parts.discard_parts(disk, [j.part for j in jobs if j.part is not None])
        raise
    finally:
        pool.close()
        takers.close()
        publishers.close()
        source.close()


def _raise_any(jobs: list[_Job]) -> None:
    for job in jobs:
        if job.error is not None:
            raise job.error

"""Writing parts: immutable Parquet files on a disk, written once, checked against the catalog.

A part carries its random id, and the catalog version that names it first, in
the Parquet key-value metadata (its file name carries that version too, see
:mod:`._rollback`). On an encrypted disk that footer is authenticated with the
rest of the file, so a part file replaced by another valid part (or an older
copy) is caught on the first read by comparing the id, the row count and the
size with the catalog.
A part on a plain disk also has the SHA-256 of its whole Parquet byte stream in
the catalog, checked on full reads (:func:`verify_part`, merges, moves, backups):
nothing else would notice a changed byte of it. A part on an encrypted disk has
none: every segment of it is authenticated with AES-GCM under the file's own data
key on every read, and its footer's part id, row count and size identify it, so a
digest would add nothing but a second pass over its bytes as it is written.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import sys
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..disks import Disk, discardable
from ..errors import CatalogError, DatabaseError, DiskFileNotFoundError, FormatError
from . import _lookup, _waits
from ._catalog import PartMeta
from ._fdlimit import out_of_files, too_many_open_files
from ._granule import GRANULE_ROWS, PageScanner
from ._numpy import numpy_valid, numpy_values
from ._rollback import VERSION_KEY, part_file_name
from ._stats import key_range_of

log = logging.getLogger("cryptdisk.db")

__all__ = ["COLUMN_GRANULES_KEY", "KEY_BOUNDS_KEY", "KEY_GRANULES_KEY", "NAN_KEY", "PAGES_KEY",
           "PART_ID_KEY", "check_footer", "column_compression", "column_granules",
           "dictionary_columns", "discard_parts", "fits_schema", "key_bounds", "key_granules",
           "not_as_recorded", "null_free_schema", "statistics_columns", "verify_part",
           "write_parts"]

PART_ID_KEY = b"cryptdisk.part_id"
#: Footer entry: the row groups holding NaN, per floating column (Parquet statistics
#: leave NaN out, and DuckDB orders NaN above every number).
NAN_KEY = b"cryptdisk.nan_row_groups"
#: Footer entry: each row group's minimum and maximum of a signed integer ORDER BY key
#: without NULLs: the key's name, a NUL byte, then every minimum and every maximum as
#: little-endian int64 (see :func:`key_bounds`). A query opening the part reads the key's
#: sparse index from here at once, not from one statistics object per row group.
KEY_BOUNDS_KEY = b"cryptdisk.key_bounds"
#: Footer entry: the minimum and maximum of the same key in every granule (each row
#: group's rows cut into runs of ``GRANULE_ROWS`` from its first row): the key's name, a NUL
#: byte, then little-endian int64s: the granule's rows, the number of row groups, each row
#: group's rows, every granule's minimum, every maximum (see :func:`key_granules`). A point
#: query decodes the key's pages of one granule.
KEY_GRANULES_KEY = b"cryptdisk.key_granules"
#: Footer entry: the page index (see :class:`~._granule.PageScanner`): where each page of
#: each column chunk starts and how many rows it holds, so a query reading a few rows of a
#: row group finds their pages without reading and parsing the chunk's page headers.
PAGES_KEY = b"cryptdisk.pages"
#: Footer entry: per granule (as :data:`KEY_GRANULES_KEY` cuts them), the minimum and
#: maximum of each numeric column but the key (integers of up to 64 bits but UBIGINT, and
#: FLOAT/DOUBLE), NaN and NULL left out, and a byte of facts (:data:`GRANULE_NULL`,
#: :data:`GRANULE_NAN`, :data:`GRANULE_EMPTY`): JSON ``{"granule": rows, "groups": [each
#: row group's rows], "columns": [[name, "i" or "f"], ...]}``, a NUL byte, then per
#: column every minimum and every maximum (little-endian int64 or float64) and every
#: granule's facts (see :func:`column_granules`). A top-N on such a column ranks
#: granules, not row groups (see ``_scan._Stream._top_tasks``).
COLUMN_GRANULES_KEY = b"cryptdisk.column_granules"
#: Granule facts of :data:`COLUMN_GRANULES_KEY`: a NULL, a NaN, no number at all (its
#: minimum and maximum are then 0 and mean nothing).
GRANULE_NULL, GRANULE_NAN, GRANULE_EMPTY = 1, 2, 4
#: Whether parts are written with :data:`PAGES_KEY` and :data:`KEY_GRANULES_KEY` (tests
#: turn it off to write parts as earlier versions did).
WRITE_PAGE_INDEX = True
#: Whether parts are written with :data:`COLUMN_GRANULES_KEY` (tests turn it off to write
#: parts as earlier versions did).
WRITE_COLUMN_GRANULES = True
#: Whether parts are written with a lookup block before the footer (:mod:`._lookup`;
#: tests turn it off to write parts as earlier versions did).
WRITE_LOOKUP = True
COMPRESSION = "lz4"
#: Bytes of Parquet a part's writer gathers (in Arrow's memory, without the GIL) before
#: handing them to Python to be scanned for the page index and encrypted.
SINK_BUFFER = 1 << 20
#: Rows per row group: the granule a filtered scan reads, decrypts and decodes at least.
#: 64Ki rows (8 ClickHouse granules) keep a point query on the key at one small read
#: (about 0.5 MB per 8-byte column) while a full scan's per-row-group costs (footer
#: entries, one decode call each) stay a few percent.
ROW_GROUP_ROWS = 1 << 16


def null_free_schema(schema: pa.Schema, data: pa.Table | pa.RecordBatch) -> pa.Schema:
    """``schema`` with each column that ``data`` holds no NULL in made non-nullable: a part
    written in it stores that column as Parquet REQUIRED, so a scan decodes no definition
    levels for it (pyarrow turns each value's level into a validity bit, about half the CPU
    of decoding a column of 8-byte numbers). The table's columns stay nullable."""
    fields = [f.with_nullable(False) if f.nullable and not data.column(f.name).null_count
              else f for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def fits_schema(schema: pa.Schema, data: pa.Table | pa.RecordBatch) -> bool:
    """Whether ``data`` holds no NULL in a column that ``schema`` (a part's) has REQUIRED."""
    return all(f.nullable or not data.column(f.name).null_count for f in schema)


class _HashingWriter:
    """Hash (``hashing``) and write (encrypt) on a background thread, while pyarrow encodes
    the next pages.

    pyarrow hands ``write`` immutable ``bytes``, so they are queued without a
    copy; hashing and AES-GCM release the GIL, so the two threads overlap.
    ``finish()`` waits for the queue to drain and re-raises any write error.
    """

    def __init__(self, raw: Any, hashing: bool = True, scan: bool = False) -> None:
        self._raw = raw
        #: reads the page headers as they pass, on the writing thread (see PAGES_KEY)
        self.scanner: PageScanner | None = PageScanner() if scan else None
        self._hash = hashlib.sha256() if hashing else None
        self._size = 0
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._thread = _waits.Worker(self._drain, "cryptdisk-part-writer")
        self._thread.start()
        self.closed = False
        self._discard = False
        #: writes held back by :meth:`hold` (the footer), not yet queued
        self._held: list[bytes] | None = None

    def discard(self) -> None:
        """Drop every later write (the part is being discarded)."""
        self._discard = True

    def _drain(self) -> None:
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    if self._hash is not None:
                        self._hash.update(data)
                    self._raw.write(data)
                except BaseException as exc:  # re-raised in the writing thread
                    self._error = exc

    def write(self, data: Any) -> int:
        if self._discard:
            return len(data)
        if self._error is not None:
            raise self._error
        if not isinstance(data, bytes):
            data = bytes(data)
        if self.scanner is not None:
            self.scanner.feed(data)
        if self._held is not None:
            self._held.append(data)
        else:
            self._put(data)
        self._size += len(data)
        return len(data)

    def hold(self) -> None:
        """Keep the writes from now on (pyarrow's footer) until :meth:`release`."""
        self._held = []

    def release(self, block: bytes | None) -> None:
        """Write what :meth:`hold` kept, ``block`` inserted before the Parquet footer it
        ends with (its length in the last 8 bytes): the footer holds no offset of its own,
        so the file stays the same Parquet file (see :mod:`._lookup`)."""
        held, self._held = b"".join(self._held or ()), None
        if block:
            footer = int.from_bytes(held[-8:-4], "little") + 8 if len(held) >= 8 else 0
            if held[-4:] != b"PAR1" or footer > len(held):
                raise FormatError("the part's footer was not where its writer put it")
            held = held[: len(held) - footer] + block + held[len(held) - footer :]
            self._size += len(block)
        if held and not self._discard:
            self._put(held)

    def _put(self, data: bytes | None) -> None:
        # the writing thread ends only on None: a put on an ended one is for nothing
        _waits.put(self._queue, data, self._thread.done.is_set)

    def finish(self) -> None:
        if not self._thread.done.is_set():
            self._put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error

    def tell(self) -> int:
        return self._size

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True  # the disk file is published by its owner, not by pyarrow

    @property
    def digest(self) -> str:
        """The SHA-256 of what was written, or "" when not hashing."""
        return self._hash.hexdigest() if self._hash is not None else ""


class _NaNGroups:
    """Which row groups of each floating column hold a NaN, as the writer splits batches."""

    def __init__(self, schema: pa.Schema) -> None:
        self.columns = [f.name for f in schema if pa.types.is_floating(f.type)]
        self.groups = 0
        self.found: dict[str, list[int]] = {c: [] for c in self.columns}

    def add(self, batch: pa.RecordBatch | pa.Table, group_rows: int) -> None:
        import pyarrow.compute as pc

        n = batch.num_rows
        for start in range(0, n, group_rows):
            piece = batch.slice(start, group_rows)
            for c in self.columns:
                if pc.any(pc.is_nan(piece.column(c))).as_py():
                    self.found[c].append(self.groups)
            self.groups += 1

    def to_json(self) -> bytes:
        import json

        return json.dumps({"row_groups": self.groups, "nan": self.found}).encode()


class _KeyBounds:
    """Each row group's minimum and maximum of a signed integer key, as the writer splits
    batches (see :data:`KEY_BOUNDS_KEY`); none once a NULL key is seen."""

    def __init__(self, schema: pa.Schema, key: str | None) -> None:
        i = schema.get_field_index(key) if key is not None else -1
        self.key = key if i >= 0 and pa.types.is_signed_integer(schema.field(i).type) else None
        self.mins: list[int] = []
        self.maxs: list[int] = []
        self.granule_mins: list[int] = []
        self.granule_maxs: list[int] = []
        self.groups: list[int] = []  # each row group's rows

    def add(self, batch: pa.RecordBatch | pa.Table, group_rows: int) -> None:
        if self.key is None:
            return
        col = batch.column(self.key)
        if col.null_count:
            self.key = None
            return
        for start in range(0, len(col), group_rows):
            piece = numpy_values(col.slice(start, group_rows))  # no copy of one chunk
            self.mins.append(int(piece.min()))
            self.maxs.append(int(piece.max()))
            self.groups.append(len(piece))
            g = GRANULE_ROWS
            whole = len(piece) // g * g
            if whole:
                cut = piece[:whole].reshape(-1, g)
                self.granule_mins += cut.min(axis=1).tolist()
                self.granule_maxs += cut.max(axis=1).tolist()
            if whole < len(piece):
                self.granule_mins.append(int(piece[whole:].min()))
                self.granule_maxs.append(int(piece[whole:].max()))

    def to_bytes(self) -> bytes | None:
        if self.key is None or not self.mins:
            return None
        import array

        values = array.array("q", self.mins + self.maxs)
        if sys.byteorder == "big":
            values.byteswap()
        return self.key.encode() + b"\0" + values.tobytes()

    def granules_to_bytes(self) -> bytes | None:
        if self.key is None or not self.granule_mins:
            return None
        import array

        values = array.array("q", [GRANULE_ROWS, len(self.mins), *self.groups,
                                   *self.granule_mins, *self.granule_maxs])
        if sys.byteorder == "big":
            values.byteswap()
        return self.key.encode() + b"\0" + values.tobytes()


def _granule_kind(typ: pa.DataType) -> str | None:
    """"i" or "f" for a column whose granule bounds :data:`COLUMN_GRANULES_KEY` keeps."""
    if pa.types.is_integer(typ) and not (pa.types.is_unsigned_integer(typ)
                                         and typ.bit_width == 64):
        return "i"
    if pa.types.is_float32(typ) or pa.types.is_float64(typ):
        return "f"
    return None


class _ColumnGranules:
    """Each granule's minimum, maximum and facts of the numeric columns but the key, as
    the writer splits batches (see :data:`COLUMN_GRANULES_KEY`)."""

    def __init__(self, schema: pa.Schema, key: str | None) -> None:
        self.columns = [(f.name, kind) for f in schema
                        if f.name != key and (kind := _granule_kind(f.type)) is not None]
        self.groups: list[int] = []
        self.found: dict[str, tuple[list[Any], list[Any], list[Any]]] = {
            c: ([], [], []) for c, _k in self.columns}

    def add(self, batch: pa.RecordBatch | pa.Table, group_rows: int) -> None:
        import numpy as np

        if not self.columns:
            return
        n = batch.num_rows
        for start in range(0, n, group_rows):
            rows = min(group_rows, n - start)
            self.groups.append(rows)
            starts = np.arange(0, rows, GRANULE_ROWS)
            for c, kind in self.columns:
                col = batch.column(c).slice(start, rows)
                dtype = np.dtype("f8") if kind == "f" else np.dtype("i8")
                with np.errstate(invalid="ignore"):  # a NULL's slot may hold a signaling
                    values = np.asarray(numpy_values(col), dtype=dtype)  # NaN (set to 0 below)
                facts = np.zeros(len(starts), np.uint8)
                number = None  # which rows hold a number (None: all of them)
                if col.null_count:
                    valid = numpy_valid(col)
                    values = np.where(valid, values, dtype.type(0))  # a NULL's slot: 0
                    facts |= np.logical_or.reduceat(~valid, starts).astype(np.uint8) \
                        * GRANULE_NULL
                    number = valid
                if kind == "f":
                    nan = np.isnan(values)
                    if nan.any():
                        facts |= np.logical_or.reduceat(nan, starts).astype(np.uint8) \
                            * GRANULE_NAN
                        number = ~nan if number is None else number & ~nan
                if number is None:
                    mins = np.minimum.reduceat(values, starts)
                    maxs = np.maximum.reduceat(values, starts)
                else:
                    big = np.inf if kind == "f" else np.iinfo(np.int64).max
                    small = -np.inf if kind == "f" else np.iinfo(np.int64).min
                    mins = np.minimum.reduceat(np.where(number, values, big), starts)
                    maxs = np.maximum.reduceat(np.where(number, values, small), starts)
                    empty = ~np.logical_or.reduceat(number, starts)
                    facts |= empty.astype(np.uint8) * GRANULE_EMPTY
                    mins[empty] = 0
                    maxs[empty] = 0
                lo, hi, fl = self.found[c]
                lo.append(mins)
                hi.append(maxs)
                fl.append(facts)

    def to_bytes(self) -> bytes | None:
        import json

        import numpy as np

        if not self.columns or not self.groups:
            return None
        head = json.dumps({"granule": GRANULE_ROWS, "groups": self.groups,
                           "columns": [[c, k] for c, k in self.columns]}).encode()
        out = [head, b"\0"]
        for c, kind in self.columns:
            lo, hi, fl = self.found[c]
            dtype = "<f8" if kind == "f" else "<i8"
            out += (np.concatenate(lo).astype(dtype).tobytes(),
                    np.concatenate(hi).astype(dtype).tobytes(),
                    np.concatenate(fl).astype(np.uint8).tobytes())
        return b"".join(out)


def column_granules(metadata: dict[bytes, bytes] | None, column: str, row_groups: int,
                    rows: int) -> tuple[int, list[int], Any, Any, Any] | None:
    """``(granule rows, each row group's rows, minima, maxima, facts)`` of ``column`` per
    granule (numpy arrays) from a part footer's :data:`COLUMN_GRANULES_KEY` entry; None
    when there is no such entry for ``column`` or it does not describe ``row_groups`` row
    groups of ``rows`` rows in all."""
    raw = (metadata or {}).get(COLUMN_GRANULES_KEY)
    if raw is None:
        return None
    import json

    import numpy as np

    head, sep, data = raw.partition(b"\0")
    try:
        doc = json.loads(head)
        g, groups, columns = doc["granule"], doc["groups"], doc["columns"]
        if not (isinstance(g, int) and g > 0 and isinstance(groups, list)
                and len(groups) == row_groups
                and all(isinstance(r, int) and r > 0 for r in groups)
                and sum(groups) == rows and isinstance(columns, list)):
            return None
        count = sum(-(-r // g) for r in groups)
        at = 0
        for name, kind in columns:
            if kind not in ("i", "f"):
                return None
            if name == column:
                dtype = np.dtype("<f8" if kind == "f" else "<i8")
                if not sep or at + 17 * count > len(data):
                    return None
                mins = np.frombuffer(data, dtype, count, at)
                maxs = np.frombuffer(data, dtype, count, at + 8 * count)
                facts = np.frombuffer(data, np.uint8, count, at + 16 * count)
                return g, groups, mins, maxs, facts
            at += 17 * count
    except (ValueError, TypeError, KeyError):
        return None
    return None


def key_granules(metadata: dict[bytes, bytes] | None, column: str, row_groups: int,
                 rows: int) -> tuple[int, list[int], Sequence[int], Sequence[int]] | None:
    """``(granule rows, each row group's rows, minima, maxima)`` of ``column`` per granule
    from a part footer's :data:`KEY_GRANULES_KEY` entry; None when there is no such entry
    for ``column`` or it does not describe ``row_groups`` row groups of ``rows`` rows in
    all, one granule per run of that many rows of each. The minima and maxima stay packed
    (``array.array`` of int64): a query looks at a few granules, and a 10M-row part has
    1,224 (as Python ints, about 0.3M instructions of a cold query's open)."""
    raw = (metadata or {}).get(KEY_GRANULES_KEY)
    if raw is None:
        return None
    name, sep, data = raw.partition(b"\0")
    if not sep or name != column.encode() or len(data) % 8 or len(data) < 16:
        return None
    import array

    values = array.array("q")
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    g, n = values[0], values[1]
    if g <= 0 or n != row_groups or len(values) < 2 + n:
        return None
    groups = values[2 : 2 + n].tolist()
    if sum(groups) != rows or min(groups, default=0) <= 0:
        return None
    count = sum(-(-r // g) for r in groups)
    if len(values) != 2 + n + 2 * count:
        return None
    return g, groups, values[2 + n : 2 + n + count], values[2 + n + count :]


def key_bounds(metadata: dict[bytes, bytes] | None, column: str,
               row_groups: int) -> list[tuple[Any, Any] | None] | None:
    """Per row group, ``(min, max)`` of ``column`` from a part footer's
    :data:`KEY_BOUNDS_KEY` entry (``metadata``: the footer's key-value pairs), or None
    when there is no such entry for ``column`` with ``row_groups`` row groups."""
    raw = (metadata or {}).get(KEY_BOUNDS_KEY)
    if raw is None:
        return None
    name, sep, data = raw.partition(b"\0")
    if not sep or name != column.encode() or len(data) != 16 * row_groups or not row_groups:
        return None
    import array

    values = array.array("q")
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    found = values.tolist()
    return list(zip(found[:row_groups], found[row_groups:], strict=True))


#: A column whose first rows are more than this share distinct values is written without
#: a dictionary: pyarrow would build one per row group and drop it past its page limit.
DICTIONARY_MAX_DISTINCT = 0.5
_SAMPLE_ROWS = 1 << 16


def dictionary_columns(batch: pa.RecordBatch, schema: pa.Schema) -> list[str] | bool:
    """The columns worth a dictionary, judged on the first rows of an insert's first batch.

    True (pyarrow's default: every column) when the schema has nested columns (their
    leaves have other names) or the sample is small; else the columns whose sample has
    at most :data:`DICTIONARY_MAX_DISTINCT` distinct values per row (unique keys, hashes
    and measurements go without: their dictionaries would cost writing time and end up
    dropped).
    """
    import pyarrow.compute as pc

    if batch.num_rows < 4096 or any(pa.types.is_nested(f.type) for f in schema):
        return True
    sample = batch.slice(0, _SAMPLE_ROWS)
    keep = []
    for f in schema:
        col = sample.column(sample.schema.get_field_index(f.name))
        most = DICTIONARY_MAX_DISTINCT * len(col)
        # more distinct values than that in the first rows alone: so in all of them (the
        # hashing of half the rows for a column of unique values)
        first = col.slice(0, int(most) + 1)
        if len(first) < len(col) and pc.count_distinct(first).as_py() > most:
            continue
        if pc.count_distinct(col).as_py() <= most:
            keep.append(f.name)
    return keep


#: Runs of an insert's first rows (in the part's order) whose ranges of a text column
#: :func:`statistics_columns` compares.
_STATISTICS_RUNS = 8


def _text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t)
                or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def statistics_columns(batch: pa.RecordBatch, schema: pa.Schema,
                       dictionary: list[str] | bool, order: list[str]) -> list[str] | bool:
    """The columns whose pages and row groups get Parquet statistics (min, max, NULLs),
    judged on the first rows of an insert's first batch.

    Every column but a text or binary one that is not in ``order`` (the ORDER BY), was
    given no ``dictionary`` (more than half its sampled values distinct) and is spread
    evenly: the sample in the part's row order (sorted by ``order``) cut into
    :data:`_STATISTICS_RUNS` runs, every run's range holds a value of every other's
    (hashes, UUIDs, random text). Such a column's row groups would each span nearly all
    its values, so no filter is decided by them, while computing them (a comparison of
    every string) was a fifth of the Parquet encoding of the benchmark's rows. True
    (every column) when none is left out, the schema has nested columns or names with a
    dot (pyarrow names statistics by leaf path), or the sample is small.
    """
    if (batch.num_rows < 4096 or any(pa.types.is_nested(f.type) for f in schema)
            or any("." in f.name for f in schema)):
        return True
    if isinstance(dictionary, bool):  # (every column has a dictionary, or none does)
        dictionary = [f.name for f in schema] if dictionary else []
    text = [f.name for f in schema if _text(f.type) and f.name not in order
            and f.name not in dictionary]
    if not text:
        return True
    import pyarrow.compute as pc

    sample = batch.slice(0, _SAMPLE_ROWS)
    if order:
        try:
            sample = sample.take(pc.sort_indices(
                sample, sort_keys=[(c, "ascending") for c in order]))
        except (pa.ArrowException, KeyError):
            return True
    n = sample.num_rows
    size = -(-n // _STATISTICS_RUNS)
    spread = set()
    for name in text:
        col = sample.column(sample.schema.get_field_index(name))
        lows, highs = [], []
        for start in range(0, n, size):
            found = pc.min_max(col.slice(start, size))
            if found["min"].is_valid:
                lows.append(found["min"].as_py())
                highs.append(found["max"].as_py())
        if len(lows) == _STATISTICS_RUNS and max(lows) < min(highs):
            spread.add(name)
    return [f.name for f in schema if f.name not in spread] if spread else True


#: A column is compressed (LZ4) only if its sample's Parquet pages shrink by at least this
#: share: LZ4 costs about as much CPU as the rest of a column's encoding, and on near-random
#: bytes (hashes, random keys and floats) saves a few percent at best.
COMPRESSION_MIN_SAVING = 0.10


def column_compression(batch: pa.RecordBatch, schema: pa.Schema,
                       dictionary: list[str] | bool) -> dict[str, str] | str:
    """Each column's codec, judged on the first rows of an insert's first batch.

    The sample (the rows :func:`dictionary_columns` judged, encoded with its choice) is
    written to memory with LZ4; a column whose pages shrink by less than
    :data:`COMPRESSION_MIN_SAVING` is written uncompressed, the others with LZ4.
    :data:`COMPRESSION` for every column (a str) when the schema has nested columns or
    names with a dot (pyarrow keys codecs by leaf path), or the sample is small.
    """
    if (batch.num_rows < 4096 or any(pa.types.is_nested(f.type) for f in schema)
            or any("." in f.name for f in schema)):
        return COMPRESSION
    sample = batch.slice(0, _SAMPLE_ROWS)
    if sample.schema != schema:
        sample = sample.cast(schema)
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, compression=COMPRESSION,
                          use_dictionary=dictionary) as writer:
        writer.write_batch(sample)
    group = pq.read_metadata(pa.BufferReader(sink.getvalue())).row_group(0)
    chosen = {}
    for j in range(group.num_columns):
        col = group.column(j)
        raw = col.total_uncompressed_size
        saved = 1 - col.total_compressed_size / raw if raw else 0.0
        chosen[col.path_in_schema] = COMPRESSION if saved >= COMPRESSION_MIN_SAVING else "none"
    return chosen


#: what :meth:`_Prefetch.next` takes when its thread ended without a result (stopped)
_GONE: tuple[pa.RecordBatch | None, BaseException | None] = (None, Exception())


class _Prefetch:
    """Pull the next batches on another thread while the writer encodes the current one.

    DuckDB produces (sorts, converts to Arrow) and pyarrow encodes, both without the
    GIL, so the two overlap on two cores. At most ``depth`` batches wait. An error of
    the source is raised by :meth:`next`; :meth:`close` stops the thread and waits
    for it (the source, a DuckDB result, must not be in use when the caller goes on).
    """

    def __init__(self, it: Iterable[pa.RecordBatch], depth: int = 2) -> None:
        self._it = iter(it)
        self._queue: queue.Queue[tuple[pa.RecordBatch | None, BaseException | None]] = \
            queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = _waits.Worker(self._run, "cryptdisk-insert-source")
        self._thread.start()

    def _put(self, item: tuple[pa.RecordBatch | None, BaseException | None]) -> bool:
        return _waits.put(self._queue, item, self._stop.is_set)

    def _run(self) -> None:
        try:
            for batch in self._it:
                if not self._put((batch, None)):
                    return
            self._put((None, None))
        except BaseException as exc:  # handed to the writing thread
            self._put((None, exc))

    def next(self) -> pa.RecordBatch | None:
        batch, error = _waits.get(self._queue, self._thread.done.is_set, _GONE)
        if error is _GONE[1]:  # a fresh error each time: the traceback is this one's
            error = DatabaseError("the insert's source ended without a result")
        if error is not None:
            raise error
        return batch

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._it = iter(())  # the source (a DuckDB result) is not kept alive by this


class _PartWriter:
    """One part being written: Parquet encoding here, hashing and encryption on a thread.

    :meth:`write` takes a table or batch (cast to the part's schema) and splits it into
    row groups of :data:`ROW_GROUP_ROWS`; :meth:`finish` publishes the part (atomic
    rename on the disk) and returns its catalog entry, or None (removing the file) if
    no row was written; :meth:`abort` discards it.
    """

    def __init__(self, disk: Disk, prefix: str, schema: pa.Schema, *, version: int,
                 compression: dict[str, str] | str, dictionary: list[str] | bool,
                 key: str | None, statistics: list[str] | bool = True) -> None:
        self.disk, self.schema, self.key = disk, schema, key
        self.part_id = uuid.uuid4().hex
        self._version = str(version).encode()
        self.path = f"{prefix}/{part_file_name(version, self.part_id)}"
        self.rows = 0
        self._raw = disk.open_write(self.path)
        #: one leaf column per field: the page index can say which chunk a page is of
        self._leaves = len(schema) if not any(pa.types.is_nested(f.type) for f in schema) \
            else 0
        self._groups: list[int] = []  # each row group's rows, as the writer splits batches
        self._sink = _HashingWriter(self._raw, hashing=not disk.is_encrypted,
                                    scan=self._leaves > 0 and WRITE_PAGE_INDEX)
        meta_schema = schema.with_metadata({PART_ID_KEY: self.part_id.encode(),
                                            VERSION_KEY: str(version).encode()})
        try:
            # pyarrow writes each page header and page body as its own write: buffered
            # here in Arrow's memory (no GIL), they reach Python SINK_BUFFER bytes at a time
            self._buffered = pa.BufferedOutputStream(pa.PythonFile(self._sink, mode="w"),
                                                     SINK_BUFFER)
            self._writer = pq.ParquetWriter(self._buffered, meta_schema,
                                            compression=compression,
                                            use_dictionary=dictionary,
                                            write_statistics=statistics,
                                            max_rows_per_page=GRANULE_ROWS,
                                            write_batch_size=GRANULE_ROWS)
        except BaseException:
            self.abort()
            raise
        self._nans = _NaNGroups(schema)
        self._bounds = _KeyBounds(schema, key)
        self._granules = _ColumnGranules(schema, key)

    def write(self, data: pa.Table | pa.RecordBatch) -> None:
        if not data.num_rows:
            return
        if data.schema != self.schema:
            data = data.cast(self.schema)
        if isinstance(data, pa.RecordBatch):
            self._writer.write_batch(data, row_group_size=ROW_GROUP_ROWS)
        else:  # row groups of ROW_GROUP_ROWS across the table's chunks
            self._writer.write_table(data, row_group_size=ROW_GROUP_ROWS)
        self._nans.add(data, ROW_GROUP_ROWS)
        self._bounds.add(data, ROW_GROUP_ROWS)
        if WRITE_COLUMN_GRANULES:
            self._granules.add(data, ROW_GROUP_ROWS)
        n = data.num_rows
        self._groups += [ROW_GROUP_ROWS] * (n // ROW_GROUP_ROWS) + (
            [n % ROW_GROUP_ROWS] if n % ROW_GROUP_ROWS else [])
        self.rows += n

    def finish(self) -> PartMeta | None:
        """:meth:`seal` then :meth:`publish` the part."""
        self.seal()
        return self.publish()

    def seal(self) -> None:
        """Write the part's footer and wait for its last bytes to reach the disk file (not
        yet published); on an error the part is discarded."""
        try:
            extra = {NAN_KEY: self._nans.to_json()}
            bounds = self._bounds.to_bytes()
            if bounds is not None:
                extra[KEY_BOUNDS_KEY] = bounds
            granules = self._bounds.granules_to_bytes() if WRITE_PAGE_INDEX else None
            if granules is not None:
                extra[KEY_GRANULES_KEY] = granules
            columns = self._granules.to_bytes() if WRITE_COLUMN_GRANULES else None
            if columns is not None:
                extra[COLUMN_GRANULES_KEY] = columns
            self._buffered.flush()  # every page written so far through the scanner
            scanner, self._sink.scanner = self._sink.scanner, None  # the footer is no page
            pages = scanner.to_bytes(self._groups, self._leaves) if scanner else None
            if pages is not None:
                extra[PAGES_KEY] = pages
            self._writer.add_key_value_metadata(extra)
            self._sink.hold()  # the footer, to go after the lookup block
            self._writer.close()
            self._buffered.flush()  # the footer's last bytes, to the sink
            block = (_lookup.build(self._writer.writer.metadata,
                                   {PART_ID_KEY: self.part_id.encode(),
                                    VERSION_KEY: self._version, **extra})
                     if WRITE_LOOKUP and self.rows else None)
            self._sink.release(block)
        except BaseException:
            self.abort()
            raise
        try:
            self._sink.finish()  # the hashing thread's last writes
        except BaseException:
            self.abort()
            raise

    def publish(self) -> PartMeta | None:
        """Publish the part :meth:`seal` wrote (on a local disk: ``fsync``, rename, ``fsync``
        of its directory) and return its catalog entry, or None (the file removed) if it
        has no row."""
        try:
            self._raw.close()  # publishes the file
            if self.rows == 0:  # nothing to keep
                self.disk.remove(self.path)
                return None
            info = self.disk.info(self.path)
        except BaseException:
            # (the file may be in place: renamed, then its directory's fsync failed) no
            # catalog will name it: it goes, not at the next writer's open
            with contextlib.suppress(Exception):
                self.disk.remove(self.path)
            raise
        lo, hi = (key_range_of(self._writer.writer.metadata, self.key) if self.key else None
                  ) or (None, None)
        return PartMeta(self.part_id, self.disk.name, self.path, self.rows, self._sink.tell(),
                        self._sink.digest, info.key_id, info.algorithm, info.stored_size,
                        key_min=lo, key_max=hi)

    def abort(self) -> None:
        """Discard the part: the disk's temporary file goes, nothing is published. Errors
        of the discarded writes are dropped; a Ctrl-C (or SystemExit) meanwhile is raised
        once the temporary file is gone."""
        self._sink.discard()  # what pyarrow and the buffer still hold goes nowhere
        signal: BaseException | None = None
        writer = getattr(self, "_writer", None)
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: S110 (the discarded part's: it goes nowhere)
                pass
            except BaseException as exc:
                signal = exc
        while True:  # the disk thread ends before its file is discarded
            try:
                self._sink.finish()
            except Exception:  # noqa: S110 (the discarded writes')
                pass
            except BaseException as exc:
                if exc is not self._sink._error:  # (the writes' own error: dropped)
                    signal = signal or exc
                    if not self._sink._thread.done.is_set():
                        continue  # (its wait was interrupted: wait again)
            break
        try:
            discardable(self._raw).abort()  # the Disk contract's discard
        finally:
            if signal is not None:
                raise signal


def _whole_groups(next_batch: Callable[[], pa.RecordBatch | None],
                  rows: int) -> Iterator[pa.Table]:
    """The batches ``next_batch()`` returns (None at the end), as tables of a multiple of
    ``rows`` rows, the last one shorter: each is written as whole row groups, so every row
    group of a part holds ``rows`` rows but its last, whatever sizes the batches come in
    (DuckDB's sorted output for a merge may start with a batch of a few rows, which would
    otherwise become a row group of its own, and alone decide the part's encodings)."""
    held: list[pa.RecordBatch] = []
    n = 0
    while (batch := next_batch()) is not None:
        if not batch.num_rows:
            continue
        held.append(batch)
        n += batch.num_rows
        if n >= rows:
            table = pa.Table.from_batches(held)
            cut = n - n % rows
            yield table.slice(0, cut)
            rest = table.slice(cut)
            held, n = rest.to_batches(), rest.num_rows
    if n:
        yield pa.Table.from_batches(held)


def write_parts(disk: Disk, prefix: str, batches: Iterable[pa.RecordBatch], schema: pa.Schema,
                *, version: int, max_rows: int,
                on_rows: Callable[[int], None] | None = None,
                key: str | None = None, null_free: bool = False) -> list[PartMeta]:
    """Write ``batches`` as they come, in parts of at most ``max_rows`` rows each, in row
    groups of :data:`ROW_GROUP_ROWS` rows (a part's last one may be shorter).

    With ``null_free``, each part stores as Parquet REQUIRED the columns its first rows
    (a few row groups) hold no NULL in (:func:`null_free_schema`), and ends early, before
    rows with a NULL in one of those.

    ``version`` is the catalog version that will name the parts (the loaded
    catalog's plus one); it goes into each part's name and footer. With ``key``
    (the first ORDER BY column), each part's min and max of it (from the row
    groups' statistics, which the part's footer holds too) are recorded in its
    catalog entry: the part-level sparse index.

    Returns the new parts (already on disk, not yet in the catalog). If this
    raises, the parts written so far are removed (:func:`discard_parts`); the caller
    records nothing.
    """
    source = _Prefetch(batches)
    parts: list[PartMeta] = []
    try:
        pieces = _whole_groups(source.next, ROW_GROUP_ROWS)
        pending = next(pieces, None)
        sample = (pending.slice(0, _SAMPLE_ROWS).combine_chunks().to_batches()[0]
                  if pending is not None else None)
        dictionary = dictionary_columns(sample, schema) if sample is not None else True
        compression = (column_compression(sample, schema, dictionary) if sample is not None
                       else COMPRESSION)
        statistics = (statistics_columns(sample, schema, dictionary, [key] if key else [])
                      if sample is not None else True)
        del sample
        while pending is not None:
            writer = _PartWriter(disk, prefix, null_free_schema(schema, pending) if null_free
                                 else schema, version=version,
                                 compression=compression, dictionary=dictionary, key=key,
                                 statistics=statistics)
            try:
                while (pending is not None and writer.rows < max_rows
                       and (not writer.rows or fits_schema(writer.schema, pending))):
                    room = max_rows - writer.rows  # the part ends at max_rows rows
                    piece = pending.slice(0, room) if pending.num_rows > room else pending
                    writer.write(piece)
                    if on_rows is not None and piece.num_rows:
                        on_rows(piece.num_rows)
                    pending = (pending.slice(room) if piece is not pending
                               else next(pieces, None))
            except BaseException:
                writer.abort()
                raise
            part = writer.finish()
            if part is not None:
                parts.append(part)
        return parts
    except BaseException:
        discard_parts(disk, parts)
        raise
    finally:
        source.close()


def discard_parts(disk: Disk, parts: Iterable[PartMeta]) -> None:
    """Remove the files of ``parts``, written by an insert that failed (no catalog names
    them, none will: their version is the next one's, which this writer holds). One that
    cannot be removed stays an orphan for the next writer's open to remove, as after a
    crash; the insert's own error is the one raised."""
    for part in parts:
        try:
            disk.remove(part.path)
        except (FileNotFoundError, DiskFileNotFoundError):
            pass
        except OSError as exc:
            log.warning("cryptdisk: removing part %s of a failed insert failed (%s): the "
                        "next writer's open removes it", part.path, type(exc).__name__)


def not_as_recorded(disk: Disk, part: PartMeta, exc: BaseException) -> CatalogError:
    """The error for a part file that is not what the catalog recorded (``exc`` says how)."""
    how = "an encrypted" if part.is_encrypted else "a plain"
    return CatalogError(
        f"part {part.path} on disk {disk.name!r} is not what the catalog recorded ({how} "
        f"Parquet part): {type(exc).__name__}: {exc}",
        hint="restore the part from a backup, or open the database with the config it "
        "was written with")


def check_footer(f: Any, disk: Disk, part: PartMeta) -> None:
    """The open part ``f`` is the catalog's ``part``: its size, and its footer's part id and
    row count (the footer read through ``f``, so authenticated on an encrypted disk)."""
    size = int(f.size)
    tail = bytes(f.pread(size - 8, 8)) if size >= 12 else b""
    footer = int.from_bytes(tail[:4], "little") + 8 if tail[4:] == b"PAR1" else size + 1
    try:
        if size != part.bytes:
            raise ValueError(f"{size} bytes, the catalog says {part.bytes}")
        if footer > size - 4:
            raise ValueError("not a Parquet file")
        meta = pq.read_metadata(pa.BufferReader(f.pread(size - footer, footer)))
        found = (meta.metadata or {}).get(PART_ID_KEY, b"").decode("ascii", "replace")
        if found != part.id or meta.num_rows != part.rows:
            raise ValueError(f"part id {found or 'none'} with {meta.num_rows} rows, the "
                             f"catalog names {part.id} with {part.rows}")
    except (ValueError, pa.ArrowException) as exc:
        raise not_as_recorded(disk, part, exc) from None


def verify_part(disk: Disk, part: PartMeta) -> None:
    """Read every byte of a part and check it is the part the catalog recorded.

    A part with a SHA-256 in the catalog (every part on a plain disk) must match it. A
    part without one must be on an encrypted disk: reading it authenticates every segment
    (AES-GCM), and its size and its footer's part id and row count must be the catalog's.
    """
    if not part.sha256 and not (part.is_encrypted and disk.is_encrypted):
        raise CatalogError(f"part {part.path} on disk {disk.name!r} has no SHA-256 in the "
                           "catalog, which only a part on an encrypted disk may lack",
                           hint="restore the part (or the catalog) from a backup")
    digest = hashlib.sha256() if part.sha256 else None
    try:
        with disk.open_read(part.path) as f:
            if digest is None:
                check_footer(f, disk, part)
            while chunk := f.read(8 << 20):
                if digest is not None:
                    digest.update(chunk)
    except (FileNotFoundError, DiskFileNotFoundError):
        raise CatalogError(f"part {part.path} is missing on disk {disk.name!r}") from None
    except FormatError as exc:
        raise not_as_recorded(disk, part, exc) from None
    except OSError as exc:
        if out_of_files(exc):
            raise too_many_open_files(f"verifying part {part.path} on disk {disk.name!r}",
                                      exc) from None
        raise
    if digest is not None and digest.hexdigest() != part.sha256:
        raise CatalogError(f"part {part.path} on disk {disk.name!r} does not match the "
                           "SHA-256 the catalog recorded (replaced or rolled back)")

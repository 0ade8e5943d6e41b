"""Reading one granule (a few Parquet pages) of a column chunk instead of the whole chunk.

Parts are written with pages of at most :data:`GRANULE_ROWS` rows. A column
chunk is a sequence of pages, each a small Thrift header (its kind, sizes and
number of values) followed by its bytes. To decode rows ``r0..r1`` of a row
group, :func:`page_spans` walks the page headers of a chunk (reading each
header's bytes only), and :func:`decode_pages` hands pyarrow a small Parquet
file of its own: the chunk's dictionary page if it has one and the data pages
that hold those rows, under a footer written here that describes just them.
pyarrow decodes it as any file. Only flat columns of plain types take this
path (:func:`granule_schema` says which); anything it cannot describe is read
whole by the caller.

The bytes come from the part as the caller reads it: on an encrypted disk,
from segments that have authenticated.
"""

from __future__ import annotations

import array
import importlib
import itertools
import operator
import sys
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

__all__ = ["GRANULE_ROWS", "PageIndex", "PageScanner", "PageSpan", "decode_chunk_pages",
           "decode_one_width_chunk", "decode_page_rows", "decode_pages", "decode_plain_pages",
           "granule_schema",
           "leaf_schema", "page_spans", "plain_page_prefix", "plain_page_problem", "walked_all"]

#: Rows per Parquet data page (ClickHouse's granule): a point query decodes one page
#: per column where it would decode a whole row group.
GRANULE_ROWS = 8192

# Thrift compact protocol type ids
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = \
    range(1, 13)
_PHYSICAL = {"BOOLEAN": 0, "INT32": 1, "INT64": 2, "FLOAT": 4, "DOUBLE": 5, "BYTE_ARRAY": 6}
_CODECS = {"UNCOMPRESSED": 0, "SNAPPY": 1, "GZIP": 2, "BROTLI": 4, "ZSTD": 6, "LZ4": 7}
_ENCODINGS = {"PLAIN": 0, "PLAIN_DICTIONARY": 2, "RLE": 3, "BIT_PACKED": 4,
              "DELTA_BINARY_PACKED": 5, "DELTA_LENGTH_BYTE_ARRAY": 6, "DELTA_BYTE_ARRAY": 7,
              "RLE_DICTIONARY": 8, "BYTE_STREAM_SPLIT": 9}
#: (physical type, logical type) -> (Arrow type, converted type id, LogicalType field id)
_TYPES: dict[tuple[str, str], tuple[pa.DataType, int | None, int | None]] = {
    ("INT64", "None"): (pa.int64(), None, None),
    ("INT32", "None"): (pa.int32(), None, None),
    ("DOUBLE", "None"): (pa.float64(), None, None),
    ("FLOAT", "None"): (pa.float32(), None, None),
    ("BOOLEAN", "None"): (pa.bool_(), None, None),
    ("BYTE_ARRAY", "String"): (pa.string(), 0, 1),  # UTF8, LogicalType.STRING
    ("INT32", "Date"): (pa.date32(), 6, 6),  # DATE, LogicalType.DATE
}
_DICTIONARY_PAGE = 2

try:  # PLAIN BYTE_ARRAY pages decoded in C (csrc/cryptdisk_db/csort.c), no type stubs (Any)
    _BYTE_ARRAY_PAGE: Any = importlib.import_module(
        f"{__package__}._csort").byte_array_page
except (ImportError, AttributeError):  # pragma: no cover - not built: one-width strings only
    _BYTE_ARRAY_PAGE = None
try:  # a page's strings of one length copied into an array's data, in C (no type stubs)
    _ONE_WIDTH_INTO: Any = importlib.import_module(f"{__package__}._csort").one_width_into
except (ImportError, AttributeError):  # pragma: no cover - not built (or built before it)
    _ONE_WIDTH_INTO = None
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3


class PageError(ValueError):
    """A page header that is not what a Parquet writer writes (the caller reads the chunk
    whole, which reports the damage as any read does)."""


# -- Thrift compact protocol: read a struct, write the few a footer needs ------------------

def _varint(buf: Any, pos: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if pos >= len(buf):
            raise PageError("truncated page header")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 70:
            raise PageError("overlong varint in a page header")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _read_value(buf: Any, pos: int, t: int, depth: int) -> tuple[Any, int]:
    if t in (_TRUE, _FALSE):
        return t == _TRUE, pos
    if t == _BYTE:
        if pos >= len(buf):
            raise PageError("truncated page header")
        return buf[pos], pos + 1
    if t in (_I16, _I32, _I64):
        n, pos = _varint(buf, pos)
        return _zigzag(n), pos
    if t == _DOUBLE:
        if pos + 8 > len(buf):
            raise PageError("truncated page header")
        return None, pos + 8
    if t == _BINARY:
        n, pos = _varint(buf, pos)
        if pos + n > len(buf):
            raise PageError("truncated page header")
        return None, pos + n  # (statistics: not needed)
    if t in (_LIST, _SET):
        if pos >= len(buf):
            raise PageError("truncated page header")
        head = buf[pos]
        pos += 1
        size, et = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        for _ in range(size):
            _, pos = _read_value(buf, pos, _BYTE if et in (_TRUE, _FALSE) else et, depth)
        return None, pos
    if t == _STRUCT:
        return _read_struct(buf, pos, depth + 1)
    raise PageError(f"unexpected Thrift type {t} in a page header")


def _read_struct(buf: Any, pos: int, depth: int = 0) -> tuple[dict[int, Any], int]:
    if depth > 8:
        raise PageError("page header nested too deeply")
    fields: dict[int, Any] = {}
    fid = 0
    while True:
        if pos >= len(buf):
            raise PageError("truncated page header")
        head = buf[pos]
        pos += 1
        if head == 0:
            return fields, pos
        t, delta = head & 0x0F, head >> 4
        if delta:
            fid += delta
        else:
            n, pos = _varint(buf, pos)
            fid = _zigzag(n)
        fields[fid], pos = _read_value(buf, pos, t, depth)


def _w_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _w_int(out: bytearray, n: int) -> None:
    _w_varint(out, (n << 1) ^ (n >> 63))


def _w_struct(out: bytearray, fields: list[tuple[int, int, Any]]) -> None:
    """Write a struct of ``(field id, type, value)`` in ascending field order."""
    last = 0
    for fid, t, value in fields:
        wire = (_TRUE if value else _FALSE) if t == _TRUE else t
        if 0 < fid - last <= 15:
            out.append(((fid - last) << 4) | wire)
        else:
            out.append(wire)
            _w_int(out, fid)
        last = fid
        if t in (_I32, _I64):
            _w_int(out, value)
        elif t == _BINARY:
            _w_varint(out, len(value))
            out += value
        elif t == _STRUCT:
            _w_struct(out, value)
        elif t == _LIST:
            et, items = value
            if len(items) < 15:
                out.append((len(items) << 4) | et)
            else:
                out.append(0xF0 | et)
                _w_varint(out, len(items))
            for item in items:
                if et == _STRUCT:
                    _w_struct(out, item)
                elif et == _BINARY:
                    _w_varint(out, len(item))
                    out += item
                else:
                    _w_int(out, item)
    out.append(0)


# -- pages ---------------------------------------------------------------------------------

class PageSpan:
    """One page of a column chunk: its bytes ``start..end`` in the file (header included),
    and, for a data page, the rows ``first_row..first_row + rows`` of the row group."""

    __slots__ = ("dictionary", "end", "first_row", "rows", "start")

    def __init__(self, start: int, end: int, first_row: int, rows: int,
                 dictionary: bool) -> None:
        self.start, self.end, self.first_row, self.rows = start, end, first_row, rows
        self.dictionary = dictionary


def page_spans(read: Callable[[int, int], Any], start: int, end: int,
               num_values: int, until: int | None = None,
               walked: list[PageSpan] | None = None) -> list[PageSpan]:
    """The pages of the column chunk at ``start..end`` of the file, from their headers.

    ``read(offset, n)`` returns up to ``n`` bytes of the file at ``offset``. The
    pages' values must add up to the chunk's ``num_values`` (a flat column: one value
    a row) and their bytes to its length; otherwise :class:`PageError`.

    With ``until``, the walk stops once its data pages hold row ``until`` (every page
    before is walked, so the pages' first rows are exact): the list then ends
    before ``end`` (see :func:`walked_all`), and the totals are checked only by a walk
    that reaches the chunk's end. ``walked``: the pages a stopped walk returned, to
    continue from (a new list is returned).
    """
    spans: list[PageSpan] = list(walked or ())
    pos = spans[-1].end if spans else start
    rows = sum(p.rows for p in spans)
    while pos < end:
        if until is not None and rows > until:
            return spans
        want = min(256, end - pos)
        while True:
            head = read(pos, want)
            try:
                header, used = _read_struct(head, 0)
                break
            except PageError:
                if want >= end - pos or want >= 1 << 20:
                    raise
                want = min(end - pos, want * 4)  # a long header (statistics of long strings)
        kind, size = header.get(1), header.get(3)
        if not isinstance(size, int) or size < 0:
            raise PageError(f"a page header at offset {pos} without a page size")
        page_end = pos + used + size
        if page_end > end:
            raise PageError(f"a page at offset {pos} runs past its column chunk")
        if kind == _DICTIONARY_PAGE:
            if spans:
                raise PageError("a dictionary page after a data page")
            spans.append(PageSpan(pos, page_end, 0, 0, True))
        elif kind in (_DATA_PAGE, _DATA_PAGE_V2):
            sub = header.get(5 if kind == _DATA_PAGE else 8)
            n = sub.get(1) if isinstance(sub, dict) else None
            if not isinstance(n, int) or n < 0:
                raise PageError(f"a data page at offset {pos} without its number of values")
            spans.append(PageSpan(pos, page_end, rows, n, False))
            rows += n
        else:
            raise PageError(f"a page of kind {kind!r} at offset {pos}")
        pos = page_end
    if rows != num_values:
        raise PageError(f"the pages hold {rows} values, the column chunk {num_values}")
    return spans


def plain_page_prefix(rows: int, body: int) -> bytes:
    """The first bytes of the header a Parquet writer (pyarrow's) writes before a data page
    of ``rows`` values stored as they are in ``body`` bytes: its kind (DATA_PAGE), both
    sizes ``body``, and the start of its ``DataPageHeader`` (``rows`` values, PLAIN). A
    header that begins so describes that page; one that does not is checked field by field
    (:func:`plain_page_problem`: a CRC or a version 2 header is written so too)."""
    out = bytearray(b"\x15\x00\x15")  # type = DATA_PAGE, then uncompressed_page_size
    _w_int(out, body)
    out.append(0x15)  # compressed_page_size
    _w_int(out, body)
    out += b"\x2c\x15"  # data_page_header (field 5): num_values
    _w_int(out, rows)
    out += b"\x15\x00"  # encoding = PLAIN
    return bytes(out)


def plain_page_problem(head: Any, rows: int, body: int) -> str | None:
    """What is wrong with ``head`` as the header of a data page of ``rows`` values stored
    as they are (uncompressed, PLAIN, no levels) in the ``body`` bytes right after it, or
    None if it is such a header: one whole Thrift ``PageHeader`` (no byte before the body
    left over), a data page whose sizes are ``body`` and whose values are ``rows``."""
    try:
        header, used = _read_struct(head, 0)
    except PageError as exc:
        return str(exc)
    if used != len(head):
        return f"a page header of {used} bytes where {len(head)} precede the values"
    kind = header.get(1)
    if kind not in (_DATA_PAGE, _DATA_PAGE_V2):
        return f"a page of kind {kind!r}, not a data page"
    if header.get(2) != body or header.get(3) != body:
        return (f"a page of {header.get(3)!r} bytes ({header.get(2)!r} uncompressed) "
                f"where its values take {body}")
    sub = header.get(5 if kind == _DATA_PAGE else 8)
    if not isinstance(sub, dict) or sub.get(1) != rows:
        found = sub.get(1) if isinstance(sub, dict) else None
        return f"a data page of {found!r} values where the page index says {rows}"
    encoding = sub.get(2 if kind == _DATA_PAGE else 4)
    if encoding != _ENCODINGS["PLAIN"] or (kind == _DATA_PAGE_V2 and (
            sub.get(5, 0) or sub.get(6, 0))):
        return "a data page not stored as its values"
    return None


def walked_all(spans: list[PageSpan], end: int) -> bool:
    """Whether :func:`page_spans` walked the chunk ending at ``end`` to its end."""
    return bool(spans) and spans[-1].end == end


def granule_schema(meta: pq.FileMetaData, j: int) -> tuple[pa.DataType, int, int | None,
                                                            int | None, bool] | None:
    """How to describe leaf column ``j`` in a footer of our own: (Arrow type, physical
    type id, converted type id, LogicalType field id, optional), or None if this module
    does not describe that column (it is read whole)."""
    col = meta.schema.column(j)
    return leaf_schema(col.path, col.physical_type, str(col.logical_type),
                       col.max_definition_level, col.max_repetition_level)


def leaf_schema(path: str, physical: str, logical: str, max_definition: int,
                max_repetition: int) -> tuple[pa.DataType, int, int | None, int | None,
                                              bool] | None:
    """:func:`granule_schema` of a leaf column given as its path, Parquet physical type
    and logical type (pyarrow's names) and its definition and repetition levels."""
    if max_repetition != 0 or max_definition > 1 or "." in path:
        return None
    found = _TYPES.get((physical, logical))
    if found is None:
        return None
    typ, converted, logical_id = found
    return typ, _PHYSICAL[physical], converted, logical_id, max_definition == 1


def decode_pages(meta: pq.FileMetaData, rg: int, j: int, pages: list[PageSpan],
                 read: Callable[[int, int], Any], described: Any = False) -> pa.Array | None:
    """Decode ``pages`` (a chunk's dictionary page, if any, and consecutive data pages)
    of leaf column ``j`` in row group ``rg``; None if the column is not one this module
    describes. ``read(offset, n)`` returns the file's bytes at ``offset``. ``described``:
    :func:`granule_schema` of the column, if the caller has it."""
    if described is False:
        described = granule_schema(meta, j)
    chunk = meta.row_group(rg).column(j)
    return decode_chunk_pages(meta.schema.column(j).name, str(chunk.compression),
                              list(chunk.encodings), pages, read, described)


def decode_chunk_pages(name: str, compression: str, encoding_names: list[str],
                       pages: list[PageSpan], read: Callable[[int, int], Any],
                       described: Any) -> pa.Array | None:
    """:func:`decode_pages` of a column chunk given by its leaf's name, its codec and
    encodings (pyarrow's names) and :func:`granule_schema` of its leaf."""
    if described is None:
        return None
    typ, physical, converted, logical, optional = described
    codec = _CODECS.get(compression.upper())
    encodings = [_ENCODINGS.get(e) for e in encoding_names]
    if codec is None or any(e is None for e in encodings):
        return None
    if not any(p.dictionary for p in pages):
        direct = decode_plain_pages(compression, pages, read, typ, physical, optional)
        if direct is not None:
            return direct
    dictionary_offset = None
    values = 0
    pos = 4  # after PAR1
    for p in pages:
        if p.dictionary:
            dictionary_offset = pos
        else:
            values += p.rows
        pos += p.end - p.start
    first_data = 4 if dictionary_offset is None else 4 + (pages[0].end - pages[0].start)
    length = pos - 4
    raw_name = name.encode()
    leaf: list[tuple[int, int, Any]] = [(1, _I32, physical), (3, _I32, 1 if optional else 0),
                                        (4, _BINARY, raw_name)]
    if converted is not None:
        leaf.append((6, _I32, converted))
    if logical is not None:
        leaf.append((10, _STRUCT, [(logical, _STRUCT, [])]))
    column_meta: list[tuple[int, int, Any]] = [
        (1, _I32, physical), (2, _LIST, (_I32, encodings)), (3, _LIST, (_BINARY, [raw_name])),
        (4, _I32, codec), (5, _I64, values), (6, _I64, length), (7, _I64, length),
        (9, _I64, first_data)]
    if dictionary_offset is not None:
        column_meta.append((11, _I64, dictionary_offset))
    footer = bytearray()
    _w_struct(footer, [
        (1, _I32, 1),
        (2, _LIST, (_STRUCT, [[(4, _BINARY, b"schema"), (5, _I32, 1)], leaf])),
        (3, _I64, values),
        (4, _LIST, (_STRUCT, [[(1, _LIST, (_STRUCT, [[(2, _I64, first_data),
                                                        (3, _STRUCT, column_meta)]])),
                               (2, _I64, length), (3, _I64, values)]])),
    ])
    # the file in one buffer of its size, filled once (no zeroing, no growing)
    data = pa.allocate_buffer(pos + len(footer) + 8)
    out = memoryview(data).cast("B")
    out[:4] = b"PAR1"
    at = 4
    for p in pages:
        n = p.end - p.start
        got = read(p.start, n)
        if len(got) != n:
            raise PageError(f"a page at offset {p.start} runs past the end of the file")
        out[at : at + n] = got
        at += n
    out[at : at + len(footer)] = footer
    out[at + len(footer) :] = len(footer).to_bytes(4, "little") + b"PAR1"
    out.release()
    # pyarrow's reader itself: ParquetFile would build its Python-side schema maps first
    reader = ParquetReader()
    reader.open(pa.BufferReader(data), pre_buffer=False)
    table = reader.read_all(use_threads=False)
    arr = table.column(0)
    if arr.type != typ or len(arr) != values:
        return None
    return arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()


# -- PLAIN data pages decoded straight into Arrow arrays ------------------------------------

#: pyarrow's name of a chunk's codec -> pyarrow's codec for its pages (Parquet's LZ4_RAW is
#: pyarrow's "LZ4"); None: the pages are not compressed
_PAGE_CODECS: dict[str, str | None] = {"UNCOMPRESSED": None, "LZ4": "lz4_raw",
                                       "ZSTD": "zstd", "SNAPPY": "snappy"}
#: Parquet physical type id -> the NumPy type of its PLAIN values
_PLAIN_WIDTH = {1: "<i4", 2: "<i8", 4: "<f4", 5: "<f8"}
_PLAIN_SIZE = {1: 4, 2: 8, 4: 4, 5: 8}
#: :func:`decode_page_rows` checks up to this many strings' lengths in Python, more at once
#: in NumPy
_FEW = 256
_PLAIN_BYTE_ARRAY = 6
_ENC_PLAIN, _ENC_RLE = 0, 3
#: The longest page header :func:`decode_one_width_chunk` takes on its first bytes alone
#: (pyarrow's, with the statistics of strings of up to a few hundred bytes, are shorter)
_HEADER_LIMIT = 1024
#: the most a page decompressed here may grow (LZ4's bound is about 255)
_MAX_RATIO = 256


def decode_plain_pages(compression: str, pages: list[PageSpan],
                       read: Callable[[int, int], Any], typ: pa.DataType, physical: int,
                       optional: bool) -> pa.Array | None:
    """Data pages (v1, PLAIN values, RLE definition levels of a flat column) decoded into
    one Arrow array of ``typ`` without pyarrow's Parquet reader; None for anything else
    (a dictionary, another encoding or page version, pages that do not add up, text that
    is not UTF-8), which the caller decodes through a Parquet file of its own.

    Fixed-width values (INT32, INT64, FLOAT, DOUBLE) are read as they are. BYTE_ARRAY
    values (each a 4-byte length, then its bytes) become the array's offsets and data in
    C (``_csort.byte_array_page``, without the GIL), every length checked against the
    bytes left before it is used; values that run past their page, leave bytes over or do
    not match the page's rows raise :class:`PageError`. Pages whose strings all have one
    length (hashes, UUIDs, codes) go through a strided view that checks them at once
    (about half the C copy's instructions); where the extension is not built, only those
    are decoded here."""
    import numpy as np

    if compression.upper() not in _PAGE_CODECS:
        return None
    name = _PAGE_CODECS[compression.upper()]
    if physical not in _PLAIN_WIDTH and physical != _PLAIN_BYTE_ARRAY:
        return None
    codec = None
    if name is not None:
        if not pa.Codec.is_available(name):
            return None
        codec = pa.Codec(name)
    raws = _read_pages(pages, read)
    if raws is None:
        return None
    bodies: list[tuple[Any, int]] = []
    for p, raw in zip(pages, raws, strict=True):
        n = p.end - p.start
        try:
            header, used = _read_struct(raw, 0)
        except PageError:
            return None
        sub = header.get(5)
        size, plain_size = header.get(3), header.get(2)
        if (header.get(1) != _DATA_PAGE or not isinstance(sub, dict)
                or sub.get(1) != p.rows or sub.get(2) != _ENC_PLAIN
                or (optional and sub.get(3) != _ENC_RLE)
                or size != n - used or not isinstance(plain_size, int) or plain_size < 0):
            return None
        body: Any = memoryview(raw)[used:]
        if codec is not None and plain_size > _MAX_RATIO * len(body) + 64:
            return None  # not allocated on a header's word (pyarrow's reader judges it)
        if codec is not None:
            try:
                body = memoryview(codec.decompress(body, decompressed_size=plain_size))
            except (pa.ArrowException, ValueError, OSError):  # (damaged: "Corrupt Lz4 ...")
                return None
        if len(body) != plain_size:
            return None
        bodies.append((body, p.rows))
    if not bodies:
        return None
    if len(bodies) > 1 and physical in _PLAIN_WIDTH:
        joined = _fixed_width_pages(np, bodies, typ, physical, optional)
        if joined is not None:
            return joined
    arrays = []
    for body, rows in bodies:
        arr = _plain_page(np, body, rows, typ, physical, optional)
        if arr is None:
            return None
        arrays.append(arr)
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def decode_page_rows(compression: str, page: PageSpan, source: Callable[[int, int], Any],
                     typ: pa.DataType, physical: int, optional: bool, first: int, end: int
                     ) -> pa.Array | None:
    """Rows ``first..end`` (of the page's own rows) of one uncompressed PLAIN data page
    (v1; RLE definition levels of a flat column if ``optional``), reading only the bytes
    that hold them (``source(offset, n)``: the file's bytes): its header, its levels, and
    the values of those rows (fixed-width
    values at their place; strings of one length, each record's length up to row ``end``
    checked). On an encrypted disk only the segments holding them are decrypted (a top-N
    of 10 rows on a sorted part: one segment of each column, not the page's five of
    32-character hashes). None for anything else (a compressed page, strings of several
    lengths, a header not as pyarrow writes it): the caller decodes whole pages."""
    import numpy as np

    def read(offset: int, n: int) -> Any:
        return memoryview(source(offset, n)).cast("B")

    n = page.end - page.start
    if (compression.upper() != "UNCOMPRESSED" or page.dictionary or not
            0 <= first < end <= page.rows or n < 8):
        return None
    head = read(page.start, min(n, 16))
    if len(head) < 8 or head[0] != 0x15 or head[1] != 0x00 or head[2] != 0x15:
        return None
    size = _zigzag(_varint(head, 3)[0])
    used = n - size
    if not 0 < used <= _HEADER_LIMIT:
        return None
    head = read(page.start, used)
    if optional:  # (the levels' encoding follows PLAIN in the header: parsed whole)
        header, parsed = _read_struct(head, 0)
        sub = header.get(5)
        if (parsed != used or header.get(1) != _DATA_PAGE or header.get(2) != size
                or header.get(3) != size or not isinstance(sub, dict)
                or sub.get(1) != page.rows or sub.get(2) != _ENC_PLAIN
                or sub.get(3) != _ENC_RLE):
            return None
    elif bytes(head[: len(prefix := plain_page_prefix(page.rows, size))]) != prefix:
        return None
    body = page.start + used
    defined = None
    at = 0
    if optional:
        length = read(body, 4)
        if len(length) != 4:
            return None
        at = 4 + int.from_bytes(length, "little")
        if at > size:
            return None
        found = _levels(np, read(body, at), page.rows)
        if found is None:
            return None
        defined = found[0]
    present = page.rows if defined is None else int(np.count_nonzero(defined))
    before = first if defined is None else int(np.count_nonzero(defined[:first]))
    upto = end if defined is None else int(np.count_nonzero(defined[:end]))
    rows = end - first
    nulls = rows - (upto - before)
    # (no NULL among the rows: bytes and ints, not NumPy, whose first calls in a process
    # cost a cold top-N more than its rows' decoding)
    mask = None if not nulls else defined[first:end]  # type: ignore[index]
    validity = None if mask is None else pa.py_buffer(np.packbits(mask, bitorder="little"))
    values_at = body + at
    if physical in _PLAIN_WIDTH:
        width = _PLAIN_SIZE[physical]
        if size - at != present * width:
            return None
        raw = read(values_at + before * width, (upto - before) * width)
        if len(raw) != (upto - before) * width:
            return None
        if mask is None:
            return pa.Array.from_buffers(typ, rows, [None, pa.py_buffer(bytes(raw))], 0)
        full = np.zeros(rows, np.dtype(_PLAIN_WIDTH[physical]))
        full[mask] = np.frombuffer(raw, full.dtype, upto - before)
        return pa.Array.from_buffers(typ, rows, [validity, pa.py_buffer(full)], nulls)
    text = pa.types.is_string(typ)
    if physical != _PLAIN_BYTE_ARRAY or not (text or pa.types.is_binary(typ)):
        return None
    width = 0
    data = b""
    if upto:
        lead = read(values_at, 4)
        if len(lead) != 4:
            return None
        width = int.from_bytes(lead, "little")
        record = 4 + width
        if size - at != present * record:  # (the page's size: every string this long?)
            return None
        raw = read(values_at, upto * record)  # each length up to row ``end`` checked
        if len(raw) != upto * record:
            return None
        if upto <= _FEW:
            lengths = raw.cast("I") if not width % 4 and sys.byteorder == "little" else None
            if lengths is not None:  # (records of a multiple of 4 bytes: every n-th word)
                if any(v != width for v in lengths[:: record // 4]):
                    return None
            elif any(int.from_bytes(raw[k : k + 4], "little") != width
                     for k in range(0, len(raw), record)):
                return None
            data = b"".join(raw[k + 4 : k + record]
                            for k in range(before * record, len(raw), record))
        else:
            table = np.frombuffer(raw, np.dtype([("n", "<u4"), ("v", f"V{width}")]), upto) \
                if width else np.frombuffer(raw, "<u4", upto)
            if (not (table["n"] == width).all()) if width else table.any():
                return None
            data = table["v"][before:].tobytes() if width else b""
    if mask is None:
        offsets = pa.py_buffer(array.array("i", range(0, (rows + 1) * width, width))
                               if width else bytes(4 * (rows + 1)))
    else:
        steps = np.zeros(rows + 1, np.int32)
        np.cumsum(mask * np.int32(width), out=steps[1:])
        offsets = pa.py_buffer(steps)
    arr = pa.Array.from_buffers(typ, rows, [validity, offsets, pa.py_buffer(data)], nulls)
    if text and not data.isascii():  # each value must be UTF-8
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            return None
    return arr


def _read_pages(pages: list[PageSpan], read: Callable[[int, int], Any]) -> list[Any] | None:
    """Each page's bytes (header included), read in one call per run of adjacent pages (a
    range query's pages of a column: on an encrypted disk each segment is decrypted into
    one buffer once, not into one buffer per page and copied into the next page's); None
    if the file ends first."""
    out: list[Any] = []
    i = 0
    while i < len(pages):
        j = i
        while j + 1 < len(pages) and pages[j + 1].start == pages[j].end:
            j += 1
        start, end = pages[i].start, pages[j].end
        raw = read(start, end - start)
        if len(raw) != end - start:
            return None
        view = memoryview(raw).cast("B")
        out += [view[p.start - start : p.end - start] for p in pages[i : j + 1]]
        i = j + 1
    return out


def _fixed_width_pages(np: Any, bodies: list[tuple[Any, int]], typ: pa.DataType,
                       physical: int, optional: bool) -> pa.Array | None:
    """Pages of fixed-width PLAIN values without NULLs as one array, each page's values
    copied once, into their place in it (not into an array per page, then all of them
    into one); None if a page has NULLs or does not fit (then decoded page by page, which
    judges it)."""
    dtype = np.dtype(_PLAIN_WIDTH[physical])
    values = []
    for body, rows in bodies:
        at = 0
        if optional:
            found = _levels(np, body, rows)
            if found is None or found[0] is not None:
                return None
            at = found[1]
        if len(body) - at != rows * dtype.itemsize:
            return None
        values.append((body[at:], rows))
    total = sum(rows for _v, rows in values)
    full = np.empty(total, dtype)
    pos = 0
    for v, rows in values:
        full[pos : pos + rows] = np.frombuffer(v, dtype, rows)
        pos += rows
    return pa.Array.from_buffers(typ, total, [None, pa.py_buffer(full)], 0)


def _levels(np: Any, body: Any, rows: int) -> tuple[Any, int] | None:
    """A v1 page's definition levels of a column whose highest level is 1 (a 4-byte
    length, then runs of the RLE / bit-packed hybrid of width 1): (a bool array of
    ``rows``, or None if every row is defined; where the values begin), or None."""
    if len(body) < 4:
        return None
    length = int.from_bytes(body[:4], "little")
    end = 4 + length
    if end > len(body):
        return None
    pos, filled = 4, 0
    runs: list[Any] = []
    while filled < rows:
        try:
            head, pos = _varint(body, pos)
        except PageError:
            return None
        if head & 1:  # bit-packed: groups of 8 values, one byte a group at width 1
            groups = head >> 1
            if not groups or pos + groups > end:
                return None
            bits = np.unpackbits(np.frombuffer(body, np.uint8, groups, pos),
                                 bitorder="little")
            take = min(len(bits), rows - filled)
            runs.append(bits[:take].astype(bool))
            pos += groups
        else:  # a run of one value, in one byte
            count = head >> 1
            if not count or pos >= end or body[pos] > 1:
                return None
            take = min(count, rows - filled)
            runs.append(np.full(take, body[pos] == 1))
            pos += 1
        filled += take
    if pos != end:
        return None
    defined = runs[0] if len(runs) == 1 else np.concatenate(runs)
    return (None if defined.all() else defined), end


def _plain_page(np: Any, body: Any, rows: int, typ: pa.DataType, physical: int,
                optional: bool) -> pa.Array | None:
    defined = None
    at = 0
    if optional:
        found = _levels(np, body, rows)
        if found is None:
            return None
        defined, at = found
    present = rows if defined is None else int(np.count_nonzero(defined))
    values = body[at:]
    validity = None if defined is None else pa.py_buffer(
        np.packbits(defined, bitorder="little"))
    nulls = rows - present
    if physical != _PLAIN_BYTE_ARRAY:
        dtype = np.dtype(_PLAIN_WIDTH[physical])
        if len(values) != present * dtype.itemsize:
            return None
        got = np.frombuffer(values, dtype, present)
        if defined is None:
            full = got.copy()
        else:
            full = np.zeros(rows, dtype)
            full[defined] = got
        return pa.Array.from_buffers(typ, rows, [validity, pa.py_buffer(full)], nulls)
    text = pa.types.is_string(typ)
    if not text and not pa.types.is_binary(typ):
        return None
    if text and (_BYTE_ARRAY_PAGE is None or _one_width(values, present)):
        arr = _one_width_page(np, values, rows, typ, defined, validity, present, nulls)
        if arr is not None or _BYTE_ARRAY_PAGE is None:
            return arr
    if _BYTE_ARRAY_PAGE is None:
        return None
    try:
        found = _BYTE_ARRAY_PAGE(values, rows, defined)
    except ValueError as exc:
        raise PageError(f"a PLAIN string page of {rows} rows: {exc}") from None
    if found is None:  # more than 2 GiB of text: pyarrow's reader
        return None
    offsets, chars, ascii_only = found
    arr = pa.Array.from_buffers(typ, rows, [validity, pa.py_buffer(offsets),
                                            pa.py_buffer(chars)], nulls)
    if text and not ascii_only:  # each value must be UTF-8
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            return None
    return arr


def _one_width(values: Any, present: int) -> bool:
    """Whether the page's size says its ``present`` PLAIN strings can all be as long as
    the first (:func:`_one_width_page` checks each): 32-character hashes decode so in
    about half the instructions of the C decoder's copy value by value."""
    return present > 0 and len(values) >= 4 and len(values) == present * (
        4 + int.from_bytes(values[:4], "little"))


def _one_width_page(np: Any, values: Any, rows: int, typ: pa.DataType, defined: Any,
                    validity: Any, present: int, nulls: int) -> pa.Array | None:
    """The strings of a page whose values all have one length, through a strided view of
    its (length, bytes) records; None if they do not."""
    if present:  # every value as long as the first, or not decoded here
        if len(values) < 4:
            return None
        width = int.from_bytes(values[:4], "little")
        if len(values) != present * (4 + width) or present * width >= 1 << 31:
            return None
        if width:  # (length, bytes) records: the lengths checked, the bytes copied out
            table = np.frombuffer(values, np.dtype([("n", "<u4"), ("v", f"V{width}")]),
                                  present)
            if not (table["n"] == width).all():
                return None
            data = table["v"].copy()
        else:
            if not (np.frombuffer(values, "<u4", present) == 0).all():
                return None
            data = np.zeros(0, np.uint8)
    else:
        if len(values):
            return None
        width, data = 0, np.zeros(0, np.uint8)
    if defined is None:
        offsets = np.arange(rows + 1, dtype=np.int32) * np.int32(width)
    else:
        offsets = np.zeros(rows + 1, np.int32)
        np.cumsum(defined * np.int32(width), out=offsets[1:])
    arr = pa.Array.from_buffers(typ, rows, [validity, pa.py_buffer(offsets),
                                            pa.py_buffer(data)], nulls)
    text = data.view(np.uint8)
    if len(text) and text.max() >= 0x80:  # not all ASCII: each value must be UTF-8
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            return None
    return arr


#: Offsets of strings of one width without NULLs, by (rows, width): the same for every
#: full row group of a column, shared by its arrays (never written)
_STEPS: dict[tuple[int, int], pa.Buffer] = {}
_STEPS_MAX = 8


def _steps(np: Any, rows: int, width: int) -> pa.Buffer:
    """The offsets ``0, width, 2 * width ... rows * width`` (int32), kept for the next
    chunk of as many rows."""
    got = _STEPS.get((rows, width))
    if got is None:
        got = pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * np.int32(width))
        if len(_STEPS) >= _STEPS_MAX:
            _STEPS.clear()
        _STEPS[rows, width] = got
    return got


def _plain_header(raw: Any, rows: int, prefixes: dict[tuple[int, int], bytes]) -> int | None:
    """The length of the header that starts the page ``raw`` (header and body) if it
    begins as pyarrow writes a PLAIN data page of ``rows`` values whose body runs to the
    end of ``raw`` (:func:`plain_page_prefix`: its kind, both sizes, its values and
    encoding); None otherwise. A bytes comparison: parsing the header (statistics
    included) took about 45 us a page in Python, more than copying the page's strings."""
    if len(raw) < 4 or raw[0] != 0x15 or raw[1] != 0x00 or raw[2] != 0x15:
        return None
    try:
        zigzag, _pos = _varint(raw, 3)
    except PageError:
        return None
    size = _zigzag(zigzag)
    used = len(raw) - size
    prefix = prefixes.get((rows, size))
    if prefix is None:
        prefix = prefixes[rows, size] = plain_page_prefix(rows, size)
    if not len(prefix) <= used <= _HEADER_LIMIT or raw[: len(prefix)] != prefix:
        return None
    return used


def decode_one_width_chunk(chunk: Any, base: int, pages: list[PageSpan], typ: pa.DataType,
                           optional: bool) -> pa.Array | None:
    """A whole uncompressed column chunk of PLAIN BYTE_ARRAY data pages (v1; RLE levels
    of a flat column if ``optional``) whose strings all have one length (hashes, UUIDs,
    codes), as one Arrow array of ``typ`` (string or binary): the chunk's bytes
    ``chunk`` (its file offset ``base``) hold the ``pages``, which must tile it; each
    page's header is parsed and checked against its span, its lengths checked at once
    through a strided view, and its bytes copied once, into their place in the array's
    data (pyarrow's reader appended value by value; :func:`decode_plain_pages` would
    concatenate its pages' arrays, a second copy). The text is checked as UTF-8 unless it
    is all ASCII. None for anything else (the caller decodes the chunk through pyarrow,
    which reports any damage)."""
    import numpy as np

    text = pa.types.is_string(typ)
    if not text and not pa.types.is_binary(typ):
        return None
    found: list[tuple[Any, int, int, Any]] = []  # (values, rows, present, levels or None)
    prefixes: dict[tuple[int, int], bytes] = {}
    width = -1
    present_all = rows_all = 0
    at = 0
    for p in pages:
        if p.dictionary or p.start - base != at:
            return None
        raw = chunk[at : p.end - base]
        at = p.end - base
        used = _plain_header(raw, p.rows, prefixes)
        if used is None:  # not as pyarrow writes it: parsed, field by field
            try:
                header, used = _read_struct(raw, 0)
            except PageError:
                return None
            sub = header.get(5)
            size = header.get(3)
            if (header.get(1) != _DATA_PAGE or not isinstance(sub, dict)
                    or sub.get(1) != p.rows or sub.get(2) != _ENC_PLAIN
                    or (optional and sub.get(3) != _ENC_RLE)
                    or size != len(raw) - used or header.get(2) != size):
                return None
        body = raw[used:]
        defined, start = None, 0
        if optional:
            levels = _levels(np, body, p.rows)
            if levels is None:
                return None
            defined, start = levels
        values = body[start:]
        present = p.rows if defined is None else int(np.count_nonzero(defined))
        if present:
            if len(values) < 4:
                return None
            if width < 0:
                width = int.from_bytes(values[:4], "little")
            if len(values) != present * (4 + width):
                return None
        elif len(values):
            return None
        found.append((values, p.rows, present, defined))
        present_all += present
        rows_all += p.rows
    if at != len(chunk) or not found:
        return None
    width = max(width, 0)
    if present_all * width >= 1 << 31:
        return None
    # pyarrow's pool, not NumPy's: memory a batch DuckDB has done with frees is the next
    # chunk's, where a fresh mapping of each chunk's strings cost page faults and zeroing
    buf = pa.allocate_buffer(present_all * width)
    if _ONE_WIDTH_INTO is not None and width:
        ascii_only = True
        done = 0
        for values, _rows, present, _defined in found:
            if present:  # (each length checked, the bytes copied, without the GIL)
                got = _ONE_WIDTH_INTO(values, present, width, buf, done * width)
                if got is None:
                    return None
                ascii_only = ascii_only and got
                done += present
        data = None
    else:
        data = np.frombuffer(buf, np.uint8) if width else np.zeros(0, np.uint8)
        record = np.dtype([("n", "<u4"), ("v", f"V{width}")]) if width else None
        done = 0
        for values, _rows, present, _defined in found:
            if not present:
                continue
            if record is None:
                if not (np.frombuffer(values, "<u4", present) == 0).all():
                    return None
                continue
            table = np.frombuffer(values, record, present)
            if not (table["n"] == width).all():
                return None
            data[done * width : (done + present) * width].view(f"V{width}")[:] = table["v"]
            done += present
        ascii_only = not len(data) or int(data.max()) < 0x80
    nulls = rows_all - present_all
    validity = None
    if not nulls:
        offsets = _steps(np, rows_all, width)
    else:
        defined_all = np.concatenate([np.ones(rows, bool) if defined is None else defined
                                      for _values, rows, _present, defined in found])
        offsets = np.zeros(rows_all + 1, np.int32)
        np.cumsum(defined_all * np.int32(width), out=offsets[1:])
        offsets = pa.py_buffer(offsets)
        validity = pa.py_buffer(np.packbits(defined_all, bitorder="little"))
    arr = pa.Array.from_buffers(typ, rows_all, [validity, offsets,
                                                buf if data is None or width
                                                else pa.py_buffer(data)], nulls)
    if text and not ascii_only:  # not all ASCII: each value must be UTF-8
        try:
            arr.validate(full=True)
        except pa.ArrowInvalid:
            return None
    return arr


# -- the page index written with a part -----------------------------------------------------

class PageScanner:
    """Where a part's pages are, found from the bytes of the Parquet file as it is written.

    pyarrow writes a file as ``PAR1``, then every column chunk of every row group as a
    run of pages (a Thrift header, then the page's bytes), then the footer. :meth:`feed`
    takes the bytes in order and reads each page header as it passes (the bodies are
    skipped, never copied); :meth:`to_bytes` turns the pages seen so far into the page
    index (:func:`page_index_bytes`). Anything it does not understand stops the scan
    (the part is then written without an index and read by walking its page headers).
    """

    def __init__(self) -> None:
        self._skip = 4  # PAR1
        self._pos = 0  # file offset of the next byte fed
        self._head = bytearray()  # an incomplete page header, from file offset _head_at
        self._head_at = 0
        self.pages: list[tuple[int, int, int]] = []  # (offset, values or -1, end)
        self.failed = False

    def feed(self, data: Any) -> None:
        if self.failed:
            return
        n = len(data)
        pos = 0
        while pos < n:
            if self._skip:
                take = min(self._skip, n - pos)
                self._skip -= take
                pos += take
                continue
            old = len(self._head)
            buf: Any
            if old:  # the header began in an earlier write
                take = min(n - pos, 4096)
                self._head += data[pos : pos + take]
                buf, at = self._head, self._head_at
            else:
                take = n - pos
                buf, at = memoryview(data)[pos:], self._pos + pos
            try:
                header, used = _read_struct(buf, 0)
            except PageError:
                if not old:
                    self._head, self._head_at = bytearray(data[pos:]), at
                if len(self._head) >= 1 << 16:  # no page header is this long: not pages
                    self.failed = True
                    return
                pos += take  # wait for the rest of the header
                continue
            self._head = bytearray()
            kind, size = header.get(1), header.get(3)
            if not isinstance(size, int) or size < 0:
                self.failed = True
                return
            values: int
            if kind == _DICTIONARY_PAGE:
                values = -1
            elif kind in (_DATA_PAGE, _DATA_PAGE_V2):
                sub = header.get(5 if kind == _DATA_PAGE else 8)
                found = sub.get(1) if isinstance(sub, dict) else None
                if not isinstance(found, int) or found < 0:
                    self.failed = True
                    return
                values = found
            else:
                self.failed = True
                return
            self.pages.append((at, values, at + used + size))
            pos += used - old
            self._skip = size
        self._pos += n

    def to_bytes(self, group_rows: list[int], leaves: int) -> bytes | None:
        """The page index of the chunks of ``group_rows`` (each row group's rows) and
        ``leaves`` flat columns whose pages have all been seen (the file's last chunks may
        still be in the writer's buffers: they get no entry); None if nothing to index."""
        if self.failed or not group_rows or leaves <= 0:
            return None
        counts: list[int] = []
        entries: list[int] = []
        i = 0
        pages = self.pages
        for rows in group_rows:
            for _ in range(leaves):
                start = i
                seen = 0
                if i < len(pages) and pages[i][1] < 0:  # a dictionary page comes first
                    i += 1
                while i < len(pages) and pages[i][1] >= 0 and seen < rows:
                    seen += pages[i][1]
                    i += 1
                if seen != rows or i == start:
                    counts.extend([0] * (len(group_rows) * leaves - len(counts)))
                    return _pack(len(group_rows), leaves, counts, entries) if any(
                        counts) else None
                base = pages[start][0]
                if pages[i - 1][2] - base >= 1 << 31:
                    counts.append(0)
                    continue
                counts.append(i - start)
                for at, values, _end in pages[start:i]:
                    entries += (at - base, values)
        return _pack(len(group_rows), leaves, counts, entries)


def _pack(groups: int, leaves: int, counts: list[int], entries: list[int]) -> bytes:
    import array
    import sys

    values = array.array("i", [groups, leaves, *counts, *entries])
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


class PageIndex:
    """A part's page index (:class:`PageScanner`), as written in its footer: for each
    column chunk whose pages were indexed, where each page starts (relative to the chunk)
    and how many values it holds (-1: the dictionary page), so a granule read finds its
    pages without walking their headers. The footer is authenticated with the part on an
    encrypted disk; every chunk's entry is checked against the footer's own numbers
    (:meth:`spans`) before it is used, and an entry that does not fit is not used."""

    def __init__(self, raw: bytes, groups: int, leaves: int) -> None:
        import array
        import sys

        values = array.array("i")
        ok = len(raw) % 4 == 0 and len(raw) >= 8
        if ok:
            values.frombytes(raw)
            if sys.byteorder == "big":
                values.byteswap()
        chunks = groups * leaves
        self._counts: list[int] = []
        self._starts: list[int] = []
        self._entries = values
        self._leaves = leaves
        if not ok or values[0] != groups or values[1] != leaves or len(values) < 2 + chunks:
            return
        counts = values[2 : 2 + chunks].tolist()
        if min(counts, default=0) < 0:
            return
        # each chunk's first entry: after the counts, two numbers a page (summed in C)
        starts = list(itertools.accumulate(map(operator.mul, counts, itertools.repeat(2)),
                                           initial=2 + chunks))
        if starts.pop() != len(values):
            return
        self._counts, self._starts = counts, starts

    def spans(self, rg: int, j: int, start: int, end: int, num_values: int
              ) -> list[PageSpan] | None:
        """The pages of leaf ``j``'s chunk in row group ``rg`` (at ``start..end`` of the
        file, ``num_values`` values, as the footer says), or None if not indexed or the
        entry does not fit that chunk."""
        c = rg * self._leaves + j
        if not self._counts or not 0 <= c < len(self._counts) or not self._counts[c]:
            return None
        at = self._starts[c]
        raw = self._entries[at : at + 2 * self._counts[c]].tolist()
        offsets, counts = raw[0::2], raw[1::2]
        if offsets[0] != 0:
            return None
        out: list[PageSpan] = []
        rows = 0
        for k, (off, n) in enumerate(zip(offsets, counts, strict=True)):
            a = start + off
            b = start + offsets[k + 1] if k + 1 < len(offsets) else end
            if not a < b <= end:
                return None
            if n < 0:
                if k:
                    return None
                out.append(PageSpan(a, b, 0, 0, True))
            else:
                out.append(PageSpan(a, b, rows, n, False))
                rows += n
        return out if rows == num_values else None

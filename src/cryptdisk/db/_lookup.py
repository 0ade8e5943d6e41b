"""A part's lookup block: what a query on the key needs of the footer, without the footer.

A part's Parquet footer describes every column chunk of every row group (459 for
a 10M-row, 3-column part) and pyarrow parses all of it before the first byte can
be read: about 370 us of CPU for a 108 KB footer, the largest single cost of a
process's first query on the key. So every part is written with a lookup block
just before its footer, which a reader finds from the footer's length (the last
8 bytes of the file) without parsing the footer::

    PAR1 | column chunks ... | block | u32 block length | MAGIC | footer | u32 | PAR1

The block is a list of named entries (``u32`` count, then per entry a ``u16``
name length, the name, a ``u32`` data length, the data; little-endian):

- ``part``: JSON: the part id, rows, ``created_by`` and each leaf column's name,
  path, Parquet physical and logical type and its definition and repetition levels;
- ``groups``: each row group's rows, int64;
- ``chunks``: per row group, per leaf column, four int64: the column chunk's start
  in the file and its length (as Arrow computes them, dictionary page first), its number of
  values, and its codec (its place in :data:`CODECS`, 31 for another) in the high 32
  bits above a bit per encoding (:data:`ENCODINGS`; bit 31 for any other);
- every cryptdisk entry of the footer's key-value metadata, byte for byte (the part
  id, the key's row-group and granule bounds, the page index, the NaN row groups).

Parquet readers ignore bytes between the last column chunk and the footer. The
block is part of the file: on an encrypted disk every segment of it authenticates
(AES-GCM) before it is used, as the footer's do, and on a plain disk the part's
SHA-256 in the catalog covers it. A reader checks the block's numbers against one
another and against the catalog (part id, rows) and reads the footer instead when
the block is missing (a part written before it existed) or does not fit.
"""

from __future__ import annotations

import array
import json
import struct
import sys
from typing import Any

from ..errors import FormatError

__all__ = ["CODECS", "ENCODINGS", "MAGIC", "TRAILER", "Lookup", "build", "parse"]

#: The last bytes before a part's footer when a lookup block precedes it.
MAGIC = b"cdLookup"
#: ``u32`` block length, then :data:`MAGIC`.
TRAILER = 4 + len(MAGIC)
#: pyarrow's names of a column chunk's codec, numbered as the block stores them.
CODECS = ("UNCOMPRESSED", "SNAPPY", "GZIP", "BROTLI", "ZSTD", "LZ4", "LZ4_RAW", "LZO")
#: pyarrow's names of a column chunk's encodings, each a bit of the block's mask.
ENCODINGS = ("PLAIN", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED", "DELTA_BINARY_PACKED",
             "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY", "RLE_DICTIONARY",
             "BYTE_STREAM_SPLIT")
_CODEC_IDS = {name: i for i, name in enumerate(CODECS)}
_ENCODING_BITS = {name: i for i, name in enumerate(ENCODINGS)}
_OTHER = 31  # the bit of an encoding not named above; the codec number of a codec not named


def _chunk_start_end(col: Any) -> tuple[int, int]:
    start = col.data_page_offset
    dictionary = col.dictionary_page_offset
    if col.has_dictionary_page and dictionary is not None and 0 < dictionary < start:
        start = dictionary
    return int(start), int(start) + int(col.total_compressed_size)


def _int64s(values: list[int]) -> bytes:
    out = array.array("q", values)
    if sys.byteorder == "big":
        out.byteswap()
    return out.tobytes()


def _int64_array(raw: bytes) -> array.array[int]:
    out = array.array("q")
    out.frombytes(raw)
    if sys.byteorder == "big":
        out.byteswap()
    return out


def _from_int64s(raw: bytes) -> list[int]:
    return _int64_array(raw).tolist()


def build(meta: Any, kv: dict[bytes, bytes]) -> bytes | None:
    """The lookup block (trailer included) of a part whose footer is ``meta`` (pyarrow's
    ``FileMetaData``) with the cryptdisk key-value entries ``kv``; None for a part this
    block cannot describe (no row group)."""
    groups = [int(meta.row_group(i).num_rows) for i in range(meta.num_row_groups)]
    if not groups:
        return None
    leaves = []
    for j in range(meta.num_columns):
        c = meta.schema.column(j)
        leaves.append([c.name, c.path, c.physical_type, str(c.logical_type),
                       int(c.max_definition_level), int(c.max_repetition_level)])
    chunks: list[int] = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        for j in range(meta.num_columns):
            col = rg.column(j)
            codec = _CODEC_IDS.get(str(col.compression).upper(), _OTHER)
            mask = 0
            for e in col.encodings:
                mask |= 1 << _ENCODING_BITS.get(e, _OTHER)
            start, end = _chunk_start_end(col)
            chunks += (start, end - start, int(col.num_values), codec << 32 | mask)
    head = {"part_id": kv[b"cryptdisk.part_id"].decode(), "rows": int(meta.num_rows),
            "created_by": str(meta.created_by or ""), "leaves": leaves}
    entries = [(b"part", json.dumps(head).encode()), (b"groups", _int64s(groups)),
               (b"chunks", _int64s(chunks)), *sorted(kv.items())]
    out = [struct.pack("<I", len(entries))]
    for name, data in entries:
        out += (struct.pack("<H", len(name)), name, struct.pack("<I", len(data)), data)
    body = b"".join(out)
    return body + struct.pack("<I", len(body)) + MAGIC


class Lookup:
    """A parsed lookup block (see the module docstring); :func:`parse` checks it."""

    __slots__ = ("at", "chunks", "created_by", "groups", "kv", "leaves", "part_id", "rows")

    def __init__(self, part_id: str, rows: int, created_by: str, groups: list[int],
                 leaves: list[list[Any]], chunks: array.array[int], kv: dict[bytes, bytes],
                 at: int) -> None:
        self.part_id, self.rows, self.created_by = part_id, rows, created_by
        #: each row group's rows; each leaf's [name, path, physical, logical, def, rep]
        self.groups, self.leaves = groups, leaves
        #: four ints per (row group, leaf): start, length, values, codec << 32 | encodings
        self.chunks = chunks
        self.kv = kv
        self.at = at  # the block's offset in the file: every chunk ends before it

    def chunk(self, rg: int, j: int) -> tuple[int, int, int]:
        """``(start, end, values)`` of leaf ``j``'s chunk in row group ``rg``;
        :class:`~cryptdisk.errors.FormatError` for one outside the part's data (before
        its ``PAR1``, or running into the block)."""
        at = 4 * (rg * len(self.leaves) + j)
        start, length, values = self.chunks[at : at + 3]
        if start < 4 or length < 0 or values < 0 or start + length > self.at:
            raise FormatError(f"a column chunk at offset {start} of length {length}")
        return start, start + length, values

    def codec(self, rg: int, j: int) -> tuple[str, list[str]]:
        """pyarrow's names of the codec and the encodings of leaf ``j``'s chunk in row
        group ``rg`` ("OTHER" for one the block does not name)."""
        packed = self.chunks[4 * (rg * len(self.leaves) + j) + 3]
        codec = packed >> 32  # (negative for a corrupt block: "OTHER" too)
        return (CODECS[codec] if 0 <= codec < len(CODECS) else "OTHER",
                [ENCODINGS[e] if e < len(ENCODINGS) else "OTHER"
                 for e in range(32) if packed >> e & 1])


def parse(data: Any, at: int) -> Lookup | None:
    """The lookup block ``data`` (its bytes, trailer excluded), found at offset ``at`` of
    its part file, or None if it is not one or its numbers do not fit together (the
    row groups' rows adding up to the part's; four numbers per row group and leaf; the
    part id of the key-value entries; each chunk is checked as it is used, see
    :meth:`Lookup.chunk`)."""
    try:
        data = memoryview(data).cast("B")
        (count,) = struct.unpack_from("<I", data, 0)
        pos = 4
        entries: dict[bytes, bytes] = {}
        for _ in range(count):
            (n,) = struct.unpack_from("<H", data, pos)
            name = bytes(data[pos + 2 : pos + 2 + n])
            (m,) = struct.unpack_from("<I", data, pos + 2 + n)
            pos += 6 + n
            if pos + m > len(data):
                return None
            entries[name] = bytes(data[pos : pos + m])
            pos += m
        if pos != len(data):
            return None
        head = json.loads(entries.pop(b"part"))
        groups = _from_int64s(entries.pop(b"groups"))
        chunks = _int64_array(entries.pop(b"chunks"))
        part_id, rows, created_by, leaves = (head["part_id"], head["rows"],
                                             head["created_by"], head["leaves"])
        if not (isinstance(part_id, str) and isinstance(rows, int)
                and isinstance(created_by, str) and isinstance(leaves, list) and leaves
                and groups and min(groups) > 0 and sum(groups) == rows):
            return None
        for leaf in leaves:
            if not (isinstance(leaf, list) and len(leaf) == 6
                    and all(isinstance(v, str) for v in leaf[:4])
                    and all(isinstance(v, int) for v in leaf[4:])):
                return None
        if len(chunks) != 4 * len(groups) * len(leaves):
            return None
        if entries.get(b"cryptdisk.part_id", b"").decode("ascii", "replace") != part_id:
            return None
    except (struct.error, ValueError, TypeError, KeyError, UnicodeDecodeError,
            RecursionError):  # (json.loads of deeply nested brackets)
        return None
    return Lookup(part_id, rows, created_by, groups, leaves, chunks, entries, at)

"""COPY ... FROM STDIN and COPY ... TO STDOUT: the statement, and rows in text, CSV or binary.

Text format is PostgreSQL's: fields split by a delimiter (tab), ``\\N`` for NULL,
backslash escapes. CSV is PostgreSQL's CSV: a field is quoted when it holds the
delimiter, the quote, a newline or a carriage return, when it equals the NULL string, or
when it is ``\\.`` alone on a line; NULL is the NULL string unquoted (default: an empty
field) and a quoted field is never NULL (``""`` is the empty string); the ``QUOTE`` and
``ESCAPE`` characters (default both ``"``) say how quotes are written; a line ``\\.``
alone ends the data; optional header line. Binary is PostgreSQL's binary
copy format: the 11-byte signature ``PGCOPY\\n\\377\\r\\n\\0``, flags, a header
extension, then per row a 16-bit field count and per field a 32-bit length (-1:
NULL) and the value in its type's binary format; a field count of -1 ends the data.

COPY ... TO STDOUT encodes one CopyData per row. A result read a batch at a time (the
analytical engine's stream) is encoded batch by batch: the header (CSV, text, binary's
signature) only before the first batch's rows, binary's trailer only after the last, so
the bytes are those of the whole result encoded at once.
"""

from __future__ import annotations

import datetime as dt
import re
import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ProtocolError
from . import _types
from ._engines import StatementError
from ._sqltext import unqualified_parts
from ._types import real_writers, text_formatter

__all__ = ["SIGNATURE", "CopyStatement", "decode_binary", "decode_rows", "encode_binary",
           "encode_rows", "parse_copy"]

#: the first bytes of PostgreSQL's binary copy format
SIGNATURE = b"PGCOPY\n\xff\r\n\x00"

_IDENT = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'


@dataclass
class CopyStatement:
    direction: str            # "in" (FROM STDIN) or "out" (TO STDOUT)
    table: str | None         # the table, or None for COPY (query) TO STDOUT
    query: str | None
    columns: list[str] | None
    csv: bool = False
    binary: bool = False
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"
    quote: str = '"'
    escape: str = '"'
    header_match: bool = False   # HEADER MATCH: the header line must name the columns
    force_not_null: list[str] | None = None  # CSV FROM: columns whose NULL string is a value
    force_null: list[str] | None = None      # CSV FROM: columns whose quoted NULL string is NULL


def _ident(token: str) -> str:
    return token[1:-1].replace('""', '"') if token.startswith('"') else token.lower()


def parse_copy(sql: str) -> CopyStatement:
    m = re.fullmatch(
        rf"\s*COPY\s+(?:(?P<table>{_IDENT}(?:\s*\.\s*{_IDENT})?)\s*(?:\((?P<cols>[^)]*)\))?"
        rf"|\((?P<query>.+)\))\s+(?P<dir>FROM\s+STDIN|TO\s+STDOUT)(?P<opts>.*?)\s*;?\s*",
        sql, re.I | re.S)
    if not m:
        raise StatementError("COPY: only COPY table [(columns)] FROM STDIN and COPY "
                             "table|(query) TO STDOUT are supported", "0A000")
    direction = "in" if m["dir"].upper().startswith("FROM") else "out"
    if m["cols"] is not None:  # (an empty name: "()", "(a,)", "(a,,b)")
        names = m["cols"].split(",")
        for place, name in enumerate(names):
            if not name.strip():
                near = ")" if place == len(names) - 1 else ","
                raise StatementError(f'syntax error at or near "{near}"', "42601")
    if direction == "in" and m["query"]:
        raise StatementError("COPY (query) FROM STDIN is not valid", "42601")
    st = CopyStatement(direction, ".".join(unqualified_parts(
        [_ident(t) for t in re.findall(_IDENT, m["table"])])) if m["table"] else None,
                       m["query"],
                       [_ident(c.strip()) for c in m["cols"].split(",")] if m["cols"] else None)
    opts = m["opts"].strip()
    opts = re.sub(r"^WITH\s*", "", opts, flags=re.I).strip()
    if opts.startswith("(") and opts.endswith(")"):  # (commas inside '...' are values)
        items = [o.strip() for o in re.findall(r"(?:'(?:[^']|'')*'|\([^)]*\)|[^,'(])+",
                                                opts[1:-1]) if o.strip()]
    else:  # the old syntax: [BINARY] [DELIMITER [AS] ','] [NULL [AS] ''] [CSV [HEADER]]
        items = _old_options(opts)
    given: set[str] = set()
    for item in items:
        km = re.match(r"([A-Za-z_]*)\s*(.*)", item, re.S)
        assert km
        key, value = km[1].upper() or item, km[2].strip()
        text = value[1:-1].replace("''", "'") if value.startswith("'") else value
        if key in given:
            raise StatementError("conflicting or redundant options", "42601")
        given.add(key)
        if key == "FORMAT":
            if text.lower() not in ("text", "csv", "binary"):
                raise StatementError(f"COPY format {text} is not supported (text, csv, "
                                     "binary)", "0A000")
            st.csv = text.lower() == "csv"
            st.binary = text.lower() == "binary"
        elif key == "HEADER":
            word = text.lower()
            if word not in ("", "true", "on", "1", "false", "off", "0", "match"):
                raise StatementError('header requires a Boolean value or "match"', "42601")
            st.header = word not in ("false", "off", "0")
            st.header_match = word == "match"
            if st.header_match and direction == "out":
                raise StatementError('cannot use "match" with HEADER in COPY TO', "0A000")
        elif key in ("FORCE_NOT_NULL", "FORCE_NULL"):
            if not (value.startswith("(") and value.endswith(")")):
                raise StatementError(f'argument to option "{key.lower()}" must be a list of '
                                     "column names", "22023")
            setattr(st, key.lower(), [_ident(c.strip()) for c in value[1:-1].split(",")])
        elif key == "DELIMITER":
            st.delimiter = text
        elif key == "NULL":
            st.null = text
        elif key in ("QUOTE", "ESCAPE"):
            setattr(st, key.lower(), text)
        else:
            raise StatementError(f"COPY option {key} is not supported", "0A000")
        if st.binary and key in ("HEADER", "DELIMITER", "NULL"):
            raise StatementError(f"cannot specify {key} in BINARY mode",
                                 "0A000" if key == "HEADER" else "42601")
    if st.csv:
        st.delimiter = st.delimiter if "DELIMITER" in given else ","
        st.null = st.null if "NULL" in given else ""
        st.escape = st.escape if "ESCAPE" in given else st.quote
    _check_options(st, given)
    return st


def _check_options(st: CopyStatement, given: set[str]) -> None:
    """PostgreSQL's checks of the text and CSV options, in its order, with its codes:
    without them a value and NULL, or a field and the next, could be written alike (in
    text format a delimiter that is a letter, a digit, ``.`` or a backslash would be
    taken for an escape)."""
    def one_byte(what: str, value: str) -> None:
        if len(value.encode()) != 1:
            raise StatementError(f"COPY {what} must be a single one-byte character", "0A000")

    one_byte("delimiter", st.delimiter)
    if st.delimiter in "\r\n":
        raise StatementError("COPY delimiter cannot be newline or carriage return", "22023")
    if "\r" in st.null or "\n" in st.null:
        raise StatementError("COPY null representation cannot use newline or carriage "
                             "return", "22023")
    if not st.csv and st.delimiter in "\\.abcdefghijklmnopqrstuvwxyz0123456789":
        raise StatementError(f'COPY delimiter cannot be "{st.delimiter}"', "22023")
    if not st.csv and given & {"QUOTE", "ESCAPE"}:
        key = "quote" if "QUOTE" in given else "escape"
        raise StatementError(f"COPY {key} available only in CSV mode", "0A000")
    if st.csv:
        one_byte("quote", st.quote)
        if st.delimiter == st.quote:
            raise StatementError("COPY delimiter and quote must be different", "22023")
        one_byte("escape", st.escape)
    if st.delimiter in st.null:
        raise StatementError("COPY delimiter must not appear in the NULL specification",
                             "0A000")
    if st.csv and st.quote in st.null:
        raise StatementError("CSV quote character must not appear in the NULL "
                             "specification", "0A000")
    for key, what in (("FORCE_NOT_NULL", "force not null"), ("FORCE_NULL", "force null")):
        if key in given and not st.csv:
            raise StatementError(f"COPY {what} available only in CSV mode", "0A000")
        if key in given and st.direction != "in":
            raise StatementError(f"COPY {what} only available using COPY FROM", "0A000")


def _old_options(opts: str) -> list[str]:
    """The options of PostgreSQL's old COPY syntax (``CSV HEADER``, ``DELIMITER AS ','``,
    as psql's ``\\copy ... csv header`` sends them) as the new syntax's ``KEY value``."""
    tokens = re.findall(r"'(?:[^']|'')*'|[^\s']+", opts)
    items, i = [], 0
    while i < len(tokens):
        word = tokens[i].upper()
        i += 1
        if word in ("CSV", "BINARY"):
            items.append(f"FORMAT {word}")
        elif word == "HEADER":
            items.append("HEADER")
        elif word == "FORCE":  # FORCE QUOTE ... / FORCE NOT NULL ...: refused below
            items.append(word)
            break
        elif word in ("DELIMITER", "NULL", "QUOTE", "ESCAPE"):
            if i < len(tokens) and tokens[i].upper() == "AS":
                i += 1
            if i >= len(tokens) or not tokens[i].startswith("'"):
                raise StatementError(f"COPY: {word} needs a quoted string", "42601")
            items.append(f"{word} {tokens[i]}")
            i += 1
        else:
            items.append(tokens[i - 1])  # (refused below, by its name)
    return items


def decode_rows(st: CopyStatement, data: bytes) -> list[list[str | None]]:
    """The rows of text or CSV ``data`` (all of it: :func:`._copyin.decoder` reads it as
    it comes)."""
    from ._copyin import decoder

    dec = decoder(st, 1 << 62)
    return dec.feed(data) + dec.finish()


def encode_rows(st: CopyStatement, names: list[str], rows: Sequence[Sequence[Any]],
                *, first: bool = True, oids: list[int] | None = None,
                extra_float_digits: int = 1) -> Iterator[bytes]:
    """Rows in text or CSV, a chunk (one CopyData) per row, each value as a SELECT writes
    its column's type ``oids`` in text (:func:`._types.text_formatter`, a real column's
    values all at once: :func:`._types.real_writers`; None: as its Python type says);
    ``first``: these are the result's first rows (the header line, if asked for, comes
    before them)."""
    header = st.header and first
    writers = [text_formatter(o, extra_float_digits) for o in oids or [0] * len(names)]
    for i, write in real_writers(oids or [], rows, extra_float_digits, nulls=False).items():
        writers[i] = write
    if st.csv:
        single = len(names) == 1
        if header:
            yield (st.delimiter.join(_csv_field(st, n, single) for n in names)
                   + "\n").encode()
        for row in rows:
            yield (st.delimiter.join(st.null if v is None else _csv_field(st, w(v), single)
                                     for w, v in zip(writers, row, strict=True))
                   + "\n").encode()
        return
    if header:
        yield (st.delimiter.join(_text_field(st, n) for n in names) + "\n").encode()
    for row in rows:
        fields = [st.null if v is None else _text_field(st, w(v))
                  for w, v in zip(writers, row, strict=True)]
        yield (st.delimiter.join(fields) + "\n").encode()


def _text_field(st: CopyStatement, value: str) -> str:
    """A value (never NULL) as PostgreSQL's text format writes it: backspace, form feed,
    newline, carriage return, tab and vertical tab as ``\\b`` ... ``\\v``, a backslash
    and the delimiter after a backslash, other characters as they are. (The delimiter is
    replaced last: it is none of the characters the escapes insert, parse_copy saw to it.)"""
    return value.replace("\\", "\\\\").replace("\b", "\\b").replace("\f", "\\f").replace(
        "\n", "\\n").replace("\r", "\\r").replace("\t", "\\t").replace("\v", "\\v").replace(
        st.delimiter, "\\" + st.delimiter)


# --- CSV ---------------------------------------------------------------------------------

def _csv_field(st: CopyStatement, value: str, single: bool) -> str:
    """A value (never NULL) as PostgreSQL's CSV writes it: quoted if it holds the
    delimiter, the quote, a newline or a carriage return, if it equals the NULL string (so
    that it reads back as that string), or if it is ``\\.`` in a row of one column (the
    end-of-data marker); inside quotes the quote and the escape character follow an escape
    character."""
    if (st.delimiter not in value and st.quote not in value and "\n" not in value
            and "\r" not in value and value != st.null and not (single and value == "\\.")):
        return value
    q, e = st.quote, st.escape
    body = value.replace(q, q + q) if e == q else value.replace(e, e + e).replace(q, e + q)
    return q + body + q


# --- binary ------------------------------------------------------------------------------

_INTS = {2: "!h", 4: "!i", 8: "!q"}


def _field(oid: int, data: bytes, row: int, column: int) -> object:
    """One field's value by its column's type OID. An integer column takes a 2, 4 or 8
    byte integer and a float column a 4 or 8 byte float, whatever its own width (the
    engines' types map to PostgreSQL's loosely: SQLite's INTEGER is int8)."""
    try:
        if oid in (_types.INT2, _types.INT4, _types.INT8) and len(data) in _INTS:
            return struct.unpack(_INTS[len(data)], data)[0]
        if oid in (_types.FLOAT4, _types.FLOAT8) and len(data) in (4, 8):
            return struct.unpack("!f" if len(data) == 4 else "!d", data)[0]
        if oid in (_types.INT2, _types.INT4, _types.INT8, _types.FLOAT4, _types.FLOAT8):
            raise ProtocolError(f"{len(data)} bytes is not a binary number")
        if oid == _types.TIME:
            if len(data) != 8:
                raise ProtocolError(f"{len(data)} bytes is not a binary time")
            (us,) = struct.unpack("!q", data)
            if not 0 <= us < 86_400_000_000:
                raise ProtocolError("time out of range")
            seconds, micro = divmod(us, 1_000_000)
            return dt.time(seconds // 3600, seconds // 60 % 60, seconds % 60, micro)
        return _types._decode_binary(oid, data)
    except (ProtocolError, struct.error, ValueError, ArithmeticError) as exc:
        raise StatementError(f"COPY binary data: row {row}, column {column}: {exc}",
                             "22P03") from None


def decode_binary(data: bytes, oids: list[int]) -> list[list[object]]:
    """Rows of PostgreSQL's binary copy format (all of ``data``: :func:`._copyin.decoder`
    reads it as it comes), each field decoded by the OID of its column; a malformed stream
    raises StatementError (22P04, 22P03 for a bad value)."""
    from ._copyin import _BinaryDecoder

    dec = _BinaryDecoder(oids, 1 << 62)
    return dec.feed(data) + dec.finish()


def encode_binary(oids: list[int], rows: Iterable[tuple[Any, ...]], *, first: bool = True,
                  last: bool = True) -> Iterator[bytes]:
    """Rows in PostgreSQL's binary copy format, a chunk (one CopyData) per row and one for
    the trailer; the header starts the first, as PostgreSQL sends it (psycopg expects it).
    ``first``: these are the result's first rows (the header is sent before them);
    ``last``: its last (the trailer follows them)."""
    head = SIGNATURE + struct.pack("!Ii", 0, 0) if first else b""
    count = struct.pack("!h", len(oids))
    for row in rows:
        out = [head, count]
        head = b""
        for oid, value in zip(oids, row, strict=True):
            field = _types.encode_value(oid, value, 1)
            if field is None:
                out.append(b"\xff\xff\xff\xff")
            else:
                out.append(struct.pack("!i", len(field)))
                out.append(field)
        yield b"".join(out)
    if last:
        yield head + b"\xff\xff"

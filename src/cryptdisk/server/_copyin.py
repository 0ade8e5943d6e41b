"""COPY ... FROM STDIN's data read as it arrives: text, CSV and binary, PostgreSQL 15's rules.

A decoder takes the CopyData bodies in order (:meth:`CopyDecoder.feed`, any split: a
line, a quoted CSV field, a binary tuple or a UTF-8 character may span messages) and
returns the rows each completes; :meth:`CopyDecoder.finish` the last ones, at CopyDone.
What it holds between calls is the incomplete line or tuple only: at most ``max_line``
bytes (a longer one is an error, 54000), so a COPY of any size is read in bounded memory.

The text and CSV rules are those of PostgreSQL 15's ``CopyReadLineText`` and
``CopyReadAttributes*``, checked against a real server (tests/server/copy_vectors.json):

- the first line's ending (``\\n``, ``\\r\\n`` or ``\\r``) is the data's; another one
  outside a quoted CSV field is an error (22P04, "literal newline found in data");
- text: a backslash escapes the next character, a newline too (the value holds it);
  ``\\ooo`` (its value modulo 256) and ``\\xhh`` are bytes, which must make UTF-8 with
  the rest (``\\0``, ``\\377``: 22021, as an invalid byte of the input is); ``\\.``
  anywhere in a line ends the data (the line's text before it is its last row), and must
  be followed by the data's line ending ("end-of-copy marker corrupt" otherwise); a
  backslash at the very end of the data is dropped;
- CSV: ``\\.`` ends the data only alone at the start of a record (unquoted), and must then
  end with the data's line ending; ``\\.`` at the very end of the data is a value;
- HEADER skips the first line; HEADER MATCH checks its fields against the column names;
  FORCE_NOT_NULL makes the NULL string of a column a value, FORCE_NULL a quoted one NULL.
"""

from __future__ import annotations

import codecs
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ._engines import StatementError

__all__ = ["CopyDecoder", "decoder"]

_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|([\s\S])|$)")
_ESCAPE_BYTES = re.compile(rb"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|([\s\S])|$)")
#: a text line's characters up to its end, ``\\.`` or a backslash ending the buffer
_TEXT_LINE = re.compile(r"(?:[^\\\r\n]++|\\[^.])*+")
_NEWLINE = {"\n": "newline", "\r": "carriage return"}
_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"  # (as _copy.SIGNATURE)


def _utf8_error(data: bytes) -> StatementError:
    bad = " ".join(f"0x{b:02x}" for b in data[:3])
    return StatementError(f'invalid byte sequence for encoding "UTF8": {bad}', "22021")


def _unescape_bytes(field: str) -> str:
    """A text field whose escapes give bytes of 0x80 or more: the bytes, as UTF-8."""
    def sub(m: re.Match[bytes]) -> bytes:
        if m[1] is not None:
            return bytes([int(m[1], 8) & 0xFF])
        if m[2] is not None:
            return bytes([int(m[2], 16)])
        if m[3] is not None:
            return _ESCAPES.get(m[3].decode("latin-1"), m[3].decode("latin-1")).encode(
                "latin-1") if m[3] in b"bfnrtv" else m[3]
        return b""

    raw = _ESCAPE_BYTES.sub(sub, field.encode())
    try:
        value = raw.decode()
    except UnicodeDecodeError as exc:
        raise _utf8_error(raw[exc.start:exc.end + 2]) from None
    if "\x00" in value:
        raise _utf8_error(b"\x00")
    return value


def _unescape(field: str) -> str:
    """A text-format field's value: its backslash escapes replaced (PostgreSQL's
    CopyReadAttributesText); 22021 for an escape that makes NUL or bytes not UTF-8."""
    high = False

    def sub(m: re.Match[str]) -> str:
        nonlocal high
        if m[3] is not None:
            return _ESCAPES.get(m[3], m[3])
        if m[1] is None and m[2] is None:
            return ""  # a backslash that ends the line
        b = int(m[1], 8) & 0xFF if m[1] is not None else int(m[2], 16)
        if b == 0:
            raise _utf8_error(b"\x00")
        high = high or b >= 0x80
        return chr(b)

    value = _ESCAPE.sub(sub, field)
    return _unescape_bytes(field) if high else value


def _split_text(line: str, delimiter: str) -> list[str]:
    """A text-format line's fields, still escaped: split at the delimiters no backslash
    escapes (a value's delimiter is written ``\\|``, as PostgreSQL writes it)."""
    if "\\" not in line:
        return line.split(delimiter)
    fields, start, i, n = [], 0, 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c == delimiter:
            fields.append(line[start:i])
            start = i + 1
        i += 1
    fields.append(line[start:])
    return fields


class CopyDecoder:
    """Rows of one COPY ... FROM STDIN's data, fed as it arrives.

    ``feed(data)`` returns the rows ``data`` completes, ``finish()`` those left at the end
    of the data; both raise :class:`StatementError` for malformed data, with the line (or
    binary row) where it is. ``lines`` is the input lines read so far (the header too), and
    ``ended`` tells that the end-of-data marker was read (the rest is ignored, as
    PostgreSQL ignores it)."""

    def __init__(self, max_line: int, name: str = "") -> None:
        self.max_line = max_line
        self.name = name
        self.lines = 0
        self.ended = False

    def feed(self, data: bytes) -> list[list[Any]]:
        raise NotImplementedError

    def finish(self) -> list[list[Any]]:
        raise NotImplementedError

    def _error(self, message: str, hint: str | None = None, sqlstate: str = "22P04",
               line: int | None = None) -> StatementError:
        where = f"COPY {self.name}, " if self.name else "COPY "
        return StatementError(f"{message} ({where}line {line or self.lines + 1})", sqlstate,
                              hint=hint)

    def _too_long(self, size: int) -> StatementError:
        return self._error(f"a line of {size} bytes or more exceeds the server's "
                           f"max_copy_size ({self.max_line} bytes)", "send shorter lines, "
                           "or raise max_copy_size", "54000")


class _LineDecoder(CopyDecoder):
    """Text and CSV: the input as text (UTF-8, decoded as it comes), split into records."""

    def __init__(self, st: Any, max_line: int, name: str = "",
                 names: list[str] | None = None,
                 force_not_null: Sequence[int] = (), force_null: Sequence[int] = ()) -> None:
        super().__init__(max_line, name)
        self.st = st
        self.names = names  # HEADER MATCH: the columns the header line must name
        self.header = bool(st.header)
        self.force_not_null = list(force_not_null)
        self.force_null = list(force_null)
        self.eol: str | None = None
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""

    def feed(self, data: bytes) -> list[list[Any]]:
        if self.ended:
            return []
        try:
            text = self._utf8.decode(data)
        except UnicodeDecodeError as exc:
            raise self._utf8_failure(exc) from None
        if "\x00" in text:
            raise self._error('invalid byte sequence for encoding "UTF8": 0x00',
                              sqlstate="22021")
        buf = self._text + text if self._text else text
        rows, used = self._records(buf, False)
        self._text = buf[used:]
        if len(self._text) > self.max_line:  # (characters: at least as many bytes)
            raise self._too_long(len(self._text))
        return rows

    def finish(self) -> list[list[Any]]:
        if self.ended:
            return []
        try:
            tail = self._utf8.decode(b"", final=True)
        except UnicodeDecodeError as exc:
            raise self._utf8_failure(exc) from None
        buf, self._text = self._text + tail, ""
        rows, _ = self._records(buf, True)
        if self.header and self.names is not None:  # no header line at all
            self._check_header(None)
        return rows

    def _utf8_failure(self, exc: UnicodeDecodeError) -> StatementError:
        bad = exc.object[exc.start:exc.end + 2]
        return self._error(f'invalid byte sequence for encoding "UTF8": '
                           f'{" ".join(f"0x{b:02x}" for b in bad[:3])}', sqlstate="22021")

    def _records(self, buf: str, final: bool) -> tuple[list[list[Any]], int]:
        raise NotImplementedError

    def _line_end(self, buf: str, at: int, final: bool, csv: bool) -> int | None:
        """Where the line ending at ``buf[at]`` (a CR or LF) ends, checked against the
        data's; None: it cannot be told yet (a CR that ends the buffer)."""
        what = "unquoted" if csv else "literal"
        c = buf[at]
        if c == "\r":
            if self.eol is None or self.eol == "\r\n":
                if at + 1 == len(buf) and not final:
                    return None
                if buf[at + 1:at + 2] == "\n":
                    self.eol = "\r\n"
                    return at + 2
                if self.eol is None:
                    self.eol = "\r"
                    return at + 1
            if self.eol == "\r":
                return at + 1
        elif self.eol is None or self.eol == "\n":
            self.eol = "\n"
            return at + 1
        name = _NEWLINE[c]
        raise self._error(f"{what} {name} found in data",
                          f'Use quoted CSV field to represent {name}.' if csv else
                          f'Use "\\{"r" if c == chr(13) else "n"}" to represent {name}.')

    def _marker_end(self, buf: str, at: int, final: bool, csv: bool) -> bool | None:
        """After ``\\.`` at ``buf[at]``: True if it ends the data, False if it is a value
        (CSV only), None if the buffer ends too soon to tell."""
        rest = buf[at + 2:at + 4]
        need = 2 if self.eol == "\r\n" else 1
        if len(rest) < need and not final:
            return None
        if not rest:
            if csv:
                return False
            raise self._error("end-of-copy marker corrupt")
        first = rest[0]
        if self.eol == "\r\n":
            if first == "\n" and csv:
                return False
            if first == "\n":
                raise self._error("end-of-copy marker does not match previous newline style")
            if first != "\r":
                if csv:
                    return False
                raise self._error("end-of-copy marker corrupt")
            first = rest[1:2]
            if not first:
                if csv:
                    raise self._error("unquoted carriage return found in data",
                                      "Use quoted CSV field to represent carriage return.")
                raise self._error("end-of-copy marker corrupt")
        if first not in ("\r", "\n"):
            if csv:
                return False
            raise self._error("end-of-copy marker corrupt")
        if (self.eol in ("\n", "\r\n") and first != "\n") or (self.eol == "\r"
                                                             and first != "\r"):
            raise self._error("end-of-copy marker does not match previous newline style")
        return True

    def _row(self, fields: list[str | None]) -> list[Any] | None:
        """A record's fields as a row (None: it was the header line)."""
        self.lines += 1
        if self.header:
            self.header = False
            if self.names is not None:
                self._check_header(fields)
            return None
        raw = list(fields) if self.force_null and self.force_not_null else fields
        for j in self.force_not_null:
            if j < len(fields) and fields[j] is None:
                fields[j] = self.st.null
        for j in self.force_null:  # (not a NULL FORCE_NOT_NULL made a value)
            if j < len(fields) and fields[j] == self.st.null and (
                    j not in self.force_not_null or raw[j] is not None):
                fields[j] = None
        return fields

    def _check_header(self, fields: list[str | None] | None) -> None:
        """HEADER MATCH: PostgreSQL 15's checks of the header line's fields."""
        self.header = False
        names = self.names or []
        # no header line: an empty one, which CSV reads as NULL
        got = fields if fields is not None else [None] if self.st.csv else [""]
        if len(got) != len(names):
            raise self._error(f"wrong number of fields in header line: got {len(got)}, "
                              f"expected {len(names)}", line=1)
        for i, (value, name) in enumerate(zip(got, names, strict=True)):
            if value is None:
                raise self._error(f"column name mismatch in header line field {i + 1}: got "
                                  f'null value ("{self.st.null}"), expected "{name}"', line=1)
            if value != name:
                raise self._error(f"column name mismatch in header line field {i + 1}: got "
                                  f'"{value}", expected "{name}"', line=1)


class _TextDecoder(_LineDecoder):
    """PostgreSQL's text format."""

    def _records(self, buf: str, final: bool) -> tuple[list[list[Any]], int]:
        rows: list[list[Any]] = []
        st = self.st
        null, delimiter = st.null, st.delimiter
        n = len(buf)
        if self.eol in (None, "\n") and "\\" not in buf and "\r" not in buf:
            # the common case: lines split at newlines, fields at delimiters, no escapes
            end = n if final else buf.rfind("\n") + 1
            if end == 0:
                return rows, 0
            lines = buf[:end].split("\n")
            if lines[-1] == "":
                lines.pop()
            if len(lines) > 1 or buf[end - 1:end] == "\n":
                self.eol = "\n"
            if self.header and lines:
                self._row([None if f == null else f for f in lines.pop(0).split(delimiter)])
            self.lines += len(lines)
            if self.force_null or self.force_not_null:
                self.lines -= len(lines)
                for line in lines:
                    rows.append(self._row(  # type: ignore[arg-type]
                        [None if f == null else f for f in line.split(delimiter)]))
                return rows, end
            rows = [[None if f == null else f for f in line.split(delimiter)]
                    for line in lines]
            return rows, end
        pos = 0
        while pos < n:
            e = _TEXT_LINE.match(buf, pos).end()  # type: ignore[union-attr]
            if e == n or (buf[e] == "\\" and e + 1 == n):  # the buffer ends the line
                if not final:
                    break
                self._text_row(rows, buf[pos:n])
                pos = n
                break
            if buf[e] == "\\":  # \. : the end of the data
                ends = self._marker_end(buf, e, final, False)
                if ends is None:
                    break
                if e > pos:
                    self._text_row(rows, buf[pos:e])
                self.ended = True
                return rows, n
            after = self._line_end(buf, e, final, False)
            if after is None:
                break
            self._text_row(rows, buf[pos:e])
            pos = after
        return rows, pos

    def _text_row(self, rows: list[list[Any]], line: str) -> None:
        null = self.st.null
        row = self._row([None if f == null else _unescape(f) if "\\" in f else f
                         for f in _split_text(line, self.st.delimiter)])
        if row is not None:
            rows.append(row)


class _CsvDecoder(_LineDecoder):
    """PostgreSQL's CSV: a field may mix quoted and unquoted parts (``a"b,c"`` is
    ``ab,c``); it is NULL only if no part was quoted and it equals the NULL string."""

    def __init__(self, st: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(st, *args, **kwargs)
        d, q, e = (re.escape(c) for c in (st.delimiter, st.quote, st.escape))
        if st.quote == st.escape:
            inner = f"(?:[^{q}]|{q}{q})*+"
        else:  # an escape before the quote or itself takes it; elsewhere it is itself
            inner = f"(?:[^{q}{e}]|{e}[{q}{e}]|{e}(?![{q}{e}]))*+"
        self._field = re.compile(f"(?:[^{d}{q}\r\n]++|{q}{inner}{q})*+")
        self._part = re.compile(f"{q}({inner}){q}")
        quote, escape = st.quote, st.escape
        unescape = re.compile(f"{e}([{re.escape(quote + escape)}])")
        self._content: Callable[[re.Match[str]], str] = (
            (lambda m: m[1].replace(quote + quote, quote)) if quote == escape
            else (lambda m: unescape.sub(r"\1", m[1])))

    def _records(self, buf: str, final: bool) -> tuple[list[list[Any]], int]:
        st = self.st
        q, d, null = st.quote, st.delimiter, st.null
        field, part, content = self._field, self._part, self._content
        rows: list[list[Any]] = []
        pos, n = 0, len(buf)
        while pos < n:
            start = pos
            if buf.startswith("\\.", pos):
                ends = self._marker_end(buf, pos, final, True)
                if ends is None:
                    break
                if ends:
                    self.ended = True
                    return rows, n
            fields: list[str | None] = []
            while True:
                m = field.match(buf, pos)
                raw, pos = m[0], m.end()  # type: ignore[index, union-attr]
                fields.append(part.sub(content, raw) if q in raw else None if raw == null
                              else raw)
                if pos < n and buf[pos] == d:
                    pos += 1
                else:
                    break
            if pos < n and buf[pos] == q:  # a quote left open
                if not final:
                    return rows, start
                raise self._error("unterminated CSV quoted field")
            if pos == n and not final:
                return rows, start
            if pos < n:
                after = self._line_end(buf, pos, final, True)
                if after is None:
                    return rows, start
                pos = after
            row = self._row(fields)
            if row is not None:
                rows.append(row)
        return rows, pos


class _BinaryDecoder(CopyDecoder):
    """PostgreSQL's binary copy format, each field decoded by its column's type OID."""

    def __init__(self, oids: list[int], max_line: int, name: str = "") -> None:
        super().__init__(max_line, name)
        self.oids = oids
        self._buf = b""
        self._header = False

    def feed(self, data: bytes) -> list[list[Any]]:
        if self.ended:
            if data:
                raise _bad(f"{len(data)} bytes after the end-of-data marker")
            return []
        buf = self._buf + data if self._buf else data
        rows, used = self._rows(buf)
        self._buf = buf[used:]
        if len(self._buf) > self.max_line:
            raise self._too_long(len(self._buf))
        return rows

    def finish(self) -> list[list[Any]]:
        rows = self.feed(b"")
        if not self._header:
            raise _bad("the header is truncated" if self._buf.startswith(_SIGNATURE) else
                       "the signature is missing (not PostgreSQL's binary copy format)")
        if self._buf:
            raise _bad(f"row {self.lines + 1} is truncated")
        return rows  # ended at a row boundary without the marker: PostgreSQL accepts it

    def _rows(self, buf: bytes) -> tuple[list[list[Any]], int]:
        from ._copy import SIGNATURE, _field

        view = memoryview(buf)
        n = len(view)
        pos = 0
        if not self._header:
            if n < 19:
                if bytes(view[:11]) != SIGNATURE[:min(n, 11)]:
                    raise _bad("the signature is missing (not PostgreSQL's binary copy "
                               "format)")
                return [], 0
            if bytes(view[:11]) != SIGNATURE:
                raise _bad("the signature is missing (not PostgreSQL's binary copy format)")
            flags, ext = struct.unpack_from("!Ii", view, 11)
            if flags & 0x10000:
                raise _bad("rows with OIDs are not supported")
            if flags & 0xFFFF0000:
                raise _bad(f"unknown critical flags {flags:#x} in the header")
            if ext < 0 or ext > self.max_line:
                raise _bad("the header extension is longer than the data")
            if 19 + ext > n:
                return [], 0
            self._header = True
            pos = 19 + ext
        rows: list[list[Any]] = []
        oids = self.oids
        width = len(oids)
        while pos < n:
            start = pos
            if pos + 2 > n:
                return rows, start
            (count,) = struct.unpack_from("!h", view, pos)
            pos += 2
            if count == -1:
                if pos != n:
                    raise _bad(f"{n - pos} bytes after the end-of-data marker")
                self.ended = True
                return rows, n
            number = self.lines + 1
            if count != width:
                raise _bad(f"row {number} has {count} fields for {width} columns")
            row: list[Any] = []
            for column, oid in enumerate(oids):
                if pos + 4 > n:
                    return rows, start
                (size,) = struct.unpack_from("!i", view, pos)
                pos += 4
                if size == -1:
                    row.append(None)
                    continue
                if size < 0:
                    raise _bad(f"row {number}, column {column + 1}: a field of {size} "
                               "bytes")
                if size > self.max_line:
                    raise self._too_long(size)
                if size > n - pos:
                    return rows, start
                row.append(_field(oid, bytes(view[pos:pos + size]), number, column + 1))
                pos += size
            self.lines += 1
            rows.append(row)
        return rows, pos


def _bad(text: str) -> StatementError:
    return StatementError(f"COPY binary data: {text}", "22P04")


def decoder(st: Any, max_line: int, *, name: str = "", oids: list[int] | None = None,
            names: list[str] | None = None, force_not_null: Sequence[int] = (),
            force_null: Sequence[int] = ()) -> CopyDecoder:
    """The decoder of ``st``'s data (a :class:`._copy.CopyStatement`): binary by the
    column type ``oids``; ``names``: the columns HEADER MATCH checks the header against;
    ``force_not_null`` / ``force_null``: the positions of the columns named by CSV's
    FORCE_NOT_NULL / FORCE_NULL; ``name``: the table, for error messages."""
    if st.binary:
        return _BinaryDecoder(oids or [], max_line, name)
    cls = _CsvDecoder if st.csv else _TextDecoder
    return cls(st, max_line, name, names if getattr(st, "header_match", False) else None,
               force_not_null, force_null)

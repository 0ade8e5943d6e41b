"""COPY ... FROM STDIN and COPY ... TO STDOUT: the statement, and rows in text or CSV format.

Text format is PostgreSQL's: fields split by a delimiter (tab), ``\\N`` for NULL,
backslash escapes. CSV: RFC 4180 quoting, an empty field is NULL (the
``NULL`` option changes that), optional header line. Binary COPY is not supported.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ._engines import StatementError
from ._types import _text

__all__ = ["CopyStatement", "decode_rows", "encode_rows", "parse_copy"]

_IDENT = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


@dataclass
class CopyStatement:
    direction: str            # "in" (FROM STDIN) or "out" (TO STDOUT)
    table: str | None         # the table, or None for COPY (query) TO STDOUT
    query: str | None
    columns: list[str] | None
    csv: bool = False
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"


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
    if direction == "in" and m["query"]:
        raise StatementError("COPY (query) FROM STDIN is not valid", "42601")
    st = CopyStatement(direction, ".".join(_ident(t) for t in re.findall(_IDENT, m["table"]))
                       if m["table"] else None, m["query"],
                       [_ident(c.strip()) for c in m["cols"].split(",")] if m["cols"] else None)
    opts = m["opts"].strip()
    opts = re.sub(r"^WITH\s*", "", opts, flags=re.I).strip()
    if opts.startswith("(") and opts.endswith(")"):
        items = [o.strip() for o in opts[1:-1].split(",") if o.strip()]
    else:  # the old syntax: CSV HEADER DELIMITER ',' NULL ''
        items = re.findall(r"[A-Za-z_]+(?:\s+(?:'(?:[^']|'')*'|[A-Za-z_]+))?", opts)
        items = [re.sub(r"^CSV$", "FORMAT csv", i, flags=re.I) for i in items]
    for item in items:
        key, _, value = item.partition(" ")
        key, value = key.upper(), value.strip()
        text = value[1:-1].replace("''", "'") if value.startswith("'") else value
        if key == "FORMAT":
            if text.lower() not in ("text", "csv"):
                raise StatementError(f"COPY format {text} is not supported (text, csv)", "0A000")
            st.csv = text.lower() == "csv"
        elif key == "HEADER":
            st.header = text.lower() not in ("false", "off", "0")
        elif key == "DELIMITER":
            if len(text) != 1:
                raise StatementError("COPY delimiter must be a single character", "22023")
            st.delimiter = text
        elif key == "NULL":
            st.null = text
        else:
            raise StatementError(f"COPY option {key} is not supported", "0A000")
    if st.csv:
        st.delimiter = "," if st.delimiter == "\t" and "DELIMITER" not in opts.upper() \
            else st.delimiter
        st.null = "" if st.null == "\\N" and "NULL" not in opts.upper() else st.null
    return st


def _unescape(field: str) -> str:
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c != "\\" or i + 1 >= len(field):
            out.append(c)
            i += 1
            continue
        n = field[i + 1]
        if n in _ESCAPES:
            out.append(_ESCAPES[n])
            i += 2
        elif n in "01234567":
            m = re.match(r"[0-7]{1,3}", field[i + 1:])
            assert m
            out.append(chr(int(m[0], 8)))
            i += 1 + len(m[0])
        elif n == "x" and re.match(r"[0-9A-Fa-f]", field[i + 2:i + 3]):
            m = re.match(r"[0-9A-Fa-f]{1,2}", field[i + 2:])
            assert m
            out.append(chr(int(m[0], 16)))
            i += 2 + len(m[0])
        else:
            out.append(n)
            i += 2
    return "".join(out)


def decode_rows(st: CopyStatement, data: bytes) -> list[list[str | None]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise StatementError("COPY data is not valid UTF-8", "22021") from None
    rows: list[list[str | None]] = []
    if st.csv:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=st.delimiter,
                            strict=True)
        try:
            for i, raw in enumerate(reader):
                if i == 0 and st.header:
                    continue
                rows.append([None if v == st.null else v for v in raw])
        except csv.Error as exc:
            raise StatementError(f"COPY: malformed CSV: {exc}", "22P04") from None
        return rows
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for i, line in enumerate(lines):
        if line == "\\.":
            break
        if i == 0 and st.header:
            continue
        rows.append([None if f == st.null else _unescape(f)
                     for f in line.rstrip("\r").split(st.delimiter)])
    return rows


def encode_rows(st: CopyStatement, names: list[str], rows: Iterable[tuple[Any, ...]]) -> \
        Iterator[bytes]:
    if st.csv:
        buf = io.StringIO()
        writer = csv.writer(buf, delimiter=st.delimiter, lineterminator="\n")
        if st.header:
            writer.writerow(names)
        for row in rows:
            writer.writerow([st.null if v is None else _text(v) for v in row])
            yield buf.getvalue().encode()
            buf.seek(0)
            buf.truncate()
        if buf.getvalue():
            yield buf.getvalue().encode()
        return
    if st.header:
        yield (st.delimiter.join(names) + "\n").encode()
    for row in rows:
        fields = [st.null if v is None else _text(v).replace("\\", "\\\\").replace(
            "\n", "\\n").replace("\r", "\\r").replace("\t", "\\t").replace(
            st.delimiter, "\\" + st.delimiter) for v in row]
        yield (st.delimiter.join(fields) + "\n").encode()

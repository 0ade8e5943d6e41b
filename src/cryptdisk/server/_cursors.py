"""Server-side cursors: ``DECLARE``, ``FETCH``, ``MOVE``, ``CLOSE`` (psycopg's ServerCursor).

A cursor's query runs when it is declared; its rows are held by the session
(as every portal's are) and handed out by ``FETCH``. The cursor is also a
protocol portal of the same name, so a client may Describe it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._engines import StatementError

__all__ = ["Declare", "Fetch", "move", "parse_close", "parse_declare", "parse_fetch"]

_NAME = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
_DECLARE = re.compile(rf"\s*DECLARE\s+({_NAME})\s+((?:[A-Za-z]+\s+)*?)CURSOR\s+"
                      r"(?:(WITH|WITHOUT)\s+HOLD\s+)?FOR\s+(.+)", re.I | re.S)
_FETCH = re.compile(rf"\s*(FETCH|MOVE)\s+(.*?)\s*({_NAME})\s*;?\s*", re.I | re.S)
_CLOSE = re.compile(rf"\s*CLOSE\s+(ALL|{_NAME})\s*;?\s*", re.I | re.S)


def _ident(token: str) -> str:
    return token[1:-1].replace('""', '"') if token.startswith('"') else token.lower()


@dataclass
class Declare:
    name: str
    hold: bool
    scroll: bool
    query: str


@dataclass
class Fetch:
    name: str
    move: bool          # MOVE: position only, no rows
    kind: str           # "forward", "backward", "absolute", "relative"
    count: int | None   # None: ALL


def parse_declare(sql: str) -> Declare:
    m = _DECLARE.fullmatch(sql)
    if not m:
        raise StatementError("syntax: DECLARE name [[NO] SCROLL] CURSOR [WITH HOLD] FOR query",
                             "42601")
    options = [w.upper() for w in m[2].split()]
    if "BINARY" in options:
        raise StatementError("DECLARE ... BINARY is not supported (ask for binary results "
                             "with the protocol's result formats)", "0A000")
    unknown = set(options) - {"NO", "SCROLL", "ASENSITIVE", "INSENSITIVE"}
    if unknown:
        raise StatementError(f"DECLARE: unknown option {sorted(unknown)[0]}", "42601")
    name = _ident(m[1])
    return Declare(name, (m[3] or "").upper() == "WITH",
                   "SCROLL" in options and "NO" not in options, m[4].strip().rstrip(";"))


def parse_fetch(sql: str) -> Fetch:
    m = _FETCH.fullmatch(sql)
    if not m:
        raise StatementError("syntax: FETCH [direction] [FROM | IN] cursor", "42601")
    words = m[2].split()
    if words and words[-1].upper() in ("FROM", "IN"):
        words = words[:-1]
    up = [w.upper() for w in words]

    def number(text: str) -> int:
        if not re.fullmatch(r"[+-]?\d+", text):
            raise StatementError(f"FETCH: {text!r} is not a row count", "42601")
        return int(text)

    kind, count = "forward", 1
    if not up or up == ["NEXT"]:
        pass
    elif up == ["PRIOR"]:
        kind = "backward"
    elif up == ["FIRST"]:
        kind = "absolute"
    elif up == ["LAST"]:
        kind, count = "absolute", -1
    elif up in (["ALL"], ["FORWARD", "ALL"]):
        count = None  # type: ignore[assignment]
    elif up == ["BACKWARD", "ALL"]:
        kind, count = "backward", None  # type: ignore[assignment]
    elif len(up) == 1 and up[0] in ("FORWARD", "BACKWARD"):
        kind = up[0].lower()
    elif len(up) == 2 and up[0] in ("FORWARD", "BACKWARD", "ABSOLUTE", "RELATIVE"):
        kind, count = up[0].lower(), number(up[1])
    elif len(up) == 1:
        count = number(up[0])
    else:
        raise StatementError(f"FETCH: unknown direction {' '.join(words)}", "42601")
    if count is not None and count < 0 and kind in ("forward", "backward"):
        kind, count = ("backward" if kind == "forward" else "forward"), -count
    return Fetch(_ident(m[3]), m[1].upper() == "MOVE", kind, count)


def parse_close(sql: str) -> str | None:
    """The cursor ``CLOSE`` names; None for ``CLOSE ALL``."""
    m = _CLOSE.fullmatch(sql)
    if not m:
        raise StatementError("syntax: CLOSE name | ALL", "42601")
    return None if m[1].upper() == "ALL" else _ident(m[1])


def move(pos: int, total: int, fetch: Fetch) -> tuple[list[int], int]:
    """(0-based row indices in the order returned, new position) for ``fetch`` from
    position ``pos`` (0: before the first row, 1..total: on a row, total+1: after the
    last), as PostgreSQL moves a cursor."""
    count = total + 1 if fetch.count is None else fetch.count
    if fetch.kind == "forward":
        if count == 0:
            return ([pos - 1] if 1 <= pos <= total else []), pos
        end = min(pos + count, total + 1)
        return list(range(pos, min(end, total))), end
    if fetch.kind == "backward":
        if count == 0:
            return ([pos - 1] if 1 <= pos <= total else []), pos
        end = max(pos - count, 0)
        return list(range(min(pos, total + 1) - 2, max(end, 1) - 2, -1)), end
    target = count if fetch.kind == "absolute" else pos + count
    if fetch.kind == "absolute" and count < 0:
        target = total + 1 + count
    target = max(0, min(target, total + 1))
    return ([target - 1] if 1 <= target <= total else []), target

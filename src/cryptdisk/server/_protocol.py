"""The PostgreSQL v3 wire protocol: a strict parser for what clients send, builders for replies.

Every parser takes the body of one message (already bounded by the caller's
maximum message size) and either returns a frozen dataclass or raises
:class:`cryptdisk.ProtocolError`: lengths and counts are checked against the
bytes present, strings must be NUL-terminated UTF-8, and no trailing byte is
left unread. Nothing here does I/O; :mod:`._session` reads and writes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import ProtocolError

__all__ = [
    "CANCEL_REQUEST_CODE",
    "GSSENC_REQUEST_CODE",
    "PROTOCOL_3",
    "SSL_REQUEST_CODE",
    "Bind",
    "CancelRequest",
    "Close",
    "Describe",
    "Execute",
    "Flush",
    "Parse",
    "Query",
    "SSLRequest",
    "StartupMessage",
    "Sync",
    "Terminate",
    "parse_frontend",
    "parse_startup",
]

PROTOCOL_3 = 196608          # 3 << 16
SSL_REQUEST_CODE = 80877103
CANCEL_REQUEST_CODE = 80877102
GSSENC_REQUEST_CODE = 80877104
#: PostgreSQL's own bound on a startup packet (src/include/libpq/pqcomm.h).
MAX_STARTUP_LENGTH = 10000
#: At most this many parameters in a Bind or Parse (PostgreSQL's limit is 65535, an int16).
MAX_PARAMETERS = 65535


class _Reader:
    """Bounded reads from one message body; every overrun is a ProtocolError."""

    __slots__ = ("data", "kind", "pos")

    def __init__(self, data: bytes, kind: str) -> None:
        self.data = data
        self.pos = 0
        self.kind = kind

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolError(f"{self.kind} message is truncated")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        value: int = struct.unpack("!h", self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = struct.unpack("!i", self._take(4))[0]
        return value

    def byte(self) -> bytes:
        return self._take(1)

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError(f"{self.kind} message has an unterminated string")
        raw = self.data[self.pos:end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"{self.kind} message has a string that is not UTF-8") from None

    def count(self, what: str) -> int:
        n = self.int16()
        if n < 0:
            raise ProtocolError(f"{self.kind} message has a negative {what} count")
        return n

    def rest(self) -> bytes:
        return self._take(len(self.data) - self.pos)

    def done(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"{self.kind} message has {len(self.data) - self.pos} "
                                "unexpected trailing bytes")


# --- startup ------------------------------------------------------------------------


@dataclass(frozen=True)
class StartupMessage:
    parameters: dict[str, str]


@dataclass(frozen=True)
class SSLRequest:
    gss: bool = False  # a GSSENCRequest, refused like an SSLRequest we cannot honour


@dataclass(frozen=True)
class CancelRequest:
    process_id: int
    secret_key: int


def parse_startup(body: bytes) -> StartupMessage | SSLRequest | CancelRequest:
    """Parse a startup packet's body (after its int32 length)."""
    r = _Reader(body, "startup")
    code = r.int32()
    if code == SSL_REQUEST_CODE or code == GSSENC_REQUEST_CODE:
        r.done()
        return SSLRequest(gss=code == GSSENC_REQUEST_CODE)
    if code == CANCEL_REQUEST_CODE:
        pid, key = r.int32(), r.int32()
        r.done()
        return CancelRequest(pid, key)
    if code >> 16 != 3:
        raise ProtocolError(f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF} "
                            "(this server speaks 3.0)")
    params: dict[str, str] = {}
    while True:
        name = r.cstring()
        if not name:
            break
        if name in params:
            raise ProtocolError(f"startup parameter {name!r} given twice")
        params[name] = r.cstring()
    r.done()
    return StartupMessage(params)


# --- frontend messages after startup -------------------------------------------------


@dataclass(frozen=True)
class Query:
    sql: str


@dataclass(frozen=True)
class Parse:
    name: str
    sql: str
    param_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


@dataclass(frozen=True)
class Describe:
    kind: str  # "S" statement or "P" portal
    name: str


@dataclass(frozen=True)
class Execute:
    portal: str
    max_rows: int


@dataclass(frozen=True)
class Close:
    kind: str
    name: str


@dataclass(frozen=True)
class Sync:
    pass


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class Terminate:
    pass


@dataclass(frozen=True)
class Password:
    """A 'p' message: its meaning (SASL initial response, SASL response) depends on state."""

    data: bytes


Message = Query | Parse | Bind | Describe | Execute | Close | Sync | Flush | Terminate | Password


def _formats(r: _Reader, what: str) -> tuple[int, ...]:
    formats = tuple(r.int16() for _ in range(r.count(what)))
    for f in formats:
        if f not in (0, 1):
            raise ProtocolError(f"{r.kind} message has format code {f} (0 text or 1 binary)")
    return formats


def parse_frontend(kind: bytes, body: bytes) -> Message:
    """Parse one frontend message of type ``kind`` (one byte) with ``body``."""
    if kind == b"Q":
        if body and body.find(b"\0") == len(body) - 1:  # the common case, as below
            try:
                return Query(body[:-1].decode("utf-8"))
            except UnicodeDecodeError:
                pass
        r = _Reader(body, "Query")
        q = Query(r.cstring())
        r.done()
        return q
    if kind == b"P":
        r = _Reader(body, "Parse")
        name, sql = r.cstring(), r.cstring()
        types = tuple(r.int32() & 0xFFFFFFFF for _ in range(r.count("parameter type")))
        r.done()
        return Parse(name, sql, types)
    if kind == b"B":
        r = _Reader(body, "Bind")
        portal, statement = r.cstring(), r.cstring()
        pformats = _formats(r, "parameter format")
        values: list[bytes | None] = []
        for _ in range(r.count("parameter")):
            n = r.int32()
            if n < -1:
                raise ProtocolError("Bind message has a parameter length below -1")
            values.append(None if n == -1 else r._take(n))
        rformats = _formats(r, "result format")
        r.done()
        if len(pformats) not in (0, 1, len(values)):
            raise ProtocolError(f"Bind message has {len(pformats)} parameter formats for "
                                f"{len(values)} parameters")
        return Bind(portal, statement, pformats, tuple(values), rformats)
    if kind in (b"D", b"C"):
        label = "Describe" if kind == b"D" else "Close"
        r = _Reader(body, label)
        which = r.byte()
        if which not in (b"S", b"P"):
            raise ProtocolError(f"{label} message names {which!r}, not 'S' or 'P'")
        name = r.cstring()
        r.done()
        return (Describe if kind == b"D" else Close)(which.decode(), name)
    if kind == b"E":
        r = _Reader(body, "Execute")
        portal, max_rows = r.cstring(), r.int32()
        r.done()
        return Execute(portal, max(max_rows, 0))
    if kind in (b"S", b"H", b"X"):
        if body:
            raise ProtocolError(f"message {kind.decode()} has a body of {len(body)} bytes")
        return Sync() if kind == b"S" else Flush() if kind == b"H" else Terminate()
    if kind == b"p":
        return Password(body)
    shown = kind.decode("latin-1") if kind.isalpha() else repr(kind)
    raise ProtocolError(f"unsupported frontend message type {shown} "
                        "(COPY and the function call protocol are not implemented)")


def parse_copy_message(kind: bytes, body: bytes) -> tuple[str, bytes]:
    """A message during COPY FROM STDIN: ("data", bytes), ("done", b""), ("fail", reason),
    ("ignore", b"") for Flush and Sync, which PostgreSQL also ignores there."""
    if kind == b"d":
        return "data", body
    if kind == b"c":
        if body:
            raise ProtocolError("CopyDone message has a body")
        return "done", b""
    if kind == b"f":
        r = _Reader(body, "CopyFail")
        reason = r.cstring()
        r.done()
        return "fail", reason.encode()
    if kind in (b"H", b"S"):
        if body:
            raise ProtocolError(f"message {kind.decode()} has a body")
        return "ignore", b""
    raise ProtocolError(f"unexpected message type {kind!r} during COPY FROM STDIN")


def copy_response(kind: bytes, columns: int) -> bytes:
    """CopyInResponse (G) or CopyOutResponse (H), text format."""
    return message(kind, struct.pack("!bh", 0, columns) + struct.pack("!h", 0) * columns)


def result_format(formats: Sequence[int], index: int) -> int:
    """The format of column/parameter ``index`` under Bind's rules (none, one for all, each)."""
    if not formats:
        return 0
    if len(formats) == 1:
        return formats[0]
    if index >= len(formats):
        raise ProtocolError(f"{len(formats)} format codes for more than {len(formats)} values")
    return formats[index]


# --- backend messages ---------------------------------------------------------------


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstr(text: str) -> bytes:
    return text.encode("utf-8").replace(b"\0", b"") + b"\0"


def auth_ok() -> bytes:
    return message(b"R", struct.pack("!i", 0))


def auth_sasl(mechanisms: Sequence[str]) -> bytes:
    return message(b"R", struct.pack("!i", 10) + b"".join(cstr(m) for m in mechanisms) + b"\0")


def auth_sasl_continue(data: bytes) -> bytes:
    return message(b"R", struct.pack("!i", 11) + data)


def auth_sasl_final(data: bytes) -> bytes:
    return message(b"R", struct.pack("!i", 12) + data)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key_data(pid: int, key: int) -> bytes:
    return message(b"K", struct.pack("!ii", pid, key))


def ready_for_query(status: str) -> bytes:
    return message(b"Z", status.encode())


#: typlen of the fixed-size types a RowDescription names (-1: variable)
_TYPE_SIZES = {16: 1, 20: 8, 21: 2, 23: 4, 700: 4, 701: 8, 1082: 4, 1114: 8, 1184: 8}


def row_description(columns: Sequence[tuple[str, int, int]]) -> bytes:
    """``columns``: (name, type oid, format code)."""
    body = [struct.pack("!h", len(columns))]
    for name, oid, fmt in columns:
        body.append(cstr(name) + struct.pack("!ihihih", 0, 0, oid, _TYPE_SIZES.get(oid, -1), -1,
                                             fmt))
    return message(b"T", b"".join(body))


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!I", o)
                                                                    for o in oids))


_INT32 = struct.Struct("!i")
_INT16 = struct.Struct("!h")
_NULL = _INT32.pack(-1)


def data_row(values: Sequence[bytes | None]) -> bytes:
    parts = [b"D", b"", _INT16.pack(len(values))]
    size = 6
    for v in values:
        if v is None:
            parts.append(_NULL)
            size += 4
        else:
            parts.append(_INT32.pack(len(v)))
            parts.append(v)
            size += 4 + len(v)
    parts[1] = _INT32.pack(size)
    return b"".join(parts)


def command_complete(tag: str) -> bytes:
    done = _COMPLETE.get(tag)
    if done is None:
        done = message(b"C", cstr(tag))
        if len(_COMPLETE) >= 1024:
            _COMPLETE.clear()
        _COMPLETE[tag] = done
    return done


#: CommandComplete messages by tag ("UPDATE 1", "BEGIN", ...), built once each
_COMPLETE: dict[str, bytes] = {}


def error_response(code: str, text: str, *, severity: str = "ERROR",
                   hint: str | None = None) -> bytes:
    fields = [b"S" + cstr(severity), b"V" + cstr(severity), b"C" + cstr(code), b"M" + cstr(text)]
    if hint:
        fields.append(b"H" + cstr(hint))
    return message(b"E", b"".join(fields) + b"\0")


def notice_response(text: str, severity: str = "NOTICE", code: str = "00000") -> bytes:
    """A NoticeResponse: a NOTICE, or a WARNING with its SQLSTATE."""
    level = severity.encode()
    return message(b"N", b"S" + level + b"\0V" + level + b"\0C" + code.encode() + b"\0M"
                   + cstr(text) + b"\0")


#: ReadyForQuery for each transaction status
READY_FOR_QUERY = {status: ready_for_query(status) for status in "ITE"}
COPY_DONE = message(b"c")
PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
EMPTY_QUERY = message(b"I")
PORTAL_SUSPENDED = message(b"s")

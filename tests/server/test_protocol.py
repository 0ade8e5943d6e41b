"""The message parser: strict on every field, never anything but ProtocolError on bad bytes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.errors import ProtocolError
from cryptdisk.server import _protocol as P


def cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def bind_body(params: list[bytes | None], pformats=(), rformats=()) -> bytes:
    out = cstr("portal") + cstr("stmt") + struct.pack("!h", len(pformats))
    out += b"".join(struct.pack("!h", f) for f in pformats)
    out += struct.pack("!h", len(params))
    for p in params:
        out += struct.pack("!i", -1) if p is None else struct.pack("!i", len(p)) + p
    out += struct.pack("!h", len(rformats)) + b"".join(struct.pack("!h", f) for f in rformats)
    return out


def test_startup_parameters() -> None:
    body = struct.pack("!i", P.PROTOCOL_3) + cstr("user") + cstr("alice") + cstr("database") \
        + cstr("d") + b"\0"
    assert P.parse_startup(body) == P.StartupMessage({"user": "alice", "database": "d"})
    assert P.parse_startup(struct.pack("!i", P.SSL_REQUEST_CODE)) == P.SSLRequest()
    assert P.parse_startup(struct.pack("!iii", P.CANCEL_REQUEST_CODE, 7, 9)) == \
        P.CancelRequest(7, 9)


@pytest.mark.parametrize("body", [
    struct.pack("!i", 2 << 16) + b"\0",                                    # protocol 2
    struct.pack("!i", P.PROTOCOL_3) + cstr("user"),                        # value missing
    struct.pack("!i", P.PROTOCOL_3) + cstr("user") + cstr("a"),            # no terminator
    struct.pack("!i", P.PROTOCOL_3) + cstr("user") + b"\xff\0" + b"\0",    # not UTF-8
    struct.pack("!i", P.PROTOCOL_3) + cstr("u") + cstr("a") + cstr("u") + cstr("b") + b"\0",
    struct.pack("!i", P.SSL_REQUEST_CODE) + b"x",                          # trailing byte
    b"\0\0",
])
def test_bad_startup(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        P.parse_startup(body)


def test_bind_round_trip() -> None:
    msg = P.parse_frontend(b"B", bind_body([b"1", None, b""], (0, 1, 0), (1,)))
    assert msg == P.Bind("portal", "stmt", (0, 1, 0), (b"1", None, b""), (1,))


@pytest.mark.parametrize("kind,body", [
    (b"B", bind_body([b"1"])[:-1]),                                 # truncated
    (b"B", bind_body([b"1"]) + b"\0"),                              # trailing byte
    (b"B", bind_body([b"1"], (2,))),                                # format 2
    (b"B", bind_body([b"1", b"2"], (0, 0, 0))),                     # 3 formats, 2 params
    (b"B", cstr("") + cstr("") + struct.pack("!hhi", 0, 1, -2) + struct.pack("!h", 0)),
    (b"B", cstr("") + cstr("") + struct.pack("!hhi", 0, 1, 1 << 30)),  # length past the end
    (b"P", cstr("s") + cstr("SELECT 1") + struct.pack("!h", -1)),   # negative count
    (b"P", cstr("s") + cstr("SELECT 1") + struct.pack("!hi", 2, 23)),
    (b"Q", b"SELECT 1"),                                            # no NUL
    (b"D", b"X" + cstr("")),
    (b"E", cstr("")),
    (b"S", b"x"),
    (b"d", b"copy data"),
    (b"F", b""),
    (b"\x00", b""),
])
def test_bad_messages(kind: bytes, body: bytes) -> None:
    with pytest.raises(ProtocolError):
        P.parse_frontend(kind, body)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(list(b"QPBDECSHXpdfFcz\x00")), st.binary(max_size=300))
def test_any_bytes_parse_or_raise_protocol_error(kind: int, body: bytes) -> None:
    try:
        P.parse_frontend(bytes([kind]), body)
    except ProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_startup_parses_or_raises(body: bytes) -> None:
    try:
        P.parse_startup(body)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=8),
       st.lists(st.sampled_from([0, 1]), max_size=1))
def test_bind_parses_what_was_built(params: list[bytes | None], fmts: list[int]) -> None:
    body = bind_body(params, tuple(fmts))
    msg = P.parse_frontend(b"B", body)
    assert isinstance(msg, P.Bind) and list(msg.params) == params
    for cut in range(len(body)):  # every truncation is refused, never misread
        with pytest.raises(ProtocolError):
            P.parse_frontend(b"B", body[:cut])

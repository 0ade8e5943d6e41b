"""The binary COPY reader on generated inputs: rows or a clear error, and a round trip."""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.server import _copy, _types

from .fuzz_copy_binary import target

HEADER = _copy.SIGNATURE + struct.pack("!Ii", 0, 0)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    target(data)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 255), st.lists(st.tuples(st.integers(-3, 12), st.binary(max_size=20)),
                                     max_size=12),
       st.booleans())
def test_random_fields_after_a_valid_header(seed: int, fields: list[tuple[int, bytes]],
                                            trailer: bool) -> None:
    """Well-formed framing (field counts and lengths near the real ones) around random
    values, so the reader gets past its header checks into the field decoders."""
    body = b""
    for size, value in fields:
        if size == -3:
            body += struct.pack("!h", seed % 4)  # a field count
        elif size == -2:
            body += struct.pack("!i", -1)        # NULL
        else:
            body += struct.pack("!i", size) + value[:max(size, 0)]
    target(bytes([seed]) + HEADER + body + (b"\xff\xff" if trailer else b""))


VALUES = {
    _types.INT8: st.integers(-(2 ** 63), 2 ** 63 - 1),
    _types.INT4: st.integers(-(2 ** 31), 2 ** 31 - 1),
    _types.TEXT: st.text(),
    _types.FLOAT8: st.floats(allow_nan=False),
    _types.BOOL: st.booleans(),
    _types.BYTEA: st.binary(max_size=40),
    _types.DATE: st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)),
    _types.TIMESTAMP: st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)),
    _types.NUMERIC: st.decimals(allow_nan=False, allow_infinity=False, places=3,
                                min_value=decimal.Decimal("-1e20"),
                                max_value=decimal.Decimal("1e20")),
    _types.UUID: st.uuids(),
    _types.TIME: st.times(),
}


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[int], list[tuple[object, ...]]]:
    oids = draw(st.lists(st.sampled_from(sorted(VALUES)), min_size=1, max_size=5))
    rows = draw(st.lists(st.tuples(*[st.one_of(st.none(), VALUES[o]) for o in oids]),
                         max_size=8))
    return oids, rows


@settings(max_examples=200, deadline=None)
@given(tables())
def test_encode_then_decode_gives_the_rows_back(table) -> None:
    oids, rows = table
    data = b"".join(_copy.encode_binary(oids, rows))
    back = _copy.decode_binary(data, oids)
    assert [tuple(r) for r in back] == rows
    for cut in range(19, len(data) - 2, max(1, len(data) // 7)):  # every cut is refused or
        try:                                                      # ends at a row boundary
            got = _copy.decode_binary(data[:cut], oids)
        except _copy.StatementError as exc:
            assert exc.sqlstate in ("22P04", "22P03")
        else:
            assert [tuple(r) for r in got] == rows[:len(got)]


def test_uuid_and_time_round_trip_examples() -> None:
    u = uuid.UUID(int=7)
    data = b"".join(_copy.encode_binary([_types.UUID, _types.TIME], [(u, dt.time(1, 2, 3, 4))]))
    assert _copy.decode_binary(data, [_types.UUID, _types.TIME]) == [[u, dt.time(1, 2, 3, 4)]]

"""The header fuzz target on generated inputs: only CryptdiskError may escape."""

from __future__ import annotations

import dataclasses
import os
import struct
import tempfile
from functools import cache

from hypothesis import given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk import Key, Keyring
from cryptdisk.format import Kind, MutableStore, new_header, rewrap_header

from .fuzz_header import RING, target

VALID = None


def _valid_file() -> bytes:
    global VALID
    if VALID is None:
        import tempfile

        ring = Keyring([Key(1, bytes(range(32)))])
        path = os.path.join(tempfile.mkdtemp(), "v.cd")
        with cryptdisk.open(path, "wb", keyring=ring, segment_size=512) as f:
            f.write(os.urandom(1500))
        with open(path, "rb") as f:
            VALID = f.read()
    return VALID


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes(data):
    target(data)


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=200))
def test_bytes_after_the_magic(data):
    target(b"CRYPTDSK" + data)


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2200), st.integers(0, 255)), max_size=6),
       st.integers(0, 2200))
def test_mutated_valid_file(edits, cut):
    target(_mutated(_valid_file(), edits, cut))


def _mutated(data: bytes, edits: list[tuple[int, int]], cut: int) -> bytes:
    """``data`` with bytes overwritten at the edits' positions, then cut to ``cut`` (>= 1)."""
    raw = bytearray(data)
    for pos, value in edits:
        if pos < len(raw):
            raw[pos] = value
    return bytes(raw[: max(cut, 1)])


@cache
def _valid_framed_file() -> bytes:
    """A framed file like a tiny SQLite WAL: lead 32, frames of 24 + 512, a partial last one."""
    header, dek = new_header(Kind.FRAMED, RING.current_key(), segment_size=512, lead=32,
                             frame_extra=24)
    path = os.path.join(tempfile.mkdtemp(), "f.cd")
    with open(path, "wb") as f:
        f.write(header.to_bytes())
    fd = os.open(path, os.O_RDWR)
    try:
        MutableStore(fd, header, dek, writable=True).pwrite(os.urandom(32 + 2 * 536 + 100), 0)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        return f.read()


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1600), st.integers(0, 255)), max_size=6),
       st.integers(0, 1600))
def test_mutated_valid_framed_file(edits, cut):
    target(_mutated(_valid_framed_file(), edits, cut))


@settings(max_examples=1000, deadline=None)
@given(kind=st.integers(1, 3), lead=st.integers(0, 0xFFFF), extra=st.integers(0, 0xFFFF),
       log2=st.integers(9, 11), body=st.binary(max_size=1500), zeros=st.integers(0, 3000))
def test_authentic_headers_with_any_geometry(kind, lead, extra, log2, body, zeros):
    """Headers that authenticate, with any bytes 12-15 for any kind: the checks of the
    fields, not the key slot, must stop a bad geometry before it reaches the records."""
    key = RING.current_key()
    header, dek = new_header(Kind.MUTABLE, key, segment_size=1 << log2)
    header = rewrap_header(dataclasses.replace(header, kind=kind, lead=lead, frame_extra=extra),
                           dek, key)
    target(header.to_bytes() + body + bytes(zeros))


def test_the_geometry_fields_sit_at_bytes_12_to_15():
    """The strategy above edits the fields the spec places at bytes 12-15."""
    header, _ = new_header(Kind.FRAMED, RING.current_key(), segment_size=512, lead=300,
                           frame_extra=7)
    assert struct.unpack("<HH", header.to_bytes()[12:16]) == (300, 7)

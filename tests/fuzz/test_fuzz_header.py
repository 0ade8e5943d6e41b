"""The header fuzz target on generated inputs: only CryptdiskError may escape."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk import Key, Keyring

from .fuzz_header import target

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
    raw = bytearray(_valid_file())
    for pos, value in edits:
        if pos < len(raw):
            raw[pos] = value
    target(bytes(raw[: max(cut, 1)]))

"""Properties of the content-defined chunker."""

from __future__ import annotations

import io
import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.backup._chunker import chunks

SMALL = {"avg_size": 1024, "min_size": 256, "max_size": 4096}


class _Trickle(io.RawIOBase):
    """A stream that returns at most ``step`` bytes per read (short reads)."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.pos, self.step = data, 0, step

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.step if n < 0 else min(n, self.step)
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return out


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=40_000), st.integers(0, 2**32 - 1))
def test_chunks_join_to_the_input_within_size_bounds(data: bytes, seed: int) -> None:
    parts = list(chunks(io.BytesIO(data), seed, **SMALL))
    assert b"".join(parts) == data
    assert all(len(p) <= SMALL["max_size"] for p in parts)
    assert all(len(p) >= SMALL["min_size"] for p in parts[:-1])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**32 - 1))
def test_cut_points_do_not_depend_on_how_the_stream_is_read(step: int, seed: int) -> None:
    data = os.urandom(30_000)
    whole = list(chunks(io.BytesIO(data), seed, **SMALL))
    assert list(chunks(_Trickle(data, step), seed, **SMALL)) == whole  # type: ignore[arg-type]


@settings(max_examples=30, deadline=None)
@given(st.binary(min_size=1, max_size=200), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_an_insertion_changes_only_nearby_chunks(insert: bytes, seed: int, fill: int) -> None:
    # the data comes from a drawn seed, so a failing example replays; a cut point depends
    # on the bytes since the last cut, so resynchronising takes a few chunks: over 3,000
    # random trials at most 10 chunks (12 KB) changed, 1 at the median, 5 at the 99th
    # percentile, so the bound below is 32 KiB past the insertion
    data = random.Random(fill).randbytes(200_000)
    at = 100_000
    before = list(chunks(io.BytesIO(data), seed, **SMALL))
    after = set(chunks(io.BytesIO(data[:at] + insert + data[at:]), seed, **SMALL))
    start = 0
    for chunk in before:
        if start + len(chunk) <= at or start >= at + 32 * 1024:  # before it, or resynchronised
            assert chunk in after, (start, len(chunk))
        start += len(chunk)


def test_the_seed_moves_the_cut_points() -> None:
    data = os.urandom(100_000)
    a = [len(c) for c in chunks(io.BytesIO(data), 1, **SMALL)]
    b = [len(c) for c in chunks(io.BytesIO(data), 2, **SMALL)]
    assert a != b

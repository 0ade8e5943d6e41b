"""Properties of the content-defined chunker."""

from __future__ import annotations

import io
import os

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
@given(st.binary(min_size=1, max_size=200), st.integers(0, 2**32 - 1))
def test_an_insertion_changes_only_nearby_chunks(insert: bytes, seed: int) -> None:
    data = os.urandom(60_000)
    before = list(chunks(io.BytesIO(data), seed, **SMALL))
    after = list(chunks(io.BytesIO(data[:30_000] + insert + data[30_000:]), seed, **SMALL))
    assert len(set(before) & set(after)) >= len(before) - 6  # resynchronises


def test_the_seed_moves_the_cut_points() -> None:
    data = os.urandom(100_000)
    a = [len(c) for c in chunks(io.BytesIO(data), 1, **SMALL)]
    b = [len(c) for c in chunks(io.BytesIO(data), 2, **SMALL)]
    assert a != b

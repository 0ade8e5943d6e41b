"""The CSV COPY reader on generated inputs: rows or a clear error, and a round trip."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from .fuzz_copy_csv import target


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    target(data)


@settings(max_examples=1000, deadline=None)
@given(st.integers(0, 255), st.text(alphabet=",;\t|\"'\\\n\r.NUL x", max_size=60))
def test_random_text_of_csv_characters(seed: int, text: str) -> None:
    target(bytes([seed]) + text.encode())

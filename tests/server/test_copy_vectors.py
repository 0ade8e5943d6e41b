"""COPY ... FROM STDIN's text and CSV read as PostgreSQL 15 reads them: each case of
copy_vectors.json (bytes -> rows or SQLSTATE, answered by a real PostgreSQL 15: see
copy_vectors.py) decoded by the server's incremental decoder, whole and split at arbitrary
CopyData boundaries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from cryptdisk.server import _copy, _copyin
from cryptdisk.server._engines import StatementError

VECTORS = json.loads((Path(__file__).parent / "copy_vectors.json").read_text())


def decode(case: dict[str, Any], pieces: list[bytes]) -> list[list[str | None]]:
    """``case``'s statement over a table of text columns c1, c2, ... reading ``pieces``
    (its data, split) as the server does: the decoder, then the engines' check of each
    row's width (22P04)."""
    st = _copy.parse_copy(f"COPY t FROM STDIN {case['options']}")
    names = [f"c{i + 1}" for i in range(case["columns"])]
    forced = {}
    for option in ("force_not_null", "force_null"):
        for c in getattr(st, option) or []:
            if c not in names:
                raise StatementError(f'column "{c}" of relation "t" does not exist', "42703")
        forced[option] = [names.index(c) for c in getattr(st, option) or []]
    dec = _copyin.decoder(st, 1 << 20, name="t", names=names, **forced)
    rows = [row for piece in pieces for row in dec.feed(piece)] + dec.finish()
    for i, row in enumerate(rows):
        if len(row) != len(names):
            raise StatementError(f"COPY row {i + 1} has {len(row)} fields", "22P04")
    return rows


def expect(case: dict[str, Any], pieces: list[bytes]) -> None:
    if "rows" in case:
        assert decode(case, pieces) == case["rows"], case
        return
    with pytest.raises(StatementError) as err:
        decode(case, pieces)
    assert err.value.sqlstate == case["sqlstate"], (case, str(err.value))
    if case["sqlstate"] == "22P04" and "data for column" not in case["message"] \
            and "extra data" not in case["message"]:
        assert str(err.value).startswith(case["message"]), (case, str(err.value))


@pytest.mark.parametrize("case", VECTORS, ids=[f"{i}" for i in range(len(VECTORS))])
def test_postgresql_15_reads_the_same_rows_or_fails_the_same_way(case) -> None:
    expect(case, [case["data"].encode("latin-1")])


@pytest.mark.parametrize("case", VECTORS, ids=[f"{i}" for i in range(len(VECTORS))])
def test_one_byte_a_message_reads_the_same(case) -> None:
    data = case["data"].encode("latin-1")
    expect(case, [data[i:i + 1] for i in range(len(data))])


@settings(max_examples=300, deadline=None)
@given(hs.sampled_from(VECTORS), hs.lists(hs.integers(0, 64), max_size=6))
def test_any_split_into_copydata_reads_the_same(case, cuts) -> None:
    data = case["data"].encode("latin-1")
    at = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *at], [*at, len(data)], strict=True)]
    expect(case, pieces)


@pytest.mark.parametrize("options", ["", "(FORMAT csv)", "(FORMAT binary)"])
def test_a_line_longer_than_max_copy_size_fails(options) -> None:
    """The decoder holds at most ``max_line`` bytes of an unfinished line (row): a longer
    one, in any split, fails with 54000 (``max_copy_size``); shorter lines of any total
    size are read."""
    st = _copy.parse_copy(f"COPY t FROM STDIN {options}")
    if st.binary:
        head = _copy.SIGNATURE + b"\0" * 8
        dec = _copyin.decoder(st, 100, oids=[25])
        assert dec.feed(head + b"\0\x01\0\0\0\x02ab" * 50) == [["ab"]] * 50
        long = b"\0\x01\0\0\0\xc8" + b"x" * 200
    else:
        dec = _copyin.decoder(st, 100)
        assert dec.feed(b"ab\n" * 1000) == [["ab"]] * 1000
        long = b"x" * 200 + b"\n"
    with pytest.raises(StatementError) as err:
        for i in range(0, len(long), 30):
            dec.feed(long[i:i + 30])
    assert err.value.sqlstate == "54000", err.value

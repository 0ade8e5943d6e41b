"""The lookup block parser's fuzz target on hypothesis inputs, and as an atheris target."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .fuzz_lookup import target


def _block(part: bytes, groups: list[int], chunks: list[int]) -> bytes:
    entries = [(b"part", part), (b"groups", struct.pack(f"<{len(groups)}q", *groups)),
               (b"chunks", struct.pack(f"<{len(chunks)}q", *chunks)),
               (b"cryptdisk.part_id", b"p")]
    out = struct.pack("<I", len(entries))
    for name, data in entries:
        out += struct.pack("<H", len(name)) + name + struct.pack("<I", len(data)) + data
    return out


_int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def _blocks(draw):
    """Blocks whose structure parses, with any numbers in them."""
    groups = draw(st.lists(st.integers(1, 10), min_size=1, max_size=3))
    nleaves = draw(st.integers(1, 3))
    leaves = [["a", "a", "INT64", "None", draw(st.integers(-5, 5)), 0]
              for _ in range(nleaves)]
    part = json.dumps({"part_id": "p", "rows": sum(groups), "created_by": "x",
                       "leaves": leaves}).encode()
    chunks = draw(st.lists(_int64, min_size=4 * len(groups) * nleaves,
                           max_size=4 * len(groups) * nleaves))
    return draw(st.binary(min_size=3, max_size=3)) + _block(part, groups, chunks)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300), _blocks()))
def test_only_documented_outcomes(data):
    target(data)


def test_deeply_nested_json_is_not_a_block():
    """json.loads of deeply nested brackets raises RecursionError: the parser says None."""
    target(b"\0\0\x10" + _block(b"[" * 100_000 + b"]" * 100_000, [1], [4, 1, 1, 0]))


def test_atheris_runs_the_target(tmp_path):
    """The same file is a working atheris target (a short run, as a smoke test)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.fuzz_lookup", "-runs=20000",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Done 20000 runs" in proc.stderr


def test_a_negative_codec_number_is_other():
    """A corrupt block's codec number below zero names no codec (it indexed from the end)."""
    from cryptdisk.db import _lookup

    part = json.dumps({"part_id": "p", "rows": 1, "created_by": "x",
                       "leaves": [["a", "a", "INT64", "None", 0, 0]]}).encode()
    block = _block(part, [1], [4, 1, 1, (-1 << 32) | 1])
    assert _lookup.parse(block, 1 << 20).codec(0, 0) == ("OTHER", ["PLAIN"])  # type: ignore[union-attr]

"""CI's run of the ClickHouse header fuzz target on hypothesis-generated inputs."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.fuzz_clickhouse_header import check

_header_like = st.builds(
    lambda version, alg, middle, pad, body: (
        b"ENC" + struct.pack("<HH", version, alg) + middle + pad + body),
    st.sampled_from([1, 2, 0x0100, 3, 0, 0xFFFF]),
    st.sampled_from([0, 1, 2, 3, 0x0200, 0xFFFF]),
    st.binary(min_size=0, max_size=32),
    st.one_of(st.just(bytes(32)), st.binary(max_size=40)),
    st.binary(max_size=300),
)


def _mutate(data: bytes, positions: list[int], values: list[int]) -> bytes:
    out = bytearray(data)
    for p, v in zip(positions, values):
        if out:
            out[p % len(out)] = v
    return bytes(out)


_mutated = st.builds(
    _mutate, _header_like, st.lists(st.integers(0, 400), max_size=4),
    st.lists(st.integers(0, 255), max_size=4))


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=200), _header_like, _mutated))
def test_only_documented_exceptions(data):
    check(data)


def test_atheris_runs_the_target(tmp_path):
    """The same file is a working atheris target (a short run, as a smoke test)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.fuzz_clickhouse_header", "-runs=20000",
         f"-artifact_prefix={tmp_path}/"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Done 20000 runs" in proc.stderr

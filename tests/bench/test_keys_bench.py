"""cryptdisk bench keys runs end to end at a tiny size (no timing is asserted): every key
opens every file and scans its table, and the provider calls are what each key makes."""

from __future__ import annotations

import os
from pathlib import Path

from cryptdisk.bench import BenchOptions, Measurement
from cryptdisk.bench.keys_speed import run


def test_each_key_in_fresh_workers_with_its_provider_calls(tmp_path: Path) -> None:
    before = {k: os.environ.get(k) for k in ("SOFTHSM2_CONF", "CD_BENCH_PIN")}
    got: list = []
    run(BenchOptions(tmp_path, quick=True, rows=25, repeats=1), got.append, lambda *a: None)
    ms = {(m.case, m.strategy): m for m in got if isinstance(m, Measurement)}
    keys = ("local key file", "pkcs11 (SoftHSM2)", "pkcs11 wrapped_key")
    cases = ("load the keyring (connect)", "first open of each file", "re-open (unwrap cache)",
             "cold scan: open, sum(x)")
    assert set(ms) == {(c, k) for c in cases for k in keys}
    first = {k: ms[("first open of each file", k)] for k in keys}
    assert all(m.work == 25 and m.unit == "opens/s" and m.values[0] > 0 for m in first.values())
    assert [first[k].extra["provider_calls"] for k in keys] == [0, 25, 1]
    scan = {k: ms[("cold scan: open, sum(x)", k)] for k in keys}
    assert all(m.work == 200_000 for m in scan.values())
    assert scan["pkcs11 wrapped_key"].extra["provider_calls"] == 1
    assert scan["pkcs11 (SoftHSM2)"].extra["baseline"] == "local key file"
    assert list(tmp_path.iterdir()) == []  # the experiment removed what it created
    assert {k: os.environ.get(k) for k in before} == before  # and restored the environment

"""The fs_scan benchmark runs end to end at a tiny size and records every strategy.

No timing is asserted (the machine is shared); only that each strategy ran,
returned the same answer (the benchmark checks that itself) and was recorded.
"""

from __future__ import annotations

from pathlib import Path

from cryptdisk.bench import fs_scan
from cryptdisk.bench._model import BenchOptions, Measurement


def test_fs_scan_records_all_strategies(tmp_path: Path) -> None:
    got: list[Measurement] = []
    fs_scan.run(BenchOptions(workdir=tmp_path, quick=True, rows=20_000, repeats=2),
                got.append, lambda *a: None)
    assert {(m.case.split()[0], m.strategy) for m in got} == {
        (q, s) for q in fs_scan.QUERIES for s in fs_scan.STRATEGIES}
    for m in got:
        assert len(m.values) == 2 and all(v > 0 for v in m.values)
        assert m.extra["ratio_to_direct"] > 0 and m.work and m.work > 0
    assert list(tmp_path.iterdir()) == []  # the scratch directory was removed

"""``cryptdisk bench backup`` runs end to end at a tiny size and records every phase.

No timing is asserted (the machine is shared): each tool's phases ran, checked what
they restored (the bodies raise on a wrong size) and were recorded.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from cryptdisk.bench import backup
from cryptdisk.bench._model import BenchOptions, Failure, Measurement


def test_backup_bench_records_every_phase_of_both_tools(tmp_path: Path) -> None:
    got: list[object] = []
    backup.run(BenchOptions(workdir=tmp_path, quick=True, rows=20_000, repeats=1),
               got.append, lambda *a: None)
    assert not [g for g in got if isinstance(g, Failure)], got
    ms = [m for m in got if isinstance(m, Measurement)]
    tools = {"cryptdisk", "restic"} if shutil.which("restic") else {"cryptdisk"}
    cases = {"first backup", "second backup (+1% rows)", "restore (of the second)",
             "second backup stores, % of the first"}
    assert {(m.case, m.strategy) for m in ms} == {(c, t) for c in cases for t in tools}
    for m in ms:
        assert len(m.values) == 1 and m.values[0] > 0
        if m.unit == "MB/s":
            assert m.cpu_per_gb and m.peak_rss_mb and m.work and m.work > 0
    share = next(m for m in ms if m.strategy == "cryptdisk" and m.unit == "%")
    assert share.values[0] < 50  # +1% rows: far less than the first backup
    assert "Targets" in backup.NOTES[0]
    assert list(tmp_path.iterdir()) == []  # the scratch directory was removed

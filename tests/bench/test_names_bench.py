"""cryptdisk bench names runs end to end at a tiny size (no timing is asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cryptdisk.bench import BenchOptions, Measurement
from cryptdisk.bench._bodies_names import list_and_read, write_files
from cryptdisk.bench.names import run

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_run_lists_and_reads_every_file(tmp_path: Path) -> None:
    key = os.urandom(32)
    write_files(str(tmp_path / "names"), key, True, 30)
    listing, reading = list_and_read(str(tmp_path / "names"), key.hex(), True, 30)
    assert (listing.case, reading.case) == ("list", "open+read")
    assert listing.value > 0 and reading.value > 0 and listing.work == reading.work == 30
    stored = [p.name for p in (tmp_path / "names").rglob("*")]
    assert len(stored) == 30 + 2 and not any("part=" in n or "file-" in n for n in stored)
    write_files(str(tmp_path / "plain"), key, False, 30)  # the baseline keeps its names
    assert any(p.name.startswith("part=") for p in (tmp_path / "plain").rglob("*"))
    listing, _reading = list_and_read(str(tmp_path / "plain"), key.hex(), False, 30)
    assert listing.work == 30


def test_both_disks_interleaved_in_fresh_workers(tmp_path: Path) -> None:
    got: list = []
    run(BenchOptions(tmp_path, quick=True, rows=40, repeats=2), got.append, lambda *a: None)
    ms = {(m.case, m.strategy): m for m in got if isinstance(m, Measurement)}
    assert set(ms) == {(c, s) for c in ("list", "open+read")
                       for s in ("plain names", "encrypted names")}
    for m in ms.values():
        assert m.experiment == "names" and m.unit == "s" and m.work == 40
        assert len(m.values) == 2 and all(v > 0 for v in m.values) and m.peak_rss_mb > 0
    assert ms[("list", "encrypted names")].extra["baseline"] == "plain names"
    assert list(tmp_path.iterdir()) == []  # the experiment removed what it created


def test_cryptdisk_bench_names_from_the_command_line(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "names", "--rows", "30",
                        "--repeats", "1", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith(("list", "open+read"))]
    assert len(lines) == 4 and sum("encrypted names" in line for line in lines) == 2

"""python -m cryptdisk.bench.dask_scan runs end to end on a tiny table (both readers agree)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the test extra installs distributed")

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_dask_benchmark_runs_and_both_readers_agree(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-W", "ignore", "-m", "cryptdisk.bench.dask_scan",
                        "--rows", "20000", "--repeats", "1", "--workers", "1",
                        "--workdir", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "answers differ" not in r.stdout
    assert [ln.split()[0] for ln in lines[2:]] == ["full", "filtered"]

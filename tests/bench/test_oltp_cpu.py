"""cryptdisk bench oltp-cpu runs real transactions on the real strategies (no timing asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk.sqlite as csql
from cryptdisk.bench import BenchOptions, Measurement
from cryptdisk.bench._bodies_oltp_cpu import cpu_per_transaction
from cryptdisk.bench.oltp_cpu import run

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(params=csql.IMPLEMENTATIONS)
def vfs_implementation(request, monkeypatch) -> str:
    """Both VFSes (C and Python), as the SQLite tests run."""
    monkeypatch.setenv("CRYPTDISK_SQLITE_VFS", request.param)
    return request.param


def test_a_run_times_tpcb_on_an_encrypted_database(tmp_path, vfs_implementation):
    [sample] = cpu_per_transaction("cryptdisk", "tpcb", str(tmp_path), "wal", "normal", 0.2,
                                   "tpcb wal+normal")
    assert sample.case == "tpcb wal+normal" and sample.unit == "CPU us/txn"
    assert sample.better == "lower" and sample.work_unit == "transactions"
    assert sample.work >= 50 and sample.value > 0
    assert sample.value == pytest.approx(sample.cpu_s / sample.work * 1e6)
    assert sample.extra["wall_us_per_txn"] > 0
    raw = (tmp_path / "cryptdisk" / "bench.db").read_bytes()
    assert not raw.startswith(b"SQLite format 3")  # the run measured the encrypted store
    assert b"pgbench_accounts" not in raw


def test_one_case_interleaves_plain_and_cryptdisk(tmp_path):
    got: list = []
    run(BenchOptions(tmp_path, quick=True, duration=0.2, repeats=2, case="select"),
        got.append, lambda *a: None)
    ms = {m.strategy: m for m in got if isinstance(m, Measurement)}
    assert set(ms) == {"plain", "cryptdisk"}
    for m in ms.values():
        assert m.experiment == "oltp-cpu" and m.case == "select wal+normal"
        assert len(m.values) == 2 and all(v > 0 for v in m.values) and m.peak_rss_mb > 0
    assert ms["cryptdisk"].extra["baseline"] == "plain"
    assert list(tmp_path.iterdir()) == []  # the experiment removed what it created


def test_an_unknown_case_names_the_cases(tmp_path):
    with pytest.raises(ValueError, match=r"no oltp-cpu case matches --case 'nope' \(cases: "
                       r"tpcb wal\+normal; tpcb wal\+full;"):
        run(BenchOptions(tmp_path, quick=True, case="nope"), lambda m: None, lambda *a: None)


def test_cryptdisk_bench_oltp_cpu_from_the_command_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "oltp-cpu", "--case",
                        "tpcb wal+full", "--duration", "0.2", "--repeats", "1", "--workdir",
                        str(tmp_path / "w"), "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "tpcb wal+full" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["failures"] == [] and doc["skipped"] == []
    assert {(m["case"], m["strategy"]) for m in doc["measurements"]} == {
        ("tpcb wal+full", "plain"), ("tpcb wal+full", "cryptdisk")}


def test_the_private_entry_point_is_gone():
    r = subprocess.run([sys.executable, "-m", "cryptdisk.bench._oltp_cpu", "tpcb"],
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=SRC))
    assert r.returncode != 0 and "No module named cryptdisk.bench._oltp_cpu" in r.stderr

"""The olap_db experiment runs end to end on a few rows (no timing is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from cryptdisk.bench import olap_db
from cryptdisk.bench._model import BenchOptions, Measurement

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_olap_db_records_every_case_for_both_strategies(tmp_path):
    got = []
    progress = []
    olap_db.run(BenchOptions(tmp_path, rows=3000, repeats=2), got.append,
                lambda what, n, total: progress.append((n, total)))
    assert all(isinstance(m, Measurement) for m in got)
    cases = {(m.case, m.strategy) for m in got}
    for case in ("insert", "avg(c_float) cold threads=all", "sum(c_int) warm threads=1"):
        assert (case, "plain") in cases and (case, "cryptdisk") in cases
    insert = next(m for m in got if m.case == "insert" and m.strategy == "cryptdisk")
    assert len(insert.values) == 2 and all(v > 0 for v in insert.values)
    assert insert.extra["rows"] == 3000
    assert 0 < insert.extra["cache_peak_bytes"] <= insert.extra["cache_bound_bytes"]
    assert insert.peak_rss_mb > 0 and insert.work > 0
    assert progress[-1][0] == progress[-1][1]
    assert list(tmp_path.iterdir()) == []  # the experiment removed what it created


def test_cryptdisk_bench_olap_db_prints_a_table(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "olap-db", "--rows", "2000",
                        "--repeats", "1", "--workdir", str(tmp_path / "w"), "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    table = [line for line in r.stdout.splitlines() if "avg(c_float) warm threads=all" in line]
    assert len(table) == 2 and " x" in next(t for t in table if "cryptdisk" in t)  # the ratio
    assert out.stat().st_size > 0
    assert {m["experiment"] for m in json.loads(out.read_text())["measurements"]} == {"olap-db"}


def test_case_runs_only_the_matching_queries(tmp_path):
    """``--case TEXT`` inserts into both tables but queries only what TEXT names."""
    got = []
    olap_db.run(BenchOptions(tmp_path, rows=2000, repeats=1, case="avg"), got.append,
                lambda *a: None)
    cases = {m.case for m in got}
    assert "insert" in cases and "avg(c_float) cold threads=all" in cases
    assert not any(c.startswith("sum(c_int)") for c in cases)


def test_an_unknown_case_names_the_queries(tmp_path):
    import pytest

    with pytest.raises(ValueError, match=r"no olap-db query matches --case 'nope' "
                       r"\(queries: avg\(c_float\); sum\(c_int\)\)"):
        olap_db.run(BenchOptions(tmp_path, rows=1000, case="nope"), lambda m: None,
                    lambda *a: None)

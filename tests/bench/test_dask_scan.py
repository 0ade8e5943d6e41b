"""cryptdisk bench dask runs end to end on a tiny table: both readers, 1 and 2 workers,
both shapes, answers checked against DuckDB's, the full scan one fused aggregation (no
timing is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cryptdisk.bench import dask_scan
from cryptdisk.bench._model import Measurement

pytest.importorskip("distributed", reason="the test extra installs distributed")

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_ratios_and_scaling_are_paired_by_round():
    def m(case, strategy, values):
        return Measurement("dask", case, strategy, "Mrows/s", values)

    ms = [m("full scan, 1 worker", "plain", [10.0, 8.0]),
          m("full scan, 1 worker", "cryptdisk", [5.0, 8.0]),
          m("full scan, 2 workers", "plain", [20.0, 12.0]),
          m("full scan, 2 workers", "cryptdisk", [10.0, 16.0])]
    got = []
    dask_scan._finish(ms, got.append, 100, 1e6, 1.1e6)
    by = {(x.case, x.strategy): x.extra for x in got}
    assert by[("full scan, 1 worker", "cryptdisk")]["ratio_to_plain"] == pytest.approx(1.5)
    assert by[("full scan, 2 workers", "plain")]["scaling_vs_1_worker"] == pytest.approx(1.75)
    assert by[("full scan, 2 workers", "cryptdisk")]["scaling_vs_1_worker"] == 2.0
    assert "ratio_to_plain" not in by[("full scan, 1 worker", "plain")]
    assert any("2 workers run 2.00x" in n for n in dask_scan.NOTES)
    assert dask_scan.NOTES[1] == dask_scan.SHAPES_NOTE  # what each shape computes
    assert not [n for n in dask_scan.NOTES if "CPU s per compute" in n]  # none recorded


def test_the_notes_say_where_each_computes_cpu_went():
    extra = {"client_main_cpu_s": 0.01, "client_loop_cpu_s": 0.15, "worker_task_cpu_s": 0.3,
             "worker_task_cpu_max_s": 0.3, "worker_other_cpu_s": 0.2, "tasks": 87,
             "task_spec_bytes": 55000}
    got = []
    dask_scan._finish([Measurement("dask", "full scan, 1 worker", "cryptdisk", "Mrows/s",
                                   [5.0], extra=dict(extra))], got.append, 3_000_000, 1e6, 1e6)
    note = next(n for n in dask_scan.NOTES if "CPU s per compute" in n)
    assert "workers 0.300 in tasks" in note and "100 ns per table row" in note
    assert "87 tasks, 55 kB pickled" in note


def test_the_timeline_splits_a_computes_wall_time_from_the_task_stream():
    from cryptdisk.bench._bodies_dask import _timeline

    def task(worker, key, start, stop):
        return {"worker": worker, "key": key,
                "startstops": [{"action": "transfer", "start": start - 0.5, "stop": start},
                               {"action": "compute", "start": start, "stop": stop}]}

    stream = [task("a", ("cryptdisk-chunk-x", 0), 10.1, 10.3),  # a read fused with its chunk
              task("a", ("chunk-y", 0), 10.35, 10.36),   # 0.05 idle before it
              task("a", ("cryptdisk-read-table-x", 2), 10.4, 10.6),  # 0.04 idle
              task("b", ("cryptdisk-read-table-x", 1), 10.2, 10.5),
              task("b", "sum-tree-z", 10.6, 10.7)]  # 0.1 idle
    got = _timeline(stream, 2, 10.0, 10.75)
    assert got["head_s"] == pytest.approx(0.1) and got["tail_s"] == pytest.approx(0.05)
    assert got["in_tasks_s"] == pytest.approx(0.81) and got["in_tasks_max_s"] == pytest.approx(0.41)
    assert got["gaps_s"] == pytest.approx(0.19)
    assert (got["reads_min"], got["reads_max"]) == (1, 2)
    # the workers' times carry their clock-offset estimate's error: a task that seems to
    # end after the result arrived (or start before the timed region) leaves 0, not < 0
    skewed = _timeline(stream, 2, 10.15, 10.68)
    assert (skewed["head_s"], skewed["tail_s"]) == (0.0, 0.0)
    assert skewed["in_tasks_s"] == pytest.approx(0.81)
    # a worker that ran nothing ran no read task; dd.read_parquet's reads count too
    got = _timeline([task("a", ("read_parquet-fused-chunk-x", 0), 1.0, 2.0)], 2, 0.5, 2.5)
    assert (got["reads_min"], got["reads_max"], got["gaps_s"]) == (0, 1, 0)
    assert _timeline([], 1, 0.0, 1.0) == {}


def test_the_notes_say_where_each_computes_wall_time_went():
    extra = {"head_s": 0.02, "tail_s": 0.01, "in_tasks_s": 0.4, "in_tasks_max_s": 0.2,
             "gaps_s": 0.05, "reads_min": 5, "reads_max": 7, "plan_s": 0.004,
             "rows": 3_000_000}
    dask_scan._finish([Measurement("dask", "full scan, 2 workers", "cryptdisk", "Mrows/s",
                                   [10.0], extra=dict(extra))], [].append, 3_000_000, 1e6, 1e6)
    note = next(n for n in dask_scan.NOTES if "wall s per compute" in n)
    assert "wall s per compute 0.300: 0.020 before the first task" in note
    assert "idle between their tasks 0.050" in note and "5 to 7 read tasks" in note


def test_cryptdisk_bench_dask_runs_both_readers_at_each_worker_count(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "dask", "--rows", "20000",
                        "--repeats", "1", "--threads", "2", "--workdir", str(tmp_path / "w"),
                        "--json", str(out)], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["failures"] == [] and doc["skipped"] == []
    by = {(m["case"], m["strategy"]): m for m in doc["measurements"]}
    assert set(by) == {(f"{shape}, {n}", reader) for shape in ("full scan", "filtered sum")
                       for n in ("1 worker", "2 workers") for reader in ("cryptdisk", "plain")}
    full = by[("full scan, 2 workers", "cryptdisk")]
    assert full["values"][0] > 0 and full["extra"]["workers"] == 2
    # 12 parts of about 1.7k rows: read_table reads them in one partition, dd.read_parquet
    # makes one per file
    assert full["extra"]["partitions"] == 1
    assert by[("full scan, 2 workers", "plain")]["extra"]["partitions"] == dask_scan.PARTS
    assert full["extra"]["ratio_to_plain"] > 0 and full["extra"]["scaling_vs_1_worker"] > 0
    # where the CPU went, by component: every figure is there, the parts add up
    x = full["extra"]
    for k in ("client_main_cpu_s", "client_loop_cpu_s", "worker_task_cpu_s",
              "worker_other_cpu_s", "plan_s", "transfer_bytes", "idle_client_loop_cpu_per_s",
              "idle_worker_other_cpu_per_s"):
        assert x[k] >= 0, k
    assert x["task_spec_bytes"] > 0
    # the full scan is one aggregation, fused with the read: a task per partition, one more
    # adding the partials (three separate sums, unfused: 7 per partition and the trees)
    for n in ("1 worker", "2 workers"):
        for reader in ("cryptdisk", "plain"):
            e = by[(f"full scan, {n}", reader)]["extra"]
            assert e["tasks"] == e["partitions"] + 1, (n, reader, e["tasks"])
    assert x["worker_task_cpu_max_s"] <= x["worker_task_cpu_s"]
    # where the wall time went, from the task stream: the one partition is read by one worker
    for k in ("head_s", "tail_s", "in_tasks_s", "gaps_s"):
        assert x[k] >= 0, k
    assert (x["reads_min"], x["reads_max"]) == (0, 1)
    assert x["in_tasks_max_s"] <= x["in_tasks_s"]
    # the filter on the key leaves out files (read_table's skipping: tests/dask)
    assert by[("filtered sum, 1 worker", "plain")]["extra"]["partitions"] < dask_scan.PARTS
    assert list((tmp_path / "w").iterdir()) == []  # the experiment removed what it created

"""The olap-engine experiment runs end to end on a few rows (no timing is asserted)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cryptdisk.bench import olap_engine
from cryptdisk.bench._bodies_engine import CACHE_OFF, ENGINES, shapes
from cryptdisk.bench._model import Failure, Measurement

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_a_wrong_answer_is_a_failure():
    def m(strategy, answer):
        return Measurement("olap-engine", "sum(c_int) cold", strategy, "s", [0.1], "lower",
                           extra={"answer": answer})

    got = []
    olap_engine._finish([m("duckdb file", "a"), m("cryptdisk encrypted", "b"),
                         m("cryptdisk plain", "a")], got.append, 10)
    failures = [f for f in got if isinstance(f, Failure)]
    assert [f.strategy for f in failures] == ["cryptdisk encrypted"]
    assert "differs" in failures[0].error


def test_cryptdisk_bench_olap_engine_runs_every_shape_on_every_engine(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    out = tmp_path / "r.json"
    rows = 20_000
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "olap-engine", "--rows",
                        str(rows), "--repeats", "1", "--workdir", str(tmp_path / "w"), "--json",
                        str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr
    assert "point c_int = X cold" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["failures"] == [] and doc["skipped"] == []
    ms = doc["measurements"]
    assert {m["experiment"] for m in ms} == {"olap-engine"}
    by = {(m["case"], m["strategy"]): m for m in ms}
    for engine in ENGINES:
        assert by[("load the Parquet file", engine)]["values"][0] > 0
    assert ("load the Parquet file", CACHE_OFF) not in by  # it reads cryptdisk encrypted's
    for engine in [*ENGINES, CACHE_OFF]:
        for name in shapes(rows):
            assert (f"{name} cold", engine) in by and (f"{name} warm", engine) in by
    # cryptdisk answered as DuckDB's own file did, shape by shape (a digest of the rows)
    for name in shapes(rows):
        duck = by[(f"{name} cold", "duckdb file")]["extra"]["answer"]
        assert by[(f"{name} cold", "cryptdisk encrypted")]["extra"]["answer"] == duck
        assert by[(f"{name} warm", "cryptdisk plain")]["extra"]["answer"] == duck
        assert by[(f"{name} cold", CACHE_OFF)]["extra"]["answer"] == duck
    point = by[("point c_int = X cold", "cryptdisk encrypted")]
    assert point["extra"]["vs_chdb_encrypted"] > 0 and point["extra"]["vs_duckdb_file"] > 0
    assert point["peak_rss_mb"] > 0 and point["extra"]["rows"] == rows
    assert list((tmp_path / "w").iterdir()) == []  # the experiment removed what it created


def test_case_runs_only_the_matching_shapes(tmp_path, monkeypatch):
    """``--case TEXT`` loads every engine but runs only the shapes whose name holds TEXT."""
    from cryptdisk.bench._model import BenchOptions

    ran = []
    monkeypatch.setattr(olap_engine, "run_worker", lambda *a, **k: type(
        "R", (), {"samples": [], "peak_rss_mb": 1.0})())
    monkeypatch.setattr(olap_engine, "interleave",
                        lambda options, exp, strategies, *a, **k: ran.append(
                            {s.args["name"] for s in strategies}))
    olap_engine.run(BenchOptions(tmp_path, rows=1000, case="c_int = X"), lambda m: None,
                    lambda *a: None)
    assert ran == [{"point c_int = X"}]


def test_case_load_repeats_the_loads_alone_into_fresh_stores(tmp_path, monkeypatch):
    """``--case load``: every engine loads ``--repeats`` times, engines interleaved and
    turned each round, each round into its own directory; no shape runs; one measurement
    per engine holds every round's time, with its paired ratio to chdb's encrypted disk."""
    from cryptdisk.bench._measure import Sample
    from cryptdisk.bench._model import BenchOptions

    calls, got = [], []

    def worker(_cleanup, target, args):
        if not target.endswith(":load"):
            return type("R", (), {"samples": [], "peak_rss_mb": 1.0})()
        calls.append((args["engine"], args["work"]))
        value = 2.0 if args["engine"] == "cryptdisk encrypted" else 4.0
        return type("R", (), {"samples": [Sample(olap_engine.LOAD, "s", value + len(calls))],
                              "peak_rss_mb": 5.0})()

    monkeypatch.setattr(olap_engine, "run_worker", worker)
    monkeypatch.setattr(olap_engine, "interleave", lambda *a, **k: pytest.fail("a shape ran"))
    olap_engine.run(BenchOptions(tmp_path, rows=1000, repeats=3, case="load"), got.append,
                    lambda *a: None)
    assert len(calls) == 3 * len(ENGINES)
    assert [e for e, _ in calls[:2]] == ENGINES[:2]
    assert [e for e, _ in calls[5:7]] == ENGINES[1:3]  # the order turned
    assert len({w for _, w in calls}) == 3  # a fresh directory per round
    by = {m.strategy: m for m in got}
    assert set(by) == set(ENGINES) and all(len(m.values) == 3 for m in by.values())
    assert by["cryptdisk encrypted"].extra["vs_chdb_encrypted"] < 1


def test_an_unknown_case_names_the_shapes(tmp_path):
    import pytest

    from cryptdisk.bench._model import BenchOptions

    with pytest.raises(ValueError, match=r"no olap-engine shape matches --case 'nope' "
                       r"\(shapes: avg\(c_float\); sum\(c_int\);"):
        olap_engine.run(BenchOptions(tmp_path, rows=1000, case="nope"), lambda m: None,
                        lambda *a: None)


def test_a_big_run_repeats_warm_runs_fewer_times_and_reads_with_the_cache_off(tmp_path,
                                                                               monkeypatch):
    """Over 20M rows each shape gets 3 warm repeats and count(DISTINCT) one (about a minute
    a run at 100M rows); up to 20M, 5. Every shape also runs on the encrypted table with
    cache_bytes=0, right after the encrypted table, with no load of its own."""
    from cryptdisk.bench._model import BenchOptions

    loads, ran = [], []

    def worker(_cleanup, target, args):
        if target.endswith(":load"):
            loads.append(args["engine"])
        return type("R", (), {"samples": [], "peak_rss_mb": 1.0})()

    monkeypatch.setattr(olap_engine, "run_worker", worker)
    monkeypatch.setattr(olap_engine, "interleave",
                        lambda options, exp, strategies, *a, **k: ran.append(
                            [(s.name, s.args["name"], s.args["warm"]) for s in strategies]))
    for rows in (20_000_000, 100_000_000):
        olap_engine.run(BenchOptions(tmp_path, rows=rows, case="c_"), lambda m: None,
                        lambda *a: None)
    assert loads == ENGINES + ENGINES
    small, big = ran[:len(ran) // 2], ran[len(ran) // 2:]
    assert {w for shape in small for _e, _n, w in shape} == {5}
    warm = {n: w for shape in big for _e, n, w in shape}
    assert warm["count(DISTINCT c_str)"] == 1
    assert warm["point c_int = X"] == 3 and warm["avg(c_float)"] == 3
    engines = [e for e, _n, _w in big[0]]
    assert engines[:3] == ["cryptdisk encrypted", CACHE_OFF, "cryptdisk plain"]
    assert sorted(engines) == sorted([*ENGINES, CACHE_OFF])

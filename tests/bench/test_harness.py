"""Harness logic: ratios, interleaving, JSON schema, report generation, skipped peers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from cryptdisk.bench._cleanup import Cleanup
from cryptdisk.bench._model import BenchOptions, Failure, Measurement, Skipped
from cryptdisk.bench._report import baseline_for, summary_lines, write_report
from cryptdisk.bench._stats import median_interval, paired_ratio, ratio_of
from cryptdisk.bench._suite import Results, Strategy, interleave, run_experiment


def test_paired_ratio_is_median_of_round_ratios():
    r = paired_ratio([10.0, 30.0, 20.0], [5.0, 10.0, 20.0])  # ratios 2, 3, 1
    assert (r.median, r.low, r.high, r.paired) == (2.0, 1.0, 3.0, True)
    assert r.percent_change() == pytest.approx(100.0)


def test_ratio_falls_back_to_medians_when_runs_differ():
    r = paired_ratio([4.0, 6.0], [1.0, 2.0, 3.0])
    assert not r.paired and r.median == pytest.approx(5.0 / 2.0)
    with pytest.raises(ValueError):
        paired_ratio([], [1.0])


def test_median_interval_brackets_the_median_and_narrows_with_rounds():
    import random
    import statistics

    rnd = random.Random(7)
    many = [rnd.gauss(0.96, 0.06) for _ in range(200)]
    few = many[:10]
    lo_many, hi_many = median_interval(many)
    lo_few, hi_few = median_interval(few)
    assert lo_many <= statistics.median(many) <= hi_many
    assert lo_few <= statistics.median(few) <= hi_few
    assert hi_many - lo_many < hi_few - lo_few  # more rounds, a tighter interval
    assert 0.93 < lo_many < 0.96 < hi_many < 0.99  # around the true median, 0.96
    assert median_interval(few) == (lo_few, hi_few)  # seeded: the same values, the same answer
    assert median_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)
    lo_half, hi_half = median_interval(many, level=0.5)
    assert hi_half - lo_half < hi_many - lo_many
    with pytest.raises(ValueError):
        median_interval([])
    with pytest.raises(ValueError, match="level"):
        median_interval([1.0], level=1.0)


def test_cpu_ratio_uses_cpu_per_unit_of_work():
    a = Measurement("io", "read", "enc", "MB/s", [1, 1], cpu_s=[3.0, 3.0], work=2e9)
    b = Measurement("io", "read", "plain", "MB/s", [1, 1], cpu_s=[1.0, 1.0], work=1e9)
    assert a.cpu_per_gb == pytest.approx(1.5)
    assert ratio_of(a, b, cpu=True).median == pytest.approx(1.5)


def test_baseline_rules():
    ms = [Measurement("olap", "q", s, "s", [1.0]) for s in
          ("chdb plain", "chdb AES_128_CTR", "plain", "cryptdisk")]
    ms.append(Measurement("olap", "q", "x", "s", [1.0], extra={"baseline": "cryptdisk"}))
    by = {m.strategy: m for m in ms}
    assert baseline_for(by["chdb AES_128_CTR"], ms) is by["chdb plain"]
    assert baseline_for(by["cryptdisk"], ms) is by["plain"]
    assert baseline_for(by["x"], ms) is by["cryptdisk"]
    assert baseline_for(by["plain"], ms) is None


def _body_target() -> str:
    return "tests.bench._bodies:count"


@pytest.fixture()
def options(tmp_path):
    cleanup = Cleanup(tmp_path)
    yield BenchOptions(cleanup.workdir, quick=True, cleanup=cleanup)
    cleanup.run()


def test_interleave_runs_a_b_a_b_in_fresh_workers(options, monkeypatch):
    log = options.workdir / "order.log"
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2]))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]) + ":" +
                       str(Path(__file__).resolve().parents[2] / "src"))
    got: list = []
    steps: list = []
    strategies = [Strategy(n, _body_target(), dict(log=str(log), name=n)) for n in "AB"]
    strategies.append(Strategy("C", "tests.bench._bodies:fail", {}))
    interleave(options, "io", strategies, got.append, lambda d, c, t: steps.append((c, t)), "x", 3)
    assert log.read_text().split() == ["A", "B", "A", "B", "A", "B"]
    ms = {m.strategy: m for m in got if isinstance(m, Measurement)}
    assert set(ms) == {"A", "B"} and len(ms["A"].values) == 3
    assert ms["A"].peak_rss_mb > 1 and ms["A"].extra["pid"] != ms["B"].extra["pid"]
    assert ms["A"].cpu_s and ms["A"].work == 1e6
    failed = [s for s in got if isinstance(s, Failure)]
    assert len(failed) == 1 and "boom" in failed[0].error  # failed once, then dropped
    assert "RuntimeError: boom" in failed[0].traceback  # the worker's own traceback
    assert "_bodies.py" in failed[0].traceback and "in fail" in failed[0].traceback
    assert not [s for s in got if isinstance(s, Skipped)]  # a crash is not a skip
    assert steps[-1] == (9, 9)


def test_missing_dependency_is_skipped_and_a_crash_is_a_failure(options, tmp_path, monkeypatch):
    pkg = tmp_path / "fakepeers"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "needs_dep.py").write_text("import no_such_package_xyz\n")
    (pkg / "broken.py").write_text("def run(o, r, p):\n    raise RuntimeError('peer broke')\n")
    (pkg / "good.py").write_text(
        "from cryptdisk.bench._model import Measurement, Skipped\n"
        "from cryptdisk.bench._worker import run_worker\n"
        "EXPERIMENT = 'fake'\n"
        "NOTES = ['configured as documented']\n"
        "def body():\n"
        "    return []\n"
        "def run(options, record, progress):\n"
        "    assert options.quick and options.workdir.is_dir()\n"
        "    progress('fake step', 1, 2)\n"
        "    rss = run_worker(options.cleanup, 'fakepeers.good:body', {}).peak_rss_mb\n"
        "    record(Measurement('fake', 'q', 'plain', 's', [1.0, 2.0], peak_rss_mb=rss))\n"
        "    record(Skipped('fake', 'peer', 'not here', 'apt-get install peer'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    res = Results({}, {}, "cmd")
    steps: list = []
    big = bytearray(300 << 20)
    big[:: 4096] = b"x" * len(big[:: 4096])  # the harness is big; the module's child is not
    run_experiment("olap", options, res, lambda *a: steps.append(a),
                   ["cryptdisk.bench.not_written_yet", "fakepeers.needs_dep", "fakepeers.broken",
                    "fakepeers.good"])
    del big
    reasons = {s.strategy: s for s in res.skipped}
    failures = {f.strategy: f for f in res.failures}
    assert set(failures) == {"cryptdisk.bench.not_written_yet", "fakepeers.broken"}
    assert "cannot import cryptdisk.bench.not_written_yet" in failures[
        "cryptdisk.bench.not_written_yet"].error  # our own module missing: a bug, not a skip
    dep = reasons["fakepeers.needs_dep"]
    assert "no_such_package_xyz" in dep.reason and "cryptdisk[bench]" in dep.install
    broken = failures["fakepeers.broken"]
    assert "peer broke" in broken.error and "broken.py" in broken.traceback
    assert reasons["peer"].install == "apt-get install peer"
    assert set(reasons) == {"fakepeers.needs_dep", "peer"}
    (m,) = res.measurements
    assert m.values == [1.0, 2.0] and m.median == 1.5 and m.experiment == "fake"
    assert m.peak_rss_mb < 250  # its worker's own: not the harness's 300 MB
    assert res.notes["fake"] == ["configured as documented"]
    assert ("fake step", 1, 2) in steps


def _synthetic() -> Results:
    res = Results({"cpu_model": "Test CPU", "cores": 2, "packages": {"duckdb": "1"}},
                  {"quick": True}, "cryptdisk bench all --quick", started="2026-01-01T00:00:00Z")
    for strategy, base in (("plain", 100.0), ("cryptdisk", 80.0), ("gocryptfs", 40.0)):
        res.record(Measurement("io", "read", strategy, "MB/s", [base, base * 1.1, base * 0.9],
                               cpu_s=[1.0, 1.2, 1.1], work=1e9, peak_rss_mb=40.0))
    res.record(Measurement("olap", "avg(c_float) threads=all warm", "chdb plain", "s",
                           [0.1, 0.12], better="lower", cpu_s=[0.1, 0.1], work=8e8))
    res.record(Measurement("olap", "avg(c_float) threads=all warm", "chdb AES_128_CTR", "s",
                           [0.13, 0.15], better="lower", cpu_s=[0.12, 0.13], work=8e8))
    res.record(Skipped("oltp", "postgresql", "pg_ctl not found", "apt-get install postgresql"))
    res.notes["io"] = ["page cache note"]
    return res


def test_json_round_trip_and_schema():
    res = _synthetic()
    d = json.loads(json.dumps(res.to_dict()))
    assert d["schema"] == "cryptdisk-bench/1"
    m = d["measurements"][1]
    for key in ("experiment", "case", "strategy", "unit", "values", "median", "min", "max",
                "cpu_s", "cpu_s_per_gb", "peak_rss_mb", "work"):
        assert key in m
    assert m["median"] == pytest.approx(80.0) and m["min"] == pytest.approx(72.0)
    assert d["skipped"][0]["install"] == "apt-get install postgresql"
    back = Results.from_dict(d)
    assert [x.strategy for x in back.measurements] == [x.strategy for x in res.measurements]


def test_report_writes_markdown_and_plots(tmp_path):
    out = tmp_path / "report"
    md = write_report(_synthetic(), out, note="noisy shared machine")
    text = md.read_text()
    assert "noisy shared machine" in text and "Test CPU" in text
    assert "31.175 s" in text  # the published ClickHouse insert beside ours
    assert "+35-50 % CPU" in text  # the published LUKS figure
    assert "| read | cryptdisk | MB/s | 3 | 80 | 72-88 | 0.80 (0.80-0.80) |" in text
    assert "`apt-get install postgresql`" in text
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert {"io-mb-s.png", "io-cpu-per-gb.png", "io-relative-cost.png", "olap-s.png"} <= set(pngs)
    for p in out.glob("*.png"):
        assert p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG"
        assert f"]({p.name})" in text
    lines = summary_lines(_synthetic())
    assert any("x0.80" in line for line in lines)
    assert any(line.startswith("skipped oltp/postgresql") for line in lines)


def test_cleanup_removes_workdir_and_kills_children(tmp_path):
    c = Cleanup(tmp_path)
    (c.workdir / "f").write_text("x")
    proc = c.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    undone = []
    c.push("note", lambda: undone.append(1))
    c.run()
    assert proc.poll() is not None and undone == [1] and not c.workdir.exists()
    c.run()  # idempotent


def test_worker_peak_rss_is_its_own_not_the_harness(options, monkeypatch):
    """ru_maxrss of an exec'd child inherits the parent's high-water mark; VmHWM does not."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{root}:{root / 'src'}")
    from cryptdisk.bench._worker import run_worker

    big = bytearray(300 << 20)
    big[:: 4096] = b"x" * len(big[:: 4096])  # touch every page: the harness is now > 300 MiB
    res = run_worker(options.cleanup, "tests.bench._bodies:count",
                     dict(log=str(options.workdir / "l"), name="A"))
    assert 5 < res.peak_rss_mb < 200
    hog = run_worker(options.cleanup, "tests.bench._bodies:hog", dict(mib=256))
    assert hog.peak_rss_mb > 256
    del big


def test_olap_answers_are_checked():
    from cryptdisk.bench._bodies_olap import check_result

    check_result("sum", b"-5\n", 2**64 - 5)  # Int64 wrap vs HUGEINT agree modulo 2**64
    check_result("avg", (1.5,), 1.5)
    with pytest.raises(AssertionError):
        check_result("avg", b"1.6\n", 1.5)
    with pytest.raises(AssertionError):
        check_result("sum", (7,), 8)


def test_database_numbers_serialise_as_json():
    from decimal import Decimal

    m = Measurement("olap-db", "q", "plain", "s", [Decimal("0.5"), 1], cpu_s=[Decimal("0.25")],
                    work=Decimal(1_000_000_000))
    d = json.loads(json.dumps(m.to_dict()))
    assert d["work"] == 1e9 and d["values"] == [0.5, 1.0] and d["cpu_s_per_gb"] == 0.25


def test_samples_of_one_case_in_two_units_stay_apart(options, monkeypatch):
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{root}:{root / 'src'}")
    got: list = []
    interleave(options, "crypto", [Strategy("s", "tests.bench._bodies:two_units", {})],
               got.append, lambda *a: None, "x", 2)
    by_unit = {m.unit: m for m in got}
    assert by_unit["MB/s"].values == [5.0, 5.0]
    assert by_unit["MiB peak RSS"].values == [30.0, 30.0]


def test_a_failure_keeps_its_traceback_in_json_report_and_summary(tmp_path):
    res = _synthetic()
    res.record(Failure("olap", "chdb plain", "chdb failed: ValueError: x",
                       "Traceback (most recent call last):\n  File \"b.py\"\nValueError: x\n"))
    d = json.loads(json.dumps(res.to_dict()))
    assert d["failures"] == [{"experiment": "olap", "strategy": "chdb plain",
                              "error": "chdb failed: ValueError: x",
                              "traceback": res.failures[0].traceback}]
    assert Results.from_dict(d).failures == res.failures
    text = write_report(res, tmp_path / "r").read_text()
    assert "Failed (a crash" in text and "**chdb plain**: chdb failed" in text
    assert '  File "b.py"' in text
    assert "FAILED olap/chdb plain: chdb failed: ValueError: x" in summary_lines(res)


def test_cryptdisk_bench_exits_non_zero_when_a_run_failed(tmp_path, monkeypatch, capsys):
    import cryptdisk.bench as suite  # what cryptdisk bench calls
    from cryptdisk.cli import main

    def fake(name, options, results, progress, modules=None):
        results.record(Measurement(name, "c", "plain", "s", [1.0]))
        results.record(Failure(name, "peer", "peer failed: boom", "Traceback ..."))

    monkeypatch.setattr(suite, "run_experiment", fake)
    assert main(["bench", "crypto", "--workdir", str(tmp_path), "--json",
                 str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err
    assert "1 benchmark run(s) failed: crypto/peer" in err and "incomplete" in err
    assert json.loads((tmp_path / "r.json").read_text())["failures"][0]["strategy"] == "peer"


def test_interleave_can_rotate_the_order_and_gives_median_extras(options, monkeypatch):
    log = options.workdir / "order.log"
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", f"{root}:{root / 'src'}")
    got: list = []
    interleave(options, "oltp", [Strategy(n, _body_target(), dict(log=str(log), name=n))
                                 for n in "ABC"], got.append, lambda *a: None, "x", 3,
               rotate=True)
    assert log.read_text().split() == list("ABCBCACAB")
    (a,) = [m for m in got if m.strategy == "A"]
    assert len(a.values) == 3 and a.extra["pid"] > 0  # a number: the median of 3 runs' pids


def test_cleanup_stops_workers_before_the_actions_and_daemons_after(tmp_path):
    """A FUSE daemon serves its mount until the unmount action has run; the workers,
    which hold files open on it, are gone before."""
    c = Cleanup(tmp_path)
    worker = c.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    daemon = c.popen([sys.executable, "-c", "import time; time.sleep(60)"], daemon=True)
    seen = []
    c.push("unmount", lambda: seen.append((worker.poll() is not None, daemon.poll() is None)))
    c.run()
    assert seen == [(True, True)]
    assert daemon.poll() is not None and not c.workdir.exists()


def test_a_child_that_ignores_sigterm_is_killed_and_cleanup_ends(tmp_path):
    import signal
    import subprocess
    import time

    c = Cleanup(tmp_path)
    proc = c.popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                    "signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
                   stdout=subprocess.PIPE, daemon=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    t0 = time.monotonic()
    c.run()
    assert proc.returncode == -signal.SIGKILL
    assert time.monotonic() - t0 < 30  # bounded waits (SIGTERM, then SIGKILL), never wait()
    proc.stdout.close()

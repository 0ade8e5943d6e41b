"""How much of a store the OS page cache holds, and evicting it (``--drop-page-cache``)."""

import os

import pytest

from cryptdisk.bench import olap_engine
from cryptdisk.bench._model import Measurement
from cryptdisk.bench._pagecache import drop, files, resident

pytestmark = pytest.mark.skipif(resident([__file__]) is None,
                                reason="needs mincore (Linux) to tell what is cached")


def test_a_file_just_read_is_cached_and_dropping_it_evicts_it(tmp_path):
    store = tmp_path / "store"
    (store / "sub").mkdir(parents=True)
    (store / "a").write_bytes(os.urandom(1 << 20))
    (store / "sub" / "b").write_bytes(os.urandom(300_000))
    (store / "empty").write_bytes(b"")
    assert files([store]) == [store / "a", store / "empty", store / "sub" / "b"]
    for f in files([store]):
        f.read_bytes()
    assert resident([store]) == pytest.approx(1.0, abs=0.02)
    drop([store])
    assert resident([store]) < 0.1  # (written and synced: clean pages go)
    (store / "sub" / "b").read_bytes()
    got = resident([store])
    assert 0.1 < got < 0.4  # about 300 KB of the 1.3 MB
    assert resident([tmp_path / "missing"]) is None  # no bytes: nothing to tell


def test_the_bodies_record_what_the_page_cache_held_and_the_report_says_it(tmp_path):
    from cryptdisk.bench._bodies_engine import load, shape
    from cryptdisk.bench._bodies_olap import prepare

    data = str(tmp_path / "d.parquet")
    prepare(path=data, rows=5000)
    load("cryptdisk encrypted", str(tmp_path), data, 5000)
    warm = shape("cryptdisk encrypted", str(tmp_path), "sum(c_int)", 5000, 1)
    cold = shape("cryptdisk encrypted", str(tmp_path), "sum(c_int)", 5000, 1, drop_cache=True)
    assert warm[0].extra["page_cache"] > 0.9  # just written and read
    assert cold[0].extra["page_cache"] < 0.1
    assert cold[0].extra["answer"] == warm[0].extra["answer"]
    got = []
    olap_engine._finish([Measurement("olap-engine", "sum(c_int) cold", "cryptdisk encrypted",
                                     "s", [0.1], "lower", extra=dict(cold[0].extra))],
                        got.append, 5000, dropped=True)
    assert any("evicted before each run" in n and "cryptdisk encrypted 0-" in n
               for n in olap_engine.NOTES)


def test_the_option_reaches_every_engine_s_runs(tmp_path, monkeypatch):
    from cryptdisk.bench._model import BenchOptions

    seen = []
    monkeypatch.setattr(olap_engine, "run_worker", lambda *a, **k: type(
        "R", (), {"samples": [], "peak_rss_mb": 1.0})())
    monkeypatch.setattr(olap_engine, "interleave",
                        lambda options, exp, strategies, *a, **k: seen.extend(
                            s.args["drop_cache"] for s in strategies))
    for flag in (True, False):
        seen.clear()
        olap_engine.run(BenchOptions(tmp_path, rows=1000, case="avg", drop_page_cache=flag),
                        lambda m: None, lambda *a: None)
        assert seen and set(seen) == {flag}


def test_the_cli_refuses_the_option_for_other_experiments(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "cryptdisk", "bench", "crypto", "--quick",
                        "--drop-page-cache", "--workdir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--drop-page-cache goes with" in r.stderr

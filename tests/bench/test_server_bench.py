"""``cryptdisk bench server`` (``oltp --server``): real pgbench against cryptdisk serve and
PostgreSQL (structure, never timings)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import psutil

from tests.bench.test_cli import _bench


def test_round_trip_case_runs_every_server_and_cleans_up():
    from cryptdisk.bench import BenchOptions, Failure, Measurement
    from cryptdisk.bench.server import NOTES, run

    got: list = []
    # not under pytest's base temp: another pytest session resets its mode to 0700, which
    # would lock the cluster's postgres user out of its data directory mid-run
    with tempfile.TemporaryDirectory(prefix="cd-server-bench-") as work:
        tmp_path = Path(work)
        run(BenchOptions(tmp_path, quick=True, duration=1, repeats=2, case="round trips"),
            got.append, lambda *a: None)
        assert list(tmp_path.iterdir()) == []  # databases, PostgreSQL's cluster, logs: gone
        left = [p for p in psutil.process_iter(["cmdline", "ppid"])  # servers: stopped
                if ("multiprocessing.spawn" in " ".join(p.info["cmdline"] or [])
                and p.info["ppid"] == os.getpid()) or work in " ".join(p.info["cmdline"] or [])]
        assert left == []
    assert [g for g in got if isinstance(g, Failure)] == []
    ms = {m.strategy: m for m in got if isinstance(m, Measurement)}
    assert set(ms) == {"serve encrypted", "serve plain", "serve encrypted, no TLS",
                       "postgresql"}
    for m in ms.values():
        assert m.case == "SELECT 1 (round trips) clients=1"
        assert len(m.values) == 2 and all(v > 0 for v in m.values) and m.work > 0
        assert m.extra["p50_ms"] > 0 and m.extra["server_cpu_us_per_txn"] > 0
        assert m.peak_rss_mb > 0
    assert ms["serve encrypted"].extra["baseline"] == "serve plain"
    from cryptdisk.server import default_workers

    assert ms["serve encrypted"].extra["workers"] == default_workers()  # serve's default
    assert any("worker process" in n for n in NOTES)
    assert ms["postgresql"].extra["baseline"] == "serve encrypted"
    assert any(n.startswith("Targets (issue #17") for n in NOTES)


def test_server_flag_goes_with_oltp_only(tmp_path):
    r = _bench("crypto", "--server", "--workdir", str(tmp_path))
    assert r.returncode == 1 and "--server goes with 'cryptdisk bench oltp'" in r.stderr
    assert "Traceback" not in r.stderr

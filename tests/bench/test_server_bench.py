"""``cryptdisk bench server`` (``oltp --server``): real pgbench against cryptdisk serve and
PostgreSQL (structure, never timings)."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import tempfile
from pathlib import Path

import psutil
import pytest

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
                       "postgresql", "postgresql, no TLS"}
    for m in ms.values():
        assert m.case == "SELECT 1 (round trips) clients=1"
        assert len(m.values) == 2 and all(v > 0 for v in m.values) and m.work > 0
        assert m.extra["p50_ms"] > 0 and m.extra["server_cpu_us_per_txn"] > 0
        assert m.extra["client_cpu_us_per_txn"] > 0  # pgbench's
        runs = m.extra["cpu_us_per_txn_runs"]  # server and pgbench, per run
        assert len(runs) == 2 and all(r > m.extra["server_cpu_us_per_txn"] / 10 for r in runs)
        assert m.peak_rss_mb > 0
    assert ms["serve encrypted"].extra["baseline"] == "serve plain"
    from cryptdisk.server import default_workers

    assert ms["serve encrypted"].extra["workers"] == default_workers()  # serve's default
    assert any("worker process" in n for n in NOTES)
    assert ms["postgresql"].extra["baseline"] == "serve encrypted"
    assert ms["postgresql, no TLS"].extra["baseline"] == "postgresql"
    assert ms["serve encrypted, no TLS"].extra["baseline"] == "serve encrypted"
    # each server's TLS/plaintext ratio, paired round by round, side by side
    tls = [n for n in NOTES if n.startswith("TLS/plaintext TPS")]
    assert len(tls) == 1
    case = re.escape("[SELECT 1 (round trips) clients=1]")
    num = r"([0-9.]+) \(([0-9.]+)-([0-9.]+)\)"
    diff = r"CPU ([-+0-9.]+) us \(([-+0-9.]+) to ([-+0-9.]+)\)"
    m = re.search(f"{case} cryptdisk serve {num}, {diff}, PostgreSQL {num}, {diff}", tls[0])
    assert m, tls[0]
    for first, (a, b) in zip((1, 7), (("serve encrypted", "serve encrypted, no TLS"),
                                      ("postgresql", "postgresql, no TLS")), strict=True):
        median, low, high, cpu, cpu_low, cpu_high = (float(m[first + i]) for i in range(6))
        rs = sorted(x / y for x, y in zip(ms[a].values, ms[b].values, strict=True))
        assert (low, high, median) == (round(rs[0], 2), round(rs[-1], 2),
                                       round(statistics.median(rs), 2))
        ds = sorted(x - y for x, y in zip(ms[a].extra["cpu_us_per_txn_runs"],
                                          ms[b].extra["cpu_us_per_txn_runs"], strict=True))
        assert (cpu_low, cpu_high, cpu) == (round(ds[0], 1), round(ds[-1], 1),
                                            round(statistics.median(ds), 1))
    assert any(n.startswith("Targets (issue #17") for n in NOTES)


def test_postgresql_takes_plaintext_from_loopback_only_and_tls(tmp_path):
    """The no-TLS strategy's connections are plaintext, the TLS one's encrypted (as
    PostgreSQL sees them), and pg_hba.conf lets plaintext in from 127.0.0.1 only."""
    from cryptdisk.bench._oltp_pg import find_pg_bin
    from cryptdisk.bench.server import _Postgres
    from cryptdisk.server import self_signed

    bindir = find_pg_bin()
    assert bindir is not None, "PostgreSQL is not installed (apt-get install postgresql)"
    with tempfile.TemporaryDirectory(prefix="cd-server-bench-") as work:
        workdir = Path(work)
        tls = workdir / "tls"
        tls.mkdir()
        self_signed(tls / "server.pem", tls / "server.key")
        for name in ("pem", "key"):
            shutil.copy(tls / f"server.{name}", tls / f"pg.{name}")
            if os.geteuid() == 0:
                shutil.chown(tls / f"pg.{name}", "postgres")
        pg = _Postgres(bindir, workdir, tls, "secret-pw", 1)  # checks both modes itself
        try:
            assert pg.uses_tls(True, tls / "server.pem", "secret-pw") is True
            assert pg.uses_tls(False, tls / "server.pem", "secret-pw") is False
            hba = [line.split() for line in
                   (pg.cluster.data / "pg_hba.conf").read_text().splitlines()
                   if line.strip() and not line.startswith("#")]
            assert ["hostnossl", "all", "all", "127.0.0.1/32", "scram-sha-256"] in hba
            assert all(r[0] == "local" or r[3] == "127.0.0.1/32" for r in hba)
            assert all(r[-1] != "trust" for r in hba if r[0] != "local")
            with pytest.raises(RuntimeError, match="password authentication failed"):
                pg.uses_tls(False, tls / "server.pem", "wrong")
        finally:
            pg.stop()


def test_server_flag_goes_with_oltp_only(tmp_path):
    r = _bench("crypto", "--server", "--workdir", str(tmp_path))
    assert r.returncode == 1 and "--server goes with 'cryptdisk bench oltp'" in r.stderr
    assert "Traceback" not in r.stderr

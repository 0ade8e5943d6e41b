"""Worker body of the oltp experiment: one run of one case under one strategy.

The worker starts the case's client processes (``spawn``: fresh interpreters), lets
them open the database and warm their caches, starts them together, and stops
them after the run's duration. Each client reports its transactions, latencies,
the CPU seconds of its timed window and its peak RSS (``VmHWM``, see
:func:`cryptdisk.bench._measure.peak_rss_mb`).
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

from ._measure import Sample
from ._oltp_sqlite import DbSpec

__all__ = ["percentiles", "run_case", "run_clients"]


def run_clients(spec: DbSpec, case: Any, duration: float) -> dict[str, float]:
    """Run ``case.clients`` client processes for ``duration`` seconds; their totals."""
    from ._oltp_sqlite import client_main

    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Barrier(case.clients + 1)
    start = ctx.Event()
    stop_at = ctx.Value("d", 0.0, lock=False)
    procs, pipes = [], []
    for i in range(case.clients):
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=client_main, args=(spec, case.kind, case.scale, 1000 + i, ready,
                                                  start, stop_at, send), daemon=True)
        p.start()
        procs.append(p)
        pipes.append(recv)
    try:
        ready.wait(timeout=600)  # every client has opened the database and warmed its cache
    except BaseException:
        for p in procs:
            p.kill()
        raise
    t0 = time.perf_counter()
    stop_at.value = t0 + duration
    start.set()
    results = []
    try:
        for recv in pipes:
            if not recv.poll(duration + 600):
                raise RuntimeError("a benchmark client did not report")
            results.append(recv.recv())
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    elapsed = max(duration, time.perf_counter() - t0)
    lat = sorted(x for r in results for x in r.latencies_us)
    txns = sum(r.transactions for r in results)
    return {"tps": txns / elapsed, "txns": txns, "cpu_s": sum(r.cpu_s for r in results),
            **percentiles(lat), "retries": sum(r.retries for r in results),
            "rss_mb": max(r.max_rss_kib for r in results) / 1024}


def percentiles(lat: list[float]) -> dict[str, float]:
    if not lat:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0}
    def pick(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] / 1000

    return {"p50_ms": pick(0.50), "p95_ms": pick(0.95), "p99_ms": pick(0.99)}


def run_case(strategy: str, path: str, secret: str, journal: str, synchronous: str,
             cache_kib: int, case: dict[str, Any], duration: float) -> list[Sample]:
    """One run: TPS (the value), CPU seconds of the clients' timed windows, transactions."""
    from .oltp import Case

    spec = DbSpec(strategy, path, secret, journal, synchronous, cache_kib)
    c = Case(**case)
    r = run_clients(spec, c, duration)
    return [Sample(c.name, "TPS", r["tps"], r["cpu_s"], r["txns"], "transactions", "higher",
                   {"p50_ms": r["p50_ms"], "p95_ms": r["p95_ms"], "p99_ms": r["p99_ms"],
                    "cpu_us_per_txn": r["cpu_s"] / r["txns"] * 1e6 if r["txns"] else 0.0,
                    "retries": r["retries"], "clients_peak_rss_mb": r["rss_mb"]})]

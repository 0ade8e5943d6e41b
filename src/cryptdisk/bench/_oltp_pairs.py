"""Paired rounds of one oltp case, plain SQLite against cryptdisk's: more rounds, less noise.

``cryptdisk bench oltp`` runs every case a few rounds; on a shared 2-core
machine the per-round ratio of one case spreads by +-10%, so a single
5-round median can land either side of a target. This tool runs one case
the same way (a fresh client process per run, the order rotated each round,
a ``sync`` before each run) for as many rounds as asked and prints each
paired ratio, their median and a 90% bootstrap interval for it::

    python -m cryptdisk.bench._oltp_pairs tpcb-like --journal wal --synchronous full --rounds 10
    python -m cryptdisk.bench._oltp_pairs select-only --clients 4 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from ._bodies_oltp import run_clients
from ._oltp_sqlite import DbSpec, load
from ._stats import median_interval
from .oltp import BIG_CACHE_KIB, Case, round_order

__all__ = ["main", "paired_ratios"]

STRATEGIES = ["plain", "cryptdisk"]


def paired_ratios(case: Case, rounds: int, duration: float,
                  workdir: str) -> tuple[list[float], dict[str, list[dict[str, float]]]]:
    """cryptdisk/plain TPS per round of ``case``, and every run's figures by strategy."""
    specs = {}
    for strategy in STRATEGIES:
        secret = os.urandom(32).hex() if strategy != "plain" else ""
        spec = DbSpec(strategy, os.path.join(workdir, f"{strategy}.db"), secret)
        load(spec, case.scale)
        specs[strategy] = DbSpec(strategy, spec.path, secret, case.journal, case.synchronous,
                                 case.cache_kib)
    runs: dict[str, list[dict[str, float]]] = {s: [] for s in STRATEGIES}
    for round_ in range(rounds):
        for strategy in round_order(STRATEGIES, round_):
            os.sync()
            runs[strategy].append(run_clients(specs[strategy], case, duration))
    ratios = [c["tps"] / p["tps"] for p, c in zip(runs["plain"], runs["cryptdisk"], strict=True)]
    return ratios, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=["tpcb-like", "select-only"])
    parser.add_argument("--journal", default="wal")
    parser.add_argument("--synchronous", default="normal")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    case = Case(args.kind, 1, args.journal, args.synchronous, BIG_CACHE_KIB, args.clients)
    with tempfile.TemporaryDirectory(prefix="cryptdisk-oltp-pairs-") as workdir:
        ratios, runs = paired_ratios(case, args.rounds, args.duration, workdir)
    for strategy, figures in runs.items():
        cpu = statistics.median(r["cpu_s"] / r["txns"] * 1e6 for r in figures if r["txns"])
        print(f"{strategy:9s} TPS {[round(r['tps']) for r in figures]}; "
              f"CPU us/transaction median {cpu:.1f}")
    low, high = median_interval(ratios)
    print(f"{case.name}: cryptdisk/plain per round {[round(r, 3) for r in ratios]}; "
          f"median {statistics.median(ratios):.3f} (90% bootstrap interval {low:.3f}-{high:.3f})")


if __name__ == "__main__":
    main()

"""Tiny worker bodies for the harness tests."""

import os

from cryptdisk.bench._measure import Sample, Stopwatch


def count(log: str, name: str) -> list[Sample]:
    with Stopwatch() as sw, open(log, "a") as f:
        f.write(name + "\n")
    return [sw.rate("case", 1e6, pid=os.getpid())]


def fail() -> list[Sample]:
    raise RuntimeError("boom")

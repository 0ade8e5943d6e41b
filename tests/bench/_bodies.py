"""Tiny worker bodies for the harness tests."""

import os

from cryptdisk.bench._measure import Sample, Stopwatch


def count(log: str, name: str) -> list[Sample]:
    with Stopwatch() as sw, open(log, "a") as f:
        f.write(name + "\n")
    return [sw.rate("case", 1e6, pid=os.getpid())]


def fail() -> list[Sample]:
    raise RuntimeError("boom")


def hog(mib: int) -> list[Sample]:
    buf = bytearray(mib << 20)
    buf[::4096] = b"y" * len(buf[::4096])
    return [Sample("hog", "MiB", len(buf) / (1 << 20))]


def two_units() -> list[Sample]:
    return [Sample("c", "MB/s", 5.0), Sample("c", "MiB peak RSS", 30.0, better="lower")]

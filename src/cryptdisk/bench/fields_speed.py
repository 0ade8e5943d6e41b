"""Single-core throughput of the field functions (cryptdisk.fields), a quick measurement.

    python -m cryptdisk.bench.fields_speed [--values N]

Prints values/s (or MB/s) per function against issue 18's targets: FF1 >= 1M
16-digit values/s/core, AES-SIV >= 3M short values/s/core, GCM >= 1 GB/s/core on
long values. One process, one thread; the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from ..fields import (
    FieldKey,
    encrypt,
    encrypt_deterministic,
    fpe_encrypt,
    mask_hash,
    mask_last4,
    tokenize,
)

__all__ = ["main"]


def _best(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _cards(n: int) -> pa.Array:
    rng = np.random.default_rng(0)
    digits = rng.integers(0, 10, size=(n, 16), dtype=np.uint8) + ord("0")
    offsets = (np.arange(n + 1, dtype=np.int32) * 16).tobytes()
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(digits.tobytes()))


def _luhn_cards(n: int) -> pa.Array:
    rng = np.random.default_rng(1)
    x = rng.integers(0, 10, size=(n, 16))
    x[:, -1] = 0
    rev = x[:, ::-1].copy()
    doubled = rev[:, 1::2] * 2
    rev[:, 1::2] = np.where(doubled > 9, doubled - 9, doubled)
    x[:, -1] = (10 - rev.sum(axis=1) % 10) % 10
    return pa.array(["".join(map(str, row)) for row in x.tolist()], pa.string())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=200_000)
    args = parser.parse_args(argv)
    n = args.values
    key = FieldKey.generate("bench")
    cards = _cards(n)
    short = pa.array([os.urandom(8).hex() for _ in range(n)], pa.string())  # 16 chars
    long_values = pa.array([os.urandom(1 << 20) for _ in range(64)], pa.binary())
    luhn = _luhn_cards(n // 4)
    rows = [
        ("fpe_encrypt FF1, 16 digits", n, _best(lambda: fpe_encrypt(cards, key, "pan")),
         1_000_000, "values/s"),
        ("tokenize 6+4 kept, Luhn", n // 4, _best(lambda: tokenize(
            luhn, key, "pan", keep_first=6, keep_last=4, luhn=True), 1),
         None, "values/s"),
        ("encrypt_deterministic AES-SIV, 16 chars", n,
         _best(lambda: encrypt_deterministic(short, key)), 3_000_000, "values/s"),
        ("encrypt AES-256-GCM, 16 chars", n, _best(lambda: encrypt(short, key)), None,
         "values/s"),
        ("encrypt AES-256-GCM, 1 MiB values", 64, _best(lambda: encrypt(long_values, key)),
         1000, "MB/s"),
        ("mask_last4", n, _best(lambda: mask_last4(cards)), None, "values/s"),
        ("mask_hash HMAC-SHA-256", n, _best(lambda: mask_hash(cards, key)), None, "values/s"),
    ]
    print(f"{'function':42} {'rate':>14}  target")
    for name, count, seconds, target, unit in rows:
        rate = count * (1 << 20) / 1e6 / seconds if unit == "MB/s" else count / seconds
        goal = "" if target is None else f"{target:,} ({rate / target:.0%} of it)"
        print(f"{name:42} {rate:>10,.0f} {unit:8} {goal}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

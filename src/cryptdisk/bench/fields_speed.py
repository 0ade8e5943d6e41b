"""Single-core throughput of the field functions (cryptdisk.fields), a quick measurement.

    python -m cryptdisk.bench.fields_speed [--values N] [--scan-rows N]

Prints values/s (or MB/s) per function against issue 18's targets: FF1 >= 1M
16-digit values/s/core, AES-SIV >= 3M short values/s/core, GCM >= 1 GB/s/core on
long values; then a warm scan of an encrypted table decrypting 1, 2 and 4 GCM
columns (16 characters) against the same scan of clear columns (target: under 1.5x
for one column). The functions run in one thread; the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from ..db import connect
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


_CONFIG = """
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
hex = "{at_rest}"

[disks.local]
type = "local"
path = "data"

[disks.secure]
type = "encrypted"
disk = "local"

[policies.default]
volumes = [{{ name = "main", disks = ["secure"] }}]

[fields.keys.bench]
hex = "{field}"
"""


def _query(db: Any, sql: str) -> Callable[[], Any]:
    return lambda: db.sql(sql)


def _scan(rows: int) -> None:
    """Warm scans of an encrypted table: decrypting 1, 2, 4 GCM columns against clear ones."""
    with tempfile.TemporaryDirectory() as tmp:
        config = os.path.join(tmp, "bench.toml")
        with open(config, "w") as f:
            f.write(_CONFIG.format(at_rest=os.urandom(32).hex(), field=os.urandom(32).hex()))
        db = connect(os.path.join(tmp, "db"), config)
        try:
            db.sql("CREATE TABLE t (c0 VARCHAR, c1 VARCHAR, c2 VARCHAR, c3 VARCHAR, "
                   "e0 VARCHAR, e1 VARCHAR, e2 VARCHAR, e3 VARCHAR)")
            clear = ", ".join(f"substr(md5((range * 4 + {i})::VARCHAR), 1, 16)"
                              for i in range(4))
            protected = ", ".join(f"encrypt(substr(md5((range * 4 + {i})::VARCHAR), 1, 16), "
                                  "'bench')" for i in range(4))
            db.sql(f"INSERT INTO t SELECT {clear}, {protected} "  # noqa: S608 (constants)
                   f"FROM range({int(rows)})")
            print(f"\nwarm scan of {rows:,} rows (sum of lengths), encrypted table")
            print(f"{'columns':10} {'clear s':>9} {'decrypting s':>13} {'ratio':>7}  target")
            for k in (1, 2, 4):
                plain = " + ".join(f"length(c{i})" for i in range(k))
                dec = " + ".join(f"length(decrypt(e{i}, 'bench'))" for i in range(k))
                a = _best(_query(db, f"SELECT sum({plain}) FROM t"))  # noqa: S608
                b = _best(_query(db, f"SELECT sum({dec}) FROM t"))  # noqa: S608
                goal = "1.5x" if k == 1 else ""
                print(f"{k:<10} {a:9.3f} {b:13.3f} {b / a:6.1f}x  {goal}")
        finally:
            db.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=200_000)
    parser.add_argument("--scan-rows", type=int, default=200_000,
                        help="rows of the scan-overhead table (0: skip it)")
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
    if args.scan_rows:
        _scan(args.scan_rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

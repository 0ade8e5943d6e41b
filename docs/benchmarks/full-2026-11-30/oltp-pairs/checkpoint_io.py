"""The I/O of a WAL checkpoint: 250 random database pages written, then one fdatasync.

cryptdisk stores a SQLite page as a 4128-byte record (the page, its nonce and its
tag), so each page write dirties two 4 KiB filesystem blocks; plain SQLite's
4096-byte pages dirty one. This times both patterns (and aligned pages plus one
metadata block per 128 pages, a layout that keeps nonces and tags apart) on the
filesystem of the working directory, as medians of 40 checkpoints, 3 times each::

    python docs/benchmarks/full-2026-11-30/oltp-pairs/checkpoint_io.py [DIR]
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time

PAGES = 2600  # a scale-1 pgbench database
PER_CHECKPOINT = 250  # pages a checkpoint writes after ~250 TPC-B transactions


def checkpoint_ms(directory: str, layout: str, rounds: int = 40) -> float:
    """Median milliseconds to write PER_CHECKPOINT random pages in ``layout`` and fdatasync."""
    path = os.path.join(directory, f"checkpoint-io.{layout}")
    record = 4128 if layout == "unaligned" else 4096
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, 4096 + PAGES * record + 200 * 4096)
        os.fsync(fd)
        page, meta = os.urandom(record), os.urandom(4096)
        rnd, times = random.Random(1), []
        for _ in range(rounds):
            pages = sorted(rnd.sample(range(PAGES), PER_CHECKPOINT))
            start = time.perf_counter()
            for p in pages:
                where = (4096 + p * record if layout == "unaligned"
                         else 4096 * (2 + (p // 128) * 129 + p % 128))
                os.pwrite(fd, page, where)
            if layout == "aligned+meta":
                for group in sorted({p // 128 for p in pages}):
                    os.pwrite(fd, meta, 4096 * (1 + group * 129))
            os.fdatasync(fd)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3
    finally:
        os.close(fd)
        os.unlink(path)


def main() -> None:
    directory = sys.argv[1] if len(sys.argv) > 1 else "."
    layouts = ("unaligned", "aligned", "aligned+meta")
    results: dict[str, list[float]] = {k: [] for k in layouts}
    for _ in range(3):
        for layout in layouts:  # interleaved, so drift falls on all three
            results[layout].append(checkpoint_ms(directory, layout))
    for layout, ms in results.items():
        print(f"{layout:13s} {', '.join(f'{x:.2f}' for x in ms)} ms per checkpoint "
              f"({PER_CHECKPOINT} pages and an fdatasync)")


if __name__ == "__main__":
    main()

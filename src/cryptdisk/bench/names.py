"""What encrypting file names costs: listing and opening many small files.

Two encrypted disks over local directories, identical but for
``encrypt_names``, each get the same N small files (100 bytes, spread over
directories of 100 files, as a partitioned table would be). Then, in
interleaved rounds (plain names, encrypted names, plain, ...), each with a new
disk object so no name is cached from an earlier round and the decrypted-read
cache off: ``list()`` of the whole disk, then ``open_read`` and read of every
file. Printed: the median seconds of each step per disk and their ratio.

Run it alone with ``python -m cryptdisk.bench.names [--files N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ..disks import EncryptedDisk, LocalDisk
from ..keys import Key, Keyring

__all__ = ["main", "run"]

_PER_DIR = 100


def _disk(root: Path, key: Key, names: bool) -> EncryptedDisk:
    return EncryptedDisk("bench", LocalDisk("raw", root), Keyring([key], key.key_id),
                         cache_bytes=0, names_key_id=key.key_id if names else None)


def _paths(files: int) -> list[str]:
    return [f"table/part={i // _PER_DIR:05d}/file-{i:06d}.bin" for i in range(files)]


def run(workdir: Path, files: int = 10_000, rounds: int = 5,
        say: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
    """Median seconds per step (``list``, ``open+read``) for each disk; see the module doc."""
    key = Key.generate(1)
    paths = _paths(files)
    roots = {"plain names": workdir / "plain", "encrypted names": workdir / "names"}
    for label, root in roots.items():
        disk = _disk(root, key, label == "encrypted names")
        start = time.perf_counter()
        for p in paths:
            disk.write_bytes(p, os.urandom(100))
        say(f"wrote {files} files with {label} in {time.perf_counter() - start:.1f} s")
    times: dict[str, dict[str, list[float]]] = {
        label: {"list": [], "open+read": []} for label in roots}
    for r in range(rounds):
        for label, root in roots.items():
            disk = _disk(root, key, label == "encrypted names")
            start = time.perf_counter()
            listed = disk.list()
            mid = time.perf_counter()
            for p in listed:
                with disk.open_read(p) as f:
                    f.read()
            end = time.perf_counter()
            if len(listed) != files:
                raise RuntimeError(f"{label}: listed {len(listed)} of {files} files")
            times[label]["list"].append(mid - start)
            times[label]["open+read"].append(end - mid)
        say(f"round {r + 1}/{rounds} done")
    return {label: {step: statistics.median(v) for step, v in steps.items()}
            for label, steps in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="cryptdisk-names-"))
    try:
        result = run(workdir, args.files, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    plain, names = result["plain names"], result["encrypted names"]
    print(f"{args.files} files, median of {args.rounds} rounds:")
    for step in ("list", "open+read"):
        print(f"  {step:10s} plain names {plain[step]:.3f} s   encrypted names "
              f"{names[step]:.3f} s   ratio {names[step] / plain[step]:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

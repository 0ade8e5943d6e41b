"""Worker bodies of the io (vioperf) experiment: one thread per core, 1 MiB buffers.

Every 1 MiB block starts with a stamp ``(file number, block number, generation)``
so that readers verify what they read back. ``kind`` is ``plain`` (``os`` calls on
a directory, which may be a gocryptfs mount) or ``cryptdisk`` (:func:`cryptdisk.open`:
sealed files for sequential write and reads, mutable ``r+b`` files for rewrite).
"""

from __future__ import annotations

import os
import random
import struct
import time
from typing import Any

from ._bodies_crypto import _keyring, _parallel
from ._measure import Sample, Stopwatch

__all__ = ["make_files", "read", "rewrite", "skip_read", "write"]

BLOCK = 1 << 20
_STAMP = struct.Struct("<QQQ")


class DataError(RuntimeError):
    """Data read back is not what was written."""


def _block(file_no: int, index: int, gen: int = 0) -> bytearray:
    buf = bytearray(BLOCK)
    buf[32:] = bytes(range(256)) * ((BLOCK - 32) // 256) + bytes((BLOCK - 32) % 256)
    _STAMP.pack_into(buf, 0, file_no, index, gen)
    return buf


def _check(buf: bytearray | memoryview, file_no: int, index: int) -> None:
    f, i, _gen = _STAMP.unpack_from(buf, 0)
    if (f, i) != (file_no, index):
        raise DataError(f"file {file_no} block {index}: read back block ({f}, {i})")


def _open(kind: str, path: str, mode: str, key_hex: str | None) -> Any:
    if kind == "plain":
        return open(path, mode, buffering=0)
    import cryptdisk

    return cryptdisk.open(path, mode, keyring=_keyring(key_hex or ""))


def make_files(kind: str, directory: str, threads: int, blocks: int, key_hex: str | None,
               mode: str, prefix: str) -> list[Sample]:
    """Create the per-thread files: ``seq*`` for (skip-)read (``wb``: sealed for cryptdisk),
    ``mut*`` for rewrite (``w+b``: mutable for cryptdisk)."""
    for t in range(threads):
        with _open(kind, os.path.join(directory, f"{prefix}{t}.dat"), mode, key_hex) as f:
            for i in range(blocks):
                f.write(_block(t, i))
    return []


def write(kind: str, directory: str, threads: int, duration: float, key_hex: str | None,
          case: str) -> list[Sample]:
    """Sequential 1 MiB writes for ``duration`` s per thread, then fdatasync (timed)."""
    written = [0] * threads

    def work(t: int) -> None:
        path = os.path.join(directory, f"new{t}.dat")
        buf = _block(t, 0)
        with _open(kind, path, "wb", key_hex) as f:  # cryptdisk: fsync + rename on close
            deadline = time.perf_counter() + duration
            i = 0
            while time.perf_counter() < deadline:
                _STAMP.pack_into(buf, 0, t, i, 0)
                f.write(buf)
                i += 1
            if kind == "plain":
                os.fdatasync(f.fileno())
        written[t] = i * BLOCK

    with Stopwatch() as sw:
        _parallel(threads, work)
    for t in range(threads):
        os.unlink(os.path.join(directory, f"new{t}.dat"))
    return [sw.rate(case, sum(written))]


def read(kind: str, directory: str, threads: int, duration: float, key_hex: str | None,
         case: str) -> list[Sample]:
    """Sequential 1 MiB reads (wrapping round) for ``duration`` s, every block verified."""
    done = [0] * threads

    def work(t: int) -> None:
        buf = bytearray(BLOCK)
        with _open(kind, os.path.join(directory, f"seq{t}.dat"), "rb", key_hex) as f:
            i = 0
            deadline = time.perf_counter() + duration
            while time.perf_counter() < deadline:
                if f.readinto(buf) != BLOCK:
                    f.seek(0)
                    i = 0
                    continue
                _check(buf, t, i)
                i += 1
                done[t] += BLOCK

    with Stopwatch() as sw:
        _parallel(threads, work)
    return [sw.rate(case, sum(done))]


def rewrite(kind: str, directory: str, threads: int, duration: float, key_hex: str | None,
            case: str) -> list[Sample]:
    """Read a 1 MiB block, verify it, write it back changed; then fdatasync (timed)."""
    done = [0] * threads

    def work(t: int) -> None:
        buf = bytearray(BLOCK)
        with _open(kind, os.path.join(directory, f"mut{t}.dat"), "r+b", key_hex) as f:
            blocks = f.seek(0, os.SEEK_END) // BLOCK
            i, gen = 0, int(time.time())
            deadline = time.perf_counter() + duration
            while time.perf_counter() < deadline:
                f.seek(i * BLOCK)
                if f.readinto(buf) != BLOCK:
                    raise DataError(f"file {t}: short read at block {i}")
                _check(buf, t, i)
                _STAMP.pack_into(buf, 0, t, i, gen)
                f.seek(i * BLOCK)
                f.write(buf)
                done[t] += 2 * BLOCK  # read + write, as vioperf counts rewrite
                i = (i + 1) % blocks
            if kind == "plain":
                os.fdatasync(f.fileno())
            else:
                f.sync()

    with Stopwatch() as sw:
        _parallel(threads, work)
    return [sw.rate(case, sum(done))]


def skip_read(kind: str, directory: str, threads: int, duration: float, key_hex: str | None,
              case: str) -> list[Sample]:
    """1 MiB reads at random block offsets (verified) for ``duration`` s: seeks per second."""
    seeks = [0] * threads

    def work(t: int) -> None:
        rng = random.Random(t)
        buf = bytearray(BLOCK)
        with _open(kind, os.path.join(directory, f"seq{t}.dat"), "rb", key_hex) as f:
            blocks = f.seek(0, os.SEEK_END) // BLOCK
            deadline = time.perf_counter() + duration
            while time.perf_counter() < deadline:
                i = rng.randrange(blocks)
                f.seek(i * BLOCK)
                if f.readinto(buf) != BLOCK:
                    raise DataError(f"file {t}: short read at block {i}")
                _check(buf, t, i)
                seeks[t] += 1

    with Stopwatch() as sw:
        _parallel(threads, work)
    sample = sw.rate(case, sum(seeks) * BLOCK, unit="seeks/s", scale=BLOCK)
    return [sample]

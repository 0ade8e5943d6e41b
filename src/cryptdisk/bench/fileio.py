"""The io experiment: Vertica's vioperf (LUKS vs plain), reproduced on files.

Four tests, each for a fixed duration with one thread per core and 1 MiB
buffers: sequential ``write`` (then fdatasync), ``rewrite`` (read a block,
write it back, then fdatasync; MB/s counts both), sequential ``read`` and
``skip-read`` (1 MiB reads at random offsets, seeks/s). Every block read is
verified. Strategies: a plain directory, cryptdisk files (sealed for write and
reads, mutable for rewrite), and gocryptfs (FUSE) when it can mount here.
"""

from __future__ import annotations

import os
from pathlib import Path

from ._gocryptfs import INSTALL, GocryptfsMount, unavailable_reason
from ._measure import process_cpu
from ._model import BenchOptions, Progress, Recorder, Skipped
from ._suite import Strategy, ensure_cleanup, interleave

__all__ = ["NOTES", "run"]

NOTES: list[str] = []
_B = "cryptdisk.bench._bodies_io:"
_TESTS = [("write", "write", False), ("rewrite", "rewrite", False),
          ("read", "read", True), ("skip-read", "skip_read", True)]


def drop_caches() -> bool:
    """Ask the kernel to drop clean page-cache pages (needs root); True if accepted."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def _drop() -> None:
    drop_caches()


def _setup(options: BenchOptions, record: Recorder) -> list[tuple[str, str, str, object]]:
    """``(name, kind, directory, daemon pid or None)`` for every strategy that can run."""
    cleanup = ensure_cleanup(options)
    out: list[tuple[str, str, str, object]] = []
    base = Path(options.workdir)
    for name, kind in (("plain", "plain"), ("cryptdisk", "cryptdisk")):
        d = base / f"io-{name}"
        d.mkdir()
        out.append((name, kind, str(d), None))
    reason = unavailable_reason()
    if reason is not None:
        record(Skipped("io", "gocryptfs", reason, INSTALL))
        return out
    try:
        mount = GocryptfsMount(cleanup, base / "io-gocryptfs")
    except Exception as exc:  # any mount failure (OSError, CalledProcessError) is a skip
        record(Skipped("io", "gocryptfs", f"mount failed: {exc}", INSTALL))
        return out
    out.append(("gocryptfs", "plain", str(mount.mountpoint), mount.pid))
    return out


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    """Run the io experiment (see the module docstring)."""
    from ._bodies_io import make_files

    NOTES.clear()
    threads = options.threads or os.cpu_count() or 1
    duration = options.pick(1.0, 10.0, options.duration)
    repeats = options.pick(3, 5, options.repeats)
    blocks = options.pick(64, 1024)
    key_hex = os.urandom(32).hex()
    targets = _setup(options, record)
    for i, (_name, kind, d, _pid) in enumerate(targets):
        progress("io: creating test files", i, len(targets))
        make_files(kind, d, threads, blocks, key_hex if kind == "cryptdisk" else None, "wb", "seq")
        make_files(kind, d, threads, blocks, key_hex if kind == "cryptdisk" else None, "w+b",
                   "mut")
    progress("io: creating test files", len(targets), len(targets))
    dropped = drop_caches()
    for case, body, is_read in _TESTS:
        strategies = []
        for name, kind, d, pid in targets:
            daemon = (lambda p=pid: process_cpu(p)) if isinstance(pid, int) else None
            strategies.append(Strategy(
                name, _B + body,
                dict(kind=kind, directory=d, threads=threads, duration=duration,
                     key_hex=key_hex if kind == "cryptdisk" else None, case=case),
                daemon, "plain", _drop if (is_read and dropped) else None))
        interleave(options, "io", strategies, record, progress, f"io: {case}", repeats)
    NOTES.extend([
        f"{threads} threads, {duration:g} s per test, 1 MiB buffers, {blocks} MiB file per "
        "thread for read/rewrite/skip-read; every block read back is checked.",
        "Page cache: writes end with fdatasync (cryptdisk: fsync on close, then an atomic "
        "rename). " + ("Before every read and skip-read run the harness wrote 3 to "
                       "/proc/sys/vm/drop_caches (accepted), so the first pass over each file "
                       "comes from the device; with a file smaller than the run's reads, "
                       "later passes hit the cache." if dropped else
                       "/proc/sys/vm/drop_caches could not be written (not root), so reads "
                       "hit the page cache: they measure the CPU path, not the device."),
        "gocryptfs: AES-256-GCM (its default), daemon CPU (psutil, user+sys) added to "
        "the benchmark's. cryptdisk: AES-256-GCM, 64 KiB segments.",
        "Published: LUKS (dm-crypt, AES-XTS) cannot run here (no device-mapper in this "
        "kernel); its published figures are in the table above.",
    ])

"""The OS page cache of a store's files: how much of them it holds, and dropping them.

A "cold" query in a fresh process may still find its files in the page cache
(they were written or read shortly before), which hides the disk entirely.
:func:`resident` says what share of a store's bytes the cache holds (Linux
``mincore`` over a read-only mapping; None where it is not available), and
:func:`drop` asks the kernel to evict a store's files (``fsync``, then
``posix_fadvise(POSIX_FADV_DONTNEED)`` per file: no root, no effect on other
files, unlike writing to ``/proc/sys/vm/drop_caches``). Pages that another
process has mapped stay; :func:`resident` after :func:`drop` says what did.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["drop", "files", "resident"]


def files(roots: Iterable[str | Path]) -> list[Path]:
    """Every regular file under ``roots`` (a root may be a file), sorted."""
    out: list[Path] = []
    for root in roots:
        p = Path(root)
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(q for q in sorted(p.rglob("*")) if q.is_file() and not q.is_symlink())
    return out


def drop(roots: Iterable[str | Path]) -> None:
    """Evict the files under ``roots`` from the OS page cache (as far as the kernel will)."""
    for path in files(roots):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)  # dirty pages are not dropped: write them first
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)


_LIBC: ctypes.CDLL | None = None


def _libc() -> ctypes.CDLL | None:
    global _LIBC
    if _LIBC is None:
        name = ctypes.util.find_library("c")
        if name is None or not hasattr(os, "posix_fadvise"):
            return None
        libc = ctypes.CDLL(name, use_errno=True)
        if not all(hasattr(libc, f) for f in ("mmap", "munmap", "mincore")):
            return None
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.mmap.restype = ctypes.c_void_p
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.POINTER(ctypes.c_ubyte)]
        _LIBC = libc
    return _LIBC


def resident(roots: Iterable[str | Path]) -> float | None:
    """The share (0..1) of the pages of the files under ``roots`` in the page cache;
    None if it cannot be told here (no ``mincore``) or there are no bytes."""
    libc = _libc()
    if libc is None:
        return None
    page = mmap.PAGESIZE
    total = cached = 0
    for path in files(roots):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            pages = -(-size // page)
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                vec = (ctypes.c_ubyte * pages)()
                if libc.mincore(addr, size, vec) != 0:
                    return None
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        total += pages
        cached += sum(v & 1 for v in bytes(vec))
    return cached / total if total else None

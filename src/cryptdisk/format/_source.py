"""Positional, thread-safe access to the encrypted bytes of a file.

A *source* reads ``n`` bytes at an absolute offset without a shared position,
so several threads (DuckDB does this) can read one file at once.
"""

from __future__ import annotations

import mmap
import os
import threading
from typing import IO, Protocol

__all__ = ["FdSource", "FileObjectSource", "MmapSource", "Source", "source_for"]


class Source(Protocol):
    size: int

    def view(self, offset: int, n: int) -> memoryview:
        """Up to ``n`` bytes at ``offset`` (fewer only at end of file)."""
        ...

    def close(self) -> None: ...


class MmapSource:
    """A read-only memory map: zero-copy views (the fastest path for local files)."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        self._mv = memoryview(self._map) if self._map is not None else memoryview(b"")

    def view(self, offset: int, n: int) -> memoryview:
        return self._mv[offset : offset + n]

    def close(self) -> None:
        self._mv.release()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still exported; the map closes when it is freed
                pass


class FdSource:
    """``os.pread`` on a file descriptor."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self._fd = fd

    def view(self, offset: int, n: int) -> memoryview:
        n = max(0, min(n, self.size - offset))
        buf = bytearray(n)
        got = os.preadv(self._fd, [buf], offset) if n else 0
        return memoryview(buf)[:got]

    def close(self) -> None:
        pass


class FileObjectSource:
    """Any seekable binary file object (fsspec files); a lock makes seek+read atomic."""

    def __init__(self, fileobj: IO[bytes], size: int | None = None) -> None:
        self._f = fileobj
        self._lock = threading.Lock()
        if size is None:
            with self._lock:
                size = fileobj.seek(0, os.SEEK_END)
        self.size = size

    def view(self, offset: int, n: int) -> memoryview:
        n = max(0, min(n, self.size - offset))
        with self._lock:
            self._f.seek(offset)
            chunks = []
            left = n
            while left > 0:
                chunk = self._f.read(left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        return memoryview(data)

    def close(self) -> None:
        pass


def source_for(fileobj: IO[bytes] | int, *, use_mmap: bool = True) -> Source:
    """The best source for an open file: mmap or pread for real files, else the file object."""
    fd: int | None
    if isinstance(fileobj, int):
        fd = fileobj
    else:
        try:
            fd = fileobj.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
    if fd is not None:
        size = os.fstat(fd).st_size
        if use_mmap and size:
            try:
                return MmapSource(fd, size)
            except (OSError, ValueError):
                pass
        return FdSource(fd, size)
    assert not isinstance(fileobj, int)
    return FileObjectSource(fileobj)

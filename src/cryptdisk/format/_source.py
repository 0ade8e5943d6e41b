"""Positional, thread-safe access to the encrypted bytes of a file.

A *source* reads ``n`` bytes at an absolute offset without a shared position,
so several threads (DuckDB does this) can read one file at once.

Files are read with ``preadv``, not memory-mapped, by default: a mapped file that
another process truncates faults with SIGBUS on the next read of a page past its new
end, which kills the whole process (a server, for every client) with no exception to
catch. ``preadv`` returns short instead, and the reader raises its clear error.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from collections.abc import Callable, Iterator
from typing import IO, Protocol, cast

__all__ = ["MMAP_MAX", "FdSource", "FileObjectSource", "MmapSource", "Source", "borrowed",
           "source_for"]

#: ``source_for(..., use_mmap=True)`` maps files up to this size (zero-copy); larger
#: ones are read with ``preadv`` into reused buffers. Mapped pages count towards RSS, so
#: readers call :meth:`MmapSource.release` on ranges they have consumed in large
#: sequential reads.
MMAP_MAX = 1 << 40
#: Reads through :meth:`FdSource.borrow` land in buffers kept idle between reads (warm
#: pages: fresh memory costs a page fault per 4 KiB, more than decrypting it), at most
#: this many of at most ``_KEEP`` bytes each.
_IDLE_MAX = 2 * (os.cpu_count() or 1) + 2
_KEEP = 16 << 20
_IDLE: list[bytearray] = []
_IDLE_LOCK = threading.Lock()


def _after_fork() -> None:  # (a fork while another thread held the lock)
    global _IDLE_LOCK
    _IDLE_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
_FAULT_AROUND = 1 << 16  # Linux's default fault_around_bytes


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (stable ABI since 3.11): how a mapping's address is found."""

    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, called through ctypes, which lets go of the GIL for the call
    (``mmap.madvise`` keeps it); None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _libc_madvise()


def _address(obj: mmap.mmap) -> int | None:
    """The address of ``obj``'s first byte (its buffer's), or None."""
    get, drop = ctypes.pythonapi.PyObject_GetBuffer, ctypes.pythonapi.PyBuffer_Release
    get.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
    get.restype = ctypes.c_int
    drop.argtypes, drop.restype = [ctypes.POINTER(_PyBuffer)], None
    view = _PyBuffer()
    try:
        if get(obj, ctypes.byref(view), 0) != 0:
            return None
    except (BufferError, TypeError, ValueError):
        return None
    try:
        addr = view.buf
        return int(addr) if addr else None
    finally:
        drop(ctypes.byref(view))


class Source(Protocol):
    size: int

    def view(self, offset: int, n: int) -> memoryview:
        """Up to ``n`` bytes at ``offset`` (fewer only at end of file)."""
        ...

    def release(self, offset: int, n: int) -> None:
        """A hint that ``[offset, offset+n)`` will not be needed soon (drop it from RSS)."""
        ...

    def willneed(self, offset: int, n: int) -> None:
        """A hint that ``[offset, offset+n)`` is about to be read (start reading it now)."""
        ...

    def close(self) -> None: ...


def borrowed(source: Source, offset: int, n: int
             ) -> contextlib.AbstractContextManager[memoryview]:
    """Up to ``n`` bytes of ``source`` at ``offset`` (fewer only at end of file), valid inside
    the ``with`` block only: the source's ``borrow`` where it has one (:class:`FdSource`:
    large reads of any thread without a buffer per thread), else its :meth:`~Source.view`."""
    borrow = getattr(source, "borrow", None)
    if borrow is not None:
        return cast("contextlib.AbstractContextManager[memoryview]", borrow(offset, n))
    return contextlib.nullcontext(source.view(offset, n))


class MmapSource:
    """A read-only memory map: zero-copy views.

    No part of cryptdisk maps files (:func:`source_for` is always called without
    ``use_mmap``): this is for callers that own the file, for files nothing truncates
    while they are mapped. A read of a page past a truncated file's new end raises
    SIGBUS, which ends the process (see the module's docstring).
    """

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ) if size else None
        self._mv = memoryview(self._map) if self._map is not None else memoryview(b"")
        self._addr = _address(self._map) if self._map is not None and _MADVISE else None

    def view(self, offset: int, n: int) -> memoryview:
        return self._mv[offset : offset + n]

    def release(self, offset: int, n: int) -> None:
        if self._map is None:
            return
        # The kernel maps up to 64 KiB of cached pages around each fault (fault-around), so
        # a read leaves its neighbours mapped too: they go with it (a later read of them
        # faults them in again, from the page cache).
        start = max(0, offset - _FAULT_AROUND)
        start -= start % mmap.PAGESIZE
        end = min(offset + n + _FAULT_AROUND, self.size)
        end -= end % mmap.PAGESIZE
        if end <= start:
            return
        # The page cache keeps the data; only this process's mapping of it goes. Through
        # libc without the GIL: dropping the few MB a scan task read takes 0.1-0.3 ms,
        # which held the GIL from the other scan thread and the one feeding DuckDB.
        self._advise(start, end, mmap.MADV_DONTNEED)

    def willneed(self, offset: int, n: int) -> None:
        # Faults on a file mapping read around them and then ahead sequentially: a scan of
        # one column's chunks spread over the file pulled the whole file from disk. Asking
        # for exactly the ranges first reads only those (one request each, in the
        # background); the faults then find the pages cached and read nothing more.
        if self._map is None or n <= 0:
            return
        start = max(0, offset) - max(0, offset) % mmap.PAGESIZE
        end = min(offset + n, self.size)
        if end > start:
            # (without the GIL too: the kernel looks up every page of the range in the page
            # cache, 9 us for a 512 KiB column chunk cached already, 153 of them in a cold
            # scan of a 10M-row BIGINT column)
            self._advise(start, end, mmap.MADV_WILLNEED)

    def _advise(self, start: int, end: int, advice: int) -> None:
        """``madvise`` of the map's bytes ``[start, end)`` (page-aligned), through libc,
        which lets go of the GIL for the call, where it can."""
        if _MADVISE is None or self._addr is None:
            assert self._map is not None
            self._map.madvise(advice, start, end - start)
            return
        try:  # an export of the map: a close meanwhile leaves it mapped until this ends
            held = self._mv[start:end]
        except ValueError:  # closed
            return
        try:
            _MADVISE(self._addr + start, end - start, advice)
        finally:
            held.release()

    def close(self) -> None:
        self._mv.release()
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still exported; the map closes when it is freed
                pass


class FdSource:
    """``os.preadv`` on a file descriptor: :meth:`view` into a reused per-thread buffer
    (a view stays valid until the same thread asks for the next one), :meth:`borrow`
    into one of a few process-wide buffers kept warm between reads.

    A file truncated under a read reads short (never a fault): the caller sees fewer
    bytes than it asked for and raises its own error.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.fd = fd
        self._local = threading.local()

    def view(self, offset: int, n: int) -> memoryview:
        n = max(0, min(n, self.size - offset))
        buf = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            buf = self._local.buf = bytearray(max(n, 1 << 16))
        got = _preadv_all(self.fd, memoryview(buf)[:n], offset) if n else 0
        return memoryview(buf)[:got]

    @contextlib.contextmanager
    def borrow(self, offset: int, n: int) -> Iterator[memoryview]:
        n = max(0, min(n, self.size - offset))
        buf = _take(n)
        try:
            got = _preadv_all(self.fd, memoryview(buf)[:n], offset) if n else 0
            yield memoryview(buf)[:got]
        finally:
            _give_back(buf)

    def release(self, offset: int, n: int) -> None:
        pass

    def willneed(self, offset: int, n: int) -> None:
        # Read ahead in the background exactly the ranges a scan is about to read (its
        # column chunks are spread over the file: the kernel's own read-ahead follows
        # the reads only once they are sequential). Without the GIL.
        if n > 0 and hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(self.fd, max(0, offset), n, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        pass


def _take(n: int) -> bytearray:
    """An idle buffer of at least ``n`` bytes, or a new one; give it back with
    :func:`_give_back` once nothing refers to it."""
    with _IDLE_LOCK:
        for i in range(len(_IDLE) - 1, -1, -1):
            if len(_IDLE[i]) >= n:
                return _IDLE.pop(i)
    return bytearray(max(n, 1 << 20))


def _give_back(buf: bytearray) -> None:
    with _IDLE_LOCK:
        if len(_IDLE) < _IDLE_MAX and len(buf) <= _KEEP:
            _IDLE.append(buf)


def _preadv_all(fd: int, out: memoryview, offset: int) -> int:
    """``preadv`` until ``out`` is full or the file ends; returns the bytes read."""
    got = 0
    while got < len(out):
        n = os.preadv(fd, [out[got:]], offset + got)
        if n <= 0:
            break
        got += n
    return got


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

    def release(self, offset: int, n: int) -> None:
        pass

    def willneed(self, offset: int, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def source_for(fileobj: IO[bytes] | int, *, use_mmap: bool = False) -> Source:
    """The source for an open file: ``preadv`` on real files, else the file object.
    ``use_mmap``: a memory map (:class:`MmapSource`), never asked for by cryptdisk itself;
    only for a file the caller owns and nothing truncates while it is read (SIGBUS)."""
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
        if use_mmap and 0 < size <= MMAP_MAX:
            try:
                return MmapSource(fd, size)
            except (OSError, ValueError):
                pass
        return FdSource(fd, size)
    assert not isinstance(fileobj, int)
    return FileObjectSource(fileobj)

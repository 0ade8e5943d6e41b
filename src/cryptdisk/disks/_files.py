"""The file objects every disk returns: positional readers and atomic writers.

:class:`PreadFile` turns a *reader* (anything with ``size``,
``readinto_at(buf, offset)``, ``read_at(offset, n)`` and ``close()``: a plain
descriptor, a :class:`cryptdisk.format.SealedReader`, a ClickHouse reader) into
a seekable ``io.RawIOBase``. Its position is kept **per thread**: DuckDB calls
``seek()`` then ``read()`` on one shared file object from several threads, and
a shared position would let one thread's seek land between another's seek and
read. ``pread`` has no position at all.

:class:`AtomicWriteFile` forwards writes to a sink and calls ``publish`` on
``close()`` or ``discard`` on ``abort()`` / an exception in a ``with`` block.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["AtomicWriteFile", "FdReader", "PreadFile", "Reader"]


class Reader(Protocol):
    size: int

    def readinto_at(self, buf: Any, offset: int) -> int: ...

    def read_at(self, offset: int, n: int) -> bytes: ...

    def close(self) -> None: ...


class FdReader:
    """Plain bytes of an open descriptor, read with ``os.preadv`` (no shared position)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.size = os.fstat(fd).st_size

    def readinto_at(self, buf: Any, offset: int) -> int:
        out = memoryview(buf).cast("B")
        total = 0
        while total < len(out):
            got = os.preadv(self._fd, [out[total:]], offset + total)
            if got == 0:
                break
            total += got
        return total

    def read_at(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        return os.pread(self._fd, n, offset) if n else b""

    def close(self) -> None:
        os.close(self._fd)


class PreadFile(io.RawIOBase):
    """A read-only, seekable binary file over a :class:`Reader` (see the module docstring)."""

    def __init__(self, reader: Reader, name: str, info: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._r = reader
        self._local = threading.local()
        self.name = name
        self.mode = "rb"
        #: What the disk knows about the file (format, key id, ...); never secrets.
        self.info = info or {}

    @property
    def size(self) -> int:
        """Plaintext size in bytes."""
        return self._r.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _pos(self) -> int:
        return getattr(self._local, "pos", 0)

    def tell(self) -> int:
        self._checkClosed()
        return self._pos()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._checkClosed()
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos(), os.SEEK_END: self._r.size}.get(whence)
        if base is None:
            raise ValueError(f"invalid whence {whence}")
        if base + offset < 0:
            raise OSError(22, "negative seek position")
        self._local.pos = base + offset
        return base + offset

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        pos = self._pos()
        n = self._r.readinto_at(buffer, pos)
        self._local.pos = pos + n
        return n

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        pos = self._pos()
        if size is None or size < 0:
            size = max(0, self._r.size - pos)
        data = self._r.read_at(pos, size)
        self._local.pos = pos + len(data)
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def pread(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` without moving any position (thread-safe)."""
        self._checkClosed()
        if offset < 0:
            raise ValueError("negative offset")
        return self._r.read_at(offset, size)

    def preadinto(self, buffer: Any, offset: int) -> int:
        """Fill ``buffer`` from ``offset`` without moving any position; returns bytes read."""
        self._checkClosed()
        return self._r.readinto_at(buffer, offset)

    def close(self) -> None:
        if not self.closed:
            try:
                self._r.close()
            finally:
                super().close()

    def __repr__(self) -> str:
        return f"<PreadFile {self.name!r} {'closed' if self.closed else 'open'}>"

    def __reduce__(self) -> Any:
        raise TypeError("open disk files cannot be pickled; reopen the path in the other process")


class AtomicWriteFile(io.RawIOBase):
    """A file being written; visible only once :meth:`close` has published it."""

    def __init__(self, write: Callable[[Any], int], publish: Callable[[], None],
                 discard: Callable[[], None], name: str) -> None:
        super().__init__()
        self._write = write
        self._publish = publish
        self._discard = discard
        self._written = 0
        # The exception being handled when the file was opened (usually None); see close().
        self._exc_at_open = sys.exc_info()[1]
        self.name = name
        self.mode = "wb"

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written

    def write(self, data: Any) -> int:
        self._checkClosed()
        n = self._write(data)
        n = len(memoryview(data).cast("B")) if n is None else n
        self._written += n
        return n

    def abort(self) -> None:
        """Discard what was written; any previous file at the path stays as it was."""
        if not self.closed:
            try:
                self._discard()
            finally:
                super().close()

    def close(self) -> None:
        """Publish the file; or discard it if an exception was raised since it was opened.

        Wrappers such as ``fsspec.open()`` close their file from ``__exit__``
        without saying whether the block failed; an exception in flight that
        was not already being handled when the file was opened is the only
        sign, and publishing half a file would break the contract. (Writing a
        whole file inside an ``except`` block still publishes it.)
        """
        if self.closed:
            return
        in_flight = sys.exc_info()[1]
        if in_flight is not None and in_flight is not self._exc_at_open:
            self.abort()
            return
        try:
            self._publish()
        except BaseException:
            self._discard()
            raise
        finally:
            super().close()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        # Never publish from the garbage collector: an unclosed file is abandoned.
        if not self.closed:
            try:
                self.abort()
            except Exception:  # noqa: S110 - best effort in a finaliser
                pass

    def __repr__(self) -> str:
        return f"<AtomicWriteFile {self.name!r} {'closed' if self.closed else 'open'}>"

    def __reduce__(self) -> Any:
        raise TypeError("open disk files cannot be pickled")

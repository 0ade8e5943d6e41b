"""The file objects every disk returns: positional readers and atomic writers.

:class:`PreadFile` turns a *reader* (anything with ``size``,
``readinto_at(buf, offset)``, ``read_at(offset, n)`` and ``close()``: a plain
descriptor, a :class:`cryptdisk.format.SealedReader`, a ClickHouse reader) into
a seekable ``io.RawIOBase``. It has one position, as any file, except that a
thread's ``seek()`` holds for that thread's next ``read()``: DuckDB calls
``seek()`` then ``read()`` on one shared file object from several threads, and
another thread's seek must not land between the two. Reads without a seek of
their own continue where the last read or seek of any thread left the file, as
pyarrow's stream readers expect when their reads hop between threads. ``pread``
has no position at all.

:class:`AtomicWriteFile` forwards writes to a sink and calls ``publish`` on
``close()`` or ``discard`` on ``abort()`` / an exception in a ``with`` block.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, Protocol, cast

from ..format import PositionalReadFile, PublishingWriteFile
from ._base import discardable

__all__ = ["AtomicWriteFile", "FdReader", "PreadFile", "Reader", "encrypting_write"]


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


class PreadFile(PositionalReadFile):
    """A read-only, seekable binary file over a :class:`Reader` (see the module docstring).

    Same as :class:`cryptdisk.format.PositionalReadFile` but a thread's seek holds
    for its own next read, and ``info`` says what the disk knows about the file.
    """

    def __init__(self, reader: Reader, name: str, info: dict[str, Any] | None = None) -> None:
        super().__init__(reader, name)
        #: Per thread: where its last seek put it, until its next read (else None).
        self._local = threading.local()
        #: What the disk knows about the file (format, key id, ...); never secrets.
        self.info = info or {}

    def _get_pos(self) -> int:
        sought: int | None = getattr(self._local, "pos", None)
        return self._pos if sought is None else sought

    def _set_pos(self, pos: int) -> None:
        # After a read (and inside seek, below): the file's one position moves on.
        self._pos = pos
        self._local.pos = None

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        pos = super().seek(offset, whence)
        self._local.pos = pos  # this thread's next read starts here, whatever others do
        return pos

    def __repr__(self) -> str:
        return f"<PreadFile {self.name!r} {'closed' if self.closed else 'open'}>"

    def __reduce__(self) -> Any:
        raise TypeError("open disk files cannot be pickled; reopen the path in the other process")


class _CountingWriter:
    """Forwards writes to a function and counts the bytes (``close`` does nothing)."""

    def __init__(self, write: Callable[[Any], int | None]) -> None:
        self._write = write
        self.written = 0

    def write(self, data: Any) -> int:
        n = self._write(data)
        n = len(memoryview(data).cast("B")) if n is None else n
        self.written += n
        return n

    def close(self) -> None:
        pass


class AtomicWriteFile(PublishingWriteFile):
    """A file being written; visible only once :meth:`close` has published it."""

    def __init__(self, write: Callable[[Any], int | None], publish: Callable[[], None],
                 discard: Callable[[], None], name: str) -> None:
        counter = _CountingWriter(write)
        super().__init__(counter, name, "wb", publish, discard, lambda: counter.written)
        # The exception being handled when the file was opened (usually None); see close().
        self._exc_at_open = sys.exc_info()[1]

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
        super().close()

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


def encrypting_write(raw: IO[bytes], path: str,
                     make_writer: Callable[[IO[bytes]], Any]) -> IO[bytes]:
    """A file that encrypts through ``make_writer(raw)`` into ``raw``, an inner disk's
    atomic file: published when both close, discarded together with ``raw``."""
    abort = discardable(raw).abort
    try:
        writer = make_writer(raw)
    except BaseException:
        abort()
        raise

    def publish() -> None:
        writer.close()
        raw.close()

    return cast("IO[bytes]", AtomicWriteFile(writer.write, publish, abort, path))

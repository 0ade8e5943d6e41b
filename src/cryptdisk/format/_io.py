"""Standard binary file objects over the format (what :func:`cryptdisk.open` returns).

They are ``io.RawIOBase`` subclasses, so pyarrow, pandas and zipfile accept
them. ``read``/``readinto`` return only authenticated plaintext.
"""

from __future__ import annotations

import errno
import io
import os
import tempfile
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import DiskError
from ._header import Header
from ._mutable import MutableStore
from ._sealed import SealedReader, SealedWriter, pack_spans

__all__ = [
    "MutableFile",
    "PositionalReadFile",
    "PublishingWriteFile",
    "SealedReadFile",
    "SealedWriteFile",
    "temp_beside",
]


def temp_beside(path: str) -> tuple[int, str]:
    """A new temporary file ``.NAME.*.cdtmp`` in ``path``'s directory: ``(fd, its path)``.

    An error names ``path`` (what the caller asked to write), not the temporary name; a
    directory at ``path`` is refused before anything is written (its rename would fail).
    """
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    try:
        return tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".cdtmp",
                                dir=os.path.dirname(os.path.abspath(path)))
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, path) from None


class _Base(io.RawIOBase):
    name: str

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} objects cannot be pickled; reopen the file by "
                        "path with cryptdisk.open in the other process")


class _Reader(Protocol):
    size: int

    def read_at(self, offset: int, n: int) -> bytes: ...

    def readinto_at(self, buf: Any, offset: int) -> int: ...

    def close(self) -> None: ...


class PositionalReadFile(_Base):
    """A read-only, seekable file over a positional reader (``size``, ``read_at``,
    ``readinto_at``); :meth:`pread` is safe across threads (no shared position).

    Subclasses may keep the position elsewhere (per thread, say) by overriding
    :meth:`_get_pos` and :meth:`_set_pos`.
    """

    def __init__(self, reader: _Reader, name: str, closer: Callable[[], None] | None = None):
        super().__init__()
        self._r = reader
        self._pos = 0
        self._closer = closer
        self.name = name
        self.mode = "rb"

    def _get_pos(self) -> int:
        return self._pos

    def _set_pos(self, pos: int) -> None:
        self._pos = pos

    @property
    def size(self) -> int:
        """Plaintext size in bytes."""
        return self._r.size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        self._checkClosed()
        return self._get_pos()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._checkClosed()
        if whence == os.SEEK_SET:
            base = 0
        elif whence == os.SEEK_CUR:
            base = self._get_pos()
        elif whence == os.SEEK_END:
            base = self._r.size
        else:
            raise ValueError(f"invalid whence {whence}")
        if base + offset < 0:
            raise OSError(22, "negative seek position")
        self._set_pos(base + offset)
        return base + offset

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        pos = self._get_pos()
        n = self._r.readinto_at(buffer, pos)
        self._set_pos(pos + n)
        return n

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        pos = self._get_pos()
        if size is None or size < 0:
            size = max(0, self._r.size - pos)
        data = self._r.read_at(pos, size)
        self._set_pos(pos + len(data))
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def write(self, data: Any) -> int:
        raise io.UnsupportedOperation("this file is open read-only")

    def pread(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` without moving the position (safe across threads)."""
        self._checkClosed()
        if offset < 0:
            raise ValueError("negative offset")
        return self._r.read_at(offset, size)

    def preadinto(self, buffer: Any, offset: int, **options: Any) -> int:
        """Fill ``buffer`` from ``offset`` without moving the position; returns bytes read.

        ``options`` go to the reader (a sealed file's: ``advise``, ``parallel``, see
        :meth:`SealedReader.readinto_at`); readers of other formats take none.
        """
        self._checkClosed()
        if options:
            return self._r.readinto_at(buffer, offset, **options)
        return self._r.readinto_at(buffer, offset)

    def preadspans(self, buffer: Any, offset: int, spans: list[tuple[int, int]]) -> int:
        """``len(buffer)`` bytes from ``offset`` into ``buffer``, then ``spans`` (``(a, b)``
        file offsets inside them, in order, not overlapping) packed at its start; returns
        the packed bytes. A sealed file's reader does it in one call
        (:meth:`SealedReader.readinto_spans`); other readers read, then pack."""
        self._checkClosed()
        packed = getattr(self._r, "readinto_spans", None)
        if packed is not None:
            return int(packed(buffer, offset, spans))
        out = memoryview(buffer).cast("B")
        if self._r.readinto_at(out, offset) != len(out):
            raise ValueError(f"[{offset}, {offset + len(out)}) is not inside the file")
        return pack_spans(out, offset, spans)

    def advise(self, offset: int, n: int, need: bool) -> None:
        """A hint that ``[offset, offset+n)`` is about to be read (``need``) or was read;
        nothing if the reader takes no hints (see :meth:`SealedReader.advise`)."""
        self._checkClosed()
        hint = getattr(self._r, "advise", None)
        if hint is not None:
            hint(offset, n, need)

    def close(self) -> None:
        if not self.closed:
            try:
                self._r.close()
                if self._closer is not None:
                    self._closer()
            finally:
                super().close()


class SealedReadFile(PositionalReadFile):
    """A sealed file open for reading: seekable, random access, thread-safe :meth:`pread`.

    Every byte returned has authenticated.
    """

    _r: SealedReader

    def __init__(self, reader: SealedReader, name: str, closer: Callable[[], None] | None = None):
        super().__init__(reader, name, closer)

    @property
    def header(self) -> Header:
        return self._r.header

    def verify(self, progress: Callable[[int], None] | None = None) -> int:
        """Authenticate every segment of the file; returns its plaintext size."""
        return self._r.verify(progress)


class _Writer(Protocol):
    def write(self, data: Any) -> int: ...

    def close(self) -> None: ...


class _OwnedFd(io.RawIOBase):
    """A descriptor that only the process that opened it writes (see :func:`owned_file`)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd
        self._pid = os.getpid()

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data: Any) -> int:
        if os.getpid() != self._pid:  # a forked child's copy: the file is the parent's
            return len(memoryview(data).cast("B"))
        return os.write(self._fd, data)

    def close(self) -> None:
        if not self.closed:
            try:
                os.close(self._fd)  # (a child closes its own copy of the descriptor)
            finally:
                super().close()


def owned_file(fd: int, buffering: int = io.DEFAULT_BUFFER_SIZE) -> io.BufferedWriter:
    """A buffered writer over ``fd`` (which it closes) whose buffer reaches the file only
    in the process that opened it: a child forked while it was written (multiprocessing,
    Dask, a server's workers) that drops its copy, which flushes the buffer, must not
    write the parent's buffered bytes into the parent's file a second time."""
    return io.BufferedWriter(_OwnedFd(fd), buffering)


class PublishingWriteFile(_Base):
    """A forward-only file whose ``close()`` publishes what was written.

    ``publish`` runs after the writer closes (for paths: fsync, then an atomic
    rename over the destination). Leaving a ``with`` block by an exception, or
    calling :meth:`abort`, runs ``discard`` instead, so the destination keeps
    its old content.
    """

    def __init__(self, writer: _Writer, name: str, mode: str, publish: Callable[[], None],
                 discard: Callable[[], None], position: Callable[[], int]) -> None:
        super().__init__()
        self._w = writer
        self._publish = publish
        self._discard = discard
        self._position = position
        self.name = name
        self.mode = mode
        # A child forked while the file is written (multiprocessing, Dask, a server's
        # workers) has a copy of this object: the file and its temporary are the
        # parent's, which the child must neither discard nor publish.
        self._pid = os.getpid()

    def writable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        raise io.UnsupportedOperation("a file being written cannot be read")

    def readinto(self, buffer: Any) -> int:
        raise io.UnsupportedOperation("a file being written cannot be read")

    def tell(self) -> int:
        """Plaintext bytes written so far."""
        return self._position()

    def write(self, data: Any) -> int:
        self._checkClosed()
        return self._w.write(data)

    def abort(self) -> None:
        """Discard what this file object wrote (in a forked child: only its copy)."""
        if not self.closed:
            try:
                if os.getpid() == self._pid:
                    self._discard()
            finally:
                super().close()

    def close(self) -> None:
        if self.closed:
            return
        if os.getpid() != self._pid:
            super().close()
            raise DiskError(f"{self.name}: a file being written by process {self._pid} "
                            "is not published by a process it forked; its copy is closed, "
                            "the file is left to the writer")
        try:
            self._w.close()
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


class SealedWriteFile(PublishingWriteFile):
    """A sealed file being written: a forward-only stream, published atomically on close."""

    def __init__(self, writer: SealedWriter, name: str, publish: Callable[[], None],
                 discard: Callable[[], None]) -> None:
        super().__init__(writer, name, "wb", publish, discard, lambda: writer.plaintext_size)


class MutableFile(PositionalReadFile):
    """A mutable file: read, write, seek and truncate anywhere; ``pread``/``pwrite`` too."""

    _r: MutableStore

    def __init__(self, store: MutableStore, fd: int, name: str, mode: str,
                 append: bool = False, also_close: Callable[[], None] | None = None) -> None:
        def closer() -> None:
            try:
                os.close(fd)
            finally:
                if also_close is not None:
                    also_close()

        super().__init__(store, name, closer=closer)
        self._set_pos(store.size if append else 0)
        self._append = append
        self.mode = mode

    @property
    def header(self) -> Header:
        return self._r.header

    def writable(self) -> bool:
        return self._r.writable

    def fileno(self) -> int:
        raise io.UnsupportedOperation("the descriptor of an encrypted file holds ciphertext")

    def _check_writable(self) -> None:
        self._checkClosed()
        if not self._r.writable:
            raise io.UnsupportedOperation("file is open read-only")

    def write(self, data: Any) -> int:
        self._check_writable()
        if self._append:
            self._set_pos(self._r.size)
        pos = self._get_pos()
        n = self._r.pwrite(data, pos)
        self._set_pos(pos + n)
        return n

    def truncate(self, size: int | None = None) -> int:
        self._check_writable()
        size = self._get_pos() if size is None else size
        self._r.truncate(size)
        return size

    def pwrite(self, data: Any, offset: int) -> int:
        self._check_writable()
        return self._r.pwrite(data, offset)

    def verify(self, progress: Callable[[int], None] | None = None) -> int:
        """Authenticate every segment of the file; returns its plaintext size."""
        self._checkClosed()
        layout = self._r.layout
        buf = memoryview(bytearray(layout.largest))
        offset = 0  # one segment per read: offset is always where a segment starts
        while n := self._r.readinto_at(buf[: layout.capacity(layout.locate(offset)[0])], offset):
            offset += n
            if progress is not None:
                progress(n)
        return offset

    def flush(self) -> None:
        """Writes go straight to the OS; nothing is buffered here."""

    def sync(self) -> None:
        """fsync the underlying file."""
        self._checkClosed()
        self._r.sync()

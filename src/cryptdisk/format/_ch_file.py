"""Opening ClickHouse encrypted files by path: binary file objects over the CTR stream."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from .._durable import fsync_path
from ..errors import KeyNotFoundError
from ._ch_header import (
    CH_HEADER_SIZE,
    CHAlgorithm,
    CHHeader,
    clickhouse_fingerprint,
    clickhouse_v1_key_hash,
)
from ._ch_stream import CHReader, CHWriter, check_key
from ._io import PositionalReadFile, PublishingWriteFile, temp_beside
from ._source import source_for

__all__ = ["CHReadFile", "CHWriteFile", "EmptyCHReader", "ch_append", "ch_key_finder",
           "open_clickhouse"]

KeyFor = Callable[[CHHeader], bytes]
_Key = bytes | bytearray | memoryview


class EmptyCHReader:
    """The reader of a 0-byte file (ClickHouse writes empty files without a header)."""

    size = 0
    header = None

    def read_at(self, offset: int, n: int) -> bytes:
        return b""

    def readinto_at(self, buf: Any, offset: int) -> int:
        return 0

    def close(self) -> None:
        pass


class CHReadFile(PositionalReadFile):
    """A ClickHouse file open for reading: seekable, with thread-safe :meth:`pread`.

    ``header`` is ``None`` for an empty (0-byte) file, which ClickHouse writes
    without a header. Nothing read here is authenticated.
    """

    def __init__(self, reader: CHReader | None, name: str,
                 closer: Callable[[], None] | None = None) -> None:
        super().__init__(reader if reader is not None else EmptyCHReader(), name, closer)

    @property
    def header(self) -> CHHeader | None:
        header: CHHeader | None = getattr(self._r, "header", None)
        return header

    def __reduce__(self) -> Any:
        raise TypeError("CHReadFile objects cannot be pickled; reopen the file by path with "
                        "open_clickhouse in the other process")


class CHWriteFile(PublishingWriteFile):
    """A ClickHouse file being written ("wb": published atomically on close; "ab": appended).

    Leaving a ``with`` block by an exception, or :meth:`abort`, discards what
    was written: the temporary file of "wb", the appended tail of "ab".
    """

    def __init__(self, writer: CHWriter, name: str, mode: str, publish: Callable[[], None],
                 discard: Callable[[], None]) -> None:
        super().__init__(writer, name, mode, publish, discard, lambda: writer.position)
        self._ch_writer = writer

    @property
    def header(self) -> CHHeader:
        return self._ch_writer.header

    def __reduce__(self) -> Any:
        raise TypeError("CHWriteFile objects cannot be pickled")


def ch_key_finder(keys: Mapping[int, _Key]) -> KeyFor:
    """A ``key_for`` that finds a key by fingerprint (v2) or by id and key hash (v1).

    ``keys`` maps key ids to key bytes, as a ClickHouse disk config does.
    The returned callable raises :class:`KeyNotFoundError` naming the
    fingerprint or id (never a key).
    """
    by_fp: dict[bytes | None, bytes] = {clickhouse_fingerprint(k): bytes(k) for k in keys.values()}
    by_id: dict[tuple[int | None, int | None], bytes] = {
        (i, clickhouse_v1_key_hash(k)): bytes(k) for i, k in keys.items()}

    def key_for(header: CHHeader) -> bytes:
        if header.version == 2 and header.key_fingerprint in by_fp:
            return by_fp[header.key_fingerprint]
        if header.version == 1 and (header.key_id, header.v1_key_hash) in by_id:
            return by_id[(header.key_id, header.v1_key_hash)]
        raise KeyNotFoundError(f"no configured key has the file's {header.describe_key()}",
                               key_id=header.key_id,
                               hint="add the key that wrote the file to the disk's keys")
    return key_for


def _resolve_key(header: CHHeader, key: _Key | None, key_for: KeyFor | None, name: str) -> bytes:
    if key_for is not None:
        try:
            found = key_for(header)
        except KeyNotFoundError as exc:
            if exc.path is not None:
                raise
            raise KeyNotFoundError(f"{name}: {exc}", key_id=exc.key_id, path=name,
                                   hint=exc.hint) from None
        if found is None:
            raise KeyNotFoundError(f"{name}: no key for the file's {header.describe_key()}",
                                   key_id=header.key_id, path=name)
        key = found
    if key is None:
        raise TypeError("reading a ClickHouse file needs key= or key_for=")
    check_key(header, key, name)
    return bytes(key)


def _fsync_dir(path: str) -> None:
    """Make the name ``path`` durable (an ``fsync`` of its directory; an ``OSError``
    propagates: the file is in place but may not survive a crash of the machine)."""
    fsync_path(os.path.dirname(os.path.abspath(path)) or ".")


def _open_read(name: str, key: _Key | None, key_for: KeyFor | None) -> CHReadFile:
    fd = os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            os.close(fd)
            return CHReadFile(None, name)
        header = CHHeader.parse(os.pread(fd, CH_HEADER_SIZE, 0), name)
        k = _resolve_key(header, key, key_for, name)
        source = source_for(fd)
        reader = CHReader(source, header, k, name)
        return CHReadFile(reader, name, closer=lambda: os.close(fd))
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def _open_write(name: str, key: _Key | None, algorithm: str | int | CHAlgorithm | None,
                iv: bytes | None) -> CHWriteFile:
    if key is None:
        raise TypeError("writing a ClickHouse file needs key= (the disk's current key)")
    fd, tmp = temp_beside(name)
    raw = os.fdopen(fd, "wb", buffering=0)
    try:
        writer = CHWriter(raw, key, algorithm, iv=iv)
    except BaseException:
        raw.close()
        os.unlink(tmp)
        raise

    def publish() -> None:
        os.fsync(raw.fileno())
        raw.close()
        os.replace(tmp, name)
        _fsync_dir(name)

    def discard() -> None:
        raw.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)

    return CHWriteFile(writer, name, "wb", publish, discard)


def _open_append(name: str, key: _Key | None, key_for: KeyFor | None,
                 algorithm: str | int | CHAlgorithm | None, iv: bytes | None) -> CHWriteFile:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0),
                 0o600)
    raw = os.fdopen(fd, "ab", buffering=0)
    try:
        start = os.fstat(fd).st_size
        if start == 0:
            if key is None:
                raise TypeError(f"{name} is empty: appending starts a new file and needs key=")
            writer = CHWriter(raw, key, algorithm, iv=iv)
        else:
            with open(name, "rb") as f:
                header = CHHeader.parse(f.read(CH_HEADER_SIZE), name)
            writer = CHWriter.resume(raw, _resolve_key(header, key, key_for, name), header,
                                     max(0, start - CH_HEADER_SIZE))
    except BaseException:
        raw.close()
        raise

    def publish() -> None:
        os.fsync(raw.fileno())
        raw.close()

    def discard() -> None:
        try:
            os.ftruncate(raw.fileno(), start)
        finally:
            raw.close()

    return CHWriteFile(writer, name, "ab", publish, discard)


def open_clickhouse(path: str | os.PathLike[str], mode: str = "rb", *, key: _Key | None = None,
                    key_for: KeyFor | None = None,
                    algorithm: str | int | CHAlgorithm | None = None,
                    iv: bytes | None = None) -> CHReadFile | CHWriteFile:
    """Open a file in ClickHouse's encrypted-disk format.

    - ``"rb"``: a seekable reader. The key is ``key_for(header)`` (e.g.
      :func:`ch_key_finder`) or ``key``; either way it is checked against the
      header's fingerprint (:class:`WrongKeyError` if it differs).
    - ``"wb"``: a new file (fresh random IV unless ``iv``) under ``key`` with
      ``algorithm`` (default: from the key length), written to
      ``.NAME.*.cdtmp`` beside ``path``, fsynced and renamed on close.
    - ``"ab"``: continue an existing file's stream with its own header and
      IV (the key from ``key_for`` or ``key``), or start a new one with ``key``.
      Data is appended in place (as ClickHouse does); an exception inside the
      ``with`` block truncates it back. Concurrent appenders are not locked out.

    The format is unauthenticated: tampering is not detected (``docs/clickhouse.md``).
    """
    name = os.fspath(path)
    if mode == "rb":
        return _open_read(name, key, key_for)
    if mode == "wb":
        return _open_write(name, key, algorithm, iv)
    if mode == "ab":
        return _open_append(name, key, key_for, algorithm, iv)
    raise ValueError(f"mode must be 'rb', 'wb' or 'ab', not {mode!r}")


def ch_append(path: str | os.PathLike[str], key: _Key, data: bytes | bytearray | memoryview,
              *, algorithm: str | int | CHAlgorithm | None = None) -> int:
    """Append ``data`` to a ClickHouse file as ClickHouse does; returns the new plaintext size."""
    with open_clickhouse(path, "ab", key=key, algorithm=algorithm) as f:
        assert isinstance(f, CHWriteFile)
        f.write(data)
        return f.tell()

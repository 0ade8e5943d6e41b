"""Opening encrypted files by path: the safe, top-tier entry to the format."""

from __future__ import annotations

import contextlib
import os
from typing import IO, Literal, overload

from ..errors import ImmutableFileError
from ._cipher import Algorithm
from ._header import HEADER_SIZE, Header, Kind, new_header
from ._io import MutableFile, SealedReadFile, SealedWriteFile, owned_file, temp_beside
from ._mutable import MutableStore
from ._protocols import KeyLookup
from ._reread import read_open_header
from ._sealed import SealedReader, SealedWriter
from ._source import source_for
from ._tail import LOG_SUFFIX, TailSave, remove_tail

__all__ = ["DEFAULT_SEGMENT_SIZE", "open_file", "open_log", "read_header"]

DEFAULT_SEGMENT_SIZE = 64 * 1024
_MODES = {"rb", "wb", "xb", "r+b", "w+b", "x+b", "ab", "a+b"}


def read_header(fileobj: IO[bytes] | int, path: str | None = None) -> Header:
    """Parse (not authenticate) the header at the start of an open file."""
    if isinstance(fileobj, int):
        data = os.pread(fileobj, HEADER_SIZE, 0)
    else:
        fileobj.seek(0)
        data = fileobj.read(HEADER_SIZE)
    return Header.parse(data, path)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_sealed_writer(path: str, mode: str, keys: KeyLookup, algorithm: Algorithm | None,
                        segment_size: int) -> SealedWriteFile:
    if mode == "xb" and os.path.lexists(path):
        raise FileExistsError(17, "file exists", path)
    header, dek = new_header(Kind.SEALED, keys.current_key(), algorithm=algorithm,
                             segment_size=segment_size)
    fd, tmp = temp_beside(path)
    raw = owned_file(fd, 1 << 20)  # fewer, larger write syscalls
    try:
        writer = SealedWriter(raw, header, dek)
    except BaseException:
        raw.close()
        os.unlink(tmp)
        raise

    def publish() -> None:
        raw.flush()
        os.fsync(raw.fileno())
        raw.close()
        if mode == "xb":
            os.link(tmp, path)  # fails if the destination appeared meanwhile
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
        _fsync_dir(path)
        # A log's saved last segment (if a log was there) belongs to the file replaced.
        remove_tail(path, LOG_SUFFIX)

    def discard() -> None:
        discard_temp(raw, tmp)

    return SealedWriteFile(writer, path, publish, discard)


def discard_temp(raw: IO[bytes], tmp: str) -> None:
    """Close ``raw``, the temporary file ``tmp`` being written, and delete it: closing
    flushes the buffer, which on a full disk fails again (the descriptor is closed all
    the same), and the temporary file must go whatever it says."""
    try:
        with contextlib.suppress(OSError):
            raw.close()
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


ReadMode = Literal["rb"]
SealedMode = Literal["wb", "xb"]
MutableMode = Literal["r+b", "w+b", "x+b", "ab", "a+b"]


@overload
def open_file(path: str | os.PathLike[str], mode: ReadMode = ..., *, keys: KeyLookup,
              algorithm: str | Algorithm | None = ...,
              segment_size: int = ...) -> SealedReadFile | MutableFile: ...
@overload
def open_file(path: str | os.PathLike[str], mode: SealedMode, *, keys: KeyLookup,
              algorithm: str | Algorithm | None = ...,
              segment_size: int = ...) -> SealedWriteFile: ...
@overload
def open_file(path: str | os.PathLike[str], mode: MutableMode, *, keys: KeyLookup,
              algorithm: str | Algorithm | None = ...,
              segment_size: int = ...) -> MutableFile: ...
@overload
def open_file(path: str | os.PathLike[str], mode: str, *, keys: KeyLookup,
              algorithm: str | Algorithm | None = ...,
              segment_size: int = ...) -> SealedReadFile | SealedWriteFile | MutableFile: ...


def open_file(
    path: str | os.PathLike[str],
    mode: str = "rb",
    *,
    keys: KeyLookup,
    algorithm: str | Algorithm | None = None,
    segment_size: int = DEFAULT_SEGMENT_SIZE,
) -> SealedReadFile | SealedWriteFile | MutableFile:
    """Open an encrypted file. See :func:`cryptdisk.open` for the modes."""
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {sorted(_MODES)}, not {mode!r} (binary only)")
    if not isinstance(keys, KeyLookup):
        raise TypeError("keyring must be a cryptdisk.Keyring (or implement KeyLookup)")
    name = os.fspath(path)
    alg = Algorithm.parse(algorithm) if algorithm is not None else None
    if mode in ("wb", "xb"):
        return _open_sealed_writer(name, mode, keys, alg, segment_size)
    if mode == "rb":
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            header, dek = read_open_header(lambda: os.pread(fd, HEADER_SIZE, 0), keys, name)
            if header.kind == Kind.SEALED:
                source = source_for(fd)
                keep = fd
                return SealedReadFile(SealedReader(source, header, dek, name), name,
                                      closer=lambda: os.close(keep))
            store = MutableStore(fd, header, dek, name, recover=TailSave(name, LOG_SUFFIX))
            return MutableFile(store, fd, name, mode)
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
    return _open_mutable(name, mode, keys, alg, segment_size)


def open_log(path: str | os.PathLike[str], *, keys: KeyLookup,
             durable: bool = True) -> MutableFile:
    """Open (create) an append-only log: a mutable file opened ``"ab"`` whose writes keep
    every earlier byte through a crash.

    Before each write the record of the segment it rewrites (or an empty record of
    the fresh segment it begins) is saved, synced, in ``<path>-cdlogtail``; a write
    killed half done is undone from it when the file is next opened, by any mode
    (see :class:`MutableStore`).

    ``durable``: the copy is synced before the rewrite and the log before the copy
    is replaced (two ``fdatasync`` calls per write), so a power cut cannot tear
    earlier lines either; without it a killed process cannot, and writes cost no sync.
    """
    return _open_mutable(os.fspath(path), "ab", keys, None, DEFAULT_SEGMENT_SIZE, log=True,
                         durable=durable)


def _open_mutable(name: str, mode: str, keys: KeyLookup, alg: Algorithm | None,
                  segment_size: int, log: bool = False, durable: bool = True) -> MutableFile:
    create = mode[0] in "wxa"
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
    if mode[0] == "x":
        flags |= os.O_CREAT | os.O_EXCL
    elif create:
        flags |= os.O_CREAT
    fd = os.open(name, flags, 0o600)
    try:
        size = os.fstat(fd).st_size
        if mode[0] in "wx" or size == 0:
            header, dek = new_header(Kind.MUTABLE, keys.current_key(), algorithm=alg,
                                     segment_size=segment_size)
            os.ftruncate(fd, 0)
            os.pwrite(fd, header.to_bytes(), 0)
        else:
            def updatable(parsed: Header) -> None:
                if parsed.kind not in Kind.WRITABLE:
                    raise ImmutableFileError(
                        f"{name}: sealed files are written once and cannot be opened for "
                        "update",
                        hint="open it with 'wb' to replace it, or create a mutable file with "
                        "'w+b'",
                    )

            header, dek = read_open_header(lambda: os.pread(fd, HEADER_SIZE, 0), keys, name,
                                           check=updatable)
        saved = TailSave(name, LOG_SUFFIX, sync=durable)
        store = MutableStore(fd, header, dek, name, writable=True,
                             recover=saved if size and mode[0] not in "wx" else None,
                             tail=saved if log else None, save_appends=log)
        if not log:  # its writes would not keep the copy current: a later crash must not
            remove_tail(name, LOG_SUFFIX)  # roll them back to it
        return MutableFile(store, fd, name, mode, append=mode[0] == "a",
                           also_close=saved.close if log else None)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise

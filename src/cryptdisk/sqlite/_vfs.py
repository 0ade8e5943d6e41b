"""The encrypting apsw VFS: every file SQLite writes goes through cryptdisk's mutable format.

- **Main database** (and temporary databases): segment size = the page size,
  taken from the first page SQLite writes, so a page write is one segment:
  one ``encrypt_into``, one ``pwrite``, no read-modify-write.
- **Rollback journal, WAL, statement journals**: SQLite writes these in small
  pieces (a 4-byte page number, the page, a 4-byte checksum; a 24-byte frame
  header, then the page). Contiguous writes are gathered in memory and sealed
  in whole segments when SQLite needs them on disk: before any read of the
  file, its size, sync or close; for the rollback journal also before the
  database file itself is written; for the WAL right after each commit frame
  (before SQLite publishes the commit in the wal-index), so a transaction
  SQLite reports committed is in the file even with ``synchronous=OFF``.
- **The -shm wal-index** is not encrypted (SQLite maps it as plain memory) and
  not on disk: apsw passes the xShm methods to the base VFS, which is
  ``cryptdisk-plain`` from the C extension (``csrc/cryptdisk_vfs/shm.c``), so
  the index is in ``$CRYPTDISK_SHM_DIR`` (``/dev/shm``) as with the C VFS.
  Without the C extension it stays with SQLite's default VFS, beside the
  database (docs/sqlite-vfs.md, "The wal-index").

``xFileControl`` is not overridden, so SQLite's frequent file controls (lock
timeouts, several per transaction) stay in C. One consequence: do not set
``SQLITE_FCNTL_CHUNK_SIZE`` on these files, since the default VFS would then
extend the raw file with zeros on size hints.

Locks are the default VFS's, on its own descriptor of the same file; I/O uses
a shared descriptor per file (see :mod:`._fds`). Authentication failures raise
:class:`PageAuthenticationError` (SQLite sees ``SQLITE_CORRUPT``; the
application gets the exception itself, naming the file and offset).
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import apsw

from .._sqlitefiles import JOURNAL_MAGIC
from ..errors import SegmentAuthenticationError
from ..format import HEADER_SIZE, Header, MutableStore
from ..format import KeyLookup as _KeyLookup
from . import _fds
from ._errors import PageAuthenticationError, PageSizeError, PageTruncatedError
from ._header import header_and_key
from ._native import plain_base
from ._tail import TailSave, remove_tail

__all__ = ["EncryptedFile", "EncryptedVFS", "segment_size_for"]

MAIN, JOURNAL, WAL, TEMP = "main", "journal", "wal", "temp"
log = logging.getLogger("cryptdisk.sqlite")
_FLUSH_AT = 1 << 20  # seal gathered journal/WAL bytes once this many are pending
_MAIN_FLAGS = apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_TEMP_DB | apsw.SQLITE_OPEN_TRANSIENT_DB
_counter = itertools.count(1)
_T = TypeVar("_T")

WAL_HEADER = 32
WAL_FRAME_HEADER = 24
JOURNAL_RECORD_EXTRA = 8  # page number before the page, checksum after it
_POWERSAFE_OVERWRITE = int(apsw.mapping_device_characteristics["SQLITE_IOCAP_POWERSAFE_OVERWRITE"])
_SAFE_APPEND = int(apsw.mapping_device_characteristics["SQLITE_IOCAP_SAFE_APPEND"])
_IOERR_READ, _IOERR_WRITE, _IOERR_FSYNC, _IOERR_FSTAT, _IOERR_TRUNCATE, _IOERR_CLOSE = (
    int(apsw.mapping_extended_result_codes[f"SQLITE_IOERR_{op}"])
    for op in ("READ", "WRITE", "FSYNC", "FSTAT", "TRUNCATE", "CLOSE"))
_FULL = int(apsw.mapping_result_codes["SQLITE_FULL"])


def _pow2(n: int) -> int:
    return min(max(512, 1 << max(n - 1, 1).bit_length()), 1 << 16)


def _wal_page(kind: str, head: bytes) -> int:
    """The page size in a WAL header SQLite writes first, or 0."""
    if kind == WAL and len(head) >= 12 and head[:3] == b"\x37\x7f\x06":
        return int.from_bytes(head[8:12], "big")
    return 0


def _journal_sizes(kind: str, head: bytes) -> tuple[int, int]:
    """``(sector size, page size)`` in a rollback journal's header, or ``(0, 0)``.

    SQLite writes the magic as zeros first unless synchronous=OFF, and the real
    magic once the records are synced.
    """
    if kind == JOURNAL and len(head) >= 28 and head[:8] in (JOURNAL_MAGIC, bytes(8)):
        return int.from_bytes(head[20:24], "big"), int.from_bytes(head[24:28], "big")
    return 0, 0


def framing(kind: str, first: bytes | bytearray | memoryview, offset: int) -> tuple[int, int]:
    """``(lead, frame_extra)`` of a new file: a record per frame for WALs and journals.

    A WAL is a 32-byte header, then frames of a 24-byte header and a page; a
    rollback journal is a header padded to its sector size (bytes 20-23 of the
    header), then records of page number, page and checksum. As framed files
    (``docs/format.md``, kind 3) each frame or record is one AES-GCM record:
    appending never rewrites a record holding earlier bytes, each page is
    sealed once, and SQLite need not pad WAL commits (the database file claims
    power-safe overwrite; see ``xDeviceCharacteristics``). Anything else, or
    a header that does not parse, gets a mutable file (kind 2).
    """
    head = bytes(first[:28]) if offset == 0 else b""
    if _wal_page(kind, head):
        return WAL_HEADER, WAL_FRAME_HEADER
    sector, page = _journal_sizes(kind, head)
    fits = sector <= min(0xFFFF, page + JOURNAL_RECORD_EXTRA)
    if sector and _pow2(sector) == sector and _pow2(page) == page and fits:
        return sector, JOURNAL_RECORD_EXTRA
    return 0, 0


def segment_size_for(kind: str, first: bytes | bytearray | memoryview, offset: int) -> int:
    """The segment size for a new file, from the first bytes SQLite writes to it."""
    head = bytes(first[:32]) if offset == 0 else b""
    page = 0
    if kind == MAIN and head.startswith(b"SQLite format 3\0"):
        raw = int.from_bytes(head[16:18], "big")
        page = 65536 if raw == 1 else raw
    elif kind == MAIN and offset == 0:
        page = len(first)
    else:
        page = _wal_page(kind, head) or _journal_sizes(kind, head)[1]
    if page and page & (page - 1) == 0 and 512 <= page <= 65536:
        return page
    return 4096 if page == 0 else _pow2(page)


class EncryptedVFS(apsw.VFS):
    """An apsw VFS that encrypts and authenticates every file SQLite writes.

    Use :func:`cryptdisk.sqlite.connect` rather than this class. The VFS name
    is ``cryptdisk-N``; it names no key, and ``repr`` shows only the name.
    This is the reference implementation; :class:`._native.NativeVFS` writes
    the same files from C, and is what ``connect`` uses when it was built.
    """

    def __init__(self, keyring: _KeyLookup, name: str | None = None) -> None:
        if not isinstance(keyring, _KeyLookup):
            raise TypeError("keyring must be a cryptdisk.Keyring")
        self.vfs_name = name or f"cryptdisk-{next(_counter)}"
        self.keyring = keyring
        self.journals: dict[str, EncryptedFile] = {}
        self.lock = threading.Lock()
        self.base = plain_base()  # the WAL index off the disk, as the C VFS keeps it
        super().__init__(self.vfs_name, self.base)

    def xOpen(self, name: Any, flags: list[int]) -> EncryptedFile:
        return EncryptedFile(self, name, flags)

    def xSleep(self, microseconds: int) -> int:
        """Sleep without the GIL: SQLite's busy handler sleeps here while another
        connection holds a lock, and the holder, in another thread of this process,
        needs the GIL for every call into this VFS. (apsw's default forwards to the
        base VFS with the GIL held, so each waiting thread would stall the holder.)"""
        time.sleep(microseconds / 1e6)
        return microseconds

    def xDelete(self, filename: str, syncdir: bool) -> None:
        super().xDelete(filename, syncdir)
        if filename.endswith(("-journal", "-wal")):
            remove_tail(filename)

    def __repr__(self) -> str:
        return f"<EncryptedVFS {self.vfs_name!r}>"

    def __reduce__(self) -> Any:
        raise TypeError("an EncryptedVFS cannot be pickled; register one per process")


class EncryptedFile(apsw.VFSFile):
    """One file SQLite opened through :class:`EncryptedVFS` (see the module docstring)."""

    def __init__(self, vfs: EncryptedVFS, name: Any, flags: list[int]) -> None:
        inflags = flags[0]
        super().__init__(vfs.base, name, flags)
        self._vfs = vfs
        self._store: MutableStore | None = None
        self._buf = bytearray()  # what xRead returns a view of (SQLite copies it)
        self._tail: TailSave | None = None  # the store's -cdtail side file, if any
        self._pend = bytearray()
        self._pend_start = 0
        self._write_through = False
        self._fd_key: tuple[int, int] | None = None
        self._journal_of: str | None = None
        self._reused = False  # set below: whether the file had a header at open
        if name is None:
            self.path = "<temporary file>"
            self._kind = MAIN if inflags & _MAIN_FLAGS else TEMP
            self._fd = _anonymous_file()
        else:
            self.path = name.filename() if isinstance(name, apsw.URIFilename) else str(name)
            if inflags & _MAIN_FLAGS:
                self._kind = MAIN
            elif inflags & apsw.SQLITE_OPEN_WAL:
                self._kind = WAL
            elif inflags & apsw.SQLITE_OPEN_MAIN_JOURNAL:
                self._kind = JOURNAL
            else:
                self._kind = TEMP
            writable = not inflags & apsw.SQLITE_OPEN_READONLY
            try:
                self._fd, self._fd_key = _fds.acquire(self.path, writable)
            except BaseException:
                super().xClose()
                raise
            if self._kind == JOURNAL and self.path.endswith("-journal"):
                self._journal_of = self.path[: -len("-journal")]
                vfs.journals[self._journal_of] = self
        self._gather = self._kind != MAIN
        try:
            store = self._load()
        except BaseException:
            self.xClose()
            raise
        self._reused = store is not None

    def __repr__(self) -> str:
        return f"<EncryptedFile {self._kind} {self.path!r}>"

    # -- header ------------------------------------------------------------------

    def _load(self) -> MutableStore | None:
        """Open the store if the file has a header (another process may have written it)."""
        if self._store is None and os.fstat(self._fd).st_size > 0:
            fd = self._fd
            raw, dek = header_and_key(self._vfs.keyring, self.path,
                                      lambda: os.pread(fd, HEADER_SIZE, 0), 0)
            self._store = self._new_store(raw, dek)
        return self._store

    def _new_store(self, raw: bytes, dek: bytes) -> MutableStore:
        """The file's record store: shared with other processes, and for journals and WALs
        with a -cdtail side file, a torn record reading as zeros (see _tail.py)."""
        tail = self._tail = TailSave(self.path) if self._kind in (JOURNAL, WAL) else None
        return MutableStore(self._fd, Header.parse(raw), dek, self.path, writable=True,
                            shared=True, tail=tail, torn_as_hole=tail is not None, logger=log)

    def _create(self, first: bytes | bytearray | memoryview, offset: int) -> MutableStore:
        store = self._load()
        if store is not None:
            return store
        seg = segment_size_for(self._kind, first, offset)
        raw, dek = header_and_key(self._vfs.keyring, self.path, None, seg,
                                  *framing(self._kind, first, offset))
        os.pwrite(self._fd, raw, 0)
        self._store = self._new_store(raw, dek)
        return self._store

    # -- gathering journal and WAL writes ------------------------------------------

    def _flush(self) -> None:
        pend = self._pend
        if not pend:
            return
        store = self._store or self._create(pend, self._pend_start)
        try:
            store.pwrite(pend, self._pend_start)
        except SegmentAuthenticationError as exc:
            raise _page_error(exc) from None
        self._pend_start += len(pend)
        del pend[:]

    def _flush_journal(self) -> None:
        journal = self._vfs.journals.get(self.path)
        if journal is not None and journal._pend:
            journal._flush()

    # -- VFS methods -------------------------------------------------------------------

    def xRead(self, amount: int, offset: int) -> Any:
        return _as_io_error(_IOERR_READ, self._read_file, amount, offset)

    def _read_file(self, amount: int, offset: int) -> Any:
        if self._pend:
            self._flush()
        store = self._store or self._load()
        if store is None:
            return b""
        if offset == 0 and self._kind == MAIN and amount < store.segment_size:
            return self._peek(store, amount)
        data = self._read(store, amount, offset)
        if offset == 0 and self._kind == MAIN and amount >= 512:
            # Only a whole page 1, which SQLite reads after any hot-journal rollback
            # and only when the WAL has no newer copy; never the 100-byte peek
            # at open, which may see a file left mid-commit by a crash.
            self._check_length(data, store)
        return data

    def _read(self, store: MutableStore, amount: int, offset: int) -> memoryview:
        """Up to ``amount`` plaintext bytes at ``offset``, in a buffer reused by the next read."""
        if len(self._buf) < amount:
            self._buf = bytearray(amount)
        out = memoryview(self._buf)[:amount]
        try:
            return out[: store.readinto_at(out, offset)]
        except SegmentAuthenticationError as exc:
            raise _page_error(exc) from None

    def _peek(self, store: MutableStore, amount: int) -> Any:
        """The first bytes of the database, which SQLite reads at open before any lock.

        SQLite takes only the page size from them and reads page 1 again, whole,
        after rolling back a hot journal. A process killed in the middle of
        writing page 1 (a ``pwrite`` of a record is cut between kernel pages)
        leaves a record that no longer authenticates, and its journal holds the
        page as it was. Raising here would make such a database unopenable, so a
        peek that does not authenticate returns zeros (never the bytes): SQLite
        uses its default page size, rolls the journal back, and reads the whole
        page 1 through the normal path, which raises if it is still bad.
        """
        try:
            return self._read(store, amount, 0)
        except PageAuthenticationError:
            log.warning("%s: page 1 does not authenticate at open (a write cut by a "
                        "crash?); SQLite sees zeros until it rolls back its journal",
                        self.path)
            return bytes(amount)

    def _check_length(self, page1: memoryview, store: MutableStore) -> None:
        """Pages cut from the end: the header's page count says more than the file holds."""
        if bytes(page1[:16]) != b"SQLite format 3\0" or page1[24:28] != page1[92:96]:
            return  # the in-header size is only valid when these counters agree
        if page1[18] == 2:
            # WAL mode: the database file legitimately lags the WAL (a partial
            # checkpoint may have copied page 1 before the pages it counts), and
            # SQLite reads what it needs from the WAL. A cut WAL-mode file is left
            # to SQLite's own check ("database disk image is malformed").
            return
        raw = int.from_bytes(page1[16:18], "big")
        page = 65536 if raw == 1 else raw
        if page != len(page1):
            return
        pages = int.from_bytes(page1[28:32], "big")
        size = store.current_size()
        if pages * page > size:
            raise PageTruncatedError(
                f"{self.path}: file is truncated: its header says {pages} pages of {page} "
                f"bytes but the file holds {size // page}",
                offset=store.layout.record_offset(store.layout.locate(size)[0]),
                path=self.path,
            )

    def xWrite(self, data: Any, offset: int) -> None:
        return _as_io_error(_IOERR_WRITE, self._write, data, offset)

    def _write(self, data: Any, offset: int) -> None:
        if not self._gather:
            journal = self._vfs.journals.get(self.path)
            if journal is not None and journal._pend:
                journal._flush()
            store = self._store or self._create(data, offset)
            if offset == 0 and self._kind == MAIN and self._fd_key is not None:
                self._check_page_size(data, store)
            try:
                store.pwrite(data, offset)
            except SegmentAuthenticationError as exc:
                raise _page_error(exc) from None
            return
        pend = self._pend
        appended = offset == self._pend_start + len(pend)
        if appended:  # the common case
            pend += data
        elif pend and self._pend_start <= offset and offset + len(data) <= self._pend_start + len(
                pend):
            pend[offset - self._pend_start : offset - self._pend_start + len(data)] = data
        else:
            if pend:
                self._flush()
            self._pend_start = offset
            pend += data
        if len(data) == 24 and self._kind == WAL:
            # A frame header. From a commit frame's header until the next
            # transaction's first frame, write through: SQLite may split the
            # commit frame around a sync point and pad after it, and publishes
            # the commit in the wal-index right after the last of these writes.
            # A new commit frame's header waits for its page, which follows at
            # once; a header rewritten in place (SQLite recomputes checksums of
            # frames it overwrote, after the commit frame) is written now.
            self._write_through = data[4:8] != b"\0\0\0\0"
            if self._write_through and not appended:
                self._flush()
        elif self._write_through or len(pend) >= _FLUSH_AT:
            self._flush()

    def _check_page_size(self, page1: Any, store: MutableStore) -> None:
        """Refuse a page 1 whose page size is smaller than the file's records (a VACUUM or
        a backup to a smaller page size): such a page would share a record with others,
        and a write of it cut by a crash would lose pages the journal does not hold.

        A database whose pages are that small already (an older cryptdisk's VACUUM)
        goes on as before, so it stays writable until a VACUUM to the record size.
        """
        page = _page_size(page1)
        if page == 0 or page >= store.segment_size:
            return
        try:
            stored = _page_size(self._read(store, 18, 0))
        except PageAuthenticationError:
            return  # the write fails on the same record, as it did before
        if stored and stored < store.segment_size:
            return
        raise PageSizeError(
            f"{self.path}: the page size cannot shrink to {page} bytes: this file's "
            f"encrypted records hold {store.segment_size}-byte pages, and a smaller page would "
            "share a record with others, which a crash while writing it could lose; use "
            f"PRAGMA page_size={page} and VACUUM INTO a new file instead")

    def xFileSize(self) -> int:
        return _as_io_error(_IOERR_FSTAT, self._file_size)

    def _file_size(self) -> int:
        if self._pend:
            self._flush()
        store = self._store or self._load()
        return 0 if store is None else store.current_size()

    def xTruncate(self, newsize: int) -> None:
        return _as_io_error(_IOERR_TRUNCATE, self._truncate, newsize)

    def _truncate(self, newsize: int) -> None:
        if self._pend:
            self._flush()
        elif not self._gather:
            self._flush_journal()
        if newsize == 0 and self._kind == JOURNAL:
            # An emptied rollback journal (TRUNCATE mode ends every transaction so, a
            # journal size limit of 0 too) loses its header as well: SQLite's next
            # transaction opens an empty file and lays a new journal out for itself,
            # which may claim safe append (xDeviceCharacteristics), as in DELETE mode.
            # An empty journal is no journal to SQLite, with or without a header.
            os.ftruncate(self._fd, 0)
            self._drop_store()  # a new data key and file id at the next write
            self._pend_start = 0
            return
        store = self._store or self._load()
        try:
            if store is not None:
                store.truncate(newsize)
            elif newsize:
                self._create(b"", 0).truncate(newsize)
        except SegmentAuthenticationError as exc:
            raise _page_error(exc) from None

    def xSync(self, flags: int) -> None:
        return _as_io_error(_IOERR_FSYNC, self._sync, flags)

    def _sync(self, flags: int) -> None:
        if self._pend:
            self._flush()
        elif not self._gather:
            self._flush_journal()
        if self._fd_key is None:
            return  # an anonymous temporary file: nothing to make durable
        super().xSync(flags)  # fsync/fdatasync of the same inode, plus SQLite's directory sync
        if self._store is not None:
            self._store.synced()  # the rewrites -cdtail copies were saved for are durable

    def xSectorSize(self) -> int:
        return self._store.segment_size if self._store is not None else 512

    def xDeviceCharacteristics(self) -> int:
        # Power-safe overwrite: a database page is one record, rewritten whole;
        # a WAL frame is one record (framed WAL), so a commit never shares a
        # record with the one before it, and SQLite need not pad commits to a
        # sector boundary. (A mutable WAL left by an older cryptdisk shares its
        # last segment; rewrites of it keep a -cdtail copy, see docs/sqlite-vfs.md.)
        if self._kind != MAIN:
            return 0
        if self._reused_journal():
            return _POWERSAFE_OVERWRITE
        # Safe append: every record of a framed rollback journal reads back as
        # exactly what this VFS wrote there or, torn, cut or otherwise not
        # authentic, as zeros, which end SQLite's playback (page number 0).
        # So SQLite may take the record count from the journal's size and sync
        # the journal once per commit instead of twice (docs/sqlite-vfs.md,
        # "Durability").
        return _POWERSAFE_OVERWRITE | _SAFE_APPEND

    def _reused_journal(self) -> bool:
        """Whether this database's open rollback journal already had a header when
        it was opened (``journal_mode=PERSIST`` reusing it, or a hot journal;
        ``TRUNCATE`` empties it, header and all: see ``xTruncate``).

        Its segments were laid out when it was created: as a mutable file by an
        older cryptdisk, or for a page size the database may have changed since
        (``VACUUM``). Records appended now might not line up with them, and a
        torn segment would zero part of a record, so such a journal does not get
        safe append. Decided at the journal's open, so the answer never changes
        in a transaction; a journal SQLite creates (``DELETE``) gets it.
        """
        journal = self._vfs.journals.get(self.path)
        return journal is not None and journal._reused

    def xClose(self) -> None:
        err = None
        try:
            if self._pend:
                self._flush()
        except Exception as exc:
            err = _io_error(exc, _IOERR_CLOSE)
            if err is exc:
                raise
        finally:
            if self._journal_of is not None and self._vfs.journals.get(self._journal_of) is self:
                del self._vfs.journals[self._journal_of]
            self._journal_of = None
            fd = getattr(self, "_fd", None)
            if self._fd_key is not None:
                _fds.release(self._fd_key)
                self._fd_key = None
            elif fd is not None and fd >= 0:
                os.close(fd)
            self._fd = -1
            self._drop_store()
            super().xClose()
        if err is not None:
            try:
                raise err
            finally:
                del err  # see _as_io_error

    def _drop_store(self) -> None:
        """Forget the store (its data key with it) and close its -cdtail side file."""
        if self._tail is not None:
            self._tail.close()
            self._tail = None
        self._store = None


def _page_size(page1: Any) -> int:
    """The page size in the header of a database's page 1, or 0 when it is not one."""
    head = bytes(page1[:18])
    if len(head) < 18 or not head.startswith(b"SQLite format 3\0"):
        return 0
    raw = int.from_bytes(head[16:18], "big")
    return 65536 if raw == 1 else raw


def _page_error(exc: SegmentAuthenticationError) -> PageAuthenticationError:
    """The store's error as the VFS raises it: SQLITE_CORRUPT to SQLite (see _errors)."""
    if isinstance(exc, PageAuthenticationError):
        return exc
    return PageAuthenticationError(str(exc), offset=exc.offset, path=exc.path)


_IO_CLASSES: dict[tuple[type[Exception], bool], type[Exception]] = {}


def _io_error(exc: Exception, code: int) -> Exception:
    """``exc`` as an I/O error for SQLite, if apsw would answer it otherwise.

    apsw answers SQLite with the code of the first of its exception classes an
    exception is an instance of (``SQLITE_IOERR`` for ``apsw.IOError``), its
    ``extendedresult`` attribute if it has one, and ``SQLITE_ERROR`` for anything
    else (an ``OSError``, a key provider's error). SQLite drops a connection's
    changed pages after a failed rollback only on an I/O error (or a full disk);
    with any other code it keeps them, and the connection would see a partial
    update that was never committed. So a failure of a read, write, sync, size,
    truncate or close becomes an instance of a subclass of its own class and
    ``apsw.IOError`` (``apsw.FullError`` for ``ENOSPC``, as the C VFS answers), with
    the same arguments and attributes: SQLite gets ``code`` (``SQLITE_FULL``),
    and the caller, to whom apsw raises it, the same error by class and message.
    apsw's own errors (``PageAuthenticationError`` is ``SQLITE_CORRUPT``) keep
    their codes.
    """
    if isinstance(exc, apsw.Error):
        return exc
    base = type(exc)
    full = isinstance(exc, OSError) and exc.errno == errno.ENOSPC
    cls = _IO_CLASSES.get((base, full))
    try:
        if cls is None:
            cls = type(base.__name__, (base, apsw.FullError if full else apsw.IOError),
                       {"__module__": base.__module__, "__qualname__": base.__qualname__,
                        "__reduce__": _reduce_as(base)})
            _IO_CLASSES[base, full] = cls
        args = exc.args
        if isinstance(exc, OSError) and exc.filename is not None:  # not in its args
            args = (exc.errno, exc.strerror, exc.filename, None, exc.filename2)
        new: Exception = cls.__new__(cls, *args)
        new.args = exc.args
        new.__dict__.update(vars(exc))
        new.extendedresult = _FULL if full else code  # type: ignore[attr-defined]
    except Exception:  # a class that cannot be combined or copied: raised as it is
        return exc
    new.__cause__, new.__context__ = exc.__cause__, exc.__context__
    new.__suppress_context__ = exc.__suppress_context__
    return new.with_traceback(exc.__traceback__)


def _reduce_as(base: type[Exception]) -> Callable[[Exception], Any]:
    """A ``__reduce__`` that pickles an :func:`_io_error` copy as its original class
    (the made class has the original's name, so pickle cannot find it by that name)."""
    def reduce(self: Exception) -> Any:
        made: Any = base.__reduce__(self)  # (class, args, state dict)
        state = dict(made[2] or {}) if len(made) > 2 else {}
        state.pop("extendedresult", None)
        return (base, made[1], state or None)
    return reduce


def _as_io_error(code: int, method: Callable[..., _T], *args: Any) -> _T:
    """``method(*args)``, raising what it raises as :func:`_io_error` makes it."""
    try:
        return method(*args)
    except Exception as exc:
        err = _io_error(exc, code)
        if err is exc:
            raise
    try:
        raise err  # outside the handler: not chained to its original
    finally:
        # This frame is in err's traceback: a local referring to err would make a
        # cycle keeping the frames' buffers alive until a garbage collection (a
        # gathered journal could not grow: BufferError).
        del err


def _anonymous_file() -> int:
    """An unnamed file for SQLite's temporary files (gone when closed)."""
    directory = tempfile.gettempdir()
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            return os.open(directory, flag | os.O_RDWR | os.O_CLOEXEC, 0o600)
        except OSError:
            pass
    fd, name = tempfile.mkstemp(prefix="cryptdisk-sqlite-", dir=directory)
    os.unlink(name)
    return fd

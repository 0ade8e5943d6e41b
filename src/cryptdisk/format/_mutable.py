"""Mutable and framed files: random writes and appends in place (page stores, journals).

Each segment is stored as ``nonce(16) || AES-GCM(DEK, nonce, plaintext, ad) || tag(16)``
with a fresh random 128-bit nonce on every write (as gocryptfs does) and
``ad = file_id || u64le(index)``, so a segment moved within the file or
spliced from another file fails to authenticate. Rewriting a segment never
reuses a nonce. What the format cannot see is a whole segment cut from the end
of the file, or the whole file rolled back to an older valid version: both
need a trusted size or version kept elsewhere (the database catalog, SQLite's
own header), as ``docs/format.md`` says.

Framed files (kind 3) are stored the same way; only where segments begin
differs (segment 0 holds ``lead`` bytes, later ones ``segment_size +
frame_extra``). :class:`SegmentLayout` does all of that arithmetic.

Lower tier: the caller owns the file descriptor and serialises writers.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from typing import Protocol

from cryptography.exceptions import InvalidTag

from ..errors import SegmentAuthenticationError, TruncatedFileError
from ._cipher import TAG_SIZE, new_aead
from ._header import Header, Kind
from ._layout import MUTABLE_NONCE, OVERHEAD, SegmentLayout
from ._sealed import segment_error
from ._tail import TailSave

__all__ = ["MUTABLE_NONCE", "MutableStore", "TailStore", "mutable_layout", "store_layout"]
_AD = struct.Struct("<16sQ")
#: Whole segments per batched read or write (one syscall each way).
_RUN = 64
_RETRY = (0.0, 0.001, 0.005, 0.02)  # seconds between re-reads of a shared file
log = logging.getLogger("cryptdisk.format")


def mutable_layout(file_size: int, segment_size: int, path: str | None = None) -> tuple[int, int]:
    """``(segment_count, plaintext_size)`` of a mutable (kind 2) file of ``file_size`` bytes."""
    return _counted(SegmentLayout(segment_size, segment_size), file_size, path)


def store_layout(file_size: int, header: Header, path: str | None = None) -> tuple[int, int]:
    """``(segment_count, plaintext_size)`` of a mutable or framed file with ``header``.

    Raises :class:`TruncatedFileError` when the last record is too short to
    hold any plaintext.
    """
    return _counted(SegmentLayout.of(header), file_size, path)


def _counted(layout: SegmentLayout, file_size: int, path: str | None) -> tuple[int, int]:
    count, size, cut = layout.measure(file_size)
    if cut:
        where = f"{path}: " if path else ""
        raise TruncatedFileError(
            f"{where}file is truncated: its last segment is cut short",
            offset=file_size, path=path,
        )
    return count, size


class TailStore(Protocol):
    """Where a store saves the record of a segment before rewriting it in place, for
    journals and WALs (SQLite's ``-cdtail`` side file, :mod:`cryptdisk.sqlite`)."""

    def save(self, index: int, record: memoryview) -> None:
        """Keep ``record`` (ciphertext, as on disk) as the saved copy of segment ``index``,
        on stable storage when this returns (the rewrite that follows may tear)."""

    def load(self, index: int, into: memoryview) -> int:
        """Read the saved record of segment ``index`` into ``into``; its length, or 0."""


class MutableStore:
    """Positional reads and writes of a mutable or framed file's plaintext over a descriptor.

    ``pread`` is safe from several threads; writes must be serialised by the
    caller (SQLite's locks, or the file object's lock). Each segment write is a
    single ``pwrite`` of the whole record, but a ``pwrite`` is not atomic: a
    process killed during it (the kernel checks for fatal signals between pages)
    or a power cut can leave a record half old, half new, and it then fails to
    authenticate, with any earlier bytes it held. Only the options below keep
    those bytes.

    Options for a file that other processes write at the same time (SQLite's
    databases, journals and WALs; see ``docs/sqlite-vfs.md``):

    - ``shared``: the size is asked of the file system at every read, write,
      truncate and :meth:`current_size` (``lseek``, one integer), never cached;
      a last record too short to hold any plaintext (an append cut by a crash)
      is left out of the size, with a warning, instead of raising; and a
      segment that fails to authenticate is read again a few times (another
      process may be rewriting it: a read that overlaps a write sees half of
      each).
    - ``tail``: before a segment holding earlier bytes is rewritten in place, its
      record is saved there; a segment that later fails to authenticate is read
      from the saved record if that one authenticates (the file as it was before
      an interrupted rewrite, bytes beyond it as a hole). ``tail`` holds one
      record, so the rewrite of the one saved before is synced before its copy is
      replaced, unless the file was synced since (:meth:`synced`).
    - ``save_appends`` (with ``tail``; append-only logs, :func:`~cryptdisk.format.open_log`):
      every write at the end saves first, as well as a record holding earlier
      bytes, an empty record of the fresh segment it begins (proof that the file
      ended there).
    - ``recover``: the side file of such a log. Opening checks the segments from
      the one saved last to the end; if one fails to authenticate (or the last
      record is cut) and the saved record authenticates, the last write was
      interrupted: a writable store puts the saved record back and cuts the file
      after it (synced), a read-only one reads the file as it was before that
      write. Otherwise nothing changes (a bad segment raises as usual), so a
      torn end is never taken for the end of the file without that proof.
    - ``torn_as_hole``: a segment that still fails reads as zeros, with a
      warning, instead of raising (journals and WALs: what a crash leaves at the
      write head; SQLite checksums its records and stops at a bad one).

    Their warnings go to ``logger`` (default ``cryptdisk.format``).
    """

    def __init__(self, fd: int, header: Header, dek: bytes, path: str | None = None,
                 *, writable: bool = False, shared: bool = False,
                 tail: TailStore | None = None, torn_as_hole: bool = False,
                 save_appends: bool = False, recover: TailSave | None = None,
                 logger: logging.Logger | None = None) -> None:
        if header.kind not in Kind.WRITABLE:
            raise ValueError("MutableStore needs a mutable or framed header")
        self._fd = fd
        self._aead = new_aead(dek)
        self._file_id = header.file_id
        self.header = header
        self.path = path
        self.writable = writable
        self.shared = shared
        self.tail = tail
        self.torn_as_hole = torn_as_hole
        self.save_appends = save_appends and tail is not None
        self._restored: tuple[int, bytes] | None = None  # read-only view of a recovered end
        self._log = logger or log
        self.segment_size = header.segment_size
        self.layout = SegmentLayout.of(header)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._raw_size = -1
        self._tail_pending = False  # the rewrite of the record saved last is not synced yet
        if shared:
            self.segment_count = self.size = 0
            self.current_size()
        elif recover is not None:
            self._settle(recover)
        else:
            self.segment_count, self.size = store_layout(os.fstat(fd).st_size, header, path)

    def _settle(self, saved: TailSave) -> None:
        """Undo a write cut by a crash, from the saved record (``recover``, see the class)."""
        raw = os.fstat(self._fd).st_size
        count, size, cut = self.layout.measure(raw)
        self.segment_count, self.size = count, size
        index = saved.index()
        if 0 <= index <= count and (cut or not all(
                self._authentic(j) for j in range(index, count))):
            record = memoryview(bytearray(self.layout.capacity(index) + OVERHEAD))
            got = saved.load(index, record)
            plain = memoryview(bytearray(max(0, got - OVERHEAD)))
            if got >= OVERHEAD and self._open(index, record[:got], plain):
                end = self._offset(index) + (got if got > OVERHEAD else 0)
                if self.writable:
                    if got > OVERHEAD:
                        os.pwrite(self._fd, record[:got], self._offset(index))
                    os.ftruncate(self._fd, end)
                    os.fsync(self._fd)
                else:
                    self._restored = (index, bytes(record[:got]))
                self.segment_count, self.size = self.layout.measure(end)[:2]
                self._log.warning("%s: its last write was cut (a crash?); it reads as it was "
                                  "before that write, from %s", self.path, saved.path)
                return
        if cut:
            _counted(self.layout, raw, self.path)  # raises TruncatedFileError

    def _authentic(self, index: int) -> bool:
        n = self._seg_len(index)
        record = self._scratch(n + OVERHEAD)
        return os.preadv(self._fd, [record], self._offset(index)) == n + OVERHEAD and \
            self._open(index, record, self._plain(n))

    # -- size ----------------------------------------------------------------

    def current_size(self) -> int:
        """The plaintext size now, from the file system (another process may have written).

        ``lseek(SEEK_END)`` rather than ``fstat``: one integer instead of a stat
        result (SQLite asks for the size at every read transaction). All I/O is
        positional, so the descriptor's offset is never used. A last record cut
        to ``OVERHEAD`` bytes or fewer is read again a few times (another process
        may be appending it right now), then left out of the size.
        """
        raw = os.lseek(self._fd, 0, os.SEEK_END)
        if raw == self._raw_size:
            return self.size
        count, size, cut = self.layout.measure(raw)
        if cut:
            for pause in _RETRY:
                time.sleep(pause)
                raw = os.lseek(self._fd, 0, os.SEEK_END)
                count, size, cut = self.layout.measure(raw)
                if not cut:
                    break
            else:
                # No plaintext byte of such a record can be authentic, so the file
                # ends before it, as a plain file ends before a write that never
                # happened; the next write or truncate replaces it.
                self._log.warning("%s: ignoring a cut record of %d bytes at the end (a write cut "
                            "by a crash?)", self.path, cut)
                raw = -1  # measure again next time
        self._raw_size = raw
        self.segment_count, self.size = count, size
        return size

    def _refresh(self) -> None:
        if self.shared:
            self.current_size()

    # -- one segment ---------------------------------------------------------

    def _seg_len(self, index: int) -> int:
        if index >= self.segment_count:
            return 0
        if index < self.segment_count - 1:
            return self.layout.capacity(index)
        return self.size - self.layout.start(index)

    def _offset(self, index: int) -> int:
        return self.layout.record_offset(index)

    def _fail(self, index: int) -> SegmentAuthenticationError:
        return segment_error(self.path, index, self._offset(index),
                             not self.shared and index == self.segment_count - 1)

    def _open(self, index: int, record: memoryview, out: memoryview) -> bool:
        """Authenticate and decrypt ``record`` of segment ``index`` into ``out`` (its
        plaintext length); False, ``out`` wiped, if it does not authenticate."""
        try:
            self._aead.decrypt_into(record[:MUTABLE_NONCE], record[MUTABLE_NONCE:],
                                    _AD.pack(self._file_id, index), out)
        except InvalidTag:
            out[:] = bytes(len(out))  # OpenSSL wrote unauthenticated plaintext here: wipe it
            return False
        return True

    def _decrypt_into(self, index: int, out: memoryview) -> memoryview:
        """Fill ``out`` with the first ``len(out)`` plaintext bytes of segment ``index``.

        Returns the record that authenticated (empty if the segment read as a
        hole), valid until the next call on this thread.
        """
        n = len(out)
        record = self._scratch(n + OVERHEAD)
        if self._restored is not None and self._restored[0] == index:
            record[:] = self._restored[1][: n + OVERHEAD]
            if len(self._restored[1]) == n + OVERHEAD and self._open(index, record, out):
                return record
            raise self._fail(index)
        got = os.preadv(self._fd, [record], self._offset(index))
        if got == n + OVERHEAD and self._open(index, record, out):
            return record
        return self._recover(index, out)

    def _recover(self, index: int, out: memoryview) -> memoryview:
        """Segment ``index`` did not authenticate: read it again (``shared``), take its
        saved record (``tail``), read it as zeros (``torn_as_hole``), or raise."""
        n = len(out)
        where = self._offset(index)
        record = self._scratch(self.layout.capacity(index) + OVERHEAD)
        plain = memoryview(bytearray(self.layout.capacity(index)))  # (a rare path)
        got = 0
        if self.shared:
            for pause in _RETRY:
                time.sleep(pause)
                # The whole record as it is now: an append may have lengthened it.
                got = os.preadv(self._fd, [record], where)
                m = got - OVERHEAD
                if m >= n and self._open(index, record[:got], plain[:m]):
                    out[:] = plain[:n]
                    return record[:got]
        else:
            got = os.preadv(self._fd, [record[: n + OVERHEAD]], where)
        if self.tail is not None:  # an interrupted rewrite? (see cryptdisk.sqlite._tail)
            saved = self.tail.load(index, record) - OVERHEAD
            if 0 < saved <= max(got - OVERHEAD, n) and self._open(
                    index, record[: saved + OVERHEAD], plain[:saved]):
                # The segment as it was before the write: the file ended after
                # ``saved`` bytes then, so the rest reads as a hole (zeros).
                keep = min(saved, n)
                out[:keep] = plain[:keep]
                out[keep:] = bytes(n - keep)
                return record[: saved + OVERHEAD]
        if self.torn_as_hole:
            out[:] = bytes(n)
            self._log.warning("%s: segment %d at offset %d does not authenticate; it reads as a "
                        "torn write (zeros)", self.path, index, where)
            return record[:0]
        raise self._fail(index)

    def _encrypt(self, index: int, plain: bytes | bytearray | memoryview) -> bytearray:
        nonce = os.urandom(MUTABLE_NONCE)
        out = bytearray(MUTABLE_NONCE + len(plain) + TAG_SIZE)
        out[:MUTABLE_NONCE] = nonce
        self._aead.encrypt_into(nonce, plain, _AD.pack(self._file_id, index),
                                memoryview(out)[MUTABLE_NONCE:])
        return out

    # -- ranges --------------------------------------------------------------

    def pread(self, offset: int, n: int) -> bytes:
        """Up to ``n`` plaintext bytes at ``offset`` (fewer at end of file)."""
        self._refresh()
        buf = bytearray(max(0, min(n, self.size - offset)))
        got = self.readinto_at(buf, offset)
        return bytes(memoryview(buf)[:got])

    read_at = pread

    def close(self) -> None:
        """The file descriptor belongs to the caller; nothing to release here."""

    def readinto_at(self, buf: bytearray | memoryview, offset: int) -> int:
        """Fill ``buf`` with the plaintext at ``offset``; the bytes read (fewer at end of file)."""
        out = memoryview(buf).cast("B")
        if offset < 0:
            raise ValueError("negative offset")
        if self.shared:
            index, lo = self.layout.locate(offset)
            if lo == 0 and len(out) == self.layout.capacity(index):
                return self._read_segment(index, out)  # a page: the record says its length
            self.current_size()
        n = min(len(out), max(0, self.size - offset))
        pos = 0
        while pos < n:
            index, lo = self.layout.locate(offset + pos)
            seg_len = self._seg_len(index)
            take = min(seg_len - lo, n - pos)
            if lo == 0 and take == seg_len:
                count, total = 1, seg_len
                while count < _RUN and (nxt := self._seg_len(index + count)) and \
                        pos + total + nxt <= n:
                    count, total = count + 1, total + nxt
                self._decrypt_run(index, count, out[pos : pos + total])
                pos += total
                continue
            scratch = self._plain(seg_len)
            self._decrypt_into(index, scratch)
            out[pos : pos + take] = scratch[lo : lo + take]
            pos += take
        return n

    def _read_segment(self, index: int, out: memoryview) -> int:
        """Segment ``index`` whole into ``out``, its length as its record on disk says now
        (0 past the end); ``shared`` files' page reads, which need not ask for the size."""
        record = self._scratch(len(out) + OVERHEAD)
        got = os.preadv(self._fd, [record], self._offset(index))
        n = got - OVERHEAD
        if n <= 0:
            return 0  # past the end, or a cut record current_size() leaves out
        if not self._open(index, record[:got], out[:n]):
            self._recover(index, out[:n])
        return n

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        """Write ``data`` at ``offset``, zero-filling any gap past the end."""
        if not self.writable:
            raise OSError("file is open read-only")
        mv = memoryview(data).cast("B")
        with self._lock:
            if self.shared:
                index, lo = self.layout.locate(offset)
                if lo == 0 and len(mv) == self.layout.capacity(index) and \
                        os.lseek(self._fd, 0, os.SEEK_END) >= self._offset(index):
                    self._write_one(index, mv)  # a page over no gap: no size needed
                    return len(mv)
                self.current_size()
            if offset > self.size:
                self._write_range(memoryview(bytes(offset - self.size)), self.size)
            self._write_range(mv, offset)
        return len(mv)

    def _write_range(self, mv: memoryview, offset: int) -> None:
        pos, n = 0, len(mv)
        run: list[tuple[int, memoryview]] = []  # whole segments, written in one pwrite
        #: a log's last segment, patched by an append that goes on into fresh segments:
        #: written after them, so that a write cut between the two leaves that segment
        #: short below a hole, which the saved record undoes (see ``_settle``), and never
        #: the first part of the append alone, whole and authentic
        last: tuple[int, memoryview] | None = None
        while pos < n:
            index, lo = self.layout.locate(offset + pos)
            take = min(self.layout.capacity(index) - lo, n - pos)
            old_len = self._seg_len(index)
            if self.save_appends and not pos and not lo and not old_len:
                # A fresh segment at the end: save the proof that the file ended here.
                self._save_tail(index, memoryview(self._encrypt(index, b"")))
            if lo == 0 and take >= old_len:
                run.append((index, mv[pos : pos + take]))
                pos += take
                if len(run) == _RUN:
                    self._write_run(run)
                    run = []
                continue
            if run:
                self._write_run(run)
                run = []
            cur = bytearray(old_len)  # part of a segment: read, patch, re-encrypt
            if old_len:
                record = self._decrypt_into(index, memoryview(cur))
                if lo and self.tail is not None and len(record):
                    # Bytes before ``lo`` were written earlier (maybe committed): keep
                    # the old record until the new one is wholly on disk. Only the
                    # first segment of a write can have them, so one saved record
                    # suffices. Bytes after a write are never committed ones (SQLite
                    # appends; what lies beyond is stale or this transaction's), and
                    # a cut record there reads as torn.
                    self._save_tail(index, record)
            if len(cur) < lo + take:
                cur.extend(bytes(lo + take - len(cur)))
            cur[lo : lo + take] = mv[pos : pos + take]
            if self.save_appends and not pos and take < n and old_len:
                last = (index, memoryview(cur))
            else:
                self._write_run([(index, memoryview(cur))])
            pos += take
        if run:
            self._write_run(run)
        if last is not None:
            if getattr(self.tail, "sync", True):
                os.fdatasync(self._fd)  # the fresh segments before the one they follow
            self._write_run([last])

    def _write_one(self, index: int, plain: memoryview) -> None:
        """Seal one segment under a fresh nonce and write its record (one ``pwrite``)."""
        at = len(plain) + OVERHEAD
        record = self._scratch(at)
        nonce = record[:MUTABLE_NONCE]
        nonce[:] = os.urandom(MUTABLE_NONCE)
        self._aead.encrypt_into(nonce, plain, _AD.pack(self._file_id, index),
                                record[MUTABLE_NONCE:])
        if os.pwrite(self._fd, record, self._offset(index)) != at:  # pragma: no cover
            raise OSError(f"short write of segment {index}")
        self._raw_size = -1

    def _write_run(self, run: list[tuple[int, memoryview]]) -> None:
        """Encrypt consecutive segments, each under a fresh nonce, into one ``pwrite``."""
        first = run[0][0]
        sizes = [len(plain) + OVERHEAD for _, plain in run]
        out = self._scratch(sum(sizes))
        nonces = os.urandom(MUTABLE_NONCE * len(run))
        at = 0
        for j, (index, plain) in enumerate(run):
            nonce = nonces[j * MUTABLE_NONCE : (j + 1) * MUTABLE_NONCE]
            out[at : at + MUTABLE_NONCE] = nonce
            self._aead.encrypt_into(nonce, plain, _AD.pack(self._file_id, index),
                                    out[at + MUTABLE_NONCE : at + sizes[j]])
            at += sizes[j]
        if os.pwrite(self._fd, out[:at], self._offset(first)) != at:  # pragma: no cover
            raise OSError(f"short write of segments {first}..{first + len(run) - 1}")
        last_index, last_plain = run[-1]
        self.segment_count = max(self.segment_count, last_index + 1)
        self.size = max(self.size, self.layout.start(last_index) + len(last_plain))
        self._raw_size = -1

    def _scratch(self, n: int) -> memoryview:
        """A per-thread buffer of at least ``n`` bytes, reused (no page faults per call)."""
        buf: bytearray | None = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            buf = self._local.buf = bytearray(max(n, 1 << 16))
        return memoryview(buf)[:n]

    def _plain(self, n: int) -> memoryview:
        """A second per-thread buffer, for one segment's plaintext."""
        buf: bytearray | None = getattr(self._local, "plain", None)
        if buf is None or len(buf) < n:
            buf = self._local.plain = bytearray(max(n, self.layout.largest))
        return memoryview(buf)[:n]

    def _decrypt_run(self, first: int, count: int, out: memoryview) -> None:
        """``count`` whole consecutive segments from one read, each authenticated in place."""
        total = len(out)
        records = self._scratch(total + count * OVERHEAD)
        got = os.preadv(self._fd, [records], self._offset(first))
        at = dst = 0
        for index in range(first, first + count):
            n = self._seg_len(index)
            target = out[dst : dst + n]
            if got < at + n + OVERHEAD or not self._open(
                    index, records[at : at + n + OVERHEAD], target):
                # Each segment from here on its own, with the store's recovery.
                for rest in range(index, first + count):
                    n = self._seg_len(rest)
                    self._decrypt_into(rest, out[dst : dst + n])
                    dst += n
                return
            at += n + OVERHEAD
            dst += n

    def truncate(self, size: int) -> None:
        """Cut or zero-extend the plaintext to ``size`` bytes."""
        if not self.writable:
            raise OSError("file is open read-only")
        with self._lock:
            self._refresh()
            if size > self.size:
                self._write_range(memoryview(bytes(size - self.size)), self.size)
                return
            count, rest = self.layout.locate(size)  # keep segments 0..count-1, then rest bytes
            if size == self.size:
                if self.shared and not rest and os.lseek(self._fd, 0, os.SEEK_END) > \
                        self._offset(count):
                    os.ftruncate(self._fd, self._offset(count))  # a cut record size() left out
                    self._raw_size = -1
                return
            if rest:
                cur = bytearray(self._seg_len(count))
                record = self._decrypt_into(count, memoryview(cur))
                if self.tail is not None and len(record):
                    self._save_tail(count, record)
                keep = cur[:rest]
                record = memoryview(self._encrypt(count, keep))
                os.ftruncate(self._fd, self._offset(count))
                os.pwrite(self._fd, record, self._offset(count))
                self.segment_count = count + 1
            else:
                os.ftruncate(self._fd, self._offset(count))
                self.segment_count = count
            self.size = size
            self._raw_size = -1

    def _save_tail(self, index: int, record: memoryview) -> None:
        """Save ``record`` in ``tail`` before segment ``index`` is rewritten (see the class)."""
        assert self.tail is not None
        if self._tail_pending and getattr(self.tail, "sync", True):
            os.fdatasync(self._fd)  # the copy about to be replaced is no longer needed
        self.tail.save(index, record)
        self._tail_pending = True

    def synced(self) -> None:
        """Note that the file was just made durable (its owner synced the descriptor)."""
        self._tail_pending = False

    def sync(self) -> None:
        os.fsync(self._fd)
        self.synced()

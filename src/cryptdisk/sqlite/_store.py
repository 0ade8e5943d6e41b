"""Page-sized reads and writes of a mutable cryptdisk file, tuned for SQLite's VFS.

The bytes on disk are exactly :class:`cryptdisk.format.MutableStore`'s layout
(``header || record*``, each record ``nonce(16) || AES-GCM(DEK, nonce, plain,
file_id || u64le(index)) || tag(16)``), so either class reads what the other
writes. This class exists because the VFS calls it once per page: it keeps one
ciphertext buffer and one plaintext buffer per file and reuses them, reads
records with ``preadv`` straight into the buffer, takes no lock (SQLite's file
locks already serialise writers), and asks the file system for the size only
when an access reaches the last segment. A page write that covers its whole
segment is one ``encrypt_into`` and one ``pwrite``: no read, no allocation
beyond the nonce.

Lower tier: the caller owns the descriptor and serialises writers.
"""

from __future__ import annotations

import logging
import os
import time

from cryptography.exceptions import InvalidTag

from ..format import MUTABLE_NONCE, TAG_SIZE, Header, SegmentLayout, new_aead
from ._errors import PageAuthenticationError
from ._tail import TailSave

__all__ = ["OVERHEAD", "PageStore"]

OVERHEAD = MUTABLE_NONCE + TAG_SIZE
log = logging.getLogger("cryptdisk.sqlite")
_RETRY = (0.0, 0.001, 0.005, 0.02)  # seconds between re-reads of a failing segment


class PageStore:
    """Positional plaintext I/O over one mutable file (see the module docstring).

    ``read`` returns a view of an internal buffer that stays valid until the
    next call on this store: the VFS hands it straight to SQLite, which copies it.
    """

    def __init__(self, fd: int, header: Header, dek: bytes, path: str,
                 tail: TailSave | None = None) -> None:
        self.fd = fd
        self.tail = tail
        self.torn_as_hole = tail is not None  # journals and WALs (see _decrypt)
        self.path = path
        self.header = header
        self.segment_size = header.segment_size
        self.layout = SegmentLayout.of(header)  # framed (kind 3) for WALs: a record per frame
        seg = self.layout.largest
        self._aead = new_aead(dek)
        self._file_id = header.file_id
        self._record = seg + OVERHEAD
        self._rec = bytearray(self._record)
        self._rec_mv = memoryview(self._rec)
        self._rec_len = 0  # length of the record in _rec that last authenticated
        self._nonce = self._rec_mv[:MUTABLE_NONCE]
        self._body = self._rec_mv[MUTABLE_NONCE:]
        self._plain = bytearray(seg)
        self._plain_mv = memoryview(self._plain)
        self._out = bytearray(seg)
        self._batch = bytearray(0)  # sealed records of one multi-segment write
        self._out_mv = memoryview(self._out)
        self._two: memoryview | None = None  # two records, for reads across a boundary
        self._plain2 = self._plain_mv

    # -- size ------------------------------------------------------------------

    def size(self) -> int:
        """Plaintext size now (asks the file system; another process may have written).

        ``lseek(SEEK_END)`` rather than ``fstat``: one integer instead of a stat
        result, on the hot path of every read transaction (SQLite asks for the
        database size each time). The descriptor's offset is never used (all
        I/O is positional), so moving it is harmless.
        """
        _count, size, cut = self.layout.measure(os.lseek(self.fd, 0, os.SEEK_END))
        if not cut:
            return size
        for pause in _RETRY:
            time.sleep(pause)  # maybe another process is appending a record right now
            _count, size, cut = self.layout.measure(os.lseek(self.fd, 0, os.SEEK_END))
            if not cut:
                return size
        # At most OVERHEAD bytes of a record: an append cut by a crash (SIGKILL
        # stops a write between kernel pages). No plaintext byte of it can be
        # authentic, so the file ends before it, as a plain file would end
        # before a write that never happened; the next write or truncate
        # replaces it. (A cut by whole records is what a truncated file looks
        # like; see _check_length and docs/sqlite.md.)
        log.warning("%s: ignoring a cut record of %d bytes at the end (a write cut by a "
                    "crash?)", self.path, cut)
        return size

    # -- one segment -------------------------------------------------------------

    def _fail(self, index: int) -> PageAuthenticationError:
        offset = self.layout.record_offset(index)
        return PageAuthenticationError(
            f"{self.path}: failed to decrypt and authenticate segment {index} at offset "
            f"{offset}", offset=offset, path=self.path,
        )

    def _decrypt(self, index: int, out: memoryview) -> int:
        """Decrypt segment ``index`` into ``out``; returns its plaintext length (0 past EOF).

        Afterwards ``self._rec`` holds the record that authenticated.
        """
        where = self.layout.record_offset(index)
        rec = self._rec_mv[: self.layout.capacity(index) + OVERHEAD]
        got = os.preadv(self.fd, [rec], where)
        if got == 0:
            return 0
        if self._open(index, got, out):
            self._rec_len = got
            return got - OVERHEAD
        for pause in _RETRY:
            # Another process may be rewriting this very segment (the WAL's tail
            # holds committed frames that readers read while the writer appends):
            # a read that overlapped the write sees half of each. Read again.
            time.sleep(pause)
            got = os.preadv(self.fd, [rec], where)
            if got and self._open(index, got, out):
                self._rec_len = got
                return got - OVERHEAD
        if self.tail is not None:  # an interrupted rewrite? (see _tail.py)
            saved = self.tail.load(index, self._rec_mv) - OVERHEAD
            if 0 < saved <= got - OVERHEAD and self._open(index, saved + OVERHEAD, out):
                self._rec_len = saved + OVERHEAD
                # The segment as it was before the write: the file ended after
                # ``saved`` bytes then, so the rest reads as a hole (zeros).
                out[saved : got - OVERHEAD] = bytes(got - OVERHEAD - saved)
                return got - OVERHEAD
        if self.torn_as_hole:
            # A journal or WAL: a record that never authenticates is what a write
            # cut short by a crash leaves at the write head. SQLite checksums its
            # frames and journal records and stops at a bad one, so it gets
            # zeros (never the unauthenticated bytes) and treats it as torn.
            n = max(got - OVERHEAD, 0)
            out[:n] = bytes(n)
            log.warning("%s: segment %d at offset %d does not authenticate; SQLite sees "
                        "it as a torn write (zeros)", self.path, index, where)
            return n
        raise self._fail(index)

    def _open(self, index: int, got: int, out: memoryview) -> bool:
        n = got - OVERHEAD
        if n <= 0:
            return False
        try:
            self._aead.decrypt_into(self._nonce, self._body[: n + TAG_SIZE],
                                    self._file_id + index.to_bytes(8, "little"), out[:n])
        except InvalidTag:
            out[:n] = bytes(n)  # OpenSSL wrote unauthenticated plaintext here: wipe it
            return False
        return True

    def _encrypt_write(self, index: int, plain: memoryview | bytes | bytearray) -> None:
        n = len(plain)
        self._nonce[:] = os.urandom(MUTABLE_NONCE)
        self._aead.encrypt_into(self._nonce, plain, self._file_id + index.to_bytes(8, "little"),
                                self._body[: n + TAG_SIZE])
        record = self._rec_mv[: n + OVERHEAD]
        if os.pwrite(self.fd, record, self.layout.record_offset(index)) != n + OVERHEAD:
            raise OSError(f"{self.path}: short write of segment {index}")  # pragma: no cover

    # -- ranges ------------------------------------------------------------------

    def read(self, amount: int, offset: int) -> memoryview:
        """Up to ``amount`` plaintext bytes at ``offset``; fewer only at end of file."""
        layout = self.layout
        index, lo = layout.locate(offset)
        seg = layout.capacity(index)
        if lo == 0 and amount == seg:  # the page fast path (a whole frame in a framed WAL)
            return self._out_mv[: self._decrypt(index, self._out_mv[:seg])]
        if amount > len(self._out):
            self._out = bytearray(amount)
            self._out_mv = memoryview(self._out)
        if lo and lo + amount > seg and amount - (seg - lo) <= layout.size and self._straddle(
                index, lo, amount):
            return self._out_mv[:amount]  # a page across two records: one preadv
        out = self._out_mv
        pos = 0
        while pos < amount:
            index, lo = layout.locate(offset + pos)
            seg = layout.capacity(index)
            take = min(seg - lo, amount - pos)
            if lo == 0 and take == seg:
                n = self._decrypt(index, out[pos : pos + seg])
            else:
                n = self._decrypt(index, self._plain_mv) - lo
                if n > 0:
                    n = min(n, take)
                    out[pos : pos + n] = self._plain_mv[lo : lo + n]
            if n < take:
                return out[: pos + max(n, 0)]
            pos += take
        return out[:amount]

    def _straddle(self, index: int, lo: int, amount: int) -> bool:
        """Read the tail of segment ``index`` and the head of the next into ``_out``.

        One ``preadv`` of both records, each authenticated on its own. False
        (nothing released, the plaintext buffers wiped) when either is short or
        does not authenticate: the caller's segment-by-segment path then
        retries, consults the side file, or raises, as for any segment.
        """
        layout = self.layout
        seg, big = layout.capacity(index), layout.largest
        rec = seg + OVERHEAD
        if self._two is None:
            self._two = memoryview(bytearray(2 * (big + OVERHEAD)))
            self._plain2 = memoryview(bytearray(big))
        two, head = self._two[: rec + layout.size + OVERHEAD], seg - lo
        got = os.preadv(self.fd, [two], layout.record_offset(index))
        n2 = got - rec - OVERHEAD
        if n2 < amount - head:
            return False
        plain, plain2 = self._plain_mv, self._plain2
        fid = self._file_id
        try:
            self._aead.decrypt_into(two[:MUTABLE_NONCE], two[MUTABLE_NONCE:rec],
                                    fid + index.to_bytes(8, "little"), plain[:seg])
            self._aead.decrypt_into(two[rec : rec + MUTABLE_NONCE], two[rec + MUTABLE_NONCE : got],
                                    fid + (index + 1).to_bytes(8, "little"), plain2[:n2])
        except InvalidTag:
            plain[:] = bytes(len(plain))  # OpenSSL wrote unauthenticated plaintext: wipe it
            plain2[:] = bytes(len(plain2))
            return False
        out = self._out_mv
        out[:head] = plain[lo:seg]
        out[head:amount] = plain2[: amount - head]
        return True

    def write(self, data: memoryview | bytes | bytearray, offset: int) -> None:
        """Write ``data`` at ``offset``, zero-filling any gap past the end of the file."""
        mv = memoryview(data).cast("B")
        n = len(mv)
        index, lo = self.layout.locate(offset)
        if lo == 0 and n == self.layout.capacity(index):  # the page fast path: a whole segment
            end = self.layout.record_offset(index)
            if offset > 0 and os.lseek(self.fd, 0, os.SEEK_END) < end:
                self._fill_to(offset)
            self._encrypt_write(index, mv)
            return
        size = self.size()
        if offset > size:
            self._write_range(memoryview(bytes(offset - size)), size, size)
            size = offset
        self._write_range(mv, offset, size)

    def _fill_to(self, offset: int) -> None:
        size = self.size()
        if offset > size:
            self._write_range(memoryview(bytes(offset - size)), size, size)

    def _write_range(self, mv: memoryview, offset: int, size: int) -> None:
        """Seal the segments ``mv`` touches into one buffer and write them with one ``pwrite``."""
        layout = self.layout
        pos, n = 0, len(mv)
        first = layout.locate(offset)[0]
        last = layout.locate(offset + n - 1)[0]
        base = layout.record_offset(first)
        span = layout.record_offset(last) + layout.capacity(last) + OVERHEAD - base
        if len(self._batch) < span:
            self._batch = bytearray(span)
        batch = memoryview(self._batch)
        nonces = os.urandom(MUTABLE_NONCE * (last - first + 1))  # a fresh nonce per segment
        used = 0
        while pos < n:
            index, lo = layout.locate(offset + pos)
            seg = layout.capacity(index)
            take = min(seg - lo, n - pos)
            old_len = min(seg, max(0, size - layout.start(index)))
            if lo == 0 and take >= old_len:
                plain = mv[pos : pos + take]
            else:
                got = self._decrypt(index, self._plain_mv) if old_len else 0
                if got != old_len:
                    raise self._fail(index)
                if lo and self.tail is not None:
                    # Bytes before ``lo`` were written earlier (maybe committed): keep
                    # the old record until the new one is wholly on disk. Only the
                    # first segment of a write can have them, so the side file's one
                    # slot suffices. Bytes after a write are never committed ones
                    # (SQLite appends; what lies beyond is stale or this
                    # transaction's), and a cut record there reads as torn.
                    self.tail.save(index, self._rec_mv[: self._rec_len])
                end = max(old_len, lo + take)
                if end > old_len:
                    self._plain_mv[old_len:end] = bytes(end - old_len)
                self._plain_mv[lo : lo + take] = mv[pos : pos + take]
                plain = self._plain_mv[:end]
            slot = layout.record_offset(index) - base
            k = (index - first) * MUTABLE_NONCE
            batch[slot : slot + MUTABLE_NONCE] = nonces[k : k + MUTABLE_NONCE]
            self._aead.encrypt_into(batch[slot : slot + MUTABLE_NONCE], plain,
                                    self._file_id + index.to_bytes(8, "little"),
                                    batch[slot + MUTABLE_NONCE : slot + len(plain) + OVERHEAD])
            used = slot + len(plain) + OVERHEAD
            pos += take
        where = base
        if os.pwrite(self.fd, batch[:used], where) != used:
            raise OSError(f"{self.path}: short write at offset {where}")  # pragma: no cover

    def truncate(self, size: int) -> None:
        """Cut or zero-extend the plaintext to ``size`` bytes."""
        current = self.size()
        if size >= current:
            if size > current:
                self._write_range(memoryview(bytes(size - current)), current, current)
            else:
                index, lo = self.layout.locate(size)
                raw = self.layout.record_offset(index)
                if lo == 0 and os.lseek(self.fd, 0, os.SEEK_END) > raw:
                    os.ftruncate(self.fd, raw)  # drop a cut record that size() ignored
            return
        count, rest = self.layout.locate(size)
        if rest:
            got = self._decrypt(count, self._plain_mv)
            if got < rest:
                raise self._fail(count)
            if self.tail is not None:
                self.tail.save(count, self._rec_mv[: self._rec_len])
            os.ftruncate(self.fd, self.layout.record_offset(count))
            self._encrypt_write(count, self._plain_mv[:rest])
        else:
            os.ftruncate(self.fd, self.layout.record_offset(count))

    def sync(self) -> None:
        os.fsync(self.fd)

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

import os
import struct
import threading

from cryptography.exceptions import InvalidTag

from ..errors import SegmentAuthenticationError, TruncatedFileError
from ._cipher import TAG_SIZE, new_aead
from ._header import Header, Kind
from ._layout import MUTABLE_NONCE, OVERHEAD, SegmentLayout
from ._sealed import segment_error

__all__ = ["MUTABLE_NONCE", "MutableStore", "mutable_layout", "store_layout"]
_AD = struct.Struct("<16sQ")
#: Whole segments per batched read or write (one syscall each way).
_RUN = 64


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


class MutableStore:
    """Positional reads and writes of a mutable or framed file's plaintext over a descriptor.

    ``pread`` is safe from several threads; writes must be serialised by the
    caller (SQLite's locks, or the file object's lock). Each segment write is a
    single ``pwrite`` of the whole record, so a process killed mid-write leaves
    every segment either old or new.
    """

    def __init__(self, fd: int, header: Header, dek: bytes, path: str | None = None,
                 *, writable: bool = False) -> None:
        if header.kind not in Kind.WRITABLE:
            raise ValueError("MutableStore needs a mutable or framed header")
        self._fd = fd
        self._aead = new_aead(dek)
        self._file_id = header.file_id
        self.header = header
        self.path = path
        self.writable = writable
        self.segment_size = header.segment_size
        self.layout = SegmentLayout.of(header)
        self._lock = threading.Lock()
        self._local = threading.local()
        self.segment_count, self.size = store_layout(os.fstat(fd).st_size, header, path)

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
                             index == self.segment_count - 1)

    def _decrypt_into(self, index: int, out: memoryview) -> None:
        n = len(out)
        record = os.pread(self._fd, n + OVERHEAD, self._offset(index))
        if len(record) != n + OVERHEAD:
            raise self._fail(index)
        try:
            self._aead.decrypt_into(
                record[:MUTABLE_NONCE], memoryview(record)[MUTABLE_NONCE:],
                _AD.pack(self._file_id, index), out,
            )
        except InvalidTag:
            # OpenSSL has already written unauthenticated plaintext here: wipe it.
            out[:] = bytes(len(out))
            raise self._fail(index) from None

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
        buf = bytearray(max(0, min(n, self.size - offset)))
        got = self.readinto_at(buf, offset)
        return bytes(memoryview(buf)[:got])

    read_at = pread

    def close(self) -> None:
        """The file descriptor belongs to the caller; nothing to release here."""

    def readinto_at(self, buf: bytearray | memoryview, offset: int) -> int:
        out = memoryview(buf).cast("B")
        if offset < 0:
            raise ValueError("negative offset")
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
            else:
                scratch = memoryview(bytearray(seg_len))
                self._decrypt_into(index, scratch)
                out[pos : pos + take] = scratch[lo : lo + take]
            pos += take
        return n

    def pwrite(self, data: bytes | bytearray | memoryview, offset: int) -> int:
        """Write ``data`` at ``offset``, zero-filling any gap past the end."""
        if not self.writable:
            raise OSError("file is open read-only")
        with self._lock:
            mv = memoryview(data).cast("B")
            if offset > self.size:
                self._write_range(memoryview(bytes(offset - self.size)), self.size)
            self._write_range(mv, offset)
        return len(mv)

    def _write_range(self, mv: memoryview, offset: int) -> None:
        pos, n = 0, len(mv)
        run: list[tuple[int, memoryview]] = []  # whole segments, written in one pwrite
        while pos < n:
            index, lo = self.layout.locate(offset + pos)
            take = min(self.layout.capacity(index) - lo, n - pos)
            old_len = self._seg_len(index)
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
                self._decrypt_into(index, memoryview(cur))
            if len(cur) < lo + take:
                cur.extend(bytes(lo + take - len(cur)))
            cur[lo : lo + take] = mv[pos : pos + take]
            self._write_run([(index, memoryview(cur))])
            pos += take
        if run:
            self._write_run(run)

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

    def _scratch(self, n: int) -> memoryview:
        """A per-thread buffer of at least ``n`` bytes, reused (no page faults per call)."""
        buf: bytearray | None = getattr(self._local, "buf", None)
        if buf is None or len(buf) < n:
            buf = self._local.buf = bytearray(max(n, 1 << 16))
        return memoryview(buf)[:n]

    def _decrypt_run(self, first: int, count: int, out: memoryview) -> None:
        """``count`` whole consecutive segments from one read, each authenticated in place."""
        total = len(out)
        records = self._scratch(total + count * OVERHEAD)
        got = os.preadv(self._fd, [records], self._offset(first))
        at = dst = 0
        for index in range(first, first + count):
            n = self._seg_len(index)
            if got < at + n + OVERHEAD:
                raise self._fail(index)
            target = out[dst : dst + n]
            try:
                self._aead.decrypt_into(records[at : at + MUTABLE_NONCE],
                                        records[at + MUTABLE_NONCE : at + n + OVERHEAD],
                                        _AD.pack(self._file_id, index), target)
            except InvalidTag:
                target[:] = bytes(n)  # OpenSSL wrote unauthenticated plaintext: wipe it
                raise self._fail(index) from None
            at += n + OVERHEAD
            dst += n

    def truncate(self, size: int) -> None:
        """Cut or zero-extend the plaintext to ``size`` bytes."""
        if not self.writable:
            raise OSError("file is open read-only")
        with self._lock:
            if size > self.size:
                self._write_range(memoryview(bytes(size - self.size)), self.size)
                return
            if size == self.size:
                return
            count, rest = self.layout.locate(size)  # keep segments 0..count-1, then rest bytes
            if rest:
                cur = bytearray(self._seg_len(count))
                self._decrypt_into(count, memoryview(cur))
                keep = cur[:rest]
                record = self._encrypt(count, keep)
                os.ftruncate(self._fd, self._offset(count))
                os.pwrite(self._fd, record, self._offset(count))
                self.segment_count = count + 1
            else:
                os.ftruncate(self._fd, self._offset(count))
                self.segment_count = count
            self.size = size

    def sync(self) -> None:
        os.fsync(self._fd)

"""Sealed files: written once as a stream, then read at random offsets.

Segment ``i`` of ``n`` is ``AES-GCM(DEK, nonce_i, plaintext_i, ad=b"")`` where
``nonce_i = 0x000000 || u64be(i) || (1 if i == n-1 else 0)``: the same
construction as Tink's streaming AEAD and age's STREAM. The last-segment flag
catches truncation at a segment boundary, the index catches reordering, and
the per-file random data key catches splicing between files.

Segments are decrypted and encrypted by the C extension ``_cseal`` when it was
built (AES-GCM from intel-ipsec-mb; a run of consecutive segments per call, without
the GIL, so several threads' scans run in parallel), else by ``cryptography``, one
call per segment with the GIL held; both read and write the same files.
``CRYPTDISK_SEALED_AEAD=cryptography`` (read at import) uses ``cryptography`` even
where the extension is built.

Lower tier: these classes trust their caller to pass the right header and
data key; :func:`cryptdisk.open` is the safe entry point.
"""

from __future__ import annotations

import importlib
import os
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from cryptography.exceptions import InvalidTag

from ..errors import SegmentAuthenticationError, TruncatedFileError
from ._cipher import TAG_SIZE, new_aead
from ._header import HEADER_SIZE, Header, Kind
from ._source import FdSource, Source, borrowed

__all__ = ["SealedReader", "SealedWriter", "iter_sealed_stream", "pack_spans", "sealed_layout",
           "sealed_library", "sealed_nonce", "segment_error"]

_NONCE = struct.Struct(">3xQB")

#: ``CRYPTDISK_SEALED_AEAD=cryptography`` keeps sealed files on ``cryptography``.
AEAD_ENV = "CRYPTDISK_SEALED_AEAD"

try:  # the C extension, which has no type stubs (Any)
    _cseal: Any = importlib.import_module(f"{__package__}._cseal")
except ImportError:  # pragma: no cover - not built (setup.py says why) or no AES-NI
    _cseal = None
if os.environ.get(AEAD_ENV, "").strip().lower() == "cryptography":
    _cseal = None
#: The extension has the one-call packed read (an extension built from older sources: not)
_SPANS = _cseal is not None and hasattr(_cseal.Key, "decrypt_spans")
#: ... and reads the ciphertext itself from a file descriptor (``pread_run``, ``pread_spans``)
_PREAD = _SPANS and hasattr(_cseal.Key, "pread_spans")


def sealed_library() -> str | None:
    """The library of the C segment loops (``"intel-ipsec-mb 1.3.0 (AVX-512)"``), or None
    when sealed files use ``cryptography`` (extension not built, or ``CRYPTDISK_SEALED_AEAD``)."""
    return str(_cseal.library()) if _cseal is not None else None


def _native_key(dek: bytes | bytearray | memoryview) -> Any:
    """The C extension's key object for ``dek`` (schedule and GHASH key precomputed), or None."""
    return _cseal.Key(dek) if _cseal is not None else None


def sealed_nonce(index: int, last: bool) -> bytes:
    """The 12-byte nonce of segment ``index``."""
    return _NONCE.pack(index, 1 if last else 0)


def sealed_layout(file_size: int, segment_size: int, path: str | None = None) -> tuple[int, int]:
    """``(segment_count, plaintext_size)`` of a sealed file of ``file_size`` bytes.

    Every segment but the last holds exactly ``segment_size`` bytes; the last
    holds fewer (possibly none), so the file size alone fixes the layout.
    Raises :class:`TruncatedFileError` when the size cannot be a whole file.
    """
    body = file_size - HEADER_SIZE
    record = segment_size + TAG_SIZE
    full, rest = divmod(max(body, 0), record)
    if body < TAG_SIZE or rest < TAG_SIZE:
        where = f"{path}: " if path else ""
        raise TruncatedFileError(
            f"{where}file is truncated: it ends before its final segment",
            offset=max(file_size, 0), path=path,
        )
    return full + 1, full * segment_size + rest - TAG_SIZE


def segment_error(path: str | None, index: int, offset: int,
                  last: bool) -> SegmentAuthenticationError:
    """The error for segment ``index`` failing to authenticate.

    The file's length fits its header (:func:`sealed_layout` refuses one that cannot), so
    a failing last segment cannot tell a file cut short (a copy or download that stopped,
    a full disk) from an edit inside it or a body sealed under another data key: the
    message names all three and claims none.
    """
    where = f"{path}: " if path else ""
    why = (": it is the file's last segment, and either its bytes were altered, the file "
           "was truncated (cut short), or it was sealed with a different key") if last else (
           ": its bytes were altered, or it was sealed with a different key")
    return SegmentAuthenticationError(
        f"{where}failed to decrypt and authenticate segment {index} at offset {offset}{why}",
        offset=offset, path=path,
    )


def pack_spans(out: memoryview, offset: int, spans: list[tuple[int, int]]) -> int:
    """Move ``spans`` (``(a, b)`` offsets of the bytes in ``out``, which start at
    ``offset``; in order, not overlapping) together to ``out``'s start; returns their
    bytes. ValueError for a span out of order or outside ``out``."""
    at, prev, end = 0, offset, offset + len(out)
    for a, b in spans:
        if a < prev or b < a or b > end:
            raise ValueError(f"span ({a}, {b}) is not in order inside [{offset}, {end})")
        if a - offset != at:
            out[at : at + b - a] = out[a - offset : b - offset]
        at += b - a
        prev = b
    return at


# Two threads saturate this kind of machine. A read of many whole segments decrypts half of
# them on a pool thread; the C runs release the GIL, so the halves run at once on two cores.
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
PARALLEL_MIN_SEGMENTS = 8
#: The same for the C runs: the hand-off to the pool costs some 40-70 us of CPU (measured on
#: a loaded 2-core machine), worth it against the ~0.3 ms two cores save on 32 segments.
NATIVE_PARALLEL_MIN_SEGMENTS = 32
#: Reads of this much or more (a default segment) drop the mapped ciphertext they consumed,
#: so streaming keeps RSS small: a database scan reads each row group's column chunk once,
#: often well under 1 MiB (64Ki BIGINTs are 512 KiB), and kept every such chunk mapped.
RELEASE_MIN = 1 << 16
#: Whole segments a writer seals per call with the C extension: 1 MiB of 64 KiB ones.
_SEAL_RUN = 16


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2),
                                       thread_name_prefix="cryptdisk-aead")
        return _POOL


def _forget_pool() -> None:
    """A forked child has none of the pool's threads (it would wait forever): start afresh."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


class SealedWriter:
    """Encrypt a stream of plaintext into a sealed file, one segment at a time.

    Memory stays at about two segments whatever the file size (with the C extension,
    a segment and a 1 MiB run of sealed segments for large writes). Each sealed
    segment is one ``write`` to ``raw``. ``close()``
    seals the final segment (possibly empty) and must be called exactly once;
    a writer that is never closed leaves a file without a final segment, which
    readers reject as truncated.
    """

    def __init__(self, raw: IO[bytes], header: Header, dek: bytes) -> None:
        if header.kind != Kind.SEALED:
            raise ValueError("SealedWriter needs a sealed header")
        self._raw = raw
        self._aead = new_aead(dek)
        self._key = _native_key(dek)
        self._seg = header.segment_size
        self._buf = bytearray(self._seg)
        self._fill = 0
        self._out = bytearray(self._seg + TAG_SIZE)
        self._index = 0
        self._closed = False
        self.plaintext_size = 0
        raw.write(header.to_bytes())

    def _seal(self, data: memoryview | bytearray, last: bool) -> None:
        n = len(data)
        out = memoryview(self._out)[: n + TAG_SIZE]
        if self._key is not None:
            index = self._index
            # a run of one segment; "final" is this index only for the last segment
            self._key.encrypt_run(data, out, index, index, index if last else index + 1,
                                  self._seg, n if last else 0)
        else:
            self._aead.encrypt_into(sealed_nonce(self._index, last), data, None, out)
        self._raw.write(out)
        self._index += 1

    def _seal_whole(self, data: memoryview) -> None:
        """Seal ``data``, a whole number of full segments (none of them the last): with the
        C extension in runs of up to ``_SEAL_RUN`` segments, one call each. Each segment is
        still one write: a 1 MiB write makes the page cache hold the file in large folios,
        which a memory-mapped reader then maps whole, past the ranges it drops after
        reading (tests/db/test_db_memory.py: 2.9 MB of a scanned table stayed mapped
        against 0.15 MB)."""
        seg = self._seg
        count = len(data) // seg
        if self._key is None or count == 1:
            for k in range(count):
                self._seal(data[k * seg : (k + 1) * seg], False)
            return
        record = seg + TAG_SIZE
        if len(self._out) < _SEAL_RUN * record:
            self._out = bytearray(_SEAL_RUN * record)
        out = memoryview(self._out)
        for k in range(0, count, _SEAL_RUN):
            m = min(_SEAL_RUN, count - k)
            first = self._index
            self._key.encrypt_run(data[k * seg : (k + m) * seg], out[: m * record], first,
                                  first + m - 1, first + m, seg, 0)
            write = self._raw.write
            for at in range(0, m * record, record):
                write(out[at : at + record])
            self._index += m

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._closed:
            raise ValueError("write to a closed SealedWriter")
        mv = memoryview(data).cast("B")
        total = len(mv)
        pos = 0
        seg = self._seg
        if self._fill:
            take = min(seg - self._fill, total)
            self._buf[self._fill : self._fill + take] = mv[:take]
            self._fill += take
            pos = take
            if self._fill < seg:
                self.plaintext_size += total
                return total
            self._seal(memoryview(self._buf), False)
            self._fill = 0
        whole = (total - pos) // seg * seg
        if whole:
            # Whole segments straight from the caller's buffer, no copy: the final
            # segment is always the short one, so a full segment is never the last.
            self._seal_whole(mv[pos : pos + whole])
            pos += whole
        rest = total - pos
        self._buf[:rest] = mv[pos:]
        self._fill = rest
        self.plaintext_size += total
        return total

    def close(self) -> None:
        if self._closed:
            return
        self._seal(memoryview(self._buf)[: self._fill], True)
        self._closed = True


class SealedReader:
    """Random-access, authenticated reads of a sealed file.

    Thread-safe: reads are positional and hold no shared position. Each read
    authenticates every segment it touches before any of its bytes are copied
    out; the final segment is authenticated when the reader is created.
    """

    def __init__(self, source: Source, header: Header, dek: bytes, path: str | None = None,
                 *, check_final: bool = True) -> None:
        self._src = source
        self._aead = new_aead(dek)
        self._key = _native_key(dek)
        self.header = header
        self.path = path
        self.segment_size = header.segment_size
        self._record = self.segment_size + TAG_SIZE
        self.segment_count, self.size = sealed_layout(source.size, self.segment_size, path)
        self._final_size = self.size - (self.segment_count - 1) * self.segment_size
        self._local = threading.local()
        #: where the C extension reads the ciphertext itself (pread, a chunk at a time: it
        #: is still in the CPU's cache when it is decrypted), else None
        self._fd = source.fd if isinstance(source, FdSource) and self._key is not None \
            and _PREAD else None
        if check_final:
            self._decrypt_segment(self.segment_count - 1)

    # -- one segment ---------------------------------------------------------

    def _seg_plain_len(self, index: int) -> int:
        if index < self.segment_count - 1:
            return self.segment_size
        return self.size - index * self.segment_size

    def _fail(self, index: int) -> SegmentAuthenticationError | TruncatedFileError:
        offset = HEADER_SIZE + index * self._record
        fd = getattr(self._src, "fd", None)
        try:
            now = os.fstat(fd).st_size if fd is not None else self._src.size
        except OSError:
            now = self._src.size
        if now < self._src.size:  # truncated since it was opened (by another process)
            where = f"{self.path}: " if self.path else ""
            return TruncatedFileError(
                f"{where}file is truncated: it was cut short to {now} bytes while being read "
                f"(segment {index} at offset {offset} is gone)", offset=now, path=self.path)
        return segment_error(self.path, index, offset, index == self.segment_count - 1)

    def _decrypt_into(self, index: int, out: memoryview) -> None:
        n = self._seg_plain_len(index)
        record = self._src.view(HEADER_SIZE + index * self._record, n + TAG_SIZE)
        if len(record) != n + TAG_SIZE:
            raise self._fail(index)
        if self._key is not None:  # authenticates, or wipes ``out`` and names the segment
            if self._key.decrypt_run(record, out, index, index, self.segment_count - 1,
                                     self.segment_size, self._final_size) >= 0:
                raise self._fail(index)
            return
        last = index == self.segment_count - 1
        try:
            self._aead.decrypt_into(sealed_nonce(index, last), record, None, out)
        except InvalidTag:
            # OpenSSL has already written unauthenticated plaintext here: wipe it.
            out[:] = bytes(len(out))
            raise self._fail(index) from None

    def _decrypt_segment(self, index: int) -> memoryview:
        """Plaintext of one segment, cached per thread (small sequential reads reuse it)."""
        local = self._local
        if getattr(local, "index", None) == index:
            mv: memoryview = local.view
            return mv
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(self.segment_size)
        local.index = None
        view = memoryview(buf)[: self._seg_plain_len(index)]
        self._decrypt_into(index, view)
        local.index, local.view = index, view
        return view

    # -- ranges --------------------------------------------------------------

    def advise(self, offset: int, n: int, need: bool) -> None:
        """A hint about the ciphertext of plaintext ``[offset, offset+n)``: ``need`` (about
        to be read: start reading it from disk now) or not (read: drop it from this
        process's memory; the OS page cache keeps it). Reads of at least ``RELEASE_MIN``
        give both hints themselves unless told not to (``advise=False``)."""
        n = min(n, self.size - offset)
        if n <= 0 or offset < 0:
            return
        seg = self.segment_size
        first, last = offset // seg, (offset + n - 1) // seg
        start, length = HEADER_SIZE + first * self._record, (last - first + 1) * self._record
        if need:
            self._src.willneed(start, length)
        else:
            self._src.release(start, length)

    def readinto_at(self, buf: bytearray | memoryview, offset: int, *, advise: bool = True,
                    parallel: bool = True) -> int:
        """Fill ``buf`` with plaintext from ``offset``; returns the bytes read (0 at EOF).

        ``advise=False``: no hints to the source (the caller gives them, once for several
        reads, with :meth:`advise`); ``parallel=False``: on this thread only, however
        many segments (the caller's threads are the parallelism).
        """
        out = memoryview(buf).cast("B")
        if offset < 0:
            raise ValueError("negative offset")
        n = min(len(out), max(0, self.size - offset))
        if n == 0:
            return 0
        seg = self.segment_size
        first, last = offset // seg, (offset + n - 1) // seg
        advise = advise and n >= RELEASE_MIN
        if advise:  # all of this read's ciphertext, and only it, from disk at once
            self._src.willneed(HEADER_SIZE + first * self._record,
                               (last - first + 1) * self._record)
        if not parallel and offset % seg == 0 and (
                (offset + n) % seg == 0 or offset + n == self.size):
            self._decrypt_run(first, last, out[:n])  # whole segments only: one tight loop
        else:
            self._decrypt_parts(offset, n, out, first, last, parallel)
        if advise:
            self._src.release(HEADER_SIZE + first * self._record,
                              (last - first + 1) * self._record)
        return n

    def readinto_spans(self, buf: bytearray | memoryview, offset: int,
                       spans: list[tuple[int, int]]) -> int:
        """Plaintext ``[offset, offset + len(buf))`` into ``buf`` (on this thread, no
        hints: the caller gives them), then ``spans`` (``(a, b)`` plaintext offsets inside
        that range, in order, not overlapping) packed together at its start; returns the
        packed bytes. Every segment of the range authenticates before this returns, or it
        raises (with the C extension ``buf`` is then wiped). With the C extension this is
        one call that releases the GIL once (the shared first and last segments, the run
        between them and the packing), where :meth:`readinto_at` and a Python loop
        moving the spans took the GIL back several times a read (docs/engine-profile.md)."""
        out = memoryview(buf).cast("B")
        n = len(out)
        if offset < 0 or offset + n > self.size:
            raise ValueError(f"plaintext [{offset}, {offset + n}) is not inside the file's "
                             f"{self.size} bytes")
        if n and self._key is not None and _SPANS:
            seg, record = self.segment_size, self._record
            first, last = offset // seg, (offset + n - 1) // seg
            final = self.segment_count - 1
            size = (last - first) * record + (self.size - last * seg if last == final
                                              else seg) + TAG_SIZE
            if self._fd is not None:  # read and decrypted in one call, without the GIL
                failed, packed = self._key.pread_spans(
                    self._fd, HEADER_SIZE + first * record, out, first, last, final, seg,
                    self._final_size, offset, spans)
                if failed >= 0:
                    raise self._fail(failed)
                return int(packed)
            with borrowed(self._src, HEADER_SIZE + first * record, size) as cipher:
                if len(cipher) == size:
                    failed, packed = self._key.decrypt_spans(
                        cipher, out, first, last, final, seg, self._final_size, offset, spans)
                    if failed >= 0:
                        raise self._fail(failed)
                    return int(packed)
        if n:
            self.readinto_at(out, offset, advise=False, parallel=False)
        return pack_spans(out, offset, spans)

    def _decrypt_run(self, first: int, last: int, out: memoryview) -> None:
        """Decrypt whole segments ``first..last`` into ``out`` on this thread, from one view
        of their ciphertext: per segment a slice, a nonce and the AEAD call (a database
        scan decrypts some 1,400 segments per 8-byte column of 10M rows; callgrind: a
        third less Python than through :meth:`_decrypt_into`). Each segment authenticates
        before its plaintext is written; one that fails is wiped and raises, as there."""
        seg, record = self.segment_size, self._record
        final = self.segment_count - 1
        size = (last - first) * record + (self.size - last * seg if last == final else seg) \
            + TAG_SIZE
        if self._fd is not None:  # read and decrypted in one call, without the GIL
            failed = self._key.pread_run(self._fd, HEADER_SIZE + first * record, out, first,
                                         last, final, seg, self._final_size)
            if failed >= 0:
                raise self._fail(failed)
            return
        with borrowed(self._src, HEADER_SIZE + first * record, size) as cipher:
            if self._key is not None and len(cipher) == size:
                # one call for the run, without the GIL: -1, or the segment that failed
                # (wiped)
                failed = self._key.decrypt_run(cipher, out, first, last, final, seg,
                                               self._final_size)
                if failed >= 0:
                    raise self._fail(failed)
                return
            decrypt, pack = self._aead.decrypt_into, _NONCE.pack
            at = pos = 0
            for index in range(first, last + 1):  # (a short ``cipher``: the file ends early)
                n = seg if index < final else self.size - index * seg
                chunk = cipher[at : at + n + TAG_SIZE]
                dst = out[pos : pos + n]
                if len(chunk) != n + TAG_SIZE:
                    raise self._fail(index)
                try:
                    decrypt(pack(index, index == final), chunk, None, dst)
                except InvalidTag:
                    # OpenSSL has already written unauthenticated plaintext here: wipe it.
                    dst[:] = bytes(n)
                    raise self._fail(index) from None
                at += record
                pos += n

    def _decrypt_parts(self, offset: int, n: int, out: memoryview, first: int, last: int,
                       parallel: bool) -> None:
        """Plaintext ``[offset, offset+n)`` of segments ``first..last`` into ``out``: a
        partial first or last segment decrypted whole (authenticated) into the thread's
        segment buffer and its part copied, the whole segments between straight into
        ``out``. Constant Python work per read, whatever the number of segments (a loop
        over them cost about 1 us a segment: with 16 KiB segments, more than the AES-GCM
        of the edges it saved)."""
        seg = self.segment_size
        end = offset + n
        lo, hi = first, last  # the whole segments: lo..hi
        head = tail = 0  # plaintext bytes from a partial first / last segment
        if offset % seg or end < first * seg + self._seg_plain_len(first):
            head = min(end, first * seg + self._seg_plain_len(first)) - offset
            out[:head] = self._decrypt_segment(first)[offset - first * seg :
                                                       offset - first * seg + head]
            lo = first + 1
        if last >= lo and end < last * seg + self._seg_plain_len(last):
            tail = end - last * seg
            out[n - tail : n] = self._decrypt_segment(last)[:tail]
            hi = last - 1
        if hi < lo:
            return
        if self._key is not None:
            self._decrypt_whole(lo, hi, out[head : n - tail], parallel)
            return
        whole = [(index, out[head + (index - lo) * seg :
                             head + (index - lo) * seg + self._seg_plain_len(index)])
                 for index in range(lo, hi + 1)]
        if parallel:
            self._decrypt_many(whole)
        else:
            self._decrypt_many_serial(whole)

    def _decrypt_whole(self, first: int, last: int, out: memoryview, parallel: bool) -> None:
        """Whole segments ``first..last`` with the C extension: one run, or from
        ``NATIVE_PARALLEL_MIN_SEGMENTS`` on with ``parallel`` two halves, one on the pool."""
        if not parallel or last - first + 1 < NATIVE_PARALLEL_MIN_SEGMENTS:
            self._decrypt_run(first, last, out)
            return
        mid = (first + last + 1) // 2
        split = (mid - first) * self.segment_size
        future = _pool().submit(self._decrypt_run, mid, last, out[split:])
        try:
            self._decrypt_run(first, mid - 1, out[:split])
        finally:
            failed = future.exception()  # waits: nothing writes into ``out`` after we return
        if failed is not None:
            raise failed

    def _decrypt_many(self, jobs: list[tuple[int, memoryview]]) -> None:
        if len(jobs) < PARALLEL_MIN_SEGMENTS:
            for index, dst in jobs:
                self._decrypt_into(index, dst)
            return
        half = len(jobs) // 2
        run: Callable[[list[tuple[int, memoryview]]], None] = self._decrypt_many_serial
        future = _pool().submit(run, jobs[half:])
        run(jobs[:half])
        future.result()

    def _decrypt_many_serial(self, jobs: list[tuple[int, memoryview]]) -> None:
        for index, dst in jobs:
            self._decrypt_into(index, dst)

    def read_at(self, offset: int, n: int) -> bytes:
        """``n`` plaintext bytes from ``offset`` (fewer at end of file)."""
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        seg = self.segment_size
        index = offset // seg
        if offset % seg == 0 and n == self._seg_plain_len(index):
            if self._key is not None:  # without the GIL, then one copy
                buf = bytearray(n)
                self._decrypt_into(index, memoryview(buf))
                return bytes(buf)
            # Exactly one segment: decrypt straight into a new bytes object.
            last = index == self.segment_count - 1
            record = self._src.view(HEADER_SIZE + index * self._record, n + TAG_SIZE)
            try:
                return self._aead.decrypt(sealed_nonce(index, last), record, None)
            except InvalidTag:
                raise self._fail(index) from None
        buf = bytearray(n)
        self.readinto_at(buf, offset)
        return bytes(buf)

    def verify(self, progress: Callable[[int], None] | None = None) -> int:
        """Authenticate every segment; returns the plaintext size."""
        scratch = memoryview(bytearray(self.segment_size))
        done = 0
        for index in range(self.segment_count):
            self._decrypt_into(index, scratch[: self._seg_plain_len(index)])
            if progress is not None:
                progress(self._seg_plain_len(index))
            offset = HEADER_SIZE + (index + 1) * self._record
            if offset - done >= RELEASE_MIN:
                self._src.release(done, offset - done)
                done = offset
        return self.size

    def close(self) -> None:
        self._local = threading.local()
        self._src.close()


def iter_sealed_stream(
    raw: IO[bytes], header: Header, dek: bytes, path: str | None = None
) -> Iterator[memoryview]:
    """Decrypt a sealed file from a non-seekable stream (after its header), segment by segment.

    Each yielded segment has authenticated. The final segment is the short one
    (less than a whole segment, possibly empty), so no look-ahead is needed; a
    stream that ends without it fails as truncated.
    """
    aead, key = new_aead(dek), _native_key(dek)
    record = header.segment_size + TAG_SIZE
    where = f"{path}: " if path else ""
    out = bytearray(header.segment_size)

    def read_record() -> bytes:
        chunks, left = [], record
        while left:
            chunk = raw.read(left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    index = 0
    while True:
        current = read_record()
        offset = HEADER_SIZE + index * record
        last = len(current) < record
        if last and len(current) < TAG_SIZE:
            raise TruncatedFileError(f"{where}file is truncated: it ends before its final segment",
                                     offset=offset + len(current), path=path)
        view = memoryview(out)[: len(current) - TAG_SIZE]
        if key is not None:  # ``final`` is this index only for the last segment
            if key.decrypt_run(current, view, index, index, index if last else index + 1,
                               header.segment_size, len(view) if last else 0) >= 0:
                raise segment_error(path, index, offset, last)
        else:
            try:
                aead.decrypt_into(sealed_nonce(index, last), current, None, view)
            except InvalidTag:
                view[:] = bytes(len(view))
                raise segment_error(path, index, offset, last) from None
        yield view
        if last:
            return
        index += 1

"""What a sealed reader asks of its source: large reads announce their ciphertext first.

A memory-mapped part read cold (not in the page cache) is paged in by faults,
and the kernel's read-around then reads ahead through the whole file: a scan
of one column pulled every column from disk. So a read of ``RELEASE_MIN``
bytes or more tells its source exactly which records it is about to
authenticate (:meth:`Source.willneed`) before touching them.
"""

from __future__ import annotations

import io
import mmap
import os

from cryptdisk import Keyring
from cryptdisk.format import HEADER_SIZE, Kind, MmapSource, SealedReader, SealedWriter, new_header
from cryptdisk.format._sealed import RELEASE_MIN

SEG = 65536
RECORD = SEG + 16


class _Recording:
    """An in-memory source that records the hints it is given."""

    def __init__(self, data: bytes) -> None:
        self.size = len(data)
        self._mv = memoryview(data)
        self.needed: list[tuple[int, int]] = []
        self.views: list[int] = []

    def view(self, offset: int, n: int) -> memoryview:
        self.views.append(offset)
        return self._mv[offset : offset + n]

    def release(self, offset: int, n: int) -> None:
        pass

    def willneed(self, offset: int, n: int) -> None:
        self.needed.append((offset, n))

    def close(self) -> None:
        pass


def _sealed(size: int) -> tuple[bytes, bytes, SealedReader, _Recording]:
    key = Keyring.single(os.urandom(32)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=SEG)
    plain = os.urandom(size)
    out = io.BytesIO()
    writer = SealedWriter(out, header, dek)
    writer.write(plain)
    writer.close()
    src = _Recording(out.getvalue())
    return plain, out.getvalue(), SealedReader(src, header, dek), src


def test_a_large_read_announces_exactly_its_records_before_reading_them():
    plain, _, reader, src = _sealed(10 * SEG + 123)
    src.needed.clear()
    src.views.clear()
    offset, n = 2 * SEG + 100, 3 * SEG  # segments 2..5, the first and last partly
    buf = bytearray(n)
    assert reader.readinto_at(buf, offset) == n
    assert bytes(buf) == plain[offset : offset + n]
    assert src.needed == [(HEADER_SIZE + 2 * RECORD, 4 * RECORD)]
    assert min(src.views) >= HEADER_SIZE + 2 * RECORD  # and reads inside what it announced
    assert max(src.views) < HEADER_SIZE + 6 * RECORD


def test_small_reads_give_no_hint():
    plain, _, reader, src = _sealed(4 * SEG)
    src.needed.clear()
    buf = bytearray(RELEASE_MIN - 1)
    assert reader.readinto_at(buf, 5) == len(buf)
    assert bytes(buf) == plain[5 : 5 + len(buf)]
    assert src.needed == []


def test_a_read_to_the_end_of_the_file_announces_its_last_records():
    plain, _, reader, src = _sealed(3 * SEG + 10)
    src.needed.clear()
    buf = bytearray(4 * SEG)
    assert reader.readinto_at(buf, SEG) == 2 * SEG + 10
    assert bytes(buf[: 2 * SEG + 10]) == plain[SEG:]
    # segments 1..3 (the final one short); the source clips the range at its size
    assert src.needed == [(HEADER_SIZE + RECORD, 3 * RECORD)]


def test_a_mapped_source_takes_the_hint_for_any_range(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 * mmap.PAGESIZE + 7))
    fd = os.open(path, os.O_RDONLY)
    try:
        src = MmapSource(fd, os.fstat(fd).st_size)
        for offset, n in [(0, 1), (5, mmap.PAGESIZE), (mmap.PAGESIZE + 1, 10**9), (-3, 0)]:
            src.willneed(offset, n)  # unaligned, past the end, empty: no error
        assert bytes(src.view(0, 4)) == path.read_bytes()[:4]
        src.close()
    finally:
        os.close(fd)

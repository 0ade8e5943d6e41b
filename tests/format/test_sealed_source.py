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
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk import Keyring
from cryptdisk.errors import SegmentAuthenticationError
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
        self.released: list[tuple[int, int]] = []

    def view(self, offset: int, n: int) -> memoryview:
        self.views.append(offset)
        return self._mv[offset : offset + n]

    def release(self, offset: int, n: int) -> None:
        self.released.append((offset, n))

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


def _mapped_pages(path, pages: int) -> list[bool]:
    """Whether each of the first ``pages`` pages of this process's mapping of ``path`` is
    mapped now (``/proc/self/maps`` and the present bit of ``/proc/self/pagemap``)."""
    with open("/proc/self/maps") as f:
        found = [line for line in f if line.rstrip().endswith(str(path))]
    assert len(found) == 1, found
    base = int(found[0].split("-")[0], 16)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(base // mmap.PAGESIZE * 8)
        raw = f.read(pages * 8)
    return [bool(int.from_bytes(raw[i * 8 : i * 8 + 8], "little") >> 63) for i in range(pages)]


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="needs /proc/self/pagemap")
def test_a_mapped_source_drops_only_the_released_range_from_memory(tmp_path):
    page = mmap.PAGESIZE
    around = (1 << 16) // page  # the fault-around the release takes with it
    path = tmp_path / "f"
    data = os.urandom(256 * page)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        src = MmapSource(fd, len(data))
        keep = src.view(200 * page, 40 * page)  # a view in use elsewhere
        assert bytes(src.view(0, len(data))) == data  # every page faulted in
        assert all(_mapped_pages(path, 256))
        src.release(40 * page + 5, 60 * page)
        gone = range(40 - around, 100 + around)  # the pages it touched, and 64 KiB around
        assert _mapped_pages(path, 256) == [i not in gone for i in range(256)]
        assert bytes(src.view(0, len(data))) == data  # read again from the page cache
        assert bytes(keep) == data[200 * page : 240 * page]
        keep.release()
        src.close()
        src.release(0, len(data))  # after close: nothing, no error
    finally:
        os.close(fd)


def test_a_read_told_not_to_advise_gives_no_hint_and_advise_gives_them_for_the_range():
    plain, _, reader, src = _sealed(10 * SEG + 123)
    src.needed.clear()
    offset, n = 2 * SEG + 100, 3 * SEG  # segments 2..5
    reader.advise(offset, n, True)
    assert src.needed == [(HEADER_SIZE + 2 * RECORD, 4 * RECORD)]
    buf = bytearray(n)
    assert reader.readinto_at(buf, offset, advise=False, parallel=False) == n
    assert bytes(buf) == plain[offset : offset + n]
    assert len(src.needed) == 1 and src.released == []  # the read itself hinted nothing
    reader.advise(offset, n, False)
    assert src.released == [(HEADER_SIZE + 2 * RECORD, 4 * RECORD)]
    reader.advise(10 * SEG + 200, 5, True)  # past the end, negative: nothing, no error
    reader.advise(-1, 5, False)
    assert len(src.needed) == 1 and len(src.released) == 1


@pytest.mark.parametrize("parallel", [True, False])
def test_a_serial_read_authenticates_every_segment_as_a_parallel_one_does(parallel):
    key = Keyring.single(os.urandom(32)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=SEG)
    out = io.BytesIO()
    writer = SealedWriter(out, header, dek)
    writer.write(os.urandom(12 * SEG))
    writer.close()
    damaged = bytearray(out.getvalue())
    damaged[HEADER_SIZE + 9 * RECORD + 5] ^= 1  # segment 9 of the 12 the read covers
    reader = SealedReader(_Recording(bytes(damaged)), header, dek)
    buf = bytearray(12 * SEG)
    with pytest.raises(SegmentAuthenticationError, match="segment 9"):
        reader.readinto_at(buf, 0, advise=False, parallel=parallel)
    assert bytes(buf[9 * SEG : 10 * SEG]) == bytes(SEG)  # no unauthenticated plaintext


@pytest.mark.parametrize(("first", "count"), [(0, 1), (3, 4), (7, 4), (0, 11), (10, 1)])
def test_a_serial_read_of_whole_segments_equals_a_parallel_one(first, count):
    # 10 full segments and a short final one (index 10); reads ending at the file's end
    # take the final segment, whose nonce is flagged last
    plain, _data, reader, _src = _sealed(10 * SEG + 321)
    offset = first * SEG
    want = plain[offset : offset + count * SEG]
    serial, parallel = bytearray(count * SEG), bytearray(count * SEG)
    assert reader.readinto_at(serial, offset, advise=False, parallel=False) == len(want)
    assert reader.readinto_at(parallel, offset) == len(want)
    assert bytes(serial[: len(want)]) == bytes(parallel[: len(want)]) == want


def test_a_serial_read_of_whole_segments_fails_on_a_file_cut_short_after_opening():
    key = Keyring.single(os.urandom(32)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=SEG)
    out = io.BytesIO()
    writer = SealedWriter(out, header, dek)
    plain = os.urandom(6 * SEG + 10)
    writer.write(plain)
    writer.close()
    src = _Recording(out.getvalue())
    reader = SealedReader(src, header, dek)
    src.size -= RECORD + 100  # segment 4 now ends early
    src._mv = src._mv[: src.size]
    buf = bytearray(6 * SEG)
    with pytest.raises(SegmentAuthenticationError, match="segment 4"):
        reader.readinto_at(buf, 0, advise=False, parallel=False)
    assert bytes(buf[: 4 * SEG]) == plain[: 4 * SEG]  # authenticated before the cut
    assert bytes(buf[4 * SEG :]) == bytes(2 * SEG)


def _small(size: int) -> tuple[bytes, bytes, object, bytes]:
    key = Keyring.single(os.urandom(32)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=512)
    plain = os.urandom(size)
    out = io.BytesIO()
    writer = SealedWriter(out, header, dek)
    writer.write(plain)
    writer.close()
    return plain, out.getvalue(), header, dek


@settings(max_examples=200, deadline=None)
@given(segments=st.integers(0, 6), tail=st.integers(0, 511), data=st.data())
def test_any_range_reads_its_plaintext(segments, tail, data):
    """Edge segments in part, the whole ones between them as a run, the final one short."""
    plain, sealed, header, dek = _small(segments * 512 + tail)
    reader = SealedReader(_Recording(sealed), header, dek)  # type: ignore[arg-type]
    offset = data.draw(st.integers(0, len(plain)))
    n = data.draw(st.integers(0, len(plain) - offset + 600))
    buf = bytearray(n)
    got = reader.readinto_at(buf, offset)
    assert got == min(n, len(plain) - offset)
    assert bytes(buf[:got]) == plain[offset : offset + got]


@pytest.mark.parametrize("segment", [1, 3, 5])  # the first edge, a whole one, the last edge
def test_a_tampered_segment_of_an_unaligned_read_fails_it(segment):
    _plain, sealed, header, dek = _small(6 * 512 + 40)
    damaged = bytearray(sealed)
    damaged[HEADER_SIZE + segment * (512 + 16) + 7] ^= 1
    reader = SealedReader(_Recording(bytes(damaged)), header, dek)  # type: ignore[arg-type]
    buf = bytearray(4 * 512)
    with pytest.raises(SegmentAuthenticationError, match=f"segment {segment} "):
        reader.readinto_at(buf, 512 + 100, advise=False)
    start = segment * 512 - (512 + 100)  # the failed segment's bytes in buf
    assert bytes(buf[max(0, start) : start + 512]) == bytes(len(buf[max(0, start) : start + 512]))


def _python_calls(reader: SealedReader, buf: bytearray, offset: int) -> int:
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        reader.readinto_at(buf, offset, advise=False, parallel=False)
    finally:
        sys.setprofile(None)
    return calls


def test_an_unaligned_read_costs_the_same_python_for_any_number_of_segments():
    """Through the C extension, a read with partial first and last segments makes the same
    Python calls for 3 segments as for 300: the partial edges, then one call for the whole
    segments between (before, a loop over every segment of the range built its slices,
    which made small segments cost more Python per byte than their AES-GCM saved)."""
    plain, sealed, header, dek = _small(400 * 512)
    reader = SealedReader(_Recording(sealed), header, dek)  # type: ignore[arg-type]
    assert reader._key is not None  # the C extension (intel-ipsec-mb) is built in
    counts = []
    for segments in (3, 30, 300):
        offset, n = 512 + 100, (segments - 1) * 512
        buf = bytearray(n)
        counts.append(_python_calls(reader, buf, offset))
        assert bytes(buf) == plain[offset : offset + n]
        reader._local.index = None  # (a fresh thread's buffer: no segment cached)
    assert counts[0] == counts[1] == counts[2], counts

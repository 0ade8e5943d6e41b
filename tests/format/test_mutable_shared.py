"""MutableStore's options for files other processes write at once (SQLite's files).

``shared`` asks the file system for the size at every call and tolerates a cut
last record; ``tail`` falls back to a record saved before an in-place rewrite;
``torn_as_hole`` reads a record that never authenticates as zeros. Without
them the store raises, as the format promises for files nobody else writes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cryptdisk import Keyring
from cryptdisk.errors import SegmentAuthenticationError, TruncatedFileError
from cryptdisk.format import HEADER_SIZE, Kind, MutableStore, new_header, open_header, read_header

RING = Keyring.generate()
SEG = 512
OVERHEAD = 32


def record_offset(index: int) -> int:
    return HEADER_SIZE + index * (SEG + OVERHEAD)


class Saved:
    """A TailStore in memory: the one record saved last."""

    def __init__(self) -> None:
        self.index = -1
        self.record = b""

    def save(self, index: int, record: memoryview) -> None:
        self.index, self.record = index, bytes(record)

    def load(self, index: int, into: memoryview) -> int:
        if index != self.index or len(self.record) > len(into):
            return 0
        into[: len(self.record)] = self.record
        return len(self.record)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    header, _dek = new_header(Kind.MUTABLE, RING.current_key(), segment_size=SEG)
    p = tmp_path / "f"
    p.write_bytes(header.to_bytes())
    return p


@pytest.fixture
def fds(path: Path) -> Iterator[list[int]]:
    opened: list[int] = []
    yield opened
    for fd in opened:
        os.close(fd)


def store(path: Path, fds: list[int], **options: object) -> MutableStore:
    fd = os.open(path, os.O_RDWR)
    fds.append(fd)
    header = read_header(fd, str(path))
    return MutableStore(fd, header, open_header(header, RING), str(path), writable=True,
                        **options)  # type: ignore[arg-type]


def flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 1]))


def test_a_shared_store_sees_what_another_store_wrote(path, fds):
    reader = store(path, fds, shared=True)
    cached = store(path, fds)
    writer = store(path, fds)
    writer.pwrite(b"a" * 1000, 0)
    assert reader.current_size() == 1000
    assert reader.pread(0, 2000) == b"a" * 1000
    assert cached.pread(0, 2000) == b""  # its size is the one it opened with
    writer.truncate(300)
    assert reader.pread(0, 2000) == b"a" * 300


def test_a_cut_last_record_is_left_out_of_a_shared_size(path, fds, caplog):
    store(path, fds).pwrite(b"b" * SEG, 0)
    with open(path, "ab") as f:
        f.write(os.urandom(OVERHEAD))  # an append cut by a crash: no plaintext byte
    with pytest.raises(TruncatedFileError):
        store(path, fds)
    with caplog.at_level(logging.WARNING, logger="cryptdisk.format"):
        shared = store(path, fds, shared=True)
    assert shared.current_size() == SEG
    assert any("cut record of 32 bytes" in r.getMessage() for r in caplog.records)
    shared.truncate(SEG)  # drops the cut record
    assert path.stat().st_size == record_offset(1)
    assert store(path, fds).pread(0, 2 * SEG) == b"b" * SEG


def test_a_segment_that_fails_reads_as_zeros_only_when_torn_is_a_hole(path, fds, caplog):
    store(path, fds).pwrite(b"c" * (3 * SEG), 0)
    flip(path, record_offset(1) + 40)
    with pytest.raises(SegmentAuthenticationError, match="segment 1 at offset"):
        store(path, fds, shared=True).pread(0, 3 * SEG)
    with caplog.at_level(logging.WARNING, logger="cryptdisk.format"):
        data = store(path, fds, shared=True, torn_as_hole=True).pread(0, 3 * SEG)
    assert data == b"c" * SEG + bytes(SEG) + b"c" * SEG  # only the bad segment
    assert any("does not authenticate" in r.getMessage() for r in caplog.records)


def test_an_interrupted_rewrite_reads_as_the_saved_record(path, fds):
    saved = Saved()
    writer = store(path, fds, shared=True, tail=saved)
    writer.pwrite(b"d" * 100, 0)
    writer.pwrite(b"e" * 50, 100)  # rewrites segment 0, which holds earlier bytes
    assert saved.index == 0
    flip(path, record_offset(0) + 40)  # as a write cut between kernel pages leaves it
    reader = store(path, fds, shared=True, tail=saved)
    # The segment as it was before the rewrite, then a hole up to the current size.
    assert reader.pread(0, 150) == b"d" * 100 + bytes(50)
    with pytest.raises(SegmentAuthenticationError):
        store(path, fds, shared=True).pread(0, 150)


def test_the_saved_record_of_another_segment_is_not_used(path, fds):
    saved = Saved()
    writer = store(path, fds, shared=True, tail=saved)
    writer.pwrite(b"f" * (SEG + 10), 0)
    writer.pwrite(b"g", SEG + 10)  # saves segment 1
    assert saved.index == 1
    flip(path, record_offset(0) + 40)
    with pytest.raises(SegmentAuthenticationError, match="segment 0 at offset"):
        store(path, fds, shared=True, tail=saved).pread(0, SEG)


def test_a_shared_read_sees_a_record_lengthened_by_another_writer(path, fds):
    reader = store(path, fds, shared=True)
    writer = store(path, fds)
    writer.pwrite(b"h" * 100, 0)
    assert reader.pread(0, 100) == b"h" * 100
    writer.pwrite(b"i" * 100, 100)  # the same record, now longer
    assert reader.pread(0, 300) == b"h" * 100 + b"i" * 100

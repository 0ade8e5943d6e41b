"""Framed files (kind 3) and the segment geometry they share with mutable files.

Hypothesis properties: random writes and truncates match a bytearray model and
survive re-opening; any flipped byte of a record, and any record moved to
another index, fails authentication; ``SegmentLayout`` agrees with a
brute-force walk over the records, and with the kind-2 formula it replaced.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk import Keyring
from cryptdisk.errors import SegmentAuthenticationError, TruncatedFileError
from cryptdisk.format import (
    HEADER_SIZE,
    Kind,
    MutableStore,
    SegmentLayout,
    mutable_layout,
    new_header,
)
from cryptdisk.format._mutable import _RUN

from .framed_util import framed_store, new_framed, open_store

RING = Keyring.generate()
OVERHEAD = 32
PROPS = settings(max_examples=60, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])
# (segment size, lead, frame extra): a tiny WAL, lead > S, lead == F, lead 1, F == S
GEOMETRIES = [(512, 32, 24), (512, 600, 100), (512, 536, 24), (512, 1, 0), (1024, 32, 0)]


def _read(path: Path) -> bytes:
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        return f.read()


def _apply(model: bytearray, op: tuple[str, int, bytes]) -> None:
    what, off, data = op
    if off > len(model):
        model.extend(bytes(off - len(model)))
    if what == "w":
        model[off : off + len(data)] = data
    else:
        del model[off:]


OPS = st.lists(st.one_of(
    st.tuples(st.just("w"), st.integers(0, 4000), st.binary(max_size=1500)),
    st.tuples(st.just("t"), st.integers(0, 4500), st.just(b"")),
), max_size=20)


@PROPS
@given(geometry=st.sampled_from(GEOMETRIES), ops=OPS)
def test_random_writes_and_truncates_match_a_model(tmp_path, geometry, ops):
    seg, lead, extra = geometry
    path = tmp_path / "f"
    model = bytearray()
    with framed_store(path, RING, segment_size=seg, lead=lead, frame_extra=extra) as store:
        for op in ops:
            if op[0] == "w":
                store.pwrite(op[2], op[1])
            else:
                store.truncate(op[1])
            _apply(model, op)
            assert store.size == len(model)
        assert store.pread(0, len(model) + 10) == bytes(model)
        count = store.segment_count
    layout = SegmentLayout(lead, seg + extra)
    assert layout.measure(path.stat().st_size) == (count, len(model), 0)
    assert _read(path) == bytes(model)
    with cryptdisk.open(path, "r+b", keyring=RING) as f:
        assert f.header.kind == Kind.FRAMED
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
    assert _read(path) == bytes(model) + b"tail"


@PROPS
@given(geometry=st.sampled_from(GEOMETRIES),
       reads=st.lists(st.tuples(st.integers(0, 45000), st.integers(0, 45000)), min_size=1,
                      max_size=8))
def test_batched_reads_and_writes_span_many_segments(tmp_path, geometry, reads):
    """Runs of more than ``_RUN`` records, with segment 0 shorter or longer than the rest."""
    seg, lead, extra = geometry
    data = os.urandom(lead + (_RUN + 5) * (seg + extra) + 17)
    path = tmp_path / "f"
    with framed_store(path, RING, segment_size=seg, lead=lead, frame_extra=extra) as store:
        store.pwrite(data, 0)  # one call: batched writes of _RUN records
        assert store.segment_count == _RUN + 7
        for off, n in reads:
            assert store.pread(off, n) == data[off : off + n]
    assert _read(path) == data


def test_appending_frames_never_rewrites_earlier_records(tmp_path):
    """The point of kind 3: a WAL frame appended leaves every earlier record's bytes alone."""
    path = tmp_path / "wal"
    frame = 24 + 512
    with framed_store(path, RING, segment_size=512, lead=32, frame_extra=24) as store:
        store.pwrite(os.urandom(32), 0)
        for k in range(6):
            before = path.read_bytes()
            store.pwrite(os.urandom(frame), 32 + k * frame)
            after = path.read_bytes()
            assert after[: len(before)] == before
            assert len(after) == len(before) + frame + OVERHEAD


def _flip_target(raw: bytes, layout: SegmentLayout, pos: int) -> tuple[int, int, int]:
    """``(index, plaintext start, plaintext length)`` of the segment whose record holds ``pos``."""
    count, size, _cut = layout.measure(len(raw))
    for index in range(count):
        if layout.record_offset(index) <= pos < layout.record_offset(index + 1):
            start = layout.start(index)
            return index, start, min(layout.capacity(index), size - start)
    raise AssertionError("position outside the records")


@PROPS
@given(geometry=st.sampled_from(GEOMETRIES), size=st.integers(1, 3000),
       pos=st.integers(min_value=0), value=st.integers(1, 255))
def test_any_flipped_byte_of_a_record_fails_authentication(tmp_path, geometry, size, pos,
                                                            value):
    seg, lead, extra = geometry
    path = tmp_path / "f"
    data = os.urandom(size)
    with framed_store(path, RING, segment_size=seg, lead=lead, frame_extra=extra) as store:
        store.pwrite(data, 0)
    raw = bytearray(path.read_bytes())
    pos = HEADER_SIZE + pos % (len(raw) - HEADER_SIZE)
    raw[pos] ^= value
    path.write_bytes(raw)
    index, start, length = _flip_target(bytes(raw), SegmentLayout(lead, seg + extra), pos)
    with pytest.raises(SegmentAuthenticationError, match=f"segment {index} "):
        _read(path)
    buf = bytearray(length)
    with open_store(path, RING, writable=False) as store:
        with pytest.raises(SegmentAuthenticationError):
            store.readinto_at(buf, start)
        assert buf == bytes(length)  # nothing unauthenticated reached the buffer
        # the other segments still read: the damage is local to one record
        assert store.pread(0, start) == data[:start]
        end = start + length
        assert store.pread(end, size) == data[end:]


@PROPS
@given(geometry=st.sampled_from(GEOMETRIES), i=st.integers(0, 5), j=st.integers(0, 5),
       swap=st.booleans())
def test_a_record_moved_to_another_index_fails(tmp_path, geometry, i, j, swap):
    seg, lead, extra = geometry
    layout = SegmentLayout(lead, seg + extra)
    path = tmp_path / "f"
    with framed_store(path, RING, segment_size=seg, lead=lead, frame_extra=extra) as store:
        store.pwrite(os.urandom(layout.start(6)), 0)  # six full segments
    # only records of one length can trade places without changing the layout
    assume(i != j and layout.capacity(i) == layout.capacity(j))
    raw = path.read_bytes()
    rec = lambda k: raw[layout.record_offset(k) : layout.record_offset(k + 1)]  # noqa: E731
    parts = [rec(k) for k in range(6)]
    parts[j] = rec(i)
    if swap:
        parts[i] = rec(j)
    path.write_bytes(raw[:HEADER_SIZE] + b"".join(parts))
    with pytest.raises(SegmentAuthenticationError):
        _read(path)
    with open_store(path, RING, writable=False) as store, \
            pytest.raises(SegmentAuthenticationError, match=f"segment {j} "):
        store.pread(layout.start(j), 1)


@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_a_file_cut_inside_a_record_overhead_is_truncated(tmp_path, geometry):
    seg, lead, extra = geometry
    path = tmp_path / "f"
    data = os.urandom(lead + 2 * (seg + extra))
    with framed_store(path, RING, segment_size=seg, lead=lead, frame_extra=extra) as store:
        store.pwrite(data, 0)
    layout = SegmentLayout(lead, seg + extra)
    raw = path.read_bytes()
    for end in (layout.record_offset(0) + 1, layout.record_offset(0) + OVERHEAD,
                layout.record_offset(2) + 1, layout.record_offset(2) + OVERHEAD):
        path.write_bytes(raw[:end])
        for mode in ("rb", "r+b"):
            with pytest.raises(TruncatedFileError):
                cryptdisk.open(path, mode, keyring=RING)
    # cut at a record boundary: looks like an older, shorter file (docs/format.md)
    path.write_bytes(raw[: layout.record_offset(2)])
    assert _read(path) == data[: layout.start(2)]


def test_an_empty_framed_file_reads_empty_and_grows(tmp_path):
    path = tmp_path / "f"
    new_framed(path, RING)
    assert _read(path) == b""
    with cryptdisk.open(path, "a+b", keyring=RING) as f:
        assert f.header.kind == Kind.FRAMED
        f.write(b"x" * 40)
    assert _read(path) == b"x" * 40
    assert path.stat().st_size == HEADER_SIZE + (32 + OVERHEAD) + (8 + OVERHEAD)


def test_mutable_store_refuses_a_sealed_header(tmp_path):
    path = tmp_path / "s"
    with cryptdisk.open(path, "wb", keyring=RING) as f:
        f.write(b"sealed")
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        header = f.header
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(ValueError, match="mutable or framed"):
            MutableStore(fd, header, bytes(32))
    finally:
        os.close(fd)


# -- the geometry ---------------------------------------------------------------------


def _brute_measure(lead: int, size: int, file_size: int) -> tuple[int, int, int]:
    """Walk the records one by one: segment 0 of ``lead`` bytes, then ``size`` each."""
    pos, index, plain = HEADER_SIZE, 0, 0
    while pos < file_size:
        full = (lead if index == 0 else size) + OVERHEAD
        left = file_size - pos
        if left <= OVERHEAD:
            return index, plain, left
        take = min(full, left)
        plain += take - OVERHEAD
        pos += take
        index += 1
    return index, plain, 0


@settings(max_examples=500, deadline=None)
@given(lead=st.integers(1, 700), size=st.integers(1, 700), file_size=st.integers(0, 9000))
def test_measure_agrees_with_a_brute_force_walk(lead, size, file_size):
    assert SegmentLayout(lead, size).measure(file_size) == _brute_measure(lead, size, file_size)


@settings(max_examples=300, deadline=None)
@given(lead=st.integers(1, 700), size=st.integers(1, 700), offset=st.integers(0, 20000))
def test_locate_start_capacity_and_record_offset_agree(lead, size, offset):
    layout = SegmentLayout(lead, size)
    index, lo = layout.locate(offset)
    assert layout.start(index) + lo == offset and 0 <= lo < layout.capacity(index)
    assert layout.record_offset(index + 1) == (
        layout.record_offset(index) + layout.capacity(index) + OVERHEAD)
    # a file of exactly index + 1 full segments measures as such
    end = layout.record_offset(index + 1)
    assert layout.measure(end) == (index + 1, layout.start(index + 1), 0)


def _old_mutable_layout(file_size: int, segment_size: int) -> tuple[int, int] | None:
    """The kind-2 formula before SegmentLayout (None where it raised TruncatedFileError)."""
    body = file_size - HEADER_SIZE
    record = segment_size + OVERHEAD
    full, rest = divmod(max(body, 0), record)
    if rest == 0:
        return full, full * segment_size
    if rest <= OVERHEAD:
        return None
    return full + 1, full * segment_size + rest - OVERHEAD


@settings(max_examples=500, deadline=None)
@given(log2=st.integers(9, 24), file_size=st.one_of(st.integers(0, 5000),
                                                      st.integers(0, 1 << 36)))
def test_kind_2_layouts_are_what_mutable_layout_gave_before(log2, file_size):
    seg = 1 << log2
    old = _old_mutable_layout(file_size, seg)
    count, size, cut = SegmentLayout(seg, seg).measure(file_size)
    if old is None:
        assert cut > 0
        with pytest.raises(TruncatedFileError):
            mutable_layout(file_size, seg)
    else:
        assert (count, size, cut) == (*old, 0)
        assert mutable_layout(file_size, seg) == old
        layout = SegmentLayout(seg, seg)
        assert [layout.record_offset(i) for i in range(3)] == [
            HEADER_SIZE + i * (seg + OVERHEAD) for i in range(3)]


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"lead": 0}, ValueError, "framed file needs"),
    ({"lead": 537}, ValueError, "framed file needs"),  # > 512 + 24
    ({"lead": 32, "frame_extra": 70000}, ValueError, "framed file needs"),
    ({"lead": 32.0}, TypeError, "lead must be an int"),
    ({"lead": 32, "frame_extra": True}, TypeError, "frame_extra must be an int"),
])
def test_new_header_checks_the_framing(kwargs, error, match):
    key = Keyring.generate().current_key()
    with pytest.raises(error, match=match):
        new_header(Kind.FRAMED, key, segment_size=512, **kwargs)
    with pytest.raises(ValueError, match="framed files"):
        new_header(Kind.MUTABLE, key, segment_size=512, lead=32)

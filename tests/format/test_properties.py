"""Hypothesis properties of the format: round trips, random-offset reads, and that every
bit flip, truncation, segment swap and cross-file splice is detected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk import Keyring
from cryptdisk.errors import AuthenticationError, CryptdiskError
from cryptdisk.format import HEADER_SIZE, TAG_SIZE

SEG = 512
RING = Keyring.generate()
SIZES = [0, 1, SEG - 1, SEG, SEG + 1, 3 * SEG, 3 * SEG + 7]
PROPS = settings(max_examples=60, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def _write(path: Path, data: bytes, seg: int = SEG) -> bytes:
    with cryptdisk.open(path, "wb", keyring=RING, segment_size=seg) as f:
        f.write(data)
    return path.read_bytes()


def _read(path: Path) -> bytes:
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        return f.read()


@pytest.mark.parametrize("size", [*SIZES, 65535, 65536, 65537])
def test_round_trip_at_boundary_sizes(tmp_path, size):
    data = os.urandom(size)
    seg = 65536 if size >= 65535 else SEG
    _write(tmp_path / "f", data, seg)
    assert _read(tmp_path / "f") == data


@PROPS
@given(data=st.binary(max_size=5000), chunks=st.lists(st.integers(1, 1500), max_size=20))
def test_round_trip_with_any_write_pattern(tmp_path, data, chunks):
    path = tmp_path / "f"
    with cryptdisk.open(path, "wb", keyring=RING, segment_size=SEG) as f:
        pos = 0
        for c in chunks:
            f.write(data[pos : pos + c])
            pos += c
        f.write(data[pos:])
    assert _read(path) == data


@PROPS
@given(data=st.binary(min_size=1, max_size=4000),
       reads=st.lists(st.tuples(st.integers(0, 4200), st.integers(0, 2000)), min_size=1,
                      max_size=15))
def test_read_at_random_offset_equals_slice(tmp_path, data, reads):
    path = tmp_path / "f"
    _write(path, data)
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        for off, n in reads:
            f.seek(off)
            assert f.read(n) == data[off : off + n]
            buf = bytearray(n)
            f.seek(off)
            got = f.readinto(buf)
            assert bytes(buf[:got]) == data[off : off + n]
            assert f.pread(off, n) == data[off : off + n]


@PROPS
@given(size=st.sampled_from(SIZES), bit=st.integers(min_value=0))
def test_every_single_bit_flip_is_detected(tmp_path, size, bit):
    path = tmp_path / "f"
    raw = bytearray(_write(path, os.urandom(size)))
    bit %= len(raw) * 8
    raw[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(raw)
    with pytest.raises(CryptdiskError):
        _read(path)


def test_exhaustive_bit_flips_small_file(tmp_path):
    """Every bit of a two-segment file, flipped one at a time, is caught."""
    path = tmp_path / "f"
    clean = _write(path, os.urandom(SEG + 10))
    for bit in range(len(clean) * 8):
        raw = bytearray(clean)
        raw[bit // 8] ^= 1 << (bit % 8)
        path.write_bytes(raw)
        with pytest.raises(CryptdiskError):
            _read(path)


@PROPS
@given(size=st.sampled_from([*SIZES[1:], 5 * SEG + 3]), cut=st.integers(min_value=1))
def test_every_truncation_is_detected(tmp_path, size, cut):
    path = tmp_path / "f"
    raw = _write(path, os.urandom(size))
    cut = 1 + cut % (len(raw) - 1)  # keep 1 .. len-1 bytes
    path.write_bytes(raw[:cut])
    with pytest.raises(CryptdiskError):
        _read(path)


@PROPS
@given(segments=st.integers(2, 6), i=st.integers(0, 5), j=st.integers(0, 5))
def test_segment_swap_is_detected(tmp_path, segments, i, j):
    i, j = i % segments, j % segments
    assume(i != j)
    path = tmp_path / "f"
    raw = _write(path, os.urandom(segments * SEG))
    rec = SEG + TAG_SIZE
    parts = [raw[HEADER_SIZE + k * rec : HEADER_SIZE + (k + 1) * rec] for k in range(segments)]
    parts[i], parts[j] = parts[j], parts[i]
    path.write_bytes(raw[:HEADER_SIZE] + b"".join(parts))
    with pytest.raises(AuthenticationError):
        _read(path)


@PROPS
@given(segments=st.integers(1, 4), k=st.integers(0, 3))
def test_cross_file_splice_is_detected(tmp_path, segments, k):
    """A segment from another file (same key, same position) does not authenticate."""
    k %= segments
    a, b = tmp_path / "a", tmp_path / "b"
    raw_a = _write(a, os.urandom(segments * SEG))
    raw_b = _write(b, os.urandom(segments * SEG))
    rec = SEG + TAG_SIZE
    lo, hi = HEADER_SIZE + k * rec, HEADER_SIZE + (k + 1) * rec
    a.write_bytes(raw_a[:lo] + raw_b[lo:hi] + raw_a[hi:])
    with pytest.raises(AuthenticationError):
        _read(a)
    # whole header from another file: the body does not match the other data key
    a.write_bytes(raw_b[:HEADER_SIZE] + raw_a[HEADER_SIZE:])
    with pytest.raises(AuthenticationError):
        _read(a)


# -- mutable files ------------------------------------------------------------------


@PROPS
@given(ops=st.lists(st.tuples(st.integers(0, 3000), st.binary(max_size=1200)), max_size=25),
       trunc=st.one_of(st.none(), st.integers(0, 4000)))
def test_mutable_random_writes_match_a_model(tmp_path, ops, trunc):
    path = tmp_path / "m"
    model = bytearray()
    with cryptdisk.open(path, "w+b", keyring=RING, segment_size=SEG) as f:
        for off, data in ops:
            f.seek(off)
            f.write(data)
            if off > len(model):
                model.extend(bytes(off - len(model)))
            model[off : off + len(data)] = data
        if trunc is not None:
            f.truncate(trunc)
            if trunc > len(model):
                model.extend(bytes(trunc - len(model)))
            del model[trunc:]
        assert f.size == len(model)
    with cryptdisk.open(path, "r+b", keyring=RING) as f:
        assert f.read() == bytes(model)
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
    assert _read(path) == bytes(model) + b"tail"


def test_mutable_rewrite_uses_fresh_nonces(tmp_path):
    path = tmp_path / "m"
    with cryptdisk.open(path, "w+b", keyring=RING, segment_size=SEG) as f:
        f.write(bytes(SEG))
        first = path.read_bytes()[HEADER_SIZE : HEADER_SIZE + 16]
        f.seek(0)
        f.write(bytes(SEG))  # same plaintext, same place
        second = path.read_bytes()[HEADER_SIZE : HEADER_SIZE + 16]
    assert first != second


@PROPS
@given(size=st.integers(1, 3 * SEG), bit=st.integers(min_value=0))
def test_mutable_bit_flips_are_detected(tmp_path, size, bit):
    path = tmp_path / "m"
    with cryptdisk.open(path, "w+b", keyring=RING, segment_size=SEG) as f:
        f.write(os.urandom(size))
    raw = bytearray(path.read_bytes())
    bit %= len(raw) * 8
    raw[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(raw)
    with pytest.raises(CryptdiskError):
        _read(path)


def test_mutable_segment_moved_or_spliced_is_detected(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for p in (a, b):
        with cryptdisk.open(p, "w+b", keyring=RING, segment_size=SEG) as f:
            f.write(os.urandom(3 * SEG))
    rec = SEG + 32
    ra, rb = a.read_bytes(), b.read_bytes()
    seg = lambda raw, k: raw[HEADER_SIZE + k * rec : HEADER_SIZE + (k + 1) * rec]  # noqa: E731
    a.write_bytes(ra[:HEADER_SIZE] + seg(ra, 1) + seg(ra, 0) + seg(ra, 2))
    with pytest.raises(AuthenticationError):
        _read(a)
    a.write_bytes(ra[:HEADER_SIZE] + seg(rb, 0) + seg(ra, 1) + seg(ra, 2))
    with pytest.raises(AuthenticationError):
        _read(a)


@pytest.mark.parametrize("mode", ["wb", "w+b"])
def test_no_unauthenticated_plaintext_reaches_the_callers_buffer(tmp_path, mode):
    """OpenSSL decrypts before it checks the tag; the reader must wipe what it wrote."""
    path = tmp_path / "f"
    data = b"SECRET-PLAINTEXT" * (4 * SEG // 16)
    with cryptdisk.open(path, mode, keyring=RING, segment_size=SEG) as f:
        f.write(data)
    raw = bytearray(path.read_bytes())
    raw[HEADER_SIZE + 40] ^= 1  # inside segment 0 (the final segment stays intact)
    path.write_bytes(raw)
    buf = bytearray(2 * SEG)
    with cryptdisk.open(path, "rb", keyring=RING) as f, pytest.raises(AuthenticationError):
        f.readinto(buf)
    assert b"SECRET" not in buf

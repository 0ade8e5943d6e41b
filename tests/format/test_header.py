"""New headers made in bulk (cryptdisk.format.new_headers) against new_header."""

from __future__ import annotations

import pytest

from cryptdisk import Key, Keyring
from cryptdisk.errors import CryptdiskError, HeaderAuthenticationError
from cryptdisk.format import Algorithm, Header, Kind, new_header, new_headers, open_header


@pytest.mark.parametrize(("kind", "geometry"), [
    (Kind.MUTABLE, {"segment_size": 4096}),
    (Kind.FRAMED, {"segment_size": 4096, "lead": 512, "frame_extra": 8}),
])
@pytest.mark.parametrize("key_size", [32, 16])
def test_each_header_is_new_headers_layout_with_its_own_id_and_key(kind, geometry, key_size):
    ring = Keyring([Key(9, bytes(range(key_size)))])
    made = new_headers(kind, ring.current_key(), 8, **geometry)
    reference, _ = new_header(kind, ring.current_key(), **geometry)
    assert len(made) == 8
    ids, keys, slots = set(), set(), set()
    for raw, dek in made:
        assert len(raw) == 128
        header = Header.parse(raw)
        assert header.to_bytes() == raw
        # every field new_header sets, but the random ones, is the same
        for field in ("kind", "algorithm", "segment_size", "key_id", "key_check", "lead",
                      "frame_extra"):
            assert getattr(header, field) == getattr(reference, field), field
        assert open_header(header, ring) == dek  # the slot wraps exactly this data key
        assert len(dek) == key_size
        ids.add(header.file_id)
        keys.add(dek)
        slots.add(header.key_slot)
    assert len(ids) == len(keys) == len(slots) == 8
    assert reference.algorithm == (Algorithm.AES_256_GCM if key_size == 32
                                   else Algorithm.AES_128_GCM)


def test_a_changed_byte_in_a_bulk_header_fails_authentication():
    ring = Keyring.generate()
    raw, _ = new_headers(Kind.FRAMED, ring.current_key(), 1, segment_size=512, lead=32)[0]
    for at in (20, 60, 70):  # file id, key slot
        bad = bytearray(raw)
        bad[at] ^= 1
        with pytest.raises(HeaderAuthenticationError):
            open_header(Header.parse(bytes(bad)), ring)
    for at in (9, 12, 33):  # kind, lead, key id
        bad = bytearray(raw)
        bad[at] ^= 1
        with pytest.raises(CryptdiskError):  # malformed, or fails authentication
            open_header(Header.parse(bytes(bad)), ring)


@pytest.mark.parametrize("count", [0, -1, 2.0, True])
def test_count_must_be_a_positive_int(count):
    with pytest.raises(ValueError, match="count must be a positive int"):
        new_headers(Kind.MUTABLE, Keyring.generate().current_key(), count, segment_size=512)


@pytest.mark.parametrize(("kind", "kwargs", "error", "match"), [
    (Kind.FRAMED, {"lead": 0}, ValueError, "framed file needs"),
    (Kind.FRAMED, {"lead": 32, "frame_extra": 70000}, ValueError, "framed file needs"),
    (Kind.FRAMED, {"lead": 32.0}, TypeError, "lead must be an int"),
    (Kind.MUTABLE, {"lead": 32}, ValueError, "framed files"),
    (Kind.MUTABLE, {"segment_size": 1000}, ValueError, "power of two"),
])
def test_bad_geometry_fails_as_in_new_header(kind, kwargs, error, match):
    key = Keyring.generate().current_key()
    args = {"segment_size": 512, **kwargs}
    with pytest.raises(error, match=match):
        new_header(kind, key, **args)
    with pytest.raises(error, match=match):
        new_headers(kind, key, 4, **args)

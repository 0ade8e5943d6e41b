"""The format's own vectors, checked in both directions: by the implementation and by
an independent decoder/encoder written from docs/format.md."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import cryptdisk
from cryptdisk import Key, Keyring
from cryptdisk.errors import (
    HeaderAuthenticationError,
    KeyNotFoundError,
    MalformedHeaderError,
    NotEncryptedError,
    SegmentAuthenticationError,
    TruncatedFileError,
    UnsupportedVersionError,
    WrongKeyError,
)

from . import independent_decoder as ref
from .framed_util import framed_store

VECTORS = json.loads(
    (Path(__file__).parents[1] / "vectors" / "format" / "cryptdisk_v1.json").read_text()
)["vectors"]

OUTCOME = {
    HeaderAuthenticationError: "header failure",
    MalformedHeaderError: "header failure",
    TruncatedFileError: "truncated",
    SegmentAuthenticationError: "auth failure",
    WrongKeyError: "wrong key",
    KeyNotFoundError: "unknown key",
    NotEncryptedError: "not encrypted",
    UnsupportedVersionError: "unsupported",
}


def _keys(v: dict) -> dict[int, bytes]:
    return {int(k): bytes.fromhex(h) for k, h in v["keys"].items()}


def _keyring(v: dict) -> Keyring:
    keys = _keys(v)
    return Keyring([Key(i, m) for i, m in keys.items()], current_key_id=min(keys))


def _implementation(v: dict, tmp_path: Path) -> str | bytes:
    path = tmp_path / "v.bin"
    path.write_bytes(bytes.fromhex(v["file"]))
    try:
        with cryptdisk.open(path, "rb", keyring=_keyring(v)) as f:
            return f.read()
    except tuple(OUTCOME) as exc:
        return next(o for cls, o in OUTCOME.items() if isinstance(exc, cls))


def _independent(v: dict) -> str | bytes:
    try:
        return ref.decode(bytes.fromhex(v["file"]), _keys(v))
    except ref.Rejected as exc:
        return exc.reason


def test_vector_set_covers_every_outcome():
    outcomes = {v["expected"] for v in VECTORS}
    assert outcomes >= {"success", "auth failure", "header failure", "truncated", "wrong key",
                        "unknown key", "not encrypted", "unsupported"}


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_implementation_matches_vector(v, tmp_path):
    got = _implementation(v, tmp_path)
    if v["expected"] == "success":
        assert got == bytes.fromhex(v["plaintext"])
    else:
        assert got == v["expected"]


@pytest.mark.parametrize("v", VECTORS, ids=[v["name"] for v in VECTORS])
def test_independent_decoder_matches_vector(v):
    got = _independent(v)
    if v["expected"] == "success":
        assert got == bytes.fromhex(v["plaintext"])
    else:
        assert got == v["expected"]


SEALED = [v for v in VECTORS if v["expected"] == "success" and v["kind"] == "sealed"]


@pytest.mark.parametrize("v", SEALED, ids=[v["name"] for v in SEALED])
def test_independent_encoder_rebuilds_sealed_bytes(v):
    keys = _keys(v)
    rebuilt = ref.encode_sealed(
        bytes.fromhex(v["plaintext"]), kek=keys[v["key_id"]], key_id=v["key_id"],
        dek=bytes.fromhex(v["dek"]), file_id=bytes.fromhex(v["file_id"]),
        wrap_nonce=bytes.fromhex(v["wrap_nonce"]), seg_log2=v["segment_log2"],
    )
    assert rebuilt == bytes.fromhex(v["file"])


def test_implementation_output_decodes_independently(tmp_path):
    kek = bytes(range(32))
    ring = Keyring([Key(3, kek)])
    data = bytes(range(256)) * 700
    path = tmp_path / "x.cd"
    with cryptdisk.open(path, "wb", keyring=ring, segment_size=4096) as f:
        f.write(data)
    assert ref.decode(path.read_bytes(), {3: kek}) == data
    with cryptdisk.open(path, "w+b", keyring=ring, segment_size=1024) as f:
        f.write(data)
        f.seek(5000)
        f.write(b"patch")
    expected = bytearray(data)
    expected[5000:5005] = b"patch"
    assert ref.decode(path.read_bytes(), {3: kek}) == bytes(expected)


FRAMED = [v for v in VECTORS if v["expected"] == "success" and v["kind"] == "framed"]


def test_framed_vectors_cover_every_outcome_of_the_layout():
    names = [v["name"] for v in VECTORS if v["name"].startswith(("framed", "mutable-header"))]
    outcomes = {v["expected"] for v in VECTORS if v["name"] in names}
    assert outcomes == {"success", "auth failure", "header failure", "truncated"}
    assert {v["lead"] for v in FRAMED} >= {32, 600, 1030}
    assert any(len(v["nonces"]) == 1 for v in FRAMED)  # segment 0 alone
    assert any(v["plaintext"] == "" for v in FRAMED)


@pytest.mark.parametrize("v", FRAMED, ids=[v["name"] for v in FRAMED])
def test_independent_encoder_rebuilds_framed_bytes(v):
    keys = _keys(v)
    rebuilt = ref.encode_framed(
        bytes.fromhex(v["plaintext"]), kek=keys[v["key_id"]], key_id=v["key_id"],
        dek=bytes.fromhex(v["dek"]), file_id=bytes.fromhex(v["file_id"]),
        wrap_nonce=bytes.fromhex(v["wrap_nonce"]), seg_log2=v["segment_log2"],
        lead=v["lead"], extra=v["frame_extra"], nonces=[bytes.fromhex(n) for n in v["nonces"]],
    )
    assert rebuilt == bytes.fromhex(v["file"])


@pytest.mark.parametrize("v", FRAMED, ids=[v["name"] for v in FRAMED])
def test_framed_vectors_open_for_update(v, tmp_path):
    path = tmp_path / "v.bin"
    path.write_bytes(bytes.fromhex(v["file"]))
    plain = bytes.fromhex(v["plaintext"])
    with cryptdisk.open(path, "r+b", keyring=_keyring(v)) as f:
        assert f.header.kind == 3 and f.header.lead == v["lead"]
        assert f.read() == plain
    with cryptdisk.open(path, "a+b", keyring=_keyring(v)) as f:
        f.write(b"more")
    assert ref.decode(path.read_bytes(), _keys(v)) == plain + b"more"


def test_framed_implementation_output_decodes_independently(tmp_path):
    kek = bytes(range(32))
    ring = Keyring([Key(3, kek)])
    data = bytes(range(256)) * 300
    path = tmp_path / "x.cd"
    with framed_store(path, ring, segment_size=1024, lead=32, frame_extra=24) as store:
        store.pwrite(data, 0)
        store.pwrite(b"patch", 5000)
        store.truncate(len(data) - 77)
    expected = bytearray(data[:-77])
    expected[5000:5005] = b"patch"
    assert ref.decode(path.read_bytes(), {3: kek}) == bytes(expected)


@pytest.mark.parametrize(("lead", "extra", "size"), [(32, 24, 0), (32, 24, 31), (32, 24, 32),
                                                     (32, 24, 33), (100, 0, 5000),
                                                     (536, 24, 4000), (1, 65535, 70000)])
def test_independent_encoder_output_reads_in_the_implementation(tmp_path, lead, extra, size):
    kek = os.urandom(16)
    data = os.urandom(size)
    frame = 512 + extra
    count = 0 if size == 0 else 1 + -(-max(size - lead, 0) // frame)
    raw = ref.encode_framed(data, kek=kek, key_id=9, dek=os.urandom(32), file_id=os.urandom(16),
                            wrap_nonce=os.urandom(12), seg_log2=9, lead=lead, extra=extra,
                            nonces=[os.urandom(16) for _ in range(count)])
    path = tmp_path / "x.cd"
    path.write_bytes(raw)
    with cryptdisk.open(path, "rb", keyring=Keyring([Key(9, kek)])) as f:
        assert f.read() == data
        assert f.pread(lead - 1, 3) == data[lead - 1 : lead + 2]

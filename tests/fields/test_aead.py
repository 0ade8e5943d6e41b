"""Randomised (AES-256-GCM) and deterministic (AES-SIV) column encryption."""

import base64

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESSIV

from cryptdisk.errors import AuthenticationError, FormatError, KeyNotFoundError
from cryptdisk.fields import (
    FieldKey,
    decrypt,
    decrypt_deterministic,
    encrypt,
    encrypt_deterministic,
)
from cryptdisk.keys import Key

VALUES = pa.array(["4111111111111111", "", None, "é" * 100], pa.string())


def test_rfc5297_deterministic_vector_through_cryptography():
    # RFC 5297 appendix A.1: the primitive encrypt_deterministic builds on.
    key = bytes.fromhex("fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff")
    ad = bytes.fromhex("101112131415161718191a1b1c1d1e1f2021222324252627")
    out = AESSIV(key).encrypt(bytes.fromhex("112233445566778899aabbccddee"), [ad])
    assert out.hex() == "85632d07c6e8f37f950acd320a2ecc9340c02b9690c4dc04daef7f6afe5c"


def test_deterministic_layout_is_version_key_id_then_siv():
    key = Key(7, bytes(range(32)))
    field = FieldKey("ids", key)
    out = encrypt_deterministic(["abc"], field)[0].as_py()
    assert out[:5] == b"\x01\x00\x00\x00\x07"
    siv = AESSIV(key.derive(b"cryptdisk fields aes-siv v1", 64))
    assert out[5:] == siv.encrypt(b"abc", None)


def test_randomised_round_trip_keeps_nulls_and_never_repeats():
    key = FieldKey.generate("cards")
    a, b = encrypt(VALUES, key), encrypt(VALUES, key)
    assert a[2].as_py() is None
    assert a[0].as_py() != b[0].as_py()
    assert a[0].as_py()[:5] == b"\x01\x00\x00\x00\x01"
    assert len(a[0].as_py()) == 5 + 12 + 16 + 16
    assert decrypt(a, key).to_pylist() == VALUES.to_pylist()
    text = encrypt(VALUES, key, output="base64")
    assert pa.types.is_string(text.type)
    assert decrypt(text, key).to_pylist() == VALUES.to_pylist()


def test_deterministic_equal_in_equal_out():
    key = FieldKey.generate("emails")
    out = encrypt_deterministic(["a", "b", "a", None], key).to_pylist()
    assert out[0] == out[2] != out[1] and out[3] is None
    assert decrypt_deterministic(out, key).to_pylist() == ["a", "b", "a", None]


@pytest.mark.parametrize("enc,dec", [(encrypt, decrypt),
                                     (encrypt_deterministic, decrypt_deterministic)])
def test_tampering_and_wrong_keys_fail_authentication(enc, dec):
    key = FieldKey.generate("k")
    blob = bytearray(enc(["secret value"], key)[0].as_py())
    for i in (5, len(blob) - 1):
        bad = bytearray(blob)
        bad[i] ^= 1
        with pytest.raises(AuthenticationError, match="row 0"):
            dec(pa.array([bytes(bad)]), key)
    with pytest.raises(AuthenticationError):
        dec(pa.array([bytes(blob)]), FieldKey.generate("k"))
    other_id = bytes(blob[:1]) + (9).to_bytes(4, "big") + bytes(blob[5:])
    with pytest.raises(KeyNotFoundError, match="no version 9"):
        dec(pa.array([other_id]), key)
    with pytest.raises(FormatError):
        dec(pa.array([b"\x02" + bytes(blob[1:])]), key)
    with pytest.raises(FormatError, match="base64"):
        dec(pa.array(["not base64!"]), key)


def test_a_new_version_encrypts_and_the_old_one_still_decrypts():
    k1, k2 = Key.generate(1), Key.generate(2)
    old = FieldKey("cards", {1: k1})
    blob = encrypt(["x"], old)
    both = FieldKey("cards", {1: k1, 2: k2})
    assert both.current_id == 2
    assert decrypt(blob, both).to_pylist() == ["x"]
    assert encrypt(["x"], both)[0].as_py()[1:5] == (2).to_bytes(4, "big")
    assert base64.b64decode(encrypt(["x"], both, output="base64")[0].as_py())[4] == 2


@pytest.mark.parametrize("enc,dec", [(encrypt, decrypt),
                                     (encrypt_deterministic, decrypt_deterministic)])
def test_sliced_chunked_and_large_inputs(enc, dec):
    key = FieldKey.generate("k")
    base = pa.array(["a", None, "bcd", "", "é"], pa.string())
    for values in (base.slice(1, 3), pa.chunked_array([base[:2], base[2:]]),
                   base.cast(pa.large_string())):
        expected = values.to_pylist()
        out = enc(values, key)
        assert dec(out, key).to_pylist() == expected
        assert dec(enc(values, key, output="base64"), key).to_pylist() == expected
    raw = pa.array([b"\xff\x00", None], pa.binary())
    assert dec(enc(raw, key), key, output="binary").to_pylist() == [b"\xff\x00", None]
    with pytest.raises(FormatError, match="not UTF-8"):
        dec(enc(raw, key), key)

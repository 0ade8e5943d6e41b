"""Randomised (AES-256-GCM) and deterministic (AES-SIV) column encryption.

Every test runs through the C extension ``_cfields`` with each base64 decoder this CPU
has (AVX2, SSSE3, scalar) and through the ``cryptography`` path used when it is not
built; tests at the end check that they give the same bytes.
"""

import base64
import random
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, AESSIV
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.errors import AuthenticationError, FieldError, FormatError, KeyNotFoundError
from cryptdisk.fields import (
    FieldKey,
    _aead,
    decrypt,
    decrypt_deterministic,
    encrypt,
    encrypt_deterministic,
)
from cryptdisk.keys import Key


@pytest.fixture(autouse=True, params=["c", "c-ssse3", "c-scalar", "python"])
def backend(request, monkeypatch):
    """The C loops (required: the test environment builds them), with their best base64
    decoder or a lower one (at most the CPU's best), or cryptography's."""
    assert _aead._cfields is not None, "cryptdisk.fields._cfields was not built (setup.py)"
    if request.param == "python":
        monkeypatch.setattr(_aead, "_cfields", None)
        yield request.param
        return
    best = _aead._cfields.base64_simd()
    _aead._cfields.base64_simd({"c": best, "c-ssse3": 1, "c-scalar": 0}[request.param])
    try:
        yield request.param
    finally:
        _aead._cfields.base64_simd(best)

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


def _mixed(seed: int, n: int = 300) -> pa.Array:
    rng = random.Random(seed)
    return pa.array([None if rng.random() < 0.2 else
                     "".join(rng.choice("ab€9") for _ in range(rng.randrange(0, 90)))
                     for _ in range(n)], pa.string())


def _shapes(values: pa.Array) -> list[pa.Array]:
    return [values, values.slice(3), values.slice(5, 101), values.cast(pa.large_string()),
            values.cast(pa.binary()), pa.array([None, None], pa.string()),
            pa.array([], pa.string())]


@pytest.mark.parametrize("output", ["binary", "base64"])
def test_c_and_python_paths_give_the_same_bytes(backend, output):
    key = FieldKey.generate("k")
    for seed in range(3):
        for values in _shapes(_mixed(seed)):
            c_siv = encrypt_deterministic(values, key, output=output)
            c_gcm = encrypt(values, key, output=output)
            _aead._cfields, saved = None, _aead._cfields
            try:
                py_siv = encrypt_deterministic(values, key, output=output)
                py_gcm = encrypt(values, key, output=output)
                assert decrypt(c_gcm, key, output="binary").equals(
                    decrypt(py_gcm, key, output="binary"))
            finally:
                _aead._cfields = saved
            assert c_siv.equals(py_siv)
            expected = values.cast(pa.binary()) if len(values) else values
            assert decrypt(py_gcm, key, output="binary").to_pylist() == expected.to_pylist()
            assert decrypt_deterministic(py_siv, key, output="binary").to_pylist() == \
                expected.to_pylist()


def test_gcm_values_open_with_cryptography(backend):
    raw = Key(3, bytes(range(32)))
    out = encrypt(["4111111111111111", "", "é"], FieldKey("cards", raw)).to_pylist()
    aead = AESGCM(raw.derive(b"cryptdisk fields aes-256-gcm v1", 32))
    assert [aead.decrypt(v[5:17], v[17:], None).decode() for v in out] == \
        ["4111111111111111", "", "é"]
    assert {v[:5] for v in out} == {b"\x01\x00\x00\x00\x03"}
    assert len({v[5:17] for v in out}) == 3


def test_many_key_versions_in_one_batch():
    # the C loop keeps up to 8 versions per batch; more take the Python path
    versions = {i: Key.generate(i) for i in range(1, 11)}
    blobs = [encrypt([f"v{i}"], FieldKey("k", {i: versions[i]}))[0].as_py() for i in versions]
    both = FieldKey("k", versions)
    assert decrypt(pa.array(blobs), both).to_pylist() == [f"v{i}" for i in versions]


def test_a_bad_value_after_many_good_ones_names_its_row():
    key = FieldKey.generate("k")
    blobs = encrypt_deterministic([str(i) for i in range(5000)], key, output="base64")
    bad = blobs.to_pylist()
    bad[4321] = bad[4321][:-2] + ("A=" if bad[4321][-2:] != "A=" else "B=")
    with pytest.raises(AuthenticationError, match="row 4321"):
        decrypt_deterministic(pa.array(bad), key)
    bad[4321] = bad[4321][:-1] + "*"
    with pytest.raises(FormatError, match=r"row 4321: .*base64"):
        decrypt_deterministic(pa.array(bad), key)


def test_a_value_that_is_not_base64_is_reported_before_an_earlier_one_that_fails():
    # the C loop decodes each value as it decrypts it: a failure at row 100 still has
    # the rows after it checked as base64, so the batch is reported as Python's path
    # (which decodes every value first) reports it
    key = FieldKey.generate("k")
    for enc, dec in ((encrypt, decrypt), (encrypt_deterministic, decrypt_deterministic)):
        bad = enc([str(i) for i in range(5000)], key, output="base64").to_pylist()
        bad[100] = bad[100][:-2] + ("A=" if bad[100][-2:] != "A=" else "B=")
        bad[4000] = bad[4000][:-1] + "*"
        with pytest.raises(FormatError, match=r"row 4000: .*base64"):
            dec(pa.array(bad), key)
        bad[4000] = bad[4001]
        with pytest.raises(AuthenticationError, match="row 100"):
            dec(pa.array(bad), key)


def test_layout_errors_then_key_errors_then_failures_wherever_they_are_in_a_batch():
    # the C loop opens each value as it meets it, fetching a key version's subkey when it
    # first meets it; it reports what Python's path (layout of every value, then every key
    # version, then each value in order) reports, wherever in the batch each problem is
    key = FieldKey("k", {1: Key.generate(1)})
    stranger = FieldKey("k", {7: Key.generate(7)})  # a version the decrypting key lacks
    for enc, dec in ((encrypt, decrypt), (encrypt_deterministic, decrypt_deterministic)):
        good = enc([str(i) for i in range(3000)], key, output="base64").to_pylist()
        tampered = good[100][:-2] + ("A=" if good[100][-2:] != "A=" else "B=")
        unknown = enc(["x"], stranger, output="base64")[0].as_py()
        version2 = base64.b64encode(b"\x02" + base64.b64decode(good[5])[1:]).decode()
        cases = [  # (row: value), the error, what it names
            ({100: tampered, 2500: unknown}, KeyNotFoundError, "7"),
            ({100: unknown, 2500: good[5][:8]}, FormatError, "row 2500"),
            ({100: tampered, 2500: version2}, FormatError, "row 2500"),
            ({100: tampered, 2500: unknown, 2900: "AAAA"}, FormatError, "row 2900"),
            ({100: tampered, 2500: good[0]}, AuthenticationError, "row 100"),
        ]
        for changes, error, names in cases:
            values = list(good)
            for row, value in changes.items():
                values[row] = value
            with pytest.raises(error, match=names):
                dec(pa.array(values), key)


def test_concurrent_batches_from_threads():
    key = FieldKey.generate("k")
    batches = [_mixed(seed, 2048) for seed in range(8)]

    def round_trip(values: pa.Array) -> bool:
        return bool(decrypt(encrypt(values, key, output="base64"), key).equals(values) and
                    decrypt_deterministic(encrypt_deterministic(values, key), key).equals(values))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(round_trip, batches))


def test_native_library_names_the_cipher_library(backend):
    from cryptdisk.fields import native_library

    name = native_library()
    if backend == "python":
        assert name is None
    else:
        assert name is not None and name.split()[0] in ("libgcrypt", "OpenSSL")


_UTF8_EDGES = [b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf5\x80",
               b"\xc2", b"\xe2\x82", b"\xf0\x9f\x98", b"\x80", b"\xff", b"\xc2\xa9",
               b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf",
               b"abcdefgh", b"\x00"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=24), st.lists(st.sampled_from(_UTF8_EDGES),
                                                            max_size=6).map(b"".join)),
                min_size=1, max_size=8))
def test_decrypted_text_is_checked_as_utf8_as_python_does(values):
    """The C loop checks each plaintext for UTF-8 as it writes it (shortest forms, no
    surrogates, at most U+10FFFF): text out exactly when Python's decoder agrees."""
    key = FieldKey.generate("k")
    blobs = encrypt(pa.array(values, pa.binary()), key, output="base64")
    bad = [i for i, v in enumerate(values) if not _decodes(v)]
    if bad:
        with pytest.raises(FormatError, match=f"row {bad[0]}: .*not UTF-8"):
            decrypt(blobs, key)
    else:
        assert decrypt(blobs, key).to_pylist() == [v.decode() for v in values]


def _decodes(v: bytes) -> bool:
    try:
        v.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=0, max_size=40), st.integers(0, 200), st.sampled_from(
    ["", "=", "==", "A", "*", "\n", "====", "A=AA", "-", "_"]))
def test_c_base64_accepts_exactly_what_python_accepts(plain, at, junk):
    """A ciphertext's base64 spoiled anywhere: the C decoder refuses it (FormatError
    naming the row) exactly when Python's strict decoder does, else it opens."""
    key = FieldKey.generate("k")
    text = encrypt([plain], key, output="base64")[0].as_py()
    at = at % (len(text) + 1)
    spoiled = text[:at] + junk + text[at + len(junk):]
    try:
        raw = base64.b64decode(spoiled, validate=True)
    except ValueError:
        raw = None
    if raw is None:
        with pytest.raises(FormatError, match="row 0"):
            decrypt(pa.array([spoiled]), key, output="binary")
    elif raw == base64.b64decode(text):
        assert decrypt(pa.array([spoiled]), key, output="binary")[0].as_py() == plain
    else:  # other bytes: another layout, key version or tag
        with pytest.raises((FormatError, AuthenticationError, KeyNotFoundError)):
            decrypt(pa.array([spoiled]), key, output="binary")


def test_every_character_outside_the_alphabet_is_refused_wherever_it_is(backend):
    """The base64 decoders (AVX2 32 characters at a time, SSSE3 16, scalar 4) refuse each
    ASCII character outside RFC 4648's alphabet at every position of a ciphertext long
    enough for all three, and open the unspoiled one."""
    key = FieldKey.generate("k")
    plain = bytes(range(61))
    text = encrypt([plain], key, output="base64")[0].as_py()
    assert len(text) == 128 and text.endswith("==")
    assert decrypt(pa.array([text]), key, output="binary")[0].as_py() == plain
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    outside = [chr(c) for c in range(128) if chr(c) not in alphabet]
    for at in range(len(text) - 2):  # the last two are padding
        for junk in outside:
            spoiled = pa.array([text[:at] + junk + text[at + 1:]])
            with pytest.raises(FormatError, match=r"row 0: .*base64"):
                decrypt(spoiled, key, output="binary")


PAN = "4111111111111111"


@pytest.mark.parametrize("fn", [encrypt, encrypt_deterministic, decrypt, decrypt_deterministic])
@pytest.mark.parametrize("values", [
    [1, PAN],                 # Arrow's own error would quote the value it could not convert
    [{"pan": PAN}],           # a struct: no text to take
    [[PAN]],                  # a list
    [PAN + "\ud800"],         # a lone surrogate: not Unicode text
], ids=["mixed", "struct", "list", "surrogate"])
def test_values_that_are_no_column_raise_a_field_error_that_quotes_none(backend, fn, values):
    with pytest.raises(FieldError) as info:
        fn(values, KEY_FOR_INPUT)
    assert PAN not in str(info.value) and "4111" not in str(info.value)


@pytest.mark.parametrize("fn", [encrypt, encrypt_deterministic, decrypt, decrypt_deterministic])
def test_a_key_that_is_no_field_key_is_a_type_error(backend, fn):
    with pytest.raises(TypeError, match="FieldKey"):
        fn(["x"], "cards")


KEY_FOR_INPUT = FieldKey.generate("input")


def test_base64_ciphertexts_as_string_view_are_text(backend):
    # Arrow's string_view (Polars' strings) holds the same base64 text as string does
    key = FieldKey.generate("k")
    for seal, open_ in ((encrypt, decrypt), (encrypt_deterministic, decrypt_deterministic)):
        text = seal(["abc", None], key, output="base64").cast(pa.string_view())
        assert open_(text, key).to_pylist() == ["abc", None]


def test_dictionary_and_view_arrays_are_their_values(backend):
    # pandas' categoricals arrive as dictionary arrays: of base64 text or of bytes
    key = FieldKey.generate("k")
    for seal, open_ in ((encrypt, decrypt), (encrypt_deterministic, decrypt_deterministic)):
        for output in ("base64", "binary"):
            sealed = seal(["abc", "abc", None], key, output=output)
            assert open_(sealed.dictionary_encode(), key).to_pylist() == ["abc", "abc", None]
        raw = pa.array([b"\xff\x00", None], pa.binary())
        for form in (raw.dictionary_encode(), raw.cast(pa.binary_view())):
            assert open_(seal(form, key), key, output="binary").to_pylist() == \
                [b"\xff\x00", None]

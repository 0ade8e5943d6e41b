"""FF1 against NIST's samples, the Rev. 1 domain rule, and round trips over the Arrow API."""

import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.errors import FieldError
from cryptdisk.fields import ALPHABETS, FieldKey, ff1_decrypt, ff1_encrypt, fpe_decrypt, fpe_encrypt

from .vectors_ff1 import SAMPLES
from .vectors_ff1_acvp import ACVP


def _numerals(text):
    return np.array([[int(c, 36) for c in text]])


def _text(row):
    return "".join(np.base_repr(int(d), 36).lower() for d in row)


@pytest.mark.parametrize("sample,key,radix,tweak,plain,cipher", SAMPLES,
                         ids=[f"sample{s[0]}" for s in SAMPLES])
def test_nist_ff1_samples_both_ways(sample, key, radix, tweak, plain, cipher):
    aes = Cipher(algorithms.AES(bytes.fromhex(key)), modes.ECB())
    out = ff1_encrypt(aes, radix, bytes.fromhex(tweak), _numerals(plain))
    assert _text(out[0]) == cipher
    back = ff1_decrypt(aes, radix, bytes.fromhex(tweak), _numerals(cipher))
    assert _text(back[0]) == plain


def test_a_batch_equals_values_one_by_one():
    aes = Cipher(algorithms.AES(bytes(32)), modes.ECB())
    rng = np.random.default_rng(1)
    for radix, n in ((10, 16), (10, 21), (36, 19), (2, 40), (65536, 2)):
        x = rng.integers(0, radix, size=(20, n))
        batch = ff1_encrypt(aes, radix, b"t", x)
        single = np.concatenate([ff1_encrypt(aes, radix, b"t", x[i:i + 1]) for i in range(20)])
        assert (batch == single).all()
        assert (ff1_decrypt(aes, radix, b"t", batch) == x).all()


def test_rev1_minimum_domain_is_enforced():
    aes = Cipher(algorithms.AES(bytes(16)), modes.ECB())
    with pytest.raises(FieldError, match="domain too small"):
        ff1_encrypt(aes, 10, b"", np.zeros((1, 5), dtype=np.uint32))  # 10**5
    ff1_encrypt(aes, 10, b"", np.zeros((1, 6), dtype=np.uint32))  # 10**6 is allowed
    with pytest.raises(FieldError, match="radix"):
        ff1_encrypt(aes, 65537, b"", np.zeros((1, 2), dtype=np.uint32))
    with pytest.raises(FieldError, match="outside radix"):
        ff1_encrypt(aes, 10, b"", np.full((1, 8), 10))


KEY = FieldKey.generate("cards")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(ALPHABETS["digits"], min_size=6, max_size=24)),
                min_size=1, max_size=30))
def test_digits_round_trip_and_keep_format(values):
    out = fpe_encrypt(pa.array(values, pa.string()), KEY, "pan")
    for before, after in zip(values, out.to_pylist(), strict=True):
        if before is None:
            assert after is None
        else:
            assert len(after) == len(before) and after.isdigit()
    assert fpe_decrypt(out, KEY, "pan").to_pylist() == values


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(ALPHABETS["alnum"], min_size=4, max_size=30), min_size=1, max_size=20),
       st.binary(max_size=16).filter(lambda t: not t.startswith(b"token:")))
def test_alnum_round_trip_with_any_tweak(values, tweak):
    out = fpe_encrypt(values, KEY, alphabet="alnum", tweak=tweak)
    assert [len(v) for v in out.to_pylist()] == [len(v) for v in values]
    assert all(set(v) <= set(ALPHABETS["alnum"]) for v in out.to_pylist())
    assert fpe_decrypt(out, KEY, alphabet="alnum", tweak=tweak).to_pylist() == values


def test_declared_unicode_alphabet_round_trips():
    alphabet = "αβγδεζηθικ"
    values = ["αβγδεζηθ", "κκκκκκ"]
    out = fpe_encrypt(values, KEY, "greek", alphabet=alphabet)
    assert all(set(v) <= set(alphabet) for v in out.to_pylist())
    assert fpe_decrypt(out, KEY, "greek", alphabet=alphabet).to_pylist() == values


def test_the_column_is_the_default_tweak():
    a = fpe_encrypt(["4111111111111111"], KEY, "pan").to_pylist()
    b = fpe_encrypt(["4111111111111111"], KEY, "other").to_pylist()
    assert a != b
    assert fpe_encrypt(["4111111111111111"], KEY, "pan").to_pylist() == a


def test_a_character_outside_the_alphabet_names_the_row_not_the_value():
    with pytest.raises(FieldError, match="row 1") as info:
        fpe_encrypt(["12345678", "1234x678"], KEY, "pan")
    assert "1234x678" not in str(info.value)


def test_the_vector_path_equals_the_integer_path(monkeypatch):
    from cryptdisk.fields import _ff1

    aes = Cipher(algorithms.AES(bytes(range(32))), modes.ECB())
    rng = np.random.default_rng(2)
    cases = [(10, 16, b""), (10, 7, b"tweak"), (36, 12, bytes(20)), (2, 40, b"x" * 15)]
    fast = {c: ff1_encrypt(aes, c[0], c[2], rng.integers(0, c[0], size=(50, c[1])))
            for c in cases}
    rng = np.random.default_rng(2)
    monkeypatch.setattr(_ff1, "_FAST", 0)  # every radix**v is above it: integers only
    for c in cases:
        x = rng.integers(0, c[0], size=(50, c[1]))
        assert (ff1_encrypt(aes, c[0], c[2], x) == fast[c]).all()
        assert (ff1_decrypt(aes, c[0], c[2], fast[c]) == x).all()


@pytest.mark.parametrize("tc,alphabet,key,tweak,plain,cipher", ACVP,
                         ids=[f"acvp{row[0]}" for row in ACVP])
def test_acvp_ff1_vectors_both_ways(tc, alphabet, key, tweak, plain, cipher):
    aes = Cipher(algorithms.AES(bytes.fromhex(key)), modes.ECB())
    index = {c: i for i, c in enumerate(alphabet)}
    x = np.array([[index[c] for c in plain]])
    out = ff1_encrypt(aes, len(alphabet), bytes.fromhex(tweak), x)
    assert "".join(alphabet[int(d)] for d in out[0]) == cipher
    assert (ff1_decrypt(aes, len(alphabet), bytes.fromhex(tweak), out) == x).all()


@pytest.mark.parametrize("fn", [fpe_encrypt, fpe_decrypt])
def test_a_value_too_short_for_ff1_names_the_function_and_row(fn):
    # an empty value (a CSV's empty field) and one under the Rev. 1 minimum domain
    for values, row, match in [(["123456", "123456", ""], 2, "needs 2 or more"),
                               (["1234567", "12345"], 1, "domain too small")]:
        with pytest.raises(FieldError, match=f"{fn.__name__}: row {row} has "
                           f"{len(values[row])} characters: FF1 {match}") as info:
            fn(values, KEY, "pan")
        assert "12345" not in str(info.value).replace("1,000,000", "")

"""Tokens (FF1 with kept digits and Luhn) and masking functions."""

import hashlib
import hmac

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.errors import FieldError
from cryptdisk.fields import (
    FieldKey,
    detokenize,
    fpe_decrypt,
    fpe_encrypt,
    luhn_valid,
    mask_email,
    mask_full,
    mask_hash,
    mask_last4,
    mask_null,
    tokenize,
)

KEY = FieldKey.generate("cards")


def _luhn_complete(body):
    for check in "0123456789":
        if luhn_valid(np.array([[int(c) for c in body + check]]))[0]:
            return body + check
    raise AssertionError


def test_luhn_check():
    rows = np.array([[int(c) for c in s] for s in ("4111111111111111", "4111111111111112")])
    assert luhn_valid(rows).tolist() == [True, False]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text("0123456789", min_size=15, max_size=18), min_size=1, max_size=20))
def test_card_tokens_keep_bin_last4_and_luhn(bodies):
    cards = [_luhn_complete(b) for b in bodies]
    tokens = tokenize(cards, KEY, "pan", keep_first=6, keep_last=4, luhn=True).to_pylist()
    for card, token in zip(cards, tokens, strict=True):
        assert len(token) == len(card) and token.isdigit()
        assert token[:6] == card[:6] and token[-4:] == card[-4:]
        assert luhn_valid(np.array([[int(c) for c in token]]))[0]
    assert detokenize(tokens, KEY, "pan", keep_first=6, keep_last=4,
                      luhn=True).to_pylist() == cards


def test_tokens_are_deterministic_per_key_and_column():
    ids = ["12345678901", "12345678901", "99999999999"]
    a = tokenize(ids, KEY, "customer").to_pylist()
    assert a[0] == a[1] != a[2] and a[0] != ids[0]
    assert tokenize(ids, KEY, "customer").to_pylist() == a
    assert tokenize(ids, KEY, "other").to_pylist() != a
    assert tokenize(ids, FieldKey.generate("cards"), "customer").to_pylist() != a
    alnum = tokenize(["AB12cd34"], KEY, "ref", alphabet="alnum").to_pylist()
    assert detokenize(alnum, KEY, "ref", alphabet="alnum").to_pylist() == ["AB12cd34"]


def test_token_errors():
    with pytest.raises(FieldError, match="Luhn"):
        tokenize(["4111111111111112"], KEY, "pan", luhn=True)
    with pytest.raises(FieldError, match="too few"):
        tokenize(["4111111111"], KEY, "pan", keep_first=6, keep_last=4)
    with pytest.raises(FieldError, match="domain too small"):
        tokenize(["41111111111111"], KEY, "pan", keep_first=6, keep_last=4)
    # the row whose middle is too short is named, with what is left to tokenize
    with pytest.raises(FieldError, match=r"detokenize: row 1 has 14 characters; keeping 6 \+ 4 "
                       "leaves 4 characters: FF1 domain too small"):
        detokenize(["4111111111111111", "41111111111111"], KEY, "pan", keep_first=6,
                   keep_last=4)


@pytest.fixture(params=["c", "python"])
def mask_backend(request, monkeypatch):
    """The masks through the C extension (required in tests) or through pyarrow."""
    from cryptdisk.fields import _aead

    assert _aead.native_module() is not None, "cryptdisk.fields._cfields was not built"
    if request.param == "python":
        monkeypatch.setattr(_aead, "_cfields", None)
    return request.param


def test_masks(mask_backend):
    values = pa.array(["alice@example.com", "1234", "4111111111111111", None, "a@b@c.org"])
    assert mask_full(values).to_pylist() == ["*" * 17, "****", "*" * 16, None, "*" * 9]
    assert mask_last4(values).to_pylist() == ["*" * 13 + ".com", "****", "*" * 12 + "1111",
                                              None, "*****.org"]
    assert mask_email(values).to_pylist() == ["****@example.com", "****", "*" * 16, None,
                                              "****@c.org"]
    assert mask_null(values).to_pylist() == [None] * 5
    hashed = mask_hash(["x", "x", "y", None], KEY).to_pylist()
    assert hashed[0] == hashed[1] != hashed[2] and hashed[3] is None and len(hashed[0]) == 64
    assert mask_hash(["x"], FieldKey.generate("other")).to_pylist()[0] != hashed[0]
    secret = KEY._version().hmac_key()
    assert hashed[0] == hmac.new(secret, b"x", hashlib.sha256).hexdigest()


def test_c_masks_leave_no_other_bytes_in_their_buffer():
    # mask_full and mask_last4 write into a buffer of the input's size: multi-byte
    # characters mask to fewer bytes, and what is left after the last value is zeroed
    # (no stale pool memory, a freed decryption's output say, behind the values)
    arr = pa.array(["\u00e9" * 9, "\u65e5\u672c\u8a9e\u30c6\u30ad\u30b9\u30c8", None, "abcdef"])
    for mask in (mask_full, mask_last4):
        out = mask(arr)
        _validity, offsets, data = out.buffers()
        end = int.from_bytes(offsets.to_pybytes()[4 * len(out):4 * len(out) + 4], "little")
        assert data.size > end  # the input's size: 18 + 21 + 6 bytes, 9 + 7 + 6 masked
        assert data.to_pybytes()[end:] == b"\0" * (data.size - end)


def test_c_masks_of_ascii_keep_offsets_and_hide_what_nulls_hold():
    # an all-ASCII column masks in place: the output reuses the input's offsets, and
    # its data holds stars and kept tails only: not the bytes under a null slot, nor
    # those before the first value of a slice (zero)
    data = b"secret-before" + b"4111111111111111" + b"hidden-under-null" + b"abc" + b"12345"
    offsets = pa.array([0, 13, 29, 46, 49, 54], pa.int32()).buffers()[1]
    validity = pa.array([True, True, False, True, True]).buffers()[1]
    arr = pa.Array.from_buffers(pa.string(), 5, [validity, offsets, pa.py_buffer(data)],
                                null_count=1).slice(1)
    for mask, want in ((mask_last4, ["*" * 12 + "1111", None, "***", "*2345"]),
                       (mask_full, ["*" * 16, None, "***", "*****"])):
        out = mask(arr)
        out.validate(full=True)
        assert out.to_pylist() == want
        raw = out.buffers()[2].to_pybytes()
        assert b"secret" not in raw and b"hidden" not in raw and b"null" not in raw
        assert raw[:13] == b"\0" * 13


@pytest.mark.parametrize("offsets", [[0, 8, 4, 12], [0, 4, 16, 12], [0, 4, 8, 99], [-4, 0, 4, 8]])
@pytest.mark.parametrize("kind", ["full", "last4", "email"])
@pytest.mark.parametrize("nulls", [False, True])
def test_c_masks_refuse_offsets_that_decrease_or_leave_the_data(offsets, kind, nulls):
    # the all-ASCII path checks the offsets in the pass that copies the tails: a column
    # whose offsets decrease or point outside its data is an error, never a read past it
    from cryptdisk.fields import _aead

    native = _aead.native_module()
    assert native is not None
    validity = pa.array([True, False, True]).buffers()[1] if nulls else b""
    offs = pa.array(offsets, pa.int32()).buffers()[1]
    with pytest.raises(ValueError, match=r"column offsets|column buffers"):
        native.mask_column(kind, validity, offs, b"abcdefghijkl", False, 3, 0,
                           pa.allocate_buffer)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text("ab1234@.\u00e9", max_size=12)), max_size=30),
       st.integers(0, 5), st.booleans())
def test_c_masks_equal_the_pyarrow_ones_on_ascii_and_not(values, skip, ascii_only):
    from cryptdisk.fields import _aead

    if ascii_only:
        values = [v if v is None else v.replace("\u00e9", "e") for v in values]
    arr = pa.array(values, pa.string()).slice(min(skip, len(values)))
    native = _aead._cfields
    got = [f(arr) for f in (mask_full, mask_last4)]
    _aead._cfields = None
    try:
        want = [f(arr) for f in (mask_full, mask_last4)]
    finally:
        _aead._cfields = native
    assert native is not None
    for g, w in zip(got, want, strict=True):
        g.validate(full=True)
        assert g.to_pylist() == w.to_pylist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=12)), max_size=30),
       st.integers(0, 5))
def test_c_masks_equal_the_pyarrow_ones(values, skip):
    from cryptdisk.fields import _aead

    arr = pa.array(values, pa.string()).slice(min(skip, len(values)))
    native = _aead._cfields
    got = [f(arr) for f in (mask_full, mask_last4, mask_email)] + [mask_hash(arr, KEY)]
    _aead._cfields = None
    try:
        want = [f(arr) for f in (mask_full, mask_last4, mask_email)] + [mask_hash(arr, KEY)]
    finally:
        _aead._cfields = native
    assert native is not None
    for g, w in zip(got, want, strict=True):
        assert g.to_pylist() == w.to_pylist()


def test_values_that_are_not_text():
    # a list of numbers is what an array of numbers is: masks and mask_hash take it as
    # text, as encrypt does; FF1 and tokens refuse it with a FieldError, never an Arrow one
    numbers = [4111111111111111, None]
    assert mask_last4(numbers).to_pylist() == ["************1111", None]
    assert mask_full(numbers).to_pylist() == mask_full(pa.array(numbers)).to_pylist()
    assert mask_hash(numbers, KEY).to_pylist() == mask_hash(["4111111111111111", None],
                                                            KEY).to_pylist()
    for values in (numbers, pa.array(numbers), ["4111111111111111", 42]):
        for fn in (fpe_encrypt, tokenize):
            with pytest.raises(FieldError, match="take text"):
                fn(values, KEY, "pan")


PAN = "4111111111111111"


@pytest.mark.parametrize("fn", [
    mask_full, mask_last4, mask_email, mask_null,
    lambda v: mask_hash(v, KEY), lambda v: fpe_encrypt(v, KEY, "pan"),
    lambda v: tokenize(v, KEY, "pan"), lambda v: detokenize(v, KEY, "pan"),
], ids=["mask_full", "mask_last4", "mask_email", "mask_null", "mask_hash", "fpe_encrypt",
        "tokenize", "detokenize"])
@pytest.mark.parametrize("values", [
    [1, PAN],                 # Arrow's own error would quote the value it could not convert
    [{"pan": PAN}],           # a struct: no text to take
    [[PAN]],                  # a list
    [PAN + "\ud800"],         # a lone surrogate: not Unicode text
], ids=["mixed", "struct", "list", "surrogate"])
def test_values_that_are_no_column_raise_a_field_error_that_quotes_none(fn, values):
    if fn is mask_null and values == [[PAN]]:
        assert mask_null(values).to_pylist() == [None]  # nulls of any type, lists too
        return
    if fn is mask_null and values == [{"pan": PAN}]:
        assert mask_null(values).to_pylist() == [None]
        return
    with pytest.raises(FieldError) as info:
        fn(values)
    assert PAN not in str(info.value) and "4111" not in str(info.value)


@pytest.mark.parametrize("fn", [mask_hash, fpe_encrypt, tokenize, detokenize])
def test_a_key_that_is_no_field_key_is_a_type_error(fn):
    with pytest.raises(TypeError, match="FieldKey"):
        fn(["4111111111111111"], "cards")


@pytest.mark.parametrize("option", ["keep_first", "keep_last"])
def test_a_kept_count_is_an_int_not_a_bool(option):
    with pytest.raises(FieldError, match="keep_first and keep_last"):
        tokenize([PAN], KEY, "pan", **{option: True})


def test_fpe_cannot_compute_tokens_of_another_column():
    """tokenize tweaks FF1 with "token:" + column under the key's one FF1 subkey, which
    fpe_encrypt / fpe_decrypt use with the column name as tweak: a column (or tweak)
    "token:pan" would make fpe_decrypt detokenize column pan's tokens (before: it gave
    the clear card numbers back, the middle of kept-digit tokens too). It is refused; a
    value fpe_encrypt made under such a name before is that column's token and reads
    with detokenize."""
    from cryptdisk.fields._ff1 import ff1_encrypt

    cards = ["4111111111111111", "5500005555555559"]
    whole = tokenize(cards, KEY, "pan").to_pylist()
    kept = tokenize(cards, KEY, "pan", keep_first=6, keep_last=4).to_pylist()
    refused = "beginning with 'token:' is refused"
    for call in (lambda: fpe_decrypt(whole, KEY, "token:pan"),
                 lambda: fpe_decrypt([t[6:12] for t in kept], KEY, "token:pan"),
                 lambda: fpe_encrypt(cards, KEY, "token:pan"),
                 lambda: fpe_decrypt(whole, KEY, "x", tweak=b"token:pan"),
                 lambda: fpe_encrypt(cards, KEY, tweak=bytearray(b"token:"))):
        with pytest.raises(FieldError, match=refused) as info:
            call()
        assert "detokenize" in (info.value.hint or "")
    # what fpe_encrypt(cards, KEY, "token:pan") gave before: FF1 with that tweak
    x = np.array([[int(c) for c in v] for v in cards])
    cipher = KEY.named_version(None, "test").ff1_cipher()
    old = ["".join(map(str, row)) for row in ff1_encrypt(cipher, 10, b"token:pan", x)]
    assert old == whole
    assert detokenize(old, KEY, "pan").to_pylist() == cards
    # other names keep working, "token" without the colon and a prefix later in the name
    for col in ("token", "tokens:pan", "pan token:", "Token:pan"):
        assert fpe_decrypt(fpe_encrypt(cards, KEY, col), KEY, col).to_pylist() == cards

"""cryptdisk.format._cseal: the C segment loops of sealed files (intel-ipsec-mb AES-GCM).

The key object against NIST's vectors and against ``cryptography`` on random layouts,
every flipped bit refused with its segment wiped, lengths checked, threads, pickling;
and sealed files through both backends (the C one and the ``cryptography`` fallback)
giving the same bytes.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import threading

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk import Keyring
from cryptdisk.errors import SegmentAuthenticationError
from cryptdisk.format import (
    HEADER_SIZE,
    Kind,
    SealedReader,
    SealedWriter,
    _sealed,
    iter_sealed_stream,
    new_header,
    sealed_nonce,
)

from .test_cipher_nist import DECRYPT
from .test_sealed_source import _Recording

cseal = _sealed._cseal  # None where the extension was not built (or is switched off)
native = pytest.mark.skipif(cseal is None, reason="cryptdisk.format._cseal not built "
                            "(needs intel-ipsec-mb's headers: apt-get install libipsec-mb-dev)")
#: the one-call packed read: an extension built from older sources (an untracked build
#: output left in place) has none, and reads fall back to decrypt_run and Python
spans_built = pytest.mark.skipif(not _sealed._SPANS, reason="cryptdisk.format._cseal built "
                                 "without decrypt_spans (older sources): rebuild it")


def _records(key: bytes, first: int, last: int, final: int, seg: int, final_size: int,
             plain: bytes) -> bytes:
    """Segments first..last sealed by cryptography, the reference."""
    aead, out, pos = AESGCM(key), [], 0
    for i in range(first, last + 1):
        n = final_size if i == final else seg
        out.append(aead.encrypt(sealed_nonce(i, i == final), plain[pos : pos + n], None))
        pos += n
    assert pos == len(plain)
    return b"".join(out)


def _plain_size(first: int, last: int, final: int, seg: int, final_size: int) -> int:
    return (last - first) * seg + (final_size if last == final else seg)


# -- the key object ----------------------------------------------------------------------

@native
@pytest.mark.parametrize("v", [v for v in DECRYPT if not v["AAD"]])
def test_nist_decrypt_vectors(v):
    key = cseal.Key(bytes.fromhex(v["Key"]))
    data = bytes.fromhex(v["CT"]) + bytes.fromhex(v["Tag"])
    out = bytearray(b"\xaa" * (len(data) - 16))
    ok = key.decrypt(bytes.fromhex(v["IV"]), data, out)
    if "fail" in v:
        assert ok is False and out == bytes(len(out))  # wiped
    else:
        assert ok is True and bytes(out) == bytes.fromhex(v["PT"])


@native
def test_nist_vectors_without_associated_data_were_found():
    plain = [v for v in DECRYPT if not v["AAD"]]
    assert len(plain) > 20 and any("fail" in v for v in plain)
    assert {len(v["Key"]) for v in plain} == {32, 64}


@st.composite
def _layouts(draw):
    seg = draw(st.integers(1, 3000))
    final = draw(st.integers(0, 6))
    first = draw(st.integers(0, final))
    last = draw(st.integers(first, final))
    final_size = draw(st.integers(0, seg - 1))
    key = draw(st.sampled_from([16, 32]))
    return os.urandom(key), first, last, final, seg, final_size


@native
@settings(max_examples=150, deadline=None)
@given(layout=_layouts())
def test_runs_equal_cryptography_on_random_layouts(layout):
    dek, first, last, final, seg, final_size = layout
    plain = os.urandom(_plain_size(first, last, final, seg, final_size))
    want = _records(dek, first, last, final, seg, final_size, plain)
    key = cseal.Key(dek)
    sealed = bytearray(len(want))
    key.encrypt_run(plain, sealed, first, last, final, seg, final_size)
    assert bytes(sealed) == want
    out = bytearray(len(plain))
    assert key.decrypt_run(want, out, first, last, final, seg, final_size) == -1
    assert bytes(out) == plain


SEG, FINAL_SIZE = 32, 5  # three segments: 32, 32 and a final 5 bytes


def _small_run(dek: bytes) -> tuple[bytes, bytes]:
    plain = os.urandom(2 * SEG + FINAL_SIZE)
    return plain, _records(dek, 0, 2, 2, SEG, FINAL_SIZE, plain)


@native
@pytest.mark.parametrize("size", [16, 32])
def test_every_flipped_bit_is_refused_and_its_segment_wiped(size):
    dek = os.urandom(size)
    key = cseal.Key(dek)
    plain, sealed = _small_run(dek)
    bounds = [(0, SEG + 16), (SEG + 16, 2 * (SEG + 16)), (2 * (SEG + 16), len(sealed))]
    out_at = [0, SEG, 2 * SEG, 2 * SEG + FINAL_SIZE]
    for bit in range(8 * len(sealed)):
        damaged = bytearray(sealed)
        damaged[bit // 8] ^= 1 << (bit % 8)
        out = bytearray(b"\xaa" * len(plain))
        failed = key.decrypt_run(damaged, out, 0, 2, 2, SEG, FINAL_SIZE)
        seg = next(i for i, (a, b) in enumerate(bounds) if a <= bit // 8 < b)
        assert failed == seg, bit
        assert out[: out_at[seg]] == plain[: out_at[seg]]  # authenticated before it
        assert out[out_at[seg] : out_at[seg + 1]] == bytes(out_at[seg + 1] - out_at[seg])
        assert out[out_at[seg + 1] :] == b"\xaa" * (len(plain) - out_at[seg + 1])  # untouched


@native
def test_a_wrong_index_or_last_flag_in_the_nonce_is_refused():
    dek = os.urandom(32)
    key = cseal.Key(dek)
    plain, sealed = _small_run(dek)
    one = sealed[: SEG + 16]  # segment 0 of 3
    out = bytearray(SEG)
    assert key.decrypt_run(one, out, 0, 0, 2, SEG, FINAL_SIZE) == -1 and out == plain[:SEG]
    for first in (1, 2 ** 32, 2 ** 62):  # the record of segment 0 read as another one
        assert key.decrypt_run(one, out, first, first, first + 2, SEG, FINAL_SIZE) == first
        assert out == bytes(SEG)
    # the final segment read as a non-final one (a file cut after it), and segment 0 as final
    tail = sealed[2 * (SEG + 16) :]
    short = bytearray(FINAL_SIZE)
    assert key.decrypt_run(tail, short, 2, 2, 2, SEG, FINAL_SIZE) == -1
    assert key.decrypt_run(tail, short, 2, 2, 3, FINAL_SIZE, 0) == 2 and short == bytes(5)
    whole = bytearray(SEG)
    assert key.decrypt_run(one, whole, 0, 0, 0, SEG + 1, SEG) == 0 and whole == bytes(SEG)


@native
def test_lengths_ranges_and_buffers_are_checked():
    dek = os.urandom(32)
    key = cseal.Key(dek)
    plain, sealed = _small_run(dek)
    out = bytearray(len(plain))
    with pytest.raises(ValueError, match="need a 117-byte ciphertext and a 69-byte plaintext"):
        key.decrypt_run(sealed[:-1], out, 0, 2, 2, SEG, FINAL_SIZE)
    with pytest.raises(ValueError, match="need a 117-byte ciphertext"):
        key.decrypt_run(sealed, out[:-1], 0, 2, 2, SEG, FINAL_SIZE)
    with pytest.raises(ValueError, match="need a"):
        key.decrypt_run(sealed + b"x", out, 0, 2, 2, SEG, FINAL_SIZE)
    with pytest.raises(ValueError, match="need a"):
        key.encrypt_run(plain, bytearray(len(sealed) - 1), 0, 2, 2, SEG, FINAL_SIZE)
    for first, last, final in ((-1, 2, 2), (2, 1, 2), (0, 3, 2)):
        with pytest.raises(ValueError, match="bad segment range"):
            key.decrypt_run(sealed, out, first, last, final, SEG, FINAL_SIZE)
    for seg, final_size in ((0, 0), (SEG, SEG), (SEG, -1), (-5, 0)):
        with pytest.raises(ValueError, match="bad segment sizes"):
            key.decrypt_run(sealed, out, 0, 2, 2, seg, final_size)
    with pytest.raises(ValueError, match="too long"):
        key.decrypt_run(sealed, out, 0, 2 ** 62, 2 ** 62, SEG, FINAL_SIZE)
    with pytest.raises(TypeError, match="read-write"):
        key.decrypt_run(sealed, bytes(len(plain)), 0, 2, 2, SEG, FINAL_SIZE)
    both = bytearray(sealed)
    with pytest.raises(ValueError, match="overlap"):
        key.decrypt_run(both, memoryview(both)[: len(plain)], 0, 2, 2, SEG, FINAL_SIZE)
    with pytest.raises(ValueError, match="16 or 32 bytes, not 24"):
        cseal.Key(bytes(24))
    with pytest.raises(ValueError, match="12-byte nonce"):
        key.decrypt(bytes(11), sealed[: SEG + 16], bytearray(SEG))
    with pytest.raises(ValueError, match="len\\(data\\) - 16"):
        key.decrypt(bytes(12), sealed[: SEG + 16], bytearray(SEG + 1))
    assert out == bytes(len(plain))  # nothing was written by a refused call


@native
def test_a_key_refuses_pickling_and_copying_and_its_repr_holds_no_key():
    dek = bytes(range(32))
    key = cseal.Key(dek)
    for dump in (pickle.dumps, copy.copy, copy.deepcopy,
                 lambda k: pickle.dumps(k, protocol=0)):
        with pytest.raises(TypeError, match="cannot be pickled"):
            dump(key)
    assert repr(key) == "<cryptdisk.format._cseal.Key AES-256-GCM>"
    assert repr(cseal.Key(bytes(16))) == "<cryptdisk.format._cseal.Key AES-128-GCM>"
    assert not hasattr(key, "__dict__")


@native
def test_threads_decrypt_with_one_key():
    dek = os.urandom(32)
    key = cseal.Key(dek)
    seg, count = 4096, 64
    plain = os.urandom(count * seg - 100)
    sealed = _records(dek, 0, count - 1, count - 1, seg, seg - 100, plain)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for _ in range(20):
                out = bytearray(len(plain))
                assert key.decrypt_run(sealed, out, 0, count - 1, count - 1, seg, seg - 100) == -1
                assert out == plain
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# -- sealed files through both backends --------------------------------------------------

@pytest.fixture(params=["native", "cryptography"])
def backend(request, monkeypatch):
    if request.param == "native":
        if cseal is None:
            pytest.skip("cryptdisk.format._cseal not built")
    else:
        monkeypatch.setattr(_sealed, "_cseal", None)
    return request.param


def _write(header, dek, plain: bytes, chunks: list[int]) -> bytes:
    out = io.BytesIO()
    writer = SealedWriter(out, header, dek)
    pos = 0
    for n in chunks:
        writer.write(plain[pos : pos + n])
        pos += n
    writer.write(plain[pos:])
    writer.close()
    return out.getvalue()


@settings(max_examples=40, deadline=None)
@given(size=st.integers(0, 40 * 512 + 600), cuts=st.lists(st.integers(0, 20 * 512), max_size=4),
       key_size=st.sampled_from([16, 32]))
def test_both_backends_write_and_read_the_same_files(size, cuts, key_size):
    key = Keyring.single(os.urandom(key_size)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=512)
    plain = os.urandom(size)
    saved = _sealed._cseal
    try:
        files = []
        for module in ([saved] if saved is not None else []) + [None]:
            _sealed._cseal = module
            files.append(_write(header, dek, plain, cuts))
            reader = SealedReader(_Recording(files[-1]), header, dek)  # type: ignore[arg-type]
            buf = bytearray(size)
            assert reader.readinto_at(buf, 0) == size and buf == plain
            serial = bytearray(size)
            assert reader.readinto_at(serial, 0, parallel=False) == size and serial == plain
            streamed = b"".join(bytes(v) for v in iter_sealed_stream(
                io.BytesIO(files[-1][HEADER_SIZE:]), header, dek))
            assert streamed == plain
    finally:
        _sealed._cseal = saved
    assert all(f == files[0] for f in files)


def test_tampering_fails_the_read_and_releases_nothing(backend):
    key = Keyring.single(os.urandom(32)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=512)
    plain = os.urandom(40 * 512 + 77)  # a read of 40 segments is split in two halves
    sealed = _write(header, dek, plain, [])
    record = 512 + 16
    for segment in (0, 9, 19, 20, 39):
        damaged = bytearray(sealed)
        damaged[HEADER_SIZE + segment * record + 3] ^= 0x40
        reader = SealedReader(_Recording(bytes(damaged)), header, dek)  # type: ignore[arg-type]
        for parallel in (True, False):
            buf = bytearray(40 * 512)
            with pytest.raises(SegmentAuthenticationError, match=f"segment {segment} at offset "
                               f"{HEADER_SIZE + segment * record}: its bytes were altered, "
                               "or it was sealed with a different key$"):
                reader.readinto_at(buf, 0, parallel=parallel)
            assert buf[segment * 512 : (segment + 1) * 512] == bytes(512)
        with pytest.raises(SegmentAuthenticationError, match=f"segment {segment} "):
            reader.read_at(segment * 512, 512)
        with pytest.raises(SegmentAuthenticationError, match=f"segment {segment} "):
            reader.verify()
    damaged = bytearray(sealed)
    damaged[-1] ^= 1  # the final segment's tag: refused when the reader is made
    with pytest.raises(SegmentAuthenticationError, match=r"segment 40 .*the file was truncated"):
        SealedReader(_Recording(bytes(damaged)), header, dek)  # type: ignore[arg-type]


def test_threads_read_one_reader(backend):
    key = Keyring.single(os.urandom(32)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=4096)
    plain = os.urandom(300 * 4096 + 1234)
    reader = SealedReader(_Recording(_write(header, dek, plain, [])), header, dek)  # type: ignore[arg-type]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = __import__("random").Random(seed)
        try:
            for _ in range(30):
                offset = rng.randrange(len(plain))
                n = rng.randrange(1, 40 * 4096)
                buf = bytearray(n)
                got = reader.readinto_at(buf, offset, parallel=rng.random() < 0.5)
                assert bytes(buf[:got]) == plain[offset : offset + got]
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_the_environment_switches_to_cryptography():
    code = ("from cryptdisk.format import _sealed; import sys; "
            "sys.stdout.write(repr(_sealed.sealed_library()))")
    env = dict(os.environ, CRYPTDISK_SEALED_AEAD="cryptography")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True)
    assert done.stdout == "None"
    env.pop("CRYPTDISK_SEALED_AEAD")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          check=True)
    assert done.stdout == ("None" if cseal is None else repr(cseal.library()))


# -- a range read and packed in one call (readinto_spans, the database's value chunks) ---

def _spans_reference(plain: bytes, offset: int, spans: list[tuple[int, int]]) -> bytes:
    return b"".join(plain[a:b] for a, b in spans)


def _sealed_reader(plain: bytes, seg: int, key_size: int = 32
                   ) -> tuple[SealedReader, bytes, object, bytes]:
    key = Keyring.single(os.urandom(key_size)).current_key()
    header, dek = new_header(Kind.SEALED, key, segment_size=seg)
    sealed = _write(header, dek, plain, [])
    return SealedReader(_Recording(sealed), header, dek), sealed, header, dek  # type: ignore[arg-type]


@st.composite
def _packed_reads(draw):
    seg = draw(st.sampled_from([512, 1024]))
    size = draw(st.integers(1, 12 * seg + 100))
    # ranges starting and ending on segment boundaries, or anywhere
    edges = sorted({0, size, *range(0, size, seg)})
    offset = draw(st.one_of(st.sampled_from(edges[:-1]), st.integers(0, size - 1)))
    end = draw(st.one_of(st.sampled_from([e for e in edges if e > offset] or [size]),
                         st.integers(offset + 1, size)))
    cuts = sorted(draw(st.lists(st.integers(offset, end), max_size=8)))
    spans = [(cuts[k], cuts[k + 1]) for k in range(0, len(cuts) - 1, 2)]
    return seg, size, offset, end, spans


@settings(max_examples=120, deadline=None)
@given(read=_packed_reads(), key_size=st.sampled_from([16, 32]))
def test_a_packed_read_equals_the_spans_of_the_plaintext_on_both_backends(read, key_size):
    """``readinto_spans`` (one C call with the extension) and its Python fallback give the
    spans' bytes packed at the buffer's start, for ranges on and off segment boundaries."""
    seg, size, offset, end, spans = read
    plain = os.urandom(size)
    saved = _sealed._cseal
    try:
        for module in ([saved] if saved is not None else []) + [None]:
            _sealed._cseal = module
            reader, _sealed_bytes, _h, _d = _sealed_reader(plain, seg, key_size)
            buf = bytearray(b"\xaa" * (end - offset))
            packed = reader.readinto_spans(buf, offset, spans)
            want = _spans_reference(plain, offset, spans)
            assert packed == len(want) and bytes(buf[:packed]) == want
            if not spans:  # nothing packed: the range as it is
                assert bytes(buf) == plain[offset:end]
    finally:
        _sealed._cseal = saved


@native
@spans_built
def test_a_packed_read_is_one_call_of_the_extension(monkeypatch):
    """With the C extension a packed read is one call (the GIL released once), not a call
    for each partial edge and one for the run between (readinto_at: three)."""
    seg = 512
    plain = os.urandom(10 * seg + 33)
    reader, _s, _h, _d = _sealed_reader(plain, seg)
    calls: list[str] = []

    class Counting:
        def __init__(self, key):
            self._key = key

        def __getattr__(self, name):
            calls.append(name)
            return getattr(self._key, name)

    reader._key = Counting(reader._key)
    offset, end = seg + 100, 8 * seg + 7
    spans = [(seg + 140, 3 * seg), (3 * seg + 40, 8 * seg + 7)]
    buf = bytearray(end - offset)
    assert reader.readinto_spans(buf, offset, spans) == len(_spans_reference(plain, offset, spans))
    assert calls == ["decrypt_spans"]
    assert bytes(buf[: 2 * seg - 140]) == plain[seg + 140 : 3 * seg]


@pytest.mark.parametrize(("offset", "end"), [
    (100, 7 * 512 + 300),     # partial first and last segments
    (512, 7 * 512),           # starting and ending on segment boundaries
    (512, 7 * 512 + 300),     # starting on one
    (100, 7 * 512),           # ending on one
    (512, 12 * 512 + 77),     # to the end of the file (its short final segment)
])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_byte_anywhere_in_a_packed_read_fails_it(backend, offset, end, where):
    """A changed byte in the range's first, a middle or its last segment fails the read
    with that segment's error; with the extension the whole buffer is wiped (no
    plaintext of the range is left, authenticated or not)."""
    seg = 512
    plain = os.urandom(12 * seg + 77)
    first, last = offset // seg, (end - 1) // seg
    segment = {"first": first, "middle": (first + last) // 2, "last": last}[where]
    reader, sealed, header, dek = _sealed_reader(plain, seg)
    damaged = bytearray(sealed)
    damaged[HEADER_SIZE + segment * (seg + 16) + 5] ^= 0x10
    if segment == 12:  # the final segment: refused when the reader is made
        with pytest.raises(SegmentAuthenticationError, match="segment 12 "):
            SealedReader(_Recording(bytes(damaged)), header, dek)  # type: ignore[arg-type]
        reader = SealedReader(_Recording(bytes(damaged)), header, dek,  # type: ignore[arg-type]
                              check_final=False)
    else:
        reader = SealedReader(_Recording(bytes(damaged)), header, dek)  # type: ignore[arg-type]
    buf = bytearray(b"\xaa" * (end - offset))
    with pytest.raises(SegmentAuthenticationError, match=f"segment {segment} at offset "
                       f"{HEADER_SIZE + segment * (seg + 16)}"):
        reader.readinto_spans(buf, offset, [(offset + 8, end)])
    if backend == "native" and _sealed._SPANS:
        assert buf == bytes(len(buf))
    intact, _s, _h, _d = _sealed_reader(plain, seg)  # (the same range of an intact file reads)
    assert intact.readinto_spans(buf, offset, [(offset + 8, end)]) == end - offset - 8


@native
@spans_built
def test_a_packed_reads_buffers_and_spans_are_checked():
    seg = 512
    plain = os.urandom(4 * seg + 10)
    reader, sealed, _h, _d = _sealed_reader(plain, seg)
    key = reader._key
    body = sealed[HEADER_SIZE:]
    record = seg + 16
    cipher = body[record : 3 * record]  # segments 1..2
    out = bytearray(seg)
    args = (1, 2, 4, seg, 10)
    assert key.decrypt_spans(cipher, out, *args, seg + 100, [(seg + 100, seg + 200)]) == (-1, 100)
    assert bytes(out[:100]) == plain[seg + 100 : seg + 200]
    for spans, why in (([(seg + 200, seg + 300), (seg + 100, seg + 150)], "not in order"),
                       ([(seg + 99, seg + 150)], "not in order"),
                       ([(seg + 150, seg + 100)], "not in order"),
                       ([(seg + 100, 2 * seg + 101)], "not in order"),
                       ([[seg + 100, seg + 150]], "is a \\(start, end\\) tuple"),
                       ([(seg + 100,)], "is a \\(start, end\\) tuple")):
        out[:] = b"\xaa" * seg
        with pytest.raises(ValueError, match=why):
            key.decrypt_spans(cipher, out, *args, seg + 100, spans)
        assert out == b"\xaa" * seg  # refused before anything was written
    with pytest.raises(TypeError):
        key.decrypt_spans(cipher, out, *args, seg + 100, 5)
    with pytest.raises(ValueError, match="do not hold"):  # past the run's plaintext
        key.decrypt_spans(cipher, out, *args, 2 * seg + 1, [])
    with pytest.raises(ValueError, match="do not hold"):  # before it
        key.decrypt_spans(cipher, out, *args, seg - 1, [])
    with pytest.raises(ValueError, match="do not hold"):  # a ciphertext cut short
        key.decrypt_spans(cipher[:-1], out, *args, seg, [])
    with pytest.raises(ValueError, match="do not hold"):  # an empty range
        key.decrypt_spans(cipher, bytearray(), *args, seg, [])
    with pytest.raises(ValueError, match="bad segment range"):
        key.decrypt_spans(cipher, out, 2, 1, 4, seg, 10, seg, [])
    with pytest.raises(ValueError, match="bad segment sizes"):
        key.decrypt_spans(cipher, out, 1, 2, 4, seg, seg, seg, [])
    both = bytearray(cipher)
    with pytest.raises(ValueError, match="overlap"):
        key.decrypt_spans(both, memoryview(both)[:seg], *args, seg, [])
    with pytest.raises(ValueError, match="not inside the file"):
        reader.readinto_spans(bytearray(20), len(plain) - 10, [])


@native
def test_an_extension_without_the_packed_read_falls_back_to_the_run_and_python(monkeypatch):
    """An extension built from older sources (no ``decrypt_spans``; main's untracked build
    outputs lag its sources) reads the same bytes through ``decrypt_run`` and Python."""
    seg = 512
    plain = os.urandom(9 * seg + 5)
    reader, _s, _h, _d = _sealed_reader(plain, seg)
    monkeypatch.setattr(_sealed, "_SPANS", False)
    offset, end = 300, 8 * seg + 2
    spans = [(400, 900), (1000, 8 * seg + 2)]
    buf = bytearray(end - offset)
    assert reader.readinto_spans(buf, offset, spans) == 500 + 8 * seg + 2 - 1000
    assert bytes(buf[:500]) == plain[400:900]
    assert bytes(buf[500 : 500 + 8 * seg + 2 - 1000]) == plain[1000 : 8 * seg + 2]


def test_the_built_extension_has_the_packed_read():
    """The skips above spare a worktree whose untracked build predates ``decrypt_spans``;
    a fresh build (CI's) must have it, so a stale or partial build fails here instead of
    skipping into green."""
    assert cseal is not None, "cryptdisk.format._cseal was not built"
    assert _sealed._SPANS, "cryptdisk.format._cseal has no decrypt_spans: rebuild it"


# -- reading the records from a file (pread_run, pread_spans) ------------------------------

pread_built = pytest.mark.skipif(not _sealed._PREAD, reason="cryptdisk.format._cseal built "
                                 "without pread_run (older sources): rebuild it")


def _file_of(tmp_path, prefix: bytes, records: bytes) -> int:
    path = tmp_path / "records"
    path.write_bytes(prefix + records)
    return os.open(path, os.O_RDWR)


@pread_built
@settings(max_examples=60, deadline=None)
@given(layout=_layouts(), pad=st.integers(0, 300), cut=st.integers(0, 10**6))
def test_pread_equals_decrypt_from_memory_and_a_cut_file_fails_its_first_short_segment(
        tmp_path_factory, layout, pad, cut):
    dek, first, last, final, seg, final_size = layout
    plain = os.urandom(_plain_size(first, last, final, seg, final_size))
    records = _records(dek, first, last, final, seg, final_size, plain)
    key = cseal.Key(dek)
    fd = _file_of(tmp_path_factory.mktemp("pread"), os.urandom(pad), records)
    try:
        out = bytearray(len(plain))
        assert key.pread_run(fd, pad, out, first, last, final, seg, final_size) == -1
        assert bytes(out) == plain
        base = first * seg
        lo, hi = base + len(plain) // 3, base + len(plain) - len(plain) // 4
        if hi > lo:
            spans = [(lo, lo + (hi - lo) // 2), (hi - (hi - lo) // 4, hi)]
            got = bytearray(hi - lo)
            mem = bytearray(hi - lo)
            assert key.pread_spans(fd, pad, got, first, last, final, seg, final_size, lo,
                                   spans) == key.decrypt_spans(
                records, mem, first, last, final, seg, final_size, lo, spans)
            assert got == mem
        # cut short: the first segment whose record the file no longer holds whole fails,
        # its plaintext and nothing after it written (a run), or all of it wiped (spans)
        kept = cut % (len(records) + 1)
        os.ftruncate(fd, pad + kept)
        short = next((i for i in range(first, last + 1)
                      if (i - first) * (seg + 16) + (final_size if i == final else seg) + 16
                      > kept), -1)
        out = bytearray(b"\xaa" * len(plain))
        assert key.pread_run(fd, pad, out, first, last, final, seg, final_size) == short
        if short >= 0:
            at = (short - first) * seg
            n = final_size if short == final else seg
            assert bytes(out[:at]) == plain[:at]
            assert out[at : at + n] == bytes(n)  # wiped
            assert out[at + n :] == b"\xaa" * (len(out) - at - n)  # not written
    finally:
        os.close(fd)


@pread_built
def test_pread_reads_past_its_chunk_and_reports_a_bad_descriptor(tmp_path):
    """64 KiB segments, 40 of them: more than one 1 MiB read; a closed descriptor raises
    OSError, a negative one or offset ValueError."""
    dek, seg, final = os.urandom(32), 1 << 16, 40
    plain = os.urandom(final * seg + 7)
    records = _records(dek, 0, final, final, seg, 7, plain)
    key = cseal.Key(dek)
    fd = _file_of(tmp_path, b"h" * 128, records)
    try:
        out = bytearray(len(plain))
        assert key.pread_run(fd, 128, out, 0, final, final, seg, 7) == -1 and out == plain
        got = bytearray(seg * 30)
        assert key.pread_spans(fd, 128, got, 0, final, final, seg, 7, 5 * seg,
                               [(5 * seg, 6 * seg), (30 * seg, 35 * seg)]) == (-1, 6 * seg)
        assert got[: 6 * seg] == plain[5 * seg : 6 * seg] + plain[30 * seg : 35 * seg]
        os.ftruncate(fd, 128 + 25 * (seg + 16) + 100)  # segment 25 is cut
        assert key.pread_run(fd, 128, out, 0, final, final, seg, 7) == 25
        assert out[: 25 * seg] == plain[: 25 * seg] and out[25 * seg : 26 * seg] == bytes(seg)
    finally:
        os.close(fd)
    with pytest.raises(OSError):
        key.pread_run(fd, 128, out, 0, final, final, seg, 7)
    with pytest.raises(ValueError):
        key.pread_run(-1, 128, out, 0, final, final, seg, 7)
    with pytest.raises(ValueError):
        key.pread_spans(3, -1, out, 0, final, final, seg, 7, 0, [])


@pread_built
@pytest.mark.parametrize("bad", [0, 37, 63, 64, 65, 127, 128, 150])
def test_pread_refuses_a_flipped_or_cut_segment_in_any_batch_and_leaves_no_plaintext(
        tmp_path, bad):
    """1000-byte segments, 151 of them, read from a file: a segment flipped anywhere (the
    first, a middle one, the file's final one) is refused with its index, the segments
    before it are plaintext and nothing at or after it is; cut short inside it, it is
    refused and nothing after it is written; a packed read of the same range fails with
    the same index, all of its output wiped."""
    dek, seg, final, final_size = os.urandom(32), 1000, 150, 321
    plain = os.urandom(final * seg + final_size)
    records = _records(dek, 0, final, final, seg, final_size, plain)
    key = cseal.Key(dek)
    record = seg + 16
    n = final_size if bad == final else seg
    spans = [(10, 5 * seg), (5 * seg + 7, 140 * seg + 3), (140 * seg + 9, len(plain) - 2)]
    for damage in ("flip", "cut"):
        data = bytearray(records)
        if damage == "flip":
            data[bad * record + 17] ^= 0x01
        else:
            data = data[: bad * record + n // 2]
        fd = _file_of(tmp_path, b"h" * 99, bytes(data))
        try:
            out = bytearray(b"\xaa" * len(plain))
            assert key.pread_run(fd, 99, out, 0, final, final, seg, final_size) == bad
            at = bad * seg
            assert out[:at] == plain[:at]
            assert out[at : at + n] == bytes(n)  # wiped
            after = out[at + n :]
            if damage == "cut":
                assert after == b"\xaa" * len(after)  # not written
            else:  # wiped or not written, never plaintext
                for k in range(bad + 1, final + 1):
                    got = bytes(out[k * seg : k * seg + (final_size if k == final else seg)])
                    assert got.strip(b"\x00") == b"" or got.strip(b"\xaa") == b""
            packed = bytearray(b"\xaa" * (len(plain) - 11))
            assert key.pread_spans(fd, 99, packed, 0, final, final, seg, final_size, 10,
                                   spans) == (bad, 0)
            assert packed == bytes(len(packed))
        finally:
            os.close(fd)
        fd = _file_of(tmp_path, b"h" * 99, records)  # whole: the same reads give the plaintext
        try:
            out = bytearray(len(plain))
            assert key.pread_run(fd, 99, out, 0, final, final, seg, final_size) == -1
            assert out == plain
            packed = bytearray(len(plain) - 11)
            want = b"".join(plain[a:b] for a, b in spans)
            assert key.pread_spans(fd, 99, packed, 0, final, final, seg, final_size, 10,
                                   spans) == (-1, len(want))
            assert packed[: len(want)] == want
        finally:
            os.close(fd)


@st.composite
def _long_packed_reads(draw):
    """Reads of up to 200 segments of 1 KiB, with up to 30 spans anywhere in the range,
    empty ones included."""
    seg = 1024
    size = draw(st.integers(1, 200 * seg + 100))
    offset = draw(st.integers(0, size - 1))
    end = draw(st.integers(offset + 1, size))
    cuts = sorted(draw(st.lists(st.integers(offset, end), max_size=60)))
    spans = [(cuts[k], cuts[k + 1]) for k in range(0, len(cuts) - 1, 2)]
    return seg, size, offset, end, spans


@pread_built
@settings(max_examples=80, deadline=None)
@given(read=_long_packed_reads())
def test_a_long_packed_read_from_a_file_equals_the_spans_of_the_plaintext(
        tmp_path_factory, read):
    """pread_spans gives the spans' bytes packed, as decrypt_spans does from memory, for
    ranges of up to 200 segments and up to 30 spans."""
    seg, size, offset, end, spans = read
    dek = os.urandom(32)
    plain = os.urandom(size)
    final = (size - 1) // seg
    final_size = size - final * seg
    if final_size == seg:  # (a final segment is shorter than the others: one more, empty)
        final, final_size = final + 1, 0
    records = _records(dek, 0, final, final, seg, final_size, plain)
    first, last = offset // seg, (end - 1) // seg
    record = seg + 16
    key = cseal.Key(dek)
    fd = _file_of(tmp_path_factory.mktemp("spans"), b"x" * 7, records)
    try:
        got = bytearray(b"\xaa" * (end - offset))
        count, packed = key.pread_spans(fd, 7 + first * record, got, first, last, final, seg,
                                        final_size, offset, spans)
        want = b"".join(plain[a:b] for a, b in spans)
        assert (count, packed) == (-1, len(want)) and bytes(got[:packed]) == want
        if not spans:
            assert bytes(got) == plain[offset:end]
        mem = bytearray(end - offset)
        cipher = records[first * record : min(len(records), (last + 1) * record)]
        assert key.decrypt_spans(cipher, mem, first, last, final, seg, final_size, offset,
                                 spans) == (-1, len(want)) and mem[:packed] == want
    finally:
        os.close(fd)

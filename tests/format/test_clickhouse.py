"""ClickHouse's encrypted-disk format: header, fingerprint, CTR stream, files; real ClickHouse."""

from __future__ import annotations

import io
import os
import pickle
import random
import struct
import threading

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cryptdisk.errors import (
    KeyNotFoundError,
    MalformedHeaderError,
    NotEncryptedError,
    UnsupportedVersionError,
    WrongKeyError,
)
from cryptdisk.format import source_for
from cryptdisk.format.clickhouse import (
    CH_HEADER_SIZE,
    CHAlgorithm,
    CHHeader,
    CHReader,
    CHWriter,
    ch_append,
    ch_key_finder,
    clickhouse_fingerprint,
    clickhouse_v1_key_hash,
    is_clickhouse_header,
    open_clickhouse,
)

KEY = bytes.fromhex("00112233445566778899aabbccddeeff")
TOP = 1 << 128

# --- an independent reference: AES-ECB on explicit counter blocks --------------------------


def ref_keystream(key: bytes, iv: bytes, start: int, n: int) -> bytes:
    """Keystream bytes [start, start+n): block b is AES_K(u128be((IV + b) mod 2^128))."""
    first, last = start // 16, (start + n + 15) // 16
    ivn = int.from_bytes(iv, "big")
    blocks = b"".join(((ivn + b) % TOP).to_bytes(16, "big") for b in range(first, last))
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    stream = enc.update(blocks) + enc.finalize()
    return stream[start - first * 16 : start - first * 16 + n]


def xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def ref_file(key: bytes, iv: bytes, data: bytes, alg: int) -> bytes:
    header = b"ENC" + struct.pack("<HH", 2, alg) + clickhouse_fingerprint(key) + iv
    return header + bytes(64 - len(header)) + xor(data, ref_keystream(key, iv, 0, len(data)))


keys = st.sampled_from([16, 24, 32]).flatmap(lambda n: st.binary(min_size=n, max_size=n))
ivs = st.one_of(
    st.binary(min_size=16, max_size=16),
    st.integers(TOP - 300, TOP - 1).map(lambda v: v.to_bytes(16, "big")),  # wraps past 2^128
    st.integers((1 << 64) - 40, (1 << 64) + 40).map(lambda v: v.to_bytes(16, "big")),  # carry
    st.integers((1 << 32) - 40, (1 << 32) + 40).map(lambda v: v.to_bytes(16, "big")),
)

# --- fingerprint -----------------------------------------------------------------------------


def test_fingerprint_published_value():
    assert clickhouse_fingerprint(KEY).hex() == "75264928bd0f327f80f1af4b93f2cd69"


def test_siphash64_reference_vectors():
    from cryptdisk.format._ch_siphash import siphash64

    k0, k1 = struct.unpack("<QQ", bytes(range(16)))  # SipHash paper's key 00..0f
    assert siphash64(b"", k0, k1) == 0x726FDB47DD0E0E31
    assert siphash64(bytes(range(15)), k0, k1) == 0xA129CA6149BE45E5


def test_fingerprint_accepts_bytearray_and_differs_per_key():
    assert clickhouse_fingerprint(bytearray(KEY)) == clickhouse_fingerprint(KEY)
    assert clickhouse_fingerprint(KEY[:-1] + b"\x00") != clickhouse_fingerprint(KEY)


# --- algorithm and header --------------------------------------------------------------------


def test_algorithm_parse_and_sizes():
    assert CHAlgorithm.parse("AES_128_CTR") is CHAlgorithm.AES_128_CTR
    assert CHAlgorithm.parse("aes_256_ctr") is CHAlgorithm.AES_256_CTR
    assert CHAlgorithm.parse(1) is CHAlgorithm.AES_192_CTR
    assert [a.key_size for a in CHAlgorithm] == [16, 24, 32]
    assert CHAlgorithm.for_key(bytes(24)) is CHAlgorithm.AES_192_CTR
    with pytest.raises(ValueError, match="aes_128_ctr"):
        CHAlgorithm.parse("aes_128_gcm")
    with pytest.raises(ValueError):
        CHAlgorithm.for_key(bytes(20))


@settings(deadline=None)
@given(alg=st.sampled_from(list(CHAlgorithm)), fp=st.binary(min_size=16, max_size=16),
       iv=st.binary(min_size=16, max_size=16))
def test_header_v2_round_trip(alg, fp, iv):
    h = CHHeader(2, alg, fp, None, iv)
    raw = h.to_bytes()
    assert len(raw) == CH_HEADER_SIZE == 64
    assert raw[:7] == b"ENC" + struct.pack("<HH", 2, alg)
    assert raw[7:23] == fp and raw[23:39] == iv and raw[39:] == bytes(25)
    assert CHHeader.parse(raw) == h
    assert h.fingerprint == fp
    assert is_clickhouse_header(raw)


@pytest.mark.parametrize("order", ["<", ">"])
def test_header_v1_both_byte_orders(order):
    iv = os.urandom(16)
    body = b"ENC" + struct.pack(order + "HHQB", 1, 2, 0x0102030405060708, 0x0B) + iv
    h = CHHeader.parse(body + bytes(32))
    assert (h.version, h.algorithm, h.key_id, h.v1_key_hash, h.iv) == (
        1, CHAlgorithm.AES_256_CTR, 0x0102030405060708, 0x0B, iv)
    assert h.key_fingerprint is None
    assert h.fingerprint == struct.pack("<QQ", 0x0102030405060708, 0x0B)  # ClickHouse's v1 value
    assert is_clickhouse_header(body)


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (b"", NotEncryptedError, "no 'ENC'"),
        (b"PAR1" + bytes(60), NotEncryptedError, "not a ClickHouse"),
        (b"ENC\x02\x00\x00\x00", MalformedHeaderError, "truncated: 7 of 64"),
        (b"ENC" + struct.pack("<HH", 3, 0) + bytes(57), UnsupportedVersionError, "version 3"),
        (b"ENC" + struct.pack("<HH", 0, 0) + bytes(57), UnsupportedVersionError, "version 0"),
        (b"ENC" + struct.pack("<HH", 2, 3) + bytes(57), UnsupportedVersionError, "algorithm 3"),
        (b"ENC" + struct.pack("<HH", 2, 0) + bytes(56) + b"\x01", MalformedHeaderError,
         "padding"),
    ],
)
def test_header_errors(data, error, match):
    with pytest.raises(error, match=match) as info:
        CHHeader.parse(data, "some/file.bin")
    assert "some/file.bin" in str(info.value)


def test_header_validates_fields():
    with pytest.raises(ValueError):
        CHHeader(2, CHAlgorithm.AES_128_CTR, None, None, bytes(16))
    with pytest.raises(ValueError):
        CHHeader(2, CHAlgorithm.AES_128_CTR, bytes(16), None, bytes(15))
    with pytest.raises(ValueError):
        CHHeader(1, CHAlgorithm.AES_128_CTR, None, None, bytes(16))
    assert not is_clickhouse_header(b"ENC\x05\x00")


# --- the CTR stream against the ECB reference -----------------------------------------------


@settings(max_examples=150, deadline=None)
@given(key=keys, iv=ivs, data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000)),
       reads=st.lists(st.tuples(st.integers(0, 3100), st.integers(0, 400)), max_size=8))
def test_writer_matches_reference_and_reader_reads_any_slice(key, iv, data, cuts, reads):
    raw = io.BytesIO()
    w = CHWriter(raw, key, iv=iv)
    pos = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        w.write(data[pos:cut])  # streaming across arbitrary write sizes
        pos = cut
    w.close()
    alg = CHAlgorithm.for_key(key)
    assert raw.getvalue() == (ref_file(key, iv, data, alg) if data else b"")
    if not data:
        return
    raw.seek(0)
    reader = CHReader(source_for(raw), CHHeader.parse(raw.getvalue()), key)
    assert reader.size == len(data)
    for off, n in reads:
        assert reader.read_at(off, n) == data[off : off + n]
        buf = bytearray(n)
        got = reader.readinto_at(buf, off)
        assert bytes(buf[:got]) == data[off : off + n]


def test_counter_wraps_past_2_128():
    iv = (TOP - 2).to_bytes(16, "big")
    data = os.urandom(100)
    raw = io.BytesIO()
    CHWriter(raw, KEY, iv=iv).write(data)
    body = raw.getvalue()[64:]
    blocks = [(TOP - 2), (TOP - 1), 0, 1, 2, 3, 4]
    ecb = Cipher(algorithms.AES(KEY), modes.ECB()).encryptor()
    ks = ecb.update(b"".join(b.to_bytes(16, "big") for b in blocks))
    assert body == xor(data, ks[:100])


def test_a_failed_sync_of_the_directory_fails_the_write(tmp_path, monkeypatch):
    """The file is renamed into place, then its directory synced so the name survives a
    crash of the machine: a failed sync is the writer's error, not ignored."""
    real = os.fsync

    def fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(5, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    p = tmp_path / "d.bin"
    with pytest.raises(OSError, match="Input/output error"):
        with open_clickhouse(p, "wb", key=KEY) as f:
            f.write(b"data")


def test_large_read_crosses_chunks(tmp_path, monkeypatch):
    import cryptdisk.format._ch_stream as stream

    monkeypatch.setattr(stream, "CHUNK_SIZE", 4096)
    data = os.urandom(50_000)
    p = tmp_path / "big.bin"
    with open_clickhouse(p, "wb", key=KEY) as f:
        f.write(data)
    with open_clickhouse(p, key=KEY) as f:
        assert f.pread(1001, 30_000) == data[1001:31_001]
        buf = bytearray(45_000)
        f.seek(7)
        assert f.readinto(buf) == 45_000 and bytes(buf) == data[7:45_007]


# --- files: write, read, append, empty, atomicity ------------------------------------------


def test_file_round_trip_and_file_api(tmp_path):
    data = os.urandom(10_000)
    p = tmp_path / "col.bin"
    with open_clickhouse(p, "wb", key=KEY, algorithm="aes_128_ctr") as f:
        assert f.write(data[:3]) == 3
        f.write(memoryview(data)[3:])
        assert f.tell() == len(data)
    assert p.stat().st_size == 64 + len(data)
    with open_clickhouse(p, key=KEY) as f:
        assert f.size == len(data) and f.header.version == 2
        assert f.read(5) == data[:5] and f.tell() == 5
        f.seek(-10, os.SEEK_END)
        assert f.read() == data[-10:]
        f.seek(3)
        f.seek(4, os.SEEK_CUR)
        assert f.read(3) == data[7:10]
        assert f.read(0) == b"" and f.pread(len(data) + 5, 3) == b""
        assert KEY.hex() not in repr(f) and "col.bin" in repr(f)
        with pytest.raises(TypeError, match="pickled"):
            pickle.dumps(f)
    with pytest.raises(ValueError):
        open_clickhouse(p, "r+b", key=KEY)


def test_empty_file_is_zero_bytes_without_header(tmp_path):
    p = tmp_path / "empty.txt"
    with open_clickhouse(p, "wb", key=KEY) as f:
        f.write(b"")
    assert p.read_bytes() == b""
    with open_clickhouse(p, key_for=lambda h: pytest.fail("no key needed")) as f:
        assert f.header is None and f.size == 0 and f.read() == b""


def test_write_is_atomic_and_discarded_on_error(tmp_path):
    p = tmp_path / "data.bin"
    with open_clickhouse(p, "wb", key=KEY) as f:
        f.write(b"old contents")
    with pytest.raises(RuntimeError), open_clickhouse(p, "wb", key=KEY) as f:
        f.write(b"new contents")
        temps = [x.name for x in tmp_path.iterdir() if x.name != "data.bin"]
        assert len(temps) == 1 and temps[0].startswith(".data.bin.")
        assert temps[0].endswith(".cdtmp")
        raise RuntimeError("boom")
    assert sorted(x.name for x in tmp_path.iterdir()) == ["data.bin"]
    with open_clickhouse(p, key=KEY) as f:
        assert f.read() == b"old contents"


def test_rewrite_uses_fresh_iv(tmp_path):
    p = tmp_path / "f"
    ivs_seen = set()
    for _ in range(3):
        with open_clickhouse(p, "wb", key=KEY) as f:
            f.write(b"x" * 100)
            ivs_seen.add(f.header.iv)
    assert len(ivs_seen) == 3


@given(key=keys, iv=ivs, parts=st.lists(st.binary(max_size=200), min_size=1, max_size=5))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_append_continues_the_stream(tmp_path, key, iv, parts):
    p = tmp_path / f"a-{os.urandom(6).hex()}"
    with open_clickhouse(p, "ab", key=key, iv=iv) as f:
        f.write(parts[0])
    for part in parts[1:]:
        ch_append(p, key, part)
    data = b"".join(parts)
    alg = CHAlgorithm.for_key(key)
    # Same header and IV throughout: the file equals one write of everything.
    expected = ref_file(key, iv, data, alg) if data else b""
    if data and not parts[0]:  # the first non-empty append starts the file with a random IV
        expected = None
    if expected is not None:
        assert p.read_bytes() == expected
    with open_clickhouse(p, key=key) as f:
        assert f.read() == data


def test_append_keeps_header_and_prefix(tmp_path):
    p = tmp_path / "log.txt"
    ch_append(p, KEY, b"first line\n")
    before = p.read_bytes()
    assert ch_append(p, KEY, b"second line\n") == 23
    after = p.read_bytes()
    assert after[: len(before)] == before
    with open_clickhouse(p, key=KEY) as f:
        assert f.read() == b"first line\nsecond line\n"


def test_an_append_that_creates_the_file_makes_it_owner_only(tmp_path):
    """As cryptdisk's other encrypted files: 0600 whatever the umask (0644 before)."""
    old = os.umask(0o022)
    try:
        ch_append(tmp_path / "new.txt", KEY, b"x")
        with open_clickhouse(tmp_path / "new2.txt", "ab", key=KEY) as f:
            f.write(b"y")
        with open_clickhouse(tmp_path / "new3.txt", "wb", key=KEY) as f:
            f.write(b"z")
    finally:
        os.umask(old)
    for name in ("new.txt", "new2.txt", "new3.txt"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name


def test_append_with_wrong_key_refuses_and_abort_truncates(tmp_path):
    p = tmp_path / "log.txt"
    ch_append(p, KEY, b"hello")
    before = p.read_bytes()
    other = os.urandom(16)
    with pytest.raises(WrongKeyError):
        ch_append(p, other, b"world")
    assert p.read_bytes() == before
    with pytest.raises(RuntimeError), open_clickhouse(p, "ab", key=KEY) as f:
        f.write(b" world")
        raise RuntimeError("stop")
    assert p.read_bytes() == before
    finder = ch_key_finder({3: other, 4: KEY})
    with open_clickhouse(p, "ab", key_for=finder) as f:  # ClickHouse: the file's own key
        f.write(b"!")
    with open_clickhouse(p, key=KEY) as f:
        assert f.read() == b"hello!"


# --- keys: wrong key, lookup by fingerprint and by id -----------------------------------------


def test_wrong_key_is_detected_by_fingerprint(tmp_path):
    p = tmp_path / "f.bin"
    with open_clickhouse(p, "wb", key=KEY) as f:
        f.write(b"secret data")
    wrong = bytes(16)
    with pytest.raises(WrongKeyError) as info:
        open_clickhouse(p, key=wrong)
    assert str(p) in str(info.value) and wrong.hex() not in str(info.value)
    with open_clickhouse(tmp_path / "g", "wb", key=bytes(32)) as f:
        f.write(b"x")
    with pytest.raises(WrongKeyError, match="32-byte key"):
        open_clickhouse(tmp_path / "g", key=KEY)


def test_key_not_found_names_file_and_fingerprint(tmp_path):
    p = tmp_path / "f.bin"
    with open_clickhouse(p, "wb", key=KEY) as f:
        f.write(b"secret data")
    other = os.urandom(32)
    with pytest.raises(KeyNotFoundError) as info:
        open_clickhouse(p, key_for=ch_key_finder({1: other}))
    msg = str(info.value)
    assert str(p) in msg and "75264928bd0f327f80f1af4b93f2cd69" in msg
    assert KEY.hex() not in msg and other.hex() not in msg
    assert info.value.path == str(p)
    with pytest.raises(TypeError):
        open_clickhouse(p)


def test_version1_file_found_by_key_id(tmp_path):
    key = os.urandom(24)
    iv = os.urandom(16)
    data = os.urandom(777)
    header = CHHeader(1, CHAlgorithm.AES_192_CTR, None, 9, iv, clickhouse_v1_key_hash(key))
    p = tmp_path / "v1.bin"
    p.write_bytes(header.to_bytes() + xor(data, ref_keystream(key, iv, 0, len(data))))
    with open_clickhouse(p, key_for=ch_key_finder({1: os.urandom(24), 9: key})) as f:
        assert f.header.key_id == 9 and f.read() == data
    with pytest.raises(KeyNotFoundError, match="key id 9"):
        open_clickhouse(p, key_for=ch_key_finder({8: key}))
    # Big-endian v1 (ClickHouse 21.x on some builds): same plaintext.
    be = b"ENC" + struct.pack(">HHQB", 1, 1, 9, clickhouse_v1_key_hash(key)) + iv
    p.write_bytes(be + bytes(32) + xor(data, ref_keystream(key, iv, 0, len(data))))
    with open_clickhouse(p, key_for=ch_key_finder({9: key})) as f:
        assert f.read() == data


def test_truncated_and_foreign_files(tmp_path):
    p = tmp_path / "t"
    p.write_bytes(b"ENC\x02\x00")
    with pytest.raises(MalformedHeaderError, match="truncated"):
        open_clickhouse(p, key=KEY)
    p.write_bytes(b"hello, plain text file")
    with pytest.raises(NotEncryptedError):
        open_clickhouse(p, key=KEY)


def test_concurrent_preads(tmp_path):
    data = os.urandom(300_000)
    p = tmp_path / "c.bin"
    with open_clickhouse(p, "wb", key=KEY) as f:
        f.write(data)
    errors = []
    with open_clickhouse(p, key=KEY) as f:

        def work(seed):
            rnd = random.Random(seed)
            for _ in range(200):
                off, n = rnd.randrange(len(data)), rnd.randrange(5000)
                if f.pread(off, n) != data[off : off + n]:
                    errors.append((off, n))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []


def test_reader_over_a_file_object_source():
    data = os.urandom(5000)
    raw = io.BytesIO()
    CHWriter(raw, KEY).write(data)

    class NoFileno(io.BytesIO):
        def fileno(self):
            raise io.UnsupportedOperation

    src = source_for(NoFileno(raw.getvalue()))
    r = CHReader(src, CHHeader.parse(raw.getvalue()), KEY)
    assert r.read_at(4000, 2000) == data[4000:]
    with pytest.raises(TypeError, match="pickled"):
        pickle.dumps(r)


# --- real ClickHouse (chdb), both directions ---------------------------------------------------

from cryptdisk.format._ch_siphash import siphash64  # noqa: E402
from tests.format.chdb_util import (  # noqa: E402
    CHDB_MISSING,
    Hasher,
    needs_chdb,
    run_session,
    storage_xml,
)

ROWS = 30_000
TABLES = {"t128": "p128", "t256": "p256", "tplain": "pplain"}
ANSWER = "SELECT count(), sum(a), sum(cityHash64(b)), sum(c) FROM {t}"


@pytest.fixture(scope="module")
def hasher():
    if CHDB_MISSING:
        pytest.skip(CHDB_MISSING)
    h = Hasher()
    yield h
    h.close()


@pytest.mark.chdb
@needs_chdb
@settings(max_examples=150, deadline=None)
@given(key=st.one_of(st.binary(max_size=100), keys))
def test_fingerprint_equals_clickhouse_siphash(hasher, key):
    fingerprint, hash64 = hasher(key)
    assert clickhouse_fingerprint(key) == fingerprint
    assert siphash64(key) == hash64
    assert clickhouse_v1_key_hash(key) == hash64 & 0x0F


def _key_xml(keys: dict[int, bytes]) -> str:
    return "".join(f'<key_hex id="{i}">{k.hex()}</key_hex>' for i, k in keys.items())


def _config(root, k128: dict[int, bytes], cur128: int, alg128: str,
            k256: dict[int, bytes], cur256: int, alg256: str) -> str:
    disks = (
        f"<raw><type>local</type><path>{root}/raw/</path></raw>"
        f"<plain><path>{root}/plain/</path></plain>"
        f"<enc128><type>encrypted</type><disk>raw</disk><path>e128/</path>{_key_xml(k128)}"
        f"<current_key_id>{cur128}</current_key_id><algorithm>{alg128}</algorithm></enc128>"
        f"<enc256><type>encrypted</type><disk>raw</disk><path>e256/</path>{_key_xml(k256)}"
        f"<current_key_id>{cur256}</current_key_id><algorithm>{alg256}</algorithm></enc256>"
    )
    policies = "".join(f"<{p}><volumes><main><disk>{d}</disk></main></volumes></{p}>"
                       for p, d in (("p128", "enc128"), ("p256", "enc256"), ("pplain", "plain")))
    path = os.path.join(root, "config.xml")
    with open(path, "w") as f:
        f.write(storage_xml(disks, policies))
    return path


def _files(top: str) -> dict[str, str]:
    """Files below a disk's ``store/`` keyed by their path inside the table directory."""
    out = {}
    for dirpath, _, names in os.walk(os.path.join(top, "store")):
        for name in names:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, top).split("/", 3)[3]] = full
    return out


def _make_tables(root: str) -> dict:
    """Three tables with the same rows: on AES_128_CTR, AES_256_CTR and plain disks."""
    keys = {"k128": {1: os.urandom(16), 2: os.urandom(16)}, "k256": {0: os.urandom(32)}}
    config = _config(root, keys["k128"], 2, "AES_128_CTR", keys["k256"], 0, "aes_256_ctr")
    queries = []
    for table, policy in TABLES.items():
        queries += [
            f"CREATE TABLE {table} (a Int64, b String, c Float64) ENGINE = MergeTree "
            f"ORDER BY a SETTINGS storage_policy = '{policy}'",
            f"INSERT INTO {table} SELECT number, hex(MD5(toString(number))), number / 7 "
            f"FROM numbers({ROWS})",
        ]
    queries += [ANSWER.format(t=t) for t in TABLES]
    answers = run_session(os.path.join(root, "db"), config, queries)[-len(TABLES):]
    assert answers[0] == answers[1] == answers[2]
    return {"root": root, "keys": keys, "answer": answers[0]}


@pytest.fixture(scope="module")
def ch_tables(tmp_path_factory):
    if CHDB_MISSING:
        pytest.skip(CHDB_MISSING)
    return _make_tables(str(tmp_path_factory.mktemp("chdb")))


@pytest.mark.chdb
@needs_chdb
def test_reader_decrypts_every_file_clickhouse_wrote(ch_tables):
    root = ch_tables["root"]
    plain = _files(f"{root}/raw/../plain")
    assert "format_version.txt" in plain and any(p.endswith("data.bin") for p in plain)
    for disk, keyset, alg in (("e128", "k128", CHAlgorithm.AES_128_CTR),
                              ("e256", "k256", CHAlgorithm.AES_256_CTR)):
        encrypted = _files(f"{root}/raw/{disk}")
        assert sorted(encrypted) == sorted(plain)
        finder = ch_key_finder(ch_tables["keys"][keyset])
        for rel, path in encrypted.items():
            with open(plain[rel], "rb") as f:
                expected = f.read()
            with open(path, "rb") as f:
                stored = f.read()
            with open_clickhouse(path, key_for=finder) as f:
                assert f.read() == expected, f"{disk}/{rel}"
                if expected:
                    assert f.header.algorithm is alg and f.header.version == 2
            if expected:
                assert len(stored) == 64 + len(expected)
                # CTR: a file of n bytes stores its bytes unchanged with probability
                # 2^(-8n) (1/256 for the 1-byte files): only 16 bytes or more must differ
                assert len(expected) < 16 or stored[64:] != expected, f"{disk}/{rel}"
            else:
                assert stored == b""
    current = ch_tables["keys"]["k128"][2]  # current_key_id = 2
    with open_clickhouse(_files(f"{root}/raw/e128")["format_version.txt"], key=current) as f:
        assert f.header.key_fingerprint == clickhouse_fingerprint(current)


@pytest.mark.chdb
@needs_chdb
def test_clickhouse_reads_files_written_here(tmp_path):
    root = str(tmp_path)
    ch_tables = _make_tables(root)
    old = ch_tables["keys"]
    new128, new256 = {7: os.urandom(32)}, {5: os.urandom(24)}
    for disk, finder, new_key in (("e128", ch_key_finder(old["k128"]), new128[7]),
                                  ("e256", ch_key_finder(old["k256"]), new256[5])):
        for path in _files(f"{root}/raw/{disk}").values():
            with open_clickhouse(path, key_for=finder) as f:
                data = f.read()
                old_iv = f.header.iv if f.header else None
            with open_clickhouse(path, "wb", key=new_key) as f:
                f.write(data)
            with open(path, "rb") as f:
                head = f.read(64)
            if data:
                assert CHHeader.parse(head).iv != old_iv
                assert CHHeader.parse(head).key_fingerprint == clickhouse_fingerprint(new_key)
    # Only the new keys are configured: ClickHouse can read the tables only through our files.
    config = _config(root, new128, 7, "aes_256_ctr", new256, 5, "aes_192_ctr")
    queries = [ANSWER.format(t="t128"), ANSWER.format(t="t256"),
               f"INSERT INTO t128 SELECT number + {ROWS}, 'x', 1 FROM numbers(1000)",
               "OPTIMIZE TABLE t128 FINAL", ANSWER.format(t="t128")]
    answers = run_session(os.path.join(root, "db"), config, queries)
    assert answers[0] == answers[1] == ch_tables["answer"]
    assert int(answers[4][0]["count()"]) == ROWS + 1000
    # ClickHouse's merge wrote a new part under the new current key; we read it back.
    merged = [p for rel, p in _files(f"{root}/raw/e128").items()
              if rel.endswith("count.txt") and "all_1_" in rel and "_1_0" not in rel.split("/")[0]]
    assert merged
    with open_clickhouse(merged[0], key_for=ch_key_finder(new128)) as f:
        assert f.header.algorithm is CHAlgorithm.AES_256_CTR
        assert f.read() == str(ROWS + 1000).encode()


def test_bad_keys_fail_clearly(tmp_path):
    from cryptdisk.errors import InvalidKeyError

    with pytest.raises(InvalidKeyError, match="aes_256_ctr needs a 32-byte key"):
        open_clickhouse(tmp_path / "x", "wb", key=KEY, algorithm="AES_256_CTR")
    with pytest.raises(InvalidKeyError, match="16, 24 or 32"):
        open_clickhouse(tmp_path / "x", "wb", key=bytes(20))
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind
    with open_clickhouse(tmp_path / "y", "wb", key=KEY) as f:
        f.write(b"data")
    with pytest.raises(TypeError, match="bytes"):
        open_clickhouse(tmp_path / "y", key=KEY.hex())


_KILLED_WRITER = r"""
import sys, time
from cryptdisk.format.clickhouse import open_clickhouse
f = open_clickhouse(sys.argv[1], "wb", key=bytes.fromhex(sys.argv[2]))
f.write(b"new" * 100_000)
print("written", flush=True)
time.sleep(60)
"""


def test_sigkill_while_writing_leaves_the_old_file(tmp_path):
    import signal
    import subprocess
    import sys

    p = tmp_path / "part.bin"
    with open_clickhouse(p, "wb", key=KEY) as f:
        f.write(b"old contents")
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(p), KEY.hex()],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "written"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
    with open_clickhouse(p, key=KEY) as f:
        assert f.read() == b"old contents"
    stray = [x.name for x in tmp_path.iterdir() if x.name != "part.bin"]
    assert len(stray) == 1 and stray[0].startswith(".part.bin.") and stray[0].endswith(".cdtmp")

"""A part's lookup block: a query on the key opens a part without parsing its footer."""

import hashlib
import json
import pathlib
import struct

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _lookup, _partread, _parts
from cryptdisk.db._granule import granule_schema
from cryptdisk.db._partread import _chunk_start_end
from cryptdisk.db._storage import local_path
from cryptdisk.errors import AuthenticationError, CatalogError, FormatError
from cryptdisk.format import HEADER_SIZE

from .dbhelpers import SCHEMA, gen


def _load(db, policy="default"):
    db.sql(f"CREATE TABLE t (c_int BIGINT, c_str VARCHAR, lo VARCHAR, c_float DOUBLE) "
           f"ORDER BY c_int SETTINGS storage_policy = '{policy}'")
    db.sql("INSERT INTO t SELECT i, CASE WHEN i % 7 = 0 THEN NULL ELSE md5(i::VARCHAR) END, "
           "'x' || (i % 5)::VARCHAR, i / 7 FROM range(4321) r(i)")
    db.sql("INSERT INTO t SELECT NULL, 'n', 'x', 0.5 FROM range(50)")  # a key with NULLs


def _block(raw: bytes) -> tuple[int, bytes]:
    """``(offset, bytes)`` of the lookup block in a part's plaintext ``raw``."""
    footer = int.from_bytes(raw[-8:-4], "little") + 8
    at = len(raw) - footer - _lookup.TRAILER
    assert raw[at + 4 : at + _lookup.TRAILER] == _lookup.MAGIC
    n = int.from_bytes(raw[at : at + 4], "little")
    return at - n, raw[at - n : at]


@pytest.mark.parametrize("plain", [False, True])
def test_the_lookup_block_says_what_the_footer_says(db, monkeypatch, plain):
    """Every part (a key with NULLs, a dictionary column, LZ4 and uncompressed chunks, a
    last row group shorter than the others) is written with a lookup block, and every
    number a granule read takes from it equals the footer's."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    _load(db, "plain" if plain else "default")
    parts = db.table("t").parts
    assert len(parts) == 2
    for part in parts:
        op = _partread.open_part(db.config.disks[part.disk], part)
        try:
            lookup = op._lookup
            assert lookup is not None and op._meta is None
            meta = op.meta  # parsed now
            assert lookup.rows == meta.num_rows == part.rows
            assert lookup.created_by == meta.created_by
            assert op.kv == {k: v for k, v in meta.metadata.items()
                             if k.startswith(b"cryptdisk.")}
            assert op.num_row_groups == meta.num_row_groups
            for rg in range(meta.num_row_groups):
                assert op.rows(rg) == meta.row_group(rg).num_rows
                for j in range(meta.num_columns):
                    col = meta.row_group(rg).column(j)
                    assert lookup.chunk(rg, j) == (*_chunk_start_end(col), col.num_values)
                    codec, encodings = lookup.codec(rg, j)
                    assert (codec, sorted(encodings)) == (str(col.compression),
                                                          sorted(col.encodings))
            for j in range(meta.num_columns):
                assert op.described(j) == granule_schema(meta, j)
        finally:
            op.close()


@pytest.mark.parametrize("plain", [False, True])
def test_key_queries_parse_no_footer(tmp_path, monkeypatch, plain):
    """A cold point, range and ORDER BY key LIMIT query open the part by its lookup
    block: pyarrow never parses the footer. A filter on another column reads its row
    groups' statistics, so the footer is parsed for it."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    path = tmp_path / "db"
    policy = "plain" if plain else "default"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int "
               f"SETTINGS storage_policy = '{policy}'")
        db.sql("INSERT INTO t " + gen(5000))
    parsed = []
    read_metadata = pq.read_metadata
    monkeypatch.setattr(pq, "read_metadata", lambda *a, **k: (
        parsed.append(1), read_metadata(*a, **k))[1])
    for sql, want in [
            ("SELECT c_int, c_str, c_float FROM t WHERE c_int = 4321",
             [(4321, hashlib.md5(b"4321").hexdigest(), 4321 / 7)]),
            ("SELECT count(*), sum(c_int), max(c_str) FROM t WHERE c_int BETWEEN 1000 AND 1009",
             [(10, sum(range(1000, 1010)),
               max(hashlib.md5(str(i).encode()).hexdigest() for i in range(1000, 1010)))]),
            ("SELECT c_int, c_str FROM t ORDER BY c_int LIMIT 2",
             [(i, hashlib.md5(str(i).encode()).hexdigest()) for i in (0, 1)])]:
        with cryptdisk.connect(path, read_only=True) as db:
            assert db.query(sql) == want
            assert db.last_scans["t"]["granule_reads"] == 1
        assert parsed == [], sql
    with cryptdisk.connect(path, read_only=True) as db:
        assert db.query("SELECT c_int FROM t WHERE c_str = md5('17')") == [(17,)]
    assert parsed == [1]


@pytest.mark.parametrize("plain", [False, True])
def test_full_scans_of_stored_values_parse_no_footer(tmp_path, monkeypatch, plain):
    """A cold full scan of columns stored as their values (a BIGINT, a DOUBLE, a VARCHAR
    of one width) takes each column's Arrow field from the lookup block: pyarrow never
    parses the footer, and the answers are DuckDB's over the same rows."""
    import duckdb

    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    path = tmp_path / "db"
    policy = "plain" if plain else "default"
    rows = ("SELECT (hash(i) >> 1)::BIGINT, md5(i::VARCHAR), hash(i + 1) / 7 "
            "FROM range(20000) r(i)")  # (values that do not compress: stored as they are)
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int "
               f"SETTINGS storage_policy = '{policy}'")
        db.sql("INSERT INTO t " + rows)
    parsed = []
    read_metadata = pq.read_metadata
    monkeypatch.setattr(pq, "read_metadata", lambda *a, **k: (
        parsed.append(1), read_metadata(*a, **k))[1])
    direct = []
    real = _partread.OpenPart._read_direct
    monkeypatch.setattr(_partread.OpenPart, "_read_direct", lambda self, *a: (
        lambda got: (direct.append(got is not None), got)[1])(real(self, *a)))
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t {SCHEMA}")
    con.execute(f"INSERT INTO t {rows}")
    for sql in ["SELECT sum(c_int) FROM t", "SELECT avg(c_float) FROM t",
                "SELECT max(c_str), count(c_str) FROM t",
                "SELECT sum(c_int), min(c_float), min(c_str) FROM t"]:
        direct.clear()
        with cryptdisk.connect(path, read_only=True) as db:
            want = [tuple(pytest.approx(v, rel=1e-12) if isinstance(v, float) else v
                          for v in r) for r in con.execute(sql).fetchall()]  # (sums in
            assert db.query(sql) == want, sql                                 # any order)
            assert db.last_scans["t"]["row_groups_read"] == 20
        assert direct and all(direct), sql  # (read without pyarrow's reader)
        assert parsed == [], sql


def test_parts_without_a_lookup_block_read_as_before(db, monkeypatch):
    """A part written before lookup blocks existed is opened by its footer; queries over
    old and new parts answer alike."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    monkeypatch.setattr(_parts, "WRITE_LOOKUP", False)
    db.sql("INSERT INTO t " + gen(3000))
    monkeypatch.setattr(_parts, "WRITE_LOOKUP", True)
    db.sql("INSERT INTO t " + gen(3000, 3000))
    old, new = db.table("t").parts
    found = []
    for part in (old, new):
        op = _partread.open_part(db.config.disks[part.disk], part)
        found.append(op._lookup is not None)
        op.close()
    assert found == [False, True]
    db._open_parts.clear()
    for k in (1234, 4321):
        assert db.query(f"SELECT c_int, c_str, c_float FROM t WHERE c_int = {k}") == [
            (k, hashlib.md5(str(k).encode()).hexdigest(), k / 7)]
    assert db.query("SELECT count(*), sum(c_float) FROM t WHERE c_int BETWEEN 2990 AND 3009"
                    ) == [(20, pytest.approx(sum(i / 7 for i in range(2990, 3010))))]


def test_a_tampered_lookup_block_fails_authentication(tmp_path):
    """On an encrypted disk the block is authenticated with the part: a changed byte in
    it fails the query's open of the part, never other rows."""
    path = tmp_path / "db"
    sql = "SELECT c_int, c_str FROM t WHERE c_int = 4321"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO t " + gen(5000))
        part = db.table("t").parts[0]
        with db.config.disks[part.disk].open_read(part.path) as f:
            seg = f.info["segment_size"]
            at, block = _block(bytes(f.pread(0, part.bytes)))
    offset = at + len(block) // 2
    index = offset // seg
    full = path / "data" / part.path
    data = bytearray(full.read_bytes())
    data[HEADER_SIZE + index * (seg + 16) + offset % seg] ^= 1
    full.write_bytes(bytes(data))
    with cryptdisk.connect(path, read_only=True) as db, \
            pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query(sql)


def _rewrite_block(path, part, disk, change):
    """Replace the lookup block of a plain part by ``change(block)`` (same length)."""
    full = pathlib.Path(local_path(disk, part.path))
    raw = bytearray(full.read_bytes())
    at, block = _block(bytes(raw))
    new = change(block)
    assert len(new) == len(block) and new != block
    raw[at : at + len(block)] = new
    full.write_bytes(bytes(raw))


def test_a_lookup_block_that_does_not_fit_is_not_used(tmp_path):
    """On a plain disk (no authentication but the catalog's SHA-256 on full reads), a
    block whose numbers do not add up is not used: the part opens by its footer and
    answers as before."""
    path = tmp_path / "db"
    sql = "SELECT c_int, c_str FROM t WHERE c_int = 1234"
    want = [(1234, hashlib.md5(b"1234").hexdigest())]
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int SETTINGS storage_policy = 'plain'")
        db.sql("INSERT INTO t " + gen(3000))
        part = db.table("t").parts[0]
        disk = db.config.disks[part.disk]
    # the rows the JSON names no longer add up (one digit changed, same length)
    _rewrite_block(path, part, disk, lambda b: b.replace(
        f'"rows": {part.rows}'.encode(), f'"rows": {part.rows + 1000}'.encode()))
    with cryptdisk.connect(path, read_only=True) as db:
        op = _partread.open_part(disk, part)
        assert op._lookup is None and op._meta is not None
        op.close()
        assert db.query(sql) == want


def test_a_lookup_block_of_another_part_is_a_catalog_error(db):
    """The block's part id and rows are checked against the catalog as the footer's are."""
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(100))
    part = db.table("t").parts[0]
    disk = db.config.disks[part.disk]
    op = _partread.open_part(disk, part)
    try:
        other = _lookup.Lookup("0" * 32, part.rows, "", [part.rows], [], op._lookup.chunks,
                               {}, op._lookup.at)
        with pytest.raises(CatalogError, match="not the part the catalog recorded"):
            _partread._check_identity(disk, part, None, part.bytes, other.kv, other)
        fewer = _lookup.Lookup(part.id, part.rows - 1, "", [part.rows - 1], [],
                               op._lookup.chunks, op.kv, op._lookup.at)
        with pytest.raises(CatalogError, match="not the part the catalog recorded"):
            _partread._check_identity(disk, part, None, part.bytes, fewer.kv, fewer)
    finally:
        op.close()


def _sample_block() -> tuple[bytes, int]:
    groups, leaves = [3, 2], [["a", "a", "INT64", "None", 0, 0]]
    chunks = [4, 10, 3, 1, 14, 10, 2, 1]  # PLAIN, uncompressed
    entries = [(b"part", json.dumps({"part_id": "p", "rows": 5, "created_by": "x",
                                     "leaves": leaves}).encode()),
               (b"groups", struct.pack("<2q", *groups)),
               (b"chunks", struct.pack("<8q", *chunks)), (b"cryptdisk.part_id", b"p")]
    out = struct.pack("<I", len(entries))
    for name, data in entries:
        out += struct.pack("<H", len(name)) + name + struct.pack("<I", len(data)) + data
    return out, 24


def test_the_parser_takes_a_well_formed_block_and_refuses_others():
    block, at = _sample_block()
    found = _lookup.parse(block, at)
    assert found is not None and found.groups == [3, 2] and found.rows == 5
    assert found.chunk(1, 0) == (14, 24, 2)
    assert found.codec(0, 0) == ("UNCOMPRESSED", ["PLAIN"])
    assert _lookup.parse(block[:-1], at) is None  # truncated
    assert _lookup.parse(block + b"\0", at) is None  # trailing bytes
    assert _lookup.parse(block.replace(b'"rows": 5', b'"rows": 6'), at) is None
    assert _lookup.parse(block.replace(b"cryptdisk.part_id\x01\0\0\0p",
                                       b"cryptdisk.part_id\x01\0\0\0q"), at) is None
    # a chunk running into the block itself is refused when used
    with pytest.raises(FormatError):
        _lookup.parse(block, 20).chunk(1, 0)  # type: ignore[union-attr]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_lookup_parser_fuzz_mutated_blocks_give_a_block_or_none(data):
    """Any change to a block's bytes parses to a block or to None, never an exception."""
    block, at = _sample_block()
    raw = bytearray(block)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    found = _lookup.parse(bytes(raw[:cut]), at)
    assert found is None or isinstance(found, _lookup.Lookup)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_lookup_parser_fuzz_random_bytes(blob):
    found = _lookup.parse(blob, 1 << 20)
    assert found is None or isinstance(found, _lookup.Lookup)

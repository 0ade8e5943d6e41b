"""Granule reads: a few pages of a column chunk decoded through a footer of our own."""

import array
import hashlib
import io
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _granule, _partread, _parts
from cryptdisk.db._partread import _chunk_start_end
from cryptdisk.errors import AuthenticationError
from cryptdisk.format import HEADER_SIZE

from .dbhelpers import SCHEMA, gen

N = 2000


def _table() -> pa.Table:
    rng = np.random.default_rng(7)
    ints = np.arange(N, dtype=np.int64)
    return pa.table({
        "k": pa.array(ints),
        "s": pa.array([f"{i:032x}" if i % 7 else None for i in range(N)]),
        "lo": pa.array([f"x{i % 5}" for i in range(N)]),  # a dictionary column
        "f": pa.array(rng.random(N)),
        "f32": pa.array(rng.random(N).astype(np.float32)),
        "i": pa.array(ints.astype(np.int32), mask=ints % 11 == 0),
        "d": pa.array(ints.astype(np.int32)).cast(pa.date32()),
        "b": pa.array([i % 3 == 0 for i in range(N)]),
    })


def _written(table, **options):
    """``table`` written as a Parquet file in memory with ``options``: its metadata and a
    ``read(offset, n)`` of its bytes."""
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)
    raw = memoryview(sink.getvalue())
    return pq.read_metadata(pa.BufferReader(raw)), lambda offset, n: raw[offset : offset + n]


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd", "snappy"])
def test_decoded_pages_equal_the_rows_of_the_whole_chunk(compression):
    table = _table()
    meta, read = _written(table, compression=compression, use_dictionary=["lo"],
                          max_rows_per_page=150, row_group_size=N)
    for j, name in enumerate(table.column_names):
        col = meta.row_group(0).column(j)
        spans = _granule.page_spans(read, *_chunk_start_end(col), col.num_values)
        data = [p for p in spans if not p.dictionary]
        assert len(data) == -(-N // 150)
        assert [p.first_row for p in data] == list(range(0, N, 150))
        assert [p.dictionary for p in spans].count(True) == (name == "lo")
        pages = [p for p in spans if p.dictionary] + data[4:7]
        got = _granule.decode_pages(meta, 0, j, pages, read)
        assert got is not None, name
        assert got.equals(table.column(name).slice(600, 450).combine_chunks()), name


def test_rows_of_one_page_decode_from_the_bytes_that_hold_them():
    """decode_page_rows: rows a..b of an uncompressed PLAIN page equal the table's, NULLs
    included, reading the page's header and those rows' bytes (of strings, every length
    up to row b); strings of several lengths and compressed pages are left to the whole
    page's decoding (None)."""
    n = 1000
    md5 = [hashlib.md5(str(i).encode()).hexdigest() for i in range(n)]
    table = pa.table({
        "i": pa.array(range(n), pa.int64()),
        "f": pa.array([None if i % 7 == 3 else i / 7 for i in range(n)], pa.float64()),
        "s": pa.array([None if i % 5 == 1 else md5[i] for i in range(n)], pa.string()),
        "e": pa.array([f"é{i % 1000:03d}" for i in range(n)], pa.string()),  # not ASCII
        "b": pa.array([md5[i][:4].encode() for i in range(n)], pa.binary()),
        "v": pa.array([md5[i][: i % 9] for i in range(n)], pa.string()),
        "n": pa.array([None] * n, pa.int32()),
    })
    for compression in ("none", "lz4"):
        meta, read = _written(table, compression=compression, use_dictionary=False,
                              max_rows_per_page=150, row_group_size=n)
        for j, name in enumerate(table.column_names):
            col = meta.row_group(0).column(j)
            spans = _granule.page_spans(read, *_chunk_start_end(col), col.num_values)
            described = _granule.granule_schema(meta, j)
            assert (described is None) == (name == "b"), name  # (not a type described)
            if described is None:
                continue
            typ, physical, _c, _l, optional = described
            for page in (spans[0], spans[2], spans[-1]):
                for a, b in ((0, 1), (0, 10), (5, 150), (140, 150), (0, page.rows)):
                    if b > page.rows:
                        continue
                    asked = []
                    got = _granule.decode_page_rows(
                        str(col.compression), page,
                        lambda at, k: asked.append(k) or read(at, k), typ, physical,
                        optional, a, b)
                    if compression != "none" or name == "v":
                        assert got is None, (compression, name)
                        continue
                    want = table.column(name).slice(page.first_row + a, b - a)
                    assert got is not None and got.equals(want.combine_chunks()), (name, a, b)
                    if (a, b) == (0, 10) and page.rows == 150 and name != "n":  # not all of it
                        assert 0 < sum(asked) < (page.end - page.start) // 3, (name, asked)


def test_columns_the_footer_cannot_describe_are_read_whole():
    table = pa.table({"u": pa.array([1, 2], pa.uint16()), "l": pa.array([[1], [2]]),
                      "t": pa.array([1, 2], pa.timestamp("ms"))})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    meta = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    assert all(_granule.granule_schema(meta, j) is None for j in range(meta.num_columns))


def test_page_headers_that_do_not_add_up_are_refused():
    table = pa.table({"k": pa.array(np.arange(1000, dtype=np.int64))})
    sink = io.BytesIO()
    pq.write_table(table, sink, max_rows_per_page=100, compression="none")
    raw = sink.getvalue()
    meta = pq.read_metadata(pa.BufferReader(raw))
    col = meta.row_group(0).column(0)
    start, end = _chunk_start_end(col)

    def read(offset, n):
        return raw[offset : offset + n]

    with pytest.raises(_granule.PageError, match="1000"):
        _granule.page_spans(read, start, end, 999)
    with pytest.raises(_granule.PageError):
        _granule.page_spans(read, start, end - 1, 1000)  # the last page runs past the chunk
    with pytest.raises(_granule.PageError):
        _granule.page_spans(lambda o, n: b"\x15", start, end, 1000)  # a truncated header


def test_a_walk_until_a_row_reads_no_header_after_its_page_and_walks_on_later():
    raw, start, end = _chunk_bytes()  # 10 pages of 100 rows
    reads = []

    def read(offset, n):
        reads.append(offset)
        return raw[offset : offset + n]

    full = _granule.page_spans(lambda o, n: raw[o : o + n], start, end, 1000)
    part = _granule.page_spans(read, start, end, 1000, until=350)
    assert [p.first_row for p in part if not p.dictionary] == [0, 100, 200, 300]
    assert max(reads) < part[-1].end  # the next page's header was not read
    assert not _granule.walked_all(part, end)
    again = _granule.page_spans(read, start, end, 1000, walked=part)
    assert [(p.start, p.end, p.first_row, p.rows) for p in again] == [
        (p.start, p.end, p.first_row, p.rows) for p in full]
    assert _granule.walked_all(again, end)
    with pytest.raises(_granule.PageError, match="1000"):  # the totals still checked
        _granule.page_spans(read, start, end, 999, walked=part)


def _chunk_bytes():
    table = pa.table({"k": pa.array(np.arange(1000, dtype=np.int64))})
    sink = io.BytesIO()
    pq.write_table(table, sink, max_rows_per_page=100, compression="none")
    raw = sink.getvalue()
    col = pq.read_metadata(pa.BufferReader(raw)).row_group(0).column(0)
    return raw, *_chunk_start_end(col)


_RAW, _START, _END = _chunk_bytes()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_page_header_parser_fuzz_mutated_chunks_fail_with_page_error_only(data):
    """The page header parser reads bytes of a plain part that nothing authenticated:
    any mutation of a real chunk gives its pages or a PageError, in bounded time."""
    raw = bytearray(_RAW)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(_START, _END - 1))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.sampled_from([len(raw), _END - 1, _START + 5]))
    buf = bytes(raw[:cut])
    try:
        spans = _granule.page_spans(lambda o, n: buf[o : o + n], _START, _END, 1000)
    except _granule.PageError:
        return
    assert sum(s.rows for s in spans) == 1000
    assert all(_START <= s.start < s.end <= _END for s in spans)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_page_header_parser_fuzz_random_bytes(blob):
    try:
        _granule.page_spans(lambda o, n: blob[o : o + n], 0, len(blob) + 1, 10)
    except _granule.PageError:
        pass


def test_a_long_list_of_doubles_past_the_header_is_refused_not_looped():
    # a header field: list (type 9) of 2**40 doubles (element type 7), then nothing
    head = bytes([0x19, 0xF7]) + bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x20])
    with pytest.raises(_granule.PageError, match="truncated"):
        _granule.page_spans(lambda o, n: head[o : o + n], 0, len(head), 1)


def _point_table(db, monkeypatch):
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(5000))
    return db.table("t").parts[0]


def _layout(disk, part):
    """The part's footer, its segment size and the page spans of c_str's first chunk."""
    with disk.open_read(part.path) as f:
        meta = pq.read_metadata(f)
        seg = f.info["segment_size"]
        col = meta.row_group(0).column(1)  # c_str
        spans = _granule.page_spans(lambda o, n: f.pread(o, n), *_chunk_start_end(col),
                                    col.num_values)
    return meta, seg, spans


def _flip(path, part, seg, offset):
    """Flip a bit of the part's ciphertext where plaintext byte ``offset`` is (in the
    database at ``path``); the index of the segment that no longer authenticates."""
    index = offset // seg
    full = path / "data" / part.path
    data = bytearray(full.read_bytes())
    data[HEADER_SIZE + index * (seg + 16) + offset % seg] ^= 1
    full.write_bytes(bytes(data))
    return index


def test_a_tampered_page_header_fails_the_granule_read(tmp_path, monkeypatch):
    """A granule read decrypts the segment holding the header of the page it wants: a
    changed byte there fails authentication, it never yields other rows."""
    path = tmp_path / "db"
    sql = "SELECT c_int, c_str FROM t WHERE c_int = 4321"
    with cryptdisk.connect(path) as db:
        part = _point_table(db, monkeypatch)
        disk = db.config.disks[part.disk]
        assert db.query(sql) == [(4321, hashlib.md5(b"4321").hexdigest())]
        assert db.last_scans["t"]["granule_reads"] == 1
        meta, seg, spans = _layout(disk, part)
    page = next(p for p in spans if p.first_row <= 4321 < p.first_row + p.rows)
    key_end = _chunk_start_end(meta.row_group(0).column(0))[1]
    index = _flip(path, part, seg, page.start)
    assert index > key_end // seg  # not a segment the key's read decrypts
    with cryptdisk.connect(path, read_only=True) as db, \
            pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query(sql)


def test_a_granule_read_decrypts_no_header_after_its_page(tmp_path, monkeypatch):
    """Page headers are walked only as far as the rows wanted: a changed byte in a later
    page's header is not read for earlier rows, and fails authentication once rows past
    it are read (by the same open part, which walks on)."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        part = _point_table(db, monkeypatch)
        disk = db.config.disks[part.disk]
        _meta, seg, spans = _layout(disk, part)
    early = next(p for p in spans if p.first_row <= 150 < p.first_row + p.rows)
    late = next(p for p in spans if p.first_row <= 4321 < p.first_row + p.rows)
    index = _flip(path, part, seg, late.start)
    assert index > early.end // seg + 1  # a segment the early rows' read never touches
    op = _partread.open_part(disk, part)
    try:
        got = op.read_rows(0, "c_str", 150, 152)
        assert got is not None
        assert got.to_pylist() == [hashlib.md5(str(i).encode()).hexdigest()
                                   for i in (150, 151)]
        with pytest.raises(AuthenticationError, match=f"segment {index}"):
            op.read_rows(0, "c_str", 4321, 4322)
    finally:
        op.close()


def test_a_tampered_column_read_beside_the_key_fails_the_query(tmp_path, monkeypatch):
    """The narrow columns a point query reads whole on another scan thread, while the
    key's column is read, authenticate as any read: a changed byte in one is a clear
    error, never other rows."""
    path = tmp_path / "db"
    sql = "SELECT c_int, c_str, c_float FROM t WHERE c_int = 4321"
    with cryptdisk.connect(path) as db:
        part = _point_table(db, monkeypatch)
        disk = db.config.disks[part.disk]
        assert db.query(sql) == [(4321, hashlib.md5(b"4321").hexdigest(), 4321 / 7)]
        meta, seg, _spans = _layout(disk, part)
        start, end = _chunk_start_end(meta.row_group(0).column(2))  # c_float
        key_end = _chunk_start_end(meta.row_group(0).column(0))[1]
    index = _flip(path, part, seg, (start + end) // 2)
    assert index > key_end // seg  # not a segment the key's read decrypts
    with cryptdisk.connect(path, read_only=True) as db, \
            pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query(sql)


def test_a_wide_key_range_reads_each_column_once(db, monkeypatch):
    """Key filters that keep more than half a row group read it whole: the columns read
    beside the key are used, not decoded again."""
    _point_table(db, monkeypatch)
    reads = []
    read = _partread.OpenPart.read
    monkeypatch.setattr(_partread.OpenPart, "read", lambda self, rgs, cols, *j: (
        reads.append(list(cols)) or read(self, rgs, cols, *j)))
    got = db.query("SELECT count(*), sum(c_float), count(c_str) FROM t "
                   "WHERE c_int BETWEEN 100 AND 4900")
    assert got[0][0] == got[0][2] == 4801
    assert got[0][1] == pytest.approx(sum(i / 7 for i in range(100, 4901)))
    assert sorted(c for cols in reads for c in cols) == ["c_float", "c_int", "c_str"]
    assert db.last_scans["t"]["granule_reads"] == 0


def test_pages_the_reader_does_not_understand_are_read_whole(db, monkeypatch):
    monkeypatch.setattr(_parts, "WRITE_PAGE_INDEX", False)  # a part of an earlier version
    _point_table(db, monkeypatch)

    def refuse(*args, **kwargs):
        raise _granule.PageError("not a page")

    monkeypatch.setattr(_partread, "page_spans", refuse)
    assert db.query("SELECT c_int, c_str, c_float FROM t WHERE c_int = 4321") == [
        (4321, hashlib.md5(b"4321").hexdigest(), 4321 / 7)]
    assert db.last_scans["t"]["granule_reads"] == 0
    assert db.last_scans["t"]["row_groups_read"] == 1


def test_narrow_columns_are_read_whole_and_sliced(db, monkeypatch):
    """In a part without a page index (an earlier version's), columns of 8-byte values
    decode whole (cheaper than finding their pages), on another scan thread while the
    key's column is read; the rows handed on are still only those the key's filters
    keep."""
    monkeypatch.setattr(_parts, "WRITE_PAGE_INDEX", False)
    _point_table(db, monkeypatch)
    rows_rows, wholes = [], []
    read_rows, read = _partread.OpenPart.read_rows, _partread.OpenPart.read
    monkeypatch.setattr(_partread.OpenPart, "read_rows", lambda self, rg, c, a, b: (
        rows_rows.append((c, read_rows(self, rg, c, a, b) is not None)) or read_rows(
            self, rg, c, a, b)))
    monkeypatch.setattr(_partread.OpenPart, "read", lambda self, rgs, cols, *j: (
        wholes.append(list(cols)) or read(self, rgs, cols, *j)))
    assert db.query("SELECT c_float, c_str FROM t WHERE c_int BETWEEN 10 AND 12") == [
        (i / 7, hashlib.md5(str(i).encode()).hexdigest()) for i in (10, 11, 12)]
    assert rows_rows == [("c_str", True)]
    assert sorted(wholes) == [["c_float"], ["c_int"]]
    assert db.last_scans["t"]["granule_reads"] == 1


@pytest.mark.parametrize("plain", [False, True])
def test_point_and_range_queries_through_granules(db, monkeypatch, plain):
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    policy = "plain" if plain else "default"
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int SETTINGS storage_policy = '{policy}'")
    db.sql("INSERT INTO t " + gen(5000))
    db.sql("INSERT INTO t SELECT NULL, 'n', 0.5 FROM range(50)")  # NULL keys: never kept
    got = db.query("SELECT count(*), min(c_str), sum(c_float) FROM t "
                   "WHERE c_int BETWEEN 1250 AND 1480")
    want = db.con.sql("SELECT count(*), min(md5(i::VARCHAR)), sum(i / 7) "
                      "FROM range(1250, 1481) r(i)").fetchall()
    assert got[0][:2] == want[0][:2]
    assert got[0][2] == pytest.approx(want[0][2])
    # the part of NULL keys has no key range: its key is read, no row of the others
    assert db.last_scans["t"]["granule_reads"] == 2
    assert db.query("SELECT c_str FROM t WHERE c_int IN (7, 4999, 6000)") == [
        (hashlib.md5(b"7").hexdigest(),), (hashlib.md5(b"4999").hexdigest(),)]
    assert db.query("SELECT c_str FROM t WHERE c_int = -1") == []


def _record_reads(monkeypatch):
    """Lists that OpenPart.read (columns) and read_rows ((column, first, last)) append to."""
    reads, rows_reads = [], []
    read, read_rows = _partread.OpenPart.read, _partread.OpenPart.read_rows
    monkeypatch.setattr(_partread.OpenPart, "read",
                        lambda self, rgs, cols, *j: reads.append(cols) or read(self, rgs, cols, *j))
    monkeypatch.setattr(_partread.OpenPart, "read_rows", lambda self, rg, c, a, b: (
        rows_reads.append((c, a, b)) or read_rows(self, rg, c, a, b)))
    return reads, rows_reads


@pytest.mark.parametrize("index", [True, False])
def test_the_key_column_is_read_while_duckdb_parses(tmp_path, monkeypatch, index):
    """Opening a part ahead of a statement also reads the key's column of the row group
    holding an integer the statement names (with a page index, the pages of the granule
    holding it only; an earlier version's part, the whole chunk); the granule read uses
    it, and what the statement does not use is dropped when it ends (a part connect did
    not open: see test_connect_opens_a_few_parts_so_the_first_query_reads_at_once)."""
    from cryptdisk.db import _database

    path = tmp_path / "db"
    monkeypatch.setattr(_parts, "WRITE_PAGE_INDEX", index)
    monkeypatch.setattr(_database, "_CONNECT_OPENS", 0)
    with cryptdisk.connect(path) as db:
        _point_table(db, monkeypatch)
    reads, rows_reads = _record_reads(monkeypatch)
    from cryptdisk.db import _scan

    ahead = []
    read_ahead = _scan.OpenParts._read_keys_ahead

    def spy(self, op, key, numbers):
        read_ahead(self, op, key, numbers)
        ahead.append(sorted(op.key_reads))

    monkeypatch.setattr(_scan.OpenParts, "_read_keys_ahead", spy)
    with cryptdisk.connect(path, read_only=True) as db:
        assert db.query("SELECT c_int, c_str FROM t WHERE c_int = 4321") == [
            (4321, hashlib.md5(b"4321").hexdigest())]
        assert db.last_scans["t"]["granule_reads"] == 1
        assert ahead == [[0]]  # the row group of 4321, read ahead
        if index:  # once, the granule of 100 rows holding 4321: the granule read used it
            assert reads == [] and ("c_int", 4300, 4400) in rows_reads
            assert [r for r in rows_reads if r[0] == "c_int"] == [("c_int", 4300, 4400)]
        else:
            assert reads == [["c_int"]]  # once: the granule read used it
        (op,) = db._open_parts._items.values()
        assert op.key_reads == {} and db._open_parts._key_reads == []
    reads.clear()
    with cryptdisk.connect(path, read_only=True) as db:
        # 4321 names a row group, but the filter is not on the key: nothing uses it
        assert db.query("SELECT count(*) FROM t WHERE c_str = '4321'") == [(0,)]
        (op,) = db._open_parts._items.values()
        assert op.key_reads == {} and db._open_parts._key_reads == []
        assert db.query("SELECT c_str FROM t WHERE c_int = 4321") == [
            (hashlib.md5(b"4321").hexdigest(),)]


def test_the_row_estimate_for_walking_headers_while_the_key_decodes():
    """While the key's column decodes, page headers are walked as far as where the last
    value the filters keep would be among evenly spread keys (a guess: read_rows walks
    on from it, see the test above); without an upper bound, all of them."""
    from cryptdisk.db._pushdown import Filter
    from cryptdisk.db._scan import _row_estimate

    rows = 65536
    assert _row_estimate((0, 1000), rows, [Filter("k", 250, 250)]) == 16384
    assert _row_estimate((0, 1000), rows, [Filter("k", values=(100, 750))]) == 49152
    assert _row_estimate((0, 1000), rows, [Filter("k", 10, 900), Filter("k", hi=500)]) \
        == 32768
    assert _row_estimate((0, 1000), rows, [Filter("k", hi=5000)]) == rows - 1
    assert _row_estimate((0, 1000), rows, [Filter("k", hi=-5)]) == 0
    assert _row_estimate((0, 1000), rows, [Filter("k", lo=5)]) is None
    assert _row_estimate(None, rows, [Filter("k", 5, 5)]) is None
    assert _row_estimate((7, 7), rows, [Filter("k", 7, 7)]) is None
    assert _row_estimate((-2**63, 2**63 - 1), rows, [Filter("k", 0, 0)]) == 32768


# -- the page index written with a part ------------------------------------------------------

def _spans(spans):
    return [(p.start, p.end, p.first_row, p.rows, p.dictionary) for p in spans]


@pytest.mark.parametrize("plain", [False, True])
def test_the_page_index_equals_the_walked_page_headers(db, monkeypatch, plain):
    """Every chunk of every row group of parts written in several inserts (NULLs, a
    dictionary column, a last row group shorter than the others) has index entries,
    equal to the pages its headers describe."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    policy = "plain" if plain else "default"
    db.sql(f"CREATE TABLE t (c_int BIGINT, c_str VARCHAR, lo VARCHAR, c_float DOUBLE) "
           f"ORDER BY c_int SETTINGS storage_policy = '{policy}'")
    db.sql("INSERT INTO t SELECT i, CASE WHEN i % 7 = 0 THEN NULL ELSE md5(i::VARCHAR) END, "
           "'x' || (i % 5)::VARCHAR, i / 7 FROM range(4321) r(i)")
    db.sql("INSERT INTO t SELECT NULL, 'n', 'x', 0.5 FROM range(50)")
    parts = db.table("t").parts
    assert len(parts) == 2
    for part in parts:
        disk = db.config.disks[part.disk]
        op = _partread.open_part(disk, part)
        try:
            assert _parts.PAGES_KEY in op.meta.metadata
            read = op._page_reader()
            for rg in range(op.num_row_groups):
                for j in range(op.meta.num_columns):
                    col = op.meta.row_group(rg).column(j)
                    start, end = _chunk_start_end(col)
                    assert op.indexed(rg, j), (part.rows, rg, j)
                    walked = _granule.page_spans(read, start, end, col.num_values)
                    assert _spans(op._pages[(rg, j)]) == _spans(walked)
        finally:
            op.close()


def test_with_a_page_index_a_point_query_walks_no_header_and_reads_pages_only(db, monkeypatch):
    """A part written with its page index: the granule read finds every column's pages
    there, narrow ones too, and reads no page header and no whole chunk but the key's."""
    _point_table(db, monkeypatch)
    rows_rows, wholes = [], []
    read_rows, read = _partread.OpenPart.read_rows, _partread.OpenPart.read

    def refuse(*args, **kwargs):
        raise AssertionError("a page header walked")

    monkeypatch.setattr(_partread, "page_spans", refuse)
    monkeypatch.setattr(_partread.OpenPart, "read_rows", lambda self, rg, c, a, b: (
        rows_rows.append((c, read_rows(self, rg, c, a, b) is not None)) or read_rows(
            self, rg, c, a, b)))
    monkeypatch.setattr(_partread.OpenPart, "read", lambda self, rgs, cols, *j: (
        wholes.append(list(cols)) or read(self, rgs, cols, *j)))
    assert db.query("SELECT c_float, c_str FROM t WHERE c_int BETWEEN 10 AND 12") == [
        (i / 7, hashlib.md5(str(i).encode()).hexdigest()) for i in (10, 11, 12)]
    assert sorted(rows_rows) == [("c_float", True), ("c_int", True), ("c_str", True)]
    assert wholes == []  # the key too: the pages of its granule only
    assert db.last_scans["t"]["granule_reads"] == 1


def test_a_page_index_that_does_not_fit_its_chunk_is_not_used(db, monkeypatch):
    """Malformed entries (short, wrong counts, offsets off the chunk's pages) give no
    pages: the reader walks the headers instead."""
    part = _point_table(db, monkeypatch)
    op = _partread.open_part(db.config.disks[part.disk], part)
    try:
        raw = op.meta.metadata[_parts.PAGES_KEY]
        groups, leaves = op.num_row_groups, op.meta.num_columns
        col = op.meta.row_group(0).column(1)
        start, end = _chunk_start_end(col)
        good = _granule.PageIndex(raw, groups, leaves)
        assert good.spans(0, 1, start, end, col.num_values) is not None
        assert good.spans(0, 1, start, end, col.num_values + 1) is None  # rows differ
        assert good.spans(0, 1, start, start + 100, col.num_values) is None  # runs past
        for bad in (b"", raw[:-4], raw + b"\0\0\0\0", raw[:3], b"\xff" * len(raw)):
            assert _granule.PageIndex(bad, groups, leaves).spans(
                0, 1, start, end, col.num_values) is None
        assert _granule.PageIndex(raw, groups + 1, leaves).spans(
            0, 1, start, end, col.num_values) is None
        negative = bytearray(raw)  # the first chunk's count of pages below zero: no entry
        negative[8:12] = (-1).to_bytes(4, sys.byteorder, signed=True)
        assert _granule.PageIndex(bytes(negative), groups, leaves).spans(
            0, 1, start, end, col.num_values) is None
        shifted = bytearray(raw)  # the second page of the first chunk one byte later
        at = 4 * (2 + groups * leaves + 2)
        shifted[at] += 1
        assert _granule.PageIndex(bytes(shifted), groups, leaves).spans(
            0, 0, *_chunk_start_end(op.meta.row_group(0).column(0)),
            op.meta.row_group(0).column(0).num_values) is not None  # (only that entry
        # is checked against the footer: its page sizes are not in the footer)
    finally:
        op.close()
    # a part whose index entry is garbage reads by walking its page headers
    monkeypatch.setattr(_granule.PageIndex, "spans", lambda *a, **k: None)
    assert db.query("SELECT c_int, c_str, c_float FROM t WHERE c_int = 4321") == [
        (4321, hashlib.md5(b"4321").hexdigest(), 4321 / 7)]
    assert db.last_scans["t"]["granule_reads"] == 1


@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(1, 5000), max_size=30), seed=st.integers(0, 3))
def test_the_page_scanner_reads_the_same_pages_however_the_bytes_are_cut(cuts, seed):
    """pyarrow's writes may cut a page header anywhere: fed the file's bytes in any
    pieces, the scanner finds the pages a walk of the headers finds."""
    table = _table()
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, table.schema, compression=["none", "lz4"][seed % 2],
                          use_dictionary=["lo"], max_rows_per_page=150 + seed) as writer:
        writer.write_table(table, row_group_size=700)
    raw = sink.getvalue()
    meta = pq.read_metadata(pa.BufferReader(raw))
    end = len(raw) - 8 - meta.serialized_size
    scanner = _granule.PageScanner()
    pos = 0
    for c in cuts:
        scanner.feed(raw[pos : min(end, pos + c)])
        pos = min(end, pos + c)
    scanner.feed(raw[pos:end])
    groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    index = _granule.PageIndex(scanner.to_bytes(groups, meta.num_columns),
                               meta.num_row_groups, meta.num_columns)
    for rg in range(meta.num_row_groups):
        for j in range(meta.num_columns):
            col = meta.row_group(rg).column(j)
            start, stop = _chunk_start_end(col)
            walked = _granule.page_spans(lambda o, n: raw[o : o + n], start, stop,
                                         col.num_values)
            assert _spans(index.spans(rg, j, start, stop, col.num_values)) == _spans(walked)


def test_the_key_granule_bounds_are_each_granules_min_and_max(db, monkeypatch):
    """The footer's granule bounds of the key are the min and max of every run of
    GRANULE_ROWS rows of each row group (the last run of a row group shorter); a part
    with a NULL key has none (its granule reads decode the key's whole chunk)."""
    monkeypatch.setattr(_parts, "GRANULE_ROWS", 100)
    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t SELECT (i * 7919) % 2503 - 1000, 'x', 0.5 FROM range(2503) r(i)")
    db.sql("INSERT INTO t SELECT CASE WHEN i = 3 THEN NULL ELSE i END, 'x', 0.5 "
           "FROM range(500) r(i)")
    full, nulls = sorted(db.table("t").parts, key=lambda p: -p.rows)
    op = _partread.open_part(db.config.disks[full.disk], full)
    try:
        keys = db.arrow_table("t").column("c_int").to_numpy()[:full.rows]
        assert list(keys) == sorted(keys)
        rows = [op.rows(i) for i in range(op.num_row_groups)]
        assert rows == [1000, 1000, 503]
        g, groups, mins, maxs = _parts.key_granules(op.meta.metadata, "c_int", 3, 2503)
        assert g == 100 and groups == rows and len(mins) == 10 + 10 + 6
        # kept packed as the footer holds them: an open makes no Python int of a granule
        # it does not look at
        assert all(isinstance(b, array.array) and b.typecode == "q" for b in (mins, maxs))
        want, at = [], 0
        for r in rows:
            for a in range(0, r, 100):
                piece = keys[at + a : at + min(r, a + 100)]
                want.append((piece.min(), piece.max()))
            at += r
        assert list(zip(mins, maxs, strict=True)) == want
        assert _parts.key_granules(op.meta.metadata, "c_str", 3, 2503) is None
        assert _parts.key_granules(op.meta.metadata, "c_int", 2, 2503) is None
        assert _parts.key_granules(op.meta.metadata, "c_int", 3, 2504) is None
        raw = op.meta.metadata[_parts.KEY_GRANULES_KEY]
        for bad in (raw[:-8], raw + b"\0" * 8, raw[:9], b"c_int\0" + b"\xff" * 64):
            assert _parts.key_granules({_parts.KEY_GRANULES_KEY: bad}, "c_int", 3,
                                       2503) is None
        # the rows of the granules a filter may keep: from the first to the last
        assert op.granule_rows(1, "c_int", lambda lo, hi: lo <= mins[12] <= hi) == (200, 300)
        assert op.granule_rows(1, "c_int", lambda lo, hi: False) == (0, 0)
    finally:
        op.close()
    op = _partread.open_part(db.config.disks[nulls.disk], nulls)
    try:
        assert _parts.KEY_GRANULES_KEY not in op.meta.metadata
        assert op.granule_rows(0, "c_int", lambda lo, hi: True) is None
    finally:
        op.close()
    assert db.query("SELECT count(*) FROM t WHERE c_int = 250") == [(2,)]


def test_a_range_past_the_granule_read_ahead_reads_only_the_rest(tmp_path, monkeypatch):
    """``BETWEEN a AND b`` with ``b`` past the part: the key's granule holding ``a`` is read
    ahead, and the granule read decodes only the key's pages after it, up to the last
    granule the range may keep (a part connect did not open)."""
    from cryptdisk.db import _database

    monkeypatch.setattr(_database, "_CONNECT_OPENS", 0)
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        _point_table(db, monkeypatch)
    reads, rows_reads = _record_reads(monkeypatch)
    with cryptdisk.connect(path, read_only=True) as db:
        assert db.query("SELECT count(*), min(c_str), sum(c_float) FROM t "
                        "WHERE c_int BETWEEN 4321 AND 99999") == [
            (679, min(hashlib.md5(str(i).encode()).hexdigest() for i in range(4321, 5000)),
             pytest.approx(sum(i / 7 for i in range(4321, 5000))))]
        assert db.last_scans["t"]["granule_reads"] == 1
    assert reads == []
    assert [r for r in rows_reads if r[0] == "c_int"] == [("c_int", 4300, 4400),
                                                          ("c_int", 4400, 5000)]


def test_scan_threads_opening_a_part_at_once_decode_its_granules_once(db, monkeypatch):
    """Two threads asking an open part for its key granules at once each decoded the
    footer's entry (the check and the store were not one step)."""
    part = _point_table(db, monkeypatch)
    op = _partread.open_part(db.config.disks[part.disk], part)
    decoded, decode = [], _partread.key_granules

    def slow_decode(*args):
        decoded.append(threading.get_ident())
        time.sleep(0.3)  # the other thread arrives while this one decodes
        return decode(*args)

    monkeypatch.setattr(_partread, "key_granules", slow_decode)
    try:
        got: list = []
        threads = [threading.Thread(target=lambda: got.append(op.granules(0, "c_int")))
                   for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(decoded) == 1
        assert len(got) == 2 and got[0] == got[1] and got[0]
        assert got[0][0][:2] == (0, 100)  # granules of 100 rows (_point_table)
        assert op.granules(0, "c_int") == got[0] and len(decoded) == 1
    finally:
        op.close()


def test_granule_reads_drop_their_mapped_ciphertext_once(tmp_path, monkeypatch):
    """A cold point query's reads of an encrypted part (its lookup block, the pages of its
    granules) give the OS no hint per read (two system calls each, one a TLB flush), and
    each read's ciphertext is dropped from the process's mapping afterwards, by one hint
    per granule read."""
    from cryptdisk.format._io import PositionalReadFile

    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        _point_table(db, monkeypatch)
    reads, hints = [], []
    preadinto, advise = PositionalReadFile.preadinto, PositionalReadFile.advise

    def recording_read(self, buffer, offset, **options):
        got = preadinto(self, buffer, offset, **options)
        reads.append((offset, offset + len(buffer), options))
        return got

    def recording_advise(self, offset, n, need):
        hints.append((offset, offset + n, need))
        return advise(self, offset, n, need)

    monkeypatch.setattr(PositionalReadFile, "preadinto", recording_read)
    monkeypatch.setattr(PositionalReadFile, "advise", recording_advise)
    with cryptdisk.connect(path, read_only=True) as db:
        assert db.query("SELECT c_int, c_str, c_float FROM t WHERE c_int = 4321") == [
            (4321, hashlib.md5(b"4321").hexdigest(), 4321 / 7)]
        assert db.last_scans["t"]["granule_reads"] == 1
    assert reads and all(o == {"advise": False, "parallel": False} for _a, _b, o in reads)
    drops = [(a, b) for a, b, need in hints if not need]
    assert all(any(a <= lo and hi <= b for a, b in drops) for lo, hi, _o in reads)
    assert len(drops) <= 5  # the open and one per column read, not one per run read


# -- PLAIN pages decoded straight into Arrow arrays ------------------------------------------

_DIRECT_TYPES = {"i64": pa.int64(), "i32": pa.int32(), "f64": pa.float64(),
                 "f32": pa.float32(), "d": pa.date32(), "s": pa.string()}


def _granule_of(table, compression, rows_per_page, first, last):
    """The pages of each column of ``table`` (written without dictionaries) holding rows
    ``first..last``; (meta, read, {name: pages})."""
    meta, read = _written(table, compression=compression, use_dictionary=False,
                          max_rows_per_page=rows_per_page, row_group_size=len(table))
    pages = {}
    for j, name in enumerate(table.column_names):
        col = meta.row_group(0).column(j)
        spans = _granule.page_spans(read, *_chunk_start_end(col), col.num_values)
        pages[name] = [p for p in spans if p.first_row <= last and p.first_row + p.rows > first
                       and not p.dictionary]
    return meta, read, pages


def _past_ratio(pages, read):
    """Whether a page of ``pages`` is compressed more than the direct decoder trusts a
    header's size for (it leaves such a page, a decompression bomb's shape, to pyarrow)."""
    for p in pages:
        header, used = _granule._read_struct(read(p.start, p.end - p.start), 0)
        if header.get(2) > _granule._MAX_RATIO * (p.end - p.start - used) + 64:
            return True
    return False


def _through_parquet(meta, j, pages, read, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(_granule, "decode_plain_pages", lambda *a: None)
        return _granule.decode_pages(meta, 0, j, pages, read)


_texts = st.one_of(st.text(max_size=40), st.sampled_from(["", "é", "日本語", "x" * 5000]))


#: as tests/format/test_cseal.py: the C extension is optional (setup.py says why)
needs_c = pytest.mark.skipif(_granule._BYTE_ARRAY_PAGE is None,
                             reason="cryptdisk.db._csort is not built or has no byte_array_page")

_blobs = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"\x00", b"\xff" * 3000]))


@settings(max_examples=60, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate])
@given(data=st.data(), compression=st.sampled_from(["none", "lz4", "zstd", "snappy"]),
       nulls=st.booleans(), same_width=st.booleans(), in_c=st.booleans())
def test_plain_pages_decoded_directly_equal_pyarrows_decoding(data, compression, nulls,
                                                              same_width, in_c):
    """Every type the direct decoder takes, with and without NULLs (NaN, infinities,
    extremes, empty, non-ASCII and binary strings of one length or of many): its arrays
    equal pyarrow's reading of the same pages, and fall back only for a page compressed
    more than 256-fold, or, without the C extension (``in_c`` False), for strings of
    several lengths."""
    import unittest.mock

    in_c = in_c and _granule._BYTE_ARRAY_PAGE is not None  # (an optional extension)
    with unittest.mock.patch.object(_granule, "_BYTE_ARRAY_PAGE",
                                    _granule._BYTE_ARRAY_PAGE if in_c else None):
        _check_plain_pages_equal_pyarrows(data, compression, nulls, same_width, in_c)


def _check_plain_pages_equal_pyarrows(data, compression, nulls, same_width, in_c):
    import unittest.mock

    n = data.draw(st.integers(1, 120))
    per_page = data.draw(st.integers(1, 64))
    first = data.draw(st.integers(0, n - 1))
    last = data.draw(st.integers(first, n - 1))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n))) if nulls \
        else np.zeros(n, bool)
    ints = np.array(data.draw(st.lists(st.integers(-2**63, 2**63 - 1), min_size=n,
                                       max_size=n)), np.int64)
    floats = np.array(data.draw(st.lists(st.floats(allow_nan=True, allow_infinity=True),
                                         min_size=n, max_size=n)))
    if same_width:
        width = data.draw(st.sampled_from([0, 1, 32, 300]))
        texts = [data.draw(st.text(min_size=width, max_size=width).filter(
            lambda t, w=width: len(t.encode()) == w)) if width < 32 else
            ("é" * width)[: width // 2] + "x" * (width - 2 * (width // 2)) for _ in range(n)]
    else:
        texts = data.draw(st.lists(_texts, min_size=n, max_size=n))
    blobs = data.draw(st.lists(_blobs, min_size=n, max_size=n))
    table = pa.table({
        "i64": pa.array(ints, mask=mask),
        "i32": pa.array((ints % 2**31).astype(np.int32), mask=mask),
        "f64": pa.array(floats, mask=mask),
        "f32": pa.array(np.clip(np.nan_to_num(floats, nan=np.nan), -3e38, 3e38).astype(
            np.float32), mask=mask),
        "d": pa.array((ints % 100_000).astype(np.int32), mask=mask).cast(pa.date32()),
        "s": pa.array(texts, pa.string(), mask=mask),
        "bin": pa.array(blobs, pa.binary(), mask=mask),
    })
    meta, read, pages = _granule_of(table, compression, per_page, first, last)
    want_rows = sum(p.rows for p in pages["i64"])
    for j, name in enumerate(table.column_names):
        codec = compression.upper() if compression != "none" else "UNCOMPRESSED"
        if name == "bin":  # (not a type granule reads describe: its rows are the answer)
            want = table.column("bin").slice(pages["bin"][0].first_row,
                                             want_rows).combine_chunks()
            got = _granule.decode_plain_pages(codec, pages[name], read, pa.binary(), 6, True)
        else:
            want = _through_parquet(meta, j, pages[name], read, unittest.mock.MagicMock())
            described = _granule.granule_schema(meta, j)
            got = _granule.decode_plain_pages(codec, pages[name], read, described[0],
                                              described[1], described[4])
        assert want is not None and len(want) == want_rows
        column = table.column(name).to_pylist()
        values_vary = name in ("s", "bin") and any(  # a page's strings of several widths
            len({len(t) if isinstance(t, bytes) else len(t.encode())
                 for t in column[p.first_row : p.first_row + p.rows] if t is not None}) > 1
            for p in pages[name])
        if (values_vary and not in_c) or (name == "bin" and not in_c) or (
                compression != "none" and _past_ratio(pages[name], read)):
            # without the C extension, strings of several widths or binary values; a page
            # that decompresses more than 256-fold (64 equal strings of 300 bytes under
            # zstd): pyarrow's reader decodes them
            assert got is None
            continue
        assert got is not None, name
        got.validate(full=True)
        assert got.type == (pa.binary() if name == "bin" else _DIRECT_TYPES[name])
        assert got.null_count == want.null_count
        if name in ("f64", "f32"):  # NaN != NaN: the defined values' bits are equal
            assert got.is_valid().equals(want.is_valid())
            bits = np.int64 if name == "f64" else np.int32
            assert np.array_equal(got.drop_null().to_numpy().view(bits),
                                  want.drop_null().to_numpy().view(bits)), name
        else:
            assert got.equals(want), name


def test_plain_pages_are_decoded_without_pyarrows_parquet_reader(monkeypatch):
    """A point query's granule of PLAIN pages builds no Parquet file (before the direct
    decoder, every granule went through ParquetReader)."""
    table = pa.table({"k": pa.array(np.arange(1000, dtype=np.int64)),
                      "s": pa.array([f"{i:032x}" if i % 3 else None for i in range(1000)]),
                      "f": pa.array(np.linspace(0, 1, 1000))})
    meta, read, pages = _granule_of(table, "lz4", 100, 250, 260)

    def refuse(*a, **k):
        raise AssertionError("ParquetReader used")

    monkeypatch.setattr(_granule, "ParquetReader", refuse)
    for j, name in enumerate(table.column_names):
        got = _granule.decode_pages(meta, 0, j, pages[name], read)
        assert got.equals(table.column(name).slice(200, 100).combine_chunks())



@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_adjacent_pages_are_read_at_once_and_fixed_width_values_copied_once(
        monkeypatch, compression):
    """A range's pages of a column are adjacent: they are read in one call (on an encrypted
    disk each segment decrypts once into one buffer), and fixed-width values without NULLs
    are copied once, into their place in one array (no array per page concatenated);
    pages with NULLs or strings are still decoded page by page."""
    n = 1000
    table = pa.table({"k": pa.array(np.arange(n, dtype=np.int64) * 7),
                      "f": pa.array(np.linspace(-1, 1, n)),
                      "i": pa.array(np.arange(n, dtype=np.int32), mask=np.arange(n) % 5 == 0),
                      "s": pa.array([f"{i:032x}" for i in range(n)])})
    meta, read, pages = _granule_of(table, compression, 100, 250, 520)
    concat = pa.concat_arrays
    joined = []
    monkeypatch.setattr(pa, "concat_arrays", lambda arrays: joined.append(
        arrays[0].type) or concat(arrays))
    for j, name in enumerate(table.column_names):
        assert len(pages[name]) == 4
        calls = []
        described = _granule.granule_schema(meta, j)
        got = _granule.decode_plain_pages(
            compression.upper() if compression != "none" else "UNCOMPRESSED", pages[name],
            lambda o, k: calls.append(o) or read(o, k), described[0], described[1],
            described[4])
        assert calls == [pages[name][0].start], name  # one read for the four pages
        assert got.equals(table.column(name).slice(200, 400).combine_chunks()), name
    assert joined == [pa.int32(), pa.string()]  # only the pages with NULLs, and strings'


def test_a_page_compressed_past_the_ratio_goes_through_pyarrow(monkeypatch):
    """64 equal strings of 300 bytes compress more than 256-fold under zstd: the direct
    decoder does not allocate on that header's word, and the granule still decodes."""
    table = pa.table({"s": pa.array(["\u00e9" * 150] * 64)})
    meta, read, pages = _granule_of(table, "zstd", 64, 0, 63)
    assert _past_ratio(pages["s"], read)
    described = _granule.granule_schema(meta, 0)
    assert _granule.decode_plain_pages("ZSTD", pages["s"], read, described[0], described[1],
                                       described[4]) is None
    assert _granule.decode_pages(meta, 0, 0, pages["s"], read).equals(
        table.column("s").combine_chunks())


@needs_c
def test_strings_of_several_lengths_are_decoded_without_pyarrows_parquet_reader(
        monkeypatch):
    """Strings of different lengths (empty, NULL, non-ASCII) decode in C into the array's
    offsets and data (before, every such page went through ParquetReader)."""
    texts = [None if i % 7 == 0 else "é" * (i % 4) + f"{i}" * (i % 3) for i in range(1000)]
    table = pa.table({"v": pa.array(texts), "w": pa.array([t or "" for t in texts])})
    meta, read, pages = _granule_of(table, "snappy", 100, 250, 460)

    def refuse(*a, **k):
        raise AssertionError("ParquetReader used")

    monkeypatch.setattr(_granule, "ParquetReader", refuse)
    for j, name in enumerate(table.column_names):
        got = _granule.decode_pages(meta, 0, j, pages[name], read)
        got.validate(full=True)
        assert got.equals(table.column(name).slice(200, 300).combine_chunks()), name


def _string_page(texts):
    """The PLAIN page of the strings ``texts`` (no NULLs, uncompressed): (header, values,
    described)."""
    table = pa.table({"v": pa.array(texts)},
                     schema=pa.schema([pa.field("v", pa.string(), nullable=False)]))
    meta, read, pages = _granule_of(table, "none", len(texts), 0, len(texts) - 1)
    (span,) = pages["v"]
    raw = bytes(read(span.start, span.end - span.start))
    _header, used = _granule._read_struct(raw, 0)
    return raw[:used], raw[used:], _granule.granule_schema(meta, 0)


@needs_c
@pytest.mark.parametrize(("values", "rows", "problem"), [
    (b"\x02\x00\x00\x00ab\x05\x00\x00\x00cd", 2, "a value runs past the page"),
    (b"\x02\x00\x00\x00ab\xff\xff\xff\xffcd", 2, "a value runs past the page"),
    (b"\x02\x00\x00\x00ab\x02\x00", 2, "no room for the lengths"),
    (b"\x02\x00\x00\x00ab\x02\x00\x00\x00cdx", 2, "bytes left over"),
    (b"\x02\x00\x00\x00ab\x02\x00\x00\x00cd", 1, "bytes left over"),
    (b"\x02\x00\x00\x00ab\x02\x00\x00\x00cd", 4, "too short for its values' lengths"),
    (b"\x08\x00\x00\x00abcdefgh\x00\x00\x00\x00", 3, "no room for the lengths"),
])
def test_string_values_that_do_not_fill_their_page_raise_a_page_error(values, rows,
                                                                       problem):
    """A length past the page's end (however large), bytes left over, or values that do
    not match the page's rows: a PageError naming it, never bytes from outside the page."""
    with pytest.raises(ValueError, match=problem):
        _granule._BYTE_ARRAY_PAGE(values, rows)
    with pytest.raises(_granule.PageError, match=problem):
        _granule._plain_page(np, memoryview(values), rows, pa.string(), 6, False)


@needs_c
def test_a_string_page_whose_lengths_lie_fails_the_granule_decode_with_a_page_error():
    header, values, described = _string_page(["ab", "", "cde"])
    assert values == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00cde"
    page = header + values.replace(b"\x03\x00\x00\x00", b"\x02\x00\x00\x00")
    span = _granule.PageSpan(0, len(page), 0, 3, False)
    with pytest.raises(_granule.PageError, match="bytes left over"):
        _granule.decode_plain_pages("UNCOMPRESSED", [span], lambda o, n: page[o : o + n],
                                    described[0], described[1], described[4])


@needs_c
@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=40), st.binary(max_size=300)),
                       max_size=80))
def test_the_string_decoder_gives_arrows_offsets_and_data(values):
    """Values short and long in any order (short ones are copied 16 bytes at a time where
    the page and the data have them): the offsets and data of Arrow's array of them."""
    page = b"".join(len(v).to_bytes(4, "little") + v for v in values if v is not None)
    defined = np.array([v is not None for v in values], bool)
    offsets, data, ascii_only = _granule._BYTE_ARRAY_PAGE(page, len(values), defined)
    want = pa.array(values, pa.binary())
    assert offsets == want.buffers()[1].to_pybytes()[: 4 * (len(values) + 1)]
    assert data == b"".join(v for v in values if v)
    assert ascii_only == all(b < 0x80 for b in data)


@needs_c
def test_strings_of_one_width_take_the_strided_view_not_the_c_copy(monkeypatch):
    """32-character hashes (the bench's c_str) decode through NumPy's strided view, which
    costs about half the instructions of the C decoder's copy value by value; a page of
    several widths goes to the C decoder."""
    calls = []
    c_decoder = _granule._BYTE_ARRAY_PAGE
    monkeypatch.setattr(_granule, "_BYTE_ARRAY_PAGE",
                        lambda *a: calls.append(a[1]) or c_decoder(*a))
    texts = [None if i % 5 == 0 else f"{i:032x}" for i in range(300)]
    varied = [None if i % 5 == 0 else "x" * (i % 7) for i in range(300)]
    table = pa.table({"h": pa.array(texts), "v": pa.array(varied)})
    meta, read, pages = _granule_of(table, "none", 300, 0, 299)
    for j, name in enumerate(table.column_names):
        described = _granule.granule_schema(meta, j)
        got = _granule.decode_plain_pages("UNCOMPRESSED", pages[name], read, described[0],
                                          described[1], described[4])
        assert got.equals(table.column(name).combine_chunks())
        assert calls == ([] if name == "h" else [300])


@needs_c
def test_the_string_decoder_reads_the_defined_rows_only():
    offsets, data, ascii_only = _granule._BYTE_ARRAY_PAGE(
        b"\x01\x00\x00\x00a\x00\x00\x00\x00\x02\x00\x00\x00\xc3\xa9", 5,
        np.array([False, True, True, False, True]))
    assert np.frombuffer(offsets, np.int32).tolist() == [0, 0, 1, 1, 1, 3]
    assert data == b"a\xc3\xa9" and not ascii_only
    with pytest.raises(ValueError, match="rows do not match"):
        _granule._BYTE_ARRAY_PAGE(b"", 2, np.array([False]))


def test_pages_the_direct_decoder_does_not_take_go_through_pyarrow():
    table = pa.table({"b": pa.array([i % 3 == 0 for i in range(500)]),
                      "lo": pa.array([f"x{i % 5}" for i in range(500)])})
    meta, read = _written(table, use_dictionary=["lo"], max_rows_per_page=100,
                          compression="none")
    for j, name in enumerate(table.column_names):
        col = meta.row_group(0).column(j)
        spans = _granule.page_spans(read, *_chunk_start_end(col), col.num_values)
        data = [p for p in spans if not p.dictionary]
        described = _granule.granule_schema(meta, j)
        assert _granule.decode_plain_pages("UNCOMPRESSED", data[1:3], read, described[0],
                                           described[1], described[4]) is None, name
        got = _granule.decode_pages(meta, 0, j, [p for p in spans if p.dictionary]
                                    + data[1:3], read)
        assert got.equals(table.column(name).slice(100, 200).combine_chunks()), name


def _one_page(compression="none"):
    table = pa.table({"k": pa.array(np.arange(200, dtype=np.int64),
                                    mask=np.arange(200) % 7 == 0),
                      "s": pa.array([f"{i:08d}" for i in range(200)]),
                      "v": pa.array(["é" * (i % 5) + "x" * (i % 3) for i in range(200)],
                                    mask=np.arange(200) % 6 == 0)})
    meta, read, pages = _granule_of(table, compression, 200, 0, 199)
    return table, meta, {name: bytes(read(p.start, p.end - p.start)) for name, (p,) in
                         pages.items()}


@pytest.mark.parametrize("compression", ["none", "lz4"])
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_direct_decoder_fuzz_damaged_pages_give_none_or_rows_never_a_crash(compression,
                                                                           data):
    """Page bytes on a plain disk are not authenticated: a mutated or truncated page
    gives None (the caller then decodes through pyarrow, which reports the damage), a
    PageError, or the array pyarrow's reader decodes from the same bytes, and reads nothing
    outside the page."""
    import unittest.mock

    table, meta, raw_pages = _one_page(compression)
    name = data.draw(st.sampled_from(["k", "s", "v"]))
    page = bytearray(raw_pages[name])
    for _ in range(data.draw(st.integers(0, 6))):
        page[data.draw(st.integers(0, len(page) - 1))] = data.draw(st.integers(0, 255))
    page = page[: data.draw(st.integers(0, len(page)))]
    buf = bytes(page)
    span = _granule.PageSpan(0, len(raw_pages[name]), 0, 200, False)
    j = table.column_names.index(name)
    described = _granule.granule_schema(meta, j)
    read = lambda o, n: buf[o : o + n]  # noqa: E731
    try:
        got = _granule.decode_plain_pages("LZ4" if compression == "lz4" else "UNCOMPRESSED",
                                          [span], read, described[0], described[1],
                                          described[4])
    except _granule.PageError:
        return  # the clear error (the caller reads the chunk whole, as pyarrow judges it)
    if got is not None:
        got.validate(full=True)
        assert len(got) == 200 and got.type == described[0]
        want = _through_parquet(meta, j, [span], read, unittest.mock.MagicMock())
        assert want is not None
        assert got.equals(want)


def test_a_truncated_page_falls_back_and_reports_a_page_error():
    _table, meta, raw_pages = _one_page()
    buf = raw_pages["k"][:-9]
    span = _granule.PageSpan(0, len(raw_pages["k"]), 0, 200, False)
    described = _granule.granule_schema(meta, 0)
    read = lambda o, n: buf[o : o + n]  # noqa: E731
    assert _granule.decode_plain_pages("UNCOMPRESSED", [span], read, described[0],
                                       described[1], described[4]) is None
    with pytest.raises(_granule.PageError, match="past the end"):
        _granule.decode_pages(meta, 0, 0, [span], read)


def test_strings_of_one_width_that_are_not_utf8_are_not_decoded_directly():
    """The direct path checks the text: ASCII at once, anything else value by value (a
    2-byte character split across two values is not UTF-8 in either)."""
    def decode(raw):
        at = span.start
        return _granule.decode_plain_pages("UNCOMPRESSED", [span],
                                           lambda o, n: raw[o - at : o - at + n],
                                           described[0], described[1], described[4])

    table = pa.table({"s": pa.array(["abc", "cde", "éx", "xyz"])})
    meta, read, pages = _granule_of(table, "none", 4, 0, 3)
    (span,) = pages["s"]
    page = bytes(read(span.start, span.end - span.start))
    described = _granule.granule_schema(meta, 0)
    assert decode(page).to_pylist() == ["abc", "cde", "éx", "xyz"]
    # "éx" -> b"\xc3" "x" "\xa9": a lead byte without its continuation, and a stray one
    broken = page.replace(b"\xc3\xa9x", b"\xc3x\xa9")
    assert broken != page
    assert decode(broken) is None
    # the same bytes as one run would be valid UTF-8 across values: "ab\xc3" + "\xa9xy"
    split = page.replace(b"abc", b"ab\xc3").replace(b"\x03\x00\x00\x00cde",
                                                    b"\x03\x00\x00\x00\xa9de")
    assert decode(split) is None


def test_a_tampered_column_granule_bound_fails_the_top_n(tmp_path, monkeypatch):
    """The granule bounds of the columns but the key (``COLUMN_GRANULES_KEY``) are read
    from the part's lookup block, which authenticates as any segment: a changed byte in
    them is the part's authentication error, never a top-N missing its best rows."""
    path = tmp_path / "db"
    sql = "SELECT c_int FROM t ORDER BY c_float DESC LIMIT 2"
    with cryptdisk.connect(path) as db:
        part = _point_table(db, monkeypatch)
        disk = db.config.disks[part.disk]
        assert db.query(sql) == [(4999,), (4998,)]
        assert db.last_scans["t"]["granule_reads"] == 1
        with disk.open_read(part.path) as f:
            seg = f.info["segment_size"]
            plain = f.pread(0, f.size)
    name = _parts.COLUMN_GRANULES_KEY
    at = bytes(plain).index(name)  # the lookup block's entry (before the footer's)
    index = _flip(path, part, seg, at + len(name) + 40)  # in the entry's data
    with cryptdisk.connect(path, read_only=True) as db, \
            pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query(sql)

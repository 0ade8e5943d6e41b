"""VARCHAR column chunks whose strings all have one length (hashes, UUIDs, codes), read
whole by a scan: decrypted (or read) into the arena and their strings copied once into the
array (in C, ``_csort.one_width_into``, or through NumPy's strided view where it is not
built), without pyarrow's Parquet reader; anything else goes through pyarrow as before."""

import hashlib

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _blocks, _granule
from cryptdisk.db import _partread as _parts
from cryptdisk.db import _parts as writer
from cryptdisk.errors import AuthenticationError

from .dbhelpers import flip_segment_byte

#: as tests/db/test_db_granule.py: the C extension is optional (setup.py says why)
needs_c = pytest.mark.skipif(_granule._ONE_WIDTH_INTO is None,
                             reason="cryptdisk.db._csort is not built or has no one_width_into")

#: (name, SQL of the VARCHAR column from i) of one length each: ASCII hashes, two-byte
#: characters, empty strings, long strings
_ONE_WIDTH = {
    "md5": "md5(i::VARCHAR)",
    "accents": "translate(md5(i::VARCHAR), '0123456789abcdef', 'àáâãäåæçèéêëìíîï')",
    "empty": "''",
    "long": "repeat(md5(i::VARCHAR), 10)",
}


def _as_values(monkeypatch):
    """Parts written uncompressed and without dictionaries, as hashes are (and as a
    column of few distinct values is not)."""
    monkeypatch.setattr(writer, "COMPRESSION_MIN_SAVING", 2.0)  # nothing saves 200%
    monkeypatch.setattr(writer, "dictionary_columns", lambda *a: [])
    monkeypatch.setattr(_blocks, "dictionary_columns", lambda *a: [])
    # (a small insert's sample is not judged: every column LZ4)
    monkeypatch.setattr(writer, "column_compression", lambda *a: "NONE")
    monkeypatch.setattr(_blocks, "column_compression", lambda *a: "NONE")


def _table(db, monkeypatch, column_sql, policy="default", nulls=False, rows=50_000,
           group_rows=10_000):
    """A one-part table t (c_int BIGINT, c_str VARCHAR) of ``rows`` rows in row groups of
    ``group_rows``, stored uncompressed and without a dictionary; c_str is ``column_sql``
    (NULL every 7th row if ``nulls``)."""
    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", group_rows)
    _as_values(monkeypatch)
    db.sql(f"CREATE TABLE t (c_int BIGINT, c_str VARCHAR) SETTINGS storage_policy = '{policy}'")
    value = f"CASE WHEN i % 7 = 3 THEN NULL ELSE {column_sql} END" if nulls else column_sql
    select = f"SELECT i::BIGINT, {value} FROM range({rows}) r(i)"
    db.sql("INSERT INTO t " + select)
    part = db.table("t").parts[0]
    return part, db.config.disks[part.disk], select


@pytest.mark.parametrize("policy", ["default", "plain"])
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("kind", sorted(_ONE_WIDTH))
def test_strings_of_one_width_are_read_without_pyarrows_reader(db, monkeypatch, kind, nulls,
                                                               policy):
    """Every row group read (one, several, with the BIGINT beside) equals pyarrow's
    decoding of the chunk, and no Parquet reader is built (before, every read of a
    VARCHAR chunk went through one: this failed); the SQL answers equal DuckDB's."""
    part, disk, select = _table(db, monkeypatch, _ONE_WIDTH[kind], policy, nulls)
    want = _parts.read_part(disk, part, ["c_int", "c_str"])  # (pyarrow's reader)
    op = _parts.open_part(disk, part)
    decoded = []
    real = _parts._read_row_groups
    monkeypatch.setattr(_parts, "_read_row_groups", lambda *a: decoded.append(a[2]) or real(*a))
    try:
        assert op.num_row_groups == 5
        assert bool(op.described(op._index["c_str"])[4]) == nulls  # OPTIONAL with NULLs
        got = pa.concat_tables([op.read([0, 1, 2], ["c_str"]), op.read([3], ["c_str"]),
                                op.read([4], ["c_str"])])
        both = op.read([2, 3], ["c_int", "c_str"])
        assert decoded == []
    finally:
        op.close()
    assert got.column("c_str").to_pylist() == want.column("c_str").to_pylist()
    assert got.schema.field("c_str").type == pa.string()
    assert both.equals(want.slice(20_000, 20_000).combine_chunks()) or (
        both.to_pylist() == want.slice(20_000, 20_000).to_pylist())
    for chunk in got.column("c_str").chunks:
        chunk.validate(full=True)
    sql = ("SELECT substr(c_str, 1, 2) AS p, count(*) AS n, count(c_str), min(c_str), "
           "max(c_str) FROM t GROUP BY p ORDER BY p")
    assert db.query(sql) == db.con.sql(sql.replace("FROM t", f"FROM ({select}) s(c_int, c_str)")
                                       ).fetchall()


def test_an_encrypted_string_chunk_is_one_read_and_its_edge_segments_authenticate(
        tmp_path, db, monkeypatch):
    """An encrypted string chunk is read by one call, its partial first and last segments
    with the whole ones between (each edge a call and a read of its own cost the strings
    scan about a tenth of its CPU), and a changed byte in its first segment, shared with
    the chunk before it, fails the read with that segment's error."""
    from cryptdisk.format._io import PositionalReadFile

    part, disk, _select = _table(db, monkeypatch, _ONE_WIDTH["md5"])
    calls = []
    spans, into = PositionalReadFile.preadspans, PositionalReadFile.preadinto
    monkeypatch.setattr(PositionalReadFile, "preadspans", lambda self, b, o, s: calls.append(
        ("spans", o, len(b), s)) or spans(self, b, o, s))
    monkeypatch.setattr(PositionalReadFile, "preadinto", lambda self, b, o, **k: calls.append(
        ("into", o, len(b))) or into(self, b, o, **k))
    op = _parts.open_part(disk, part)
    try:
        seg = op._segment
        start, end, _compressed = op._chunk_info(2, op._index["c_str"])
        calls.clear()
        got = op.read([2], ["c_str"])
    finally:
        op.close()
    assert calls == [("spans", start, end - start, [])]
    assert got.column(0).to_pylist() == [hashlib.md5(str(i).encode()).hexdigest()
                                         for i in range(20_000, 30_000)]
    flip_segment_byte(tmp_path / "db" / "data" / part.path, start // seg, seg)
    op = _parts.open_part(disk, part)
    try:
        with pytest.raises(AuthenticationError, match=f"segment {start // seg} "):
            op.read([2], ["c_str"])
    finally:
        op.close()


@pytest.mark.parametrize("policy", ["default", "plain"])
def test_strings_of_several_lengths_go_through_pyarrow_once_tried(db, monkeypatch, policy):
    """A chunk whose strings differ in length is not decoded here: the read goes through
    pyarrow's reader (same answers), and the part's later reads of the column go there at
    once, without reading the chunk for this decoder first."""
    part, disk, _select = _table(db, monkeypatch, "md5(i::VARCHAR)[: 1 + i % 32]", policy)
    want = _parts.read_part(disk, part, ["c_str"])
    op = _parts.open_part(disk, part)
    tried = []
    real = _granule.decode_one_width_chunk
    monkeypatch.setattr(_parts, "decode_one_width_chunk",
                        lambda *a: tried.append(1) or real(*a))
    try:
        got = pa.concat_tables([op.read([rg], ["c_str"]) for rg in range(op.num_row_groups)])
    finally:
        op.close()
    assert got.column(0).to_pylist() == want.column(0).to_pylist()
    assert tried == [1]


def test_a_tampered_segment_of_a_string_chunk_fails_the_read(tmp_path, db, monkeypatch):
    """Every segment of a string chunk authenticates before the decoder sees it: a byte
    changed inside row group 2's c_str chunk fails that read with the segment's error,
    and the SQL query fails the same way."""
    part, disk, _select = _table(db, monkeypatch, _ONE_WIDTH["md5"])
    op = _parts.open_part(disk, part)
    seg = op._segment
    start, end, _compressed = op._chunk_info(2, op._index["c_str"])
    index = (start + end) // 2 // seg
    op.close()
    flip_segment_byte(tmp_path / "db" / "data" / part.path, index, seg)
    op = _parts.open_part(disk, part)
    try:
        with pytest.raises(AuthenticationError, match=f"segment {index}"):
            op.read([2], ["c_str"])
        assert op.read([0], ["c_str"]).num_rows == 10_000  # the others still read
    finally:
        op.close()
    db.cache.clear()
    with pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query("SELECT count(DISTINCT substr(c_str, 1, 3)) FROM t")


def test_pages_that_do_not_tile_the_chunk_are_refused(db, monkeypatch):
    """A plain part's page index is not authenticated: spans moved by a few bytes (so the
    values would start inside a header or a string), a page missing, or a header changed
    make the decoder refuse the chunk (None: pyarrow reads it whole), never misread it;
    a byte changed anywhere gives None or the chunk's rows, never an exception."""
    part, disk, _select = _table(db, monkeypatch, _ONE_WIDTH["md5"], "plain", rows=20_000)
    op = _parts.open_part(disk, part)
    try:
        j = op._index["c_str"]
        pages = op._plain_pages(0, j)
        start, end, _compressed = op._chunk_info(0, j)
        chunk = bytes(op._handle.read_at(end - start, start))
        want = op.read([0], ["c_str"]).column(0).chunk(0)
    finally:
        op.close()
    assert len(pages) >= 2
    decode = _granule.decode_one_width_chunk
    assert decode(chunk, start, pages, pa.string(), False).equals(want)
    P = _granule.PageSpan
    for shift in (-8, -4, -1, 1, 4, 8):
        moved = list(pages)
        p, q = moved[0], moved[1]
        moved[0] = P(p.start, p.end + shift, p.first_row, p.rows, False)
        moved[1] = P(q.start + shift, q.end, q.first_row, q.rows, False)
        assert decode(chunk, start, moved, pa.string(), False) is None, shift
    assert decode(chunk, start, pages[1:], pa.string(), False) is None
    assert decode(chunk[: pages[-1].start - start], start, pages[:-1], pa.string(),
                  False) is not None  # (a chunk of the first pages alone decodes)
    assert decode(chunk, start, pages, pa.binary(), False).to_pylist() == [
        s.encode() for s in want.to_pylist()]
    assert decode(chunk, start, pages, pa.int64(), False) is None
    import random
    rng = random.Random(7)
    for _ in range(300):
        damaged = bytearray(chunk)
        at = rng.randrange(len(damaged))
        damaged[at] = rng.randrange(256)
        got = decode(bytes(damaged), start, pages, pa.string(), False)
        assert got is None or len(got) == len(want)


@pytest.mark.parametrize("in_c", [True, False])
def test_one_width_text_that_is_not_utf8_is_not_decoded_here(monkeypatch, in_c):
    """The text is checked: ASCII at once, anything else value by value; a chunk of
    binary values of one width read as VARCHAR gives None (pyarrow's reader judges it).
    In C (``in_c``, where built) and through NumPy alike."""
    import io

    if not in_c:
        monkeypatch.setattr(_granule, "_ONE_WIDTH_INTO", None)

    import pyarrow.parquet as pq

    def chunk_of(values, typ):
        sink = io.BytesIO()
        pq.write_table(pa.table({"s": pa.array(values, typ)}), sink, compression="NONE",
                       use_dictionary=False, data_page_size=64, write_batch_size=8,
                       write_statistics=False)
        raw = sink.getvalue()
        meta = pq.ParquetFile(pa.BufferReader(raw)).metadata
        col = meta.row_group(0).column(0)
        start, end = _parts._chunk_start_end(col)
        spans = _granule.page_spans(lambda o, n: raw[o : o + n], start, end, col.num_values)
        return raw[start:end], start, spans

    good = ["日本語", None, "ßßßßa"] * 30  # (9 bytes each; NULLs: levels before them)
    chunk, base, spans = chunk_of(good, pa.string())
    assert len(spans) > 1
    assert _granule.decode_one_width_chunk(chunk, base, spans, pa.string(),
                                           True).to_pylist() == good
    bad = [b"\xff\xfe\xfd\xfc"] * 20
    chunk, base, spans = chunk_of(bad, pa.binary())
    assert _granule.decode_one_width_chunk(chunk, base, spans, pa.string(), True) is None
    assert _granule.decode_one_width_chunk(chunk, base, spans, pa.binary(),
                                           True).to_pylist() == bad


_SETTINGS = settings(max_examples=15, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow,
                                            HealthCheck.function_scoped_fixture,
                                            HealthCheck.data_too_large])


@st.composite
def _tables(draw):
    letters = draw(st.sampled_from(["ab", "xyz09", "éß", "日本", "😀a"]))
    width = draw(st.integers(0, 40))
    char = st.sampled_from(list(letters))
    one = st.lists(char, min_size=width, max_size=width).map("".join)
    if len({len(c.encode()) for c in letters}) > 1:  # one length in bytes: one character
        one = st.lists(st.just(letters[0]), min_size=width, max_size=width).map("".join)
    nulls = draw(st.booleans())
    value = st.one_of(st.none(), one) if nulls else one
    inserts = draw(st.lists(st.lists(value, max_size=70), min_size=1, max_size=3))
    return (inserts, draw(st.sampled_from(["default", "plain"])), draw(st.booleans()),
            draw(st.booleans()))


@_SETTINGS
@given(table=_tables(), data=st.data())
def test_one_width_strings_answer_as_duckdb(tmp_path_factory, monkeypatch, table, data):
    """Random tables of strings of one length (ASCII, two-, three- and four-byte
    characters, empty, up to 40 characters; NULLs or not; several inserts, so several
    parts; row groups of 16 rows in pages of 4; encrypted or plain; cache on or off):
    GROUP BY, ORDER BY, count, min, max, filters and LIMIT answer as DuckDB does over the
    same rows, cold and warm; the strings copied in C or, as where the extension is not
    built, through NumPy."""
    inserts, policy, cache, in_c = table
    if not in_c:
        monkeypatch.setattr(_granule, "_ONE_WIDTH_INTO", None)
    monkeypatch.setattr(writer, "GRANULE_ROWS", 4)
    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", 16)
    _as_values(monkeypatch)
    direct = []
    real = _granule.decode_one_width_chunk
    monkeypatch.setattr(_parts, "decode_one_width_chunk",
                        lambda *a: direct.append(1) or real(*a))
    path = tmp_path_factory.mktemp("ow") / "db"
    ref = duckdb.connect()
    with cryptdisk.connect(path, cache_bytes=(64 << 20) if cache else 0) as db:
        db.sql(f"CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY (k) "
               f"SETTINGS storage_policy = '{policy}'")
        ref.execute("CREATE TABLE t (k BIGINT, s VARCHAR)")
        k = 0
        for rows in inserts:
            values = []
            for v in rows:
                values.append(f"({k}, {'NULL' if v is None else repr(v)})")
                k += 1
            sql = (f"INSERT INTO t VALUES {', '.join(values)}" if values
                   else "INSERT INTO t SELECT * FROM t WHERE false")
            db.sql(sql)
            ref.execute(sql)
        cut = data.draw(st.integers(0, max(k, 1)))
        queries = [
            "SELECT substr(s, 1, 2) AS p, count(*) AS n FROM t GROUP BY p ORDER BY p NULLS FIRST",
            "SELECT k, s FROM t ORDER BY k",
            "SELECT count(s), count(*), min(s), max(s), sum(length(s)) FROM t",
            f"SELECT k, s FROM t WHERE k >= {cut} ORDER BY k LIMIT 5",
            "SELECT s, count(*) FROM t GROUP BY s ORDER BY s NULLS FIRST",
        ]
        for _round in range(2):  # cold, then warm (from the cache when it is on)
            for q in queries:
                assert db.query(q) == ref.execute(q).fetchall(), q
    ref.close()
    assert direct or k == 0


@needs_c
@pytest.mark.parametrize("width", [0, 1, 9, 16, 31, 32, 33, 40, 64, 100])
def test_the_c_copy_checks_every_length_and_tells_ascii(width):
    """``one_width_into`` (the widths it copies word by word and any other): the values'
    bytes packed at ``at``, nothing else written; a length that differs anywhere (first,
    middle, last value) gives None; a byte >= 0x80 anywhere makes it say not ASCII; sizes
    that do not add up are a ValueError, never a read or write past a buffer."""
    copy = _granule._ONE_WIDTH_INTO
    rows = [bytes((65 + (i * 7 + k) % 26) for k in range(width)) for i in range(37)]
    values = b"".join(len(v).to_bytes(4, "little") + v for v in rows)
    out = bytearray(b"\xee" * (3 + 37 * width + 5))
    assert copy(values, 37, width, out, 3) is True
    assert out[:3] == b"\xee" * 3 and out[3 + 37 * width :] == b"\xee" * 5
    assert bytes(out[3 : 3 + 37 * width]) == b"".join(rows)
    for i in (0, 18, 36):
        at = i * (4 + width)
        other = values[:at] + (width + 1).to_bytes(4, "little") + values[at + 4 :]
        assert copy(other, 37, width, bytearray(len(out)), 3) is None
    if width:
        for i in (0, 18, 36):
            at = i * (4 + width) + 4 + width - 1
            high = values[:at] + b"\xc3" + values[at + 1 :]
            assert copy(high, 37, width, bytearray(len(out)), 3) is False
    with pytest.raises(ValueError, match="not count values"):
        copy(values + b"x", 37, width, out, 3)
    with pytest.raises(ValueError, match="not count values"):
        copy(values, 36, width, out, 3)
    with pytest.raises(ValueError, match="not count values"):
        copy(values, 37, -1, out, 3)
    if width:
        with pytest.raises(ValueError, match="no room"):
            copy(values, 37, width, out, 9)
    with pytest.raises(ValueError, match="no room"):
        copy(values, 37, width, out, len(out) + 1)
    with pytest.raises(TypeError):
        copy(values, 37, width, bytes(len(out)), 3)  # (not writable)


@needs_c
@pytest.mark.parametrize("policy", ["default", "plain"])
def test_the_scan_copies_one_width_strings_in_c(db, monkeypatch, policy):
    """A scan of hashes copies their strings in C (a call per page holding values), and answers
    as DuckDB over the same rows, with NULLs and empty strings in other parts."""
    _part, _disk, select = _table(db, monkeypatch, _ONE_WIDTH["md5"], policy, nulls=True)
    db.sql("INSERT INTO t SELECT i::BIGINT, CASE WHEN i % 3 = 0 THEN NULL ELSE '' END "
           "FROM range(50000, 50100) r(i)")
    calls = []
    real = _granule._ONE_WIDTH_INTO
    monkeypatch.setattr(_granule, "_ONE_WIDTH_INTO", lambda *a: calls.append(a[2]) or real(*a))
    db.cache.clear()
    sql = "SELECT substr(c_str, 1, 2) AS p, count(*), count(c_str) FROM t GROUP BY p ORDER BY p"
    want = db.con.sql(sql.replace("FROM t", f"FROM ({select} UNION ALL SELECT i::BIGINT, "
                                  "CASE WHEN i % 3 = 0 THEN NULL ELSE '' END FROM "
                                  "range(50000, 50100) r(i)) s(c_int, c_str)")).fetchall()
    assert db.query(sql) == want
    assert calls and set(calls) == {32}


@needs_c
@settings(max_examples=300, deadline=None, database=None)
@given(width=st.integers(0, 80), data=st.data())
def test_the_c_copy_equals_a_plain_reading_of_the_values(width, data):
    """Random values of one width (any bytes), at a random place in the output, sometimes
    one length changed: the C copy gives None exactly when a length is not ``width``, and
    otherwise the values' bytes packed in place, and says ASCII exactly when no byte of
    them is >= 0x80; the bytes around them are untouched."""
    count = data.draw(st.integers(0, 40))
    rows = [data.draw(st.binary(min_size=width, max_size=width)) for _ in range(count)]
    lengths = [width] * count
    if count and data.draw(st.booleans()):
        lengths[data.draw(st.integers(0, count - 1))] = data.draw(
            st.integers(0, 2**32 - 1).filter(lambda n: n != width))
    values = b"".join(n.to_bytes(4, "little") + v for n, v in zip(lengths, rows, strict=True))
    at = data.draw(st.integers(0, 16))
    out = bytearray(b"\x5a" * (at + count * width + 7))
    got = _granule._ONE_WIDTH_INTO(values, count, width, out, at)
    if any(n != width for n in lengths):
        assert got is None
        return
    packed = b"".join(rows)
    assert got is all(b < 0x80 for b in packed)
    assert bytes(out[at : at + len(packed)]) == packed
    assert out[:at] == b"\x5a" * at and out[at + len(packed) :] == b"\x5a" * 7

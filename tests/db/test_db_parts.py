"""Part reads: in-place decryption into the reusable arena, pipelined with decoding."""

import itertools
import os
import time
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cryptdisk.db import _granule
from cryptdisk.db import _partread as _parts
from cryptdisk.db import _parts as part_writer
from cryptdisk.errors import AuthenticationError
from cryptdisk.format import HEADER_SIZE

from .dbhelpers import SCHEMA, flip_segment_byte, gen


def test_results_do_not_alias_the_arena(db, monkeypatch):
    # LZ4 on every column: uncompressed chunks are decrypted into fresh buffers, not the arena
    monkeypatch.setattr(part_writer, "COMPRESSION_MIN_SAVING", -1.0)
    # the live threads' arenas, and every arena made from here on, kept even if its
    # thread ends (a DuckDB thread calling back into Python ends its thread state)
    monkeypatch.setattr(_parts, "_ARENAS", set(_parts._ARENAS))
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(50_000))
    table = db.arrow_table("t")
    expected = db.con.sql(gen(50_000)).to_arrow_table()
    arenas = [a._map for a in [_parts._ARENA, *_parts._ARENAS] if a._map is not None]
    assert arenas
    for arena in arenas:  # scribble over everything decrypted so far, on every thread
        arena.seek(0)
        arena.write(b"\xff" * len(arena))
    assert table.column("c_int").to_pylist() == expected.column(0).to_pylist()
    assert table.column("c_str").to_pylist() == expected.column(1).to_pylist()
    assert table.column("c_float").to_pylist() == expected.column(2).to_pylist()


def test_compact_file_decrypts_reads_outside_prepared_ranges(tmp_path, db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(1000))
    part = db.table("t").parts[0]
    disk = db.config.disks[part.disk]
    with disk.open_read(part.path) as f:
        plain = f.read()
        arena = memoryview(bytearray(b"x" * 10))
        compact = _parts._CompactFile(f, len(plain), [(100, 110, 0)], arena)
        compact.seek(100)
        assert bytes(compact.read(10)) == b"x" * 10  # served from the arena
        compact.seek(50)
        assert bytes(compact.read(100)) == plain[50:150]  # decrypted on demand
        compact.seek(-8, 2)
        assert bytes(compact.read()) == plain[-8:]


@pytest.mark.parametrize("columns", [None, ["c_str"], ["c_float", "c_int"]])
def test_read_part_matches_for_any_projection(db, columns):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(3000))
    part = db.table("t").parts[0]
    got = _parts.read_part(db.config.disks[part.disk], part, columns)
    full = db.con.sql(gen(3000)).to_arrow_table().rename_columns(["c_int", "c_str", "c_float"])
    want = full if columns is None else full.select(columns)
    assert got.cast(want.schema).equals(want) or got.to_pylist() == want.to_pylist()
    assert isinstance(got, pa.Table)


def _many_row_groups(db, monkeypatch, rows=20_000, group_rows=2_000):
    """A table whose one part has many row groups, so reads go through the pipeline."""
    from cryptdisk.db import _parts as writer

    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", group_rows)
    monkeypatch.setattr(writer, "COMPRESSION_MIN_SAVING", -1.0)  # LZ4 even on md5 strings
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(rows))
    part = db.table("t").parts[0]
    return part, db.config.disks[part.disk]


@pytest.mark.parametrize("columns", [["c_float"], ["c_int", "c_float"], None])
def test_pipelined_read_of_many_chunks_matches(db, monkeypatch, columns):
    part, disk = _many_row_groups(db, monkeypatch)
    with disk.open_read(part.path) as f:
        meta = pq.read_metadata(f)
    assert meta.num_row_groups == 10
    assert len(_parts._chunk_ranges(meta, columns)) >= 10  # adjacent chunks are not merged
    got = _parts.read_part(disk, part, columns)
    full = db.con.sql(gen(20_000)).to_arrow_table().rename_columns(["c_int", "c_str", "c_float"])
    want = full if columns is None else full.select(columns)
    assert got.to_pylist() == want.to_pylist()


def test_tampered_later_chunk_fails_and_the_arena_stays_usable(tmp_path, db, monkeypatch):
    part, disk = _many_row_groups(db, monkeypatch)
    with disk.open_read(part.path) as f:
        meta = pq.read_metadata(f)
        seg = f.info["segment_size"]
        count = -(-f.size // seg)
    chunk = meta.row_group(6).column(2)  # c_float of a late row group: the background thread's
    index = (chunk.data_page_offset + 100) // seg
    first = _parts._chunk_ranges(meta, ["c_float"])[0]
    assert first[1] // seg < index < count - 1  # neither the first chunk nor the footer
    full = tmp_path / "db" / "data" / part.path
    data = bytearray(full.read_bytes())
    data[HEADER_SIZE + index * (seg + 16) + 7] ^= 1
    full.write_bytes(bytes(data))
    db.cache.clear()
    with pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query("SELECT avg(c_float) FROM t")
    db.sql(f"CREATE TABLE u {SCHEMA}")
    db.sql("INSERT INTO u " + gen(20_000))
    assert db.query("SELECT sum(c_int), count(c_float) FROM u") == [
        (sum(range(20_000)), 20_000)]


def test_concurrent_reads_share_the_arena_safely(db, monkeypatch):
    part, disk = _many_row_groups(db, monkeypatch)
    want = _parts.read_part(disk, part, ["c_int", "c_float"])
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: _parts.read_part(disk, part, ["c_int", "c_float"]),
                            range(8)))
    assert all(t.equals(want) for t in got)


def test_a_forked_child_reads_parts_with_its_own_worker(db, monkeypatch):
    part, disk = _many_row_groups(db, monkeypatch)
    want = sum(range(20_000))
    assert _parts.read_part(disk, part, ["c_int"]).column(0).to_pylist()[-1] == 19_999
    pid = os.fork()
    if pid == 0:  # the parent's worker thread does not exist here
        try:
            got = sum(_parts.read_part(disk, part, ["c_int"]).column(0).to_pylist())
            os._exit(0 if got == want else 1)
        except BaseException:
            os._exit(2)
    deadline = time.monotonic() + 20
    while not (done := os.waitpid(pid, os.WNOHANG))[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    if not done[0]:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise AssertionError("the forked child hung reading a part")
    assert os.waitstatus_to_exitcode(done[1]) == 0


@pytest.mark.parametrize("columns", [["c_float"], ["c_int", "c_float"], ["c_str"],
                                     ["c_int", "c_str", "c_float"]])
def test_row_group_reads_decode_from_the_arena_without_python_reads(db, monkeypatch, columns):
    part, disk = _many_row_groups(db, monkeypatch)
    want = _parts.read_part(disk, part, columns)
    op = _parts.open_part(disk, part)
    made = []
    real = _parts._CompactFile
    monkeypatch.setattr(_parts, "_CompactFile", lambda *a: made.append(a) or real(*a))
    try:
        native = pa.concat_tables([op.read([rg], columns) for rg in range(op.num_row_groups)])
        pairs = pa.concat_tables([op.read([rg, rg + 5], columns) for rg in range(5)])
        assert not made  # pyarrow read the arena as memory, not through a Python file
        monkeypatch.setattr(_parts, "_GAP_SLACK", -(1 << 40))  # every read compacted
        monkeypatch.setattr(_parts, "SPAN_MAX", 0)  # (a run's span allowance too)
        compacted = pa.concat_tables([op.read([rg], columns)
                                      for rg in range(op.num_row_groups)])
        assert made
    finally:
        op.close()
    assert native.equals(want) and compacted.equals(want)
    expected_pairs = pa.concat_tables([want.slice(rg * 2_000, 2_000).combine_chunks()
                                       for rg in (0, 5, 1, 6, 2, 7, 3, 8, 4, 9)])
    assert pairs.to_pylist() == expected_pairs.to_pylist()


def _apart(db, monkeypatch):
    """A part whose c_float chunks lie several segments apart (c_str between them)."""
    part, disk = _many_row_groups(db, monkeypatch, rows=100_000, group_rows=20_000)
    op = _parts.open_part(disk, part)
    seg = op._segment
    starts = [_parts._chunk_start_end(op.meta.row_group(rg).column(2))
              for rg in range(op.num_row_groups)]
    assert op.num_row_groups == 5
    assert all(b[0] - a[1] > 2 * seg for a, b in itertools.pairwise(starts))
    return op, disk, part, starts


@pytest.mark.parametrize("groups", [[0, 1, 2, 3, 4], [1, 2], [0, 2, 4], [3, 1]])
@pytest.mark.parametrize("columns", [["c_float"], ["c_int", "c_float"], ["c_str"]])
def test_a_read_of_row_groups_far_apart_fills_only_its_chunks_of_the_arena(
        db, monkeypatch, groups, columns):
    """Row groups whose chunks lie apart in the file are decrypted one after another into
    the arena (not at their distance in the file), each decoded by a reader of its own:
    the rows are the same as a plain read's, in the order asked."""
    op, _disk, _part, starts = _apart(db, monkeypatch)
    made = []
    real = _parts._CompactFile
    monkeypatch.setattr(_parts, "_CompactFile", lambda *a: made.append(a) or real(*a))
    try:
        size, arena = op.span(groups, columns)
        got = op.read(groups, columns)
    finally:
        op.close()
    assert not made  # decoded from the arena as memory
    if len(columns) == 1:  # each chunk's whole segments, one after another
        assert arena <= size + len(groups) * (2 * op._segment + _parts._ARENA_ALIGN)
    if columns == ["c_float"] and len(groups) > 1:  # far less than the chunks' extent
        assert 2 * arena < max(b for _a, b in starts) - min(a for a, _b in starts)
    full = db.con.sql(gen(100_000)).to_arrow_table().rename_columns(
        ["c_int", "c_str", "c_float"])
    want = pa.concat_tables([full.slice(rg * 20_000, 20_000) for rg in groups])
    assert got.to_pylist() == want.select(columns).to_pylist()


def test_a_read_decrypts_and_decodes_one_block_at_a_time_in_one_stretch_of_the_arena(
        db, monkeypatch):
    """A read of row groups far apart decrypts a block into the thread's arena, decodes
    it, then decrypts the next block over the same memory: each block is decoded right
    after it authenticated, and the arena a read touches is its largest block, not the
    sum of them (fresh memory costs more than decrypting into it)."""
    op, _disk, _part, _starts = _apart(db, monkeypatch)
    events = []
    real_buffer, real_decode = _parts._Arena.buffer, _parts._read_row_groups

    def buffer(self, n):
        events.append(("arena", n))
        return real_buffer(self, n)

    monkeypatch.setattr(_parts._Arena, "buffer", buffer)
    monkeypatch.setattr(_parts, "_read_row_groups",
                        lambda *a: events.append(("decode", a[2])) or real_decode(*a))
    try:
        blocks = op._blocks([0, 1, 2, 3, 4], ["c_float"])
        _size, extent = op.span([0, 1, 2, 3, 4], ["c_float"])
        got = op.read([0, 1, 2, 3, 4], ["c_float"])
    finally:
        op.close()
    assert len(blocks) == 5
    assert [e[0] for e in events] == ["arena", "decode"] * 5  # decrypted, decoded, next
    assert [e[1] for e in events if e[0] == "decode"] == [[0], [1], [2], [3], [4]]
    largest = max(n for kind, n in events if kind == "arena")
    assert 4 * largest < extent  # one block's stretch at a time, not all five
    full = db.con.sql(gen(100_000)).to_arrow_table()
    assert got.column("c_float").to_pylist() == full.column(2).to_pylist()


def test_a_tampered_segment_of_a_later_row_group_fails_before_its_decoding(
        tmp_path, db, monkeypatch):
    """Each block of a read authenticates before pyarrow decodes it: a segment altered in
    a later row group's chunk fails the read, the blocks before it were decoded (from
    authenticated plaintext) and dropped, and the tampered one never reached pyarrow; the
    SQL query fails with the segment's error."""
    op, disk, part, starts = _apart(db, monkeypatch)
    seg = op._segment
    index = (starts[3][0] + starts[3][1]) // 2 // seg  # inside row group 3's chunk
    op.close()
    flip_segment_byte(tmp_path / "db" / "data" / part.path, index, seg)
    decoded = []
    real = _parts._read_row_groups
    monkeypatch.setattr(_parts, "_read_row_groups",
                        lambda *a: decoded.append(a[2]) or real(*a))
    op = _parts.open_part(disk, part)
    try:
        with pytest.raises(AuthenticationError, match=f"segment {index}"):
            op.read([0, 1, 2, 3, 4], ["c_float"])
        assert decoded == [[0], [1], [2]]  # one block per row group, in order, up to it
        assert op.read([0, 1], ["c_float"]).num_rows == 40_000  # the others still read
    finally:
        op.close()
    db.cache.clear()
    with pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query("SELECT avg(c_float) FROM t")


def test_a_row_group_read_decrypts_on_the_reading_thread(tmp_path):
    """A scan's threads are its parallelism: a row group's chunks (here 35 segments of
    c_str) are decrypted a few segments per call on the reading thread; the format's own
    thread pool (which splits reads of 8 segments or more) never starts."""
    import subprocess
    import sys

    import cryptdisk

    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql("INSERT INTO t " + gen(70_000))
    child = (
        "import threading, cryptdisk\n"
        "from cryptdisk.db import _partread\n"
        f"db = cryptdisk.connect({str(path)!r}, read_only=True)\n"
        "part = db.table('t').parts[0]\n"
        "op = _partread.open_part(db.config.disks[part.disk], part)\n"
        "got = op.read([0], ['c_int', 'c_str'])\n"
        "assert got.num_rows == 65536 and got.column('c_int')[-1].as_py() == 65535\n"
        "print(sorted({t.name.split('_')[0] for t in threading.enumerate()}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cryptdisk-aead" not in proc.stdout and "MainThread" in proc.stdout


def test_pyarrow_copies_the_flat_types_out_of_uncompressed_pages():
    """What lets the arena hold uncompressed pages: for every type _copied_type admits,
    the decoded arrays of an uncompressed file (plain or dictionary pages, v1 or v2) keep
    nothing of the file's memory, so overwriting it changes no value."""
    import datetime
    import decimal
    import io

    n = 3000
    table = pa.table({
        "i": pa.array([i if i % 7 else None for i in range(n)], pa.int64()),
        "u": pa.array(range(n), pa.uint16()),
        "f": pa.array([i / 3 for i in range(n)], pa.float32()),
        "s": pa.array([f"s{i}" if i % 5 else None for i in range(n)], pa.string()),
        "r": pa.array([f"r{i % 10}" for i in range(n)], pa.large_string()),
        "b": pa.array([i % 2 == 0 for i in range(n)]),
        "bin": pa.array([bytes([i % 256]) * 3 for i in range(n)], pa.binary()),
        "fsb": pa.array([bytes([i % 256]) * 16 for i in range(n)], pa.binary(16)),
        "dec": pa.array([decimal.Decimal(i) / 100 for i in range(n)], pa.decimal128(18, 2)),
        "d": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=i % 300)
                       for i in range(n)], pa.date32()),
        "t": pa.array([i * 1000 for i in range(n)], pa.time64("us")),
        "ts": pa.array([i * 10**6 for i in range(n)], pa.timestamp("us")),
        "dur": pa.array([i for i in range(n)], pa.duration("ms")),
    })
    assert all(_parts._copied_type(f.type) for f in table.schema)
    for dictionary in (False, True):
        for version in ("1.0", "2.0"):
            sink = io.BytesIO()
            pq.write_table(table, sink, compression="NONE", use_dictionary=dictionary,
                           data_page_version=version)
            raw = bytearray(sink.getvalue())
            got = pq.ParquetFile(pa.BufferReader(pa.py_buffer(raw))).read(use_threads=False)
            footer = int.from_bytes(raw[-8:-4], "little")
            raw[4 : len(raw) - footer - 8] = b"\xaa" * (len(raw) - footer - 12)
            assert got.equals(table), (dictionary, version)


@pytest.mark.parametrize("columns", [["c_float"], ["c_int", "c_float"], ["c_str"]])
def test_spans_are_the_span_of_each_prefix(db, monkeypatch, columns):
    """OpenPart.spans gives, in one pass, what a read of each prefix of the row groups
    takes: its chunks' bytes and the arena its blocks fill (each block's stretch, as
    _blocks cuts them), for consecutive, scattered and repeated row groups."""
    op, _disk, _part, _starts = _apart(db, monkeypatch)
    try:
        for groups in ([0, 1, 2, 3, 4], [2, 3], [4, 0, 2], [1, 1, 2], [3]):
            got = op.spans(groups, columns)
            assert len(got) == len(groups)
            for i in range(len(groups)):
                prefix = groups[: i + 1]
                chunks, _compressed = op._chunks(prefix, columns)
                blocks = op._blocks(prefix, columns)
                want = (sum(b - a for a, b in chunks),
                        sum(_parts._ARENA_ALIGN + blk[3] - blk[2] for blk in blocks))
                assert got[i] == want == op.span(prefix, columns), (groups, i)
        assert op.spans([], columns) == [] and op.span([], columns) == (0, 0)
    finally:
        op.close()


def test_runs_cut_by_their_bytes_read_every_row_group_once(db, monkeypatch):
    """A full scan reads runs of consecutive row groups while their chunks stay within
    RUN_BYTES; the row groups a run leaves out are read next, in order, none twice."""
    from cryptdisk.db import _scan

    part, disk = _many_row_groups(db, monkeypatch, rows=40_000)
    op = _parts.open_part(disk, part)
    try:
        pair = max(op.span([rg, rg + 1], ["c_int"])[0] for rg in range(op.num_row_groups - 1))
        triple = min(op.span([rg, rg + 1, rg + 2], ["c_int"])[0]
                     for rg in range(op.num_row_groups - 2))
    finally:
        op.close()
    assert op.num_row_groups == 20 and triple > pair
    monkeypatch.setattr(_scan, "RUN_BYTES", pair)  # two row groups a run, never three
    reads: list[list[int]] = []
    real = _scan.TableScan.read_groups
    monkeypatch.setattr(_scan.TableScan, "read_groups",
                        lambda self, o, groups: reads.append(list(groups)) or real(self, o, groups))
    got = db.query("SELECT sum(c_int), count(*), min(c_int), max(c_int) FROM t")
    want = duckdb.sql("SELECT sum(k), count(*), min(k), max(k) FROM (" + gen(40_000)
                      + ") g(k, s, f)").fetchall()
    assert got == want
    assert sorted(rg for run in reads for rg in run) == list(range(20))
    assert all(run == list(range(run[0], run[0] + len(run))) for run in reads)
    assert max(len(run) for run in reads) == 2


@pytest.mark.parametrize("policy", ["default", "plain"])
def test_a_cold_scan_hands_each_run_to_duckdb_as_one_batch(db, monkeypatch, policy):
    """A full scan's run of row groups whose columns are stored as their values is one
    batch for DuckDB (before: a batch per row group, each with its own Python on the scan
    thread and on the thread feeding DuckDB), while no row group of it is one the cache
    keeps; a second statement, whose reads the cache keeps, gets a batch per row group,
    each cached entry holding its own row group's buffer only (not the run's). With a
    VARCHAR column read too, the run is a batch per row group. The answers are
    DuckDB's."""
    from cryptdisk.db import _scan

    _stored_as_values(db, monkeypatch, _HASHED, rows=200_000, group_rows=5_000,
                      policy=policy)
    runs: list[tuple[list[int], list[int]]] = []
    real = _scan.TableScan.read_groups

    def spy(self, op, groups):
        got = real(self, op, groups)
        runs.append((list(groups), [b.num_rows for b in got]))
        return got

    monkeypatch.setattr(_scan.TableScan, "read_groups", spy)
    sql = "SELECT sum(c_int), sum(c_i32), count(*), min(c_f32) FROM {t}"
    want = db.con.sql(sql.format(t=f"({_HASHED.format(rows=200_000)}) "
                                 "s(c_int, c_str, c_float, c_i32, c_f32)")).fetchall()
    assert db.query(sql.format(t="t")) == want
    long = [r for r in runs if len(r[0]) > 1]
    assert sorted(rg for groups, _rows in runs for rg in groups) == list(range(40))
    assert long and all(rows == [5_000 * len(groups)] for groups, rows in long)
    runs.clear()
    assert db.query(sql.format(t="t")) == want  # (kept by the cache now)
    long = [r for r in runs if len(r[0]) > 1]
    assert long and all(rows == [5_000] * len(groups) for groups, rows in long)
    kept = [n for (_key, column), (_arr, n, _user) in db.cache._items.items()
            if column == "c_int"]
    assert kept and max(kept) < 2 * 5_000 * 8
    runs.clear()
    db.cache.clear()
    with_strings = db.query("SELECT count(DISTINCT c_str), sum(c_int) FROM t")
    assert with_strings == db.con.sql(
        f"SELECT count(DISTINCT s), sum(k) FROM ({_HASHED.format(rows=200_000)}) "
        "g(k, s, f, i, r)").fetchall()
    long = [r for r in runs if len(r[0]) > 1]
    assert long and all(rows == [5_000] * len(groups) for groups, rows in long)


def _stored_as_values(db, monkeypatch, sql, rows=100_000, group_rows=20_000,
                      policy="default"):
    """A one-part table of ``sql``'s rows in row groups of ``group_rows``, every column
    stored uncompressed (LZ4 never chosen), as hashes and random floats are; on the
    disks of storage policy ``policy`` (``plain``: unencrypted)."""
    from cryptdisk.db import _parts as writer

    monkeypatch.setattr(writer, "ROW_GROUP_ROWS", group_rows)
    monkeypatch.setattr(writer, "COMPRESSION_MIN_SAVING", 2.0)  # nothing saves 200%
    db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE, c_i32 INTEGER, "
           f"c_f32 REAL) SETTINGS storage_policy = '{policy}'")
    db.sql("INSERT INTO t " + sql.format(rows=rows))
    part = db.table("t").parts[0]
    disk = db.config.disks[part.disk]
    assert disk.is_encrypted == (policy != "plain")
    return part, disk


_HASHED = ("SELECT (hash(i) >> 1)::BIGINT, md5(i::VARCHAR), i / 7, (hash(i) >> 40)::INTEGER, "
           "(i / 3)::REAL FROM range({rows}) r(i)")


@pytest.mark.parametrize("policy", ["default", "plain"])
@pytest.mark.parametrize("columns", [["c_int"], ["c_float"], ["c_int", "c_float"],
                                     ["c_i32", "c_f32"]])
def test_a_read_of_columns_stored_as_their_values_builds_no_parquet_reader(
        db, monkeypatch, columns, policy):
    """Uncompressed, PLAIN, REQUIRED BIGINT/INTEGER/DOUBLE/REAL chunks are read into
    buffers of their own size, encrypted ones decrypted and their pages' values moved
    over the page headers, plain ones read page by page into place: the same arrays as
    pyarrow's decoding, for single and several row groups, with no Parquet reader
    (before, a reader per row group decoded them, and a plain part's always); with a
    VARCHAR column of hashes (strings of one length) beside them, too."""
    part, disk = _stored_as_values(db, monkeypatch, _HASHED, policy=policy)
    want = _parts.read_part(disk, part, [*columns, "c_str"])
    op = _parts.open_part(disk, part)
    decoded = []
    real = _parts._read_row_groups
    monkeypatch.setattr(_parts, "_read_row_groups",
                        lambda *a: decoded.append(a[2]) or real(*a))
    try:
        assert op.num_row_groups == 5
        runs = pa.concat_tables([op.read([0, 1, 2], columns), op.read([3], columns),
                                 op.read([4], columns)])
        assert decoded == []
        for c in columns:
            assert runs.column(c).to_pylist() == want.column(c).to_pylist()
            assert runs.schema.field(c).type == want.schema.field(c).type
        for chunk in runs.column(columns[0]).chunks:  # aligned buffers of the values
            assert chunk.buffers()[1].address % 8 == 0
        mixed = op.read([1], [*columns, "c_str"])
        assert decoded == []
        assert mixed.equals(want.slice(20_000, 20_000))
    finally:
        op.close()
    sums = ", ".join(f"sum({c})" for c in columns)
    got = db.query(f"SELECT {sums} FROM t")
    want = db.con.sql(f"SELECT {sums} FROM ({_HASHED.format(rows=100_000)}) "
                      "s(c_int, c_str, c_float, c_i32, c_f32)").fetchall()
    # (floating sums: DuckDB's threads add them in any order)
    assert got[0] == pytest.approx(want[0], rel=1e-12)


@pytest.mark.parametrize("policy", ["default", "plain"])
@pytest.mark.parametrize("columns", [["c_int"], ["c_int", "c_float"], ["c_i32", "c_f32"]])
def test_a_joined_read_is_one_array_over_one_buffer_per_column(db, monkeypatch, columns,
                                                                policy):
    """``read(..., joined=True)`` of several row groups gives each column stored as its
    values as one array over one aligned buffer (the chunks' values one after another),
    equal to the per row group read; a VARCHAR column beside them keeps a chunk per row
    group. Before, every chunk was an array of its own (``joined`` did not exist)."""
    part, disk = _stored_as_values(db, monkeypatch, _HASHED, policy=policy)
    want = _parts.read_part(disk, part, [*columns, "c_str"])
    op = _parts.open_part(disk, part)
    try:
        got = op.read([1, 2, 3, 4], [*columns, "c_str"], joined=True)
        single = op.read([0], columns, joined=True)
    finally:
        op.close()
    assert got.equals(want.slice(20_000))
    assert single.equals(want.select(columns).slice(0, 20_000))
    for c in columns:
        (arr,) = got.column(c).chunks
        assert arr.buffers()[1].address % 8 == 0
        assert arr.buffers()[1].size == 80_000 * arr.type.bit_width // 8
    assert got.column("c_str").num_chunks == 4


def test_a_plain_part_whose_page_index_moved_a_page_is_refused_not_misread(
        db, monkeypatch, tmp_path):
    """A plain part's page index is not authenticated: its second page of the first
    BIGINT chunk moved 8 bytes (one value) later, consistently with the chunk (the
    pages still tile it, the counts still add up), made the direct read take 8 bytes of
    that page's header as the first page's last value and drop its first: every read
    answered a wrong sum, silently. Now each page header read aside is checked to be the
    header of a page of those values, and the read fails with a clear CatalogError."""
    import cryptdisk
    from cryptdisk.errors import CatalogError

    part, disk = _stored_as_values(db, monkeypatch, _HASHED, policy="plain")
    op = _parts.open_part(disk, part)
    try:
        raw = op.meta.metadata[part_writer.PAGES_KEY]
        chunks = op.num_row_groups * op.meta.num_columns
        path = op._local
        assert path is not None and op.indexed(0, 0) and len(op._pages[(0, 0)]) > 1
        first = op._pages[(0, 0)][0]  # an intact header passes the field by field check
        with open(path, "rb") as f:
            f.seek(first.start)
            head = f.read(first.end - first.start - 8 * first.rows)
        assert head.startswith(_granule.plain_page_prefix(first.rows, 8 * first.rows))
        assert _granule.plain_page_problem(head, first.rows, 8 * first.rows) is None
        assert "values where" in _granule.plain_page_problem(
            head, first.rows + 1, 8 * first.rows)
    finally:
        op.close()
    db.close()
    with open(path, "rb") as f:
        data = bytearray(f.read())
    moved = bytearray(raw)
    at = 4 * (2 + chunks + 2)  # chunk 0's second page: its offset
    offset = int.from_bytes(moved[at : at + 4], "little")
    moved[at : at + 4] = (offset + 8).to_bytes(4, "little")
    assert data.count(raw) == 2  # (the footer's and the lookup block's copies)
    data = bytearray(bytes(data).replace(raw, bytes(moved)))
    with open(path, "r+b") as f:
        f.write(data)
    with cryptdisk.connect(tmp_path / "db") as again:
        with pytest.raises(CatalogError, match="is damaged: column 'c_int'") as info:
            again.query("SELECT sum(c_int) FROM t")
        assert "restore the part from a backup" in str(info.value.hint)
        # the other columns' chunks are intact: they still read
        assert again.query("SELECT count(c_float) FROM t") == [(100_000,)]


@pytest.mark.parametrize("policy", ["default", "plain"])
def test_a_read_of_values_with_nulls_or_a_dictionary_decodes_through_pyarrow(
        db, monkeypatch, policy):
    """A column with NULLs (OPTIONAL: levels before its values) or a dictionary is not
    stored as its values: pyarrow decodes it, and the answers are the same."""
    sql = ("SELECT (hash(i) >> 1)::BIGINT, md5(i::VARCHAR), CASE WHEN i % 3 = 0 THEN NULL "
           "ELSE i / 7 END, (i % 5)::INTEGER, (i / 3)::REAL FROM range({rows}) r(i)")
    part, disk = _stored_as_values(db, monkeypatch, sql, policy=policy)
    op = _parts.open_part(disk, part)
    decoded = []
    real = _parts._read_row_groups
    monkeypatch.setattr(_parts, "_read_row_groups",
                        lambda *a: decoded.append(a[2]) or real(*a))
    try:
        floats = op.read([0, 1], ["c_float"])
        small = op.read([2], ["c_i32"])  # five distinct values: a dictionary
        assert decoded == [[0, 1], [2]] or decoded == [[0], [1], [2]]
        assert op.read([3], ["c_int"]).num_rows == 20_000
        assert len(decoded) in (2, 3)  # (the BIGINT hashes: their values, no reader)
    finally:
        op.close()
    assert floats.column(0).null_count == sum(1 for i in range(40_000) if i % 3 == 0)
    assert small.column(0).to_pylist() == [i % 5 for i in range(40_000, 60_000)]


def test_a_tampered_segment_of_a_chunk_read_as_values_fails_the_read(
        tmp_path, db, monkeypatch):
    """A chunk read as its values authenticates every segment before the read returns: a
    byte changed inside row group 3's c_int chunk fails the read with that segment's error
    and hands back nothing, and the SQL query fails the same way."""
    part, disk = _stored_as_values(db, monkeypatch, _HASHED)
    op = _parts.open_part(disk, part)
    seg = op._segment
    start, end = _parts._chunk_start_end(op.meta.row_group(3).column(0))
    index = (start + end) // 2 // seg
    op.close()
    flip_segment_byte(tmp_path / "db" / "data" / part.path, index, seg)
    op = _parts.open_part(disk, part)
    try:
        with pytest.raises(AuthenticationError, match=f"segment {index}"):
            op.read([0, 1, 2, 3, 4], ["c_int"])
        assert op.read([0, 1], ["c_int"]).num_rows == 40_000  # the others still read
    finally:
        op.close()
    db.cache.clear()
    with pytest.raises(AuthenticationError, match=f"segment {index}"):
        db.query("SELECT sum(c_int) FROM t")


@pytest.fixture(params=["native", "cryptography"])
def sealed_backend(request, monkeypatch):
    """Sealed files through the C extension, or through its fallback (``cryptography``)."""
    from cryptdisk.format import _sealed

    if request.param == "native":
        if _sealed._cseal is None:
            pytest.skip("cryptdisk.format._cseal not built")
        if not _sealed._SPANS:
            pytest.skip("cryptdisk.format._cseal built without decrypt_spans: rebuild it")
    else:
        monkeypatch.setattr(_sealed, "_cseal", None)
    return request.param


def test_an_encrypted_chunk_read_as_values_is_one_packed_read(db, monkeypatch, sealed_backend):
    """Each encrypted chunk stored as its values is one packed read of the sealed file
    (with the C extension one call that releases the GIL once: the chunk's shared first
    and last segments, the run between them and its pages' values moved over their
    headers; before, the decryption's three calls and a Python loop moving the pages):
    the same arrays as pyarrow's decoding through both backends."""
    from cryptdisk.format import SealedReader

    part, disk = _stored_as_values(db, monkeypatch, _HASHED)
    want = _parts.read_part(disk, part, ["c_int", "c_float", "c_i32"])
    packed, ranged = [], []
    real_packed, real_ranged = SealedReader.readinto_spans, SealedReader.readinto_at
    monkeypatch.setattr(SealedReader, "readinto_spans",
                        lambda self, *a: packed.append(a[1]) or real_packed(self, *a))
    monkeypatch.setattr(SealedReader, "readinto_at",
                        lambda self, *a, **k: ranged.append(a[1]) or real_ranged(self, *a, **k))
    op = _parts.open_part(disk, part)
    try:
        ranged.clear()
        got = pa.concat_tables([op.read([0, 1, 2], ["c_int", "c_float", "c_i32"]),
                                op.read([3, 4], ["c_int", "c_float", "c_i32"])])
        starts = sorted(_parts._chunk_start_end(op.meta.row_group(rg).column(j))[0]
                        for rg in range(5) for j in (0, 2, 3))
    finally:
        op.close()
    assert got.equals(want)
    assert sorted(packed) == starts  # one packed read a chunk
    # the C extension reads no chunk's range besides; the fallback decrypts each one's
    # (the other reads are the footer's page index, read when first needed)
    assert set(ranged) & set(starts) == (set() if sealed_backend == "native" else set(starts))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_flipped_byte_in_a_chunk_read_as_values_fails_the_read_on_both_backends(
        tmp_path, db, monkeypatch, sealed_backend, where):
    """A changed byte in the first (shared with the chunk before), a middle or the last
    (shared with the chunk after) segment of row group 3's BIGINT chunk fails a read of
    it with that segment's error and hands back no array; the row groups away from it
    still read, the same through the C extension and its fallback."""
    part, disk = _stored_as_values(db, monkeypatch, _HASHED)
    op = _parts.open_part(disk, part)
    seg = op._segment
    start, end = _parts._chunk_start_end(op.meta.row_group(3).column(0))
    first, last = start // seg, (end - 1) // seg
    assert last - first >= 2 and start % seg and end % seg  # shared edges, a middle
    index = {"first": first, "middle": (first + last) // 2, "last": last}[where]
    op.close()
    flip_segment_byte(tmp_path / "db" / "data" / part.path, index, seg)
    op = _parts.open_part(disk, part)
    try:
        with pytest.raises(AuthenticationError, match=f"segment {index} "):
            op.read([3], ["c_int"])
        with pytest.raises(AuthenticationError, match=f"segment {index} "):
            op.read([2, 3, 4], ["c_int"])
        with pytest.raises(AuthenticationError, match=f"segment {index} "):
            op.read([2, 3, 4], ["c_int"], joined=True)
        assert op.read([0, 1], ["c_int"]).num_rows == 40_000
        assert op.read([0, 1], ["c_int"], joined=True).num_rows == 40_000
    finally:
        op.close()

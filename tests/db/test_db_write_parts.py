"""Writing parts: the dictionary and codec choice per column and the prefetching of the source."""

import hashlib
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk.db import _parts
from cryptdisk.db._parts import _Prefetch, column_compression, dictionary_columns


def _batch(n):
    return pa.RecordBatch.from_pydict({
        "k": pa.array(range(n), pa.int64()),
        "s": pa.array([f"{i:032x}" for i in range(n)], pa.string()),
        "city": pa.array(["paris", "oslo", "lima"] * (n // 3) + ["rome"] * (n % 3)),
        "f": pa.array([float(i % 7) for i in range(n)], pa.float64()),
    })


def test_unique_columns_go_without_a_dictionary():
    b = _batch(30_000)
    assert dictionary_columns(b, b.schema) == ["city", "f"]
    assert dictionary_columns(b.slice(0, 100), b.schema) is True  # too few rows to judge
    nested = pa.schema([("l", pa.list_(pa.int64())), ("k", pa.int64())])
    assert dictionary_columns(pa.RecordBatch.from_pydict(
        {"l": [[i] for i in range(5000)], "k": list(range(5000))}, schema=nested),
        nested) is True


def test_an_insert_writes_each_column_as_chosen_and_reads_back(tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, city VARCHAR, f DOUBLE) ORDER BY k "
               "SETTINGS storage_policy = 'plain'")
        db.insert("t", pa.Table.from_batches([_batch(30_000)]))
        (path,) = db.query("SELECT path FROM system.parts")[0]
        assert db.query("SELECT count(DISTINCT s), count(*), min(city), sum(f) FROM t") == \
            [(30_000, 30_000, "lima", sum(float(i % 7) for i in range(30_000)))]
        disk = db.config.disks["plain"]
        with disk.open_read(path) as f:
            meta = pq.ParquetFile(f).metadata
        encodings = {meta.schema.column(j).name: meta.row_group(0).column(j).encodings
                     for j in range(meta.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["s"] and "RLE_DICTIONARY" not in encodings["k"]
    assert "RLE_DICTIONARY" in encodings["city"] and "RLE_DICTIONARY" in encodings["f"]


def test_a_source_error_reaches_the_writer_and_the_thread_ends():
    def source():
        yield _batch(10)
        raise ValueError("the source broke")

    p = _Prefetch(source())
    assert p.next().num_rows == 10
    with pytest.raises(ValueError, match="the source broke"):
        p.next()
    p.close()
    assert not any(t.name == "cryptdisk-insert-source" and t.is_alive()
                   for t in threading.enumerate())


def test_closing_early_stops_pulling_the_source():
    pulled = []

    def source():
        for i in range(1000):
            pulled.append(i)
            yield _batch(3)

    p = _Prefetch(source(), depth=2)
    p.next()
    p.close()  # the writer failed: the source must not be read to its end
    assert len(pulled) < 10


def test_a_failing_write_leaves_no_part_and_no_thread(tmp_path, monkeypatch):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
        monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 100)

        def broken(*a, **k):
            raise OSError("disk full")

        monkeypatch.setattr(_parts._NaNGroups, "add", broken)
        with pytest.raises(OSError, match="disk full"):
            db.sql("INSERT INTO t SELECT range FROM range(500000)")
        assert db.query("SELECT count(*) FROM t") == [(0,)]
    assert not any(t.name == "cryptdisk-insert-source" and t.is_alive()
                   for t in threading.enumerate())


def _mixed(n):
    return pa.RecordBatch.from_pydict({
        "k": pa.array(range(n), pa.int64()),
        "h": pa.array([hashlib.md5(str(i).encode()).hexdigest() for i in range(n)]),
        "text": pa.array([f"order {i % 50} shipped to warehouse {i % 7}" for i in range(n)]),
    })


def test_near_random_columns_go_uncompressed():
    b = _mixed(20_000)
    dictionary = dictionary_columns(b, b.schema)
    assert column_compression(b, b.schema, dictionary) == {"k": "lz4", "h": "none",
                                                           "text": "lz4"}
    assert column_compression(b.slice(0, 100), b.schema, True) == "lz4"  # too few rows
    dotted = pa.schema([("a.b", pa.string())])
    assert column_compression(pa.RecordBatch.from_pydict(
        {"a.b": b.column(1)}, schema=dotted), dotted, True) == "lz4"


def test_an_insert_writes_each_codec_as_chosen_and_reads_back(tmp_path):
    b = _mixed(20_000)
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, h VARCHAR, text VARCHAR) ORDER BY k")
        db.insert("t", pa.Table.from_batches([b]))
        assert db.query("SELECT count(DISTINCT h), max(text), sum(k) FROM t") == \
            [(20_000, "order 9 shipped to warehouse 6", sum(range(20_000)))]
        (path,) = db.query("SELECT path FROM system.parts")[0]
        disk = db.config.disks["default"]
        with disk.open_read(path) as f:
            meta = pq.ParquetFile(f).metadata
    codecs = {meta.schema.column(j).name: meta.row_group(0).column(j).compression
              for j in range(meta.num_columns)}
    assert codecs == {"k": "LZ4", "h": "UNCOMPRESSED", "text": "LZ4"}


def test_parts_written_at_once_never_share_a_key_and_nonce(tmp_path):
    """Parts written by concurrent threads on one disk and key: each part file has its own
    random data key (and file id), and segment ``i`` of a file is sealed under nonce
    ``(i, last)`` (checked with cryptography's AESGCM alone), so no (key, nonce) pair repeats."""
    from concurrent.futures import ThreadPoolExecutor

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from cryptdisk import Keyring
    from cryptdisk.disks import EncryptedDisk, LocalDisk
    from cryptdisk.format import HEADER_SIZE, TAG_SIZE, Header, open_header, sealed_nonce

    keyring = Keyring.generate()
    disk = EncryptedDisk("e", LocalDisk("raw", tmp_path), keyring, segment_size=4096)
    batch = _mixed(20_000)

    def write(n):
        batches = [batch.slice(i, 5_000) for i in range(0, batch.num_rows, 5_000)]
        return _parts.write_parts(disk, f"t{n}", batches, batch.schema, version=1,
                                  max_rows=10_000)

    with ThreadPoolExecutor(4) as pool:
        parts = [p for ps in pool.map(write, range(4)) for p in ps]
    assert len(parts) == 8
    keys, ids = set(), set()
    for part in parts:
        raw = (tmp_path / part.path).read_bytes()
        header = Header.parse(raw[:HEADER_SIZE])
        dek = open_header(header, keyring)
        keys.add(dek)
        ids.add(header.file_id)
        record = header.segment_size + TAG_SIZE
        body = raw[HEADER_SIZE:]
        count = -(-len(body) // record)
        plain = b"".join(
            AESGCM(dek).decrypt(sealed_nonce(i, i == count - 1),
                                body[i * record:(i + 1) * record], None)
            for i in range(count))
        assert len(plain) == part.bytes and plain[:4] == b"PAR1"
    assert len(keys) == len(ids) == len(parts)


def test_row_groups_are_whole_whatever_the_batch_sizes(tmp_path, monkeypatch):
    """A merge's sorted source may start with a batch of a few rows: it no longer becomes a
    row group of its own (nor alone decides the encodings: too few rows to judge meant a
    dictionary and LZ4 for every column); parts end at max_rows exactly."""
    from cryptdisk.disks import LocalDisk

    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 8192)
    whole = _mixed(60_000)
    sizes = [5, 12_000, 3, 30_000, 17_992]
    batches, at = [], 0
    for n in sizes:
        batches.append(whole.slice(at, n))
        at += n
    disk = LocalDisk("raw", tmp_path)
    parts = _parts.write_parts(disk, "t", batches, whole.schema, version=1, max_rows=40_960)
    assert [p.rows for p in parts] == [40_960, 19_040]
    got = []
    for part in parts:
        meta = pq.read_metadata(tmp_path / part.path)
        rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        assert all(n == 8192 for n in rows[:-1]) and 0 < rows[-1] <= 8192
        h = meta.schema.names.index("h")
        assert not meta.row_group(0).column(h).has_dictionary_page  # judged on 20k rows
        assert meta.row_group(0).column(h).compression == "UNCOMPRESSED"
        got.append(pq.read_table(tmp_path / part.path))
    assert pa.concat_tables(got).equals(pa.Table.from_batches([whole]))


def _stats_bounds(meta, column):
    j = meta.schema.names.index(column)
    return [(meta.row_group(i).column(j).statistics.min, meta.row_group(i).column(j).statistics.max)
            for i in range(meta.num_row_groups)]


@pytest.mark.parametrize("typ", ["BIGINT", "INTEGER", "SMALLINT"])
def test_a_signed_integer_key_has_its_bounds_in_the_footer(tmp_path, monkeypatch, typ):
    """Each row group's key min/max are written beside the statistics, equal to them, and
    an opened part reads them from there (not one statistics object per row group)."""
    from cryptdisk.db._partread import open_part
    from cryptdisk.db._parts import KEY_BOUNDS_KEY, key_bounds

    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql(f"CREATE TABLE t (k {typ}, v VARCHAR) ORDER BY k "
               "SETTINGS storage_policy = 'plain'")
        db.sql("INSERT INTO t SELECT (i * 7919) % 30011 - 15000, i::VARCHAR FROM range(9500) r(i)")
        db.sql("OPTIMIZE TABLE t FINAL")  # the merge's writer too
        (part,) = db.table("t").parts
        with db.config.disks["plain"].open_read(part.path) as f:
            meta = pq.ParquetFile(f).metadata
        want = _stats_bounds(meta, "k")
        assert len(want) == 10
        assert key_bounds(meta.metadata, "k", meta.num_row_groups) == want
        assert meta.metadata[KEY_BOUNDS_KEY].startswith(b"k\0")
        op = db._open_parts.get(part)
        assert op.ranges("k") == want and op.key_range("k") == (want[0][0], want[-1][1])
        fresh = open_part(db.config.disks["plain"], part)

        class NoStatistics:  # the footer, but its row groups' statistics are not read
            def __init__(self, meta):
                self._meta = meta

            def __getattr__(self, name):
                if name == "row_group":
                    raise AssertionError("read the row groups' statistics")
                return getattr(self._meta, name)

        fresh.meta = NoStatistics(fresh.meta)
        assert fresh.ranges("k") == want
        assert db.query("SELECT v FROM t WHERE k = -15000 + 7919 * 3 % 30011") == [("3",)]


def test_no_key_bounds_for_null_keys_or_other_types(tmp_path, monkeypatch):
    """A key with a NULL, or not a signed integer, has only its statistics."""
    from cryptdisk.db._parts import KEY_BOUNDS_KEY

    monkeypatch.setattr(_parts, "ROW_GROUP_ROWS", 1000)
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE n (k BIGINT, v BIGINT) ORDER BY k SETTINGS storage_policy = 'plain'")
        db.sql("INSERT INTO n SELECT CASE WHEN i % 10 = 0 THEN NULL ELSE i END, i "
               "FROM range(3000) r(i)")
        db.sql("CREATE TABLE s (k VARCHAR, v BIGINT) ORDER BY k SETTINGS storage_policy = 'plain'")
        db.sql("INSERT INTO s SELECT i::VARCHAR, i FROM range(3000) r(i)")
        for t in "ns":
            (part,) = db.table(t).parts
            with db.config.disks["plain"].open_read(part.path) as f:
                meta = pq.ParquetFile(f).metadata
            assert KEY_BOUNDS_KEY not in (meta.metadata or {})
            assert db._open_parts.get(part).ranges("k") == _stats_bounds(meta, "k")
        assert db.query("SELECT count(*) FROM n WHERE k = 7") == [(1,)]
        assert db.query("SELECT count(*) FROM s WHERE k = '7'") == [(1,)]


def test_key_bounds_that_do_not_fit_the_part_are_ignored():
    import array

    from cryptdisk.db._parts import KEY_BOUNDS_KEY, key_bounds

    raw = array.array("q", [1, 5, 4, 9]).tobytes()  # mins 1, 5; maxs 4, 9
    assert key_bounds({KEY_BOUNDS_KEY: b"k\0" + raw}, "k", 2) == [(1, 4), (5, 9)]
    assert key_bounds({KEY_BOUNDS_KEY: b"k\0" + raw}, "k", 3) is None  # other row groups
    assert key_bounds({KEY_BOUNDS_KEY: b"k\0" + raw}, "v", 2) is None  # another column
    assert key_bounds({KEY_BOUNDS_KEY: b"k" + raw}, "k", 2) is None  # no separator
    assert key_bounds({KEY_BOUNDS_KEY: b"k\0" + raw[:-1]}, "k", 2) is None
    assert key_bounds({}, "k", 2) is None and key_bounds(None, "k", 2) is None

"""Database.import_parts: parts that cryptdisk wrote, added to a table without re-encoding."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk.errors import DatabaseError

from .dbhelpers import gen


def _source(tmp_path, rows=3000, order=" ORDER BY c_int"):
    src = cryptdisk.connect(tmp_path / "src")
    src.sql(f"CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE){order}")
    src.sql(f"INSERT INTO t {gen(rows)}")
    src.sql(f"INSERT INTO t {gen(rows // 3, start=rows)}")
    return src


def _streams(db, table="t"):
    """Each part of ``table`` as a plaintext stream, read through its disk."""
    for part in db.table(table).parts:
        with db.config.disks[part.disk].open_read(part.path) as f:
            yield io.BytesIO(f.read())


def _target(tmp_path, order=" ORDER BY c_int"):
    dst = cryptdisk.connect(tmp_path / "dst")
    dst.sql(f"CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE){order}")
    return dst


def test_imported_parts_equal_the_source_and_pass_check(tmp_path) -> None:
    src = _source(tmp_path)
    dst = _target(tmp_path)
    copied: list[int] = []
    assert dst.import_parts("t", _streams(src), on_bytes=copied.append) == 4000
    got, want = dst.table("t").parts, src.table("t").parts
    assert [(p.id, p.rows, p.bytes, p.sha256) for p in got] == [
        (p.id, p.rows, p.bytes, p.sha256) for p in want]  # the bytes as they were
    assert sum(copied) == sum(p.bytes for p in want)
    assert [(p.key_min, p.key_max) for p in got] == [(0, 2999), (3000, 3999)]
    assert all(p.encrypted and p.key_id is not None for p in got)  # under dst's key
    assert dst.check() == 2
    q = "SELECT * FROM t ORDER BY c_int"
    assert dst.query(q) == src.query(q)
    assert [p for p, _g in dst.scan_plan("t", [("c_int", ">=", 3500)])] == [got[1].id]
    dst.close()
    reopened = cryptdisk.connect(tmp_path / "dst", read_only=True)
    assert reopened.query(q) == src.query(q)
    reopened.close()
    src.close()


def _refused(dst, parts, match: str) -> None:
    version = dst.catalog.version
    with pytest.raises(DatabaseError, match=match):
        dst.import_parts("t", parts)
    assert dst.catalog.version == version and dst.table("t").parts == []


def test_parquet_not_written_by_cryptdisk_is_refused(tmp_path) -> None:
    dst = _target(tmp_path)
    buf = io.BytesIO()
    pq.write_table(pa.table({"c_int": pa.array([1], pa.int64()), "c_str": ["a"],
                             "c_float": [1.0]}), buf)
    buf.seek(0)
    _refused(dst, [buf], "not a part cryptdisk wrote")
    _refused(dst, [io.BytesIO(b"not parquet at all")], "not a Parquet file")
    dst.close()


def test_other_columns_and_an_id_already_present_are_refused(tmp_path) -> None:
    src = _source(tmp_path)
    other = cryptdisk.connect(tmp_path / "other")
    other.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR)")
    other.sql("INSERT INTO t VALUES (1, 'x')")
    dst = _target(tmp_path)
    _refused(dst, list(_streams(other)), "has columns")
    # all or nothing: a good part before a bad one is not published either
    _refused(dst, [*_streams(src), *_streams(other)], "has columns")
    first = next(_streams(src))
    _refused(dst, [first, io.BytesIO(first.getvalue())], "already has part")
    dst.close()
    other.close()
    src.close()


def test_parts_optimize_wrote_without_nulls_import_into_nullable_columns(tmp_path) -> None:
    # OPTIMIZE stores a column with no NULLs as Parquet REQUIRED; the table's columns stay
    # nullable, so such a part is the table's columns (a backup restores it this way)
    src = _source(tmp_path)
    src.sql("OPTIMIZE TABLE t FINAL")
    [stream] = list(_streams(src))
    assert not any(f.nullable for f in pq.read_schema(io.BytesIO(stream.getvalue())))
    dst = _target(tmp_path)
    assert dst.import_parts("t", [stream]) == 4000
    dst.sql("INSERT INTO t VALUES (NULL, NULL, NULL)")  # still nullable
    q = "SELECT count(*), count(c_int), sum(c_int), max(c_str) FROM t"
    assert dst.query(q) == [(4001, 4000, sum(range(4000)),
                             src.query("SELECT max(c_str) FROM t")[0][0])]
    assert dst.check() == 2
    dst.close()
    src.close()


def test_inserted_parts_with_required_columns_of_another_type_are_refused(tmp_path) -> None:
    # an insert stores the columns a block has no NULL in as Parquet REQUIRED: a REQUIRED
    # column still has to be of the table's type, and one with NULLs imports as well
    other = cryptdisk.connect(tmp_path / "other")
    other.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float BIGINT) ORDER BY c_int")
    other.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), i FROM range(100) r(i)")
    other.sql("INSERT INTO t VALUES (1000, NULL, 7)")
    streams = list(_streams(other))
    assert [[f.nullable for f in pq.read_schema(io.BytesIO(s.getvalue()))]
            for s in streams] == [[False, False, False], [False, True, False]]
    dst = _target(tmp_path)
    _refused(dst, streams[:1], "has columns")
    src = cryptdisk.connect(tmp_path / "src")
    src.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) ORDER BY c_int")
    src.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), i / 7 FROM range(100) r(i)")
    src.sql("INSERT INTO t VALUES (1000, NULL, 7)")
    assert dst.import_parts("t", _streams(src)) == 101
    q = "SELECT count(*), count(c_str), sum(c_int), max(c_str) FROM t"
    assert dst.query(q) == src.query(q) and dst.check() == 2
    for d in (dst, src, other):
        d.close()


def test_a_failing_stream_publishes_nothing(tmp_path) -> None:
    src = _source(tmp_path)
    data = next(_streams(src)).getvalue()

    class Broken:
        def __init__(self) -> None:
            self.f = io.BytesIO(data)

        def read(self, n: int = -1) -> bytes:
            if self.f.tell() > len(data) // 2:
                raise OSError("the source went away")
            return self.f.read(min(n, 4096))

    dst = _target(tmp_path)
    with pytest.raises(OSError, match="went away"):
        dst.import_parts("t", [Broken()])
    assert dst.table("t").parts == []
    dst.sql(f"INSERT INTO t {gen(5)}")  # the next commit removes what the import left
    assert dst.check() == 1
    disk = dst.config.disks[dst.table("t").parts[0].disk]
    assert len(disk.list(dst.table("t").prefix(dst.catalog.db_id))) == 1
    dst.close()
    src.close()


def test_read_only_database_refuses_import(tmp_path) -> None:
    src = _source(tmp_path)
    src.close()
    ro = cryptdisk.connect(tmp_path / "src", read_only=True)
    with pytest.raises(DatabaseError, match="read-only"):
        ro.import_parts("t", [])
    ro.close()

"""Database.stream and Reader.stream: a query's rows batch by batch, from one snapshot of
the tables, its parts kept until it is closed; errors raise, never a short result."""

from __future__ import annotations

import gc
import os
import threading
import warnings

import pyarrow as pa
import pytest

import cryptdisk
from cryptdisk.db import Stream, _partread
from cryptdisk.db import _parts as part_writer
from cryptdisk.errors import AuthenticationError, DatabaseError, TableNotFoundError
from cryptdisk.format import HEADER_SIZE

from .dbhelpers import SCHEMA, gen


@pytest.fixture
def db(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        database = cryptdisk.connect(tmp_path / "db", cache_bytes=0)
    database.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    database.sql("INSERT INTO t " + gen(30_000))
    database.sql("INSERT INTO t " + gen(30_000, 30_000))
    yield database
    database.close()


def _files(tmp_path):
    return sorted((tmp_path / "db" / "data").rglob("*.parquet"))


def _released(db):
    return db._readers_running == 0 and not db._doomed_parts and all(
        s.closed for s in db._streams)


@pytest.mark.parametrize(("sql", "parameters"), [
    ("SELECT * FROM t", None),
    ("SELECT c_int, c_str FROM t WHERE c_int BETWEEN ? AND ? ORDER BY c_int", [100, 45_000]),
    ("SELECT substr(c_str, 1, 1) AS p, count(*), sum(c_int) FROM t GROUP BY p ORDER BY p",
     None),
    ("SELECT count(*) FROM t", None),  # (answered from the catalog)
    ("SELECT c_int FROM t WHERE c_int < 0", None),  # no rows
    ("SELECT 340282366920938463463374607431768211455::UHUGEINT AS u, c_int FROM t "
     "ORDER BY c_int LIMIT 3", None),
    ("DESCRIBE t", None),
])
@pytest.mark.parametrize("batch_rows", [1000, 65536])
def test_a_stream_gives_what_sql_gives(db, sql, parameters, batch_rows):
    want = db.sql(sql, parameters)
    with db.stream(sql, parameters, batch_rows=batch_rows) as s:
        assert s.schema == want.schema
        batches = list(s)
        assert s.closed  # (its end released it)
    assert all(b.num_rows <= batch_rows for b in batches)
    assert pa.Table.from_batches(batches, want.schema).equals(want)
    assert _released(db)


def test_a_stream_hands_its_rows_over_in_batches_as_arrow_consumers_read(db):
    s = db.stream("SELECT c_int FROM t ORDER BY c_int", batch_rows=2048)
    first = s.read_next_batch()
    assert first.num_rows == 2048 and first.column(0)[0].as_py() == 0
    rest = pa.RecordBatchReader.from_stream(s).read_all()  # (the Arrow C stream)
    assert first.num_rows + rest.num_rows == 60_000
    with pytest.raises(StopIteration):
        s.read_next_batch()
    assert _released(db)


def test_a_stream_reads_the_tables_as_they_were_when_it_started(db, tmp_path):
    """An insert and a merge (OPTIMIZE deletes the parts it merged) commit while a stream
    is open: it gives the rows of the catalog it started from, read from the parts it
    started from, which stay on disk until it is closed."""
    want = db.sql("SELECT * FROM t").num_rows
    parts = len(_files(tmp_path))
    s = db.stream("SELECT * FROM t", batch_rows=2048)
    got = s.read_next_batch().num_rows
    db.sql("INSERT INTO t " + gen(5, 60_000))  # the database runs statements meanwhile
    db.sql("OPTIMIZE TABLE t FINAL")
    assert db.query("SELECT count(*) FROM system.parts") == [(1,)]
    assert len(_files(tmp_path)) == parts + 2  # the new part, the merged one; old kept
    got += sum(b.num_rows for b in s)
    assert got == want
    assert _released(db)
    assert len(_files(tmp_path)) == 1
    assert db.query("SELECT count(*) FROM t") == [(want + 5,)]


def test_closing_a_stream_early_releases_its_parts_and_cursor(db, tmp_path):
    s = db.stream("SELECT * FROM t", batch_rows=1000)
    s.read_next_batch()
    db.sql("OPTIMIZE TABLE t FINAL")
    assert db._readers_running == 1 and db._doomed_parts
    s.close()
    assert s.closed and _released(db)
    assert len(_files(tmp_path)) == 1
    s.close()  # (again: nothing)
    with pytest.raises(DatabaseError, match="closed"):
        s.read_next_batch()
    with db.stream("SELECT * FROM t") as s2:
        s2.read_next_batch()
    assert s2.closed and _released(db)


def test_a_stream_dropped_unclosed_is_released_when_collected(db):
    s = db.stream("SELECT * FROM t", batch_rows=1000)
    s.read_next_batch()
    assert db._readers_running == 1
    del s
    gc.collect()
    assert _released(db)


def test_closing_the_database_closes_its_streams(tmp_path, db):
    s = db.stream("SELECT * FROM t", batch_rows=1000)
    s.read_next_batch()
    db.close()
    assert s.closed
    with pytest.raises(DatabaseError, match="closed"):
        s.read_next_batch()


def test_a_readers_stream_holds_the_reader_until_it_is_closed(db):
    r = db.reader()
    r.configure("SET integer_division = true")  # (a setting of the reader's cursor)
    with r.stream("SELECT 7 / 2 AS q, c_int FROM t ORDER BY c_int", batch_rows=10) as s:
        assert s.read_next_batch().column("q")[0].as_py() == 3
        with pytest.raises(DatabaseError, match="stream is open"):
            r.query("SELECT 1")
        with pytest.raises(DatabaseError, match="stream is open"):
            r.stream("SELECT 1")
        assert db.query("SELECT count(*) FROM t") == [(60_000,)]  # the database is free
    assert r.query("SELECT 1") == [(1,)]
    s = r.stream("SELECT * FROM t", batch_rows=10)
    s.read_next_batch()
    r.close()  # closes its stream
    assert s.closed and _released(db)


def test_a_stream_refuses_what_is_not_one_query(db):
    with pytest.raises(TypeError):
        db.stream(b"SELECT 1")  # type: ignore[arg-type]
    for bad in (0, -1, True, 1.5, "10"):
        with pytest.raises(DatabaseError, match="batch_rows"):
            db.stream("SELECT 1", batch_rows=bad)  # type: ignore[arg-type]
    with pytest.raises(DatabaseError, match="holds 2 statements"):
        db.stream("SELECT 1; SELECT 2")
    with pytest.raises(DatabaseError, match="runs a query"):
        db.stream("INSERT INTO t VALUES (1, 'a', 1)")
    with pytest.raises(DatabaseError, match="runs a query"):
        db.stream("PREPARE p AS SELECT 1")
    with pytest.raises(TableNotFoundError):
        db.stream("SELECT * FROM nope")
    with pytest.raises(DatabaseError, match="parameter"):
        db.stream("SELECT * FROM t WHERE c_int = ?", [1, 2])
    assert db.query("SELECT count(*) FROM t") == [(60_000,)]
    assert _released(db)


def _flip_in_place(path, index, segment):
    """:func:`flip_segment_byte` without truncating the file: the stream's scan has it
    mapped (a truncated mapping faults with SIGBUS)."""
    fd = os.open(path, os.O_RDWR)
    try:
        at = HEADER_SIZE + index * (segment + 16) + 9
        os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 1]), at)
    finally:
        os.close(fd)


def test_a_part_tampered_with_mid_stream_raises_its_authentication_error(
        tmp_path, monkeypatch):
    """A byte of the last of 200 row groups' c_str chunk changes after the stream's first
    batch came (the part opened and checked then): the batch that reaches it raises the
    segment's AuthenticationError and the stream ends, released; rows of the row groups
    before were given, none after."""
    monkeypatch.setattr(part_writer, "ROW_GROUP_ROWS", 2_000)  # (far past the read-ahead)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = cryptdisk.connect(tmp_path / "db", cache_bytes=0)
    try:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql("INSERT INTO t " + gen(400_000))
        part = db.table("t").parts[0]
        op = _partread.open_part(db.config.disks[part.disk], part)
        try:
            assert op.num_row_groups == 200
            seg = op._segment
            start, end, _compressed = op._chunk_info(199, op._index["c_str"])
        finally:
            op.close()
        s = db.stream("SELECT c_int, c_str FROM t", batch_rows=2048)
        got = s.read_next_batch().num_rows
        _flip_in_place(tmp_path / "db" / "data" / part.path, (start + end) // 2 // seg, seg)
        with pytest.raises(AuthenticationError, match="segment"):
            for batch in s:
                got += batch.num_rows
        assert got < 400_000
        assert s.closed and _released(db)
        with pytest.raises(AuthenticationError):  # (and as db.sql fails)
            db.sql("SELECT c_str FROM t")
    finally:
        db.close()


def test_a_stream_is_interrupted_between_batches_and_as_it_starts(db):
    """Stream.interrupt stops the next batch (it raises, the stream ends, released); a
    reader's interrupt stops a stream whose first batch is being computed."""
    s = db.stream("SELECT a.c_int, b.c_int FROM t a, t b", batch_rows=2048)
    assert s.read_next_batch().num_rows == 2048
    s.interrupt()
    with pytest.raises(DatabaseError, match=r"(?i)interrupt"):
        s.read_next_batch()
    assert s.closed and _released(db)
    r = db.reader()
    timer = threading.Timer(0.3, r.interrupt)
    timer.start()
    try:
        with pytest.raises(DatabaseError, match=r"(?i)interrupt"):
            r.stream("SELECT count(*) FROM t a, t b WHERE a.c_int + b.c_int = -1")
    finally:
        timer.cancel()
    assert _released(db)
    assert r.query("SELECT count(*) FROM t") == [(60_000,)]


def test_a_stream_is_not_pickled_and_its_repr_says_what_it_is(db):
    import pickle

    with db.stream("SELECT c_int, c_str FROM t") as s:
        assert repr(s) == "<cryptdisk.db.Stream of 2 columns>"
        with pytest.raises(TypeError, match="pickled"):
            pickle.dumps(s)
    assert repr(s) == "<cryptdisk.db.Stream of 2 columns closed>"
    assert isinstance(s, Stream)


def test_closing_the_database_while_another_thread_reads_a_stream(tmp_path):
    """``Database.close`` on one thread while another is computing a stream's batch: the
    batch is stopped and the stream ends (its release takes the database's lock, which
    close must not hold while it waits for the batch), and the reading thread is told the
    stream was closed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        database = cryptdisk.connect(tmp_path / "db2", cache_bytes=0)
    database.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    database.sql("INSERT INTO t " + gen(20_000))
    s = database.stream("SELECT a.c_int, b.c_int FROM t a, t b", batch_rows=2048)
    s.read_next_batch()
    reading = threading.Event()
    got: list[BaseException] = []

    def read() -> None:
        try:
            reading.set()
            for _batch in s:
                pass
        except BaseException as exc:  # (the reading thread's error, checked below)
            got.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    closer = threading.Thread(target=database.close, daemon=True)
    reader.start()
    reading.wait()
    closer.start()
    closer.join(30)
    reader.join(30)
    assert not closer.is_alive() and not reader.is_alive()  # (no deadlock)
    assert s.closed and database._closed
    assert len(got) == 1 and isinstance(got[0], DatabaseError)
    assert "closed" in str(got[0])

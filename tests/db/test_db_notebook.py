"""The database as a notebook uses it: DataFrames and datasets in, Ctrl-C, repr."""

import os
import signal
import threading

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk.errors import DatabaseError, KeyFileError


def test_insert_takes_a_directory_of_hive_partitioned_parquet_files(tmp_path, db):
    """A directory's path is read as its Parquet files, hive partitions as columns (before:
    "no file DIR"); one of other files or of none is a DatabaseError that says so."""
    db.execute("CREATE TABLE t (k BIGINT, region VARCHAR, year INTEGER) ORDER BY k")
    pq.write_to_dataset(pa.table({"k": [1, 2, 3], "region": ["eu", "us", "eu"],
                                  "year": [2024, 2024, 2025]}),
                        tmp_path / "hive", partition_cols=["region", "year"])
    (tmp_path / "hive" / "_SUCCESS").touch()  # (a marker Spark leaves: not read)
    assert db.insert("t", str(tmp_path / "hive")) == 3
    assert db.query("SELECT k, region, year FROM t ORDER BY k") == [
        (1, "eu", 2024), (2, "us", 2024), (3, "eu", 2025)]
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatabaseError, match=r"the directory .*empty holds no Parquet file"):
        db.insert("t", tmp_path / "empty")
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("k\n1\n")
    with pytest.raises(DatabaseError, match=r"cannot read the Parquet files of the "
                       r"directory .*csv: .*a\.csv"):
        db.insert("t", tmp_path / "csv")
    assert db.query("SELECT count(*) FROM t") == [(3,)]


def _parts_on_disk(path):
    return sorted(p for p in (path / "data").rglob("*.parquet"))


def test_insert_takes_a_glob_and_a_list_of_paths(tmp_path, db):
    """A glob and a list of paths are read as DuckDB's read_parquet and read_csv take them
    (before: "no file d/*.parquet", and a list was a TypeError); a pattern matching
    nothing, a missing file and files of two formats are refused, inserting nothing."""
    db.execute("CREATE TABLE t (k BIGINT, v VARCHAR, year INTEGER) ORDER BY k")
    d = tmp_path / "d"
    (d / "year=2024").mkdir(parents=True)
    (d / "year=2025").mkdir()
    pq.write_table(pa.table({"k": [1, 2], "v": ["a", "b"]}), d / "year=2024" / "a.parquet")
    pq.write_table(pa.table({"k": [3], "v": ["c"]}), d / "year=2025" / "b.parquet")
    (d / "x.csv").write_text("k,v\n4,d\n")
    (d / "y.csv").write_text("v,k\n\"e, f\",5\n")
    assert db.insert("t", f"{d}/*/*.parquet") == 3  # hive partitions under the glob's dir
    assert db.insert("t", f"{d}/**/*.parquet") == 3
    assert db.insert("t", [d / "year=2024" / "a.parquet", str(d / "year=2025" / "b.parquet")]) == 3
    assert db.insert("t", f"{d}/*.csv") == 2
    assert db.insert("t", (d / "x.csv", f"{d}/y*.csv")) == 2
    assert db.insert("t", f"{d}/x.c?v") == 1  # one file: as its path
    assert db.query("SELECT k, v, year FROM t ORDER BY k, year NULLS FIRST") == [
        (1, "a", None), (1, "a", 2024), (1, "a", 2024), (2, "b", None), (2, "b", 2024),
        (2, "b", 2024), (3, "c", None), (3, "c", 2025), (3, "c", 2025),
        (4, "d", None), (4, "d", None), (4, "d", None), (5, "e, f", None), (5, "e, f", None)]
    version, parts = db.catalog.version, _parts_on_disk(tmp_path / "db")
    for data, message in [
            (f"{d}/*.json", r"no file matches .*/d/\*\.json"),
            (f"{d}/**/*.pq", r"no file matches .*/d/\*\*/\*\.pq"),
            ([d / "x.csv", d / "nope.csv"], r"no file .*nope\.csv"),
            ([d / "x.csv", d / "year=2024" / "a.parquet"],
             r"the files are of more than one format \(CSV, Parquet\)"),
            ([d, d / "x.csv"], r".*/d is a directory, in a list of files")]:
        with pytest.raises(DatabaseError, match=f"^insert into t: {message}"):
            db.insert("t", data)
    assert (db.catalog.version, _parts_on_disk(tmp_path / "db")) == (version, parts)


def test_a_file_listed_twice_is_inserted_twice_as_duckdb_reads_it(tmp_path, db):
    """db.insert(t, [a, a]) inserted a's rows once, silently (the list was deduplicated),
    where DuckDB's read_parquet([a, a]) and read_csv([a, a]) read them twice: the list
    says what to insert, so each listed file (or file a listed glob matches) goes in
    as many times as it is listed, Parquet and CSV alike, as DuckDB counts them."""
    import duckdb

    db.execute("CREATE TABLE t (k BIGINT, v VARCHAR)")
    d = tmp_path / "d"
    d.mkdir()
    a, c = d / "a.parquet", d / "c.csv"
    pq.write_table(pa.table({"k": [1, 2], "v": ["a", "b"]}), a)
    c.write_text("k,v\n3,c\n")
    duck = duckdb.connect()
    for data, reader in [([a, a], "read_parquet"), ([str(a), f"{d}/*.parquet"], "read_parquet"),
                         ((c, c, c), "read_csv")]:
        files = ", ".join(f"'{f}'" for f in data)
        want = duck.execute(f"SELECT count(*) FROM {reader}([{files}])").fetchall()[0][0]
        assert db.insert("t", data) == want
    assert duck.execute(f"SELECT count(*) FROM read_parquet(['{a}', '{a}'])").fetchall() == [(4,)]
    assert db.query("SELECT k, count(*) FROM t GROUP BY k ORDER BY k") == [
        (1, 4), (2, 4), (3, 3)]


@pytest.mark.parametrize(("second", "message"), [
    ({"k": ["x"], "v": ["c"]}, r"column k is string in {b} but int64 in {a}"),
    ({"k": [3], "v": ["c"], "extra": [1.5]}, r"{b} has column extra, which {a} lacks"),
    ({"k": [3]}, r"{b} has no column v, which {a} has"),
    ({"k": [3], "v": [b"c"]}, r"column v is binary in {b} but string in {a}"),
])
@pytest.mark.parametrize("form", ["directory", "glob", "list"])
def test_insert_of_parquet_files_whose_columns_differ_names_the_file_and_column(
        tmp_path, db, second, message, form):
    """pyarrow's dataset takes the first file's schema: a later file's column of another
    type failed with pyarrow's own "Failed to parse string: 'x' as a scalar of type int64"
    naming no file, and a later file's other column was dropped without a word (before:
    extra and v-as-bytes inserted their rows, the column extra lost). Now a DatabaseError
    names the file and the column, before anything is written."""
    db.execute("CREATE TABLE t (k BIGINT, v VARCHAR, extra DOUBLE)")
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"k": [1, 2], "v": ["a", "b"]}), d / "a.parquet")
    pq.write_table(pa.table(second), d / "b.parquet")
    data = {"directory": d, "glob": f"{d}/*.parquet",
            "list": [d / "a.parquet", d / "b.parquet"]}[form]
    version, parts = db.catalog.version, _parts_on_disk(tmp_path / "db")
    with pytest.raises(DatabaseError, match="^insert into t: " + message.format(
            a=f"{d}/a\\.parquet", b=f"{d}/b\\.parquet")) as e:
        db.insert("t", data)
    assert "ds.dataset(files, schema=...)" in e.value.hint
    assert (db.catalog.version, _parts_on_disk(tmp_path / "db")) == (version, parts)
    assert db.query("SELECT count(*) FROM t") == [(0,)]


def test_insert_of_parquet_files_of_one_type_family_or_nulls_goes_in(tmp_path, db):
    """int32 beside int64, large_string beside string and a column of NULLs only (pandas
    writes one as Parquet type null) are alike: read as the first file's type."""
    db.execute("CREATE TABLE t (k BIGINT, v VARCHAR)")
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"k": pa.array([1], pa.int64()), "v": ["a"]}), d / "a.parquet")
    pq.write_table(pa.table({"k": pa.array([2], pa.int32()),
                             "v": pa.array(["b"], pa.large_string())}), d / "b.parquet")
    pq.write_table(pa.table({"k": [3], "v": pa.nulls(1)}), d / "c.parquet")
    assert db.insert("t", d) == 3
    assert db.query("SELECT k, v FROM t ORDER BY k") == [(1, "a"), (2, "b"), (3, None)]


@pytest.mark.parametrize("glob", [False, True])
def test_insert_of_parquet_files_of_one_family_reads_each_at_the_widest_width(
        tmp_path, db, glob):
    """Files of one family are read at its widest type among them, as DuckDB's
    read_parquet unions them: read at the first file's type, a float64's 0.1 after a
    float32 file went in as 0.10000000149011612 (no error), an int64 beyond int32 after
    an int32 file failed naming no file, microseconds after a millisecond file too; a
    later file's values of a column the first file holds as NULLs only went in as NULL."""
    import datetime as dt

    db.execute("CREATE TABLE t (f DOUBLE, k BIGINT, ts TIMESTAMP, v VARCHAR)")
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"f": pa.array([1.5], pa.float32()),
                             "k": pa.array([1], pa.int32()),
                             "ts": pa.array([dt.datetime(2024, 1, 1)], pa.timestamp("ms")),
                             "v": pa.nulls(1)}), d / "a.parquet")
    pq.write_table(pa.table({"f": pa.array([0.1], pa.float64()),
                             "k": pa.array([2**40], pa.int64()),
                             "ts": pa.array([dt.datetime(2024, 1, 1, 0, 0, 0, 123456)],
                                            pa.timestamp("us")), "v": ["x"]}),
                   d / "b.parquet")
    assert db.insert("t", str(d / "*.parquet") if glob else d) == 2
    assert db.query("SELECT f, k, ts, v FROM t ORDER BY k") == [
        (1.5, 1, dt.datetime(2024, 1, 1), None),
        (0.1, 2**40, dt.datetime(2024, 1, 1, 0, 0, 0, 123456), "x")]


def test_insert_takes_a_pyarrow_dataset_and_scanner(tmp_path, db):
    db.execute("CREATE TABLE t (k BIGINT, v VARCHAR) ORDER BY k")
    (tmp_path / "files").mkdir()
    for i in range(3):  # a dataset of three files, read as a stream of batches
        pq.write_table(pa.table({"k": [i * 10, i * 10 + 1], "v": [f"a{i}", None]}),
                       tmp_path / "files" / f"f{i}.parquet")
    dataset = ds.dataset(tmp_path / "files", format="parquet")
    assert db.insert("t", dataset) == 6
    assert db.insert("t", dataset.scanner(filter=ds.field("k") > 15)) == 2
    # a column of another type goes through DuckDB's cast
    assert db.insert("t", ds.dataset(pa.table({"k": pa.array([99], pa.int32())}))) == 1
    assert db.query("SELECT k, v FROM t ORDER BY k") == [
        (0, "a0"), (1, None), (10, "a1"), (11, None), (20, "a2"), (20, "a2"),
        (21, None), (21, None), (99, None)]


@pytest.mark.parametrize("names", [["id", "id"], ["id", "ID"]])
def test_insert_of_data_naming_a_column_twice_is_refused(db, names):
    pd = pytest.importorskip("pandas")
    db.execute("CREATE TABLE t (id BIGINT, id_1 BIGINT)")
    for data in (pd.DataFrame([[1, 2]], columns=names),
                 pa.table([pa.array([1]), pa.array([2])], names=names),
                 [dict(zip(names, [1, 2], strict=True))]):
        if len(set(names)) == 1 and isinstance(data, list):
            continue  # (a dict cannot hold a key twice)
        # DuckDB renames the second one id_1 (or ID_1): it went into column id_1
        with pytest.raises(DatabaseError, match=f"column {names[1]} twice"):
            db.insert("t", data)
    assert db.query("SELECT count(*) FROM t") == [(0,)]


@pytest.mark.parametrize(("header", "twice"), [("x,x", "x"), ("x,X", "X"), ("x_1,x,x", "x")])
def test_insert_of_a_csv_file_naming_a_column_twice_is_refused(tmp_path, db, header, twice):
    """DuckDB names a CSV file's second x x_1: "x,x" went into the table's columns x and
    x_1 without a word (before: 1 row inserted, 3 into x and 4 into x_1), as a DataFrame
    naming a column twice is refused. A file whose columns are x and x_1 goes in."""
    db.execute("CREATE TABLE t (x INT, x_1 INT)")
    path = tmp_path / "f.csv"
    path.write_text(f"{header}\n3,4,5\n" if header.count(",") == 2 else f"{header}\n3,4\n")
    with pytest.raises(DatabaseError, match=f"^insert into t: .*f\\.csv has column {twice} "
                       "twice in its header line"):
        db.insert("t", path)
    assert db.query("SELECT count(*) FROM t") == [(0,)]
    path.write_text("x,X_1\n3,4\n")
    assert db.insert("t", path) == 1
    assert db.query("SELECT x, x_1 FROM t") == [(3, 4)]


@pytest.mark.parametrize(("name", "text"), [
    ("f.jsonl", '{"X": 1}\n{"x": 2}\n'),
    ("f.json", '[{"x": 1, "X": 5}, {"x": 2}]'),
])
@pytest.mark.parametrize("columns", ["x INT", "x INT, x_1 INT"])
def test_insert_of_json_whose_keys_differ_in_case_only_is_refused(tmp_path, db, name, text,
                                                                  columns):
    """DuckDB names a JSON file's second spelling of x x_1; read as the table's columns by
    name, one spelling's values became NULL without a word (before, with a column x_1:
    {"x": 2} after {"X": 1} inserted (NULL, NULL), and {"x": 1, "X": 5} lost the 5;
    without one: "no column(s) x_1"). Keys x and x_1 go in."""
    db.execute(f"CREATE TABLE t ({columns})")
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DatabaseError, match=f"^insert into t: .*{name} has the keys X, x, "
                       "which name one column"):
        db.insert("t", path)
    assert db.query("SELECT count(*) FROM t") == [(0,)]
    path.write_text('{"x": 1, "x_1": 5}\n{"x": 2}\n' if "x_1" in columns else '{"x": 1}\n')
    assert db.insert("t", path) == (2 if "x_1" in columns else 1)
    assert db.query("SELECT * FROM t ORDER BY x") == (
        [(1, 5), (2, None)] if "x_1" in columns else [(1,)])


@pytest.mark.parametrize(("second", "message"), [
    ("id,w\n3,c\n", r"b\.csv has column\(s\) w, which .*a\.csv lacks"),
    ("id\n3\n", r"b\.csv has no column\(s\) v, which .*a\.csv has"),
])
def test_insert_of_csv_files_whose_columns_differ_names_the_file(tmp_path, db, second,
                                                                 message):
    """DuckDB's error for a list of CSV files whose headers differ named no file
    ('Columns with names: "v" do not exist in the CSV File'); now the insert names the
    file and the column, inserting nothing. Columns in another order go in by name."""
    db.execute("CREATE TABLE t (id INT, v VARCHAR, w VARCHAR)")
    (tmp_path / "a.csv").write_text("id,v\n1,a\n")
    (tmp_path / "b.csv").write_text(second)
    with pytest.raises(DatabaseError, match="^insert into t: .*" + message):
        db.insert("t", f"{tmp_path}/*.csv")
    assert db.query("SELECT count(*) FROM t") == [(0,)]
    (tmp_path / "b.csv").write_text("v,id\nb,2\n")
    assert db.insert("t", [tmp_path / "a.csv", tmp_path / "b.csv"]) == 2
    assert db.query("SELECT id, v FROM t ORDER BY id") == [(1, "a"), (2, "b")]


def _sigint_in(seconds):
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler, as an interactive session has it: a process started
    in the background by a non-interactive shell (``cmd &``) inherits SIGINT ignored, and
    Python then installs no handler (the Ctrl-C would be lost, not tested)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_in_a_query_is_a_keyboard_interrupt(tmp_path, ctrl_c):
    # DuckDB notices the signal between its tasks (with one thread: the caller's) and
    # raised RuntimeError('Query interrupted')
    db = cryptdisk.connect(tmp_path / "db", threads=1)
    db.execute("CREATE TABLE t (k BIGINT)")
    db.insert("t", {"k": [1, 2]})
    reader = db.reader()
    try:
        for runner in (db, reader):
            guard = threading.Timer(60, runner.interrupt)  # (a failure, never a hang)
            guard.start()
            _sigint_in(0.2)
            with pytest.raises(KeyboardInterrupt):
                runner.query("SELECT count(*) FROM range(100000000) a, range(100000) b, t")
            guard.cancel()
            assert runner.query("SELECT sum(k) FROM t") == [(3,)]
    finally:
        db.close()


def test_repr_of_a_reader_names_its_database(tmp_path, db):
    reader = db.reader()
    assert repr(reader) == f"<cryptdisk.Reader of {db!r}>"
    reader.close()
    assert repr(reader).endswith(" closed>")
    db.close()
    assert repr(db) == f"<cryptdisk.Database {str(tmp_path / 'db')!r} closed tables=0>"


def test_a_database_made_with_a_config_opened_without_it_says_to_pass_it(tmp_path):
    from .dbhelpers import write_config

    config = write_config(tmp_path, [1], 1)
    with cryptdisk.connect(tmp_path / "db", config) as db:
        db.execute("CREATE TABLE t (k BIGINT)")
    with pytest.raises(KeyFileError) as caught:
        cryptdisk.connect(tmp_path / "db")
    assert "cryptdisk.connect(path, config)" in caught.value.hint
    assert not (tmp_path / "db.key").exists()  # (no key made for it)


def test_insert_of_a_pandas_series_takes_its_name_and_an_arrow_array_is_refused(db):
    pd = pytest.importorskip("pandas")
    db.execute("CREATE TABLE t (i BIGINT, s VARCHAR)")
    assert db.insert("t", pd.Series([1, 2], name="i")) == 2  # (DuckDB named it value)
    for array in (pa.array([3]), pa.chunked_array([[3]])):
        with pytest.raises(TypeError, match="named columns, not an Arrow array"):
            db.insert("t", array)
    assert db.query("SELECT i, s FROM t ORDER BY i") == [(1, None), (2, None)]


def test_a_loop_of_small_inserts_warns_once_to_insert_more_at_once_or_optimize(db, caplog):
    from cryptdisk.db import _insert

    db.execute("CREATE TABLE t (k BIGINT)")
    db.execute("CREATE TABLE big (k BIGINT)")
    db.insert("big", {"k": list(range(_insert.SMALL_PART_ROWS))})
    with caplog.at_level("WARNING", logger="cryptdisk.db"):
        for i in range(_insert.SMALL_PARTS - 1):
            db.insert("t", {"k": [i]})
            db.insert("big", {"k": list(range(_insert.SMALL_PART_ROWS))})  # (parts not small)
        assert not caplog.records
        for i in range(3):
            db.insert("t", {"k": [i]})
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert (f"table t has {_insert.SMALL_PARTS} parts averaging 1 rows" in warned[0]
            and 'OPTIMIZE TABLE "t"' in warned[0])
    db.execute("OPTIMIZE TABLE t")
    assert db.query("SELECT parts, rows FROM system.tables WHERE name = 't'") == [
        (1, _insert.SMALL_PARTS + 2)]


def test_a_dataframe_whose_index_is_a_column_of_the_table_is_refused(db):
    pd = pytest.importorskip("pandas")
    db.execute("CREATE TABLE agg (region VARCHAR, amount DOUBLE)")
    sums = pd.DataFrame({"region": ["EU", "US", "EU"], "amount": [1.0, 2.0, 3.0]}
                        ).groupby("region").sum()
    # the index was left out and every region stored as NULL
    with pytest.raises(DatabaseError, match="column region is the DataFrame's index") as e:
        db.insert("agg", sums)
    assert "reset_index" in e.value.hint
    assert db.insert("agg", sums.reset_index()) == 2
    assert db.insert("agg", sums.set_axis(["r1", "r2"])) == 2  # an index of another name
    assert db.query("SELECT region, amount FROM agg ORDER BY amount, region") == [
        ("US", 2.0), (None, 2.0), ("EU", 4.0), (None, 4.0)]


def test_ctrl_c_stops_a_query_that_duckdbs_threads_run(tmp_path, ctrl_c):
    # With DuckDB's threads running the join's tasks, the caller waits in DuckDB and
    # checked for no signal: the query went on (minutes) after the Ctrl-C.
    db = cryptdisk.connect(tmp_path / "db", threads=4)
    db.execute("CREATE TABLE t (k BIGINT)")
    db.insert("t", {"k": [1, 2]})
    try:
        for delay in (0.5, 1.5):
            guard = threading.Timer(20, db.interrupt)  # (a failure, never a hang)
            guard.start()
            _sigint_in(delay)
            with pytest.raises(KeyboardInterrupt):
                db.query("SELECT count(*) FROM range(100000000) a, range(100000) b, t")
            assert guard.is_alive(), "the Ctrl-C did not stop the query"
            guard.cancel()
            assert db.query("SELECT sum(k) FROM t") == [(3,)]
    finally:
        db.close()


_TZ_CHILD = r"""
import datetime, json, sys
import pandas as pd
import cryptdisk
db = cryptdisk.connect(sys.argv[1])
db.sql("CREATE TABLE t (a TIMESTAMPTZ, b TIMESTAMP, s VARCHAR)")
db.insert("t", pd.DataFrame({"a": [pd.Timestamp("2024-01-01 00:00")],
                             "b": [pd.Timestamp("2024-01-01 00:00", tz="UTC")], "s": ["pandas"]}))
db.execute("INSERT INTO t VALUES (?, ?, 'parameter')",
           [datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)])
db.sql("INSERT INTO t VALUES ('2024-01-01 00:00', '2024-01-01 00:00+00', 'sql')")
q = "SELECT s, epoch(a), b::VARCHAR, a::DATE::VARCHAR FROM t ORDER BY s"
reader = db.reader()
print(json.dumps({"rows": db.query(q), "reader": reader.query(q),
                  "tz": [str(db.sql("SELECT a FROM t").schema.field(0).type.tz),
                         str(reader.execute("SELECT a FROM t").schema.field(0).type.tz)]}))
"""


def test_timestamps_with_time_zone_are_utc_on_a_machine_in_another_zone(tmp_path):
    """database-python.md: a naive datetime into a TIMESTAMPTZ is taken as UTC, and
    TIMESTAMPTZ comes back in UTC (the server tells its clients TimeZone UTC too). On a
    machine whose TZ is another zone, DuckDB's default TimeZone was that zone: the same
    DataFrame stored another instant, and a value came back in that zone, on the database
    and on a reader."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, TZ="America/New_York")
    got = subprocess.run([sys.executable, "-c", _TZ_CHILD, str(tmp_path / "db")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    want = [[s, 1704067200.0, "2024-01-01 00:00:00", "2024-01-01"]
            for s in ("pandas", "parameter", "sql")]
    assert out["rows"] == want
    assert out["reader"] == want
    assert out["tz"] == ["UTC", "UTC"]


def test_insert_of_floats_into_an_integer_column_rounds_halves_to_even(db):
    """As docs/database-sql.md says: DuckDB's cast of a DOUBLE (1.5 and 2.5 -> 2), not
    the DECIMAL literal's rounding of INSERT ... VALUES (2.5 -> 3); NaN is an error."""
    db.execute("CREATE TABLE t (i INTEGER, n BIGINT)")
    db.insert("t", {"i": [1.5, 2.5, -0.5, 0.6], "n": [1.5, 2.5, -1.5, -0.6]})
    db.execute("INSERT INTO t VALUES (2.5, -2.5)")
    assert db.query("SELECT i, n FROM t") == [(2, 2), (2, 2), (0, -2), (1, -1), (3, -3)]
    with pytest.raises(DatabaseError, match="nan"):
        db.insert("t", {"i": [float("nan")]})


def test_ctrl_c_reaches_a_query_in_a_process_with_over_1024_open_files(tmp_path):
    """The Ctrl-C watcher waits on its pipe with poll(): select() refuses a descriptor past
    1023, and the watcher thread died on it with a traceback on stderr."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, signal, threading
        import cryptdisk
        signal.signal(signal.SIGINT, signal.default_int_handler)
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
        db = cryptdisk.connect({str(tmp_path / "db")!r}, threads=1)
        db.execute("CREATE TABLE t (k BIGINT)")
        db.insert("t", {{"k": [1, 2]}})
        threading.Timer(60, db.interrupt).start()  # (a failure, never a hang)
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            db.query("SELECT count(*) FROM range(100000000) a, range(100000) b, t")
        except KeyboardInterrupt:
            print("interrupted")
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "interrupted", out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]  # (the watcher thread died)


def test_insert_reads_cryptdisk_urls_through_the_cryptdisk_filesystem(tmp_path, monkeypatch):
    """db.insert("t", "cryptdisk://DISK/path") said "no file cryptdisk://..." (it looked
    for a local file of that name). Now it reads the file through the cryptdisk filesystem
    over the database's config file (else CRYPTDISK_CONFIG's): Parquet, CSV and JSON, a
    glob, a directory of Parquet files, a list; a missing file, a glob matching nothing,
    files of two formats, a mixed list or no config are the same clear errors as for local
    paths, and insert nothing. The database's SQL still reads no cryptdisk:// URL."""
    import fsspec

    from tests.configs import encrypted_over_local

    cfg = tmp_path / "cryptdisk.toml"
    cfg.write_text(encrypted_over_local("00" * 32, rest="""
[policies.default]
volumes = [{ name = "main", disks = ["secure"] }]"""))
    fs = fsspec.filesystem("cryptdisk", config=str(cfg), skip_instance_cache=True)
    pq.write_table(pa.table({"k": [1, 2], "v": ["a", "b"]}), "secure/pq/a.parquet",
                   filesystem=fs)
    pq.write_table(pa.table({"k": [3], "v": ["c"]}), "secure/pq/year=2025/b.parquet",
                   filesystem=fs)
    with fs.open("secure/in/c.csv", "wb") as f:
        f.write(b"v,k\n\"d, e\",4\n")
    with fs.open("secure/in/d.json", "wb") as f:
        f.write(b'{"k": 5, "v": "f"}\n')
    with fs.open("secure/in/h.csv", "wb") as f:
        f.write(b"6,g\n")  # (no header line)
    assert not (tmp_path / "raw" / "enc" / "in" / "c.csv").read_bytes().startswith(b"v,k")
    monkeypatch.delenv("CRYPTDISK_CONFIG", raising=False)
    db = cryptdisk.connect(tmp_path / "db", str(cfg))
    try:
        db.sql("CREATE TABLE t (k BIGINT, v VARCHAR) ORDER BY k")
        assert db.insert("t", "cryptdisk://secure/pq/a.parquet") == 2
        assert db.insert("t", "CRYPTDISK://secure/in/c.csv") == 1
        assert db.insert("t", ["cryptdisk://secure/in/d.json"]) == 1
        assert db.insert("t", "cryptdisk://secure/pq/*/*.parquet") == 1
        assert db.insert("t", ["cryptdisk://secure/pq/a.parquet",
                               "cryptdisk://secure/pq/year=2025/b.parquet"]) == 3
        assert db.query("SELECT k, v FROM t ORDER BY k") == [
            (1, "a"), (1, "a"), (2, "b"), (2, "b"), (3, "c"), (3, "c"), (4, "d, e"),
            (5, "f")]
        db.sql("CREATE TABLE y (k BIGINT, v VARCHAR, year INTEGER) ORDER BY k")
        assert db.insert("y", "cryptdisk://secure/pq") == 3  # (hive partitions as columns)
        assert db.query("SELECT k, year FROM y ORDER BY k") == [(1, None), (2, None),
                                                                (3, 2025)]
        version = db.catalog.version
        for data, message in [
                ("cryptdisk://secure/in/nope.parquet", r"no file cryptdisk://secure/in/"
                 r"nope\.parquet$"),
                ("cryptdisk://secure/in/*.pq", r"no file matches cryptdisk://secure/in/\*\.pq"),
                (["cryptdisk://secure/in/c.csv", "cryptdisk://secure/pq/a.parquet"],
                 r"the files are of more than one format \(CSV, Parquet\)"),
                (["cryptdisk://secure/pq", "cryptdisk://secure/in/c.csv"],
                 r"cryptdisk://secure/pq is a directory, in a list of files"),
                ("cryptdisk://secure/in", r"cannot read the Parquet files of the directory "
                 r"cryptdisk://secure/in: .*c\.csv"),
                (["cryptdisk://secure/in/c.csv", str(tmp_path / "x.csv")],
                 r"the list holds cryptdisk:// URLs and local paths"),
                ("cryptdisk://secure/in/h.csv", r"cryptdisk://secure/in/h\.csv has no header "
                 "line naming its columns")]:
            with pytest.raises(DatabaseError, match=f"^insert into t: {message}"):
                db.insert("t", data)
        assert db.catalog.version == version
        with pytest.raises(DatabaseError, match="the database's SQL does not read"):
            db.sql("SELECT * FROM read_csv('cryptdisk://secure/in/c.csv')")
    finally:
        db.close()
    db = cryptdisk.connect(tmp_path / "db2")  # (the default config: no disk "secure")
    try:
        db.sql("CREATE TABLE t (k BIGINT, v VARCHAR)")
        with pytest.raises(DatabaseError, match=r"^insert into t: no config to read "
                           r"cryptdisk:// URLs with"):
            db.insert("t", "cryptdisk://secure/pq/a.parquet")
        monkeypatch.setenv("CRYPTDISK_CONFIG", str(cfg))
        assert db.insert("t", "cryptdisk://secure/in/c.csv") == 1
        assert db.query("SELECT k, v FROM t") == [(4, "d, e")]
    finally:
        db.close()

"""cryptdisk.dask.read_table on a real LocalCluster: results equal the embedded engine's,
filters on the key leave out parts, tasks and worker logs carry no key material."""

import pickle
import subprocess
import sys

import cloudpickle
import pandas as pd
import pytest

import cryptdisk
import cryptdisk.dask
from cryptdisk.errors import CatalogError, ConfigError, DatabaseError

from ..db.dbhelpers import write_config
from .daskhelpers import encodings

PART_ROWS = 150_000  # 3 row groups of 64Ki rows per part


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """Table t (ORDER BY k) in 3 parts, on an encrypted disk of a TOML config."""
    tmp = tmp_path_factory.mktemp("daskread")
    cfg = write_config(tmp, [1], 1)
    path = tmp / "db"
    with cryptdisk.connect(path, cfg) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        for i in range(3):
            db.sql(f"INSERT INTO t SELECT i, md5(i::VARCHAR), i / 7 "
                   f"FROM range({i * PART_ROWS}, {(i + 1) * PART_ROWS}) r(i)")
    return path, cfg, (tmp / "k1.hex").read_text().split()[-1]


def _engine(path, cfg, sql):
    with cryptdisk.connect(path, cfg, read_only=True) as db:
        return db.sql(sql).to_pandas()


def _same(got, want):
    got = got.sort_values(list(got.columns)).reset_index(drop=True)
    want = want.sort_values(list(want.columns)).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_a_table_reads_as_one_partition_per_part_equal_to_the_engine(client, table):
    path, cfg, _key = table
    df = cryptdisk.dask.read_table(path, "t", config=cfg)
    assert df.npartitions == 3
    assert list(df.columns) == ["k", "s", "f"]
    got = client.compute(df).result()
    _same(got, _engine(path, cfg, "SELECT * FROM t"))
    agg = client.compute(df.groupby(df.k % 10).f.sum()).result().sort_index()
    want = _engine(path, cfg, "SELECT k % 10 AS g, sum(f) AS f FROM t GROUP BY g")
    assert agg.to_dict() == pytest.approx(dict(zip(want.g, want.f, strict=True)))


def test_a_worker_with_several_threads_reads_partitions_at_once_exactly(table):
    """One worker process, four threads sharing its connection, whose lock no longer
    covers the reading (tests/db/test_db_read_part.py shows two threads inside it at
    once): nine row-group partitions read by nine tasks equal the engine's rows."""
    import distributed

    path, cfg, _key = table
    with distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=4,
                                  host="127.0.0.1", dashboard_address=None) as cluster, \
            distributed.Client(cluster) as c:
        df = cryptdisk.dask.read_table(path, "t", config=cfg, row_groups_per_partition=1)
        assert df.npartitions == 9
        with distributed.get_task_stream(c) as stream:
            got = c.compute(df).result()
        _same(got, _engine(path, cfg, "SELECT * FROM t"))
        assert sum("cryptdisk-read-table" in str(t["key"]) for t in stream.data) == 9


def test_a_filter_on_the_key_schedules_only_the_parts_that_can_match(client, table):
    path, cfg, _key = table
    lo, hi = PART_ROWS + 10, PART_ROWS + 70_000  # inside the second part, 2 of its row groups
    df = cryptdisk.dask.read_table(path, "t", ["s", "k"], [("k", ">=", lo), ("k", "<", hi)],
                                   config=cfg)
    assert df.npartitions == 1
    got = client.compute(df).result()
    assert list(got.columns) == ["s", "k"]
    _same(got, _engine(path, cfg, f"SELECT s, k FROM t WHERE k >= {lo} AND k < {hi}"))
    spanning = cryptdisk.dask.read_table(path, "t", filters=[("k", "in", [5, 2 * PART_ROWS])],
                                         config=cfg, min_partition_rows=0)
    assert spanning.npartitions == 2  # one row group of the first part, one of the third
    assert sorted(client.compute(spanning.k).result()) == [5, 2 * PART_ROWS]
    none = cryptdisk.dask.read_table(path, "t", filters=[("k", ">", 10**9)], config=cfg)
    assert len(client.compute(none).result()) == 0


def test_a_key_range_read_without_its_key_column_equals_the_engine(client, table):
    """Columns that leave out the filtered key: partitions of inner row groups (every row
    matches, read without the key, not filtered) and of boundary ones (filtered row by
    row), one partition per row group; and a range inside one row group."""
    path, cfg, _key = table
    lo, hi = PART_ROWS // 2 + 5, 2 * PART_ROWS + 100  # row group 1 of part 1 .. 0 of part 3
    df = cryptdisk.dask.read_table(path, "t", ["f", "s"], [("k", ">=", lo), ("k", "<", hi)],
                                   config=cfg, row_groups_per_partition=1)
    assert df.npartitions == 6
    got = client.compute(df).result()
    _same(got, _engine(path, cfg, f"SELECT f, s FROM t WHERE k >= {lo} AND k < {hi}"))
    assert client.compute(df.f.sum()).result() == pytest.approx(
        sum(i / 7 for i in range(lo, hi)))
    inside = cryptdisk.dask.read_table(path, "t", ["f"], [("k", ">=", 70_000),
                                                          ("k", "<", 70_010)], config=cfg)
    assert inside.npartitions == 1
    assert client.compute(inside).result().f.tolist() == [i / 7 for i in range(70_000, 70_010)]


def test_partitions_come_in_dasks_string_dtype_one_task_each(client, table):
    """Strings arrive as ``string[pyarrow]``, the dtype Dask gives them (as dd.read_parquet
    does): no task converting each partition follows the read."""
    import dask
    import distributed

    path, cfg, _key = table
    df = cryptdisk.dask.read_table(path, "t", config=cfg)
    assert df.dtypes["s"] == pd.StringDtype("pyarrow")
    with distributed.get_task_stream(client) as stream:  # two reductions share the reads
        client.compute([df.f.sum(), df.s.count()], sync=True)
    names = [str(t["key"]) for t in stream.data]
    assert sum("cryptdisk-read-table" in n for n in names) == df.npartitions
    assert not [n for n in names if "string" in n], names  # no conversion task
    got = client.compute(df.partitions[0]).result()
    assert got.dtypes.to_dict() == df.dtypes.to_dict()
    with dask.config.set({"dataframe.convert-string": False}):  # pandas' own str dtype then
        plain = cryptdisk.dask.read_table(path, "t", ["s"], config=cfg)
        assert plain.dtypes["s"] != pd.StringDtype("pyarrow")
        assert client.compute(plain.partitions[0]).result().dtypes["s"] == plain.dtypes["s"]


def test_small_parts_share_partitions_up_to_min_partition_rows(client, tmp_path):
    """Six parts of 1000 rows: one task reads them all by default; a smaller
    min_partition_rows packs two to a partition; 0 gives one partition per part."""
    import distributed

    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE u (k BIGINT, s VARCHAR) ORDER BY k")
        for i in range(6):
            db.sql(f"INSERT INTO u SELECT i, md5(i::VARCHAR) FROM range({i * 1000}, "
                   f"{(i + 1) * 1000}) r(i)")
    want = _engine(tmp_path / "db", None, "SELECT * FROM u")
    for min_rows, n in ((None, 1), (2500, 3), (0, 6)):
        kw = {} if min_rows is None else {"min_partition_rows": min_rows}
        df = cryptdisk.dask.read_table(tmp_path / "db", "u", **kw)
        assert df.npartitions == n, min_rows
        with distributed.get_task_stream(client) as stream:
            got = client.compute(df).result()
        _same(got, want)
        assert sum("cryptdisk-read-table" in str(t["key"]) for t in stream.data) == n
    # a filter on the key still leaves parts out before packing
    flt = cryptdisk.dask.read_table(tmp_path / "db", "u", ["k"], [("k", ">=", 4500)],
                                    min_partition_rows=0)
    assert flt.npartitions == 2
    assert sorted(client.compute(flt).result().k) == list(range(4500, 6000))
    with pytest.raises(DatabaseError, match="min_partition_rows"):
        cryptdisk.dask.read_table(tmp_path / "db", "u", min_partition_rows=-1)


def test_filters_on_other_columns_equal_the_engine(client, table):
    path, cfg, _key = table
    filters = [("f", "<", 1000.5), ("s", ">=", "8"), ("k", "!=", 7)]
    df = cryptdisk.dask.read_table(path, "t", ["k", "f"], filters, config=cfg)
    _same(client.compute(df).result(),
          _engine(path, cfg, "SELECT k, f FROM t WHERE f < 1000.5 AND s >= '8' AND k <> 7"))


def test_large_parts_split_into_row_group_partitions(client, table):
    path, cfg, _key = table
    df = cryptdisk.dask.read_table(path, "t", ["k"], config=cfg, row_groups_per_partition=1)
    assert df.npartitions == 9
    sizes = client.compute(df.map_partitions(len)).result().tolist()
    assert sum(sizes) == 3 * PART_ROWS and all(0 < n <= 65536 for n in sizes)
    assert client.compute(df.k.sum()).result() == sum(range(3 * PART_ROWS))


def test_tasks_and_worker_logs_carry_no_key_material(client, table):
    path, cfg, key_hex = table
    needles = encodings(bytes.fromhex(key_hex))
    df = cryptdisk.dask.read_table(path, "t", ["k", "s"], [("k", "<", 1000)], config=cfg)
    graph = dict(df.__dask_graph__())
    seen = 0
    for task in graph.values():
        for blob in (pickle.dumps(task), cloudpickle.dumps(task), repr(task).encode()):
            assert not any(n in blob for n in needles)
            seen += str(cfg).encode() in blob  # the scan sees the tasks' arguments
    assert seen >= 2
    assert client.compute(df.k.count()).result() == 1000
    logs = repr(client.get_worker_logs()) + repr(client.get_scheduler_logs())
    assert "read-table" in repr(client.run_on_scheduler(
        lambda dask_scheduler: list(dask_scheduler.task_prefixes)))
    assert not any(n.decode("latin-1") in logs for n in needles[1:])


def test_a_config_object_is_refused_it_would_put_keys_in_the_graph(table):
    path, cfg, _key = table
    from cryptdisk.config import load_config

    with pytest.raises(ConfigError, match="path"):
        cryptdisk.dask.read_table(path, "t", config=load_config(cfg))


def test_bad_columns_and_filters_fail_on_the_client(table):
    path, cfg, _key = table
    with pytest.raises(DatabaseError, match="no column"):
        cryptdisk.dask.read_table(path, "t", ["nope"], config=cfg)
    with pytest.raises(DatabaseError, match="no column"):
        cryptdisk.dask.read_table(path, "t", filters=[("nope", "=", 1)], config=cfg)
    with pytest.raises(DatabaseError, match="op must be"):
        cryptdisk.dask.read_table(path, "t", filters=[("k", "like", 1)], config=cfg)
    with pytest.raises(DatabaseError, match="2 OR-ed lists of filters"):
        cryptdisk.dask.read_table(path, "t", filters=[[("k", "=", 1)], [("k", "=", 2)]],
                                  config=cfg)


def test_a_filter_value_the_column_cannot_compare_with_fails_on_the_client(table, monkeypatch):
    """Checked against the column's type when the read is planned, before any task runs
    (not on a worker with DuckDB's message and SQL): the column, its type and the value."""
    path, cfg, _key = table
    monkeypatch.setattr(cryptdisk.dask._read, "_read_partition",
                        lambda spec: pytest.fail("a task ran"))
    for flt, typ, value in [(("k", "<", "abc"), "BIGINT", "'abc'"),
                            (("k", "in", [1, "x"]), "BIGINT", "'x'"),
                            (("s", ">=", 5), "VARCHAR", "5"),
                            (("f", "=", b"1"), "DOUBLE", "b'1'")]:
        with pytest.raises(DatabaseError) as err:
            cryptdisk.dask.read_table(path, "t", filters=[("k", ">", 0), flt], config=cfg)
        msg = str(err.value)
        assert f"column {flt[0]} is {typ}" in msg and value in msg, msg
        assert "SELECT" not in msg and "__cd_read_part" not in msg, msg
    # A value DuckDB casts to the column's type is a filter (the engine compares so).
    df = cryptdisk.dask.read_table(path, "t", filters=[("k", "<", "5")], config=cfg)
    assert list(df.columns) == ["k", "s", "f"]


def test_read_part_names_the_column_and_type_of_a_value_it_cannot_compare(table):
    path, cfg, _key = table
    with cryptdisk.connect(path, cfg, read_only=True) as db:
        part = db.scan_plan("t")[0][0]
        with pytest.raises(DatabaseError, match=r"column k is BIGINT.*'abc'"):
            db.read_part("t", part, filters=[("k", "<", "abc")])


def test_one_and_ed_list_in_dasks_or_of_ands_form_is_the_same_filter(client, table):
    path, cfg, _key = table
    dnf = cryptdisk.dask.read_table(path, "t", filters=[[("k", ">=", 10), ["k", "<", 20]]],
                                    config=cfg)
    flat = cryptdisk.dask.read_table(path, "t", filters=[("k", ">=", 10), ("k", "<", 20)],
                                     config=cfg)
    assert dnf.npartitions == flat.npartitions == 1
    _same(client.compute(dnf).result(), client.compute(flat).result())
    assert sorted(client.compute(dnf).result()["k"]) == list(range(10, 20))


def test_the_key_file_beside_the_database_is_loaded_by_each_worker(client, tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE u (a BIGINT, b VARCHAR)")
        db.sql("INSERT INTO u SELECT i, i::VARCHAR FROM range(1000) r(i)")
        db.sql("INSERT INTO u SELECT i, NULL FROM range(1000, 1500) r(i)")
    df = cryptdisk.dask.read_table(tmp_path / "db", "u")
    assert df.npartitions == 1  # two small parts, read by one task
    _same(client.compute(df).result(), _engine(tmp_path / "db", None, "SELECT * FROM u"))


def test_a_part_merged_away_after_planning_fails_clearly(client, tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE u (a BIGINT)")
        db.sql("INSERT INTO u SELECT * FROM range(10)")
        db.sql("INSERT INTO u SELECT * FROM range(10, 20)")
        df = cryptdisk.dask.read_table(tmp_path / "db", "u")
        db.sql("OPTIMIZE TABLE u FINAL")
    with pytest.raises(CatalogError, match="merged or dropped"):
        client.compute(df).result()


def test_importing_cryptdisk_does_not_import_dask():
    code = ("import sys, cryptdisk, cryptdisk.db, cryptdisk.dask\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')]\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_part_removed_after_planning_fails_clearly_on_a_worker_that_knew_it(client,
                                                                           tmp_path):
    """The workers' connections already hold the plan's catalog version, but not its
    parts open (``connect`` opens a few parts itself: not here, ``_CONNECT_OPENS = 0``; a
    connection that holds them open reads them as they were); the merged-away part's file
    is then deleted (the writer's cleanup): the task says to plan again."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE u (a BIGINT)")
        db.sql("INSERT INTO u SELECT * FROM range(10)")
        db.sql("INSERT INTO u SELECT * FROM range(10, 20)")
        df = cryptdisk.dask.read_table(tmp_path / "db", "u")
        path = str(tmp_path / "db")

        def open_here():  # this worker's connection, at the plan's catalog version
            import cryptdisk.db._database as database
            from cryptdisk.dask._read import _process_database

            opens, database._CONNECT_OPENS = database._CONNECT_OPENS, 0
            try:
                with _process_database(path, None) as (db, _opened):
                    return db.catalog.version
            finally:
                database._CONNECT_OPENS = opens

        assert set(client.run(open_here).values()) == {db.catalog.version}
        db.sql("OPTIMIZE TABLE u FINAL")
        db.sql("INSERT INTO u VALUES (20)")
        db.sql("INSERT INTO u VALUES (21)")  # the merged parts' files are gone now
        names = {p["path"].rsplit("/", 1)[-1]
                 for p in db.sql("SELECT path FROM system.parts").to_pylist()}
    assert {p.name for p in (tmp_path / "db").parent.rglob("*.parquet")} == names
    with pytest.raises(CatalogError, match="merged or dropped"):
        client.compute(df).result()


def _count_setup_work():
    """Counts, in this process, what opening a database and a part costs: key loading
    (``resolve_config``), catalog reads (``load_catalog``), part footers (``open_part``).
    Returns (counts, undo)."""
    import cryptdisk.db._database as database
    import cryptdisk.db._scan as scan

    counts = {"keys": 0, "catalog": 0, "footers": 0}
    patched = [(database, "resolve_config", "keys"), (database, "load_catalog", "catalog"),
               (scan, "open_part", "footers")]
    originals = [(mod, name, getattr(mod, name)) for mod, name, _what in patched]

    def counting(fn, what):
        def wrapper(*args, **kwargs):
            counts[what] += 1
            return fn(*args, **kwargs)
        return wrapper

    for mod, name, what in patched:
        setattr(mod, name, counting(getattr(mod, name), what))

    def undo():
        for mod, name, fn in originals:
            setattr(mod, name, fn)
    return counts, undo


def test_planning_again_reads_no_catalog_key_or_footer_until_a_writer_commits(tmp_path):
    """The client keeps one read-only connection per database: a second read_table of an
    unchanged table loads no key, reads no catalog and decrypts no footer; a commit in
    between is seen (the new catalog once, the new part's footer once)."""
    cfg = write_config(tmp_path, [1], 1)
    path = tmp_path / "db"
    with cryptdisk.connect(path, cfg) as db:
        db.sql("CREATE TABLE u (k BIGINT, s VARCHAR) ORDER BY k")
        db.sql("INSERT INTO u SELECT i, i::VARCHAR FROM range(1000) r(i)")
        db.sql("INSERT INTO u SELECT i, i::VARCHAR FROM range(1000, 2000) r(i)")
    assert cryptdisk.dask.read_table(path, "u", config=cfg, min_partition_rows=0
                                     ).npartitions == 2
    counts, undo = _count_setup_work()
    try:
        again = cryptdisk.dask.read_table(path, "u", ["k"], [("k", ">=", 10)], config=cfg,
                                          min_partition_rows=0)
        assert counts == {"keys": 0, "catalog": 0, "footers": 0}
        assert again.npartitions == 2
        with cryptdisk.connect(path, cfg) as db:
            db.sql("INSERT INTO u VALUES (5000, 'x')")
            by_writer = dict(counts)
        newer = cryptdisk.dask.read_table(path, "u", config=cfg, min_partition_rows=0)
        # the writer's connection counted its own keys, catalog and footers; the planner
        # read the new catalog once and opened only the new part
        planner = {k: counts[k] - by_writer[k] for k in counts}
        assert planner == {"keys": 0, "catalog": 1, "footers": 1}, (planner, by_writer)
    finally:
        undo()
    assert newer.npartitions == 3
    assert newer.k.max().compute(scheduler="sync") == 5000


def test_tasks_do_no_catalog_or_key_work_on_a_worker_that_has_the_database_open(client,
                                                                               table):
    """Per task, a worker reads the part's row groups: the keys and the catalog were
    loaded once by that worker process, and footers are opened once per process."""
    path, cfg, _key = table
    df = cryptdisk.dask.read_table(path, "t", ["k", "f"], config=cfg)
    want = sum(range(3 * PART_ROWS))
    assert client.compute(df.k.sum()).result() == want  # every worker has it open now

    def start():
        import builtins
        builtins._cd_counts = _count_setup_work()  # one per worker process

    def stop():
        import builtins
        counts, undo = builtins._cd_counts
        undo()
        return counts

    client.run(start)
    try:
        for _ in range(3):
            assert client.compute(df.k.sum()).result() == want
    finally:
        per_worker = client.run(stop)
    assert len(per_worker) == 2
    for counts in per_worker.values():
        assert counts["keys"] == 0 and counts["catalog"] == 0, per_worker
        assert counts["footers"] <= 3, per_worker  # a part new to this worker, once


def test_a_forked_child_opens_its_own_connection_not_the_parents(table, monkeypatch):
    """The kept connection belongs to the process that opened it: a child forked after
    read_table (seen here as another pid) opens its own, since DuckDB's must not cross a
    fork."""
    import os

    from cryptdisk.dask._read import _process_database

    path, cfg, _key = table
    cryptdisk.dask.read_table(path, "t", config=cfg)

    def kept():
        with _process_database(str(path), str(cfg)) as (db, _opened):
            return db

    parent = kept()
    assert kept() is parent
    real = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real + 1)
    child = kept()
    assert child is not parent
    assert child.read_part("t", child.scan_plan("t")[0][0], ["k"]).num_rows == PART_ROWS
    assert kept() is child  # kept for the child's next read


def test_credentials_in_a_url_or_its_options_never_reach_a_task_graph(tmp_path):
    """Refused before a graph exists (tasks carry the URL and options to every worker)."""
    secret = "s3cr3t-do-not-leak"
    cfg = write_config(tmp_path, [1], 1)
    for url, options in ((f"memory://u:{secret}@bucket/db", None),
                         ("memory://bucket/db", {"client_kwargs": {
                             "endpoint_url": f"http://AKID:{secret}@127.0.0.1:9000"}})):
        with pytest.raises(ConfigError, match="credentials") as info:
            cryptdisk.dask.read_table(url, "t", config=cfg, storage_options=options)
        assert secret not in str(info.value)
        with pytest.raises(ConfigError, match="credentials") as info:
            cryptdisk.dask.to_table(None, url, "t", config=cfg, storage_options=options)
        assert secret not in str(info.value)


def test_dtype_backend_keeps_the_meta_dtypes_in_partitions_with_nulls(client, tmp_path):
    """NumPy dtypes turn a BIGINT with a NULL into float64 and a BOOLEAN into object in
    that partition only, unlike the meta (as dd.read_parquet does); dtype_backend=
    "numpy_nullable" or "pyarrow" (dd.read_parquet's values) keep every partition's
    dtypes equal to the meta's."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE n (k BIGINT, v BIGINT, b BOOLEAN, s VARCHAR, f DOUBLE) ORDER BY k")
        db.sql("INSERT INTO n SELECT i, i, true, i::VARCHAR, i / 2 FROM range(100) r(i)")
        db.sql("INSERT INTO n SELECT i, NULL, NULL, NULL, NULL FROM range(100, 150) r(i)")
    numpy = cryptdisk.dask.read_table(tmp_path / "db", "n", min_partition_rows=0)
    parts = client.compute([numpy.partitions[i] for i in range(2)], sync=True)
    assert str(numpy._meta.v.dtype) == "int64" and str(parts[1].v.dtype) == "float64"
    for backend, want in (("numpy_nullable", ["Int64", "Int64", "boolean", "string",
                                              "Float64"]),
                          ("pyarrow", ["int64[pyarrow]", "int64[pyarrow]", "bool[pyarrow]",
                                       "string[pyarrow]", "double[pyarrow]"])):
        df = cryptdisk.dask.read_table(tmp_path / "db", "n", min_partition_rows=0,
                                       dtype_backend=backend)
        assert [str(t) for t in df._meta.dtypes] == want, backend
        parts = client.compute([df.partitions[i] for i in range(2)], sync=True)
        for part in parts:
            assert [str(t) for t in part.dtypes] == want, (backend, part.dtypes)
        assert parts[1].v.isna().all() and parts[1].b.isna().all()
        assert client.compute(df.v.sum()).result() == sum(range(100))
        assert client.compute((df.v + 1).max()).result() == 100
    with pytest.raises(DatabaseError, match="dtype_backend"):
        cryptdisk.dask.read_table(tmp_path / "db", "n", dtype_backend="arrow")


def test_a_worker_that_cannot_load_the_keys_says_it_is_the_worker(client, table, tmp_path,
                                                                   monkeypatch):
    """The client plans with keys from its environment; a worker without them failed
    with the very same message ('environment variable DKKEY is not set') while the
    client had it set, which reads as the client's problem. Now the error (same type,
    raised by compute() on the client) names the worker and says each one loads the keys
    itself."""
    from cryptdisk.errors import MissingEnvironmentVariableError

    path, cfg, key = table
    env_cfg = tmp_path / "env.toml"
    env_cfg.write_text(cfg.read_text().replace('file = "k1.hex"', 'from_env = "DKKEY"')
                       .replace('path = "store/', f'path = "{cfg.parent}/store/'))
    monkeypatch.setenv("DKKEY", key)  # here, not in the workers started before
    df = cryptdisk.dask.read_table(path, "t", config=env_cfg)
    with pytest.raises(MissingEnvironmentVariableError) as info:
        client.compute(df.f.sum()).result()
    message = str(info.value)
    assert message.startswith("on Dask worker tcp://127.0.0.1:"), message
    assert "environment variable DKKEY is not set" in message
    assert "each worker opens the database and loads its keys itself" in info.value.hint
    assert key not in message and key not in info.value.hint
    with cryptdisk.connect(path, env_cfg, read_only=True) as db:  # the client opens it
        assert db.query("SELECT count(*) FROM t") == [(3 * PART_ROWS,)]

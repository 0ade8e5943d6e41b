"""A query's peak memory is bounded by the settings, not by the table's size."""

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

import cryptdisk
from cryptdisk.db import DEFAULT_COLUMN_CACHE_BYTES

MB = 1 << 20
#: The overhead docs/database.md states on top of memory_limit + cache_bytes (with the
#: process's first scan's start-up: connect no longer warms the scan path up).
OVERHEAD = 160 * MB

CHILD = textwrap.dedent("""
    import sys, cryptdisk
    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    db = cryptdisk.connect(sys.argv[1], read_only=True, memory_limit=sys.argv[2],
                           cache_bytes=int(sys.argv[3]))
    db.con.execute("SET enable_progress_bar = false")
    db.query("SELECT 1")
    before = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on: this query's peak
    out = db.query(sys.argv[4])
    print(db.cache.size, before, status("VmHWM:"), repr(out[0]))
""")


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """4.2M rows: 218 MB of decoded columns (8 + 36 + 8 bytes a row), over 4x a 50 MB limit."""
    path = tmp_path_factory.mktemp("mem") / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) ORDER BY c_int")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), i / 7 FROM range(4200000) r(i)")
        decoded = db.arrow_table("t").nbytes
    assert decoded >= 4 * 50 * MB
    return path


def _peak(path, sql, cache_bytes=0):
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path), "50MB", str(cache_bytes),
                           sql], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    cached, before, hwm, answer = proc.stdout.strip().splitlines()[-1].split(" ", 3)
    return int(hwm) - int(before), answer, int(cached)


@pytest.mark.parametrize(("sql", "answer"), [
    ("SELECT length(max(c_str)), sum(c_int), count(c_float) FROM t",
     "(32, 8819997900000, 4200000)"),
    ("SELECT substr(c_str, 1, 1) AS p, count(*), sum(c_int), max(c_float) FROM t GROUP BY p "
     "ORDER BY p", "('0', "),
    ("SELECT c_int, c_str FROM t ORDER BY c_float DESC LIMIT 3", "(4199999, "),
    # the other shapes of `cryptdisk bench olap-engine`: point, range, LIMIT on the key
    ("SELECT c_int, c_str, c_float FROM t WHERE c_int = 2100000", "(2100000, '"),
    ("SELECT count(*), sum(c_float) FROM t WHERE c_int BETWEEN 1000000 AND 1004199",
     "(4200, "),
    ("SELECT c_int, c_str, c_float FROM t ORDER BY c_int LIMIT 10", "(0, '"),
])
def test_peak_memory_stays_within_the_settings(big, sql, answer):
    grown, got, _cached = _peak(big, sql)
    assert got.startswith(answer)
    assert grown <= 50 * MB + OVERHEAD, f"{grown / MB:.0f} MB"


def test_the_cache_bound_adds_at_most_itself(big):
    """Three runs: the second fills the cache (row groups are kept from their second read),
    up to its bound, which c_str (151 MB) exceeds: the third churns through it."""
    sql = "; ".join(["SELECT max(c_str) FROM t"] * 3)
    grown, _, cached = _peak(big, sql, cache_bytes=64 * MB)
    assert 48 * MB <= cached <= 64 * MB
    assert grown <= 50 * MB + 64 * MB + OVERHEAD, f"{grown / MB:.0f} MB"


@pytest.mark.parametrize("sql", [
    "SELECT max(c_str), min(c_int) FROM t",
    # two scans of the table in one statement: the second reads every row group again
    "SELECT (SELECT max(c_str) FROM t) AS a, (SELECT min(c_str) FROM t) AS b",
])
def test_a_cold_query_holds_what_it_holds_with_the_cache_off(big, sql):
    """A query's first run keeps nothing in the cache (c_str alone, 151 MB, would fit
    in this one): its answer and its peak are those of the same query with the cache off."""
    off, answer, _ = _peak(big, sql)
    on, got, cached = _peak(big, sql, cache_bytes=256 * MB)
    assert got == answer and cached == 0
    assert on <= off + 48 * MB, f"{on / MB:.0f} MB with the cache, {off / MB:.0f} MB without"


ALLOC_CHILD = textwrap.dedent("""
    import sys, cryptdisk, pyarrow as pa
    db = cryptdisk.connect(sys.argv[1], read_only=True, cache_bytes=int(sys.argv[2]))
    db.query("SELECT 1")
    pool = pa.default_memory_pool()
    calls, total, held = (pool.num_allocations(), pool.total_bytes_allocated(),
                          pool.bytes_allocated())
    answer = db.query(sys.argv[3])
    print(pool.num_allocations() - calls, pool.total_bytes_allocated() - total,
          pool.bytes_allocated() - held, db.cache.size, repr(answer[0]))
""")


@pytest.mark.parametrize("sql", [
    "SELECT avg(c_float) FROM t",
    "SELECT substr(c_str, 1, 2) AS p, count(*) FROM t GROUP BY p ORDER BY p",
    "SELECT (SELECT max(c_str) FROM t) AS a, (SELECT min(c_str) FROM t) AS b",
])
def test_a_cold_query_allocates_what_it_allocates_with_the_cache_off(big, sql):
    """Arrow's allocations of a query's first run with the default cache are those of the
    same run with the cache off, call for call and byte for byte, and it keeps none of
    them: a first read keeps nothing for a possible admission, nor reads differently
    (kernel time of a cold scan that differed between the two came from the VM's huge
    page faults, not from the cache: docs/engine-cost.md)."""
    runs = []
    for cache_bytes in (0, DEFAULT_COLUMN_CACHE_BYTES):
        proc = subprocess.run([sys.executable, "-c", ALLOC_CHILD, str(big), str(cache_bytes),
                               sql], capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr
        calls, total, held, cached, answer = proc.stdout.strip().splitlines()[-1].split(" ", 4)
        runs.append((int(calls), int(total), int(held), int(cached), ast.literal_eval(answer)))
    off, on = runs
    assert on[3] == 0 and on[2] == off[2] == 0  # nothing kept, by the cache or otherwise
    assert on[:4] == off[:4], f"cache on {on[:3]}, off {off[:3]} (allocations, bytes, held)"
    # the same answer: a float sum's last digit follows the order DuckDB's threads add in
    assert [pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for v in on[4]] \
        == list(off[4])


STREAM_CHILD = textwrap.dedent("""
    import sys, cryptdisk
    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    db = cryptdisk.connect(sys.argv[1], read_only=True, memory_limit="50MB", cache_bytes=0)
    db.query("SELECT 1")
    before = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on: the stream's peak
    rows = total = 0
    with db.stream(sys.argv[2]) as s:
        for batch in s:
            rows += batch.num_rows
            total += sum(batch.column(0).to_pylist())
    print(before, status("VmHWM:"), rows, total)
""")


@pytest.mark.parametrize("sql", [
    "SELECT c_int, c_str, c_float FROM t",
    "SELECT c_int, upper(c_str) FROM t WHERE c_float >= 0",
])
def test_a_stream_of_every_row_stays_within_the_settings(big, sql):
    """Database.stream hands over the 4.2M rows (218 MB decoded, over 4x memory_limit)
    batch by batch: the reading process's peak grows by no more than a query's bound
    (``db.sql`` of the same statement holds the whole result: about 270 MB here)."""
    proc = subprocess.run([sys.executable, "-c", STREAM_CHILD, str(big), sql],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    before, hwm, rows, total = map(int, proc.stdout.split())
    assert (rows, total) == (4_200_000, 8819997900000)
    assert hwm - before <= 50 * MB + OVERHEAD, f"{(hwm - before) / MB:.0f} MB"


def test_optimize_of_an_ordered_table_sorts_within_the_bound(tmp_path):
    """OPTIMIZE ... FINAL of a table with an ORDER BY sorts one key interval at a time: its
    peak stays under memory_limit + the overhead, where one sort of the whole table needed
    the table twice over (218 MB of decoded columns here)."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) ORDER BY c_int")
        for start in (0, 1):  # two interleaved parts: the merge really sorts
            db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), i / 7 "
                   f"FROM range({start}, 4200000, 2) r(i)")
    child = CHILD.replace("read_only=True", "read_only=False")
    proc = subprocess.run([sys.executable, "-c", child, str(path), "100MB", "0",
                           "OPTIMIZE TABLE t FINAL; SELECT count(*), min(c_int), max(c_int) "
                           "FROM t"], capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    _cached, before, hwm, answer = proc.stdout.strip().splitlines()[-1].split(" ", 3)
    assert answer == "(4200000, 0, 4199999)"
    grown = int(hwm) - int(before)
    assert grown <= 100 * MB + OVERHEAD, f"{grown / MB:.0f} MB"
    with cryptdisk.connect(path, read_only=True) as db:
        assert len(db.table("t").parts) == 1
        keys = db.arrow_table("t", ["c_int"]).column("c_int").to_pylist()
    assert keys == list(range(4200000))


SPILL_CHILD = textwrap.dedent("""
    import json, os, sys, threading, cryptdisk
    from cryptdisk.errors import DatabaseError
    roots = sys.argv[3:]
    def files():
        found = {}
        for root in roots:
            for d, _dirs, names in os.walk(root):
                for n in names:
                    p = os.path.join(d, n)
                    try:
                        st = os.stat(p)
                    except FileNotFoundError:  # (one that came and went: seen by a poll)
                        continue
                    found[p] = [st.st_size, st.st_mtime_ns]
        return found
    db = cryptdisk.connect(sys.argv[1], memory_limit="32MB", cache_bytes=0)
    before = files()
    seen, done = set(), threading.Event()
    def poll():  # files that a query creates and deletes while it runs
        while not done.is_set():
            seen.update(files())
            done.wait(0.02)
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        db.query(sys.argv[2])
        error = None
    except DatabaseError as exc:
        error = [type(exc).__name__, str(exc), exc.hint]
    finally:
        done.set()
        poller.join()
    temp = db.query("SELECT current_setting('temp_directory')")[0][0]
    print(json.dumps({"error": error, "before": before, "after": files(),
                      "new": sorted(seen - set(before)), "temp_directory": temp}))
""")


def test_an_aggregation_over_memory_limit_fails_clearly_and_writes_nothing(big, tmp_path):
    """count(DISTINCT c_str) over a column 4x memory_limit cannot run in memory, and
    DuckDB may not spill it (its temporary files would hold the strings unless encrypted,
    which this DuckDB cannot do securely: docs/database.md). The query fails with the
    DatabaseError that says so, and no file appears or changes anywhere DuckDB could put
    temporary files: the database's directory, the working directory (DuckDB's default
    temp_directory is ./.tmp), TMPDIR; polled while the query runs."""
    with cryptdisk.connect(big, read_only=True) as db:
        column = db.arrow_table("t", ["c_str"]).column("c_str")
        assert column.nbytes >= 4 * 32 * MB  # 151 MB, 4.2M distinct: the hash table is more
    cwd, tmpdir = tmp_path / "cwd", tmp_path / "tmpdir"
    cwd.mkdir()
    tmpdir.mkdir()
    env = dict(os.environ, TMPDIR=str(tmpdir))
    proc = subprocess.run([sys.executable, "-c", SPILL_CHILD, str(big),
                           "SELECT count(DISTINCT c_str) FROM t", str(big), str(cwd),
                           str(tmpdir)], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["error"] is not None, "the query answered: it fitted in memory_limit?"
    kind, message, hint = got["error"]
    assert kind == "DatabaseError"
    assert "memory_limit" in message and "spill" in message
    assert "temp_directory" not in message  # (DuckDB's own advice, which cryptdisk refuses)
    assert "memory_limit" in hint
    assert got["new"] == []
    assert got["after"] == got["before"]
    assert os.listdir(cwd) == [] and os.listdir(tmpdir) == []
    assert got["temp_directory"] == ""


MAPPED_CHILD = textwrap.dedent("""
    import sys, cryptdisk
    db = cryptdisk.connect(sys.argv[1], read_only=True, cache_bytes=0)
    print(db.query(sys.argv[2])[0])
    mapping, total = "", 0
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if ":" not in fields[0]:  # a mapping's first line: range, perms, ..., path
                mapping = fields[5] if len(fields) > 5 else ""
            elif fields[0] == "Rss:" and mapping.endswith(".parquet"):
                total += int(fields[1]) * 1024
    print(total)
""")


@pytest.mark.parametrize("sql", ["SELECT sum(c_int) FROM t", "SELECT avg(c_float) FROM t",
                                 "SELECT max(c_str) FROM t"])
def test_a_scan_leaves_no_part_pages_mapped(big, sql):
    _no_pages_mapped(big, sql)


def test_a_scan_of_a_plain_table_leaves_no_part_pages_mapped(tmp_path):
    """A plain part is read, not memory-mapped: a scan of a mapped one kept the pages it
    read in the process's RSS (70 MB for max(c_str) over 2M rows; at 100M rows a GROUP BY
    on c_str peaked at 4.6 GB with the default cache, against 1.1 GB encrypted)."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR) ORDER BY c_int "
               "SETTINGS storage_policy = 'plain'")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(2000000) r(i)")
    _no_pages_mapped(path, "SELECT max(c_str) FROM t")


def _no_pages_mapped(path, sql):
    """The encrypted parts are memory-mapped; a scan drops the pages it read from its
    mapping (the OS page cache keeps them), so the process's RSS does not grow with the
    table. Each row group's c_int chunk is about 512 KiB: 24 MB of them stayed mapped
    (RSS) after one scan when only reads of 1 MiB or more were dropped."""
    proc = subprocess.run([sys.executable, "-c", MAPPED_CHILD, str(path), sql],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    mapped = int(proc.stdout.split()[-1])
    assert mapped <= 2 * MB, f"{mapped / MB:.1f} MB of part files still mapped"


def test_a_row_group_from_the_cache_is_handed_over_without_a_copy(tmp_path):
    """DuckDB gets the cached buffers themselves: a copy per row group and column cost
    fresh memory and a memcpy on every warm scan (ChunkedArray.combine_chunks copies even
    a single chunk)."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR) ORDER BY c_int")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR) FROM range(1000) r(i)")
        meta = db.table("t")
        scan = db._scan(meta, ["c_int", "c_str"])
        op = db._open_parts.get(meta.parts[0])
        for _ in range(2):  # kept from its second read
            scan.read_group(op, 0)
        batch = scan.read_group(op, 0)
        key = f"{meta.parts[0].id}/0"
        for name in ("c_int", "c_str"):
            cached = db.cache.get(key, name)
            assert cached is not None
            got = batch.column(batch.schema.get_field_index(name))
            assert got.buffers()[-1].address == cached.chunk(0).buffers()[-1].address


THREADS_CHILD = textwrap.dedent("""
    import gc, sys, threading, cryptdisk
    from cryptdisk.db import _partread
    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    db = cryptdisk.connect(sys.argv[1])
    db.sql("CREATE TABLE t (k BIGINT, a BIGINT, b BIGINT, c DOUBLE)")
    db.sql("INSERT INTO t SELECT i, (hash(i) >> 1)::BIGINT, (hash(i + 1) >> 1)::BIGINT, "
           "random() FROM range(500000) r(i)")
    part = db.table("t").parts[0]
    opened = _partread.OpenPart(db.config.disks[part.disk], part)
    groups = list(range(opened.meta.num_row_groups))
    def read():
        assert opened.read(groups, ["k", "a", "b", "c"]).num_rows == 500000
    for i in range(int(sys.argv[2])):
        worker = threading.Thread(target=read)
        worker.start()
        worker.join()
        gc.collect()
        if i == 0:
            first = rss()
    opened.close()
    db.close()
    print(rss() - first, len(_partread._ARENAS))
""")


def test_the_arena_of_a_thread_that_ended_is_freed(tmp_path):
    """Each thread decrypts parts into an arena of its own, touched up to the size of its
    largest read; it goes with the thread. The threads that end are many in a long-lived
    process: a statement's insert-source thread, the server's session threads, DuckDB's
    threads calling back into Python (a new thread state, and so a new arena, each call).
    A module-level list kept every arena ever made: 14 MB here for each of 30 threads
    (385 MB), and 3.3 GB mapped (238 arenas) after tests/db/test_db_mutate*.py."""
    proc = subprocess.run([sys.executable, "-c", THREADS_CHILD, str(tmp_path / "db"), "30"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr
    growth, arenas = proc.stdout.split()
    assert int(growth) < 100 * MB, f"RSS grew {int(growth) / MB:.0f} MB over 29 threads' reads"
    assert int(arenas) <= 2  # the process-wide arena and the main thread's, at most

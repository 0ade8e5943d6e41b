"""Tables of hundreds of parts read, checked and merged by a process whose limit of open
files (``ulimit -n``) is lower than their number of parts: the answers are DuckDB's over
the same rows, and a process left with no descriptor at all gets a clear error.

Every INSERT makes a part and every open part holds a descriptor; the children lower
RLIMIT_NOFILE themselves (real processes, real part files, no mocks).
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

import cryptdisk
from cryptdisk.errors import DatabaseError

from .dbhelpers import write_config

SRC = str(Path(__file__).resolve().parents[2] / "src")
PARTS = 400  # parts of each table: more than the children's limit of open files
ROWS = 40  # rows of each part
LIMIT = 256  # the children's soft limit of open files

#: A part's rows (part ``k``): keys spread so that parts' key ranges overlap, NULLs in
#: c_float (a fifth of the rows).
PART_ROWS = ("SELECT (i * 7919 + {k} * 104729) % 100003 AS c_int, md5((i + {k})::VARCHAR) "
             "AS c_str, CASE WHEN i % 5 = 0 THEN NULL ELSE (i * {k}) / 7 END AS c_float "
             "FROM range({rows}) r(i)")
TABLES = {"e": "ORDER BY c_int",  # encrypted, sorted
          "p": "ORDER BY c_int SETTINGS storage_policy = 'plain'",  # plain, sorted
          "u": ""}  # encrypted, no ORDER BY
#: the key of part 7's row 3: a point query that finds rows
POINT = (3 * 7919 + 7 * 104729) % 100003

QUERIES = [
    "SELECT count(*), sum(c_int), count(c_float), max(c_float), min(c_str) FROM {t}",
    "SELECT substr(c_str, 1, 1) AS g, count(*), sum(c_int), max(c_float) FROM {t} "
    "GROUP BY g ORDER BY g",
    f"SELECT c_int, c_str, c_float FROM {{t}} WHERE c_int = {POINT} ORDER BY ALL",
    "SELECT count(*), sum(c_int), max(c_float) FROM {t} WHERE c_int BETWEEN 1000 AND 9000",
    "SELECT c_int, c_str, c_float FROM {t} ORDER BY c_float DESC NULLS LAST, c_int, c_str "
    "LIMIT 5",
    "SELECT c_int, c_str FROM {t} ORDER BY c_int DESC, c_str LIMIT 5",
    "SELECT c_int, c_str FROM {t} WHERE c_str > 'f' ORDER BY c_int LIMIT 3",
    "SELECT count(*) FROM (SELECT c_str FROM {t} LIMIT 7)",
    "SELECT min(c_int), max(c_int) FROM {t}",
]
JOINS = [
    "SELECT count(*), sum(a.c_int) FROM e a JOIN p b ON a.c_int = b.c_int AND a.c_str = b.c_str",
    "SELECT count(*), sum(b.c_int) FROM e a JOIN u b ON a.c_str = b.c_str "
    "WHERE a.c_int < 50000",
]
ALL_QUERIES = [q.format(t=t) for q in QUERIES for t in TABLES] + JOINS

#: Runs with RLIMIT_NOFILE's soft limit at argv[3]: each query of stdin's JSON list on the
#: database argv[1] (config argv[2]), printing one JSON line of rows (or of the error) each.
CHILD = textwrap.dedent("""
    import json, os, resource, sys
    soft = int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE,
                       (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    import cryptdisk
    from cryptdisk.errors import CryptdiskError

    def run(fn):
        try:
            return {"rows": repr(fn())}
        except CryptdiskError as exc:
            return {"error": type(exc).__name__, "message": str(exc), "hint": exc.hint}

    job = json.load(sys.stdin)
    db = cryptdisk.connect(sys.argv[1], config=sys.argv[2], read_only=job["read_only"],
                           cache_bytes=0)
    for sql in job["queries"]:
        print(json.dumps(run(lambda: db.query(sql))), flush=True)
    if job.get("starve"):  # every free descriptor taken, then the query again, then freed
        sql = job["starve"]
        held = []
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        print(json.dumps(run(lambda: db.query(sql))), flush=True)
        for fd in held:
            os.close(fd)
        print(json.dumps(run(lambda: db.query(sql))), flush=True)
    for name in job.get("maintain", []):
        if name == "check":
            print(json.dumps(run(db.check)), flush=True)
        elif name == "gc":
            print(json.dumps(run(db.collect_garbage)), flush=True)
        else:
            print(json.dumps(run(lambda: db.sql(name))), flush=True)
    print(json.dumps({"fds": len(os.listdir("/proc/self/fd"))}))
    db.close()
""")


def _child(path: Path, job: dict, limit: int = LIMIT) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path / "db"), str(path / "c.toml"),
                           str(limit)], input=json.dumps(job), capture_output=True, text=True,
                          env=env, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """Tables e, p and u of PARTS parts each, and DuckDB's tables of the same rows.

    Each part is staged as an insert of its own would write it (``stage_parts``), and
    each table's committed at once: 1,200 INSERTs took 95 s, mostly their commits."""
    path = tmp_path_factory.mktemp("many")
    cfg = write_config(path, [1], 1)
    ref = duckdb.connect()
    with cryptdisk.connect(path / "db", config=cfg) as db:
        for t, rest in TABLES.items():
            db.sql(f"CREATE TABLE {t} (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) {rest}")
            ref.sql(f"CREATE TABLE {t} (c_int BIGINT, c_str VARCHAR, c_float DOUBLE)")
            staged = []
            for k in range(PARTS):
                rows = PART_ROWS.format(k=k, rows=ROWS)
                ref.sql(f"INSERT INTO {t} {rows}")
                staged += db.stage_parts(t, ref.sql(rows).to_arrow_table(),
                                         db.catalog.version + 1)
            db.commit_parts(t, staged)
        counts = db.query("SELECT \"table\", count(*) FROM system.parts GROUP BY 1 ORDER BY 1")
    assert counts == [(t, PARTS) for t in sorted(TABLES)]
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] > PARTS  # (else nothing to show)
    return path, ref


@pytest.fixture(scope="module")
def answers(many):
    path, _ref = many
    got = _child(path, {"read_only": True, "queries": ALL_QUERIES})
    assert len(got) == len(ALL_QUERIES) + 1
    return dict(zip(ALL_QUERIES, got, strict=False))


@pytest.mark.parametrize("sql", ALL_QUERIES)
def test_queries_over_more_parts_than_open_files_answer_as_duckdb(many, answers, sql):
    _path, ref = many
    assert answers[sql] == {"rows": repr(ref.sql(sql).fetchall())}


def test_a_process_without_descriptors_gets_a_clear_error_then_answers(many):
    """No descriptor left: the statement fails with a DatabaseError that says so and
    what to do (not an OSError, not a part taken for damaged); freed, the same connection
    answers."""
    path, ref = many
    sql = QUERIES[0].format(t="e")
    warm, starved, after, _fds = _child(path, {"read_only": True, "queries": [sql],
                                              "starve": sql})
    want = {"rows": repr(ref.sql(sql).fetchall())}
    assert warm == want and after == want
    assert starved["error"] == "DatabaseError", starved
    assert "too many open files" in starved["message"]
    assert f"ulimit -n: {LIMIT}" in starved["message"]
    assert "OPTIMIZE TABLE" in starved["hint"] and "ulimit -n" in starved["hint"]


def test_check_collect_garbage_and_optimize_under_the_limit(many, tmp_path):
    """A writer under the same limit checks every part, collects garbage and merges each
    table (OPTIMIZE), after which the tables hold the same rows in a few parts."""
    path, ref = many
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    full = QUERIES[0]
    job = {"read_only": False, "queries": [],
           "maintain": ["check", "gc", *(f"OPTIMIZE TABLE {t}" for t in TABLES)]}
    checked, collected, *optimized, _fds = _child(copy, job)
    assert checked == {"rows": repr(PARTS * len(TABLES))}
    assert collected == {"rows": "0"}
    assert optimized == [{"rows": "None"}] * len(TABLES)
    queries = [full.format(t=t) for t in TABLES] + ["SELECT count(*) FROM system.parts"]
    *got, parts, _fds = _child(copy, {"read_only": True, "queries": queries})
    assert got == [{"rows": repr(ref.sql(q).fetchall())} for q in queries[:-1]]
    assert parts == {"rows": repr([(len(TABLES),)])}


def test_the_command_raises_its_soft_limit_towards_the_hard_one():
    """``cryptdisk`` (run as the program) raises a low soft limit of open files, as
    ClickHouse's server does at start; the library leaves it alone."""
    code = textwrap.dedent("""
        import resource
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        import cryptdisk
        from cryptdisk.cli._app import OPEN_FILES, _raise_open_files_limit
        cryptdisk.connect  # (the library: nothing raised)
        before = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        _raise_open_files_limit()
        after = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        print(before, after, OPEN_FILES if hard == resource.RLIM_INFINITY
              else min(hard, OPEN_FILES))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60, check=True).stdout.split()
    before, after, want = map(int, out)
    assert before == 64
    assert after == want


def test_the_error_names_the_limit_and_the_way_out():
    from cryptdisk.db._fdlimit import out_of_files, too_many_open_files

    exc = OSError(24, "Too many open files")
    assert out_of_files(exc) and not out_of_files(OSError(2, "No such file"))
    err = too_many_open_files("opening part x", exc)
    assert isinstance(err, DatabaseError)
    assert "opening part x" in str(err) and "OPTIMIZE TABLE" in (err.hint or "")


@pytest.mark.parametrize(("soft", "ranked"), [(4096, True), (1024, True), (256, False)])
def test_a_top_n_over_more_parts_than_kept_open_still_ranks_them_within_the_limit(
        tmp_path, monkeypatch, soft, ranked):
    """A top-N plan holds every part it ranks open: it is given up for streaming only
    over more parts than a quarter of the limit of open files (at ``ulimit -n`` 256, more
    than 64), not over more than the 64 kept open between statements. 80 parts at 1024
    or 4096 read a few row groups; at 256 all 80 are read (DuckDB sorts); the same rows."""
    from cryptdisk.db import _fdlimit

    monkeypatch.setattr(_fdlimit, "open_files_limit", lambda: soft)
    cfg = write_config(tmp_path, [1], 1)
    with cryptdisk.connect(tmp_path / "db", config=cfg, cache_bytes=0) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
        staged = []
        for k in range(80):
            rows = duckdb.sql(f"SELECT i * 80 + {k} AS k, md5(i::VARCHAR) AS s "
                              "FROM range(50) r(i)").to_arrow_table()
            staged += db.stage_parts("t", rows, db.catalog.version + 1)
        db.commit_parts("t", staged)
        ref = duckdb.connect()
        ref.sql("CREATE TABLE t AS SELECT i * 80 + k AS k, md5(i::VARCHAR) AS s "
                "FROM range(50) a(i), range(80) b(k)")
        for sql in ["SELECT k, s FROM t ORDER BY k DESC LIMIT 3",
                    "SELECT k FROM t ORDER BY k LIMIT 2"]:
            assert db.query(sql) == ref.sql(sql).fetchall()
            read = db.last_scans["t"]["row_groups_read"]
            assert (read < 10) if ranked else (read == 80), (sql, read)


def test_an_insert_with_no_descriptor_left_gets_the_clear_error(tmp_path):
    """An INSERT whose part file cannot be opened (no descriptor left) fails with the
    same DatabaseError as a read (not a raw OSError); freed, it inserts."""
    code = textwrap.dedent("""
        import os, sys
        import cryptdisk
        from cryptdisk.errors import DatabaseError
        with cryptdisk.connect(sys.argv[1]) as db:
            db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
            held = []
            try:
                while True:
                    held.append(os.open(os.devnull, os.O_RDONLY))
            except OSError:
                pass
            try:
                db.sql("INSERT INTO t SELECT * FROM range(10)")
            except DatabaseError as exc:
                print("error", "too many open files" in str(exc),
                      "ulimit -n" in (exc.hint or ""))
            finally:
                for fd in held:
                    os.close(fd)
            db.sql("INSERT INTO t SELECT * FROM range(10)")
            print("rows", db.query("SELECT count(*) FROM t")[0][0])
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "db")],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["error", "True", "True", "rows", "10"], proc.stdout

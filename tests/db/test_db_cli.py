"""The database commands end to end, as a user runs them (subprocess)."""

import csv
import io
import json
import os
import subprocess
import sys

import pytest

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def run(*args, stdin=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env, timeout=300, input=stdin)


_NESTED = ("SELECT [1, NULL, 3] AS l, {'d': DATE '2024-01-02', 's': 'x,\"y'} AS st, "
           "MAP {'k': 1.50::DECIMAL(4, 2), 'z': NULL} AS m, MAP {1: [true]} AS mi, "
           "[['a'], []] AS ll, ['\\x00'::BLOB] AS lb, NULL::INTEGER[] AS nl, 7 AS n")


def test_sql_prints_nested_values_as_json_text_in_csv(tmp_path):
    """LIST, STRUCT and MAP values: JSON in --format json, their JSON text in a CSV cell
    (and in the table), never Python's repr (Decimal('1.50'), datetime.date(...))."""
    db = str(tmp_path / "db")
    want = {"l": [1, None, 3], "st": {"d": "2024-01-02", "s": 'x,"y'},
            "m": {"k": "1.50", "z": None}, "mi": {"1": [True]}, "ll": [["a"], []],
            "lb": ["00"], "nl": None, "n": 7}
    js = run("sql", db, "--create", "-q", _NESTED, "--format", "json")
    assert js.returncode == 0, js.stderr
    assert json.loads(js.stdout) == [want]
    out = run("sql", db, "-q", _NESTED, "--format", "csv")
    assert out.returncode == 0, out.stderr
    header, row = list(csv.reader(io.StringIO(out.stdout)))
    assert header == list(want)
    cells = dict(zip(header, row, strict=True))
    assert cells["nl"] == "" and cells["n"] == "7"
    assert {k: json.loads(v) for k, v in cells.items() if k not in ("nl", "n")} == {
        k: v for k, v in want.items() if k not in ("nl", "n")}
    table = run("sql", db, "-q", _NESTED)
    assert table.returncode == 0, table.stderr
    assert '{"k": "1.50", "z": null}' in table.stdout and "Decimal" not in table.stdout


def test_sql_one_shot_formats_and_errors(tmp_path):
    db = str(tmp_path / "db")
    done = run("sql", db, "--create", "-q", "CREATE TABLE t (a BIGINT, b VARCHAR); "
               "INSERT INTO t VALUES (1, 'x'), (2, NULL); SELECT * FROM t ORDER BY a")
    assert done.returncode == 0, done.stderr
    assert "created the encryption key" in done.stderr and "db.key" in done.stderr
    assert done.stdout.splitlines()[0].split() == ["a", "|", "b"]
    assert "(2 rows)" in done.stdout and "NULL" in done.stdout
    csv_out = run("sql", db, "-q", "SELECT * FROM t ORDER BY a", "--format", "csv")
    assert csv_out.stdout == "a,b\n1,x\n2,\n"
    js = run("sql", db, "-q", "SELECT a, b FROM t ORDER BY a", "--format", "json")
    assert json.loads(js.stdout) == [{"a": 1, "b": "x"}, {"a": 2, "b": None}]
    bad = run("sql", db, "-q", "SELECT * FROM nope")
    assert bad.returncode == 1
    assert bad.stderr.startswith("cryptdisk: error:") and "Traceback" not in bad.stderr
    policy = run("sql", db, "-q", "CREATE TABLE u (a INT) SETTINGS storage_policy = 'x'")
    assert policy.returncode == 1 and "unknown storage policy 'x'" in policy.stderr


def test_sql_makes_a_database_only_with_create_and_only_where_nothing_else_lives(tmp_path):
    """A mistyped path is an error that names --create, and leaves nothing behind (no
    directory, no key file); --create makes a database where nothing else lives."""
    for typo in (tmp_path / "sales.bd", tmp_path / "empty"):
        done = run("sql", str(typo), "-q", "CREATE TABLE t (a INT)")
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stdout
        assert done.stderr.startswith(f"cryptdisk: error: no cryptdisk database at {typo}")
        assert "cryptdisk: hint: check the path; --create makes a new database" in done.stderr
        (tmp_path / "empty").mkdir(exist_ok=True)
    assert os.listdir(tmp_path) == ["empty"] and os.listdir(tmp_path / "empty") == []
    done = run("sql", str(tmp_path / "new.db"), "--create", "--read-only", "-q", "SELECT 1")
    assert done.returncode == 1 and "--create makes a database, which --read-only" in done.stderr
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("mine")
    (tmp_path / "plain.txt").write_text("x")
    for target, message in ((tmp_path / "d", "is not empty"),
                            (tmp_path / "plain.txt", "is a file, not a database"),
                            (tmp_path / "nonexistent" / "path.db", "does not exist")):
        for create in ([], ["--create"]):
            done = run("sql", str(target), *create, "-q", "SELECT 1")
            assert done.returncode == 1, done.stdout
            assert done.stderr.startswith("cryptdisk: error:")
            assert message in done.stderr if create else "no cryptdisk database" in done.stderr
            assert "cryptdisk: hint:" in done.stderr and "File exists" not in done.stderr
    assert sorted(os.listdir(tmp_path)) == ["d", "empty", "plain.txt"]
    assert os.listdir(tmp_path / "d") == ["notes.txt"]
    created = run("sql", str(tmp_path / "new.db"), "--create", "-q", "SELECT 1")
    assert created.returncode == 0 and "created a new database in" in created.stderr
    for create in ([], ["--create"]):  # then it opens, with or without --create
        again = run("sql", str(tmp_path / "new.db"), *create, "-q", "SELECT 1")
        assert again.returncode == 0 and "created" not in again.stderr, again.stderr
    made = run("sql", str(tmp_path / "empty"), "--create", "-q", "SELECT 1")
    assert made.returncode == 0 and "created a new database in" in made.stderr


def test_database_commands_take_c_for_config(tmp_path):
    from .dbhelpers import write_config

    cfg = str(write_config(tmp_path, [1], 1))
    db = str(tmp_path / "db")
    done = run("sql", db, "--create", "-c", cfg, "-q", "CREATE TABLE t (a INT); "
               "INSERT INTO t VALUES (1); "
               "SELECT name, is_encrypted FROM system.disks ORDER BY name", "--format", "csv")
    assert done.returncode == 0, done.stderr
    assert "secure,true" in done.stdout and "open,false" in done.stdout
    for command in ("rotate", "reencrypt"):
        done = run(command, db, "-c", cfg)
        assert done.returncode == 0, done.stderr


def test_rotate_and_reencrypt_never_create_a_database(tmp_path):
    """A mistyped path is an error, not a new empty database "re-encrypted" with success."""
    for command in ("rotate", "reencrypt"):
        done = run(command, str(tmp_path / "typo.db"))
        assert done.returncode == 1, done.stdout
        assert done.stderr == f"cryptdisk: error: no cryptdisk database at {tmp_path / 'typo.db'}\n"
    assert os.listdir(tmp_path) == []


def test_reencrypt_prints_only_its_summary(tmp_path):
    db = str(tmp_path / "db")
    run("sql", db, "--create", "-q", "CREATE TABLE t (a INT); INSERT INTO t VALUES (1)")
    done = run("reencrypt", db)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"re-encrypted 1 table(s) of {db} under new data keys (key 1)\n"


def test_sql_reads_statements_from_stdin(tmp_path):
    db = str(tmp_path / "db")
    script = "CREATE TABLE t (a INT);\nINSERT INTO t\n  SELECT * FROM range(5);\n" \
             "SELECT sum(a) AS s\nFROM t;\n"
    done = run("sql", db, "--create", "--format", "csv", stdin=script)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "s\n10\n"


def test_sql_second_writer_and_read_only(tmp_path):
    db = str(tmp_path / "db")
    run("sql", db, "--create", "-q", "CREATE TABLE t (a INT)")
    locker = subprocess.Popen(
        [sys.executable, "-c", "import cryptdisk, sys, time; d = cryptdisk.connect(sys.argv[1]);"
         " print('ready', flush=True); time.sleep(60)", db],
        stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=SRC))
    try:
        assert locker.stdout.readline().strip() == "ready"
        locked = run("sql", db, "-q", "SELECT 1")
        assert locked.returncode == 1 and "open for writing in another process" in locked.stderr
        assert "--read-only" in locked.stderr  # the hint
        ro = run("sql", db, "--read-only", "-q", "SELECT count(*) AS n FROM t", "--format", "csv")
        assert ro.stdout == "n\n0\n", ro.stderr
    finally:
        locker.kill()
        locker.wait()
        locker.stdout.close()


def test_demo_runs_end_to_end(tmp_path):
    work = tmp_path / "new" / "work"  # --dir creates it
    done = run("demo", "--rows", "20000", "--repeats", "1", "--dir", str(work))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "system.disks" in out and "encrypted | true" in out.replace("  ", " ")
    assert "PAR1" in out and "CRYPTDSK" in out
    assert "in these bytes: no" in out and "in these bytes: yes" in out
    for step in ("INSERT", "avg(c_float) cold", "sum(c_int) warm, 1 thread"):
        assert step in out
    assert os.path.exists(work / "demo.db.key")


def test_demo_refuses_a_database_it_did_not_make(tmp_path):
    """demo --dir DIR deleted DIR/demo.db and its key file whoever made them; now only what
    an earlier demo made there (its marker file) is replaced, anything else is refused."""
    work = tmp_path / "mine"
    work.mkdir()
    (work / "demo.db").mkdir()
    (work / "demo.db" / "catalog").write_bytes(b"someone's database")
    (work / "demo.db.key").write_bytes(b"someone's key")
    done = run("demo", "--rows", "2000", "--repeats", "1", "--dir", str(work))
    assert done.returncode == 1, done.stdout
    assert "demo.db exists and was not made by cryptdisk demo" in done.stderr
    assert "Traceback" not in done.stderr
    assert (work / "demo.db" / "catalog").read_bytes() == b"someone's database"
    assert (work / "demo.db.key").read_bytes() == b"someone's key"
    done = run("demo", "--files", "--rows", "200", "--dir", str(work))  # other names: runs
    assert done.returncode == 0, done.stderr
    assert (work / "demo.db.key").read_bytes() == b"someone's key"


def test_demo_runs_again_in_its_own_directory(tmp_path):
    work = tmp_path / "work"
    for _ in range(2):
        done = run("demo", "--rows", "2000", "--repeats", "1", "--dir", str(work))
        assert done.returncode == 0, done.stderr
    assert os.path.exists(work / "demo.db.key")


def _spawn_on_a_terminal(home, *args):
    """`python -m cryptdisk ARGS` on a pseudo-terminal, HOME=home; (pid, terminal fd)."""
    import pty
    import warnings

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
               HOME=str(home), TERM="dumb")
    with warnings.catch_warnings():  # 3.12+ warns about fork in a threaded process; we exec
        warnings.simplefilter("ignore", DeprecationWarning)
        pid, fd = pty.fork()
    if pid == 0:  # child: the command on a terminal
        os.execve(sys.executable, [sys.executable, "-m", "cryptdisk", *args], env)
    return pid, fd


def _read_until(fd, marker, timeout=60):
    """What the terminal shows until ``marker`` (or ``timeout`` seconds, or its end)."""
    import select
    import time

    out = b""
    end = time.monotonic() + timeout
    while marker not in out and time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    return out.decode(errors="replace")


def test_interactive_shell_multiline_and_history(tmp_path):
    db = str(tmp_path / "db")
    home = tmp_path / "home"
    home.mkdir()
    pid, fd = _spawn_on_a_terminal(home, "sql", db, "--create", "--history",
                                   str(home / "hist"))

    def read_until(marker, timeout=60):
        return _read_until(fd, marker, timeout)

    try:
        assert "end statements with ';'" in read_until(b"cryptdisk> ")
        os.write(fd, b"SELECT 40\n")
        assert "->" in read_until(b"-> ")  # the statement continues on the next line
        os.write(fd, b"  + 2 AS answer;\n")
        out = read_until(b"cryptdisk> ")
        assert "answer" in out and "42" in out
        os.write(fd, b"SELECT * FROM nope;\n")
        assert "error:" in read_until(b"cryptdisk> ")  # the shell survives errors
        os.write(fd, b"\x04")  # Ctrl-D
        read_until(b"\n", timeout=10)
    finally:
        _pid, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "SELECT 40" in (home / "hist").read_text()
    assert os.stat(home / "hist").st_mode & 0o077 == 0
    assert not (home / ".cryptdisk_sql_history").exists()


def test_shell_dot_commands(tmp_path):
    import time

    db = str(tmp_path / "db")
    run("sql", db, "--create", "-q",
        "CREATE TABLE sales (a INT); INSERT INTO sales VALUES (1), (2)")
    pid, fd = _spawn_on_a_terminal(tmp_path, "sql", db)
    done = 0

    def read_until(marker, timeout=60):
        return _read_until(fd, marker, timeout)

    try:
        assert ".help" in read_until(b"cryptdisk> ")
        os.write(fd, b".help\n")
        out = read_until(b"cryptdisk> ")
        assert ".tables" in out and ".quit" in out
        os.write(fd, b".tables\n")
        out = read_until(b"cryptdisk> ")
        assert "sales" in out and "default" in out and "(1 row)" in out
        os.write(fd, b".nope\n")
        assert "unknown command .nope" in read_until(b"cryptdisk> ")
        os.write(fd, b".quit\n")
        read_until(b"\n", timeout=10)
        for _ in range(100):  # .quit ends the shell
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(".quit did not end the shell")
    finally:
        if not done:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0


def test_sql_pin_refuses_a_directory_restored_from_an_older_copy(tmp_path):
    import shutil

    db = str(tmp_path / "db")
    assert run("sql", db, "--create", "--pin", "-q", "CREATE TABLE t (a BIGINT)").returncode == 0
    assert (tmp_path / "db.pin").exists()
    shutil.copytree(db, tmp_path / "copy")
    assert run("sql", db, "--pin", "-q", "INSERT INTO t VALUES (1)").returncode == 0
    shutil.rmtree(db)
    shutil.copytree(tmp_path / "copy", db)
    refused = run("sql", db, "--pin", "-q", "INSERT INTO t VALUES (2)")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert "rolled back" in refused.stderr and "db.pin" in refused.stderr
    read = run("sql", db, "--pin", "--read-only", "-q", "SELECT count(*) AS n FROM t",
               "--format", "csv")
    assert read.returncode == 0 and read.stdout == "n\n0\n"
    assert "rolled back" in read.stderr
    assert run("sql", db, "-q", "SELECT count(*) FROM t").returncode == 0  # no pin: no check


def test_demo_fits_80_columns_and_names_its_key_once(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
               COLUMNS="80")
    done = subprocess.run([sys.executable, "-m", "cryptdisk", "demo", "--rows", "300000",
                           "--repeats", "1"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= 80, [line for line in lines if len(line) > 80]
    assert any("300000/300000" in line and "t_encrypted" in line for line in lines)
    assert any(line.startswith("t_encrypted |") for line in lines)  # system.parts, one line
    both = done.stdout + done.stderr
    assert both.count("demo.db.key") == 1 and "created the encryption key" not in both


@pytest.mark.parametrize("rows", ["0", "-5", "ten"])
def test_demo_refuses_a_row_count_below_one(rows):
    done = run("demo", "--rows", rows)
    assert done.returncode == 2 and "--rows" in done.stderr and "Traceback" not in done.stderr

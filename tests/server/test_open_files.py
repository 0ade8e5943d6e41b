"""A real `cryptdisk serve` (the analytical engine, TLS, SCRAM) whose limit of open files
is below its table's number of parts: full scans, point queries, top-N and
count(DISTINCT) answer as DuckDB does over the same rows, beside sessions that each hold a
streamed result suspended mid-table (an Execute's row limit: asyncpg's cursors); sessions
that open streams and go away (abruptly, cancelled, or closing them) leave no descriptor
behind; past the limit a client gets SQLSTATE 53000 with the way out, and the server goes
on serving and accepting once descriptors are free again.

The server's soft and hard RLIMIT_NOFILE are set before it starts (the command raises a
low soft limit towards the hard one: that is checked on its own). Real processes, real
part files, the server's descriptors read from /proc.
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import resource
import ssl
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import asyncpg
import duckdb
import psycopg
import pytest

import cryptdisk
from cryptdisk.errors import DatabaseError
from tests.server.certs import make_ca_and_server

PARTS = 160  # parts of table t: more than the server's limit of open files
ROWS = 150  # rows of each part (24,000 in all: a stream suspends mid-table)
LIMIT = 64  # the server's soft and hard limit of open files
STORM = 20  # clients refused at once at the limit
PASSWORD = "pw of u"
#: part k's rows: keys of the parts overlapping, NULLs in f (a fifth)
PART_ROWS = ("SELECT (i * 7919 + {k} * 104729) % 100003 AS k, md5((i + {k})::VARCHAR) AS s, "
             "CASE WHEN i % 5 = 0 THEN NULL ELSE (i * {k}) / 7 END AS f FROM range({rows}) r(i)")
POINT = (3 * 7919 + 7 * 104729) % 100003  # part 7's row 3
QUERIES = [
    "SELECT count(*), sum(k), count(f), max(f), min(s) FROM t",
    f"SELECT k, s, f FROM t WHERE k = {POINT} ORDER BY ALL",
    "SELECT count(*), sum(k) FROM t WHERE k BETWEEN 1000 AND 9000",
    "SELECT k, s FROM t ORDER BY k DESC, s LIMIT 5",
    "SELECT k, s, f FROM t ORDER BY f DESC NULLS LAST, k, s LIMIT 5",
    "SELECT count(DISTINCT s) FROM t",
    "SELECT count(DISTINCT k) FROM t",
    "SELECT substr(s, 1, 1) AS g, count(*), sum(k) FROM t GROUP BY g ORDER BY g",
]
#: the streamed result each holding session leaves suspended
STREAMED = "SELECT k, s, f FROM t"


class Served:
    """``cryptdisk serve`` on ``root/app.db`` started with RLIMIT_NOFILE (soft, hard)."""

    def __init__(self, root: Path, soft: int, hard: int) -> None:
        self.root, self.ca = root, root / "tls" / "ca.pem"
        self.log = open(root / f"serve-{soft}-{hard}.err", "w+")
        env = {**os.environ, "CRYPTDISK_PASSWORD": PASSWORD}

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cryptdisk", "serve", str(root / "app.db"), "--config",
             str(root / "c.toml"), "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
            stderr=self.log, text=True, cwd=root, env=env, preexec_fn=limit)
        assert self.proc.stdout is not None
        lines = []
        for line in self.proc.stdout:
            lines.append(line)
            m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m[1])
                return
        self.proc.wait(30)
        raise AssertionError(f"the server did not start: {lines} {self.errors()}")

    def errors(self) -> str:
        """What the server wrote to stderr so far (all of it once stopped)."""
        if self.log.closed:
            return self.said
        self.log.seek(0)
        return self.log.read()

    def descriptors(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def limits(self) -> tuple[int, int]:
        for line in Path(f"/proc/{self.proc.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
        raise AssertionError("no open-files limit in /proc")

    def psycopg(self, autocommit: bool = True) -> psycopg.Connection:
        return psycopg.connect(host="localhost", port=self.port, user="u", password=PASSWORD,
                               dbname="app", sslmode="verify-full", sslrootcert=str(self.ca),
                               autocommit=autocommit, connect_timeout=10)

    async def asyncpg(self) -> asyncpg.Connection:
        return await asyncpg.connect(
            host="localhost", port=self.port, user="u", password=PASSWORD, database="app",
            ssl=ssl.create_default_context(cafile=str(self.ca)), timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.said = self.errors()
        self.log.close()


@pytest.fixture(scope="module")
def database(tmp_path_factory: Any) -> tuple[Path, Any]:
    """``app.db`` with table t of PARTS encrypted parts, its user u, a config with the
    server's certificate; and DuckDB's table of the same rows."""
    root = tmp_path_factory.mktemp("fds")
    (root / "tls").mkdir()
    _ca, cert, key = make_ca_and_server(root / "tls")
    config = root / "c.toml"
    config.write_text(f"""
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
hex = "{"cd" * 32}"
[disks.local]
type = "local"
path = "data"
[disks.secure]
type = "encrypted"
disk = "local"
[policies.default]
volumes = [{{ name = "main", disks = ["secure"] }}]
[server]
cert = "{cert}"
key = "{key}"
scram_iterations = 4096
max_connections = 1000
access_log = "{root / 'access.log'}"
""")
    config.chmod(0o600)
    ref = duckdb.connect()
    ref.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        db = cryptdisk.connect(root / "app.db", config=config)
    with db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        staged = []
        for k in range(PARTS):  # (each part as its own INSERT writes it, one commit)
            rows = PART_ROWS.format(k=k, rows=ROWS)
            ref.sql(f"INSERT INTO t {rows}")
            staged += db.stage_parts("t", ref.sql(rows).to_arrow_table(),
                                     db.catalog.version + 1)
        db.commit_parts("t", staged)
        assert db.query("SELECT count(*) FROM system.parts") == [(PARTS,)]
    env = {**os.environ, "CRYPTDISK_PASSWORD": PASSWORD}
    subprocess.run([sys.executable, "-m", "cryptdisk", "serve", str(root / "app.db"),
                    "--config", str(config), "--add-user", "u", "--admin"], env=env,
                   check=True, capture_output=True, timeout=120, cwd=root)
    return root, ref


@pytest.fixture(scope="module")
def served(database: tuple[Path, Any]) -> Any:
    """The server at soft = hard = LIMIT (it cannot raise its own)."""
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= LIMIT
    s = Served(database[0], LIMIT, LIMIT)
    try:
        yield s
    finally:
        s.stop()
    errors = s.errors()
    assert "Traceback" not in errors and "internal error" not in errors, errors[-5000:]


def _wait_for(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _clear(exc: BaseException) -> None:
    """``exc`` is the clear error a client gets past the limit: 53000, the limit, the hint
    (libpq words a refused login as text: ``FATAL: ...`` and ``HINT: ...``)."""
    text = str(exc)
    state = getattr(exc, "sqlstate", None)
    hint = getattr(exc, "hint", None) or getattr(getattr(exc, "diag", None),
                                                 "message_hint", None) or ""
    if state is None and isinstance(exc, psycopg.OperationalError) and "FATAL" in text:
        state, hint = "53000" if "too many open files" in text else None, text
    assert state == "53000", (type(exc), state, text)
    assert "too many open files" in text and f"ulimit -n: {LIMIT}" in text, text
    assert "ulimit -n" in hint, hint
    assert "Traceback" not in text and "internal error" not in text, text


async def _hold(served: Served, rows: int = 100) -> tuple[asyncpg.Connection, Any, Any]:
    """A session with STREAMED's portal suspended after its first ``rows`` rows: (the
    connection, its transaction, the cursor)."""
    conn = await served.asyncpg()
    try:
        tx = conn.transaction()
        await tx.start()
        cur = await conn.cursor(STREAMED)
        got = await cur.fetch(rows)
    except BaseException:
        conn.terminate()
        raise
    assert len(got) == rows
    return conn, tx, cur


def test_the_command_raises_a_low_soft_limit_towards_the_hard_one(database: Any) -> None:
    """`cryptdisk serve` started with a soft limit of LIMIT raises it to its hard limit
    (at most 65536), as every `cryptdisk` command does: so the other tests set the hard
    limit low too. (First: the server of the tests below holds the database's LOCK.)"""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    s = Served(database[0], LIMIT, hard)
    try:
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        assert s.limits()[0] == want
        with s.psycopg() as c:
            assert c.execute("SELECT count(*) FROM t").fetchall() == [(PARTS * ROWS,)]
    finally:
        s.stop()


def test_queries_answer_beside_suspended_streams(served: Served, database: Any) -> None:
    """Each query answers as DuckDB over the same rows, by a new connection, while six
    sessions each hold a streamed result suspended mid-table; then each of those streams
    is read to its end, every row once."""
    _root, ref = database
    want = {sql: ref.sql(sql).fetchall() for sql in QUERIES}
    every = sorted(ref.sql(STREAMED).fetchall(), key=repr)

    async def body() -> None:
        held = [await _hold(served, 100 + i) for i in range(6)]
        for sql in QUERIES:
            def ask(sql: str = sql) -> list[Any]:
                with served.psycopg() as c:
                    return c.execute(sql).fetchall()
            assert await asyncio.to_thread(ask) == want[sql], sql
        for i, (conn, tx, cur) in enumerate(held):
            rest = await cur.fetch(PARTS * ROWS)
            await tx.commit()
            await conn.close()
            assert len(rest) == PARTS * ROWS - 100 - i
        # one session reads the whole stream: the rows as DuckDB's, none twice
        conn, tx, cur = await _hold(served, 1)
        rows = [tuple(r) for r in await cur.fetch(PARTS * ROWS)]
        await tx.commit()
        await conn.close()
        assert len(rows) == PARTS * ROWS - 1

    asyncio.run(body())
    with served.psycopg() as c:
        rows = sorted(c.execute(STREAMED).fetchall(), key=repr)
    assert rows == every


def test_streams_left_open_cancelled_or_cut_off_leave_no_descriptor(served: Served) -> None:
    """Sixteen sessions open streams and go away in every way (the connection dropped with
    the portal suspended, a CancelRequest mid-stream, the transaction rolled back or
    committed; psycopg's DECLAREd cursors, which stream too, left open as the client
    closes, or closed); once they are gone the server holds no more descriptors than
    before."""
    with served.psycopg() as c:  # the kept-open parts filled (the baseline's)
        for sql in QUERIES[:1] * 3:
            c.execute(sql).fetchall()
    _wait_for(lambda: served.descriptors() <= LIMIT, "a settled server")
    before = served.descriptors()

    async def body() -> None:
        for i in range(12):
            conn, tx, _cur = await _hold(served)
            if i % 4 == 0:
                conn.terminate()  # dropped: no Close, no Sync, no Terminate
                continue
            if i % 4 == 1:
                await tx.rollback()  # the block ends: its portal and stream with it
            elif i % 4 == 2:
                await tx.commit()
            else:  # a CancelRequest while another streamed query sends its rows
                with pytest.raises(asyncio.TimeoutError):
                    await conn.fetch("SELECT a.k, a.s FROM t a, range(50) r(i)",
                                     timeout=0.3)
            await conn.close()

    asyncio.run(body())
    for i in range(4):
        with served.psycopg(autocommit=False) as c:
            cur = c.cursor(name=f"c{i}")  # DECLARE ... NO SCROLL CURSOR: streamed
            cur.execute(STREAMED)
            assert len(cur.fetchmany(100)) == 100
            if i % 2:
                cur.close()  # CLOSE; else the client goes with the cursor open
        cur.close()  # (the connection closed: nothing sent)
    with served.psycopg() as c:
        assert c.execute("SELECT count(*) FROM t").fetchall() == [(PARTS * ROWS,)]
    _wait_for(lambda: served.descriptors() <= before,
              f"descriptors back to {before} (now {served.descriptors()})")


def test_past_the_limit_a_clear_error_and_the_server_serves_on(served: Served,
                                                               database: Any) -> None:
    """Sessions holding suspended streams are opened until the server has no descriptor
    left (each holds its socket), and kept: the statement that does not fit fails with
    53000 ("too many open files", the limit, the hint) and its session stays; a new
    connection then is refused so after TLS (it waited unanswered in the accept queue),
    and so is each of a storm of clients after it, which the server's log tells in a
    line or two with their count, not a line each; the held sessions read on (rows, or
    the same error); once they end, the server answers and accepts as before and holds
    what it held."""
    _root, ref = database
    want = ref.sql(QUERIES[0]).fetchall()
    before = served.descriptors()
    failures: list[BaseException] = []

    async def body() -> None:
        held: list[asyncpg.Connection] = []
        cursors = []
        try:
            for _ in range(LIMIT):
                try:
                    conn = await served.asyncpg()
                except asyncpg.PostgresError as exc:  # refused at login: none was left
                    failures.append(exc)
                    break
                held.append(conn)
                try:
                    await conn.execute("BEGIN")
                    cur = await conn.cursor(STREAMED)
                    assert len(await cur.fetch(100)) == 100
                    cursors.append(cur)
                except asyncpg.PostgresError as exc:  # (its session stays, and its socket)
                    failures.append(exc)
                    break
            assert failures, "the limit was never reached"

            def connect() -> None:  # a new client now: refused, none is left
                with pytest.raises(psycopg.OperationalError) as refused:
                    served.psycopg()
                failures.append(refused.value)

            await asyncio.wait_for(asyncio.to_thread(connect), 60)
            for _ in range(STORM):  # a storm of clients: each refused, logged as a few lines
                await asyncio.wait_for(asyncio.to_thread(connect), 60)
            for cur in cursors[:5]:  # held ones read on: rows or the clear error
                try:
                    assert len(await asyncio.wait_for(cur.fetch(1000), 60)) == 1000
                except asyncpg.PostgresError as exc:
                    failures.append(exc)
        finally:
            for conn in held:
                conn.terminate()

    asyncio.run(body())
    for exc in failures:
        _clear(exc)
    assert served.proc.poll() is None
    refusals = [line for line in served.errors().splitlines()
                if "the client is refused (53000)" in line]
    # one line at the first refusal, then one per 10 s with the count: not one a client
    assert 1 <= len(refusals) <= 3 < STORM, refusals
    _wait_for(lambda: served.descriptors() <= before,
              f"descriptors back to {before} (now {served.descriptors()})")
    with served.psycopg() as c:
        assert c.execute(QUERIES[0]).fetchall() == want


@pytest.mark.parametrize("exc", [
    OSError(errno.EMFILE, "Too many open files"),  # a file other than a part's
    OSError(errno.ENFILE, "Too many open files in system"),
    DatabaseError('IO Error: Cannot open file "x.tmp": Too many open files'),  # DuckDB's
])
def test_every_error_of_no_descriptor_left_is_53000_with_the_way_out(exc: Exception) -> None:
    from cryptdisk.server._engines import statement_error

    err = statement_error(exc)
    assert err.sqlstate == "53000", err.sqlstate
    assert "too many open files" in str(err).lower() and "ulimit -n" in (err.hint or "")
    assert ("the system" in str(err)) == (getattr(exc, "errno", None) == errno.ENFILE)


def test_refusals_are_logged_once_per_interval_with_their_count(caplog: Any) -> None:
    """The first refusal is logged at once; those within the next interval as one line
    with their count when it ends; an interval with none ends the throttling, so the next
    refusal is logged at once again."""
    from cryptdisk.server._openfiles import Throttled

    timers: list[Any] = []
    warning = Throttled("refused", lambda delay, fn: timers.append((delay, fn)), every=10)
    exc = OSError(errno.EMFILE, "Too many open files")

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused")]

    with caplog.at_level("WARNING", logger="cryptdisk.server"):
        for _ in range(500):
            warning.warn(exc)
        assert lines() == ["refused: [Errno 24] Too many open files"]
        assert [d for d, _ in timers] == [10]
        timers.pop()[1]()  # the interval ends: one line for the 499 others
        assert lines()[1] == ("refused: 499 more in the last 10 s (the last: [Errno 24] Too "
                              "many open files)")
        timers.pop()[1]()  # an interval with none: nothing logged, no timer
        assert len(lines()) == 2 and timers == []
        warning.warn(exc)
        assert len(lines()) == 3 and len(timers) == 1

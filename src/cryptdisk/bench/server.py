"""Server experiment: the real ``pgbench`` against ``cryptdisk serve`` and PostgreSQL 15.

The PostgreSQL TDE experiment, over the network protocol: pgbench's
TPC-B-like and select-only transactions (custom scripts run with ``-n -f``,
statement for statement pgbench's built-in ones; pgbench's own initialisation
needs PostgreSQL-only SQL, so the SQLite databases are loaded directly, as
``cryptdisk bench oltp`` loads them), a trivial ``SELECT 1`` (query round trips)
and ``SELECT 1`` with a new connection per transaction (``-C``: TLS handshake
plus SCRAM login), against:

- ``serve encrypted``: ``cryptdisk serve --sqlite`` on an encrypted database, TLS;
- ``serve plain``: the same server on an unencrypted SQLite file, TLS;
- ``serve encrypted, no TLS``: the encrypted one over plaintext loopback;
- ``postgresql``: PostgreSQL 15, started here (initdb into the scratch
  directory), TCP loopback with TLS, SCRAM-SHA-256 logins;
- ``postgresql, no TLS``: the same PostgreSQL over plaintext loopback (its
  pg_hba.conf takes plaintext from 127.0.0.1 only), so that the run shows
  PostgreSQL's own TLS/plaintext ratio beside cryptdisk serve's.

Every server listens on 127.0.0.1 at a free port; over TLS the clients verify
its certificate (``sslmode=verify-full``; ``disable`` for the plaintext
strategies). The servers run side by side for the whole experiment; the cases
run one at a time, strategies interleaved and rotated each round. Each run
reports TPS, latency p50/p99 (pgbench's ``-l`` per-transaction log), the
server's CPU seconds per transaction and its peak RSS. ``NOTES`` gives each
server's TLS/plaintext ratio per case and ends with the issue's targets, met
or missed by how much.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import secrets
import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._bodies_oltp import percentiles
from ._model import BenchOptions, Failure, Measurement, Progress, Recorder, Skipped
from ._oltp_sqlite import ACCOUNTS_PER_SCALE, DbSpec, database_files, load
from ._stats import Ratio, ratio_of
from ._suite import experiment_dir, round_order

__all__ = ["NOTES", "run"]

NOTES: list[str] = []
EXPERIMENT = "server"
ENCRYPTED, PLAIN, NO_TLS, POSTGRES, PG_NO_TLS = (
    "serve encrypted", "serve plain", "serve encrypted, no TLS", "postgresql",
    "postgresql, no TLS")
STRATEGIES = (ENCRYPTED, PLAIN, NO_TLS, POSTGRES, PG_NO_TLS)
_PLAINTEXT = (NO_TLS, PG_NO_TLS)  # pgbench connects with sslmode=disable
_BASELINE = {ENCRYPTED: PLAIN, NO_TLS: ENCRYPTED, POSTGRES: ENCRYPTED, PG_NO_TLS: POSTGRES}
#: each server's TLS strategy and its plaintext one: the TLS/plaintext ratios
_TLS_PAIRS = (("cryptdisk serve", ENCRYPTED, NO_TLS), ("PostgreSQL", POSTGRES, PG_NO_TLS))
_USER = "bench"


def _script(kind: str, scale: int) -> str:
    if kind == "select-only":
        return (f"\\set aid random(1, {ACCOUNTS_PER_SCALE * scale})\n"
                "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n")
    if kind == "tpcb-like":
        return (f"\\set aid random(1, {ACCOUNTS_PER_SCALE * scale})\n"
                f"\\set bid random(1, {scale})\n"
                f"\\set tid random(1, {10 * scale})\n"
                "\\set delta random(-5000, 5000)\n"
                "BEGIN;\n"
                "UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;\n"
                "SELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n"
                "UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;\n"
                "UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;\n"
                "INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) "
                "VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);\n"
                "END;\n")
    return "SELECT 1;\n"  # round trips, and handshakes with -C


@dataclass(frozen=True)
class Case:
    kind: str  # "select-only", "tpcb-like", "round-trip", "handshake"
    clients: int

    @property
    def name(self) -> str:
        what = {"round-trip": "SELECT 1 (round trips)",
                "handshake": "connect + SELECT 1 (-C: TLS handshake + SCRAM)"}
        return f"{what.get(self.kind, self.kind + ' scale=1')} clients={self.clients}"


def cases(options: BenchOptions) -> list[Case]:
    clients = [1, 8]
    out = [Case("select-only", c) for c in clients] + [Case("tpcb-like", c) for c in clients]
    return [*out, Case("round-trip", 1), Case("handshake", 1)]


# -- the servers ------------------------------------------------------------------------------


def serve_child(spec: dict[str, Any], conn: Any) -> None:
    """A server process: ``cryptdisk serve --sqlite``'s Server on the spec's database; sends
    its port through ``conn``, serves until SIGTERM."""

    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    from ..keys import Key, Keyring
    from ..server import (
        ScramAuthenticator,
        Server,
        SQLiteEngine,
        UserStore,
        end_point_hash,
        server_context,
    )

    secret = conn.recv()  # the database key and the password: never in argv
    keyring = Keyring([Key(1, bytes.fromhex(secret["key"]))])
    engine = SQLiteEngine(spec["path"], keyring, plaintext=spec["plaintext"])
    store = UserStore(spec["users"], keyring, iterations=4096)  # PostgreSQL's default count
    store.set_user(_USER, secret["password"], admin=True, create=_USER not in store.users)
    with open(spec["cert"], "rb") as f:
        binding = end_point_hash(x509.load_pem_x509_certificate(f.read()).public_bytes(
            Encoding.DER))
    server = Server(engine, host="127.0.0.1", port=0,
                    ssl_context=server_context(spec["cert"], spec["key"]),
                    plaintext_loopback=True, max_connections=200,
                    authenticator=ScramAuthenticator(store, channel_binding=binding))
    workers = spec["workers"]
    if workers > 1:
        from ..server import run_workers

        run_workers(server, workers, ready=lambda address: conn.send(address[1]))
    else:
        server.run(ready=lambda address: conn.send(address[1]))


class _Serve:
    """One ``cryptdisk serve`` process (multiprocessing, spawn) on a SQLite database."""

    def __init__(self, path: str, key_hex: str, plaintext: bool, tls_dir: Path,
                 password: str, workers: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve_child, daemon=True, args=(dict(
            path=path, plaintext=plaintext, users=path + ".users", workers=workers,
            cert=str(tls_dir / "server.pem"), key=str(tls_dir / "server.key")), child))
        self.proc.start()
        parent.send({"key": key_hex, "password": password})
        for _ in range(1200):  # up to 120 s, but not a moment after the child died
            if parent.poll(0.1) or not self.proc.is_alive():
                break
        if not parent.poll():
            self.stop()
            raise RuntimeError(f"cryptdisk serve did not start (exit code {self.proc.exitcode})")
        self.workers = workers
        self.port = int(parent.recv())
        assert self.proc.pid is not None
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()  # SIGTERM: drains, then exits
            self.proc.join(30)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)


class _Postgres:
    """PostgreSQL on 127.0.0.1 (SCRAM; TLS, and plaintext from loopback) via
    :class:`._oltp_pg.PgCluster`."""

    def __init__(self, bindir: str, workdir: Path, tls_dir: Path, password: str,
                 scale: int) -> None:
        from ._oltp_pg import PgCluster

        self.bindir = bindir
        self.cluster = PgCluster(bindir, workdir)
        self.port = _free_port()
        try:
            self.cluster.start(options=f"-p {self.port} -c listen_addresses=127.0.0.1 "
                               f"-c ssl=on -c ssl_cert_file={tls_dir / 'pg.pem'} "
                               f"-c ssl_key_file={tls_dir / 'pg.key'}")
            # the setup's unix socket (in the scratch directory), then TCP from loopback
            # only, over TLS and (the plaintext strategy) without it
            (self.cluster.data / "pg_hba.conf").write_text(
                "local all all trust\n"
                "hostssl all all 127.0.0.1/32 scram-sha-256\n"
                "hostnossl all all 127.0.0.1/32 scram-sha-256\n")
            self.cluster._run("pgbench", "-h", str(self.cluster.sock), "-p", str(self.port),
                              "-U", _USER, "-i", "-q", "-s", str(scale), "postgres")
            self._psql(f"ALTER USER {_USER} PASSWORD '{password}'")
            self.cluster._run("pg_ctl", "-D", str(self.cluster.data), "reload")
            self.pid = self.cluster.postmaster_pid()
            for tls in (True, False):
                if self.uses_tls(tls, tls_dir / "server.pem", password) is not tls:
                    raise RuntimeError(f"a connection with sslmode="
                                       f"{'verify-full' if tls else 'disable'} "
                                       f"{'did not use' if tls else 'used'} TLS")
        except BaseException:
            self.cluster.stop()
            raise

    def uses_tls(self, tls: bool, ca: Path, password: str) -> bool:
        """Whether a TCP connection made as pgbench makes it (:func:`_client_env`) is
        encrypted, as the server sees it (``pg_stat_ssl``)."""
        done = subprocess.run(
            [os.path.join(self.bindir, "psql"), "-X", "-A", "-t", "-c",
             "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"],
            env=_client_env(self.port, tls, ca, password), capture_output=True, text=True,
            timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"psql over TCP failed: {done.stderr.strip()[-300:]}")
        return done.stdout.strip() == "t"

    def _psql(self, sql: str) -> None:
        self.cluster._run("psql", "-h", str(self.cluster.sock), "-p", str(self.port), "-U",
                          _USER, "-X", "-q", "-c", sql, "postgres")

    def stop(self) -> None:
        self.cluster.stop()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process, its reaped children and its live children."""
    import psutil

    try:
        proc = psutil.Process(pid)
        t = proc.cpu_times()
        total = float(t.user + t.system + t.children_user + t.children_system)
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
    except psutil.Error:
        return 0.0
    return total


def _children(pid: int) -> int:
    import psutil

    try:
        return len(psutil.Process(pid).children())
    except psutil.Error:
        return 0


def _settle(pid: int, children: int, timeout: float = 10.0) -> None:
    """Wait until the server has no more child processes than before the run (PostgreSQL's
    backends exit after their client, and their CPU counts once the postmaster reaped them)."""
    deadline = time.monotonic() + timeout
    while _children(pid) > children and time.monotonic() < deadline:
        time.sleep(0.05)


def _tree_rss_mb(pid: int) -> float:
    import psutil

    try:
        proc = psutil.Process(pid)
        total = proc.memory_info().rss
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += child.memory_info().rss
    except psutil.Error:
        return 0.0
    return float(total) / (1 << 20)


# -- one run ----------------------------------------------------------------------------------


def _client_env(port: int, tls: bool, ca: Path, password: str) -> dict[str, str]:
    """libpq's environment for a client of the server at ``port`` (the password in the
    environment, never in argv)."""
    return {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(port), "PGUSER": _USER,
            "PGPASSWORD": password, "PGDATABASE": "postgres",
            "PGSSLMODE": "verify-full" if tls else "disable", "PGSSLROOTCERT": str(ca)}


def _pgbench(pgbench: str, port: int, tls: bool, ca: Path, password: str, case: Case,
             script: Path, duration: float, logs: Path, server_pid: int) -> dict[str, float]:
    from ._oltp_pg import read_latencies

    for old in logs.glob("pgb*"):
        old.unlink()
    env = _client_env(port, tls, ca, password)
    args = [pgbench, "-n", "-f", str(script), "-c", str(case.clients),
            "-j", str(min(case.clients, os.cpu_count() or 1)), "-T", str(max(1, round(duration))),
            "-l", "--log-prefix", str(logs / "pgb")]
    if case.kind == "handshake":
        args.append("-C")
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:  # the server's RSS while the clients are connected
        while not stop.wait(0.25):
            peak[0] = max(peak[0], _tree_rss_mb(server_pid))

    sampler = threading.Thread(target=sample, daemon=True)
    children = _children(server_pid)
    before = _tree_cpu(server_pid)
    # pgbench's CPU: the only child this process reaps during the run (the servers are
    # reaped when they stop)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    sampler.start()
    try:
        done = subprocess.run(args, env=env, capture_output=True, text=True,
                              timeout=duration * 4 + 120, check=False)
    finally:
        stop.set()
        sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (after.ru_utime + after.ru_stime) - (reaped.ru_utime + reaped.ru_stime)
    _settle(server_pid, children)
    used = _tree_cpu(server_pid) - before
    out = done.stdout + done.stderr
    if done.returncode != 0 or "aborted" in out:
        raise RuntimeError(f"pgbench failed ({done.returncode}): {out.strip()[-600:]}")
    m = re.search(r"tps = ([0-9.]+)", out)
    if not m:
        raise RuntimeError(f"no tps in pgbench output: {out[-300:]}")
    lat = sorted(read_latencies(logs / "pgb"))
    tps = float(m[1])
    txns = float(len(lat)) or tps * duration
    return {"tps": tps, "txns": txns, "cpu_s": used, "client_cpu_s": client, "rss_mb": max(peak[0],
                                                                     _tree_rss_mb(server_pid)),
            **percentiles(lat)}


def _workers(text: str | None) -> int:
    """``--workers`` as cryptdisk serve reads it (auto: one per CPU, at most 8)."""
    from ..server import MAX_WORKERS, default_workers

    if text in (None, "auto"):
        return default_workers()
    if not str(text).isdigit() or not 1 <= int(str(text)) <= MAX_WORKERS:
        raise ValueError(f"--workers {text!r}: expected 1 to {MAX_WORKERS} or auto")
    return int(str(text))


def _measurement(case: Case, strategy: str, runs: list[dict[str, float]]) -> Measurement:
    def med(key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    extra: dict[str, Any] = {"p50_ms": med("p50_ms"), "p99_ms": med("p99_ms"),
                             "server_cpu_us_per_txn": statistics.median(
                                 r["cpu_s"] / r["txns"] * 1e6 for r in runs if r["txns"]),
                             "client_cpu_us_per_txn": statistics.median(
                                 r["client_cpu_s"] / r["txns"] * 1e6 for r in runs
                                 if r["txns"]),
                             # per run, server and pgbench together (paired TLS costs)
                             "cpu_us_per_txn_runs": [
                                 (r["cpu_s"] + r["client_cpu_s"]) / r["txns"] * 1e6
                                 if r["txns"] else 0.0 for r in runs]}
    if strategy in _BASELINE:
        extra["baseline"] = _BASELINE[strategy]
    return Measurement(EXPERIMENT, case.name, strategy, "TPS", [r["tps"] for r in runs],
                       cpu_s=[r["cpu_s"] for r in runs], work=med("txns"),
                       work_unit="transactions",
                       peak_rss_mb=max(r["rss_mb"] for r in runs), extra=extra)


# -- the experiment ---------------------------------------------------------------------------


def run(options: BenchOptions, record: Recorder, progress: Progress) -> None:
    from ..server import self_signed
    from ._oltp_pg import INSTALL, find_pg_bin

    duration = options.pick(3.0, 10.0, options.duration)
    repeats = options.pick(2, 3, options.repeats)
    NOTES.clear()
    bindir = find_pg_bin()
    pgbench = os.path.join(bindir, "pgbench") if bindir else shutil.which("pgbench")
    if not pgbench:
        record(Skipped(EXPERIMENT, "all", "pgbench is not installed", INSTALL))
        return
    todo = [c for c in cases(options) if options.case is None or options.case in c.name]
    if not todo:
        raise ValueError(f"no server case matches --case {options.case!r} (cases: "
                         + "; ".join(c.name for c in cases(options)) + ")")
    password = secrets.token_hex(16)
    with experiment_dir(options, "server") as workdir:
        tls = workdir / "tls"
        tls.mkdir()
        self_signed(tls / "server.pem", tls / "server.key")
        shutil.copy(tls / "server.pem", tls / "pg.pem")
        shutil.copy(tls / "server.key", tls / "pg.key")
        logs = workdir / "logs"
        logs.mkdir()
        scripts = {}
        for kind in ("select-only", "tpcb-like", "round-trip"):
            scripts[kind] = workdir / f"{kind}.sql"
            scripts[kind].write_text(_script(kind, 1))
        scripts["handshake"] = scripts["round-trip"]
        keys = {}
        for name in ("encrypted", "plain"):
            keys[name] = secrets.token_hex(32)
            progress(f"server: loading the {name} SQLite database (scale 1)", 0, 1)
            load(DbSpec("cryptdisk" if name == "encrypted" else "plain",
                        str(workdir / f"{name}.db"), keys[name]), 1)
        servers: dict[str, Any] = {}
        workers = _workers(options.workers)
        NOTES.append(f"cryptdisk serve ran with {workers} worker process"
                     f"{'es' if workers > 1 else ''} (--workers "
                     f"{options.workers or 'auto'}; `cryptdisk serve`'s default is auto).")
        try:
            enc = _Serve(str(workdir / "encrypted.db"), keys["encrypted"], False, tls, password,
                         workers)
            servers[ENCRYPTED] = servers[NO_TLS] = enc
            servers[PLAIN] = _Serve(str(workdir / "plain.db"), keys["plain"], True, tls, password,
                                    workers)
            if bindir is None:
                for strategy in (POSTGRES, PG_NO_TLS):
                    record(Skipped(EXPERIMENT, strategy, "PostgreSQL (initdb, pg_ctl) is not "
                                   "installed", INSTALL))
            else:
                try:
                    progress("server: starting PostgreSQL (initdb, pgbench -i -s 1)", 0, 1)
                    if os.geteuid() == 0:
                        for f in ("pg.pem", "pg.key"):
                            shutil.chown(tls / f, "postgres")
                    servers[POSTGRES] = servers[PG_NO_TLS] = _Postgres(bindir, workdir, tls,
                                                                       password, 1)
                except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                    for strategy in (POSTGRES, PG_NO_TLS):
                        record(Skipped(EXPERIMENT, strategy,
                                       f"could not start PostgreSQL: {exc}", INSTALL))
            _run_cases(todo, servers, pgbench, tls / "server.pem", password, scripts,
                       duration, repeats, logs, record, progress)
        finally:
            for server in {id(s): s for s in servers.values()}.values():
                server.stop()
        _check_plaintext(str(workdir / "encrypted.db"))
    _targets(record)


def _run_cases(todo: list[Case], servers: dict[str, Any], pgbench: str, ca: Path,
               password: str, scripts: dict[str, Path], duration: float, repeats: int,
               logs: Path, record: Recorder, progress: Progress) -> None:
    strategies = [s for s in STRATEGIES if s in servers]
    total = len(todo) * repeats * len(strategies)
    done = 0
    for case in todo:
        runs: dict[str, list[dict[str, float]]] = {s: [] for s in strategies}
        alive = list(strategies)
        for round_ in range(repeats):
            for strategy in round_order(alive, round_):
                progress(f"server: {case.name}", done, total)
                done += 1
                server = servers[strategy]
                os.sync()
                try:
                    runs[strategy].append(_pgbench(
                        pgbench, server.port, strategy not in _PLAINTEXT, ca, password, case,
                        scripts[case.kind], duration, logs, server.pid))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    record(Failure(EXPERIMENT, f"{strategy} / {case.name}", str(exc)))
                    alive.remove(strategy)
            if not alive:
                break
        for strategy in strategies:
            if runs[strategy] and strategy in alive:
                _RESULTS[(case.name, strategy)] = m = _measurement(case, strategy,
                                                                   runs[strategy])
                if hasattr(servers[strategy], "workers"):
                    m.extra["workers"] = servers[strategy].workers
                record(m)


_RESULTS: dict[tuple[str, str], Measurement] = {}


def _check_plaintext(path: str) -> None:
    for name in database_files(path):
        with open(name, "rb") as f:
            if b"pgbench_accounts" in f.read():
                raise RuntimeError(f"{name}: plaintext found in an encrypted database")
    NOTES.append("Checked: the encrypted database's files do not contain the table names in "
                 "plaintext.")


def _paired(case: str, a: str, b: str) -> Ratio | None:
    """``a``'s TPS over ``b``'s in ``case``, paired per round (see :func:`._stats.ratio_of`)."""
    ma, mb = _RESULTS.get((case, a)), _RESULTS.get((case, b))
    if ma is None or mb is None:
        return None
    return ratio_of(ma, mb)


def _ratio(case: str, a: str, b: str) -> float | None:
    r = _paired(case, a, b)
    return r.median if r else None


def _tls_cpu(case: str, tls: str, plain: str) -> tuple[float, float, float] | None:
    """What TLS adds to a transaction's CPU, the server's and pgbench's together: the median
    of the per-round differences (microseconds), and their min and max."""
    a, b = _RESULTS.get((case, tls)), _RESULTS.get((case, plain))
    if a is None or b is None:
        return None
    xs, ys = a.extra["cpu_us_per_txn_runs"], b.extra["cpu_us_per_txn_runs"]
    if len(xs) != len(ys) or not all(xs) or not all(ys):
        return None
    ds = [x - y for x, y in zip(xs, ys, strict=True)]
    return float(statistics.median(ds)), min(ds), max(ds)


def _tls_costs() -> None:
    """A note: per case, each server's TLS/plaintext TPS ratio and what TLS adds to the CPU
    of a transaction, cryptdisk serve's beside PostgreSQL's (the same pgbench and machine:
    what TLS costs on this platform)."""
    lines = []
    for case in sorted({c for c, _ in _RESULTS}):
        parts = []
        for who, tls, plain in _TLS_PAIRS:
            r = _paired(case, tls, plain)
            if r is None:
                continue
            part = f"{who} {r.median:.2f} ({r.low:.2f}-{r.high:.2f})"
            cpu = _tls_cpu(case, tls, plain)
            if cpu is not None:
                part += f", CPU {cpu[0]:+.1f} us ({cpu[1]:+.1f} to {cpu[2]:+.1f})"
            parts.append(part)
        if parts:
            lines.append(f"[{case}] " + ", ".join(parts))
    if lines:
        NOTES.append("TLS/plaintext TPS, each server against itself over plaintext loopback, "
                     "and what TLS adds to a transaction's CPU (the server's and pgbench's "
                     "together; medians of per-round paired ratios and differences, min-max): "
                     + "; ".join(lines) + ". Both servers run TLS 1.3 with AES-256-GCM; "
                     "pgbench's TLS work (libpq, OpenSSL) runs on the same cores as the server.")


def _targets(record: Recorder) -> None:
    """The issue's targets, each met or missed (by how much), from paired medians."""
    NOTES.append("pgbench runs one process with `-j` threads (at most one per core) and "
                 "`-n -f script` for every server; PostgreSQL's tables come from `pgbench -i`, "
                 "SQLite's are loaded directly with the same rows. Both servers use "
                 "SCRAM-SHA-256 with 4096 PBKDF2 iterations (PostgreSQL's default). "
                 "PostgreSQL runs with its defaults (shared_buffers=256MB, fsync and "
                 "synchronous_commit on); SQLite in WAL mode, every commit synced before "
                 "it is acknowledged (cryptdisk serve's group commit: synchronous=NORMAL "
                 "and an fdatasync of the WAL after the write lock is released).")
    NOTES.append("Server CPU per transaction (`server_cpu_us_per_txn`, in the JSON): the "
                 "server process (PostgreSQL: the postmaster and its backends) user+sys time "
                 "over the run, divided by the transactions; pgbench's "
                 "(`client_cpu_us_per_txn`) likewise. Peak RSS: the server's RSS "
                 "(PostgreSQL: summed over its processes, shared memory counted in each) "
                 "sampled every 0.25 s.")
    checks = [
        ("encrypted/plain through the same server, TPC-B-like", "tpcb-like", ENCRYPTED, PLAIN,
         0.95),
        ("encrypted/plain through the same server, select-only", "select-only", ENCRYPTED,
         PLAIN, 0.98),
        ("TLS costs at most 10% against plaintext at 8 clients (TLS/plaintext)", None,
         ENCRYPTED, NO_TLS, 0.90),
        ("cryptdisk serve reaches half of PostgreSQL's TPS, select-only", "select-only",
         ENCRYPTED, POSTGRES, 0.5),
        ("cryptdisk serve reaches half of PostgreSQL's TPS, TPC-B-like", "tpcb-like",
         ENCRYPTED, POSTGRES, 0.5),
    ]
    lines = []
    for what, kind, a, b, target in checks:
        for case in sorted({c for c, _ in _RESULTS}):
            if kind is not None and not case.startswith(kind):
                continue
            if kind is None and not (case.endswith("clients=8") and
                                     case.startswith(("select-only", "tpcb-like"))):
                continue
            r = _ratio(case, a, b)
            if r is None:
                continue
            verdict = "met" if r >= target else f"missed by {(target - r) / target:.0%}"
            pg = _ratio(case, POSTGRES, PG_NO_TLS) if b == NO_TLS else None
            own = f"; PostgreSQL's own: {pg:.2f}" if pg is not None else ""
            lines.append(f"{what} [{case}]: {r:.2f} (target >= {target:.2f}): {verdict}{own}")
    _tls_costs()
    NOTES.append("Targets (issue #17; ratios are medians of per-round paired ratios): "
                 + ("; ".join(lines) if lines else "none measured"))
    _RESULTS.clear()

"""A real `cryptdisk serve` (SQLite with worker processes; the analytical engine) stops the
statement of a client that went away (the client process killed with SIGKILL mid-query):
the session ends and its socket is closed, and on the analytical engine other sessions'
statements, which the endless query held up, run again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest

from tests.server.certs import sqlite_serve_config
from tests.server.conftest import ENDLESS
from tests.server.test_workers import _alive, _children, _cpu, _wait_until

KEY_HEX = "ab" * 32


class Serve:
    def __init__(self, root: Path, sqlite: bool) -> None:
        db = str(root / "app.db")
        env = {**os.environ, "CRYPTDISK_PASSWORD": "pw"}

        def cryptdisk(*args: str) -> None:
            subprocess.run([sys.executable, "-m", "cryptdisk", *args], env=env, check=True,
                           capture_output=True, timeout=120, cwd=root)

        if sqlite:  # SQLite with two worker processes, keys and certificate in the config
            self.ca, _cert, config = sqlite_serve_config(root, "c.toml", KEY_HEX)
            options = ["--sqlite", "--config", str(config)]
            serving = [*options, "--workers", "2"]
        else:  # the analytical engine (one process), its key file and a self-signed cert
            cryptdisk("sql", db, "--create", "-q", "SELECT 1")
            self.ca = root / "app.db.server.pem"
            options, serving = [], ["--self-signed"]
        cryptdisk("serve", db, *options, "--add-user", "u", "--admin")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cryptdisk", "serve", db, *serving,
             "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=root, env=env)
        assert self.proc.stdout is not None
        lines: list[str] = []
        for line in self.proc.stdout:
            lines.append(line)
            m = re.search(r"on 127\.0\.0\.1:(\d+) ", line)
            if m:
                break
        assert m, lines
        self.port = int(m[1])
        if sqlite:
            _wait_until(lambda: len(_children(self.proc.pid)) == 2, "workers started")

    def conninfo(self) -> str:
        return (f"host=localhost port={self.port} user=u password=pw dbname=app "
                f"sslmode=verify-full sslrootcert={self.ca}")

    def processes(self) -> list[int]:
        return [self.proc.pid, *_children(self.proc.pid)]

    def holder(self, port: int) -> tuple[int, str] | None:
        """(pid, TCP state) of the server process holding the client port ``port``."""
        for pid in self.processes():
            try:
                conns = psutil.Process(pid).net_connections("tcp")
            except psutil.NoSuchProcess:
                continue
            for c in conns:
                if c.raddr and c.raddr.port == port:
                    return pid, c.status
        return None

    def close(self) -> None:
        workers = _children(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(60)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=["sqlite", "analytical"])
def serve(request: Any, tmp_path: Path) -> Any:
    s = Serve(tmp_path, request.param == "sqlite")
    try:
        yield s
    finally:
        s.close()


def _client_port(pid: int) -> int:
    """The local port of the client process ``pid``'s connection to the server."""
    def ports() -> list[int]:
        return [c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                if c.status == psutil.CONN_ESTABLISHED]

    _wait_until(lambda: bool(ports()), "the client connected")
    (port,) = ports()
    return port


def test_killed_clients_statement_stops(serve: Serve) -> None:
    client = subprocess.Popen(["psql", serve.conninfo(), "-X", "-c", ENDLESS],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port = _client_port(client.pid)
        _wait_until(lambda: serve.holder(port) is not None, "the server has the connection")
        owner = serve.holder(port)[0]  # type: ignore[index]
        idle = _cpu(owner)
        _wait_until(lambda: _cpu(owner) > idle + 0.3, "the statement runs")
    finally:
        client.kill()  # SIGKILL: the kernel closes its socket, nothing is sent
        client.wait(60)
    # the server finds the client gone, stops its statement and closes the socket: no
    # connection in CLOSE_WAIT left behind holding the endless statement
    _wait_until(lambda: serve.holder(port) is None, "the server closed the connection", 60)
    with psycopg.connect(serve.conninfo(), autocommit=True, connect_timeout=60) as conn:
        start = time.monotonic()
        assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
        assert time.monotonic() - start < 60  # (a bound on a hang, not a timing assertion)

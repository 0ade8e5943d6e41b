"""Owner-rights views (``WITH (security_invoker = false)``) of `cryptdisk serve`'s
analytical engine keep their grants across a restart, and across kill -9 at either side
of a view statement's catalog commit: the server comes back with the old view and its
grants or the new one and its grants, never a grant on an object it was not given on (a
view or table later made with a dropped view's name gets none). The kill points come from
the server's own report: started through ``tests/server/stopping_view_serve.py``, the
process prints the point it reached and stops itself there."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.server.certs import sqlite_serve_config

STOPPING = Path(__file__).with_name("stopping_view_serve.py")
SETUP = ["CREATE TABLE secret (s VARCHAR)", "INSERT INTO secret VALUES ('hidden')",
         "CREATE USER bob PASSWORD 'bob pw'",
         "CREATE VIEW v_pub WITH (security_invoker = false) AS "
         "SELECT length(s) AS n FROM secret",
         "GRANT SELECT ON v_pub TO bob"]


class Serve:
    """`cryptdisk serve` of an analytical database in a process of its own (``stop``:
    ``(point, pattern)`` of :mod:`tests.server.stopping_view_serve`)."""

    def __init__(self, root: Path, stop: tuple[str, str] | None = None) -> None:
        self.root, self.db = root, str(root / "app.db")
        env = {**os.environ, "CRYPTDISK_PASSWORD": "pw"}
        if not (root / "c.toml").exists():
            self.ca, _cert, self.config = sqlite_serve_config(root, "c.toml", "ab" * 32)
            self.config.write_text(self.config.read_text() + '[disks.local]\ntype = "local"\n'
                                   f'path = "{root / "data"}"\n[policies.default]\n'
                                   'volumes = [{ name = "main", disks = ["local"] }]\n')
            for args in (["sql", self.db, "--create", "-c", str(self.config), "-q",
                          "SELECT 1"],
                         ["serve", self.db, "--config", str(self.config), "--add-user", "u",
                          "--admin"]):
                subprocess.run([sys.executable, "-m", "cryptdisk", *args], env=env,
                               check=True, capture_output=True, timeout=120)
        self.ca, self.config = root / "tls" / "ca.pem", root / "c.toml"
        launch = [sys.executable, "-m", "cryptdisk"] if stop is None else \
            [sys.executable, str(STOPPING), *stop]
        self.proc = subprocess.Popen(
            [*launch, "serve", self.db, "--config", str(self.config), "--listen",
             "127.0.0.1:0", "--workers", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root,
            start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"on 127\.0\.0\.1:(\d+)", line)
        assert m, line
        self.port = int(m[1])
        self.stops: queue.Queue[int] = queue.Queue()
        self.reader = threading.Thread(target=self._stderr, daemon=True)
        self.reader.start()

    def _stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # drained, so the server never blocks writing its log
            m = re.match(r"view-change: \S+ pid (\d+)", line)
            if m:
                self.stops.put(int(m[1]))

    def connect(self, user: str = "u", password: str = "pw") -> psycopg.Connection:
        return psycopg.connect(host="localhost", port=self.port, user=user, password=password,
                               dbname="app", sslmode="verify-full", sslrootcert=str(self.ca),
                               autocommit=True)

    def kill(self) -> None:
        """kill -9 of the server and every process of its session (its workers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(60)
        self.reader.join(60)
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def servers() -> Any:
    started: list[Serve] = []
    yield started
    for s in started:
        s.kill()


def _state(s: Serve) -> tuple[list[Any], dict[str, list[Any]], list[Any]]:
    """(the views with their mode, bob's grants by table, what bob reads of each view)."""
    with s.connect() as admin:
        views = admin.execute("SELECT name, security_invoker FROM system.views "
                              "ORDER BY name").fetchall()
        grants: dict[str, list[Any]] = {}
        for table, privilege in admin.execute(
                "SELECT \"table\", privilege FROM system.grants WHERE \"user\" = 'bob' "
                "AND \"table\" IS NOT NULL ORDER BY 1, 2").fetchall():
            grants.setdefault(table, []).append(privilege)
    reads = []
    with s.connect("bob", "bob pw") as bob:
        for name, _ in views:
            try:
                reads.append((name, bob.execute(f"SELECT * FROM {name}").fetchall()))
            except psycopg.errors.InsufficientPrivilege:
                reads.append((name, "denied"))
    return views, grants, reads


def test_owner_views_and_their_grants_survive_a_restart(tmp_path: Path,
                                                         servers: list[Serve]) -> None:
    s = Serve(tmp_path)
    servers.append(s)
    with s.connect() as admin:
        for st in SETUP:
            admin.execute(st)
    before = _state(s)
    assert before == ([("v_pub", False)], {"v_pub": ["SELECT"]}, [("v_pub", [(6,)])])
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(60)
    again = Serve(tmp_path)
    servers.append(again)
    assert _state(again) == before
    with again.connect() as admin:
        assert admin.execute("SELECT owner FROM system.views").fetchall() == [("u",)]


#: statement -> (the state kept by a kill before its catalog commit, and after it)
OLD = ([("v_pub", False)], {"v_pub": ["SELECT"]}, [("v_pub", [(6,)])])
CASES = {
    "ALTER VIEW v_pub RENAME TO v_new": (
        OLD, ([("v_new", False)], {"v_new": ["SELECT"]}, [("v_new", [(6,)])])),
    "DROP VIEW v_pub": (OLD, ([], {}, [])),
    "ALTER VIEW v_pub SET (security_invoker = true)": (
        OLD, ([("v_pub", True)], {}, [("v_pub", "denied")])),
}


@pytest.mark.parametrize("point", ["before-catalog-commit", "after-catalog-commit"])
@pytest.mark.parametrize("statement", list(CASES))
def test_kill_9_at_a_view_change_keeps_the_old_grants_or_the_new(
        tmp_path: Path, servers: list[Serve], statement: str, point: str) -> None:
    s = Serve(tmp_path, (point, re.escape(statement)))
    servers.append(s)
    with s.connect() as admin:
        for st in SETUP:
            admin.execute(st)
    admin = s.connect()

    def run() -> None:
        try:
            admin.execute(statement)
        except psycopg.Error:
            pass  # (the server is killed under it)

    threading.Thread(target=run, daemon=True).start()
    s.stops.get(timeout=120)
    s.kill()
    again = Serve(tmp_path)
    servers.append(again)
    assert _state(again) == CASES[statement][point == "after-catalog-commit"]
    if point == "before-catalog-commit":
        return
    with again.connect() as admin:  # a view or a table of the old name gets no grant
        admin.execute("CREATE OR REPLACE VIEW v_pub WITH (security_invoker = false) AS "
                      "SELECT s FROM secret")
        admin.execute("ALTER VIEW v_pub RENAME TO v_other")
        admin.execute("CREATE TABLE v_pub (s VARCHAR)")
    with again.connect("bob", "bob pw") as bob:
        for name in ("v_pub", "v_other"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                bob.execute(f"SELECT * FROM {name}")

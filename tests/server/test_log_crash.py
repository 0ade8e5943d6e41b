"""kill -9 of a process appending to the encrypted access log or the audit log.

Each line rewrites the log's last segment (up to 64 KiB) in place, and a ``pwrite`` is
not atomic: a process killed during it can leave the record half old, half new. A real
child process (forked, so a round takes milliseconds) appends lines in a loop, reporting
each completed write on a pipe, and is killed with SIGKILL at a random moment. After
every kill: the log opens (as ``cryptdisk cat`` opens it), every line whose write
completed is there, in order, followed by at most the one line in flight; the next
round's child (a restarted writer, a starting server's :class:`AuditLog`) opens it for
appending and its lines follow on.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest

import cryptdisk
from cryptdisk.server import AccessLog
from cryptdisk.server._audit import AuditLog

ROUNDS = 40


def _child(kind: str, path: str, keyring, first: int, report: int) -> None:
    try:
        if kind == "access":
            log = AccessLog(path, keyring)
            for n in range(first, first + 1_000_000):
                log.write(user="alice", kind="SELECT", n=n, pad="x" * 200)
                os.write(report, n.to_bytes(8, "little"))
        else:
            audit = AuditLog(path, keyring)  # what a starting server does
            for n in range(first, first + 1_000_000):
                audit.write(session_user="alice", current_user="alice", kind="function",
                            functions=["decrypt"], tables=["t" * 4000], columns=["c"], rows=n)
                os.write(report, n.to_bytes(8, "little"))
    finally:
        os._exit(3)


def _numbers(kind: str, path: str, keyring) -> list[int]:
    if not os.path.exists(path):  # a child killed before it made the file (a loaded host):
        return []                  # no line, which the caller checks against those reported
    if kind == "access":
        with cryptdisk.open(path, "rb", keyring=keyring) as f:
            return [json.loads(line)["n"] for line in f.read().splitlines()]
    audit = AuditLog(path, keyring, read_only=True)
    assert audit.verify() is None  # the hash chain is whole
    return [entry["rows"] for entry in audit.entries()]


@pytest.mark.parametrize("kind", ["access", "audit"])
def test_kill_9_while_appending_keeps_every_completed_line(kind, keyring, tmp_path) -> None:
    path = str(tmp_path / f"sales.{kind}")
    rng = random.Random(20261206)
    expected = 0  # the next line's number
    for round_ in range(ROUNDS):
        read, report = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child)
            os.close(read)
            _child(kind, path, keyring, expected, report)
        os.close(report)
        time.sleep(rng.uniform(0.005, 0.06))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status), (round_, status)  # the child was still appending
        done = bytearray()
        while chunk := os.read(read, 1 << 16):
            done += chunk
        os.close(read)
        completed = [int.from_bytes(done[i : i + 8], "little") for i in range(0, len(done), 8)]
        assert completed == list(range(expected, expected + len(completed)))
        numbers = _numbers(kind, path, keyring)
        last = expected + len(completed)  # the first line not reported written
        # every completed line, in order, then at most the one in flight
        assert numbers[:last] == list(range(last)), (round_, numbers[-3:], last)
        assert numbers in (list(range(last)), list(range(last + 1))), (round_, numbers[-3:])
        expected = len(numbers)
    assert expected > ROUNDS // 2  # the children did append, across segments
    assert os.path.getsize(path) > 2 * 65536

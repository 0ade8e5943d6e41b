"""`cryptdisk serve` that stops itself at a point of a COMMIT with user changes, for crash
tests: ``python stopping_serve.py POINT ARGS...`` runs ``cryptdisk ARGS...`` with the
data's COMMIT (the second phase of :meth:`cryptdisk.server._users.UserStore.commit`) of a
client's transaction wrapped so that, at ``POINT`` (``before-data-commit`` or
``after-data-commit``), the process (the server, or the worker
forked from it) prints ``users-commit: POINT pid PID`` to stderr and stops itself
(SIGSTOP); the test then kills it with -9 exactly there, or lets it go on (SIGCONT).
Test code only: the patch lives in this child process, never in ``src``."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

POINTS = ("before-data-commit", "after-data-commit")


def _stop(point: str) -> None:
    sys.stderr.write(f"users-commit: {point} pid {os.getpid()}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSTOP)


def patch(point: str) -> None:
    from cryptdisk.server import _engines

    if point not in POINTS:
        raise SystemExit(f"unknown stop point {point!r}: one of {', '.join(POINTS)}")
    session = _engines._SQLiteSession
    commit_users, commit = session.commit_users, session._commit_internal

    def armed_commit_users(self: Any, store: Any, ops: Any) -> None:
        # only the COMMIT of a client's transaction: a user statement outside one (the
        # tests' setup) commits the same way, in a transaction of its own, and goes on
        self._stop_armed = bool(self.conn.in_transaction)
        try:
            commit_users(self, store, ops)
        finally:
            self._stop_armed = False

    def stopping(self: Any) -> None:
        armed = getattr(self, "_stop_armed", False)
        if armed and point == "before-data-commit":
            _stop(point)
        commit(self)
        if armed and point == "after-data-commit":
            _stop(point)

    session.commit_users = armed_commit_users  # type: ignore[method-assign]
    session._commit_internal = stopping  # type: ignore[method-assign]


if __name__ == "__main__":
    patch(sys.argv[1])
    from cryptdisk.cli import main

    sys.exit(main(sys.argv[2:]))

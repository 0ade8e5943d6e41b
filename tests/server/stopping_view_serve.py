"""`cryptdisk serve` (the analytical engine) that stops itself at a point of a view
statement, for crash tests: ``python stopping_view_serve.py POINT PATTERN ARGS...`` runs
``cryptdisk ARGS...`` with the catalog change of a ``CREATE``, ``DROP`` or ``ALTER VIEW``
whose text matches ``PATTERN`` (a regular expression) wrapped so that, at ``POINT``
(``before-catalog-commit``: the grants changed that come before it;
``after-catalog-commit``: those that come after it not changed yet), the process prints
``view-change: POINT pid PID`` to stderr and stops itself (SIGSTOP); the test then kills
it with -9 exactly there. Test code only: the patch lives in this child process, never
in ``src`` (tests/server/test_user_commit_crash.py checks that)."""

from __future__ import annotations

import os
import re
import signal
import sys
from typing import Any

POINTS = ("before-catalog-commit", "after-catalog-commit")


def _stop(point: str) -> None:
    sys.stderr.write(f"view-change: {point} pid {os.getpid()}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGSTOP)


def patch(point: str, pattern: str) -> None:
    from cryptdisk.server import _engines

    if point not in POINTS:
        raise SystemExit(f"unknown stop point {point!r}: one of {', '.join(POINTS)}")
    session = _engines._AnalyticalSession
    view_change, execute = session._view_change, session._execute_lengths

    def armed_view_change(self: Any, text: str) -> Any:
        self._stop_armed = re.search(pattern, text) is not None
        try:
            return view_change(self, text)
        finally:
            self._stop_armed = False

    def stopping(self: Any, text: str) -> Any:
        armed = getattr(self, "_stop_armed", False)
        if armed and point == "before-catalog-commit":
            _stop(point)
        result = execute(self, text)
        if armed and point == "after-catalog-commit":
            _stop(point)
        return result

    session._view_change = armed_view_change  # type: ignore[method-assign]
    session._execute_lengths = stopping  # type: ignore[method-assign]


if __name__ == "__main__":
    patch(sys.argv[1], sys.argv[2])
    from cryptdisk.cli import main

    sys.exit(main(sys.argv[3:]))

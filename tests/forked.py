"""A process that dies holding a lock while a child it forked lives on, for the tests
that a forked child never keeps its parent's flock (server, backup).

Imported by those tests; not a test module."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

__all__ = ["child_of_a_dead_holder"]

_PRELUDE = '''
import os, sys, time

def fork_and_die():
    """Fork a child made for anything (multiprocessing, Dask) that never touches the lock
    and sleeps; print its pid; die without letting go of anything (as kill -9 does)."""
    pid = os.fork()
    if pid == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        time.sleep(120)
        os._exit(0)
    print(pid, flush=True)
    os._exit(0)
'''


@contextlib.contextmanager
def child_of_a_dead_holder(script: str, *args: str,
                           env: dict[str, str] | None = None) -> Iterator[int]:
    """Run ``script`` (which takes a lock, then calls ``fork_and_die()`` holding it) in a
    process of its own with ``args``; yield the pid of the child it forked, alive, its
    parent dead; kill the child at the end."""
    out = subprocess.run([sys.executable, "-c", _PRELUDE + textwrap.dedent(script), *args],
                         capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    child = int(out.stdout)
    try:
        os.kill(child, 0)  # alive
        yield child
    finally:
        os.kill(child, signal.SIGKILL)

"""Ctrl-C for a DuckDB statement that runs on the main thread.

Python runs its SIGINT handler (``KeyboardInterrupt``) only between bytecodes of the main
thread. DuckDB (2.0.1) checks for it between the tasks it runs on the caller's thread,
but while its own threads run every task, the caller waits in ``Executor::WaitForTask``
and checks nothing: a large join could go on for minutes after a Ctrl-C (a notebook's
"interrupt kernel" too). So while :func:`interruptible` runs a statement, the signal's
wake-up byte (``signal.set_wakeup_fd``, written by Python's C-level handler, whatever the
main thread does) goes to a pipe that one daemon thread reads: on a SIGINT it calls the
connection's ``interrupt()``, DuckDB stops, and Python raises the ``KeyboardInterrupt``.
A wake-up fd set before (an event loop's) gets every byte forwarded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["interruptible"]

_lock = threading.Lock()
#: the pipe's (read end, write end), or None until the first statement (and in a child)
_pipe: tuple[int, int] | None = None
#: the connection the running statement uses, and the wake-up fd found before it
_running: tuple[Any, int] | None = None


def _watch(read_end: int) -> None:
    while True:
        try:
            data = os.read(read_end, 64)
        except OSError:  # pragma: no cover - the pipe is never closed in this process
            return
        running = _running
        if running is None:
            continue
        con, forward = running
        if forward != -1:
            with contextlib.suppress(OSError):
                os.write(forward, data)
        if signal.SIGINT in data:
            with contextlib.suppress(Exception):
                con.interrupt()


def _write_end() -> int:
    global _pipe
    with _lock:
        if _pipe is None:
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            threading.Thread(target=_watch, args=(read_end,), daemon=True,
                             name="cryptdisk-sigint").start()
            _pipe = (read_end, write_end)
        return _pipe[1]


def _forget_in_child() -> None:
    global _pipe, _running
    _pipe = None  # (the watcher thread is the parent's; a child starts its own)
    _running = None


os.register_at_fork(after_in_child=_forget_in_child)


@contextlib.contextmanager
def interruptible(con: Any) -> Iterator[None]:
    """Run the block with a Ctrl-C interrupting ``con`` (on the main thread with Python's
    own SIGINT handler; elsewhere the block runs as it is)."""
    global _running
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    write_end = _write_end()
    before = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    if before == write_end:  # (a statement inside one: the outer one's)
        yield
        return
    _running = (con, before)
    try:
        yield
    finally:
        _running = None
        signal.set_wakeup_fd(before)

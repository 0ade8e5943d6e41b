"""Descriptors that hold an ``flock`` and that a forked child closes as it starts.

An flock belongs to the open file, not to the process, and a forked child shares its
parent's open files (``O_CLOEXEC`` covers exec only): a child forked (multiprocessing,
Dask) while its parent held a lock would keep it after the parent died, and every other
process would wait for the child to exit. A descriptor passed to :func:`hold` is closed in
each child forked while it is held; closing a copy never unlocks the parent's (that takes
``LOCK_UN`` or its last copy). Call :func:`let_go` before closing it in the process that
opened it; a child opens its own if it needs the lock. :func:`exclusive` is the short
lock of one operation: open, hold, ``flock``, and let go and close after the block."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

__all__ = ["exclusive", "hold", "let_go"]

_HELD: set[int] = set()


def hold(fd: int) -> int:
    """Close ``fd`` in every process forked from now until :func:`let_go`; ``fd``."""
    _HELD.add(fd)
    return fd


def let_go(fd: int) -> None:
    """Stop closing ``fd`` at fork (before this process closes it: the number is reused)."""
    _HELD.discard(fd)


@contextlib.contextmanager
def exclusive(path: str, flags: int = os.O_RDONLY) -> Iterator[int]:
    """An exclusive ``flock`` of ``path`` (a directory, or a file opened with ``flags``)
    for the block, waiting for it; yields the descriptor. A process forked in the block
    closes its copy (:func:`hold`): the lock dies with this process."""
    fd = hold(os.open(path, flags | os.O_CLOEXEC))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        let_go(fd)
        os.close(fd)  # closing the descriptor drops the flock


def _close_in_child() -> None:
    for fd in _HELD:
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)

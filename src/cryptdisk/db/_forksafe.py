"""DuckDB instances that a forked child must never free.

DuckDB is not fork-safe (duckdb 2.0): a forked child that frees a DuckDB instance its
parent made, and did not close, joins the parent's DuckDB threads, which the child does
not have, and dies of a segmentation fault. A child frees such an instance

* at the fork itself, when an instance is held only by another thread (a thread-local,
  a frame): Python clears every other thread's state in the child before any at-fork
  handler of its own runs;
* when it exits normally, as the interpreter frees what modules hold.

So every DuckDB connection cryptdisk opens (not cursors: they free only their own
state while the instance lives), and every source a running statement holds in a
connection's registry (its handle's release takes the connection's locks, which a
parent's query may hold at the fork), is :func:`track`-ed here. Just before a fork the parent
takes one more reference to each one that is still alive, and drops it right after; the
child keeps it forever. A child cannot use those connections (their threads are gone; a
:class:`~cryptdisk.db.Database` must be opened again in the child) and never frees them:
their memory is the child's copy of the parent's pages, gone when the child exits.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any, TypeVar

__all__ = ["track"]

T = TypeVar("T")

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_ACROSS_FORK: list[Any] = []


def track(con: T) -> T:
    """Keep ``con`` (a DuckDB connection, a registry source's handle) alive in every
    child forked while it lives."""
    _LIVE.add(con)
    return con


def _hold() -> None:
    _ACROSS_FORK[:] = list(_LIVE)


def _release_in_parent() -> None:
    _ACROSS_FORK.clear()


def _keep_in_child() -> None:
    global _ACROSS_FORK
    held = _ACROSS_FORK
    if held:
        # a reference nothing will ever drop: the list (and what it holds) outlives the
        # interpreter's own clean-up at exit
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))
    _ACROSS_FORK = []
    _LIVE.clear()


os.register_at_fork(before=_hold, after_in_parent=_release_in_parent,
                    after_in_child=_keep_in_child)

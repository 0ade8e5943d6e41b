"""Waits of a writing thread on its worker threads that a Ctrl-C always ends.

Two things make a plain ``Thread.join()`` or ``Queue.get()`` unsafe on the main thread:

* a SIGINT the kernel delivers to another thread does not wake the main thread out of a
  lock's wait without a timeout: Python runs its handler (``KeyboardInterrupt``) only when
  the main thread next runs bytecode, so a wait for a worker that never comes stays
  waiting for good;
* CPython 3.11's ``Thread.join`` leaves the thread's state lock held when a
  ``KeyboardInterrupt`` lands between its ``acquire()`` and ``release()``: every later
  ``join()`` of that thread waits forever, and ``is_alive()`` stays True.

So a wait here is a loop of short waits (the main thread runs its signal handlers between
them), and a worker's end is a :class:`threading.Event` set in the worker's ``finally``,
never a ``join()``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["TICK", "Worker", "get", "put", "wait"]

#: seconds of each short wait
TICK = 0.05

T = TypeVar("T")


def wait(event: threading.Event) -> None:
    """Wait until ``event`` is set (short waits: a Ctrl-C raises meanwhile)."""
    while not event.wait(TICK):
        pass


def put(q: queue.Queue[T], item: T, gone: Callable[[], bool]) -> bool:
    """Put ``item`` on ``q`` unless ``gone()`` (the taker ended or stopped) first: whether
    it was put."""
    while not gone():
        try:
            q.put(item, timeout=TICK)
            return True
        except queue.Full:
            continue
    return False


def get(q: queue.Queue[T], gone: Callable[[], bool], ended: T) -> T:
    """The next item of ``q``, or ``ended`` when ``gone()`` (the producer ended) and
    nothing is left."""
    while True:
        try:
            return q.get(timeout=TICK)
        except queue.Empty:
            if gone():
                try:
                    return q.get_nowait()
                except queue.Empty:
                    return ended


class Worker:
    """A daemon thread running ``target``, whose end is :attr:`done` (set in its
    ``finally``) instead of a ``join()``."""

    def __init__(self, target: Callable[[], Any], name: str) -> None:
        self.done = threading.Event()
        self._target = target
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            self._target()
        finally:
            self.done.set()

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        """Wait until the target returned (a Ctrl-C raises meanwhile; a later call waits
        again, unharmed)."""
        wait(self.done)

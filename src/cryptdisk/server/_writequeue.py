"""The write lock of ``cryptdisk serve --sqlite``: write transactions take turns here before
SQLite's ``BEGIN IMMEDIATE``.

Within one process the sessions wait in line for a turn, handed on as soon as a
transaction ends. A session waits either on its own thread (:meth:`WriteQueue.acquire`)
or on the server's event loop (:meth:`WriteQueue.acquire_async`): the line is the same,
and a turn handed to a waiter on the loop wakes it there, without a thread of its own.
The holder of the turn then takes an ``flock`` on ``PATH.write-lock``, which the
server's other worker processes hold the same way: a worker that lets it go while another
waits ends that one's pause at once, through a pipe the workers forked from one server
share, and a waiter tries again every 1-2 ms besides (where SQLite's busy handler would
sleep up to 100 ms). A process waiting there writes its pid, when it began to wait and
when it last tried into 24 bytes of memory the worker processes share (anonymous, made
with the queue before they are forked), then tries once more (a release before its pid
was there woke nobody); a process that gets the lock while another, waiting since before
it began, tried within the last 5 ms lets it go once, so two busy workers take turns. The
lock file holds nothing: truncating, damaging or deleting it changes nothing (were those
bytes mapped from it, a process touching them after a truncation would die of SIGBUS).
The kernel drops the flock of a process that dies; a process forked from it closes its
copy of the lock file's descriptor, so it never keeps that flock. Without the lock file
(a read-only directory) SQLite's own locking alone keeps processes apart.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import mmap
import os
import select
import threading
import time
import weakref
from typing import Any

from .._flocks import hold, let_go

__all__ = ["WriteQueue"]

#: how often a waiter in a process's line looks for a cancel (seconds)
QUEUE_POLL = 0.02
#: the first and the longest pause between two tries of another process's flock (seconds):
#: a fallback, since the process that lets it go wakes the waiter through the pipe
_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.002
#: a waiter that has not tried the flock for this long (ns) is taken to be gone: nobody
#: lets the lock go for it
_STALE_NS = 5_000_000


#: every queue of this process: a forked child starts with empty lines (see _forked)
_QUEUES: weakref.WeakSet[WriteQueue] = weakref.WeakSet()


def _forked() -> None:
    """In a forked child: no turn is held and nobody waits in any queue's line (the parent's
    waiters are not in this process; a turn the parent held is the parent's). The child's
    copy of the parent's lock file descriptor is closed: an flock belongs to the open file,
    so that copy would hold the parent's flock after the parent died (O_CLOEXEC covers exec
    only). Closing it never unlocks the parent's (that takes LOCK_UN or its last copy)."""
    for queue in list(_QUEUES):
        queue._mutex = threading.Lock()
        queue._held = False
        queue._line = collections.deque()
        queue._pause_future = None
        queue._fd, queue._pid, queue._waiter = -1, 0, None  # (_flocks closed the fd)


os.register_at_fork(after_in_child=_forked)


def _settle(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


class _Turn:
    """A place in a process's line: ``granted`` (under the queue's mutex) once the turn is
    this waiter's. A thread waits on ``event``; a coroutine on ``future`` (set on
    ``loop``, whose thread is ``thread``)."""

    __slots__ = ("event", "future", "granted", "loop", "thread")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.granted = False
        self.loop = loop
        self.event: threading.Event | None = None
        self.future: asyncio.Future[None] | None = None
        if loop is None:
            self.event = threading.Event()
        else:
            self.future = loop.create_future()
            self.thread = threading.get_ident()

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()
        elif self.thread == threading.get_ident():
            _settle(self.future)
        else:
            assert self.loop is not None
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(_settle, self.future)


class WriteQueue:
    """The write lock of one server's SQLite database (see the module's text)."""

    def __init__(self, path: str) -> None:
        self.path = path + ".write-lock"
        #: guards ``_held`` and ``_line``: this process's turn and who waits for it
        self._mutex = threading.Lock()
        self._held = False
        self._line: collections.deque[_Turn] = collections.deque()
        self._fd = -1
        self._pid = 0
        #: [pid, began, last tried] (monotonic ns) of the latest process to wait: memory
        #: the processes forked from this one share, in use while the lock file is open
        self._shared = memoryview(mmap.mmap(-1, 24, flags=mmap.MAP_SHARED)).cast("q")
        self._waiter: Any = None
        #: a pipe the worker processes forked from this one share: a process that lets the
        #: lock go while another waits writes a byte, which ends that one's pause at once
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        #: the pause :meth:`acquire_async` awaits while another process holds the flock
        self._pause_future: asyncio.Future[None] | None = None
        _QUEUES.add(self)

    def _file(self) -> int:
        if self._pid != os.getpid():  # an flock is per open file: one open per process
            self._pid = os.getpid()
            self._waiter = None
            try:
                self._fd = hold(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                                        0o600))  # a forked child closes its copy
            except OSError:
                self._fd = -1
            else:
                self._waiter = self._shared
        return self._fd

    # -- this process's turn ---------------------------------------------------------------

    def _take(self, loop: asyncio.AbstractEventLoop | None) -> _Turn | None:
        """This process's turn now (None), or a place in its line."""
        with self._mutex:
            if not self._held:
                self._held = True
                return None
            turn = _Turn(loop)
            self._line.append(turn)
            return turn

    def _leave(self, turn: _Turn) -> None:
        """Give up a place in the line; a turn granted meanwhile goes to the next."""
        with self._mutex:
            if not turn.granted:
                self._line.remove(turn)
                return
        self._pass_on()

    def _pass_on(self) -> None:
        """Hand this process's turn to the first in line, or free it."""
        with self._mutex:
            if not self._line:
                self._held = False
                return
            turn = self._line.popleft()
            turn.granted = True
        turn.wake()

    # -- taking and releasing the lock ----------------------------------------------------

    def acquire(self, timeout: float, cancel: threading.Event | None = None) -> bool:
        """Take the lock within ``timeout`` seconds, waiting on the calling thread: False,
        not holding it, when the time runs out or ``cancel`` is set first."""
        deadline = time.monotonic() + timeout
        turn = self._take(None)
        if turn is not None:
            assert turn.event is not None
            while True:  # woken at once by a release; looks at ``cancel`` every QUEUE_POLL
                left = deadline - time.monotonic()
                if (cancel is not None and cancel.is_set()) or left <= 0:
                    self._leave(turn)
                    return False
                if turn.event.wait(min(left, QUEUE_POLL) if cancel else left):
                    break
        fd = self._file()
        if fd < 0:
            return True
        began = time.monotonic_ns()
        pause, yielded = _FIRST_PAUSE, False
        while True:
            got, yielded = self._try_flock(fd, began, yielded)
            if got:
                return True
            left = deadline - time.monotonic()
            if left <= 0 or (cancel is not None and cancel.is_set()):
                self._give_up()
                return False
            self._pause(min(pause, left))
            pause = min(pause * 2, _LONGEST_PAUSE)

    async def acquire_async(self, timeout: float, cancel: threading.Event) -> bool:
        """:meth:`acquire` on the running event loop: waits without a thread (a release hands
        the turn to the loop's waiter, another process's release wakes the loop through the
        pipe), looks at ``cancel`` every QUEUE_POLL in the line and at every try of the
        flock. A task cancelled while it waits gives its place up."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        turn = self._take(loop)
        if turn is not None:
            try:
                while True:
                    future = turn.future
                    assert future is not None
                    timer = loop.call_later(min(deadline - time.monotonic(), QUEUE_POLL),
                                            _settle, future)
                    try:
                        await future
                    finally:
                        timer.cancel()
                    with self._mutex:  # a fresh future unless granted (its wake() sees it)
                        if turn.granted:
                            break
                        turn.future = loop.create_future()
                    if cancel.is_set() or time.monotonic() >= deadline:
                        self._leave(turn)
                        return False
            except BaseException:
                self._leave(turn)
                raise
        fd = self._file()
        if fd < 0:
            return True
        began = time.monotonic_ns()
        pause, yielded = _FIRST_PAUSE, False
        watching = False
        try:
            while True:
                got, yielded = self._try_flock(fd, began, yielded)
                if got:
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or cancel.is_set():
                    self._give_up()
                    return False
                if not watching:
                    loop.add_reader(self._wake_r, self._woken)
                    watching = True
                self._pause_future = future = loop.create_future()
                timer = loop.call_later(min(pause, left), _settle, future)
                try:
                    await future
                finally:
                    timer.cancel()
                    self._pause_future = None
                pause = min(pause * 2, _LONGEST_PAUSE)
        except BaseException:
            self._give_up()
            raise
        finally:
            if watching:
                loop.remove_reader(self._wake_r)

    def _try_flock(self, fd: int, began: int, yielded: bool) -> tuple[bool, bool]:
        """One try of the flock by this process's turn (waiting since ``began``): whether it
        holds the flock now, and whether it has let it go once to a process that waited
        longer (``yielded``, passed on to the next try). Not holding it, this process is
        the waiter the file names. A process that names itself there for the first time
        tries once more at once: a release between its try and its name being written
        woke nobody (the pipe only wakes a waiter the file names)."""
        waiter, me = self._waiter, self._pid
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass
            except OSError:
                return True, yielded  # no flock here: SQLite's locks still apply
            else:
                if yielded or waiter[0] in (0, me) or waiter[1] >= began or \
                        time.monotonic_ns() - waiter[2] > _STALE_NS:
                    if waiter[0] == me:
                        waiter[0] = 0
                    return True, yielded
                fcntl.flock(fd, fcntl.LOCK_UN)  # waiting longer elsewhere: its turn first
                self._wake_waiter()
                yielded = True
            named = waiter[0] == me
            if not named:
                waiter[0], waiter[1] = me, began
            waiter[2] = time.monotonic_ns()
            if named or yielded:
                return False, yielded

    def _give_up(self) -> None:
        """Stop waiting for the flock, not holding it: the turn goes to the next in line."""
        waiter = self._waiter
        if waiter is not None and waiter[0] == self._pid:
            waiter[0] = 0
        self._pass_on()

    def _woken(self) -> None:
        """The pipe is readable (another process let the lock go): end the pause."""
        with contextlib.suppress(OSError):
            os.read(self._wake_r, 64)
        _settle(self._pause_future)

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when another process lets the lock go."""
        try:  # (poll: select() refuses a descriptor past 1023, a busy server's)
            poller = select.poll()
            poller.register(self._wake_r, select.POLLIN)
            if poller.poll(max(0, int(seconds * 1000))):
                os.read(self._wake_r, 64)
        except (BlockingIOError, InterruptedError):
            pass
        except (OSError, ValueError):  # the pipe is closed (the engine is closing)
            time.sleep(seconds)

    def _wake_waiter(self) -> None:
        waiter = self._waiter
        if waiter is not None and waiter[0] not in (0, self._pid):
            with contextlib.suppress(OSError):  # full (nobody read the last ones): fine
                os.write(self._wake_w, b"\0")

    def release(self) -> None:
        if self._fd >= 0 and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            self._wake_waiter()
        self._pass_on()

    def close(self) -> None:
        """Close the wake pipe and this process's lock file; the flock goes with the
        descriptor (the shared memory with the last reference to the queue)."""
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._wake_r = self._wake_w = -1
        if self._pid == os.getpid():
            self._waiter = None
            if self._fd >= 0:
                let_go(self._fd)
                with contextlib.suppress(OSError):
                    os.close(self._fd)
        self._fd, self._pid = -1, 0

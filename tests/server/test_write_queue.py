"""The write queue: one line for the sessions of a process, waiting on their threads or on
the event loop; the flock across worker processes: a process that lets the lock go while
another waits writes a byte into a pipe the workers share, which ends the waiter's pause."""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import threading
import time
from typing import Any

import pytest

from cryptdisk.server import SQLiteEngine
from tests.forked import child_of_a_dead_holder


def _readable(fd: int) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def test_a_release_wakes_a_waiting_process(tmp_path: Any) -> None:
    engine = SQLiteEngine(tmp_path / "q.db", None, plaintext=True)
    queue = engine.write_queue
    assert queue.acquire(5)
    queue.release()
    assert not _readable(queue._wake_r)  # nobody waited: nothing written
    assert queue.acquire(5)
    queue._waiter[0] = os.getpid() + 1  # another process is waiting
    queue.release()
    assert _readable(queue._wake_r)
    began = time.monotonic()
    queue._pause(10)  # ends at once, and takes the byte
    assert time.monotonic() - began < 5
    assert not _readable(queue._wake_r)
    engine.close()


def test_a_forked_worker_waits_for_the_lock_and_gets_it(tmp_path: Any) -> None:
    engine = SQLiteEngine(tmp_path / "q.db", None, plaintext=True)
    queue = engine.write_queue
    go_r, go_w = os.pipe()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker: waits on the flock the parent holds
        code = 1
        try:
            os.close(r)
            os.read(go_r, 1)
            got = queue.acquire(30)
            os.write(w, b"1" if got else b"0")
            queue.release()
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    assert queue.acquire(5)
    os.write(go_w, b"g")
    deadline = time.monotonic() + 30
    while queue._waiter[0] != pid:  # the child is waiting
        assert time.monotonic() < deadline
        time.sleep(0.001)
    queue.release()  # wakes it
    assert os.read(r, 1) == b"1"
    for fd in (r, go_r, go_w):
        os.close(fd)
    assert os.waitpid(pid, 0)[1] == 0
    engine.close()


def test_a_waiter_on_the_event_loop_gets_the_turn_a_thread_releases(tmp_path: Any) -> None:
    """Threads and the event loop wait in one line, served in order: a release on another
    thread hands the turn to the loop's waiter, which wakes without a thread of its own."""
    engine = SQLiteEngine(tmp_path / "q.db", None, plaintext=True)
    queue = engine.write_queue
    order: list[str] = []

    async def main() -> None:
        assert queue.acquire(5)  # held by "a thread" (this one, for now)
        loop_waiter = asyncio.ensure_future(queue.acquire_async(30, threading.Event()))
        await asyncio.sleep(0.05)
        assert not loop_waiter.done()  # in line

        def thread_waiter() -> None:
            assert queue.acquire(30)
            order.append("thread")
            queue.release()

        t = threading.Thread(target=thread_waiter)
        t.start()
        while len(queue._line) < 2:  # the thread is in line behind the loop's waiter
            await asyncio.sleep(0.001)
        releaser = threading.Thread(target=queue.release)  # released on another thread
        releaser.start()
        assert await asyncio.wait_for(loop_waiter, 10) is True
        order.append("loop")
        releaser.join()
        await asyncio.sleep(0.05)
        assert order == ["loop"]  # the thread still waits: the loop holds the turn
        queue.release()
        await asyncio.to_thread(t.join, 10)
        assert order == ["loop", "thread"]
        assert not queue._held and not queue._line

    asyncio.run(main())
    engine.close()


def test_a_cancel_or_the_timeout_ends_a_wait_on_the_loop_and_the_line_goes_on(
        tmp_path: Any) -> None:
    engine = SQLiteEngine(tmp_path / "q.db", None, plaintext=True)
    queue = engine.write_queue

    async def main() -> None:
        assert queue.acquire(5)
        cancel = threading.Event()
        cancelled = asyncio.ensure_future(queue.acquire_async(30, cancel))
        timed_out = asyncio.ensure_future(queue.acquire_async(0.1, threading.Event()))
        dropped = asyncio.ensure_future(queue.acquire_async(30, threading.Event()))
        last = asyncio.ensure_future(queue.acquire_async(30, threading.Event()))
        await asyncio.sleep(0.05)
        cancel.set()  # as a CancelRequest does (the session's interrupt)
        assert await asyncio.wait_for(cancelled, 5) is False
        assert await asyncio.wait_for(timed_out, 5) is False
        dropped.cancel()  # the session's task ends (its client went away)
        with pytest.raises(asyncio.CancelledError):
            await dropped
        assert len(queue._line) == 1 and not last.done()
        queue.release()
        assert await asyncio.wait_for(last, 5) is True  # the one left in line
        queue.release()
        assert not queue._held and not queue._line

    asyncio.run(main())
    engine.close()


def test_a_waiter_cancelled_as_it_is_granted_the_turn_passes_it_on(tmp_path: Any) -> None:
    engine = SQLiteEngine(tmp_path / "q.db", None, plaintext=True)
    queue = engine.write_queue

    async def main() -> None:
        assert queue.acquire(5)
        first = asyncio.ensure_future(queue.acquire_async(30, threading.Event()))
        second = asyncio.ensure_future(queue.acquire_async(30, threading.Event()))
        await asyncio.sleep(0.05)
        queue.release()  # granted to the first, which is cancelled before it runs
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert await asyncio.wait_for(second, 5) is True
        queue.release()
        assert not queue._held and not queue._line

    asyncio.run(main())
    engine.close()


def test_a_forked_worker_waits_for_the_lock_on_its_event_loop(tmp_path: Any) -> None:
    """Another process's release ends the wait on the loop through the pipe, well before
    the polls would: the parent holds the flock for 0.3 s, the child gets it right after."""
    engine = SQLiteEngine(tmp_path / "q.db", None, plaintext=True)
    queue = engine.write_queue
    r, w = os.pipe()
    assert queue.acquire(5)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            got = asyncio.run(queue.acquire_async(30, threading.Event()))
            os.write(w, b"1" if got else b"0")
            queue.release()
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + 30
    while queue._waiter[0] != pid:  # the child is waiting on the flock
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(0.3)
    queue.release()
    assert os.read(r, 1) == b"1"
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0
    engine.close()


def test_a_pause_on_a_descriptor_past_1023_ends_when_woken(tmp_path: Any) -> None:
    """A busy server holds more than 1024 descriptors (a socket per client): the pause
    waits with poll(), as select() refuses such a descriptor (the pause then slept its
    whole time, missing every wake-up)."""
    engine = SQLiteEngine(tmp_path / "q.db", None, plaintext=True)
    queue = engine.write_queue
    high = fcntl.fcntl(queue._wake_r, fcntl.F_DUPFD, 1100)
    try:
        queue._wake_r, low = high, queue._wake_r
        os.write(queue._wake_w, b"x")  # (another process let the lock go)
        began = time.monotonic()
        queue._pause(10)
        assert time.monotonic() - began < 5
        assert not _readable(high)  # the byte taken
    finally:
        queue._wake_r = low
        os.close(high)
        engine.close()


_DIES_HOLDING_THE_LOCK = """
from cryptdisk.server._writequeue import WriteQueue
queue = WriteQueue(sys.argv[1])
assert queue.acquire(5)
fork_and_die()
"""


def test_a_forked_child_does_not_keep_the_write_lock_of_a_parent_that_died(
        tmp_path: Any) -> None:
    """A process forked while its parent held the write lock inherited the lock file's
    descriptor, and an flock belongs to the open file, not the process: after the parent
    died the child (which never wrote) held the lock, and every worker waited for it until
    the child exited. The child now closes its copy as it starts, so the lock goes with
    the parent. (O_CLOEXEC only covers exec, not fork.)"""

    path = str(tmp_path / "q.db")
    with child_of_a_dead_holder(_DIES_HOLDING_THE_LOCK, path):
        fd = os.open(path + ".write-lock", os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError before
        finally:
            os.close(fd)

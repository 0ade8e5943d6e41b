"""The write queue's flock across worker processes: a process that lets the lock go while
another waits writes a byte into a pipe the workers share, which ends the waiter's pause."""

from __future__ import annotations

import os
import select
import time
from typing import Any

from cryptdisk.server import SQLiteEngine


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


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

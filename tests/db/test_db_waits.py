"""A write's waits on its worker threads end after a Ctrl-C left a thread in the state
CPython 3.11's ``Thread.join`` leaves it in when ``KeyboardInterrupt`` lands between its
state lock's ``acquire()`` and ``release()``: the thread has ended, its lock is held, and
``join()`` / ``is_alive()`` wait or lie forever. The waits use events set by the threads
(cryptdisk.db._waits), so a second finish or close after the interrupt returns."""

from __future__ import annotations

import io
import queue
import signal
import threading
from typing import Any

import pyarrow as pa
import pytest

from cryptdisk.db import _waits
from cryptdisk.db._parts import _HashingWriter, _Prefetch


def _leave_lock_held(thread: threading.Thread) -> None:
    """The state an interrupted ``join()`` leaves: the ended thread's lock taken, never
    released (acquiring it blocks until the thread has ended)."""
    lock = thread._tstate_lock  # type: ignore[attr-defined]
    assert lock is not None
    lock.acquire()
    assert thread.is_alive() or not hasattr(thread, "_tstate_lock")


def _returns(call: Any) -> bool:
    """Whether ``call()`` returns (run on a helper thread, given 20 s)."""
    helper = threading.Thread(target=call, daemon=True)
    helper.start()
    helper.join(20)
    return not helper.is_alive()


def _thread(worker: Any) -> threading.Thread:
    return worker.thread if isinstance(worker, _waits.Worker) else worker


def test_writer_finish_after_an_interrupted_join():
    raw = io.BytesIO()
    w = _HashingWriter(raw)
    w.write(b"abc")
    w._queue.put(None)  # as a first finish() did before its join was interrupted
    _leave_lock_held(_thread(w._thread))
    assert _returns(w.finish)
    assert raw.getvalue() == b"abc"
    assert w.digest == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_prefetch_close_after_an_interrupted_join():
    batch = pa.record_batch({"a": [1, 2]})
    p = _Prefetch(iter([batch]))
    assert p.next() == batch
    assert p.next() is None  # the source thread ends after its end
    _leave_lock_held(_thread(p._thread))
    assert _returns(p.close)


def test_prefetch_next_when_the_source_thread_is_gone():
    p = _Prefetch(iter(()))
    p._stop.set()  # the thread ends without putting its end (as after a close)
    while not p._thread.done.is_set():
        p._thread.done.wait(0.01)
    with pytest.raises(Exception, match="source ended"):
        while True:  # its end may have been put before the stop: taken first
            if p.next() is None:
                continue


def test_interrupted_wait_can_be_waited_again():
    # a KeyboardInterrupt in a wait (raised here by the event's wait itself) leaves the
    # event usable: the next wait returns once it is set
    event = threading.Event()
    calls = 0
    real = event.wait

    def interrupted(timeout: float | None = None) -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise KeyboardInterrupt
        return real(timeout)

    event.wait = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        _waits.wait(event)
    event.set()
    _waits.wait(event)
    assert calls == 2


def test_put_and_get_end_when_the_other_side_is_gone():
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    q.put(1)
    assert not _waits.put(q, 2, lambda: True)
    assert _waits.get(q, lambda: True, 0) == 1
    assert _waits.get(q, lambda: True, 0) == 0


def test_a_part_reads_wait_ends_on_a_ctrl_c_another_thread_took(monkeypatch):
    # A SIGINT the kernel hands to another thread does not wake the main thread from a
    # wait without a timeout: reading an encrypted part (read_part), the reader waited
    # for the decrypting thread's range however long it took. Here the range never
    # decrypts until the Ctrl-C has ended the reader's wait.
    from cryptdisk.db import _partread

    stall, interrupted = threading.Event(), threading.Event()
    monkeypatch.setattr(_partread, "_decrypt_range", lambda f, view, offset: None)
    monkeypatch.setattr(_partread, "_decrypt_serial",
                        lambda f, view, offset, step: stall.wait(60))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    decrypting = _partread._Decrypting(object(), [(0, 8, 0), (8, 16, 8)],
                                       memoryview(bytearray(16)))

    def ctrl_c_on_this_thread() -> None:
        while decrypting._wanted < 1:  # (the reader asked for the range, and waits)
            interrupted.wait(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        interrupted.wait(20)  # (a failure: the wait goes on until the range comes)
        stall.set()

    helper = threading.Thread(target=ctrl_c_on_this_thread, daemon=True)
    helper.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            decrypting.wait(1, 1)
        assert not stall.is_set(), "the wait ended only when the range had decrypted"
    finally:
        interrupted.set()
        helper.join()
        decrypting.close()
        signal.signal(signal.SIGINT, before)

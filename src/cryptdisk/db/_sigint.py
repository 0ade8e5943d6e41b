"""Signals during a statement on the main thread: Ctrl-C stops DuckDB, and no signal's
exception is lost.

Python runs its SIGINT handler (``KeyboardInterrupt``) only between bytecodes of the main
thread. DuckDB (2.0.1) checks for it between the tasks it runs on the caller's thread,
but while its own threads run every task, the caller waits in ``Executor::WaitForTask``
and checks nothing: a large join could go on for minutes after a Ctrl-C (a notebook's
"interrupt kernel" too). So while :func:`interruptible` runs a statement, the signal's
wake-up byte (``signal.set_wakeup_fd``, written by Python's C-level handler, whatever the
main thread does) goes to a pipe that one daemon thread reads: on a SIGINT it calls the
connection's ``interrupt()``, DuckDB stops, and Python raises the ``KeyboardInterrupt``.
A wake-up fd set before (an event loop's) gets every byte forwarded.

Python also runs a signal's handler wherever the main thread next checks, a finalizer
included, and there its exception goes nowhere: ``io``'s finalizer closes a file whose
last reference goes (a part an UPDATE replaced, mid-statement) and drops what its
``close()`` raised, silently; a ``__del__``, a weakref callback or a generator's close
prints its exception and goes on; a handler run inside a callback DuckDB called (an
Arrow stream's) becomes a DuckDB error. The statement would go on as if no signal had
come, and a program writing in a loop would never end on its Ctrl-C or SIGTERM. So a
statement on the main thread holds :class:`StatementLock` (a database's lock) or runs in
:class:`kept_signals`: meanwhile the Python handlers of SIGINT and SIGTERM are relayed
(:class:`_Relay`), each keeping the first exception it raised, and a statement that does
not end with that exception (it ends normally, or with another error) raises it at its
end.

That bookkeeping is Python code too, and a signal may be handled at any of its steps
(the first line of ``__exit__`` included, before its ``try``): its exception there would
leave a relay installed for good (every later statement taking it for an enclosing one's,
``signal.getsignal`` answering a relay, asyncio no longer installing its own handler) or
the database's lock held (every other thread waiting for it forever). So a relay called in
one of the bookkeeping's own frames (:data:`_DEFERRING`) defers the handler: it notes the
signal, and the bookkeeping runs the handler once it is done (at the end of ``__enter__``,
inside its cleanup; in ``__exit__`` once the handlers are back).
"""

from __future__ import annotations

import _signal  # (signal's functions: the wrappers in signal.py take ~4 us a call)
import _thread
import contextlib
import os
import select
import signal
import threading
from types import TracebackType
from typing import Any

__all__ = ["StatementLock", "interruptible", "kept_signals"]

#: the signals whose handlers' exceptions end a statement (Ctrl-C; SIGTERM as the
#: ``cryptdisk`` command handles it)
KEPT = (int(signal.SIGINT), int(signal.SIGTERM))

_lock = threading.Lock()
#: held while the pipe's bytes are read and acted on: by the watcher, and by a statement
#: that ends, which takes what is left (a byte read after it would interrupt the next)
_reading = threading.Lock()
#: the pipe's (read end, write end), or None until the first statement (and in a child)
_pipe: tuple[int, int] | None = None
#: the connection the running statement uses, and the wake-up fd found before it
_running: tuple[Any, int] | None = None


def _watch(read_end: int) -> None:
    poller = select.poll()  # (select() refuses a descriptor past 1023)
    poller.register(read_end, select.POLLIN)
    while True:
        try:
            poller.poll()
        except OSError:  # pragma: no cover - the pipe is never closed in this process
            return
        with _reading:
            try:
                data = os.read(read_end, 64)
            except BlockingIOError:  # (the statement that ended took them)
                continue
            except OSError:  # pragma: no cover
                return
            running = _running
            if running is None:  # (a signal as a statement began, before it noted con)
                continue
            con, forward = running
            _forward(forward, data)
            if signal.SIGINT in data:
                with contextlib.suppress(Exception):
                    con.interrupt()


def _forward(fd: int, data: bytes) -> None:
    if fd != -1:
        with contextlib.suppress(OSError):
            os.write(fd, data)


def _write_end() -> int:
    global _pipe
    with _lock:
        if _pipe is None:
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)  # (the watcher waits in select)
            os.set_blocking(write_end, False)
            # not threading.Thread: its start() waits until the new thread runs, which on
            # a statement's critical path meant waiting for the GIL the scan threads hold
            # (a cold point query's first statement waited 0.5-10 ms, with 0.1-0.3 ms of
            # CPU); the watcher needs nothing before its select, and a byte written to the
            # pipe meanwhile waits there for it (a thread of _thread is a daemon thread)
            _thread.start_new_thread(_watch, (read_end,))
            _pipe = (read_end, write_end)
        return _pipe[1]


def _forget_in_child() -> None:
    global _pipe, _running, _reading
    _pipe = None  # (the watcher thread is the parent's; a child starts its own)
    _running = None
    _reading = threading.Lock()  # (perhaps held by the parent's watcher)
    for signum in KEPT:  # (forked mid-statement: the relay's statement is the parent's)
        handler = signal.getsignal(signum)
        if isinstance(handler, _Relay):
            with contextlib.suppress(ValueError):  # (not the child's main thread)
                signal.signal(signum, handler.handler)


os.register_at_fork(after_in_child=_forget_in_child)


class interruptible:
    """Run the block with a Ctrl-C interrupting ``con`` (on the main thread with Python's
    own SIGINT handler; elsewhere the block runs as it is).

    A class, not a generator: a KeyboardInterrupt raised as the block ends, before a
    generator's ``finally`` ran, left the generator to a garbage collection on any thread
    (``set_wakeup_fd`` only works on the main one). Its ``__enter__`` and ``__exit__`` are
    bookkeeping (:data:`_DEFERRING`): in a statement (a database's lock), a signal handled
    in them, their first instruction included, runs its handler at the statement's end,
    so the wake-up fd and :data:`_running` are always put back (a Ctrl-C at the first
    line of ``__exit__`` left cryptdisk's pipe as the wake-up fd and a stale
    ``_running``, whose connection the next Ctrl-C would interrupt)."""

    __slots__ = ("_con", "_state")

    def __init__(self, con: Any) -> None:
        self._con = con
        #: (the wake-up fd before, the pipe) while this block owns the wake-up fd
        self._state: tuple[int, tuple[int, int] | None] | None = None

    def __enter__(self) -> None:
        global _running
        if (threading.current_thread() is not threading.main_thread()
                or _beneath(_signal.getsignal(signal.SIGINT)) is not signal.default_int_handler):
            return
        write_end = _write_end()
        pipe = _pipe
        before = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        if before == write_end:  # (a statement inside one: the outer one's)
            return
        self._state = (before, pipe)
        _running = (self._con, before)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        global _running
        state, self._state = self._state, None
        if state is None:
            return
        before, pipe = state
        try:
            signal.set_wakeup_fd(before)
        finally:
            with _reading:  # the bytes of its signals are its own: forwarded, acted on no more
                _running = None
                if pipe is not None and pipe is _pipe:  # (in a child forked meanwhile: the
                    # parent's pipe)
                    with contextlib.suppress(OSError):  # (BlockingIOError: none left)
                        while data := os.read(pipe[0], 64):
                            _forward(before, data)


class _Relay:
    """A signal's Python handler while a statement runs on the main thread: calls it and
    keeps the first exception it raised (which a finalizer or DuckDB may swallow)."""

    __slots__ = ("handler", "live", "pending", "raised")

    def __init__(self, handler: Any, live: list[bool]) -> None:
        self.handler = handler
        self.raised: BaseException | None = None
        #: the frame of a signal handled in the bookkeeping (deferred), or None
        self.pending: Any = None
        #: ``[True]`` while its statement runs, one cell for all of its relays (set False
        #: at once as it ends: a relay a signal left installed then is the handler it
        #: relays, and the next statement puts that back)
        self.live = live

    def __call__(self, signum: int, frame: Any) -> Any:
        if not self.live[0]:
            return self.handler(signum, frame)
        if frame is not None and frame.f_code in _DEFERRING:
            self.pending = frame  # (run by _run_pending once the bookkeeping is done)
            return None
        try:
            return self.handler(signum, frame)
        except BaseException as exc:
            if self.raised is None:
                self.raised = exc
            raise


def _run_pending(relays: list[tuple[int, _Relay]] | None = None) -> None:
    """Run the handler of each signal a relay deferred: of ``relays``, put back (the
    handler itself), or of the relays installed (None: an enclosing statement's; through
    the relay). What a handler raises propagates."""
    if relays is None:
        for signum in KEPT:
            relay = _signal.getsignal(signum)
            if isinstance(relay, _Relay) and relay.pending is not None:
                frame, relay.pending = relay.pending, None
                relay(signum, frame)
        return
    for signum, relay in relays:
        frame, relay.pending = relay.pending, None
        if frame is not None:
            relay.handler(signum, frame)


def _beneath(handler: Any) -> Any:
    """The handler a relay runs, or ``handler`` itself."""
    return handler.handler if isinstance(handler, _Relay) else handler


#: what :func:`_relay` returns on a thread other than the main one (never changed)
_ELSEWHERE: list[tuple[int, _Relay]] = []


def _relay() -> list[tuple[int, _Relay]]:
    """Relay the Python handlers of :data:`KEPT` (on the main thread, unless a statement
    there relays them already): the relays installed."""
    if threading.current_thread() is not threading.main_thread():
        return _ELSEWHERE
    relays: list[tuple[int, _Relay]] = []
    live = [True]
    try:
        for signum in KEPT:
            handler = _signal.getsignal(signum)
            if isinstance(handler, _Relay):
                if handler.live[0]:
                    return relays  # (an enclosing statement's: it keeps them)
                handler = handler.handler  # (left by a signal as one ended: replaced)
            if callable(handler):  # (not SIG_DFL, SIG_IGN nor a C handler: nothing raised)
                relay = _Relay(handler, live)
                relays.append((signum, relay))  # (first: then a signal as it is installed
                _signal.signal(signum, relay)   # finds it in the list _restore reads)
    except BaseException:  # (a signal meanwhile: its handler raised; nothing stays relayed)
        _restore(relays)
        raise
    return relays


def _restore(relays: list[tuple[int, _Relay]]) -> None:
    """Put the relayed handlers back (each, whatever a handler raises meanwhile; a handler
    the statement set itself stays)."""
    try:
        _put_back(relays)
    finally:  # (a handler put back raised before the next one was: that relay is stale)
        if relays:
            relays[0][1].live[0] = False
            _put_back_stale()


def _put_back_stale() -> None:
    """Put back the handler of a relay left installed after its statement ended."""
    for signum in KEPT:
        handler = _signal.getsignal(signum)
        if isinstance(handler, _Relay) and not handler.live[0]:
            _signal.signal(signum, handler.handler)


def _put_back(relays: list[tuple[int, _Relay]]) -> None:
    if not relays:
        return
    (signum, relay), rest = relays[0], relays[1:]
    handler = relay.handler
    try:
        if _signal.getsignal(signum) is relay:
            _signal.signal(signum, handler)
    finally:
        _put_back(rest)


def _end(relays: list[tuple[int, _Relay]], exc: BaseException | None) -> None:
    """End a statement that relayed ``relays``: raise the exception a handler raised
    unless the statement ends with it (``exc``, the one it ends with, or None)."""
    try:
        _restore(relays)
    finally:  # (the handlers back: a signal deferred meanwhile runs its own)
        _run_pending(relays)
    raised = []
    for _s, r in relays:  # (a loop: a list comprehension has a frame of its own)
        if r.raised is not None:
            raised.append(r.raised)
    if not raised or (exc is not None and any(isinstance(exc, type(r)) for r in raised)):
        return
    # swallowed (a finalizer's close(), a DuckDB callback's error): the signal's exception
    # after all, the statement's own error (if any) as its context
    raise raised[0]


class kept_signals:
    """Run the block (a statement) with SIGINT's and SIGTERM's Python handlers relayed:
    an exception one raised that the block does not end with is raised at its end (on
    the main thread; nested, or elsewhere, the block runs as it is)."""

    __slots__ = ("_relays",)

    def __enter__(self) -> None:
        self._relays: list[tuple[int, _Relay]] = []
        self._relays = _relay()
        try:
            if self._relays is not _ELSEWHERE:
                _run_pending()
        except BaseException:  # (the block does not run: its __exit__ is not called)
            relays, self._relays = self._relays, []
            _restore(relays)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        relays, self._relays = self._relays, []
        if relays:
            _end(relays, exc)
        elif relays is not _ELSEWHERE:
            _run_pending()  # (nested: the enclosing statement's relays)


def _acquire(lock: threading.RLock) -> None:
    """``lock.acquire()`` in a frame of its own: a signal while it waits for another
    thread's statement is handled there (an enclosing statement's relay would defer it in
    :meth:`StatementLock.__enter__` until the wait ended)."""
    lock.acquire()


class StatementLock:
    """A :class:`threading.RLock` (a database's: one statement at a time) whose outermost
    hold on the main thread runs as :func:`kept_signals` does."""

    __slots__ = ("_held", "_lock")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: the relays of each hold, innermost last (changed by the holder only)
        self._held: list[list[tuple[int, _Relay]]] = []

    def __enter__(self) -> None:
        relays: list[tuple[int, _Relay]] = []
        try:
            _acquire(self._lock)
            relays = _relay()
            self._held.append(relays)
            if relays is not _ELSEWHERE:
                _run_pending()
        except BaseException:  # (a signal once acquired, or while relaying: not held)
            try:
                if self._held and self._held[-1] is relays:
                    self._held.pop()
                _restore(relays)
            finally:
                # (held before, acquire() took it again: it never waits for its owner)
                if self._lock._is_owned():  # type: ignore[attr-defined]
                    self._lock.release()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            relays = self._held.pop()
            if relays:
                _end(relays, exc)
            elif relays is not _ELSEWHERE:
                _run_pending()  # (nested: the enclosing statement's relays)
        finally:
            self._lock.release()


#: the bookkeeping's frames, where a relay defers its handler (see the module's doc)
_DEFERRING = frozenset(f.__code__ for f in (
    _restore, _put_back, _end, kept_signals.__enter__, kept_signals.__exit__,
    StatementLock.__enter__, StatementLock.__exit__,
    interruptible.__enter__, interruptible.__exit__))

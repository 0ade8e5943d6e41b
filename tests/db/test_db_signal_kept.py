"""A signal whose handler runs where its exception is lost still ends the statement.

Python runs a signal's handler wherever the main thread next checks, a finalizer
included: ``io``'s finalizer closes a file whose last reference goes (a part replaced by
an UPDATE or DELETE) and drops what its ``close()`` raised, a ``__del__``'s exception is
printed and dropped, and a handler run inside a callback DuckDB called becomes a DuckDB
error. Unless cryptdisk keeps the exception (``cryptdisk.db._sigint``), the statement
goes on as if no signal had come, and a process writing in a loop never ends on its
Ctrl-C or SIGTERM (test_db_signal_commit.py sees that as a hang). Each test here has the
signal handled at such a place, at once (``signal.raise_signal``), and the statement
must end with the signal's exception."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys

import pytest

import cryptdisk
from cryptdisk.db import _mutate
from cryptdisk.format import _source

from .test_db_crash import env


class Stop(BaseException):
    """What the test's SIGTERM handler raises (as the ``cryptdisk`` command's does)."""


def _raise_stop(signum, frame):
    raise Stop()


SIGNALS = {"SIGINT": (signal.SIGINT, signal.default_int_handler, KeyboardInterrupt),
           "SIGTERM": (signal.SIGTERM, _raise_stop, Stop)}


@pytest.fixture(params=sorted(SIGNALS))
def sig(request):
    """(the signal, the exception its handler raises), with the handler installed."""
    signum, handler, raised = SIGNALS[request.param]
    before = signal.signal(signum, handler)
    yield signum, raised
    signal.signal(signum, before)


@pytest.fixture
def db(tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (id BIGINT, n BIGINT) ORDER BY id")
        for lo in range(0, 100, 25):  # four parts
            db.sql(f"INSERT INTO t SELECT i, 0 FROM range({lo}, {lo + 25}) r(i)")
        yield db


def _rows(db):
    ids = db.sql("SELECT id FROM t ORDER BY id").column("id").to_pylist()
    assert db.check() > 0
    return ids


class _Unclosed(io.RawIOBase):
    """A file nobody closes: ``io``'s finalizer calls :meth:`close`, which gets the signal."""

    def __init__(self, signum):
        super().__init__()
        self.signum = signum

    def close(self):
        if not self.closed:
            signal.raise_signal(self.signum)  # the handler runs here, in the finalizer
        super().close()


class _Finalized:
    def __init__(self, signum):
        self.signum = signum

    def __del__(self):
        signal.raise_signal(self.signum)


@pytest.mark.parametrize("statement", [
    "UPDATE t SET n = n + 1 WHERE id % 3 = 0", "DELETE FROM t WHERE id = 7",
    "OPTIMIZE TABLE t FINAL"])
def test_a_signal_while_a_replaced_part_closes_ends_the_statement(db, sig, monkeypatch,
                                                                   statement):
    # the parts a statement replaces close when their last reference goes: io's finalizer
    # (or the statement's own close, where the exception propagates as it is)
    signum, raised = sig
    real = _source.FdSource.close

    def close(self):
        monkeypatch.setattr(_source.FdSource, "close", real)  # (once)
        signal.raise_signal(signum)
        real(self)

    monkeypatch.setattr(_source.FdSource, "close", close)
    with pytest.raises(raised):
        db.sql(statement)
    assert _source.FdSource.close is real  # (the signal came)
    ids = _rows(db)  # committed or not, whole either way
    assert ids in (list(range(100)), [i for i in range(100) if i != 7])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (__del__'s)
@pytest.mark.parametrize("finalizer", [_Unclosed, _Finalized])
@pytest.mark.parametrize("statement", [
    "SELECT sum(n) FROM t", "INSERT INTO t VALUES (100, 0)",
    "UPDATE t SET n = n + 1 WHERE id % 3 = 0"])
def test_a_signal_in_a_finalizer_ends_the_statement(db, sig, monkeypatch, statement,
                                                    finalizer):
    signum, raised = sig
    real = db._release

    def release():
        monkeypatch.setattr(db, "_release", real)  # (once)
        finalizer(signum)  # gone at once: its finalizer runs, and the handler in it
        real()

    monkeypatch.setattr(db, "_release", release)
    with pytest.raises(raised):
        db.sql(statement)
    assert db._release == real
    assert len(_rows(db)) in (100, 101)
    reader = db.reader()  # a reader's query too (which runs without the database's lock)
    kind = type(reader)
    real_of_reader = kind._release

    def release_of_reader(self):
        monkeypatch.setattr(kind, "_release", real_of_reader)  # (once)
        finalizer(signum)
        real_of_reader(self)

    monkeypatch.setattr(kind, "_release", release_of_reader)
    try:
        with pytest.raises(raised):
            reader.sql("SELECT count(*) FROM t")
        assert kind._release is real_of_reader
    finally:
        reader.close()


def test_a_signal_in_duckdbs_callback_is_the_signals_exception(db, sig, monkeypatch):
    # an UPDATE's rows reach DuckDB through an Arrow stream that DuckDB reads by calling
    # back into Python: an exception there came out as DuckDB's InvalidInputException
    signum, raised = sig
    for where in ("__arrow_c_stream__", "_batches"):
        real = getattr(_mutate._PartRows, where)

        def callback(self, *args, _real=real, _where=where):
            monkeypatch.setattr(_mutate._PartRows, _where, _real)  # (once)
            signal.raise_signal(signum)
            return _real(self, *args)

        monkeypatch.setattr(_mutate._PartRows, where, callback)
        with pytest.raises(raised):
            db.sql("UPDATE t SET n = n + 1 WHERE id % 3 = 0")
        assert getattr(_mutate._PartRows, where) is real
    assert _rows(db) == list(range(100))
    assert db.sql("SELECT sum(n) FROM t").column(0).to_pylist() == [0]


def test_without_a_signal_statements_and_handlers_are_as_before(db):
    # the handlers are relayed for a statement's duration only, and back after it
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    db.sql("UPDATE t SET n = n + 1 WHERE id < 10")
    with pytest.raises(cryptdisk.errors.DatabaseError):
        db.sql("SELECT nope FROM t")
    assert {s: signal.getsignal(s) for s in handlers} == handlers
    assert db.sql("SELECT sum(n) FROM t").column(0).to_pylist() == [10]


@pytest.mark.parametrize("kind", ["lock", "kept", "nested"])
def test_a_signal_in_the_relaying_itself_leaves_no_relay_and_no_lock(kind):
    # Real signals at random moments into statements that are all bookkeeping (see
    # signal_bookkeeping_child.py): each one's exception must come, once, and leave the
    # handlers as they were and the lock free. A signal handled at the first line of
    # StatementLock.__exit__, or between a relay's install and its noting, left a relay
    # for good (a third of the signals here) and sometimes the lock held, which every
    # other thread would then wait for forever.
    child = os.path.join(os.path.dirname(__file__), "signal_bookkeeping_child.py")
    out = subprocess.run([sys.executable, child, kind, "300"], capture_output=True,
                         text=True, env=env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"signals": 300, "relay": 0, "held": 0, "stack": 0}


def test_ctrl_c_while_a_reader_waits_for_another_threads_statement(db):
    # A reader's query (kept_signals) waits for the database's lock, which another
    # thread's statement holds: a Ctrl-C must end the wait, not be deferred (as one in the
    # relaying's own steps is) until the other statement ends. The other thread signals
    # the main one again and again (a signal just before the wait begins is seen only
    # after it) until the main thread's statement has ended, or gives up after 10 s.
    import threading
    import time

    main = threading.main_thread().ident
    reader = db.reader()
    interrupted = threading.Event()
    calls: list[int] = []
    seen: list[bool] = []

    def handler(signum, frame):
        calls.append(signum)
        if len(calls) == 1:  # (the signals sent after it are counted only)
            raise Stop()

    def waiting(frame):  # the main thread is in the lock's acquiring
        while frame is not None:
            if frame.f_code.co_name in ("_acquire", "__enter__") and \
                    isinstance(frame.f_locals.get("self", frame.f_locals.get("lock")),
                               (type(db._mutex), type(db._mutex._lock))):
                return True
            frame = frame.f_back
        return False

    def other_statement():
        with db._mutex:
            while not waiting(sys._current_frames()[main]):
                time.sleep(0.001)
            for _ in range(200):
                signal.pthread_kill(main, signal.SIGINT)
                if interrupted.wait(0.05):
                    break
            seen.append(interrupted.is_set())

    before = signal.signal(signal.SIGINT, handler)
    holder = threading.Thread(target=other_statement)
    try:
        holder.start()
        with pytest.raises(Stop):
            reader.execute("SELECT count(*) FROM t")
        interrupted.set()
        holder.join()
        assert seen == [True], "the Ctrl-C came only once the other statement ended"
        assert signal.getsignal(signal.SIGINT) is handler
    finally:
        interrupted.set()
        holder.join()
        signal.signal(signal.SIGINT, before)
    assert reader.execute("SELECT count(*) FROM t").column(0).to_pylist() == [100]


def test_a_block_left_without_its_exit_is_no_finalizer_on_another_thread(tmp_path) -> None:
    """A KeyboardInterrupt raised as ``interruptible``'s block ends, before its exit ran
    (seen in CI), left a suspended generator that a garbage collection on another thread
    closed: ``set_wakeup_fd`` raised there ('only works in main thread'). Nothing is left
    to finalize; the next statement on the connection runs and a Ctrl-C still stops it."""
    import gc
    import sys
    import threading

    from cryptdisk.db._sigint import interruptible

    db = cryptdisk.connect(tmp_path / "db")
    unraisable: list[object] = []
    before_hook = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        gc.disable()  # (only the other thread's collection finds the cycle below)
        block = interruptible(db.con)
        block.__enter__()  # (its __exit__ never called, as when the interrupt lands there)
        cycle: list[object] = [block]
        cycle.append(cycle)  # (as the traceback's frames held it: freed by a collection)
        del block, cycle
        collector = threading.Thread(target=gc.collect)
        collector.start()
        collector.join()
        assert unraisable == []
        assert db.query("SELECT 42") == [(42,)]
    finally:
        gc.enable()
        sys.unraisablehook = before_hook
        signal.set_wakeup_fd(-1)
        db.close()


def test_a_ctrl_c_at_the_first_line_of_interruptibles_exit_puts_the_wakeup_fd_back():
    """A SIGINT whose handler runs at the first instruction of ``interruptible.__exit__``
    (simulated deterministically: a trace function calls the installed handler there, in
    that frame, as CPython's eval loop would) left cryptdisk's pipe as the wake-up fd and
    ``_running`` naming the statement's connection. Now the KeyboardInterrupt comes at the
    statement's end, and both are put back."""
    import sys

    from cryptdisk.db import _sigint

    class Con:
        interrupted = 0

        def interrupt(self) -> None:
            self.interrupted += 1

    target = _sigint.interruptible.__exit__.__code__

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code is target:
            sys.settrace(None)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
        return None

    # Python's own Ctrl-C handler, whatever the test run was started with (a run started
    # in the background by a non-interactive shell inherits SIGINT ignored)
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    lock = _sigint.StatementLock()
    try:
        with pytest.raises(KeyboardInterrupt):
            with lock, _sigint.interruptible(Con()):
                sys.settrace(tracer)
    finally:
        sys.settrace(None)
        now = signal.set_wakeup_fd(before)
        kept = signal.signal(signal.SIGINT, handler)
    assert now == before
    assert _sigint._running is None
    assert kept is signal.default_int_handler
    assert not lock._lock._is_owned()

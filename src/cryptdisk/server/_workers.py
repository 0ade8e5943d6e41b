"""``cryptdisk serve --workers N``: a supervisor process and N worker processes.

One Python process serves every connection on one core (one event loop, the GIL). With
several workers the supervisor binds the listening sockets, then forks the workers, each
a whole server with its own event loop accepting on those same sockets:

- *One shared listening socket*, not ``SO_REUSEPORT``: the kernel keeps one accept queue,
  so a connection waits for whichever worker is free, and none is lost in the queue of a
  worker that dies (with ``SO_REUSEPORT`` each socket has its own queue, filled by a hash
  of the client's address). A worker accepts when it has no more connections than any
  other live worker (counts in shared memory), else it leaves the connection to the
  others for 5 ms and then takes it: connections spread evenly, and ``max_connections``
  counts them all.
- *Cancel requests*: a session's process id (BackendKeyData) names its worker in its top
  bits; a worker that receives a CancelRequest for another worker's session passes it on
  through that worker's pipe (8 bytes, atomic).
- *An encrypted access log* (a mutable cryptdisk file has one writer) is written by one
  more process, forked like the workers, which send it each line as a datagram on a
  Unix socket; the supervisor holds the socket open, so lines queued when that writer
  dies wait for the one forked in its place, and a line leaves the queue only once it is
  written (a writer killed mid-line leaves it to its successor: none lost). A plain
  access log is appended by each worker directly (one ``O_APPEND`` write per line).
- *Failed logins* are counted in one table in shared memory, made before the fork
  (``ScramAuthenticator.share_failures``): an attacker's attempts add up whichever
  worker they reach.
- *Key material* stays in memory: the workers are forked from the supervisor, which has
  loaded the keyring; nothing secret is in any process's argv or environment.
- *Crashes*: a worker that dies (kill -9, a crash) is forked again; the others go on, and
  SQLite's own locking keeps the database consistent (its locks die with the process).
  SIGTERM or SIGINT to the supervisor drains every worker (each stops accepting, lets
  statements in flight finish, closes its sessions) and exits once all have. When the
  supervisor dies, even by kill -9, the workers get SIGTERM (Linux's
  ``PR_SET_PDEATHSIG``) and see the end of a pipe only the supervisor held open; either
  way they drain and exit.

The supervisor stays single-threaded and never runs an event loop (it forks from it).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import logging
import mmap
import os
import secrets
import signal
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ServerError
from ._accesslog import AccessLog

if TYPE_CHECKING:
    import asyncio

    from ._server import Server

__all__ = ["MAX_WORKERS", "Workers", "default_workers", "run_workers"]

log = logging.getLogger("cryptdisk.server")

#: the most workers (a session's process id keeps its worker's number in 7 bits)
MAX_WORKERS = 64
#: ``--workers auto``: one per CPU the process may run on, at most this many
AUTO_MAX = 8
_SLOT_SHIFT = 24
_CANCEL = struct.Struct("!ii")
_PR_SET_PDEATHSIG = 1
#: how long the supervisor waits for draining workers before it kills them
DRAIN_WAIT = 45.0


def default_workers() -> int:
    """``--workers auto``: the CPUs this process may run on, at most :data:`AUTO_MAX` (1
    where :func:`run_workers` cannot run)."""
    if not hasattr(os, "fork") or not hasattr(signal, "sigtimedwait"):
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, AUTO_MAX))


def _nonblocking_pipe() -> tuple[int, int]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    return r, w


class Workers:
    """What the workers share, made by the supervisor before it forks them: per worker, its
    live connection count (shared memory; -1 while no worker runs in that slot) and the pipe
    its cancel requests arrive on; and the pipe whose end tells the workers the supervisor
    is gone. In a worker, :attr:`slot` is its own number."""

    def __init__(self, count: int) -> None:
        if not 1 <= count <= MAX_WORKERS:
            raise ServerError(f"--workers must be between 1 and {MAX_WORKERS}")
        self.count = count
        self._memory = mmap.mmap(-1, 8 * count, flags=mmap.MAP_SHARED)
        self.connections = memoryview(self._memory).cast("q")
        for i in range(count):
            self.connections[i] = -1
        self.cancel_pipes = [_nonblocking_pipe() for _ in range(count)]
        self.death_r, self.death_w = os.pipe()
        self.slot = -1
        self.supervisor = os.getpid()
        self._deferred = False

    # -- in a worker --------------------------------------------------------------------------

    def new_pid(self, in_use: Any) -> int:
        """A session's process id: this worker's number (plus one) in bits 24-30."""
        while True:
            pid = ((self.slot + 1) << _SLOT_SHIFT) | secrets.randbits(_SLOT_SHIFT)
            if pid not in in_use:
                return pid

    def owner(self, pid: int) -> int:
        """The worker a session's process id belongs to (-1: none)."""
        slot = (pid >> _SLOT_SHIFT) - 1
        return slot if 0 <= slot < self.count else -1

    def forward_cancel(self, pid: int, key: int) -> None:
        """Pass a CancelRequest to the worker whose session ``pid`` is."""
        slot = self.owner(pid)
        if slot < 0:
            return
        try:
            os.write(self.cancel_pipes[slot][1], _CANCEL.pack(pid, key))
        except OSError as exc:  # a full pipe (a worker not reading): the cancel is dropped
            log.warning("passing a cancel request to worker %d failed: %s", slot, exc)

    def may_accept(self) -> bool:
        """Accept now: this worker has no more connections than any other live worker, or it
        has already left the connection to the others a moment (5 ms)."""
        if self._deferred:
            self._deferred = False
            return True
        mine = self.connections[self.slot]
        return all(c < 0 or mine <= c for c in self.connections)

    def defer(self) -> None:
        self._deferred = True

    def connected(self, delta: int) -> None:
        self.connections[self.slot] += delta

    def total(self) -> int:
        """Connections of every worker."""
        return sum(c for c in self.connections if c > 0)

    def attach(self, loop: asyncio.AbstractEventLoop, server: Server,
               stop: Callable[[], None]) -> None:
        """Watch this worker's cancel pipe and the supervisor's pipe on ``loop``."""
        cancel_r = self.cancel_pipes[self.slot][0]

        def cancels() -> None:
            try:
                data = os.read(cancel_r, _CANCEL.size * 64)
            except (BlockingIOError, InterruptedError):
                return
            for i in range(0, len(data) - _CANCEL.size + 1, _CANCEL.size):
                server.cancel(*_CANCEL.unpack_from(data, i))

        def supervisor_gone() -> None:
            loop.remove_reader(self.death_r)
            log.warning("worker %d: the supervisor is gone; draining", self.slot)
            stop()

        loop.add_reader(cancel_r, cancels)
        loop.add_reader(self.death_r, supervisor_gone)


class _LogForwarder(AccessLog):
    """A worker's access log: each line a datagram to the log writer process."""

    def __init__(self, path: str, sock: socket.socket) -> None:  # opens nothing
        self.path = path
        self.keyring = None
        self.sock = sock

    def write_line(self, data: bytes) -> None:
        try:  # blocks while the writer's queue is full
            self.sock.send(data)
        except OSError as exc:
            log.error("access log: a line could not be passed to its writer: %s", exc)

    def close(self) -> None:
        pass


class _Stop(Exception):
    pass


#: the signals that stop a worker or the log writer: blocked from the fork until the
#: process's own handler for them is in place (a default SIGTERM would kill it mid-start,
#: and the supervisor report the worker did not exit cleanly)
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def _write_log(path: str, keyring: Any, sock: socket.socket) -> None:
    """The log writer process: every datagram on ``sock`` a line of the encrypted access log
    at ``path``, until SIGTERM; then what is queued, and close.

    A line leaves the queue only once it is in the file: each datagram is read with
    ``MSG_PEEK``, written, and only then taken off. A writer killed (SIGKILL, a crash)
    before the line is written leaves it queued for the writer started in its place, so no
    line is lost; one killed between writing a line and taking it off makes its successor
    write that line again (at most one line twice per death)."""
    def stop(_sig: int, _frame: Any) -> None:
        raise _Stop

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor, which stops us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload is the workers' (the file stays)
    access_log = AccessLog(path, keyring)
    try:
        try:
            # forked with SIGTERM blocked (see _Supervisor.spawn): one sent meanwhile lands here
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            while True:
                data = sock.recv(_MAX_LINE, socket.MSG_PEEK)
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
                access_log.write_line(data)  # never cut by the signal
                sock.recv(_MAX_LINE)  # written: off the queue
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        except _Stop:
            pass
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        sock.setblocking(False)
        while True:
            try:
                data = sock.recv(_MAX_LINE, socket.MSG_PEEK)
            except (BlockingIOError, InterruptedError):
                break
            access_log.write_line(data)
            sock.recv(_MAX_LINE)
    finally:
        access_log.close()


#: the largest datagram (line) the log writer reads whole
_MAX_LINE = 1 << 20


def _die_with_parent(parent: int) -> None:
    """SIGTERM when the supervisor dies (Linux), and exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(0)


def bind(host: str, port: int, backlog: int = 511) -> list[socket.socket]:
    """Listening sockets for ``host``:``port`` (every address it resolves to), non-blocking."""
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
                (i[0], i[1], i[2], "", i[4]) for i in socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:  # one port for every address
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise ServerError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sockets


class _Supervisor:
    def __init__(self, server: Server, count: int) -> None:
        store = getattr(server.authenticator, "store", None)
        if store is not None and not getattr(store, "shared", True):
            raise ServerError(f"--workers {count}: the workers could not share user changes: "
                              f"{store.path}.lock cannot be created",
                              hint="make the user file's directory writable, or serve with "
                              "--workers 1")
        share = getattr(server.authenticator, "share_failures", None)
        if share is not None:  # failed logins add up across the workers
            share()
        self.server = server
        self.workers = Workers(count)
        self.sockets = bind(server.host, server.port)
        self.children: dict[int, int] = {}     # pid -> slot
        self.started: dict[int, float] = {}    # slot -> when its worker was forked
        self.failures = [0] * count            # quick deaths in a row, per slot
        self.restart_at: dict[int, float] = {}  # slot -> when to fork it again
        self.stopping = False
        self.exit_codes: list[int] = []        # of the workers that drained
        #: an encrypted access log: (path, keyring) for the log writer process, its socket
        #: pair (the workers send, the writer receives) and its process id
        self.log_target: tuple[str, Any] | None = None
        self.log_socks: tuple[socket.socket, socket.socket] | None = None
        self.log_pid = 0
        access_log = server.access_log
        if access_log is not None and getattr(access_log, "keyring", None) is not None:
            access_log.close()  # the writer process opens its own
            self.log_target = (access_log.path, access_log.keyring)
            self.log_socks = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
            self.log_socks[0].set_inheritable(False)
            server.access_log = _LogForwarder(access_log.path, self.log_socks[0])

    def spawn_log_writer(self) -> None:
        assert self.log_target is not None and self.log_socks is not None
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.pthread_sigmask(signal.SIG_SETMASK, self._mask | _STOP_SIGNALS)
                _die_with_parent(self.workers.supervisor)
                os.close(self.workers.death_w)  # only the supervisor holds it open
                for sock in self.sockets:
                    sock.close()
                _write_log(*self.log_target, self.log_socks[1])
                code = 0
            except BaseException:
                log.exception("the access log writer failed")
            finally:
                logging.shutdown()
                os._exit(code)
        self.log_pid = pid
        log.info("access log writer started (pid %d)", pid)

    def spawn(self, slot: int) -> None:
        self.workers.connections[slot] = 0
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                # SIGTERM, SIGINT and SIGHUP stay blocked until the worker's event loop
                # handles them (Server.serve unblocks them): one sent while it starts waits
                signal.pthread_sigmask(signal.SIG_SETMASK,
                                       self._mask | _STOP_SIGNALS | {signal.SIGHUP})
                _die_with_parent(self.workers.supervisor)
                os.close(self.workers.death_w)
                if self.log_socks is not None:
                    self.log_socks[1].close()
                for i, (r, _w) in enumerate(self.workers.cancel_pipes):
                    if i != slot:
                        os.close(r)
                self.workers.slot = slot
                self.server.workers = self.workers
                self.server.sockets = self.sockets
                self.server.run()
                code = 0
            except BaseException:
                log.exception("worker %d failed", slot)
            finally:
                logging.shutdown()
                os._exit(code)
        self.children[pid] = slot
        self.started[slot] = time.monotonic()
        log.info("worker %d started (pid %d)", slot, pid)

    def reap(self) -> None:
        while self.children or self.log_pid:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.log_pid:
                self.log_pid = 0
                code = os.waitstatus_to_exitcode(status)
                if not self.stopping:
                    log.warning("the access log writer (pid %d) died (%d); starting it again",
                                pid, code)
                    self.spawn_log_writer()
                elif code != 0:
                    self.exit_codes.append(code)
                continue
            slot = self.children.pop(pid, None)
            if slot is None:
                continue
            self.workers.connections[slot] = -1
            code = os.waitstatus_to_exitcode(status)
            if self.stopping:
                self.exit_codes.append(code)  # how the drain went
                log.info("worker %d (pid %d) exited (%d)", slot, pid, code)
                continue
            log.warning("worker %d (pid %d) died (%s); starting it again", slot, pid,
                        f"signal {-code}" if code < 0 else f"exit {code}")
            quick = time.monotonic() - self.started.get(slot, 0) < 1.0
            self.failures[slot] = self.failures[slot] + 1 if quick else 0
            delay = min(0.1 * 2 ** self.failures[slot], 10.0) if self.failures[slot] else 0
            self.restart_at[slot] = time.monotonic() + delay

    def run(self, ready: Callable[[tuple[str, int]], None] | None) -> int:
        stop_signals = {signal.SIGTERM, signal.SIGINT}
        waited = {signal.SIGCHLD, signal.SIGHUP, *stop_signals}
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
        try:
            if self.log_target is not None:
                self.spawn_log_writer()
            for slot in range(self.workers.count):
                self.spawn(slot)
            name = self.sockets[0].getsockname()
            self.server.address = (name[0], name[1])
            if ready is not None:
                ready(self.server.address)
            while True:
                timeout = 1.0
                if self.restart_at:
                    timeout = max(0.0, min(self.restart_at.values()) - time.monotonic())
                info = signal.sigtimedwait(waited, timeout)
                if info is not None and info.si_signo in stop_signals:
                    break
                if info is not None and info.si_signo == signal.SIGHUP:
                    log.info("reload: passed on to the workers")
                    for pid in list(self.children):  # each reloads (Server.reload)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGHUP)
                self.reap()
                now = time.monotonic()
                for slot, when in list(self.restart_at.items()):
                    if when <= now:
                        del self.restart_at[slot]
                        self.spawn(slot)
            return self.drain()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    def drain(self) -> int:
        """SIGTERM to every worker; wait for them (then SIGKILL what is left)."""
        self.stopping = True
        for sock in self.sockets:  # the workers' copies stop accepting as they drain
            sock.close()
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + DRAIN_WAIT
        while self.children and time.monotonic() < deadline:
            signal.sigtimedwait({signal.SIGCHLD}, 0.5)
            self.reap()
        for pid in self.children:
            log.warning("worker pid %d did not drain in %g s: killed", pid, DRAIN_WAIT)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while self.children:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            except OSError as exc:
                if exc.errno != errno.EINTR:
                    raise
                continue
            self.children.pop(pid, None)
        if self.log_pid:  # every worker is gone: the writer takes what is queued, and ends
            os.kill(self.log_pid, signal.SIGTERM)
            while self.log_pid:
                try:
                    pid, status = os.waitpid(self.log_pid, 0)
                except ChildProcessError:
                    break
                code = os.waitstatus_to_exitcode(status)
                if code != 0:
                    self.exit_codes.append(code)
                self.log_pid = 0
        os.close(self.workers.death_w)
        return 0 if all(c == 0 for c in self.exit_codes) else 1


def run_workers(server: Server, count: int,
                ready: Callable[[tuple[str, int]], None] | None = None) -> int:
    """Serve with ``count`` worker processes (see the module's doc) until SIGTERM or SIGINT;
    0 when every worker drained and exited cleanly. Call it from the main thread of a
    process that has no event loop running (it forks)."""
    if not hasattr(os, "fork") or not hasattr(signal, "sigtimedwait"):
        raise ServerError("--workers above 1 needs Linux (fork, sigtimedwait)",
                          hint="serve with --workers 1 here")
    return _Supervisor(server, count).run(ready)

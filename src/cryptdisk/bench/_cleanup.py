"""Leave nothing behind: scratch directories, child processes, FUSE mounts.

Everything the suite creates is registered with one :class:`Cleanup`. It runs
in reverse order from ``finally`` blocks, from ``atexit``, and on SIGINT,
SIGTERM and SIGHUP (which are turned into ``KeyboardInterrupt`` so that every
``finally`` on the way out runs too). Workers and the gocryptfs daemon die with
their parent (``PR_SET_PDEATHSIG``) even if it is killed with SIGKILL, and the
next run removes a scratch directory whose owner process is gone.

Cleanup ends promptly whatever state it finds: every wait has a timeout, and
nothing it does looks inside a FUSE mount (whether something is mounted is read
from ``/proc/mounts``; ``os.path.ismount`` stats the mount's root, which waits on
a daemon that does not answer and says False for one that died). The order:
workers first (they hold files open on the mounts), then the registered actions
(unmounting: ``fusermount -u``, else ``-u -z``, then the daemon is stopped,
SIGKILL last, which also aborts its FUSE connection, so a worker stuck in a
request on it can exit), then daemons left, then the workers that could not
exit before. The scratch directory is removed last, after lazily unmounting
anything still mounted in it, and never through a mount.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["KILL_WAIT", "Cleanup", "die_with_parent", "is_mounted", "reap_stale", "stop",
           "unmount"]

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no-op elsewhere)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass


_PREFIX = "cryptdisk-bench-"
_OWNER = ".owner-pid"


#: seconds a child has to exit after SIGTERM, after SIGKILL, and a fusermount to finish
TERM_WAIT, KILL_WAIT, FUSERMOUNT_WAIT = 3.0, 2.0, 10.0


def _unescape(field: str) -> str:
    r"""A path as ``/proc/mounts`` writes it (space, tab, newline, backslash as ``\ooo``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _mounts_under(path: Path | str) -> list[str]:
    """Mount points at or below ``path``, from ``/proc/mounts`` (never touches them)."""
    try:
        with open("/proc/mounts") as f:
            points = [_unescape(line.split()[1]) for line in f if len(line.split()) > 1]
    except OSError:
        return []
    root = str(path)
    return [p for p in points if p == root or p.startswith(root + "/")]


def is_mounted(point: Path | str) -> bool:
    """Whether something is mounted on ``point`` (``/proc/mounts``; a dead FUSE mount
    counts, and a daemon that does not answer cannot make this wait)."""
    return str(point) in _mounts_under(point)


def unmount(point: Path | str) -> bool:
    """Unmount a FUSE mount: ``fusermount -u``, and when that fails (a file still open on
    it, a daemon that does not answer, a daemon that died) ``fusermount -u -z``, which
    detaches it at once. Every call has a timeout. True if it is no longer mounted."""
    tool = shutil.which("fusermount3") or shutil.which("fusermount") or "fusermount"
    for flags in (["-u"], ["-u", "-z"]):
        if not is_mounted(point):
            return True
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([tool, *flags, str(point)], capture_output=True,
                           timeout=FUSERMOUNT_WAIT)
    return not is_mounted(point)


def stop(proc: subprocess.Popen[bytes], *, grace: float = 0.0) -> bool:
    """End ``proc``: wait ``grace`` seconds for it to exit by itself, then SIGTERM, then
    SIGKILL, each with a bounded wait. True if it has exited (and was reaped)."""
    for signal_it, wait in ((None, grace), (proc.terminate, TERM_WAIT),
                            (proc.kill, KILL_WAIT)):
        if proc.poll() is not None:
            return True
        if signal_it is not None:
            with contextlib.suppress(OSError):
                signal_it()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    return proc.poll() is not None


def reap_stale(base: Path) -> list[Path]:
    """Remove scratch directories of earlier runs whose process is gone (e.g. SIGKILLed).

    A directory is stale when the pid in its owner file no longer runs; FUSE
    mounts inside it are unmounted first. Returns the directories removed.
    """
    import psutil

    removed = []
    for d in base.glob(_PREFIX + "*"):
        try:
            pid = int((d / _OWNER).read_text())
        except (OSError, ValueError):
            continue
        if psutil.pid_exists(pid):
            continue
        for point in sorted(_mounts_under(d), reverse=True):
            unmount(point)
        if not _mounts_under(d):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


class Cleanup:
    """A stack of undo actions plus the children and scratch space they own."""

    def __init__(self, base: str | os.PathLike[str] | None = None) -> None:
        self._actions: list[tuple[str, Callable[[], None]]] = []
        self._children: list[subprocess.Popen[bytes]] = []
        #: children stopped after the actions (a FUSE daemon: its mount is undone first)
        self._daemons: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self._old_handlers: dict[int, Any] = {}
        parent = Path(base) if base is not None else Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self.reaped = reap_stale(parent)
        self.workdir = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=parent))
        (self.workdir / _OWNER).write_text(str(os.getpid()))
        atexit.register(self.run)

    def _remove_workdir(self) -> None:
        """Remove the scratch directory (the last step of :meth:`run`)."""
        for point in sorted(_mounts_under(self.workdir), reverse=True):
            unmount(point)  # a mount left behind is detached, never walked into
        if not _mounts_under(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def push(self, what: str, action: Callable[[], None]) -> None:
        """Run ``action`` at cleanup (last pushed runs first)."""
        with self._lock:
            self._actions.append((what, action))

    def popen(self, cmd: list[str], *, die_with_us: bool = False, daemon: bool = False,
              **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start a child that is killed at cleanup if it is still running.

        ``die_with_us``: the child gets SIGTERM if this process dies, even by SIGKILL
        (for programs we cannot change, such as the gocryptfs daemon). ``daemon``: it
        is stopped after the registered actions, not before (a FUSE daemon serves its
        mount until an action has unmounted it).
        """
        if die_with_us:
            kwargs["preexec_fn"] = die_with_parent
        proc = subprocess.Popen(cmd, **kwargs)
        with self._lock:
            (self._daemons if daemon else self._children).append(proc)
        return proc

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            for registered in (self._children, self._daemons):
                with contextlib.suppress(ValueError):
                    registered.remove(proc)

    def kill_children(self, *, daemons: bool = False) -> list[subprocess.Popen[bytes]]:
        """Stop the children (``daemons``: the daemons), SIGTERM then SIGKILL, with
        bounded waits; the ones that did not exit even so (stuck in the kernel, e.g. in a
        request to a FUSE daemon that does not answer) are returned, still registered."""
        with self._lock:
            if daemons:
                children, self._daemons = self._daemons, []
            else:
                children, self._children = self._children, []
        for signal_them, wait in (("terminate", TERM_WAIT), ("kill", KILL_WAIT)):
            for proc in children:
                if proc.poll() is None:
                    with contextlib.suppress(OSError):
                        getattr(proc, signal_them)()
            deadline = time.monotonic() + wait
            for proc in children:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        stuck = [proc for proc in children if proc.poll() is None]
        with self._lock:
            (self._daemons if daemons else self._children).extend(stuck)
        return stuck

    def install_signal_handlers(self) -> None:
        """Turn SIGTERM/SIGHUP into KeyboardInterrupt (SIGINT already is one)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, _interrupt)

    def run(self) -> None:
        """Stop the workers, undo every registered action (last pushed first), stop the
        daemons, reap workers that could not exit before, remove the scratch directory;
        safe to call twice."""
        # Ignore further interrupts while cleaning up, so cleanup itself completes.
        restore: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                restore[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            self.kill_children()  # workers first: they hold files open on the mounts
            while True:
                with self._lock:
                    if not self._actions:
                        break
                    _what, action = self._actions.pop()
                with contextlib.suppress(Exception):
                    action()
            self.kill_children(daemons=True)
            # a worker stuck in a request to a daemon can exit now that the daemon is gone
            self.kill_children()
            self._remove_workdir()
        finally:
            for signum, old in {**restore, **self._old_handlers}.items():
                signal.signal(signum, old if old is not None else signal.SIG_DFL)
            self._old_handlers = {}
            atexit.unregister(self.run)

    def __enter__(self) -> Cleanup:
        self.install_signal_handlers()
        return self

    def __exit__(self, *exc: object) -> None:
        self.run()

"""Leave nothing behind: scratch directories, child processes, FUSE mounts.

Everything the suite creates is registered with one :class:`Cleanup`. It runs
in reverse order from ``finally`` blocks, from ``atexit``, and on SIGINT,
SIGTERM and SIGHUP (which are turned into ``KeyboardInterrupt`` so that every
``finally`` on the way out runs too). Workers and the gocryptfs daemon die with
their parent (``PR_SET_PDEATHSIG``) even if it is killed with SIGKILL, and the
next run removes a scratch directory whose owner process is gone.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Cleanup", "die_with_parent", "reap_stale"]

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


def _mounts_under(path: Path) -> list[str]:
    try:
        with open("/proc/mounts") as f:
            points = [line.split()[1] for line in f]
    except OSError:
        return []
    root = str(path)
    return [p for p in points if p == root or p.startswith(root + "/")]


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
        tool = shutil.which("fusermount3") or shutil.which("fusermount")
        for point in sorted(_mounts_under(d), reverse=True):
            if tool:
                subprocess.run([tool, "-u", "-z", point], capture_output=True, timeout=30)
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
        self._lock = threading.Lock()
        self._old_handlers: dict[int, Any] = {}
        parent = Path(base) if base is not None else Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        self.reaped = reap_stale(parent)
        self.workdir = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=parent))
        (self.workdir / _OWNER).write_text(str(os.getpid()))
        self.push("remove scratch directory", self._remove_workdir)
        atexit.register(self.run)

    def _remove_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def push(self, what: str, action: Callable[[], None]) -> None:
        """Run ``action`` at cleanup (last pushed runs first)."""
        with self._lock:
            self._actions.append((what, action))

    def popen(self, cmd: list[str], *, die_with_us: bool = False,
              **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start a child that is killed at cleanup if it is still running.

        ``die_with_us``: the child gets SIGTERM if this process dies, even by SIGKILL
        (for programs we cannot change, such as the gocryptfs daemon).
        """
        if die_with_us:
            kwargs["preexec_fn"] = die_with_parent
        proc = subprocess.Popen(cmd, **kwargs)
        with self._lock:
            self._children.append(proc)
        return proc

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._children.remove(proc)

    def kill_children(self) -> None:
        with self._lock:
            children, self._children = self._children, []
        for proc in children:
            if proc.poll() is None:
                proc.terminate()
        for proc in children:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def install_signal_handlers(self) -> None:
        """Turn SIGTERM/SIGHUP into KeyboardInterrupt (SIGINT already is one)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, _interrupt)

    def run(self) -> None:
        """Kill children, then undo every registered action; safe to call twice."""
        # Ignore further interrupts while cleaning up, so cleanup itself completes.
        restore: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                restore[sig] = signal.signal(sig, signal.SIG_IGN)
        try:
            self.kill_children()
            while True:
                with self._lock:
                    if not self._actions:
                        break
                    _what, action = self._actions.pop()
                with contextlib.suppress(Exception):
                    action()
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

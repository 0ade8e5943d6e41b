"""A gocryptfs mount (FUSE) for the io experiment, torn down by the harness's Cleanup.

Configured as its documentation recommends for a new file system
(``gocryptfs -init``: AES-256-GCM, the default), except ``-scryptn 10`` so that
mounting is quick (it only changes the password hash, not data throughput).
The daemon runs in the foreground (``-fg``) as our child, so its CPU time is
read with psutil and added to the benchmark's. Its messages go to a log file in
the scratch directory (a pipe nobody reads would stop it once full).

Unmounting never waits on the daemon for long (see :mod:`._cleanup`): ``fusermount
-u`` while it still serves, ``-u -z`` if that fails (a worker's file still open, a
daemon that does not answer), then the daemon is stopped, SIGKILL last.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from ._cleanup import Cleanup, is_mounted, stop, unmount

__all__ = ["INSTALL", "GocryptfsMount", "unavailable_reason"]

INSTALL = "apt-get install -y gocryptfs fuse3"


def unavailable_reason() -> str | None:
    """Why gocryptfs cannot run here, or None."""
    if shutil.which("gocryptfs") is None:
        return "the gocryptfs command is not installed"
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        return "fusermount (fuse3) is not installed"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel or container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not readable and writable by this user"
    return None


class GocryptfsMount:
    """``cipher/`` mounted on ``plain/`` under ``base``; ``.pid`` is the daemon."""

    def __init__(self, cleanup: Cleanup, base: Path) -> None:
        self.cipher, self.mountpoint = base / "gocryptfs-cipher", base / "gocryptfs-plain"
        self.cipher.mkdir(parents=True)
        self.mountpoint.mkdir()
        passfile = base / "gocryptfs-pass"
        passfile.write_bytes(os.urandom(16).hex().encode())
        passfile.chmod(0o600)
        subprocess.run(["gocryptfs", "-init", "-q", "-passfile", str(passfile), "-scryptn", "10",
                        str(self.cipher)], check=True, capture_output=True, timeout=60)
        self._cleanup = cleanup
        log = base / "gocryptfs.log"
        with open(log, "wb") as err:
            self._proc = cleanup.popen(["gocryptfs", "-fg", "-q", "-passfile", str(passfile),
                                        str(self.cipher), str(self.mountpoint)],
                                       stdout=subprocess.DEVNULL, stderr=err,
                                       die_with_us=True, daemon=True)
        cleanup.push("unmount gocryptfs", self.unmount)
        deadline = time.monotonic() + 20
        while not is_mounted(self.mountpoint):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.unmount()
                said = log.read_text(errors="replace").strip()
                raise OSError(f"gocryptfs did not mount: {said or 'timeout'}")
            time.sleep(0.05)
        self.pid = self._proc.pid

    def unmount(self) -> None:
        """Unmount and stop the daemon; bounded however the daemon behaves."""
        unmount(self.mountpoint)
        # unmounted, gocryptfs -fg exits by itself; SIGKILL also aborts a FUSE connection
        # that a lazy unmount left to a file still open
        exited = stop(self._proc, grace=2.0)
        unmount(self.mountpoint)  # a mount whose daemon died before it was unmounted
        if exited:
            self._cleanup.forget(self._proc)

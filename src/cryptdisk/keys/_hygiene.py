"""Key hygiene of the process: no core dumps while it holds keys, optional mlock of key buffers.

* :func:`protect_process` sets ``prctl(PR_SET_DUMPABLE, 0)`` on Linux: no core dump of
  this process (it would hold the keys), and only root can attach a debugger or read its
  memory through ``/proc``. The ``cryptdisk`` command calls it as it starts (its
  processes hold keys: ``serve``, ``db``, ``keys`` ...); the library never does, since
  the setting is the whole host process's (a notebook, a test runner, a Dask worker
  would lose core dumps, debuggers and profilers): a program holding keys calls it
  itself. ``CRYPTDISK_ALLOW_CORE_DUMPS=1`` leaves the process dumpable (debugging).
  Where ``prctl`` is missing (not Linux) nothing happens.
* :func:`lock_buffer` / :func:`unlock_buffer` ``mlock`` a ``bytearray`` that holds key
  material (the unwrap cache's data keys, an unwrapped KMS key) so it is not written to
  swap, when ``[keyring] mlock = true`` or ``CRYPTDISK_MLOCK=1`` turned it on. Locked
  memory is limited (``ulimit -l``): a buffer that cannot be locked is counted in
  :data:`MLOCK_FAILURES` and used unlocked. ``bytes`` objects (the copies handed to the
  cipher, a local key's own material) are immutable and are not locked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

__all__ = ["ALLOW_DUMPS_ENV", "MLOCK_ENV", "enable_mlock", "is_dumpable", "lock_buffer",
           "locked_pages", "mlock_enabled", "protect_process", "unlock_buffer", "wipe_buffer"]

ALLOW_DUMPS_ENV = "CRYPTDISK_ALLOW_CORE_DUMPS"
MLOCK_ENV = "CRYPTDISK_MLOCK"

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4

_lock = threading.Lock()
_protected = False
_mlock = False
#: Buffers that ``mlock`` refused (the locked-memory limit): used unlocked.
MLOCK_FAILURES = [0]
_libc: Any = None


def _c() -> Any:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name, use_errno=True) if name else False
        except OSError:
            _libc = False
    return _libc


def protect_process() -> bool:
    """Make this process non-dumpable (once); True when it is now (or already was)."""
    global _protected
    if _protected:
        return True
    with _lock:
        if _protected:
            return True
        if os.environ.get(ALLOW_DUMPS_ENV) == "1":
            return False
        libc = _c()
        prctl = getattr(libc, "prctl", None) if libc else None
        if prctl is None:
            return False
        if prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            return False
        _protected = True
        return True


def is_dumpable() -> bool | None:
    """Whether this process may dump core (None where ``prctl`` is not available)."""
    libc = _c()
    prctl = getattr(libc, "prctl", None) if libc else None
    if prctl is None:
        return None
    return bool(prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))


def enable_mlock(on: bool = True) -> None:
    global _mlock
    _mlock = on


def mlock_enabled() -> bool:
    return _mlock or os.environ.get(MLOCK_ENV) == "1"


_PAGE = os.sysconf("SC_PAGESIZE") if hasattr(os, "sysconf") else 4096
#: page number -> how many locked buffers share it (mlock does not count: the last
#: buffer on a page unlocks it)
_pages: dict[int, int] = {}


def _page_range(buf: bytearray) -> range:
    address = ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))
    return range(address // _PAGE, (address + len(buf) - 1) // _PAGE + 1)


def lock_buffer(buf: bytearray) -> bool:
    """``mlock`` the pages of ``buf`` when mlock is on; True when they are locked.

    The buffer must not be resized while locked (that would move it).
    """
    if not buf or not mlock_enabled():
        return False
    libc = _c()
    if not libc:
        return False
    with _lock:
        pages = _page_range(buf)
        new = [p for p in pages if p not in _pages]
        if new and libc.mlock(ctypes.c_void_p(new[0] * _PAGE),
                              ctypes.c_size_t((new[-1] - new[0] + 1) * _PAGE)) != 0:
            MLOCK_FAILURES[0] += 1
            return False
        for p in pages:
            _pages[p] = _pages.get(p, 0) + 1
    return True


def wipe_buffer(buf: bytearray, locked: bool = False) -> None:
    """Overwrite ``buf`` with zeros, then undo :func:`lock_buffer` if it was ``locked``."""
    buf[:] = bytes(len(buf))
    if locked:
        unlock_buffer(buf)


def unlock_buffer(buf: bytearray) -> None:
    """Undo :func:`lock_buffer` (call after zeroing ``buf``); a no-op for unlocked buffers
    is the caller's to avoid (it passes what lock_buffer returned)."""
    libc = _c()
    if not buf or not libc:
        return
    with _lock:
        for p in _page_range(buf):
            count = _pages.get(p, 0)
            if count <= 1:
                _pages.pop(p, None)
                if count == 1:
                    libc.munlock(ctypes.c_void_p(p * _PAGE), ctypes.c_size_t(_PAGE))
            else:
                _pages[p] = count - 1


def locked_pages() -> int:
    """How many pages key buffers hold locked now."""
    return len(_pages)

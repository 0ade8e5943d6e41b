"""Key hygiene, in fresh processes: a process holding keys is not dumpable; mlock of the
unwrap cache's data keys shows in the kernel's count of locked memory and is undone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def python(code: str, **extra: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    env.pop("CRYPTDISK_ALLOW_CORE_DUMPS", None)
    env.update(extra)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


DUMPABLE = """
    import ctypes, sys
    libc = ctypes.CDLL(None)
    before = libc.prctl(3, 0, 0, 0, 0)
    import cryptdisk
    from cryptdisk.keys import Keyring
    imported = libc.prctl(3, 0, 0, 0, 0)
    Keyring.generate()
    print(before, imported, libc.prctl(3, 0, 0, 0, 0))
"""


def test_a_process_holding_keys_is_not_dumpable():
    # dumpable until the first key is made (importing cryptdisk changes nothing), then not
    assert python(DUMPABLE) == "1 1 0"


def test_core_dumps_can_be_allowed_for_debugging():
    assert python(DUMPABLE, CRYPTDISK_ALLOW_CORE_DUMPS="1") == "1 1 1"


MLOCK = """
    from cryptdisk.keys import UnwrapCache
    from cryptdisk.keys import _hygiene

    def locked_kb():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmLck:"))

    base = locked_kb()
    cache = UnwrapCache(entries=2)
    for i in range(3):  # the third evicts the first: zeroed and unlocked
        cache.put(bytes([i]) * 60, b"ad", bytes([i]) * 32)
    during = locked_kb()
    pages = _hygiene.locked_pages()
    cache.clear()
    print(base, during > base, pages in (1, 2), locked_kb() == base, _hygiene.locked_pages(),
          _hygiene.MLOCK_FAILURES[0])
"""


def test_mlock_locks_cached_data_keys_and_unlocks_them_when_dropped():
    _, grew, pages, back, left, failures = python(MLOCK, CRYPTDISK_MLOCK="1").split()
    assert (grew, pages, back, left, failures) == ("True", "True", "True", "0", "0")


def test_without_mlock_nothing_is_locked():
    out = python(MLOCK).split()
    assert out[1:] == ["False", "False", "True", "0", "0"]

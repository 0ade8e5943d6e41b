"""Key hygiene, in fresh processes: the cryptdisk command's processes are not dumpable, a
library host's process is left as it is; mlock of the unwrap cache's data keys shows in
the kernel's count of locked memory and is undone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def python(code: str, *args: str, **extra: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    env.pop("CRYPTDISK_ALLOW_CORE_DUMPS", None)
    env.update(extra)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


LIBRARY = """
    import ctypes, sys
    libc = ctypes.CDLL(None)
    before = libc.prctl(3, 0, 0, 0, 0)
    import cryptdisk
    from cryptdisk.cli import main
    from cryptdisk.keys import Keyring, protect_process
    imported = libc.prctl(3, 0, 0, 0, 0)
    Keyring.generate()
    db = cryptdisk.connect(sys.argv[1])  # a database: its key file, its keyring
    db.sql("CREATE TABLE t (x INTEGER)")
    db.close()
    assert main(["keygen", "-o", sys.argv[1] + ".k"]) == 0  # the CLI called with argv
    used = libc.prctl(3, 0, 0, 0, 0)
    protect_process()  # a program holding keys asks for it
    print(before, imported, used, libc.prctl(3, 0, 0, 0, 0))
"""

PROGRAM = """
    import ctypes, sys
    libc = ctypes.CDLL(None)
    from cryptdisk.cli import main
    sys.argv = ["cryptdisk", *sys.argv[1:]]  # as the cryptdisk script runs it
    code = main()
    print(code, libc.prctl(3, 0, 0, 0, 0))
"""


def test_the_library_leaves_its_host_process_dumpable(tmp_path):
    # importing cryptdisk, making keys, opening a database, calling the CLI's main(argv):
    # the host (a test runner, a notebook, a Dask worker) keeps core dumps and debuggers
    assert python(LIBRARY, str(tmp_path / "a.db")) == "1 1 1 0"


def test_the_cryptdisk_command_is_not_dumpable(tmp_path):
    assert python(PROGRAM, "keygen", "-o", str(tmp_path / "k")) == "0 0"
    assert python(PROGRAM, "keygen", "-o", str(tmp_path / "k2"),
                  CRYPTDISK_ALLOW_CORE_DUMPS="1") == "0 1"  # for debugging


def test_this_test_process_is_dumpable():
    from cryptdisk.keys import Keyring, is_dumpable

    Keyring.generate()
    assert is_dumpable() is True


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

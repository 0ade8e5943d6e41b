"""Without the C VFS (no compiler or headers at install time), cryptdisk.sqlite says so once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cryptdisk

SRC = str(Path(cryptdisk.__file__).resolve().parents[1])

BLOCK_CVFS = """
import sys
class _NoCVFS:  # what an install without a C compiler leaves: no _cvfs module
    def find_spec(self, name, path=None, target=None):
        if name == "cryptdisk.sqlite._cvfs":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoCVFS())
"""

CHILD = BLOCK_CVFS + """
import os, sys, warnings
import cryptdisk, cryptdisk.sqlite as csql
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for n in range(2):
        ring = cryptdisk.Keyring.single(cryptdisk.Key.generate(1))
        db = csql.connect(os.path.join(sys.argv[1], f"db{n}"), keyring=ring)
        db.execute("CREATE TABLE t (x); INSERT INTO t VALUES (1)")
        db.close()
print(csql.implementation())
for w in seen:
    print(w.category.__name__, w.message)
"""


def _run(tmp_path: Path, **env: str) -> list[str]:
    full = {k: v for k, v in os.environ.items() if k != "CRYPTDISK_SQLITE_VFS"}
    full.update(env, PYTHONPATH=os.pathsep.join(p for p in (SRC, full.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                          text=True, env=full, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_falling_back_to_the_python_vfs_warns_once_naming_the_fix(tmp_path):
    lines = _run(tmp_path)
    assert lines[0] == "python"
    warned = [line for line in lines[1:] if "C VFS was not built" in line]
    assert len(warned) == 1, lines
    assert warned[0].startswith("RuntimeWarning")
    assert "apt-get install gcc libssl-dev libsqlite3-dev libgcrypt20-dev" in warned[0]


def test_choosing_the_python_vfs_says_nothing(tmp_path):
    lines = _run(tmp_path, CRYPTDISK_SQLITE_VFS="python")
    assert lines == ["python"]

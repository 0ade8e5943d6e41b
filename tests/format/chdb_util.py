"""Run real ClickHouse (chdb) in child processes for the compatibility tests.

chdb keeps one embedded server per process, so every session (a database
path plus a ``config-file=`` holding a ``storage_configuration``) runs in its
own child process; that also proves a *fresh* server reads the files.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# found, not imported: chdb starts a dozen threads and fork handlers on import, and
# a child forked by a later test in this process (tests/format/test_fork.py,
# tests/sqlite/test_cvfs.py, tests/server/test_workers.py) could hang in them; ClickHouse
# itself only ever runs in child processes here
CHDB_MISSING = ("" if importlib.util.find_spec("chdb") is not None  # CI installs chdb
                else "chdb is not installed; pip install '.[bench]'")

needs_chdb = pytest.mark.skipif(bool(CHDB_MISSING), reason=CHDB_MISSING or "chdb present")

_SESSION = r"""
import json, sys
import chdb.session as cs
spec = json.load(sys.stdin)
s = cs.Session(spec["path"] + "?config-file=" + spec["config"])
out = []
try:
    for q in spec["queries"]:
        out.append(json.loads(str(s.query(q, "JSON")) or "null"))
finally:
    s.close()
print(json.dumps([(r or {}).get("data") for r in out]))
"""

_HASHER = r"""
import sys
import chdb.session as cs
s = cs.Session()
K0, K1 = 0x4368456E63727970, 0x7465644469736B46
for line in sys.stdin:
    h = line.strip()
    r = s.query(f"SELECT hex(sipHash128Keyed((toUInt64({K0}), toUInt64({K1})), unhex('{h}'))), "
                f"sipHash64(unhex('{h}'))", "TabSeparated")
    print(str(r).strip(), flush=True)
"""


def storage_xml(disks: str, policies: str) -> str:
    """A chdb config file body holding one ``storage_configuration``."""
    return (f"<clickhouse><storage_configuration><disks>{disks}</disks>"
            f"<policies>{policies}</policies></storage_configuration></clickhouse>\n")


def run_session(db_path: str, config_path: str, queries: list[str]) -> list[object]:
    """Run ``queries`` in a fresh chdb process; returns each query's JSON ``data`` rows."""
    spec = json.dumps({"path": db_path, "config": config_path, "queries": queries})
    proc = subprocess.run([sys.executable, "-c", _SESSION], input=spec, capture_output=True,
                          text=True, timeout=300, env=os.environ.copy())
    if proc.returncode != 0:
        raise AssertionError(f"chdb failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Hasher:
    """A chdb child process answering ``(sipHash128Keyed fingerprint hex, sipHash64)`` per key."""

    def __init__(self) -> None:
        self._p = subprocess.Popen([sys.executable, "-c", _HASHER], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)

    def __call__(self, key: bytes) -> tuple[bytes, int]:
        assert self._p.stdin is not None and self._p.stdout is not None
        self._p.stdin.write(key.hex() + "\n")
        self._p.stdin.flush()
        fp_hex, h64 = self._p.stdout.readline().split("\t")
        return bytes.fromhex(fp_hex), int(h64)

    def close(self) -> None:
        assert self._p.stdin is not None and self._p.stdout is not None
        self._p.stdin.close()
        self._p.wait(timeout=60)
        self._p.stdout.close()

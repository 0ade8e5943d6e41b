"""The -cdtail side file against power loss: a legacy WAL's shared last record is rewritten
by every commit, so its saved copy must be on stable storage before the rewrite is issued
(the kernel may write a rewrite back half done at any time), and the rewrite must be
synced before the copy is replaced. Both VFSes (conftest runs each test with each)."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.sqlite import _native

from .helpers import legacy_wal_db

CHILD = Path(__file__).with_name("tail_child.py")


def test_every_tail_copy_is_synced_before_use(tmp_path, keyring, monkeypatch, vfs_implementation):
    """Each commit into a legacy WAL saves the shared record, and syncs the copy."""
    db = legacy_wal_db(tmp_path, keyring, monkeypatch)
    synced: list[str] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)  # the Python VFS's syncs
    before = _native._cvfs.stats() if _native.available() else {}
    conn = csql.connect(str(db), keyring=keyring)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for n in range(2, 12):
        conn.execute("INSERT INTO t VALUES(?, 'x')", (n,))
    conn.close()
    tails = [p for p in synced if p.endswith("-wal-cdtail")]
    if vfs_implementation == "c":
        after = _native._cvfs.stats()
        saves = after["tail_saves"] - before["tail_saves"]
        assert saves >= 10  # one per commit at least: each shares the WAL's last record
        assert after["tail_syncs"] - before["tail_syncs"] == saves
        assert tails == []  # C syncs its copy itself, not through os
    else:
        assert len(tails) >= 10


def _events(log: str) -> list[tuple[str, str]]:
    """(call, file) from strace -y output."""
    out = []
    for line in log.splitlines():
        m = re.match(r"\d+\s+(fdatasync|fsync|pwrite64|pwritev)\((?:\d+<([^>]*)>)?", line)
        if m:
            out.append((m.group(1), m.group(2) or ""))
    return out


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize("sync", ["full", "normal"])
def test_copy_synced_before_rewrite_and_kill_keeps_commits(tmp_path, monkeypatch, sync):
    """strace a child committing into a legacy WAL. FULL: after each commit's sync of the
    WAL, the next write to the WAL (the rewrite of the shared record) comes only after the
    copy was synced. NORMAL (the WAL is not synced at commits): the copy is still synced
    each commit, and the WAL is synced between two copies (the one-record side file is
    reused only once the rewrite it covered is durable). Then kill -9 the child: every
    commit it reported is there, whichever VFS reads it."""
    material = os.urandom(32)
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, material)])
    db = legacy_wal_db(tmp_path, keyring, monkeypatch)
    wal = str(db) + "-wal"
    log = tmp_path / "strace.txt"
    env = {**os.environ, "CD_TEST_KEY": material.hex(),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    tracer = subprocess.Popen(
        ["strace", "-f", "-y", "-o", str(log), "-e",
         "trace=fdatasync,fsync,pwrite64,pwritev", sys.executable, str(CHILD), str(db),
         sync], stdout=subprocess.PIPE, env=env)
    assert tracer.stdout is not None
    pid = int(tracer.stdout.readline())
    reported = [int(tracer.stdout.readline()) for _ in range(30)]
    os.kill(pid, signal.SIGKILL)
    tracer.communicate()
    events = _events(log.read_text())
    wal_syncs = [i for i, (call, what) in enumerate(events)
                 if call in ("fdatasync", "fsync") and what == wal]
    copies = [i for i, (call, what) in enumerate(events)
              if call in ("fdatasync", "fsync") and what == wal + "-cdtail"]
    writes = [i for i, (call, what) in enumerate(events)
              if call.startswith("pwrite") and what == wal]
    assert len(copies) >= 29  # a synced copy per commit (the first may find no shared record)
    if sync == "full":
        assert len(wal_syncs) >= 29  # each commit syncs the WAL
        for a, b in itertools.pairwise(wal_syncs):
            first_write = next(i for i in writes if a < i < b)
            assert any(a < i < first_write for i in copies), events[a:b]  # the copy first
    else:
        for a, b in itertools.pairwise(copies):
            assert any(a < i < b for i in wal_syncs), events[a:b]  # rewrite durable first
    for reader in csql.IMPLEMENTATIONS:
        copy = tmp_path / f"after-kill-{reader}"
        copy.mkdir()
        for suffix in ("", "-wal", "-wal-cdtail"):
            shutil.copy(str(db) + suffix, str(copy / "t.db") + suffix)
        monkeypatch.setenv("CRYPTDISK_SQLITE_VFS", reader)
        conn = csql.connect(str(copy / "t.db"), keyring=keyring)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            ids = {i for (i,) in conn.execute("SELECT id FROM t")}
        finally:
            conn.close()
        assert {1, *reported} <= ids, reader

"""Fuzz target for the encrypted SQLite VFSes (C and Python): files edited at rest.

A small WAL-mode database (page size 512) with commits 0..N-1, the last ones
still in the WAL, is edited (bytes overwritten, files cut) and opened. Two
bases: a framed WAL (kind 3, what both VFSes write), and a mutable WAL (kind 2,
as cryptdisk wrote WALs before) with its ``-cdtail`` side file beside it. The
only acceptable outcomes: a documented error (``CryptdiskError`` or an
``apsw.Error``), or the rows of a prefix of the commits (a damaged WAL drops the
commits from the damage on, as a crash would). Garbage rows, a crash or any
other exception is a bug.

    PYTHONPATH=src python tests/fuzz/fuzz_sqlite.py -atheris_runs=20000

`tests/fuzz/test_fuzz_sqlite.py` runs the same target on hypothesis inputs in CI.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import apsw

import cryptdisk.sqlite as csql
from cryptdisk import Key, Keyring
from cryptdisk.errors import CryptdiskError

RING = Keyring([Key(1, bytes(range(32)))])
COMMITS = 12
SUFFIXES = ("", "-wal", "-wal-cdtail")
BASES = ("framed", "legacy")
_BASE: dict[str, dict[str, bytes]] = {}


def base_files(base: str = "framed") -> dict[str, bytes]:
    """The database, its WAL and (legacy WAL) side file, made once per base.

    "framed": written by the C VFS. "legacy": by the Python VFS told to make the
    WAL a mutable file, as both did before WALs were framed.
    """
    if base not in _BASE:
        directory = tempfile.mkdtemp(prefix="cryptdisk-fuzz-sqlite-")
        path = os.path.join(directory, "f.db")
        framing = csql._vfs.framing
        if base == "legacy":
            csql._vfs.framing = lambda *args: (0, 0)  # type: ignore[assignment]
        try:
            _BASE[base] = _make(path, "c" if base == "framed" else "python")
        finally:
            csql._vfs.framing = framing
        shutil.rmtree(directory)
    return _BASE[base]


def _make(path: str, implementation: str) -> dict[str, bytes]:
    conn = csql.connect(path, keyring=RING, implementation=implementation)
    try:
        conn.execute("PRAGMA page_size=512")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # a legacy WAL's commits share segments
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE t(i INTEGER PRIMARY KEY, v TEXT)")
        for i in range(COMMITS):
            conn.execute("INSERT INTO t VALUES(?, ?)", (i, f"row {i} " * 20))
            if i == COMMITS // 2:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # copy while open: the WAL (and side file) are what a crash would leave
        return {s: _read(path + s) for s in SUFFIXES if os.path.exists(path + s)}
    finally:
        conn.close()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def target(edits: list[tuple[int, int, int]], cuts: list[tuple[int, int]], implementation: str,
           directory: str, base: str = "framed") -> int | None:
    """edits: (file, offset, byte); cuts: (file, length). Only documented outcomes pass.

    Returns how many commits were read back, or None for a documented error.
    """
    files = {suffix: bytearray(data) for suffix, data in base_files(base).items()}
    names = [suffix for suffix in SUFFIXES if suffix in files]
    for which, offset, value in edits:
        data = files[names[which % len(names)]]
        if data:
            data[offset % len(data)] = value
    for which, length in cuts:
        del files[names[which % len(names)]][length:]
    path = os.path.join(directory, "f.db")
    for suffix in (*SUFFIXES, "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    for suffix, data in files.items():
        with open(path + suffix, "wb") as f:
            f.write(data)
    try:
        conn = csql.connect(path, keyring=RING, implementation=implementation)
        try:
            rows = conn.execute("SELECT i, v FROM t ORDER BY i").fetchall()
        finally:
            conn.close()
    except (CryptdiskError, apsw.Error):
        return None
    assert rows == [(i, f"row {i} " * 20) for i in range(len(rows))], rows
    return len(rows)


def main() -> None:  # pragma: no cover - run by hand under atheris
    import atheris

    directory = tempfile.mkdtemp(prefix="cryptdisk-fuzz-sqlite-")

    def one(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        edits = [(fdp.ConsumeIntInRange(0, 2), fdp.ConsumeIntInRange(0, 1 << 16),
                  fdp.ConsumeIntInRange(0, 255)) for _ in range(fdp.ConsumeIntInRange(0, 4))]
        cuts = [(fdp.ConsumeIntInRange(0, 2), fdp.ConsumeIntInRange(0, 1 << 16))
                for _ in range(fdp.ConsumeIntInRange(0, 1))]
        target(edits, cuts, csql.IMPLEMENTATIONS[fdp.ConsumeIntInRange(0, 1)], directory,
               BASES[fdp.ConsumeIntInRange(0, 1)])

    atheris.instrument_all()
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()

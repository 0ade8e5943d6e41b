"""Fuzz target for the encrypted SQLite VFSes (C and Python): files edited at rest.

A small WAL-mode database (page size 512) with commits 0..N-1, the last ones
still in the WAL and a ``-cdtail`` side file beside it, is edited (bytes
overwritten, files cut) and opened. The only acceptable outcomes: a
documented error (``CryptdiskError`` or an ``apsw.Error``), or the rows of a
prefix of the commits (a damaged WAL drops the commits from the damage on, as
a crash would). Garbage rows, a crash or any other exception is a bug.

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
_BASE: dict[str, bytes] = {}


def base_files() -> dict[str, bytes]:
    """The database, its WAL and side file, made once (by the C VFS)."""
    if not _BASE:
        directory = tempfile.mkdtemp(prefix="cryptdisk-fuzz-sqlite-")
        path = os.path.join(directory, "f.db")
        conn = csql.connect(path, keyring=RING, implementation="c")
        conn.execute("PRAGMA page_size=512")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # commits share segments: a side file
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("CREATE TABLE t(i INTEGER PRIMARY KEY, v TEXT)")
        for i in range(COMMITS):
            conn.execute("INSERT INTO t VALUES(?, ?)", (i, f"row {i} " * 20))
            if i == COMMITS // 2:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        # copy while open: the WAL and side file are what a crash would leave
        for suffix in SUFFIXES:
            with open(path + suffix, "rb") as f:
                _BASE[suffix] = f.read()
        conn.close()
        shutil.rmtree(directory)
    return _BASE


def target(edits: list[tuple[int, int, int]], cuts: list[tuple[int, int]], implementation: str,
           directory: str) -> int | None:
    """edits: (file, offset, byte); cuts: (file, length). Only documented outcomes pass.

    Returns how many commits were read back, or None for a documented error.
    """
    files = {suffix: bytearray(data) for suffix, data in base_files().items()}
    for which, offset, value in edits:
        data = files[SUFFIXES[which % len(SUFFIXES)]]
        if data:
            data[offset % len(data)] = value
    for which, length in cuts:
        suffix = SUFFIXES[which % len(SUFFIXES)]
        del files[suffix][length:]
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
        target(edits, cuts, csql.IMPLEMENTATIONS[fdp.ConsumeIntInRange(0, 1)], directory)

    atheris.instrument_all()
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()

"""Child for the torn-write test: dies by SIGKILL halfway through writing page 1 of the database.

Usage: python torn_child.py DB JOURNAL_MODE WHAT (key in CD_TEST_KEY). Commits
row 1, then arms a ``pwrite`` to the database that writes only part of a record
and kills the process: WHAT=page1 cuts page 1's record at the first kernel
page boundary (where SIGKILL cuts a real write); WHAT=append cuts the first
record appended past the file's end after 20 bytes (less than a nonce and
tag). In DELETE mode while committing row 2 (a 20 KB row), in WAL mode while
checkpointing both rows.
"""

import ctypes
import os
import signal
import sys

import apsw

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.format import HEADER_SIZE

_PWRITE = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_int64)
_keep = []


def arm(torn) -> None:
    """Route the VFS's writes through ``torn(fd, data, offset) -> int``.

    The Python VFS writes with ``os.pwrite``; the C VFS through SQLite's unix
    VFS, whose ``pwrite64`` SQLite lets a test replace (``xSetSystemCall``).
    """
    if csql.implementation() == "python":
        os.pwrite = torn
        return
    unix = apsw.VFS("torn-child", base="unix")
    real = _PWRITE(unix.xGetSystemCall("pwrite64"))

    def hook(fd: int, buf: int, n: int, offset: int) -> int:
        return torn(fd, ctypes.string_at(buf, n), offset,
                    lambda fd, data, offset: real(fd, data, len(data), offset))

    callback = _PWRITE(hook)
    _keep.extend([unix, real, callback])
    unix.xSetSystemCall("pwrite64", ctypes.cast(callback, ctypes.c_void_p).value)


def main() -> None:
    path, journal, what = sys.argv[1:4]
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(os.environ["CD_TEST_KEY"]))])
    conn = csql.connect(path, keyring=keyring)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("CREATE TABLE t(x)")
    conn.execute("INSERT INTO t VALUES(1)")
    st = os.stat(path)
    end = st.st_size

    def torn(fd: int, data: bytes, offset: int, real=os.pwrite) -> int:
        fst = os.fstat(fd)
        is_db = (fst.st_dev, fst.st_ino) == (st.st_dev, st.st_ino)
        if is_db and what == "page1" and offset == HEADER_SIZE:
            real(fd, bytes(data[: 4096 - HEADER_SIZE]), offset)
            os.kill(os.getpid(), signal.SIGKILL)
        if is_db and what == "append" and offset >= end:
            real(fd, bytes(data[:20]), offset)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(fd, data, offset)

    if journal == "wal":
        conn.execute("INSERT INTO t VALUES(randomblob(20000))")
        arm(torn)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        arm(torn)
        conn.execute("INSERT INTO t VALUES(randomblob(20000))")
    sys.exit("page 1 was never written")


if __name__ == "__main__":
    main()

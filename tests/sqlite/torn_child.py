"""Child for the torn-write test: dies by SIGKILL halfway through writing page 1 of the database.

Usage: python torn_child.py DB JOURNAL_MODE WHAT (key in CD_TEST_KEY). Commits
row 1, then arms a ``pwrite`` to the database that writes only part of a record
and kills the process: WHAT=page1 cuts page 1's record at the first kernel
page boundary (where SIGKILL cuts a real write); WHAT=append cuts the first
record appended past the file's end after 20 bytes (less than a nonce and
tag). In DELETE mode while committing row 2 (a 20 KB row), in WAL mode while
checkpointing both rows.
"""

import os
import signal
import sys

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.format import HEADER_SIZE
from cryptdisk.sqlite import _fds


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
    db_fd = _fds._table[(st.st_dev, st.st_ino)][0]
    real = os.pwrite

    def torn(fd: int, data: bytes, offset: int) -> int:
        if fd == db_fd and what == "page1" and offset == HEADER_SIZE:
            real(fd, memoryview(data)[: 4096 - HEADER_SIZE], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        if fd == db_fd and what == "append" and offset >= end:
            real(fd, memoryview(data)[:20], offset)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(fd, data, offset)

    if journal == "wal":
        conn.execute("INSERT INTO t VALUES(randomblob(20000))")
        os.pwrite = torn
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    else:
        os.pwrite = torn
        conn.execute("INSERT INTO t VALUES(randomblob(20000))")
    sys.exit("page 1 was never written")


if __name__ == "__main__":
    main()

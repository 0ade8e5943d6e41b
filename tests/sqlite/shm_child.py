"""Child process for the wal-index tests: holds an encrypted WAL database open.

Usage: python shm_child.py DB MODE (key in CD_TEST_KEY). MODE is ``cryptdisk``
(the VFS of $CRYPTDISK_SQLITE_VFS) or ``beside`` (the Python VFS over SQLite's
default VFS, which keeps the wal-index beside the database, as cryptdisk does
without its C extension). It inserts a row, prints ``ready`` (or the class name
of the exception it got), then inserts one more row per line read from stdin,
printing the row count after each, until stdin closes.
"""

import os
import sys

import apsw

import cryptdisk
import cryptdisk.sqlite as csql
import cryptdisk.sqlite._vfs as pyvfs

KEEP: list = []


def connect(path: str, mode: str, keyring: cryptdisk.Keyring):
    if mode == "cryptdisk":
        return csql.connect(path, keyring=keyring)
    pyvfs.plain_base = lambda: ""  # the wal-index beside the database
    vfs = pyvfs.EncryptedVFS(keyring)
    KEEP.append(vfs)  # registered for as long as the process runs
    return apsw.Connection(path, vfs=vfs.vfs_name)


def main() -> None:
    path, mode = sys.argv[1:3]
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(os.environ["CD_TEST_KEY"]))])
    try:
        conn = connect(path, mode, keyring)
        conn.execute("PRAGMA journal_mode=WAL").fetchall()
        conn.execute("CREATE TABLE IF NOT EXISTS t(x)")
        conn.execute("INSERT INTO t VALUES (1)")
    except Exception as exc:  # the parent asserts on the class
        print(type(exc).__name__, flush=True)
        return
    print("ready", flush=True)
    for _ in sys.stdin:
        conn.execute("INSERT INTO t VALUES (1)")
        print(conn.execute("SELECT count(*) FROM t").fetchall()[0][0], flush=True)
    conn.close()


if __name__ == "__main__":
    main()

"""Child process for the -cdtail tests: commits numbered rows into a legacy WAL until killed.

Usage: python tail_child.py DB SYNCHRONOUS (key in CD_TEST_KEY, VFS in CRYPTDISK_SQLITE_VFS).
Prints its pid, then each row number on stdout after COMMIT has returned.
"""

import os
import sys

import cryptdisk
import cryptdisk.sqlite as csql


def main() -> None:
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(os.environ["CD_TEST_KEY"]))])
    conn = csql.connect(sys.argv[1], keyring=keyring)
    conn.execute(f"PRAGMA synchronous={sys.argv[2]}")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    os.write(1, b"%d\n" % os.getpid())
    n = 100
    while True:
        conn.execute("INSERT INTO t VALUES(?, randomblob(300))", (n,))  # a commit of its own
        os.write(1, b"%d\n" % n)
        n += 1


if __name__ == "__main__":
    main()

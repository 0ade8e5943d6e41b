"""Child process for test_tail_damage.py: COUNT numbered commits into a legacy WAL (each
saves the WAL's shared last record in -cdtail), whatever happens to the side file.

Usage: python tail_damage_child.py DB COUNT [FILLER] (key in CD_TEST_KEY, VFS in
CRYPTDISK_SQLITE_VFS). Prints "ok N" after each commit that returned, "err N TYPE MESSAGE"
for each that raised, "close-err TYPE MESSAGE" if closing raised, then "done". FILLER:
first fill the file system with that file, and delete it after half the commits (a full
disk, then space again).
"""

import errno
import os
import sys

import cryptdisk
import cryptdisk.sqlite as csql


def fill(path: str) -> None:
    """Write path until the file system is full (to the last block)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)


def main() -> None:
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(os.environ["CD_TEST_KEY"]))])
    conn = csql.connect(sys.argv[1], keyring=keyring)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    count = int(sys.argv[2])
    filler = sys.argv[3] if len(sys.argv) > 3 else None
    if filler:
        fill(filler)
    for n in range(100, 100 + count):
        if filler and n == 100 + count // 2:
            os.unlink(filler)
        try:
            conn.execute("INSERT INTO t VALUES(?, randomblob(300))", (n,))  # a commit of its own
        except Exception as e:  # reported: the test judges it
            print("err", n, type(e).__name__, str(e).replace("\n", " "), flush=True)
        else:
            print("ok", n, flush=True)
    try:
        conn.close()
    except Exception as e:  # gathered bytes of a failed commit are written at close
        print("close-err", type(e).__name__, str(e).replace("\n", " "), flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()

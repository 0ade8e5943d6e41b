"""Child process for the kill -9 test: commits numbered transactions until it is killed.

Usage: python crash_child.py DB JOURNAL_MODE SYNCHRONOUS SEED (key in CD_TEST_KEY).
Prints ``open`` before it opens (and recovers) the database, then each transaction
number on stdout after COMMIT has returned: the parent kills it at those reports.
"""

import os
import random
import sys

import cryptdisk
import cryptdisk.sqlite as csql


def main() -> None:
    path, journal, sync, seed = sys.argv[1:5]
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(os.environ["CD_TEST_KEY"]))])
    os.write(1, b"open\n")
    conn = csql.connect(path, keyring=keyring)
    conn.execute(f"PRAGMA journal_mode={journal}")
    conn.execute(f"PRAGMA synchronous={sync}")
    conn.execute("PRAGMA cache_size=3")  # spill pages mid-transaction
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE IF NOT EXISTS log(n INTEGER PRIMARY KEY, k INT, pad BLOB)")
    conn.execute("CREATE TABLE IF NOT EXISTS acc(id INTEGER PRIMARY KEY, bal INT)")
    if not conn.execute("SELECT count(*) FROM acc").fetchall()[0][0]:
        conn.executemany("INSERT INTO acc VALUES(?, 0)", [(i,) for i in range(500)])
    conn.execute("COMMIT")
    n = conn.execute("SELECT coalesce(max(n), 0) + 1 FROM log").fetchall()[0][0]
    rnd = random.Random(int(seed))
    while True:
        k = rnd.randrange(1, 20)
        conn.execute("BEGIN")
        conn.execute("INSERT INTO log VALUES(?, ?, randomblob(?))", (n, k, rnd.randrange(10, 3000)))
        for _ in range(k):
            conn.execute("UPDATE acc SET bal = bal + 1 WHERE id = ?", (rnd.randrange(500),))
        conn.execute("COMMIT")
        os.write(1, b"%d\n" % n)
        n += 1


if __name__ == "__main__":
    main()

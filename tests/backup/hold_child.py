"""Child process holding an encrypted SQLite database open, for the restore --force tests.

Usage: python hold_child.py DB KEYFILE MODE STATE. MODE is ``wal`` or ``rollback`` (the
journal mode it sets); STATE is what it holds when it prints ``ready``: ``idle`` (a
connection that has read once and ended its transaction), ``read`` (inside a read
transaction) or ``write`` (inside a write transaction with a row inserted). Then, for each
line read from stdin, it commits what it holds (if anything), inserts one row and prints
the row count (or the class name of the exception it got), until stdin closes.
"""

import sys

import cryptdisk.sqlite
from cryptdisk.keys import Key, Keyring, key_from_file


def main() -> None:
    path, keyfile, mode, state = sys.argv[1:5]
    conn = cryptdisk.sqlite.connect(path, keyring=Keyring.single(Key(1, key_from_file(keyfile))))
    conn.execute("PRAGMA journal_mode=" + ("WAL" if mode == "wal" else "DELETE")).fetchall()
    conn.execute("SELECT count(*) FROM w").fetchall()
    if state == "read":
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM w").fetchall()
    elif state == "write":
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO w VALUES (-1)")
    print("ready", flush=True)
    for _ in sys.stdin:
        try:
            if conn.in_transaction:
                conn.execute("COMMIT")
            conn.execute("INSERT INTO w VALUES (-2)")
            print(conn.execute("SELECT count(*) FROM w").fetchall()[0][0], flush=True)
        except Exception as exc:  # the parent asserts on it
            print(type(exc).__name__, flush=True)
    conn.close()


if __name__ == "__main__":
    main()

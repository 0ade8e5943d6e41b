"""Child for the truncated-part tests: a scan whose part file the parent cuts short.

Usage: truncate_child.py DB TABLE

Opens the database read-only, starts streaming ``SELECT c_int, c_str FROM TABLE`` and
prints ``ready`` after the first batch; once the parent writes a line (it has truncated
the part meanwhile), reads the rest and prints ``rows N`` or ``error CLASS MESSAGE``,
then answers a query on the intact table ``u`` (``intact ROWS``). The process has to
live through the read of the truncated file to print the last two lines.
"""

import sys

import cryptdisk


def main():
    path, table = sys.argv[1:3]
    db = cryptdisk.connect(path, read_only=True, cache_bytes=0)
    stream = db.stream(f"SELECT c_int, c_str FROM {table}", batch_rows=2048)
    got = stream.read_next_batch().num_rows
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        for batch in stream:
            got += batch.num_rows
        print(f"rows {got}", flush=True)
    except Exception as exc:  # (the parent checks the class)
        print(f"error {type(exc).__name__} {exc}".replace("\n", " "), flush=True)
    print(f"intact {db.query('SELECT count(*), sum(a) FROM u')}", flush=True)
    db.close()


if __name__ == "__main__":
    main()

"""Child process for the kill -9 tests: loops over one kind of write until killed.

Usage: crash_child.py DB CONFIG_A CONFIG_B OPERATION
Prints ``committed N`` after the N-th insert has returned (so it is durable).
OPERATION ``alter`` adds, renames and drops a column between inserts; ``big-insert``:
one insert of :data:`BIG` rows (keys in random order) in blocks of about 8K rows, each
sorted and written as its own part on two threads, printing ``rows N`` as they are
written and waiting after each for a line on stdin, the parent's word to go on (so a kill
sent instead lands there, the insert unfinished); ``big-insert-sorted``: the same with
keys already in order, so blocks go on at the end of parts of up to 40K rows.
"""

import sys

import cryptdisk

BATCH = 2000
BIG = 200_000  # rows of a big-insert: 5 parts


def insert(db, i):
    db.sql(f"INSERT INTO t (c_int, c_str, c_float) SELECT {i}, md5(r::VARCHAR) || '{i}', r "
           f"FROM range({BATCH}) x(r)")


def _rows(n):
    """Report ``n`` rows written (a part thread), then wait for the parent's word."""
    print(f"rows {n}", flush=True)
    if not sys.stdin.readline():  # the parent went away
        sys.exit(1)


def big_insert(db, presorted):
    """One insert of many parts and row groups; ``rows N`` as each block is encoded, while
    the source thread pulls the next batches, part threads sort and encode blocks, and
    their writer threads hash and encrypt."""
    from cryptdisk.db import _insert, _parts

    _insert.BATCH_ROWS, _insert.PART_ROWS, _parts.ROW_GROUP_ROWS = 4096, 40_000, 2048
    db.insert_block_bytes = 256 << 10
    i = db.query("SELECT coalesce(max(c_int) + 1, 0) FROM t")[0][0]
    key = "lpad(r::VARCHAR, 8, '0')" if presorted else "md5(r::VARCHAR)"  # ORDER BY c_str
    db.insert_query("t", f"SELECT {i}, {key}, r FROM range({BIG}) x(r)", on_rows=_rows)
    print(f"committed {i}", flush=True)


def main():
    path, cfg_a, cfg_b, op = sys.argv[1:5]
    db = cryptdisk.connect(path, cfg_a)
    if op.startswith("big-insert"):
        big_insert(db, op.endswith("sorted"))
        return
    i = db.query("SELECT coalesce(max(c_int) + 1, 0) FROM t")[0][0]
    for n in range(10_000):
        if op == "insert" or n % 3 == 0:
            insert(db, i)
            print(f"committed {i}", flush=True)
            i += 1
        elif op == "optimize":
            db.sql("OPTIMIZE TABLE t FINAL")
        elif op == "move":
            policy = "plain" if n % 2 else "default"
            db.sql(f"ALTER TABLE t MODIFY SETTING storage_policy = '{policy}'")
        elif op == "alter":  # ADD, RENAME and DROP of a column, rewriting every part
            extra = [c for c, _t in db.table("t").columns[3:]]
            if not extra:
                db.sql(f"ALTER TABLE t ADD COLUMN x{n} BIGINT")
            elif extra[0].startswith("x"):
                db.sql(f"ALTER TABLE t RENAME COLUMN {extra[0]} TO y{n}")
            else:
                db.sql(f"ALTER TABLE t DROP COLUMN {extra[0]}")
        elif op == "rotate":
            db.close()
            db = cryptdisk.connect(path, cfg_b if n % 2 else cfg_a)
            db.sql("SYSTEM ROTATE KEYS")
        print("step", flush=True)


if __name__ == "__main__":
    main()

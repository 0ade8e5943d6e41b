"""Child process for the kill -9 tests: loops over one kind of write until killed.

Usage: crash_child.py DB CONFIG_A CONFIG_B OPERATION
Prints ``committed N`` after the N-th insert has returned (so it is durable).
"""

import sys

import cryptdisk

BATCH = 2000


def insert(db, i):
    db.sql(f"INSERT INTO t SELECT {i}, md5(r::VARCHAR) || '{i}', r FROM range({BATCH}) x(r)")


def main():
    path, cfg_a, cfg_b, op = sys.argv[1:5]
    db = cryptdisk.connect(path, cfg_a)
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
        elif op == "rotate":
            db.close()
            db = cryptdisk.connect(path, cfg_b if n % 2 else cfg_a)
            db.sql("SYSTEM ROTATE KEYS")
        print("step", flush=True)


if __name__ == "__main__":
    main()

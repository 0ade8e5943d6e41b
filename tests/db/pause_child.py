"""Child for kill -9 tests at a chosen point: stops just before a file is published.

Usage: pause_child.py DB NAME STATEMENT [CONFIG]

Opens the database for writing, prints ``open``, and runs STATEMENT. When the
statement is about to rename a temporary onto a file whose base name is NAME
(``catalog``, a pin, ...), it prints ``paused TEMPORARY`` and sleeps until killed,
so the parent kills it at that exact point.
"""

import os
import sys
import time

import cryptdisk


def main():
    path, name, statement = sys.argv[1:4]
    config = sys.argv[4] if len(sys.argv) > 4 else None
    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if os.path.basename(os.fspath(dst)) == name:
            print(f"paused {os.fspath(src)}", flush=True)
            time.sleep(600)
        return real_replace(src, dst, *args, **kwargs)

    os.replace = replace
    db = cryptdisk.connect(path, config)
    print("open", flush=True)
    db.sql(statement)
    print("done", flush=True)


if __name__ == "__main__":
    main()

"""Child for the kill -9 lifecycle tests: runs one ``cryptdisk`` command, pausing at a write.

Usage: lifecycle_child.py N ARGS...

Runs ``cryptdisk ARGS...`` in this process. Every call that changes the disk
(``os.write``, ``os.pwrite``, ``os.fsync``, ``os.replace``, ``os.link``, ``os.unlink``)
counts; before the N-th it prints ``paused N CALL`` and sleeps until killed, so the
parent kills it at that exact point (with ``CHILD_RESUME=1`` in the environment it
waits for a line on stdin instead and goes on: the parent does something at that
point, such as stopping a key server). A run with fewer than N such calls prints
``finished CODE`` instead.
"""

import os
import sys
import time

calls = 0


def main():
    stop = int(sys.argv[1])
    argv = sys.argv[2:]
    for name in ("write", "pwrite", "fsync", "replace", "link", "unlink"):
        real = getattr(os, name)

        def wrapped(*args, _real=real, _name=name, **kwargs):
            global calls
            if _name == "write" and args and args[0] in (1, 2):  # our own stdout/stderr
                return _real(*args, **kwargs)
            calls += 1
            if calls == stop:
                sys.__stdout__.write(f"paused {calls} {_name}\n")
                sys.__stdout__.flush()
                if os.environ.get("CHILD_RESUME"):
                    sys.stdin.readline()
                else:
                    time.sleep(600)
            return _real(*args, **kwargs)

        setattr(os, name, wrapped)
    from cryptdisk.cli._app import main as cli

    code = cli(argv)
    sys.stdout.flush()
    print(f"finished {code}", flush=True)


if __name__ == "__main__":
    main()

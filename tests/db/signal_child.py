"""Child process for the SIGTERM/SIGINT test of committed writes: writes until signalled.

Usage: signal_child.py DB
SIGTERM is handled as the ``cryptdisk`` command handles it (``Terminated`` raised in the
main thread), SIGINT as Python does (``KeyboardInterrupt``). Prints ``go`` once it writes;
exits 130 on the signal's exception, 131 on any other error (a statement's error where
the signal's exception should have come: a DuckDB query's, or a callback's).
"""

import faulthandler
import signal
import sys

import cryptdisk
from cryptdisk.cli._app import Terminated, _terminate_cleanly


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # (the parent's, if it hangs)
    # Python's own Ctrl-C: a suite started in the background (``cmd &``) passes SIGINT on
    # ignored, and Python then installs no handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _terminate_cleanly()
    try:
        with cryptdisk.connect(sys.argv[1]) as db:
            print("go", flush=True)
            k = 0
            while True:
                k += 1
                db.sql("UPDATE t SET n = n + 1 WHERE id % 3 = 0")
                db.sql(f"DELETE FROM t WHERE id = {k % 100}")
                db.sql(f"INSERT INTO t VALUES ({k % 100}, 0)")
                if k % 5 == 0:
                    db.sql("OPTIMIZE TABLE t FINAL")
    except (KeyboardInterrupt, Terminated):
        return 130
    except Exception as exc:  # (the signal became an error on the way: a failure)
        print(f"error: {exc!r}", file=sys.stderr)
        return 131


if __name__ == "__main__":
    sys.exit(main())

"""Child process for test_db_signal_kept.py: real signals, at random moments, into a loop of
statements that are all bookkeeping (a database's lock, or kept_signals, held around
nothing, nested or not), so many land in the relaying's own steps.

Usage: signal_bookkeeping_child.py KIND N
KIND is ``lock``, ``kept`` or ``nested``; N signals are sent (SIGINT, or SIGTERM with a
handler raising ``Stop``), one at a time, each once the previous one's exception was
caught. After each, the child notes what the exception left behind: a relay still
installed (``relay``), the lock still held by the main thread (``held``), a hold's relays
never taken back (``stack``). Prints a JSON object: the signals sent and the counts.
"""

import json
import os
import random
import signal
import sys
import threading

from cryptdisk.db._sigint import StatementLock, _Relay, kept_signals


class Stop(BaseException):
    pass


def _stop(signum, frame):
    raise Stop()


def main() -> int:
    kind, n = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop)
    originals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    lock = StatementLock()
    armed = threading.Event()
    sent = threading.Event()
    rng = random.Random(1)

    def sender() -> None:
        for i in range(n):
            armed.wait()
            armed.clear()
            for _ in range(rng.randrange(2000)):  # (a moment, at random; no clock)
                pass
            os.kill(os.getpid(), signal.SIGINT if i % 2 else signal.SIGTERM)
        sent.set()

    def statement() -> None:
        if kind == "lock":
            with lock:
                pass
        elif kind == "kept":
            with kept_signals():
                pass
        else:
            with kept_signals(), lock, lock:
                pass

    left = {"relay": 0, "held": 0, "stack": 0}
    threading.Thread(target=sender, daemon=True).start()
    caught = 0
    while caught < n:
        armed.set()
        try:
            while True:
                statement()
        except (KeyboardInterrupt, Stop):
            caught += 1
        for signum, handler in originals.items():
            now = signal.getsignal(signum)
            if now is not handler:
                left["relay"] += 1
                signal.signal(signum, now.handler if isinstance(now, _Relay) else handler)
        if lock._lock._is_owned():
            left["held"] += 1
            while lock._lock._is_owned():
                lock._lock.release()
        if lock._held:
            left["stack"] += 1
            lock._held.clear()
    sent.wait()
    print(json.dumps({"signals": caught, **left}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Child for the concurrent-rotation test: rewrites files' headers back and forth until told
to stop.

Usage: rotate_loop_child.py CONFIG STOP_FILE PATH...
Each round rewraps every PATH to the next key of the config's keyring with
``cryptdisk.keys.rewrap_file``, as rotations do, then writes each file's header before and
after that rewrap again, alternately, ``FLIPS`` times (ending with the one after): the same
128 bytes with one ``pwrite`` each, without unwrapping, so the headers change many times
more often and more of the readers' reads meet a write. Stops when STOP_FILE exists;
prints ``ready`` after its first round, and at the end the number of headers written and
of rounds. Its
fsyncs are skipped: durability is not what the test looks at.
"""

import os
import sys

from cryptdisk import Keyring
from cryptdisk.format import HEADER_SIZE
from cryptdisk.keys import rewrap_file

FLIPS = 50


def header(path):
    with open(path, "rb") as f:
        return f.read(HEADER_SIZE)


def main():
    config, stop, *paths = sys.argv[1:]
    ring = Keyring.from_config(config)
    rings = [ring.with_current(i) for i in sorted(ring.ids)]
    os.fsync = lambda fd: None
    fds = [os.open(p, os.O_WRONLY) for p in paths]
    written = rounds = 0
    while not os.path.exists(stop):
        before = [header(p) for p in paths]
        for path in paths:
            written += rewrap_file(path, rings[rounds % len(rings)])
        after = [header(p) for p in paths]
        for _ in range(FLIPS):
            for fd, old, new in zip(fds, before, after, strict=True):
                os.pwrite(fd, old, 0)
                os.pwrite(fd, new, 0)
                written += 2
        if rounds == 0:
            print("ready", flush=True)
        rounds += 1
    print(written, rounds, flush=True)


if __name__ == "__main__":
    main()

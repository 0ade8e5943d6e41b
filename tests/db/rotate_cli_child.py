"""Child for the kill -9 tests of ``cryptdisk rotate --new-key`` before the key is current.

Usage: rotate_cli_child.py POINT CLI-ARGS...
Runs the ``cryptdisk`` command with CLI-ARGS, stopping at POINT of installing the new key
(it prints ``at POINT`` and waits for a ``go`` line on stdin, so the parent kills it there):

- ``staging``: the new key written to ``PATH.key.new``, not yet renamed to ``PATH.key.pending``
- ``staged``: the new key recorded in ``PATH.key.pending``, the checks not yet run
- ``kept``: the old key written to ``PATH.key.ID``, the new one not yet renamed to ``PATH.key``
"""

import sys

from cryptdisk.cli import main
from cryptdisk.db import _keyfiles, _rotation


def pause(point):
    print(f"at {point}", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)


def after(func, point, when=lambda *args: True):
    def wrapped(*args, **kwargs):
        out = func(*args, **kwargs)
        if when(*args):
            pause(point)
        return out
    return wrapped


def setup(point):
    if point == "staging":
        _keyfiles.write_key_file = after(_keyfiles.write_key_file, point,
                                         lambda path, *a: str(path).endswith(".key.new"))
    elif point == "staged":
        _rotation.stage_current_key = after(_rotation.stage_current_key, point)
    elif point == "kept":
        _keyfiles._keep = after(_keyfiles._keep, point)
    else:
        raise SystemExit(f"unknown point {point}")


if __name__ == "__main__":
    setup(sys.argv[1])
    sys.exit(main(sys.argv[2:]))

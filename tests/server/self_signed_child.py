"""Child process for the kill -9 test of ``cryptdisk serve --self-signed``'s first start.

Usage: self_signed_child.py CERT KEY
Makes the certificate and key as ``cryptdisk serve --self-signed`` does
(:func:`cryptdisk.server.ensure_self_signed`). After each step it takes on the file
system in the files' directory (a file opened for writing, a rename, a link, an unlink,
before its data is written) it prints ``step WHAT`` and waits for a line on stdin, the
parent's word to go on, so a kill sent instead lands right there; ``done`` at the end.
"""

import builtins
import os
import sys

CERT, KEY = sys.argv[1:3]
HERE = os.path.dirname(os.path.abspath(CERT))


def pause(what, path):
    if os.path.dirname(os.path.abspath(os.fspath(path))) == HERE:
        print(f"step {what} {os.path.basename(os.fspath(path))}", flush=True)
        if not sys.stdin.readline():  # the parent went away
            os._exit(1)


def wrap(name, writes=lambda *a, **k: True):
    real = getattr(os, name)

    def step(path, *args, **kwargs):
        out = real(path, *args, **kwargs)
        if writes(*args, **kwargs):
            pause(name, path)
        return out

    setattr(os, name, step)


real_open = builtins.open


def opened(file, mode="r", *args, **kwargs):
    f = real_open(file, mode, *args, **kwargs)
    if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
        pause("open", file)
    return f


builtins.open = opened
wrap("open", lambda flags, *a, **k: bool(flags & (os.O_WRONLY | os.O_RDWR)))
for name in ("replace", "rename", "link", "unlink"):
    wrap(name)

from cryptdisk.server import ensure_self_signed  # noqa: E402

ensure_self_signed(CERT, KEY)
print("done", flush=True)

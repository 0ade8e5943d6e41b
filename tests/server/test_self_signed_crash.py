"""kill -9 of ``cryptdisk serve --self-signed`` while it makes its certificate and key.

The first start writes ``PATH.server.pem`` and ``PATH.server.key``; later starts use them
as they are. A real child process making them is killed with SIGKILL after each step it
takes on the file system (each file opened for writing, before its data; each rename and
unlink): after every kill the next start must serve, that is the pair on disk (made again
if need be) loads as a TLS certificate and its key, and no private key is left beside them
in a temporary file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from cryptdisk.server import ensure_self_signed, load_tls

CHILD = os.path.join(os.path.dirname(__file__), "self_signed_child.py")


def env():
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))


def test_kill_9_while_making_the_self_signed_pair_leaves_a_pair_that_serves(tmp_path):
    kill_after = 0
    while True:
        kill_after += 1
        where = tmp_path / f"run{kill_after}"
        where.mkdir()
        cert, key = where / "sales.db.server.pem", where / "sales.db.server.key"
        child = subprocess.Popen([sys.executable, CHILD, str(cert), str(key)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=env())
        steps = []
        for _ in range(kill_after):
            line = child.stdout.readline()
            steps.append(line.strip())
            if line.strip() == "done":
                break
            assert line.startswith("step "), line
            child.stdin.write("go\n")
            child.stdin.flush()
        finished = steps[-1] == "done"
        if not finished:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stdin.close()
        # the next start: makes the pair if it is not there, then loads it
        ensure_self_signed(str(cert), str(key))
        load_tls(cert, key)
        assert sorted(os.listdir(where)) == ["sales.db.server.key", "sales.db.server.pem"], \
            (steps, os.listdir(where))
        assert os.stat(key).st_mode & 0o777 == 0o600
        if finished:
            break
    assert kill_after >= 3, steps  # the pair took several steps: kills landed among them

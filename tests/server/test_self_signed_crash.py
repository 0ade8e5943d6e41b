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


def test_two_first_starts_at_once_leave_one_matching_pair(tmp_path):
    """Two first starts of ``serve --self-signed`` over the same files (two SQLite servers
    of one database may start together): one makes the pair, the other finds it. Without
    a lock between them, the second's key could replace the first's between the first's
    key and certificate (A's key, B's key, B's certificate, A's certificate), leaving a
    certificate with another process's key, which no start then loads. Here A stops right
    after putting its key in place, B runs as far as it can, then A finishes."""
    import ssl

    cert, key = tmp_path / "sales.db.server.pem", tmp_path / "sales.db.server.key"

    def start():
        return subprocess.Popen([sys.executable, CHILD, str(cert), str(key)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env())

    a = start()
    while True:  # A up to its key's rename into place
        line = a.stdout.readline()
        assert line.startswith("step "), line
        if line.split()[1] == "replace" and line.split()[2].startswith(key.name + "."):
            break
        a.stdin.write("go\n")
        a.stdin.flush()
    b = start()
    b.stdin.write("go\n" * 50)  # B never waits for the test (it may wait for A)
    b.stdin.flush()
    try:
        b.wait(timeout=15)  # (with a lock, B waits for A: it is finished below)
    except subprocess.TimeoutExpired:
        pass
    a.stdin.write("go\n" * 50)
    a.stdin.flush()
    for child in (a, b):
        assert child.wait(timeout=60) == 0
        out = child.stdout.read()
        assert out.rstrip().endswith("done"), out
        child.stdout.close()
        child.stdin.close()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)  # the key is the certificate's
    load_tls(cert, key)
    assert sorted(os.listdir(tmp_path)) == [key.name, cert.name]


_DIES_MAKING_THE_PAIR = """
import cryptdisk.server._tls as tls
tls._make_pair = lambda *args: fork_and_die()  # the directory locked
tls.self_signed(sys.argv[1], sys.argv[2])
"""


def test_a_forked_child_does_not_keep_the_pair_lock_of_a_process_that_died(tmp_path):
    """Making the pair holds an flock of its directory. A process forked meanwhile shared
    that open file: after the maker died the child kept the flock, and every start with
    --self-signed in that directory waited for the child to exit. The child now closes
    its copy as it starts."""
    import fcntl

    from tests.forked import child_of_a_dead_holder

    cert, key = tmp_path / "sales.db.server.pem", tmp_path / "sales.db.server.key"
    with child_of_a_dead_holder(_DIES_MAKING_THE_PAIR, str(cert), str(key), env=env()):
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError before
        finally:
            os.close(fd)
        ensure_self_signed(str(cert), str(key))
        load_tls(str(cert), str(key))

"""Parallel reads keep working in a process forked after the thread pool started."""

from __future__ import annotations

import os
import time

import cryptdisk
from cryptdisk import Keyring
from cryptdisk.format import _sealed

RING = Keyring.generate()
SEG = 512


def _exit_code(pid: int, timeout: float = 20.0) -> int:
    """The child's exit code; a child still running after ``timeout`` is killed and fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child hung")


def test_a_forked_child_decrypts_in_parallel_again(tmp_path):
    data = os.urandom(40 * SEG + 3)  # 40 whole segments: the parallel path
    path = tmp_path / "f"
    with cryptdisk.open(path, "wb", keyring=RING, segment_size=SEG) as f:
        f.write(data)
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        assert f.read() == data
    assert _sealed._POOL is not None  # the parent's pool and its threads exist
    pid = os.fork()
    if pid == 0:  # the child: the old pool would make it wait forever
        try:
            with cryptdisk.open(path, "rb", keyring=RING) as f:
                os._exit(0 if f.read() == data else 1)
        except BaseException:
            os._exit(2)
    assert _exit_code(pid) == 0


def test_a_forked_child_reads_with_a_reader_its_parent_opened(tmp_path):
    """The C extension's key data and its library's manager are plain memory in the child."""
    data = os.urandom(40 * SEG + 3)
    path = tmp_path / "f"
    with cryptdisk.open(path, "wb", keyring=RING, segment_size=SEG) as f:
        f.write(data)
    with cryptdisk.open(path, "rb", keyring=RING) as f:
        assert f.read(100) == data[:100]
        pid = os.fork()
        if pid == 0:
            try:
                f.seek(0)
                os._exit(0 if f.read() == data else 1)
            except BaseException:
                os._exit(2)
        assert _exit_code(pid) == 0
        f.seek(0)
        assert f.read() == data

"""fsspec writers' local spools: ciphertext only under an encrypted disk, and those of
writers killed with SIGKILL are collected by the next process that opens an fsspec disk,
never those of a live writer."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import cryptdisk
from cryptdisk import Key, Keyring
from cryptdisk.disks import EncryptedDisk, FsspecDisk
from tests.forked import child_of_a_dead_holder

from .conftest import BUCKET

SRC_ROOT = str(Path(cryptdisk.__file__).resolve().parents[1])
KEY_HEX = "3c" * 32
MARKER = b"plaintext-marker:"  # every block the writer writes starts with it

WRITER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from cryptdisk import Key, Keyring
from cryptdisk.disks import EncryptedDisk, FsspecDisk
spec = json.loads(sys.argv[2])
disk = FsspecDisk("remote", spec["url"], spec["options"])
if spec["encrypted"]:
    disk = EncryptedDisk("e", disk, Keyring([Key(1, bytes.fromhex(spec["key"]))]),
                         segment_size=4096)
block = (b"plaintext-marker:" * 4096)[:65536]
with disk.open_write("f") as f:
    for i in range(spec["blocks"]):
        f.write(block)
        print(f"block {i}", flush=True)
        sys.stdin.readline()  # the parent's go-ahead, or SIGKILL
print("published", flush=True)
"""


def spools(directory: Path) -> list[Path]:
    return sorted(directory.glob(".cryptdisk-*.cdtmp"))


def start_writer(spec: dict, spool_dir: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(spool_dir)}
    return subprocess.Popen([sys.executable, "-c", WRITER, SRC_ROOT, json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def advance(child: subprocess.Popen[str], until: str) -> None:
    """Let the writer run until it reports ``until`` (it then waits for a go-ahead)."""
    assert child.stdout is not None and child.stdin is not None
    for line in child.stdout:
        if line.strip() == until:
            return
        child.stdin.write("\n")
        child.stdin.flush()
    raise AssertionError(f"the writer ended before reporting {until!r}")


def kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    for stream in (child.stdout, child.stdin):
        if stream is not None:
            stream.close()


@pytest.fixture
def spool_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary directory of its own, for the writers and for this process."""
    directory = tmp_path / "spool"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


@pytest.mark.parametrize("store", ["memory", "s3"])
def test_killed_writers_spool_is_ciphertext_and_collected_live_one_kept(
        store: str, spool_dir: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if store == "s3":
        endpoint = request.getfixturevalue("s3_endpoint")
        url, options = f"s3://{BUCKET}/spool-{tmp_path.name}", {"endpoint_url": endpoint}
    else:
        url, options = "memory://spool", {}
    spec = {"url": url, "options": options, "encrypted": True, "key": KEY_HEX, "blocks": 40}

    killed = start_writer(spec, spool_dir)
    advance(killed, "block 30")  # ~2 MB spooled
    kill(killed)
    (dead,) = spools(spool_dir)
    data = dead.read_bytes()
    assert len(data) > 1_000_000
    assert MARKER not in data, "the spool of an encrypted disk holds plaintext"

    live = start_writer(spec, spool_dir)
    try:
        advance(live, "block 5")
        (live_spool,) = [p for p in spools(spool_dir) if p != dead]
        # The next process to open an fsspec disk (this one: its own TMPDIR) collects.
        FsspecDisk("other", "memory://elsewhere")
        assert spools(spool_dir) == [live_spool], "dead spool kept, or live spool removed"
        assert live.stdin is not None and live.stdout is not None
        live.stdin.write("\n" * 40)
        live.stdin.flush()
        assert live.stdout.read().splitlines()[-1] == "published"
        assert live.wait() == 0
    finally:
        if live.poll() is None:
            kill(live)
        for stream in (live.stdout, live.stdin):
            if stream is not None:
                stream.close()
    assert spools(spool_dir) == []
    assert not list(spool_dir.iterdir())
    if store == "s3":
        disk = EncryptedDisk("e", FsspecDisk("remote", url, options),
                             Keyring([Key(1, bytes.fromhex(KEY_HEX))]), segment_size=4096)
        assert disk.read_bytes("f") == (MARKER * 4096)[:65536] * 40


def test_a_dead_pids_spool_still_locked_is_kept(spool_dir: Path) -> None:
    from cryptdisk.disks._spool import collect_stale_spools

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    path = spool_dir / f".cryptdisk-{dead_pid}.0123456789ab.cdtmp"
    path.write_bytes(b"x")
    other = spool_dir / ".cryptdisk-notapid.cdtmp"  # not a spool's name: left alone
    other.write_bytes(b"y")
    with open(path, "rb") as held:  # a writer in another pid namespace holds its lock
        fcntl.flock(held, fcntl.LOCK_EX)
        assert collect_stale_spools(str(spool_dir)) == 0
        assert path.exists()
    assert collect_stale_spools(str(spool_dir)) == 1
    assert not path.exists() and other.exists()


_DIES_WRITING = """
import tempfile
tempfile.tempdir = sys.argv[1]
from cryptdisk.disks import FsspecDisk
f = FsspecDisk("remote", "memory://spool").open_write("f")
f.write(b"spooled")  # the spool is open and locked
fork_and_die()
"""


def test_a_forked_child_does_not_keep_the_spool_of_a_writer_that_died(
        spool_dir: Path) -> None:
    """A process forked while its parent was writing shared the spool's open file, which
    holds the flock: after the parent died the child (which writes nothing) kept it, and
    collection skipped the dead writer's spool for as long as the child lived. The child
    now closes its copy as it starts."""
    from cryptdisk.disks._spool import collect_stale_spools

    with child_of_a_dead_holder(_DIES_WRITING, str(spool_dir)):
        assert len(spools(spool_dir)) == 1
        assert collect_stale_spools(str(spool_dir)) == 1  # 0 before: the child's lock
        assert spools(spool_dir) == []


def test_a_forked_child_leaves_its_parents_spool_alone(spool_dir: Path) -> None:
    """A child forked while a file is written that drops its copy of the file (as the
    garbage collector does) neither removes nor writes the parent's spool: the parent
    still publishes what it wrote, whole."""
    from fsspec.implementations.memory import MemoryFileSystem

    disk = FsspecDisk("remote", "memory://spool-fork")
    f = disk.open_write("f")
    f.write(b"a" * 10)  # buffered in the parent: never flushed by the child
    pid = os.fork()
    if pid == 0:
        try:
            f.write(b"from the child")
            f.abort()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    (spool,) = spools(spool_dir)
    f.write(b"b" * 100_000)
    f.close()
    assert MemoryFileSystem().cat_file("/spool-fork/f") == b"a" * 10 + b"b" * 100_000
    assert not spool.exists()

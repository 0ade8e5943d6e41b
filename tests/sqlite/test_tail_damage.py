"""A damaged -cdtail side file never kills the process: a writer in a child process commits
into a legacy WAL (every commit saves the WAL's shared last record in the side file) while
the side file is cut, replaced or deleted under it, or is a directory, unwritable, or on a
full file system. The writer goes on, or gets an error naming the side file; the database
always opens whole, with each transaction either in or out. Both VFSes (conftest)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.sqlite as csql

from .helpers import legacy_wal_db

CHILD = Path(__file__).with_name("tail_damage_child.py")


def _start(db: Path, material: bytes, count: int, *extra: str,
           wrap: list[str] | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "CD_TEST_KEY": material.hex(),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    args = [sys.executable, str(CHILD), str(db), str(count), *extra]
    return subprocess.Popen([*(wrap or []), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _finish(child: subprocess.Popen[str]) -> tuple[set[int], dict[int, str]]:
    """Wait for the child; the numbers it committed and its errors by number (an error
    closing the connection as number 0)."""
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, (  # -7 would be SIGBUS
        f"the writer died (status {child.returncode}, signal "
        f"{signal.Signals(-child.returncode).name if child.returncode < 0 else None}): {err}")
    lines = out.splitlines()
    assert lines[-1] == "done", out
    ok = {int(line.split()[1]) for line in lines if line.startswith("ok ")}
    errors = {int(line.split()[1]): line.split(" ", 2)[2]
              for line in lines if line.startswith("err ")}
    errors.update({0: line.split(" ", 1)[1] for line in lines if line.startswith("close-err ")})
    return ok, errors


def _check(db: Path, keyring: cryptdisk.Keyring, ok: set[int], errors: dict[int, str]) -> None:
    """The database opens whole; each commit that returned is in it, each that raised
    is in or out (never in part: integrity_check), nothing else is."""
    conn = csql.connect(str(db), keyring=keyring)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        ids = {i for (i,) in conn.execute("SELECT id FROM t")}
    finally:
        conn.close()
    assert {1, *ok} <= ids <= {1, *ok, *errors}


def _keyed() -> tuple[bytes, cryptdisk.Keyring]:
    material = os.urandom(32)
    return material, cryptdisk.Keyring([cryptdisk.Key(1, material)])


def test_side_file_cut_replaced_or_deleted_while_in_use(tmp_path, monkeypatch):
    """Cut to nothing or to a few bytes, replaced by another file or a directory, or
    deleted, at random moments during and between commits: every commit still succeeds
    (a mapped side file would get SIGBUS at the next copy after a cut)."""
    material, keyring = _keyed()
    db = legacy_wal_db(tmp_path, keyring, monkeypatch)
    tail = Path(str(db) + "-wal" + csql._tail.SUFFIX)
    child = _start(db, material, 300)
    assert child.stdout is not None
    first = child.stdout.readline()  # the first commit opened the side file: damage it now
    assert first == "ok 100\n", first
    rnd = random.Random(7)
    damage = 0
    while child.poll() is None:
        time.sleep(rnd.random() * 0.004)
        action = rnd.randrange(5)
        try:
            if tail.is_dir():
                tail.rmdir()
            elif action == 0:
                os.truncate(tail, 0)
            elif action == 1:
                os.truncate(tail, 5)
            elif action == 2:
                other = tmp_path / "other"
                other.write_bytes(os.urandom(100))
                os.replace(other, tail)
            elif action == 3:
                tail.unlink()
            else:
                tail.unlink()
                tail.mkdir()
        except FileNotFoundError:
            continue  # not created yet, or gone: nothing to damage this time
        damage += 1
    ok, errors = _finish(child)
    assert damage >= 20  # the side file was damaged many times while the writer ran
    assert errors == {}
    assert ok == set(range(101, 400))
    ok.add(100)
    _check(db, keyring, ok, errors)


def _assert_named_errors(errors: dict[int, str], tail: Path, kind: str, count: int) -> None:
    """Each commit raised, naming the side file (and so may closing, which tries to write
    the last failed commit's gathered bytes once more)."""
    assert sorted(errors.keys() - {0}) == list(range(100, 100 + count))
    for message in errors.values():  # "IsADirectoryError [Errno 21] Is a directory: '...-cdtail'"
        assert message.startswith(kind), message
        assert str(tail) in message, message


def test_side_file_a_directory_is_an_error_naming_it(tmp_path, monkeypatch):
    material, keyring = _keyed()
    db = legacy_wal_db(tmp_path, keyring, monkeypatch)
    tail = Path(str(db) + "-wal" + csql._tail.SUFFIX)
    tail.mkdir()
    ok, errors = _finish(_start(db, material, 3))
    assert ok == set()
    _assert_named_errors(errors, tail, "IsADirectoryError", 3)
    _check(db, keyring, ok, errors)  # the side file is read only after a failed record
    tail.rmdir()
    ok, errors = _finish(_start(db, material, 3))
    assert errors == {}
    _check(db, keyring, ok, errors)


def test_unwritable_side_file_is_an_error_naming_it(tmp_path, monkeypatch):
    """chmod 000; as root, the writer runs without the capabilities that ignore modes."""
    wrap = None
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root ignores file modes, and setpriv (to drop that) is missing")
        wrap = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"]
    material, keyring = _keyed()
    db = legacy_wal_db(tmp_path, keyring, monkeypatch)
    tail = Path(str(db) + "-wal" + csql._tail.SUFFIX)
    tail.write_bytes(b"")
    tail.chmod(0)
    ok, errors = _finish(_start(db, material, 3, wrap=wrap))
    assert ok == set()
    _assert_named_errors(errors, tail, "PermissionError", 3)
    _check(db, keyring, ok, errors)


def _can_mount_tmpfs(where: Path) -> bool:
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    mount = f"mount -t tmpfs -o size=64k tmpfs {where}"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True)
    return probe.returncode == 0


def test_full_file_system(tmp_path, monkeypatch):
    """The database on a small tmpfs (its own mount namespace) that the writer fills: the
    side file cannot grow (a mapped, sparse one would get SIGBUS), so commits fail with
    the disk-full error naming it until space comes back, then succeed again."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _can_mount_tmpfs(mnt):
        pytest.skip("cannot mount a tmpfs in a mount namespace here (needs CAP_SYS_ADMIN)")
    material, keyring = _keyed()
    db = legacy_wal_db(tmp_path, keyring, monkeypatch)
    inside = mnt / db.name
    tail = Path(str(inside) + "-wal" + csql._tail.SUFFIX)
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && cp {db} {db}-wal {mnt}/ && "
              f'"$@"; rc=$?; rm -f {tail} {mnt}/filler {db}-wal; '
              f"cp {mnt}/t.db* {tmp_path}/ && exit $rc")  # the WAL is gone if checkpointed
    child = _start(inside, material, 20, str(mnt / "filler"),
                   wrap=["unshare", "-m", "sh", "-c", script, "sh"])
    ok, errors = _finish(child)
    assert errors, "the file system never filled"
    assert min(errors) == 100 and ok >= set(range(110, 120))  # full, then space again
    for message in errors.values():
        assert message.startswith("OSError [Errno 28]") and str(tail) in message, message
    _check(db, keyring, ok, errors)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_side_file_without_space_is_the_disk_full_error(tmp_path, monkeypatch):
    """The side file a link to /dev/full (every write fails with ENOSPC): the disk-full
    error without mounting anything."""
    material, keyring = _keyed()
    db = legacy_wal_db(tmp_path, keyring, monkeypatch)
    tail = Path(str(db) + "-wal" + csql._tail.SUFFIX)
    tail.symlink_to("/dev/full")
    ok, errors = _finish(_start(db, material, 3))
    _assert_named_errors(errors, tail, "OSError [Errno 28]", 3)
    _check(db, keyring, ok, errors)

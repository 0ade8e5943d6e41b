"""kill -9 of ``cryptdisk sqlite encrypt|decrypt`` mid-copy: DST is absent or whole.

A conversion writes a new database DST from SRC. A real child process doing it is killed
with SIGKILL after each step of the copy (SQLite's backup API, a few pages a step; a
SQLCipher source table by table), and at the end of the copy: after each kill DST either
does not exist (nor its journal or WAL) or holds every row, and the same conversion run
again finishes, leaving nothing of the killed one beside DST. An encrypted DST's directory
never holds the plaintext outside SRC.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import apsw
import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.sqlite import _convert

CHILD = os.path.join(os.path.dirname(__file__), "convert_child.py")
ROWS = 400
SECRET = b"confidential-row-"


def env():
    src = os.path.join(os.path.dirname(__file__), "..", "..", "src")
    return dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))


def expected_rows():
    return [(i, f"{SECRET.decode()}{i:06d}" + "x" * 200) for i in range(ROWS)]


def make_source(mode, path, keyring, passphrase):
    if mode == "sqlcipher":
        sqlcipher3 = pytest.importorskip("sqlcipher3", reason="sqlcipher3 is a bench extra")
        conn = sqlcipher3.connect(str(path))
        conn.execute(f"PRAGMA key = '{passphrase}'")
        for n in range(4):  # one table a step
            conn.execute(f"CREATE TABLE t{n}(id INTEGER PRIMARY KEY, v TEXT)")
        conn.executemany("INSERT INTO t0 VALUES(?, ?)", expected_rows())
        conn.commit()
        conn.close()
        return
    conn = (csql.connect(str(path), keyring=keyring) if mode == "decrypt"
            else apsw.Connection(str(path)))
    conn.execute("PRAGMA page_size=4096")
    if mode == "encrypt-wal":
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t0(id INTEGER PRIMARY KEY, v TEXT)")
    with conn:
        conn.executemany("INSERT INTO t0 VALUES(?, ?)", expected_rows())
    if mode == "encrypt-wal":
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def open_dst(mode, dst, keyring):
    if mode == "decrypt":
        return apsw.Connection(str(dst), flags=apsw.SQLITE_OPEN_READONLY)
    return csql.connect(str(dst), keyring=keyring, flags=apsw.SQLITE_OPEN_READONLY)


def convert(mode, src, dst, keyring, passphrase):
    if mode == "sqlcipher":
        _convert.encrypt_sqlcipher_database(str(src), str(dst), keyring, passphrase)
    elif mode == "decrypt":
        _convert.decrypt_database(str(src), str(dst), keyring)
    else:
        _convert.encrypt_database(str(src), str(dst), keyring)


def check_whole_or_absent(mode, dst, keyring):
    """True if DST is whole, False if absent; fails on anything else."""
    if not dst.exists():
        for suffix in ("-journal", "-wal"):
            assert not os.path.exists(str(dst) + suffix), suffix
        return False
    conn = open_dst(mode, dst, keyring)
    try:
        assert conn.execute("SELECT * FROM t0 ORDER BY id").fetchall() == expected_rows()
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()
    return True


@pytest.mark.parametrize("mode", ["encrypt", "encrypt-wal", "sqlcipher", "decrypt"])
def test_kill_9_mid_conversion_leaves_no_destination_or_a_whole_one(tmp_path, mode):
    key = os.urandom(32)
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, key)])
    passphrase = "correct horse"
    src = tmp_path / "src.db"
    make_source(mode, src, keyring, passphrase)
    child_mode = "encrypt" if mode == "encrypt-wal" else mode
    kill_after = 1
    while True:
        dst = tmp_path / f"out{kill_after}" / "dst.db"
        dst.parent.mkdir()
        child = subprocess.Popen([sys.executable, CHILD, child_mode, str(src), str(dst),
                                  key.hex(), passphrase], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env())
        last = ""
        for _ in range(kill_after):
            last = child.stdout.readline()
            assert last.startswith("step "), last
            done, total = map(int, last.split()[1:])
            if done == total:
                break
            child.stdin.write("go\n")
            child.stdin.flush()
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
        child.stdin.close()
        check_whole_or_absent(mode, dst, keyring)
        if mode != "decrypt":  # the plaintext is in SRC only
            for name in os.listdir(dst.parent):
                assert SECRET not in (dst.parent / name).read_bytes(), name
        # run again: it finishes and leaves DST alone beside nothing of the killed run
        for name in ("dst.db", "dst.db-wal", "dst.db-shm"):  # (as the check left them)
            if (dst.parent / name).exists():
                os.unlink(dst.parent / name)
        convert(mode, src, dst, keyring, passphrase)
        assert sorted(os.listdir(dst.parent)) == ["dst.db"]
        assert check_whole_or_absent(mode, dst, keyring)
        if done == total:
            break
        kill_after += 1
    assert kill_after > 3  # the copy took several steps: kills landed mid-way


@pytest.mark.parametrize("errno_", ["EPERM", "EOPNOTSUPP"])
def test_conversion_onto_a_filesystem_without_hard_links(tmp_path, monkeypatch, errno_):
    """FAT, exFAT and some network or FUSE filesystems have no hard links (link(2) fails
    with EPERM or EOPNOTSUPP, as here): the copy is then renamed into place (after the
    same check that nothing took DST's name), not refused after the whole copy (the
    conversion failed there with '[Errno 1] Operation not permitted', where it worked
    before it made its copy under a temporary name)."""
    import errno

    key = os.urandom(32)
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, key)])
    src = tmp_path / "src.db"
    make_source("encrypt", src, keyring, "")

    def no_link(*_args, **_kwargs):
        code = getattr(errno, errno_)
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(_convert.os, "link", no_link)
    dst = tmp_path / "out" / "dst.db"
    dst.parent.mkdir()
    _convert.encrypt_database(str(src), str(dst), keyring)
    assert sorted(os.listdir(dst.parent)) == ["dst.db"]
    assert check_whole_or_absent("encrypt", dst, keyring)
    back = tmp_path / "back.db"
    _convert.decrypt_database(str(dst), str(back), keyring)
    assert os.stat(back).st_mode & 0o777 == 0o600
    with pytest.raises(cryptdisk.errors.DatabaseError, match="already exists"):
        _convert.encrypt_database(str(src), str(dst), keyring)

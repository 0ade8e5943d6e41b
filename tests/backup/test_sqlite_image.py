"""SQLite backups and restores stream the database image (bounded memory) through a
snapshot file that holds only ciphertext under a key no file keeps (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cryptdisk.sqlite
from cryptdisk.backup import Repository, create, restore, verify
from cryptdisk.keys import Key, Keyring, key_from_file, write_key_file
from tests.forked import child_of_a_dead_holder

from .helpers import FAST_KDF
from .test_crash import _kill

ROOT = Path(__file__).resolve().parents[2]
MARKER = b"plaintext-marker-7d1f"

_MEASURE = """\
import json, resource, sys
from cryptdisk.backup import Repository, create, restore
from cryptdisk.keys import Key, Keyring, key_from_file
repo_url, src, target, keyfile = sys.argv[1:]
kr = Keyring.single(Key(1, key_from_file(keyfile)))
repo = Repository.open(repo_url, passphrase="pw")
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
base = peak()
bid = create(repo, src, keyring=kr).id
after_backup = peak()
restore(repo, bid, target, keyring=kr)
print(json.dumps({"base": base, "backup": after_backup, "restore": peak()}))
"""


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))


def _database(tmp_path: Path, mib: int) -> tuple[Path, Keyring]:
    keyfile = tmp_path / "k"
    write_key_file(keyfile, os.urandom(32))
    kr = Keyring.single(Key(1, key_from_file(keyfile)))
    src = tmp_path / "app.db"
    c = cryptdisk.sqlite.connect(src, keyring=kr)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE w (i INTEGER PRIMARY KEY, b BLOB)")
    c.execute("INSERT INTO w(b) VALUES (?)", (MARKER * 10,))
    for _ in range(mib // 8):
        with c:
            c.execute("WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n "
                      "WHERE x < 8192) INSERT INTO w(b) SELECT randomblob(1000) FROM n")
    c.close()
    return src, kr


def test_a_sqlite_backup_and_restore_hold_a_bounded_part_of_the_database_in_memory(
        tmp_path: Path) -> None:
    src, kr = _database(tmp_path, 256)
    size = src.stat().st_size
    assert size > 256 * 2**20
    Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    done = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path / "repo"), str(src),
                           str(tmp_path / "r.db"), str(tmp_path / "k")],
                          capture_output=True, text=True, env=_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rss = json.loads(done.stdout)
    # the whole image in memory (one copy or more) would add at least its size
    assert rss["backup"] - rss["base"] < size / 2, rss
    assert rss["restore"] - rss["base"] < size / 2, rss
    r = cryptdisk.sqlite.connect(tmp_path / "r.db", keyring=kr)
    try:
        assert r.execute("SELECT count(*), max(i) FROM w").fetchall() == [
            (1 + 8192 * 32, 1 + 8192 * 32)]
        assert r.execute("SELECT b FROM w WHERE i = 1").fetchall() == [(MARKER * 10,)]
        assert r.execute("PRAGMA journal_mode").fetchall() == [("wal",)]
    finally:
        r.close()
    assert [p.name for p in tmp_path.iterdir() if ".backup-" in p.name] == []


_BACKUP = """\
import sys
from cryptdisk.backup import Repository, create
from cryptdisk.keys import Key, Keyring, key_from_file
repo_url, src, keyfile = sys.argv[1:]
kr = Keyring.single(Key(1, key_from_file(keyfile)))
def report(n, _stored):
    print(f"chunk {n}", flush=True)
    sys.stdin.readline()
create(Repository.open(repo_url, passphrase="pw"), src, keyring=kr, progress=report)
"""


def test_a_killed_sqlite_backup_leaves_only_ciphertext_which_the_next_one_deletes(
        tmp_path: Path) -> None:
    src, kr = _database(tmp_path, 16)
    url = str(tmp_path / "repo")
    repo = Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    proc = subprocess.Popen([sys.executable, "-c", _BACKUP, url, str(src), str(tmp_path / "k")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=_env(), cwd=tmp_path)
    assert proc.stdout is not None
    assert proc.stdout.readline().split()[0] == "chunk"  # the snapshot is being read
    (snap,) = [p for p in tmp_path.iterdir() if p.name.startswith("app.db.backup-")]
    _kill(proc)
    assert snap.exists() and snap.stat().st_mode & 0o777 == 0o600
    assert MARKER not in snap.read_bytes()  # encrypted, under a key that died with it
    assert repo.manifest_ids() == []
    bid = create(repo, src, keyring=kr).id
    assert not snap.exists()  # the next backup of app.db deleted it
    assert [p.name for p in tmp_path.iterdir() if ".backup-" in p.name] == []
    assert verify(repo).ok
    restore(repo, bid, tmp_path / "r.db", keyring=kr)
    r = cryptdisk.sqlite.connect(tmp_path / "r.db", keyring=kr)
    try:
        assert r.execute("SELECT count(*) FROM w").fetchall() == [(1 + 8192 * 2,)]
    finally:
        r.close()


_DIES_DURING_A_SNAPSHOT = """
from cryptdisk.backup._sqliteimage import snapshot
from cryptdisk.keys import Key, Keyring, key_from_file
src, keyfile = sys.argv[1:]
kr = Keyring.single(Key(1, key_from_file(keyfile)))
with snapshot(src, kr):
    fork_and_die()
"""


def test_a_forked_child_does_not_keep_a_dead_backups_snapshot_locked(tmp_path: Path) -> None:
    """A backup holds an flock on its snapshot file while it lives, so the next backup
    deletes only a dead one's. A process forked during the backup shared that open file:
    after the backup died the child kept the flock, and its snapshot (a copy of the whole
    database) stayed beside the database until the child exited. The child now closes its
    copy as it starts, and the next backup deletes the snapshot."""
    import fcntl

    from cryptdisk.backup._sqliteimage import _delete_unlocked

    src, _kr = _database(tmp_path, 0)
    with child_of_a_dead_holder(_DIES_DURING_A_SNAPSHOT, str(src), str(tmp_path / "k"),
                                env=_env()):
        [snap] = tmp_path.glob("app.db.backup-*")
        fd = os.open(snap, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError before
        finally:
            os.close(fd)
        _delete_unlocked([str(snap)])
        assert not snap.exists()

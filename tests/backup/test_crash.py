"""Real processes: kill -9 of a backup mid-way, and backups while a writer commits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.sqlite
from cryptdisk.backup import Repository, create, prune, restore, verify
from cryptdisk.errors import BackupError
from cryptdisk.keys import Key, Keyring, key_from_file, write_key_file

from .helpers import FAST_KDF, content, make_db

ROOT = Path(__file__).resolve().parents[2]
CHILD = [sys.executable, "-m", "tests.backup.child"]


def _spawn(*argv: str, stdin: int | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    return subprocess.Popen([*CHILD, *argv], stdout=subprocess.PIPE, stdin=stdin, text=True,
                            env=env, cwd=ROOT)


def _wait_for(proc: subprocess.Popen[str], word: str, n: int) -> None:
    """Read the child's progress until it reports ``word`` number ``n`` or more (a child
    that waits for a go-ahead after each report gets one, until then)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        parts = line.split()
        if parts and parts[0] == word and int(parts[1]) >= n:
            return
        if proc.stdin is not None:
            proc.stdin.write("\n")
            proc.stdin.flush()
    raise AssertionError(f"the child ended before reporting {word} {n} ({proc.wait()})")


def test_kill_9_mid_backup_leaves_a_valid_repository_and_a_rerun_resumes(
        tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=300_000)
    url = str(tmp_path / "repo")
    Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    for kill_at in (3, 12):
        proc = _spawn("backup", url, "pw", str(src))
        _wait_for(proc, "chunk", kill_at)
        _kill(proc)
        repo = Repository.open(url, passphrase="pw")
        assert repo.manifest_ids() == []
        stored = repo.chunk_names()
        assert len(stored) >= kill_at
        for name in stored:  # every published chunk is whole and authentic
            assert isinstance(repo.check_chunk(name), bytes)
        assert verify(repo).ok
    total = len(stored)
    s = create(repo, src)
    assert s.new_chunks < s.chunks and s.chunks - s.new_chunks >= total - 1
    assert verify(repo).ok
    restore(repo, s.id, tmp_path / "r.db")
    assert content(tmp_path / "r.db") == content(src)


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()
    if proc.stdin is not None:
        proc.stdin.close()


def _committed_state(rows: list[tuple[int, int]]) -> int:
    """The number of whole batches ``rows`` hold; fails unless they are exactly 0..k-1."""
    batches: dict[int, set[int]] = {}
    for b, i in rows:
        batches.setdefault(b, set()).add(i)
    k = len(batches)
    assert sorted(batches) == list(range(k))
    assert all(v == set(range(1000)) for v in batches.values())
    assert len(rows) == 1000 * k
    return k


def test_db_backup_during_inserts_restores_one_committed_state(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE w (b BIGINT, i BIGINT)")
    db.close()
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    writer = _spawn("writer", "db", str(src))
    try:
        _wait_for(writer, "committed", 5)
        ids = [create(repo, src).id for _ in range(3)]
        _wait_for(writer, "committed", 1)  # still writing
    finally:
        _kill(writer)
    seen = []
    for n, bid in enumerate(ids):
        restore(repo, bid, tmp_path / f"r{n}.db")  # runs Database.check()
        r = cryptdisk.connect(tmp_path / f"r{n}.db", read_only=True)
        seen.append(_committed_state(r.query("SELECT b, i FROM w")))
        r.close()
    assert seen == sorted(seen) and seen[0] >= 5


def test_sqlite_backup_during_inserts_restores_one_committed_state(tmp_path: Path) -> None:
    keyfile = tmp_path / "k"
    write_key_file(keyfile, os.urandom(32))
    kr = Keyring.single(Key(1, key_from_file(keyfile)))
    src = tmp_path / "app.db"
    c = cryptdisk.sqlite.connect(src, keyring=kr)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE w (b INTEGER, i INTEGER)")
    c.close()
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    writer = _spawn("writer", "sqlite", str(src), str(keyfile))
    try:
        _wait_for(writer, "committed", 5)
        ids = [create(repo, src, keyring=kr).id for _ in range(3)]
    finally:
        _kill(writer)
    seen = []
    for n, bid in enumerate(ids):
        restore(repo, bid, tmp_path / f"r{n}.db", keyring=kr)
        r = cryptdisk.sqlite.connect(tmp_path / f"r{n}.db", keyring=kr)
        seen.append(_committed_state(r.execute("SELECT b, i FROM w").fetchall()))
        r.close()
    assert seen == sorted(seen) and seen[0] >= 5


def test_kill_9_mid_prune_loses_no_chunk_of_a_kept_backup(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    make_db(src, rows=10)
    url = str(tmp_path / "repo")
    repo = Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    ids = []
    for i in range(3):
        db = cryptdisk.connect(src)
        db.sql(f"CREATE TABLE g{i} (x VARCHAR)")  # each backup has chunks of its own
        db.sql(f"INSERT INTO g{i} SELECT md5((range + {i} * 1000000)::VARCHAR) "
                   "FROM range(100000)")
        if i:
            db.sql(f"DROP TABLE g{i - 1}")
        db.close()
        ids.append(create(repo, src).id)
    proc = _spawn("prune", url, "pw", "1", stdin=subprocess.PIPE)
    _wait_for(proc, "deleted", 2)
    _kill(proc)
    assert repo.manifest_ids() == ids[-1:]  # manifests go first
    assert verify(repo).ok  # every chunk of the kept backup is there and authentic
    left = len(repo.chunk_names())
    _dropped, deleted = prune(repo, keep_last=1)
    assert deleted > 0 and len(repo.chunk_names()) == left - deleted
    restore(repo, ids[-1], tmp_path / "r.db")
    assert content(tmp_path / "r.db") == content(src)


def test_kill_9_mid_restore_leaves_the_repository_as_it_was(tmp_path: Path) -> None:
    src = tmp_path / "a.db"
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE t (x BIGINT, s VARCHAR)")
    for i in range(6):  # six parts
        db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR) FROM range({i * 50000}, "
               f"{(i + 1) * 50000})")
    db.close()
    url = str(tmp_path / "repo")
    repo = Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    bid = create(repo, src).id

    def listing() -> dict[str, int]:
        return {str(p): p.stat().st_size for p in (tmp_path / "repo").rglob("*") if p.is_file()}

    before = listing()
    proc = _spawn("restore", url, "pw", bid, str(tmp_path / "r.db"), stdin=subprocess.PIPE)
    _wait_for(proc, "part", 3)
    _kill(proc)
    assert not (tmp_path / "r.db").exists()  # never a partial target
    (partial,) = [p for p in tmp_path.glob("r.db.restoring-*") if p.is_dir()]  # beside it
    assert (tmp_path / f"{partial.name}.key").exists()
    assert listing() == before  # a restore only reads the repository
    assert verify(repo).ok
    # The next restore to r.db deletes the killed one's work, holding r.db's restore lock.
    proc = _spawn("restore", url, "pw", bid, str(tmp_path / "r.db"), stdin=subprocess.PIPE)
    try:
        _wait_for(proc, "part", 1)
        assert not partial.exists() and not (tmp_path / f"{partial.name}.key").exists()
        (live,) = [p for p in tmp_path.glob("r.db.restoring-*") if p.is_dir()]
        with pytest.raises(BackupError, match=r"another restore to .* is running"):
            restore(repo, bid, tmp_path / "r.db")  # never touches the live restore's work
        assert live.is_dir() and (tmp_path / f"{live.name}.key").exists()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n" * 10)
        proc.stdin.flush()
        assert proc.stdout.read().split()[-1] == "done"
        assert proc.wait() == 0
    finally:
        if proc.poll() is None:
            _kill(proc)
        else:
            assert proc.stdout is not None and proc.stdin is not None
            proc.stdout.close()
            proc.stdin.close()
    assert content(tmp_path / "r.db") == content(src)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.db", "a.db.key", "r.db", "r.db.key", "repo"]


def test_the_restore_after_a_killed_one_under_a_config_deletes_its_parts(
        tmp_path: Path) -> None:
    """Under a config the parts lie on its disks, outside TARGET.restoring-<id>: the next
    restore to TARGET deletes those of the killed one too."""
    from tests.db.dbhelpers import write_config

    src = tmp_path / "a.db"
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE t (x BIGINT, s VARCHAR)")
    for i in range(6):  # six parts
        db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR) FROM range({i * 20000}, "
               f"{(i + 1) * 20000})")
    db.close()
    url = str(tmp_path / "repo")
    repo = Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    bid = create(repo, src).id
    new = tmp_path / "new"
    new.mkdir()
    cfg = str(write_config(new, [4], 4))
    store = new / "store"

    def parts() -> list[Path]:
        return sorted(p for p in store.rglob("*.parquet"))

    proc = _spawn("restore", url, "pw", bid, str(tmp_path / "r.db"), "", cfg,
                  stdin=subprocess.PIPE)
    _wait_for(proc, "part", 3)
    _kill(proc)
    assert len(parts()) >= 2  # the killed restore's parts, on the config's disk
    restore(repo, bid, tmp_path / "r.db", config=cfg)
    r = cryptdisk.connect(tmp_path / "r.db", cfg, read_only=True)
    try:
        assert sorted(store / "secure" / p.path for p in r.table("t").parts) == parts()
        assert r.query("SELECT count(*), sum(x) FROM t") == [(120000, 119999 * 60000)]
    finally:
        r.close()


def test_kill_9_before_a_sqlite_restore_is_renamed_leaves_no_target(tmp_path: Path) -> None:
    keyfile = tmp_path / "k"
    write_key_file(keyfile, os.urandom(32))
    kr = Keyring.single(Key(1, key_from_file(keyfile)))
    src = tmp_path / "app.db"
    c = cryptdisk.sqlite.connect(src, keyring=kr)
    c.execute("CREATE TABLE w (b INTEGER, i INTEGER)")
    c.executemany("INSERT INTO w VALUES (?, ?)", [(1, i) for i in range(1000)])
    c.close()
    url = str(tmp_path / "repo")
    repo = Repository.init(url, passphrase="pw", kdf_params=FAST_KDF)
    bid = create(repo, src, keyring=kr).id
    target = tmp_path / "r.db"
    proc = _spawn("restore", url, "pw", bid, str(target), str(keyfile), stdin=subprocess.PIPE)
    _wait_for(proc, "part", 1)  # written and checked, not yet renamed
    _kill(proc)
    assert not target.exists()
    assert len(list(tmp_path.glob("r.db.restoring-*"))) == 1
    restore(repo, bid, target, keyring=kr)
    assert not list(tmp_path.glob("r.db.restoring*"))  # the killed one's file, and the lock
    r = cryptdisk.sqlite.connect(target, keyring=kr)
    assert r.execute("SELECT count(*) FROM w").fetchall() == [(1000,)]
    r.close()


def test_a_sqlite_database_left_with_a_hot_journal_is_refused_clearly(tmp_path: Path) -> None:
    """A writer killed mid-transaction in rollback-journal mode leaves a hot journal that
    SQLite must roll back before the database is read; a read-only backup says so."""
    keyfile = tmp_path / "k"
    write_key_file(keyfile, os.urandom(32))
    src = tmp_path / "app.db"
    script = (
        "import os, signal, sys, cryptdisk.sqlite\n"
        "from cryptdisk.keys import Key, Keyring, key_from_file\n"
        "c = cryptdisk.sqlite.connect(sys.argv[1], keyring=Keyring.single(Key(1, "
        "key_from_file(sys.argv[2]))))\n"
        "c.execute('CREATE TABLE w (b BLOB); INSERT INTO w VALUES (1)')\n"
        "c.execute('PRAGMA cache_size=10; BEGIN')\n"  # a small cache spills to the file
        "c.execute('WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n "
        "WHERE x < 2000) INSERT INTO w SELECT randomblob(500) FROM n')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-c", script, str(src), str(keyfile)], env=env)
    assert done.returncode == -signal.SIGKILL
    assert (tmp_path / "app.db-journal").stat().st_size > 0
    kr = Keyring.single(Key(1, key_from_file(keyfile)))
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    with pytest.raises(BackupError, match=r"hot journal .* no backup was taken"):
        create(repo, src, keyring=kr)
    assert repo.manifest_ids() == []
    c = cryptdisk.sqlite.connect(src, keyring=kr)  # rolls the killed transaction back
    assert c.execute("SELECT count(*) FROM w").fetchall() == [(1,)]
    c.close()
    bid = create(repo, src, keyring=kr).id
    restore(repo, bid, tmp_path / "r.db", keyring=kr)
    r = cryptdisk.sqlite.connect(tmp_path / "r.db", keyring=kr)
    assert r.execute("SELECT count(*) FROM w").fetchall() == [(1,)]
    r.close()


def test_a_backup_during_a_key_rotation_in_another_process_loads_the_new_key(
        tmp_path: Path) -> None:
    """`cryptdisk rotate` (a real process) rewraps every part under a new key while the
    backup, opened under the old one, is reading the first part: it loads the key files
    again and starts over, instead of failing on the next part."""
    src = tmp_path / "a.db"
    db = cryptdisk.connect(src)
    db.sql("CREATE TABLE t (x BIGINT, s VARCHAR)")
    for i in range(4):  # four parts, of several chunks each
        db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR) FROM range({i * 50000}, "
               f"{(i + 1) * 50000})")
    db.close()
    before = content(src)
    write_key_file(tmp_path / "new.key", Key.generate(2))
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    rotated: list[str] = []

    def rotate_once(_n: int, _stored: int) -> None:
        if not rotated:
            done = subprocess.run([sys.executable, "-m", "cryptdisk", "rotate", str(src),
                                   "--new-key", str(tmp_path / "new.key")],
                                  capture_output=True, text=True, env=env)
            assert done.returncode == 0, done.stderr
            rotated.append(done.stdout)

    s = create(repo, src, progress=rotate_once)
    assert rotated and "under key 2" in rotated[0]
    assert (tmp_path / "a.db.key.1").exists()  # the rotation happened under the backup
    restore(repo, s.id, tmp_path / "r.db")
    assert content(tmp_path / "r.db") == before

"""Restoring over an existing database: refused without --force; with it, the restored
database takes TARGET's place atomically (real processes killed with SIGKILL)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.sqlite
from cryptdisk.backup import Repository, create, restore
from cryptdisk.errors import BackupError
from cryptdisk.keys import Key, Keyring, key_from_file, write_key_file
from tests.forked import child_of_a_dead_holder

from .helpers import FAST_KDF, content, make_db
from .test_crash import _kill, _spawn, _wait_for

ROOT = Path(__file__).resolve().parents[2]


def _two_backups(tmp_path: Path) -> tuple[Repository, str, str]:
    """A repository holding an old backup (50 rows) and a new one (3000 rows) of a.db."""
    src = tmp_path / "a.db"
    make_db(src, rows=50)
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    old = create(repo, src).id
    db = cryptdisk.connect(src)
    for i in range(3):  # three more parts
        db.sql(f"INSERT INTO t SELECT range, md5(range::VARCHAR), 0 FROM range({i * 1000}, "
               f"{(i + 1) * 1000})")
    db.close()
    return repo, old, create(repo, src).id


def _leftovers(tmp_path: Path, name: str) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(name + ".restoring"))


def test_restoring_over_a_database_is_refused_naming_force_which_replaces_it(
        tmp_path: Path) -> None:
    repo, old, new = _two_backups(tmp_path)
    restore(repo, old, tmp_path / "r.db")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PW="pw")
    cmd = [sys.executable, "-m", "cryptdisk", "backup", "restore", str(tmp_path / "repo"), new,
           str(tmp_path / "r.db"), "--passphrase-env", "PW"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "r.db exists" in p.stderr and "--force" in p.stderr
    assert content(tmp_path / "r.db")["t"][1][1] == 50
    p = subprocess.run([*cmd, "--force"], capture_output=True, text=True, env=env,
                       cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "replacing the database there" in p.stdout
    assert content(tmp_path / "r.db") == content(tmp_path / "a.db")


def test_force_replaces_a_database_keeps_its_key_and_deletes_the_old_files(
        tmp_path: Path) -> None:
    repo, old, new = _two_backups(tmp_path)
    target = tmp_path / "r.db"
    restore(repo, old, target)
    key = (tmp_path / "r.db.key").read_bytes()
    old_files = {p.name for p in target.rglob("*.parquet")}
    out = restore(repo, new, target, replace=True)
    assert out["replaced"] and "key" not in out  # no new key to tell the user about
    assert (tmp_path / "r.db.key").read_bytes() == key
    assert content(target) == content(tmp_path / "a.db")
    assert not old_files & {p.name for p in target.rglob("*.parquet")}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.db", "a.db.key", "r.db", "r.db.key", "repo"]  # the old database is gone
    # restoring a backup over its own source (rolling it back), in place
    restore(repo, old, tmp_path / "a.db", replace=True)
    assert content(tmp_path / "a.db")["t"][1][1] == 50


def test_force_under_a_config_deletes_the_old_databases_parts_on_its_disks(
        tmp_path: Path) -> None:
    from cryptdisk.config import load_config
    from tests.db.dbhelpers import write_config

    repo, old, new = _two_backups(tmp_path)
    conf = tmp_path / "conf"
    conf.mkdir()
    cfg = load_config(write_config(conf, [4], 4))
    target = tmp_path / "r.db"
    restore(repo, old, target, config=cfg)
    before = {p.name for p in (conf / "store").rglob("*.parquet")}
    assert before
    with pytest.raises(BackupError, match=r"has no .*r.db.key: it is opened under a config"):
        restore(repo, new, target, replace=True)  # its keys are the config's
    restore(repo, new, target, config=cfg, replace=True)
    r = cryptdisk.connect(target, cfg, read_only=True)
    try:
        assert r.query("SELECT count(*) FROM t") == [(3050,)]
        on_disk = {p.name for p in (conf / "store").rglob("*.parquet")}
        assert on_disk == {os.path.basename(p.path) for t in r.catalog.tables.values()
                           for p in t.parts}  # the old database's parts are gone
        assert not before & on_disk
    finally:
        r.close()
    assert not _leftovers(tmp_path, "r.db")


def test_force_refuses_what_is_not_a_database_of_the_backups_kind_or_is_in_use(
        tmp_path: Path) -> None:
    repo, _old, new = _two_backups(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(BackupError, match="not a cryptdisk database"):
        restore(repo, new, other, replace=True)
    assert (other / "notes.txt").read_text() == "mine"
    (tmp_path / "link.db").symlink_to(tmp_path / "a.db")
    with pytest.raises(BackupError, match="symbolic link"):
        restore(repo, new, tmp_path / "link.db", replace=True)
    (tmp_path / "f.db").write_bytes(b"x")
    with pytest.raises(BackupError, match=r"is a file; backup .* is of a database"):
        restore(repo, new, tmp_path / "f.db", replace=True)
    restore(repo, new, tmp_path / "r.db")
    writer = cryptdisk.connect(tmp_path / "r.db")
    try:
        with pytest.raises(BackupError, match="open for writing"):
            restore(repo, new, tmp_path / "r.db", replace=True)
        assert writer.query("SELECT count(*) FROM t") == [(3050,)]
    finally:
        writer.close()
    for name in ("other", "link.db", "f.db", "r.db"):
        assert not _leftovers(tmp_path, name)


def _sqlite(tmp_path: Path) -> tuple[Repository, str, Keyring]:
    keyfile = tmp_path / "k"
    write_key_file(keyfile, os.urandom(32))
    kr = Keyring.single(Key(1, key_from_file(keyfile)))
    c = cryptdisk.sqlite.connect(tmp_path / "app.db", keyring=kr)
    c.execute("CREATE TABLE w (i INTEGER)")
    c.executemany("INSERT INTO w VALUES (?)", [(i,) for i in range(1000)])
    c.close()
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    return repo, create(repo, tmp_path / "app.db", keyring=kr).id, kr


def _count(path: Path, kr: Keyring) -> int:
    c = cryptdisk.sqlite.connect(path, keyring=kr)
    try:
        return int(c.execute("SELECT count(*) FROM w").fetchall()[0][0])
    finally:
        c.close()


def test_a_restored_sqlite_file_is_0600_and_force_replaces_one_no_connection_has_open(
        tmp_path: Path) -> None:
    repo, bid, kr = _sqlite(tmp_path)
    restore(repo, bid, tmp_path / "new.db", keyring=kr)
    assert (tmp_path / "new.db").stat().st_mode & 0o777 == 0o600
    target = tmp_path / "r.db"
    c = cryptdisk.sqlite.connect(target, keyring=kr)
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("CREATE TABLE w (i INTEGER); INSERT INTO w VALUES (1)")
    target.chmod(0o640)
    with pytest.raises(BackupError, match=r"r.db is open: a connection holds SQLite.s lock"):
        restore(repo, bid, target, keyring=kr, replace=True)
    assert c.execute("SELECT count(*) FROM w").fetchall() == [(1,)]
    c.close()
    with pytest.raises(BackupError, match="is not a file"):
        restore(repo, bid, tmp_path / "repo", keyring=kr, replace=True)
    out = restore(repo, bid, target, keyring=kr, replace=True)
    assert out["replaced"]
    assert _count(target, kr) == 1000
    assert target.stat().st_mode & 0o777 == 0o640  # the replaced file's mode
    assert not _leftovers(tmp_path, "r.db")


@pytest.mark.parametrize("point", [("part", 2), ("swap", 1), ("swapped", 1)])
def test_kill_9_while_replacing_a_database_leaves_the_old_one_or_the_new(
        tmp_path: Path, point: tuple[str, int]) -> None:
    repo, old, new = _two_backups(tmp_path)
    target = tmp_path / "r.db"
    restore(repo, old, target)
    key = (tmp_path / "r.db.key").read_bytes()
    before = content(target)
    proc = _spawn("restore", str(tmp_path / "repo"), "pw", new, str(target), "", "", "force",
                  stdin=subprocess.PIPE)
    _wait_for(proc, *point)
    _kill(proc)
    assert (tmp_path / "r.db.key").read_bytes() == key
    want = content(tmp_path / "a.db") if point[0] == "swapped" else before
    assert content(target) == want  # opens whole: the old database or the new one
    assert _leftovers(tmp_path, "r.db")  # the work in progress, or the replaced database
    restore(repo, old, target, replace=True)  # deletes it
    assert not _leftovers(tmp_path, "r.db")
    assert content(target) == before


@pytest.mark.parametrize("point", ["swap", "swapped"])
def test_kill_9_while_replacing_a_sqlite_database_leaves_the_old_one_or_the_new(
        tmp_path: Path, point: str) -> None:
    repo, bid, kr = _sqlite(tmp_path)
    target = tmp_path / "r.db"
    c = cryptdisk.sqlite.connect(target, keyring=kr)
    c.execute("CREATE TABLE w (i INTEGER); INSERT INTO w VALUES (1)")
    c.close()
    proc = _spawn("restore", str(tmp_path / "repo"), "pw", bid, str(target),
                  str(tmp_path / "k"), "", "force", stdin=subprocess.PIPE)
    _wait_for(proc, point, 1)
    _kill(proc)
    assert _count(target, kr) == (1000 if point == "swapped" else 1)
    restore(repo, bid, target, keyring=kr, replace=True)
    assert _count(target, kr) == 1000
    assert not _leftovers(tmp_path, "r.db")


def test_force_refuses_a_target_holding_the_backup_repository_or_a_configs_disk(
        tmp_path: Path) -> None:
    from cryptdisk.config import load_config
    from tests.db.dbhelpers import write_config

    src = tmp_path / "a.db"
    make_db(src, rows=50)
    repo = Repository.init(str(src / "backups"), passphrase="pw", kdf_params=FAST_KDF)
    bid = create(repo, src).id
    with pytest.raises(BackupError, match=r"the backup repository .*backups is inside"):
        restore(repo, bid, src, replace=True)  # deleting a.db would delete the repository
    assert repo.manifest_ids() == [bid] and content(src)["t"][1][1] == 50
    # a config whose local disk lies inside the target: the restored parts would go with it
    conf = tmp_path / "r.db" / "conf"
    conf.mkdir(parents=True)
    cfg = load_config(write_config(conf, [4], 4))
    other = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    bid = create(other, src).id
    (tmp_path / "r.db" / "catalog").write_bytes(b"")
    with pytest.raises(BackupError, match=r"disk .* is inside .*r\.db"):
        restore(other, bid, tmp_path / "r.db", config=cfg, replace=True)
    assert (conf / "c.toml").is_file() and (tmp_path / "r.db" / "catalog").is_file()


def test_force_resolves_dotdot_after_a_symlink_as_the_kernel_does(tmp_path: Path) -> None:
    (tmp_path / "real" / "sub").mkdir(parents=True)
    make_db(tmp_path / "a.db", rows=50)  # beside 'link', not named by the target
    make_db(tmp_path / "real" / "a.db", rows=50)
    repo = Repository.init(str(tmp_path / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    make_db(tmp_path / "src.db", rows=7)
    bid = create(repo, tmp_path / "src.db").id
    (tmp_path / "link").symlink_to(tmp_path / "real" / "sub")
    out = restore(repo, bid, str(tmp_path / "link" / ".." / "a.db"), replace=True)
    assert out["path"] == str(tmp_path / "real" / "a.db")
    assert content(tmp_path / "real" / "a.db")["t"][1][1] == 7
    assert content(tmp_path / "a.db")["t"][1][1] == 50  # untouched
    # a trailing slash names the same database; '.' and '..' name none of their own
    restore(repo, bid, str(tmp_path / "a.db") + "/", replace=True)
    assert content(tmp_path / "a.db")["t"][1][1] == 7
    for bad in (f"{tmp_path}/a.db/.", f"{tmp_path}/a.db/.."):
        with pytest.raises(BackupError, match="names no file or directory of its own"):
            restore(repo, bid, bad, replace=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.db", "a.db.key", "link", "real", "repo", "src.db", "src.db.key"]


def test_force_leaves_a_database_put_at_target_during_the_restore(tmp_path: Path) -> None:
    repo, old, new = _two_backups(tmp_path)
    target = tmp_path / "r.db"
    restore(repo, old, target)
    restore(repo, old, tmp_path / "other.db")
    (tmp_path / "other.db" / "mine").write_text("keep")
    moved: list[int] = []

    def swap_target(n: int) -> None:
        if not moved:  # the checked database moved away, another put in its place
            moved.append(n)
            for a, b in (("r.db", "r.bak"), ("other.db", "r.db")):
                os.rename(tmp_path / a, tmp_path / b)
                os.rename(tmp_path / f"{a}.key", tmp_path / f"{b}.key")

    with pytest.raises(BackupError, match="not the database checked when the restore began"):
        restore(repo, new, target, replace=True, progress=swap_target)
    assert (target / "mine").read_text() == "keep"  # not swapped out and deleted
    assert content(target)["t"][1][1] == 50
    assert content(tmp_path / "r.bak")["t"][1][1] == 50
    assert not _leftovers(tmp_path, "r.db")


_KILLED_WRITER = (
    "import os, signal, sys, cryptdisk.sqlite\n"
    "from cryptdisk.keys import Key, Keyring, key_from_file\n"
    "c = cryptdisk.sqlite.connect(sys.argv[1], keyring=Keyring.single(Key(1, "
    "key_from_file(sys.argv[2]))))\n"
    "if sys.argv[3] == 'wal':\n"  # committed frames that only the WAL holds
    "    c.execute('PRAGMA journal_mode=WAL').fetchall()\n"
    "    c.execute('PRAGMA wal_autocheckpoint=0')\n"
    "    c.execute('CREATE TABLE w (i INTEGER)')\n"
    "    c.executemany('INSERT INTO w VALUES (?)', [(i,) for i in range(100)])\n"
    "elif sys.argv[3] == 'bigwal':\n"  # 4000 rows (2 MB) that only the WAL holds
    "    c.execute('PRAGMA journal_mode=WAL').fetchall()\n"
    "    c.execute('PRAGMA wal_autocheckpoint=0')\n"
    "    c.execute('CREATE TABLE w (i); WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT "
    "x + 1 FROM n WHERE x < 4000) INSERT INTO w SELECT randomblob(500) FROM n')\n"
    "else:\n"  # a transaction whose pages spilled to the file: only the journal undoes it
    "    c.execute('CREATE TABLE w (i); WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT "
    "x + 1 FROM n WHERE x < 2000) INSERT INTO w SELECT zeroblob(500) FROM n')\n"
    "    c.execute('PRAGMA cache_size=10; BEGIN; UPDATE w SET i = randomblob(500)')\n"
    "os.kill(os.getpid(), signal.SIGKILL)\n")


def _unchanged(path: Path, kr: Keyring) -> int:
    """The rows of ``w`` that no killed transaction touched (the killed UPDATE writes
    random blobs)."""
    c = cryptdisk.sqlite.connect(path, keyring=kr)
    try:
        return int(c.execute("SELECT count(*) FROM w WHERE typeof(i) != 'blob' "
                             "OR i = zeroblob(500)").fetchall()[0][0])
    finally:
        c.close()


@pytest.mark.parametrize("mode", ["wal", "journal"])
@pytest.mark.parametrize("point", ["swap", "swapped"])
def test_kill_9_replacing_a_sqlite_database_a_killed_writer_left_keeps_its_committed_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, point: str) -> None:
    """The old database's committed state is in its file and the WAL (or hot journal) a
    killed writer left beside it: a restore killed just before the rename leaves it whole
    (before, the restore deleted those files before the rename, and the old database
    lost its WAL's commits, or kept a half-written transaction)."""
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(tmp_path))
    repo, bid, kr = _sqlite(tmp_path)
    target = tmp_path / "r.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target),
                           str(tmp_path / "k"), mode], env=env)
    assert done.returncode == -9
    assert (tmp_path / f"r.db-{mode}").stat().st_size > 0
    proc = _spawn("restore", str(tmp_path / "repo"), "pw", bid, str(target),
                  str(tmp_path / "k"), "", "force", stdin=subprocess.PIPE)
    _wait_for(proc, point, 1)
    _kill(proc)
    old = 100 if mode == "wal" else 2000
    assert _unchanged(target, kr) == (1000 if point == "swapped" else old)
    restore(repo, bid, target, keyring=kr, replace=True)
    assert _count(target, kr) == 1000
    assert not _leftovers(tmp_path, "r.db")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("r.db")) == ["r.db"]


def test_force_over_a_killed_writers_wal_under_another_key_is_refused_keeping_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The restore's keyring cannot open the old database to apply its WAL: refused,
    nothing deleted; once its user opens it (SQLite applies the WAL), --force replaces it."""
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(tmp_path))
    repo, bid, kr = _sqlite(tmp_path)
    write_key_file(tmp_path / "k2", os.urandom(32))
    kr2 = Keyring.single(Key(1, key_from_file(tmp_path / "k2")))
    target = tmp_path / "r.db"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target),
                           str(tmp_path / "k2"), "wal"], env=env)
    assert done.returncode == -9
    with pytest.raises(BackupError, match=r"r.db has a WAL or hot journal that a killed "
                                          r"writer left .* nothing was replaced"):
        restore(repo, bid, target, keyring=kr, replace=True)
    assert (tmp_path / "r.db-wal").stat().st_size > 0
    assert _unchanged(target, kr2) == 100  # applies the WAL
    restore(repo, bid, target, keyring=kr, replace=True)
    assert _unchanged(target, kr) == 1000


def _killed_writer(tmp_path: Path, target: Path, keyfile: Path, mode: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target), str(keyfile),
                           mode], env=env)
    assert done.returncode == -9
    assert (tmp_path / f"r.db-{'journal' if mode == 'journal' else 'wal'}").stat().st_size


def test_kill_9_after_a_restore_could_not_copy_a_killed_writers_wal_keeps_the_wal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkpoint that copies a killed writer's WAL into the old file fails (its disk
    is full: writes past 256 KiB fail with EFBIG): the restore refuses, the WAL kept.
    (Before, SQLite's checkpoint at close failed silently, part of the WAL already copied
    into the file; the restore deleted the WAL, and killed just before the rename it left
    a file holding part of the WAL's pages: "database disk image is malformed".)"""
    import resource

    from .test_crash import CHILD

    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(tmp_path))
    repo, bid, kr = _sqlite(tmp_path)
    target = tmp_path / "r.db"
    _killed_writer(tmp_path, target, tmp_path / "k", "bigwal")

    def full_disk() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 18, 1 << 18))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    proc = subprocess.Popen(
        [*CHILD, "restore", str(tmp_path / "repo"), "pw", bid, str(target),
         str(tmp_path / "k"), "", "force"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, preexec_fn=full_disk)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    swapping = False
    for line in proc.stdout:
        if line.startswith("swap"):  # about to rename: killed there
            swapping = True
            proc.kill()
            break
        proc.stdin.write("\n")
        proc.stdin.flush()
    proc.wait()
    err = proc.stderr.read()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()
    assert _count(target, kr) == 4000  # the old database, whole: the WAL was kept
    assert not swapping and proc.returncode == 1
    assert ("r.db has a WAL or hot journal that a killed writer left" in err
            and "copying its WAL into the file failed" in err and "File too large" in err
            and "nothing was replaced" in err), err
    restore(repo, bid, target, keyring=kr, replace=True)  # room again: replaced
    assert _count(target, kr) == 1000
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("r.db")) == ["r.db"]


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], None]]:
    """Make a file read-only to this process: mode 0444, and for root (whom modes do not
    stop) the immutable attribute (``chattr +i``, removed after the test)."""
    made: list[Path] = []

    def make(path: Path) -> None:
        path.chmod(0o444)
        if os.geteuid() == 0:
            if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
                pytest.skip("root, and this file system has no immutable files (chattr +i)")
            made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize("mode", ["wal", "journal"])
def test_force_over_a_read_only_file_with_a_killed_writers_wal_or_journal_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only: Callable[[Path], None],
        mode: str) -> None:
    """SQLite opens a read-only file read-only: it can neither copy the WAL into it nor
    roll the hot journal back. Refused with a one-line error, nothing deleted. (Before,
    the WAL stayed, was taken for settled and deleted: as root, the rename over the
    immutable file then failed, leaving the old database without the WAL's commits, "no
    such table: w"; otherwise a kill before the rename did the same.)"""
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(tmp_path))
    repo, bid, kr = _sqlite(tmp_path)
    target = tmp_path / "r.db"
    _killed_writer(tmp_path, target, tmp_path / "k", mode)
    read_only(target)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PW="pw")
    p = subprocess.run([sys.executable, "-m", "cryptdisk", "backup", "restore",
                        str(tmp_path / "repo"), bid, str(target), "--passphrase-env", "PW",
                        "--key-file", str(tmp_path / "k"), "--force"],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert (tmp_path / f"r.db-{mode}").stat().st_size > 0  # kept
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "r.db has a WAL or hot journal that a killed writer left" in p.stderr
    assert "nothing was replaced" in p.stderr and "hint: open it once" in p.stderr
    if mode == "wal":
        assert "the file opened read-only" in p.stderr
    else:
        assert "ReadOnlyError" in p.stderr
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(target)], check=True)
    target.chmod(0o600)
    assert _unchanged(target, kr) == (100 if mode == "wal" else 2000)  # the old state, whole
    restore(repo, bid, target, keyring=kr, replace=True)
    assert _count(target, kr) == 1000


def test_force_over_a_running_writers_wal_is_refused_as_open_before_and_during_the_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process still running whose WAL holds commits the file does not have: refused as
    open, whether it had the database open when the restore began or opened it during
    the restore (just before the old file is settled); its WAL untouched, it goes on."""
    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(tmp_path))
    repo, bid, kr = _sqlite(tmp_path)
    target = tmp_path / "r.db"
    c = cryptdisk.sqlite.connect(target, keyring=kr)
    c.execute("PRAGMA journal_mode=WAL").fetchall()
    c.execute("CREATE TABLE w (i INTEGER)")
    c.close()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    hold = str(Path(__file__).with_name("hold_child.py"))
    procs: list[subprocess.Popen[str]] = []

    def writer() -> subprocess.Popen[str]:  # commits 2 rows into the WAL, stays open
        first = _count(target, kr) + 1
        proc = subprocess.Popen([sys.executable, hold, str(target), str(tmp_path / "k"),
                                 "wal", "idle"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        procs.append(proc)
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        for want in (first, first + 1):
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == str(want)
        return proc

    def opened_meanwhile(n: int) -> None:
        writer()

    try:
        for when in ("before", "during"):
            proc = writer() if when == "before" else None
            with pytest.raises(BackupError, match=r"r.db is open: a connection holds "
                                                  r"SQLite's lock on it"):
                restore(repo, bid, target, keyring=kr, replace=True,
                        progress=opened_meanwhile if proc is None else None)
            proc = procs[-1]
            assert (tmp_path / "r.db-wal").stat().st_size > 0  # its commits, kept
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == ("3" if when == "before" else "6")
            proc.stdin.close()
            assert proc.wait() == 0
            proc.stdout.close()
            assert _count(target, kr) == (3 if when == "before" else 6)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not _leftovers(tmp_path, "r.db")
    restore(repo, bid, target, keyring=kr, replace=True)
    assert _count(target, kr) == 1000


def test_a_hot_journal_is_told_from_one_sqlite_ignores_through_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What settling checks a journal left beside the file by: a killed writer's is hot
    (its first byte, decrypted, is not zero); a closed PERSIST connection's is not, and
    --force deletes it with the replaced file."""
    from cryptdisk.backup._replace import _journal_is_hot

    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(tmp_path))
    repo, bid, kr = _sqlite(tmp_path)
    target = tmp_path / "r.db"
    _killed_writer(tmp_path, target, tmp_path / "k", "journal")
    assert _journal_is_hot(str(target), kr)
    c = cryptdisk.sqlite.connect(target, keyring=kr)  # rolls it back
    c.execute("PRAGMA journal_mode=PERSIST").fetchall()
    c.execute("INSERT INTO w VALUES (1)")
    c.close()
    assert (tmp_path / "r.db-journal").stat().st_size > 0
    assert not _journal_is_hot(str(target), kr)
    assert _unchanged(target, kr) == 2001
    restore(repo, bid, target, keyring=kr, replace=True)
    assert _count(target, kr) == 1000
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("r.db")) == ["r.db"]


def test_force_makes_every_directory_of_the_new_database_durable_before_the_swap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the swap the old database is deleted: by then every directory of the new one
    must be durable, each in its parent (an fsync of every directory of the tree; a power
    loss cannot be staged here, so the fsyncs are recorded). Before, the directories made
    for the parts (``data/cryptdisk-db/<db id>``) were never fsynced: only the leaf a part
    was published in, whose fsync does not keep its own name in its new parent."""
    from cryptdisk.backup import _ops

    repo, old, new = _two_backups(tmp_path)
    target = tmp_path / "r.db"
    restore(repo, old, target)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        with contextlib.suppress(OSError):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    swapped: list[tuple[str, list[str]]] = []
    real_exchange = _ops.exchange

    def exchange(a: str, b: str) -> None:
        if not swapped:
            swapped.append((a, list(synced)))
        real_exchange(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(_ops, "exchange", exchange)
    restore(repo, new, target, replace=True)
    monkeypatch.undo()
    work, before = swapped[0]
    dirs = sorted(d for d, _, _ in os.walk(target))
    assert len(dirs) >= 5  # r.db, data, data/cryptdisk-db, its database, its tables
    assert [d for d in dirs if work + d[len(str(target)):] not in before] == []
    assert content(target) == content(tmp_path / "a.db")


def test_a_checkpoint_busy_with_a_reader_that_came_after_the_check_refuses_the_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader opening the old database just after the restore checked that nobody had
    it (those checks are skipped here to put it in that window): the checkpoint of the
    killed writer's WAL cannot finish (SQLite's wal_checkpoint(TRUNCATE) says busy), so
    the restore is refused, the WAL kept, and the reader goes on."""
    from cryptdisk.backup import _replace

    monkeypatch.setenv("CRYPTDISK_SHM_DIR", str(tmp_path))
    repo, bid, kr = _sqlite(tmp_path)
    target = tmp_path / "r.db"
    _killed_writer(tmp_path, target, tmp_path / "k", "wal")
    real_check = _replace.check_sqlite_unused
    calls: list[str] = []

    def check(dest: str, *, file_locks: bool = True) -> None:
        calls.append(dest)
        if len(calls) > 2:  # not the first check, nor the one before settling
            real_check(dest, file_locks=file_locks)

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    reader = subprocess.Popen([sys.executable, str(Path(__file__).with_name("hold_child.py")),
                               str(target), str(tmp_path / "k"), "wal", "read"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=env)
    assert reader.stdin is not None and reader.stdout is not None
    try:
        assert reader.stdout.readline() == "ready\n"
        monkeypatch.setattr(_replace, "check_sqlite_unused", check)
        with pytest.raises(BackupError, match=r"r.db has a WAL or hot journal .* could not: "
                                              r"the checkpoint of its WAL did not complete "
                                              r"\(busy, .*nothing was replaced"):
            restore(repo, bid, target, keyring=kr, replace=True)
        monkeypatch.undo()
        assert (tmp_path / "r.db-wal").stat().st_size > 0
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "101"  # its 100 rows, and one more
    finally:
        reader.stdin.close()
        assert reader.wait() == 0
        reader.stdout.close()
    assert _count(target, kr) == 101
    restore(repo, bid, target, keyring=kr, replace=True)
    assert _count(target, kr) == 1000


_DIES_REPLACING = """
from cryptdisk.backup._replace import open_target
replaced = open_target(sys.argv[1], "db", "b1")  # holds the database's LOCK, as a restore
fork_and_die()
"""


def test_a_forked_child_does_not_keep_a_dead_restores_hold_on_the_database(
        tmp_path: Path) -> None:
    """A restore with --force holds the LOCK of the database it replaces, as a writer
    does. A process forked during the restore shared that open file: after the restore
    died the child kept the flock, and the database could not be opened for writing
    until the child exited. The child now closes its copy as it starts."""

    path = tmp_path / "a.db"
    make_db(path, rows=10)
    with child_of_a_dead_holder(_DIES_REPLACING, str(path)):
        cryptdisk.connect(path).close()  # DatabaseLockedError before

"""A database made without a config rotates to a new key with no config written by hand.

Its keys are its key files: ``PATH.key`` (current) and ``PATH.key.ID`` (older
keys, kept until removed). The commands are run as a user runs them.
"""

import os
import subprocess
import sys

import pytest

import cryptdisk
from cryptdisk.db._keyfiles import install_current_key, load_keyring
from cryptdisk.errors import KeyringError, RotationError
from cryptdisk.format import read_header
from cryptdisk.keys import Key, write_key_file

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
CHILD = os.path.join(os.path.dirname(__file__), "rotate_child.py")
INSERTS = 4


def env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))


def run(*args):
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env(), timeout=300)


def make_db(tmp_path, inserts=INSERTS):
    path = tmp_path / "sales.db"
    sql = "CREATE TABLE t (x BIGINT); " + "; ".join(
        f"INSERT INTO t SELECT range FROM range({i * 100}, {(i + 1) * 100})"
        for i in range(inserts))
    made = run("sql", str(path), "--create", "-q", sql)
    assert made.returncode == 0, made.stderr
    return path


def header_key_id(path):
    with open(path, "rb") as f:
        return read_header(f).key_id


def key_ids(path):
    """Key id -> how many of the database's files (parts and catalog) are under it."""
    out = {}
    files = [path / "catalog", *sorted((path / "data").rglob("*.parquet"))]
    for f in files:
        with open(f, "rb") as fh:
            kid = read_header(fh).key_id
        out[kid] = out.get(kid, 0) + 1
    return out


def rows(path):
    with cryptdisk.connect(path) as db:
        return db.query("SELECT count(*), sum(x) FROM t")


def test_rotate_with_a_new_key_file_then_remove_the_old_key(tmp_path):
    path = make_db(tmp_path)
    expected = rows(path)
    new = tmp_path / "new.key"
    assert run("keygen", "-o", str(new), "--id", "2").returncode == 0
    done = run("rotate", str(path), "--new-key", str(new))
    assert done.returncode == 0, done.stderr
    assert "all 5 file(s) the catalog names are under key 2" in done.stdout
    assert f"key 1 is kept in {path}.key.1" in done.stdout
    assert key_ids(path) == {2: INSERTS + 1}
    keys = run("keys", str(path), "--format", "csv")
    assert keys.stdout.splitlines()[1:] == ["1,aes-256-gcm,file,false,0",
                                            "2,aes-256-gcm,file,true,5"]
    # the database opens with no config, its old key kept beside the new one
    assert rows(path) == expected
    assert os.stat(f"{path}.key.1").st_mode & 0o077 == 0
    removed = run("keys", str(path), "--remove", "1")
    assert removed.returncode == 0, removed.stderr
    assert not os.path.exists(f"{path}.key.1")
    assert rows(path) == expected
    again = run("rotate", str(path), "--new-key", str(new))  # idempotent
    assert again.returncode == 0 and "rewrapped 0 file(s)" in again.stdout


def test_the_current_key_and_a_used_key_cannot_be_removed(tmp_path):
    path = make_db(tmp_path, inserts=2)
    current = run("keys", str(path), "--remove", "1")
    assert current.returncode == 1 and "is the current key" in current.stderr
    # the first step of a rotation: key 2 is current, every file still under key 1
    install_current_key(str(path), Key.generate(2))
    used = run("keys", str(path), "--remove", "1")
    assert used.returncode == 1
    assert "key 1 is still used by 3 file(s)" in used.stderr, used.stderr
    assert os.path.exists(f"{path}.key.1")
    with cryptdisk.connect(path) as db, pytest.raises(RotationError) as err:
        db.remove_key(1)
    assert len(err.value.files) == 3
    with cryptdisk.connect(path, read_only=True) as db:
        assert db.query("SELECT count(*) FROM t") == [(200,)]


def test_the_pins_and_the_server_files_beside_the_database_are_rotated_too(tmp_path):
    """PATH.pin and cryptdisk serve's PATH.users and PATH.audit are sealed with the
    database's keys: a rotation rewraps them, so the old key can go and the database still
    opens with --pin and the server with its users."""
    path = tmp_path / "sales.db"
    made = run("sql", str(path), "--create", "--pin", "-q", "CREATE TABLE t (x BIGINT); "
               "INSERT INTO t SELECT range FROM range(100)")
    assert made.returncode == 0, made.stderr
    added = subprocess.run([sys.executable, "-m", "cryptdisk", "serve", str(path), "--add-user",
                            "alice"], capture_output=True, text=True, timeout=300,
                           env=dict(env(), CRYPTDISK_PASSWORD="a long password 1"))
    assert added.returncode == 0, added.stderr
    beside = [f"{path}.pin", f"{path}.users", f"{path}.audit"]
    assert [header_key_id(f) for f in beside] == [1, 1, 1]
    new = tmp_path / "new.key"
    assert run("keygen", "-o", str(new), "--id", "2").returncode == 0
    done = run("rotate", str(path), "--new-key", str(new))  # (without --pin)
    assert done.returncode == 0, done.stderr
    assert "the 3 beside it (pins, server files) are under key 2" in done.stdout, done.stdout
    assert [header_key_id(f) for f in beside] == [2, 2, 2]
    removed = run("keys", str(path), "--remove", "1")
    assert removed.returncode == 0, removed.stderr
    opened = run("sql", str(path), "--pin", "-q", "SELECT count(*) FROM t", "--format", "csv")
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.splitlines() == ["count_star()", "100"]
    checked = run("serve", str(path), "--check", "--self-signed")
    assert checked.returncode == 0, checked.stderr
    assert "1 user(s)" in checked.stdout


def test_a_key_a_file_beside_the_database_still_uses_is_not_removed(tmp_path):
    """A server file sealed under an older key (written by a server that loaded its keys
    before the rotation) counts as a use of that key: removing it is refused, system.keys
    counts it, and a rotation rewraps it."""
    path = make_db(tmp_path, inserts=1)
    old = load_keyring(str(path)).current_key()
    new = tmp_path / "new.key"
    assert run("keygen", "-o", str(new), "--id", "2").returncode == 0
    assert run("rotate", str(path), "--new-key", str(new)).returncode == 0
    with cryptdisk.open(f"{path}.users", "wb", keyring=cryptdisk.Keyring([old], 1)) as f:
        f.write(b"{}")
    keys = run("keys", str(path), "--format", "csv")
    assert keys.stdout.splitlines()[1:] == ["1,aes-256-gcm,file,false,1",
                                            "2,aes-256-gcm,file,true,2"]
    used = run("keys", str(path), "--remove", "1")
    assert used.returncode == 1
    assert f"{path}.users" in used.stderr and "still used by 1 file(s)" in used.stderr
    assert os.path.exists(f"{path}.key.1")
    with cryptdisk.connect(path) as db, pytest.raises(RotationError) as err:
        db.remove_key(1)
    assert err.value.files == [f"{path}.users"]
    again = run("rotate", str(path))
    assert again.returncode == 0, again.stderr
    assert "rewrapped 1 file(s)" in again.stdout
    assert run("keys", str(path), "--remove", "1").returncode == 0
    with cryptdisk.open(f"{path}.users", "rb", keyring=load_keyring(str(path))) as f:
        assert f.read() == b"{}"


def test_a_new_key_needs_its_own_id(tmp_path):
    path = make_db(tmp_path, inserts=1)
    assert run("keygen", "-o", str(tmp_path / "one.key")).returncode == 0  # id 1, the default
    done = run("rotate", str(path), "--new-key", str(tmp_path / "one.key"))
    assert done.returncode == 1 and "already has a key with id 1" in done.stderr
    assert "--id 2" in done.stderr  # the hint
    assert key_ids(path) == {1: 2} and not os.path.exists(f"{path}.key.1")


def test_new_key_with_a_config_is_refused(tmp_path):
    path = make_db(tmp_path, inserts=1)
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keyring]\n[[keyring.keys]]\nid = 1\nfile = "sales.db.key"\n'
                   '[disks.raw]\ntype = "local"\npath = "sales.db/data"\n'
                   '[disks.default]\ntype = "encrypted"\ndisk = "raw"\n'
                   '[policies.default]\nvolumes = [{ name = "main", disks = ["default"] }]\n')
    write_key_file(tmp_path / "new.key", Key.generate(2))
    done = run("rotate", str(path), "--config", str(cfg), "--new-key", str(tmp_path / "new.key"))
    assert done.returncode == 1 and "without a config" in done.stderr
    removal = run("keys", str(path), "--config", str(cfg), "--remove", "1")
    assert removal.returncode == 1 and "opened with a config" in removal.stderr
    assert "remove key 1 from the config's [keyring]" in removal.stderr


def test_key_files_left_by_a_killed_install_load(tmp_path):
    """Killed after keeping the old key and before the rename: the old key is there twice."""
    path = str(tmp_path / "db")
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (x INT); INSERT INTO t VALUES (7)")
    os.link(f"{path}.key", f"{path}.key.1")
    (tmp_path / "db.key.new").write_text("half a key")  # the temporary of the new key
    assert load_keyring(path).ids == [1]
    assert rows(path) == [(1, 7)]
    assert install_current_key(path, Key.generate(2))
    assert load_keyring(path).ids == [1, 2] and load_keyring(path).current_key_id == 2
    # a different key under the current key's id is refused, never guessed
    os.remove(f"{path}.key.1")
    write_key_file(f"{path}.key.2", Key.generate(2))
    with pytest.raises(KeyringError, match="different keys with the same id 2"):
        load_keyring(path)


@pytest.mark.parametrize("kill_after", [1, 3, INSERTS, INSERTS + 1])
def test_kill_9_during_rotation_then_rerun_finishes(tmp_path, kill_after):
    """Killed after ``kill_after`` files (the catalog is the last), a rerun finishes the job."""
    path = make_db(tmp_path)
    expected = rows(path)
    new = tmp_path / "new.key"
    write_key_file(new, Key.generate(2))
    child = subprocess.Popen([sys.executable, CHILD, str(path), str(new)], env=env(),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        for n in range(1, kill_after + 1):
            line = child.stdout.readline()
            assert line.startswith("rotated "), line
            if n < kill_after:
                child.stdin.write("go\n")
                child.stdin.flush()
        child.kill()  # SIGKILL, while it waits after its report
        child.wait()
    finally:
        child.stdin.close()
        child.stdout.close()
    assert child.returncode == -9
    rewrapped = min(kill_after, INSERTS + 1)
    assert key_ids(path) == {k: n for k, n in ((1, INSERTS + 1 - rewrapped), (2, rewrapped))
                             if n}
    assert rows(path) == expected  # opens with no config: both keys are in its key files
    if rewrapped <= INSERTS:
        used = run("keys", str(path), "--remove", "1")
        assert used.returncode == 1
        assert f"still used by {INSERTS + 1 - rewrapped} file(s)" in used.stderr
    rerun = run("rotate", str(path))
    assert rerun.returncode == 0, rerun.stderr
    assert f"rewrapped {INSERTS + 1 - rewrapped} file(s)" in rerun.stdout
    assert key_ids(path) == {2: INSERTS + 1}
    assert run("keys", str(path), "--remove", "1").returncode == 0
    assert rows(path) == expected


def test_a_reader_open_during_the_rotation_loads_the_new_key(tmp_path):
    path = make_db(tmp_path, inserts=2)
    write_key_file(tmp_path / "new.key", Key.generate(2))
    with cryptdisk.connect(path, read_only=True) as reader:
        assert reader.query("SELECT count(*) FROM t") == [(200,)]
        done = run("rotate", str(path), "--new-key", str(tmp_path / "new.key"))
        assert done.returncode == 0, done.stderr
        reader.cache.clear()
        assert reader.query("SELECT count(*), sum(x) FROM t") == [(200, 19900)]
        assert reader.keyring.current_key_id == 2


def test_a_keyring_only_config_points_to_rotate_new_key(tmp_path):
    """The issue's first step: a config listing the keys only names the command that works."""
    path = make_db(tmp_path, inserts=1)
    write_key_file(tmp_path / "new.key", Key.generate(2))
    cfg = tmp_path / "new-key.toml"
    cfg.write_text('[keyring]\ncurrent_key_id = 2\n[[keyring.keys]]\nid = 1\n'
                   'file = "sales.db.key"\n[[keyring.keys]]\nid = 2\nfile = "new.key"\n')
    done = run("rotate", str(path), "--config", str(cfg))
    assert done.returncode == 1
    assert f"hint: {path} was made without a config" in done.stderr
    assert f"cryptdisk rotate {path} --new-key FILE" in done.stderr


CLI_CHILD = os.path.join(os.path.dirname(__file__), "rotate_cli_child.py")


def kill_rotate_at(point, path, new):
    """Run ``cryptdisk rotate PATH --new-key NEW`` in a process, kill -9 it at ``point``."""
    child = subprocess.Popen([sys.executable, CLI_CHILD, point, "rotate", str(path),
                              "--new-key", str(new)], env=env(), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line == f"at {point}\n", line
        child.kill()  # SIGKILL, while it waits at that point
        child.wait()
    finally:
        child.stdin.close()
        child.stdout.close()
    assert child.returncode == -9


@pytest.mark.parametrize("point", ["staged", "kept"])
def test_kill_9_before_the_new_key_is_current_then_a_rerun_without_it_finishes(tmp_path,
                                                                             point):
    """Killed once the rotation recorded its key, before the key became current: the
    rerun the docs name (no --new-key) makes it current and rewraps, or it must not say
    it succeeded."""
    path = make_db(tmp_path)
    expected = rows(path)
    new = tmp_path / "new.key"
    write_key_file(new, Key.generate(2))
    kill_rotate_at(point, path, new)
    assert key_ids(path) == {1: INSERTS + 1}
    assert load_keyring(str(path)).current_key_id == 1
    assert rows(path) == expected  # the database opens and reads as before
    # the key listing shows the recorded key and the command that finishes the rotation
    for listing in (run("keys", str(path), "--format", "csv"),
                    run("keys", "list", "--db", str(path), "--format", "csv")):
        assert listing.returncode == 0, listing.stderr
        assert "2," not in listing.stdout  # stdout: the listing alone (key 2 is not in use)
        assert (f"warning: a rotation of database {path} to key 2 was interrupted after it "
                f"recorded the key in {path}.key.pending") in listing.stderr
        assert f"hint: finish it: cryptdisk rotate {path}\n" in listing.stderr
    rerun = run("rotate", str(path))
    assert rerun.returncode == 0, rerun.stderr
    assert "finished an interrupted rotation: key 2" in rerun.stdout
    assert f"all {INSERTS + 1} file(s) the catalog names are under key 2" in rerun.stdout
    assert key_ids(path) == {2: INSERTS + 1}
    assert load_keyring(str(path)).ids == [1, 2]
    assert not os.path.exists(f"{path}.key.pending")
    assert rows(path) == expected
    again = run("rotate", str(path))
    assert again.returncode == 0 and "rewrapped 0 file(s)" in again.stdout
    assert "interrupted" not in again.stdout
    assert "interrupted" not in run("keys", str(path)).stderr


def test_kill_9_while_the_new_key_is_written_then_the_rerun_asks_for_it(tmp_path):
    """Killed before the key was recorded whole: a rerun without --new-key cannot finish
    it, so it fails naming the command that does; that command finishes it."""
    path = make_db(tmp_path, inserts=2)
    new = tmp_path / "new.key"
    write_key_file(new, Key.generate(2))
    kill_rotate_at("staging", path, new)
    listing = run("keys", str(path))
    assert listing.returncode == 0, listing.stderr
    assert "was interrupted before it recorded the key" in listing.stderr
    assert f"cryptdisk rotate {path} --new-key FILE" in listing.stderr
    rerun = run("rotate", str(path))
    assert rerun.returncode == 1
    assert "was interrupted before it recorded the key" in rerun.stderr
    assert f"cryptdisk rotate {path} --new-key FILE" in rerun.stderr
    assert key_ids(path) == {1: 3}
    done = run("rotate", str(path), "--new-key", str(new))
    assert done.returncode == 0, done.stderr
    assert key_ids(path) == {2: 3}
    assert not os.path.exists(f"{path}.key.new") and not os.path.exists(f"{path}.key.pending")
    assert run("rotate", str(path)).returncode == 0


def test_a_rotation_whose_checks_fail_leaves_no_pending_key(tmp_path):
    path = make_db(tmp_path, inserts=1)
    part = next((path / "data").rglob("*.parquet"))
    away = tmp_path / "away.parquet"
    os.rename(part, away)  # a part the catalog names is missing
    write_key_file(tmp_path / "new.key", Key.generate(2))
    done = run("rotate", str(path), "--new-key", str(tmp_path / "new.key"))
    assert done.returncode == 1, done.stdout
    assert not os.path.exists(f"{path}.key.pending")
    assert load_keyring(str(path)).ids == [1]
    os.rename(away, part)
    again = run("rotate", str(path))
    assert again.returncode == 0 and "under key 1" in again.stdout


@pytest.mark.parametrize("step", ["write", "rename"])
def test_a_rotation_whose_key_staging_fails_leaves_no_staged_key(tmp_path, monkeypatch, step):
    """An error while the new key is staged (a full disk): the rotation raises, its files
    stay under the old key, and nothing is left that a rerun without the key would take
    for a rotation killed while staging it (which refuses and asks for the key)."""
    import errno

    import cryptdisk.db._keyfiles as keyfiles

    path = make_db(tmp_path, inserts=1)
    real_write, real_replace = keyfiles.write_key_file, os.replace

    def write_key_file(p, key, **kw):
        real_write(p, key, **kw)
        if step == "write" and str(p).endswith(".key.new"):
            raise OSError(errno.ENOSPC, "injected: no space left")

    def replace(src, dst, *a, **k):
        if step == "rename" and str(dst).endswith(".key.pending"):
            raise OSError(errno.EIO, "injected: I/O error")
        return real_replace(src, dst, *a, **k)

    monkeypatch.setattr(keyfiles, "write_key_file", write_key_file)
    monkeypatch.setattr(os, "replace", replace)
    with cryptdisk.connect(path) as db:
        with pytest.raises(OSError, match="injected"):
            db.rotate_keys(new_key=Key.generate(2))
    monkeypatch.undo()
    assert not os.path.exists(f"{path}.key.new") and not os.path.exists(f"{path}.key.pending")
    assert key_ids(path) == {1: 2}
    again = run("rotate", str(path))
    assert again.returncode == 0, again.stderr
    assert key_ids(path) == {1: 2}

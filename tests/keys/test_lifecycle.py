"""``cryptdisk keys list|add|promote|retire|destroy`` run as a user runs them, and killed.

Files and databases are written with a config; the lifecycle commands change its
``[keyring]``. Every step is checked through the real CLI, including kill -9 at
every write a step makes (the child pauses before the N-th write and is killed
there): the config then parses as the old or the new state and running the step
again finishes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import cryptdisk
import cryptdisk.fs
from cryptdisk.errors import ConfigError, KeyNotFoundError
from cryptdisk.format import Header
from cryptdisk.keys import AUDIT_ENV, Key, Keyring, write_key_file

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
CHILD = os.path.join(os.path.dirname(__file__), "lifecycle_child.py")

CONFIG = """\
# the team's config: comments and layout survive the lifecycle's edits
[keyring]
current_key_id = 1   # the first key

[[keyring.keys]]
id = 1
file = "k1.hex"   # made by cryptdisk keygen

[disks.secure_local]
type = "local"
path = "store/secure"
[disks.secure]
type = "encrypted"
disk = "secure_local"
[policies.default]
volumes = [{ name = "main", disks = ["secure"] }]
"""


def env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
                **extra)


def run(*args: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env(**extra), timeout=300, cwd=cwd)


def setup(tmp_path: Path, files: int = 3) -> tuple[str, Path]:
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg = tmp_path / "cryptdisk.toml"
    cfg.write_text(CONFIG)
    data = tmp_path / "data"
    data.mkdir()
    ring = Keyring.from_config(cfg)
    for i in range(files):
        with cryptdisk.open(data / f"f{i}.cdk", "wb", keyring=ring) as f:
            f.write(f"file {i}".encode() * 100)
    return str(cfg), data


def key_ids(data: Path) -> list[int]:
    return sorted(Header.parse(p.read_bytes()[:128]).key_id for p in data.iterdir())


def keyring_section(cfg: str) -> dict:
    return tomllib.loads(Path(cfg).read_text())["keyring"]


def test_the_whole_lifecycle_of_a_key_over_files(tmp_path):
    cfg, data = setup(tmp_path)
    listed = run("keys", "list", "-c", cfg, str(data), "--format", "csv")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == ["id,state,source,where,files", "1,current,file,k1.hex,3"]

    added = run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex"))
    assert added.returncode == 0, added.stderr
    assert (tmp_path / "k2.hex").stat().st_mode & 0o777 == 0o600
    text = Path(cfg).read_text()
    assert "# the team's config" in text and "# made by cryptdisk keygen" in text
    assert keyring_section(cfg)["keys"][1] == {"id": 2, "file": "k2.hex"}
    assert keyring_section(cfg)["current_key_id"] == 1  # added, not current

    refused = run("keys", "retire", "1", "-c", cfg, str(data))
    assert refused.returncode == 1
    assert "key 1 is the current key" in refused.stderr

    promoted = run("keys", "promote", "2", "-c", cfg, str(data), "-v")
    assert promoted.returncode == 0, promoted.stderr
    assert "rewrapped 3 file(s) under key 2" in promoted.stdout
    assert keyring_section(cfg)["current_key_id"] == 2
    assert "current_key_id = 2   # the first key" in Path(cfg).read_text()
    assert key_ids(data) == [2, 2, 2]

    # a file still under key 1 (restored from a backup) stops retire, naming it
    old = tmp_path / "old.cdk"
    with cryptdisk.open(old, "wb", keyring=Keyring.from_config(cfg).with_current(1)) as f:
        f.write(b"restored")
    (data / "sub").mkdir()
    os.replace(old, data / "sub" / "restored.cdk")
    used = run("keys", "retire", "1", "-c", cfg, str(data))
    assert used.returncode == 1
    assert "key 1 is still used by 1 file(s)" in used.stderr
    assert str(data / "sub" / "restored.cdk") in used.stderr
    assert "state" not in keyring_section(cfg)["keys"][0]
    assert run("keys", "promote", "2", "-c", cfg, str(data)).returncode == 0

    unscoped = run("keys", "retire", "1", "-c", cfg)
    assert unscoped.returncode == 1 and "which files could use key 1" in unscoped.stderr
    not_retired = run("keys", "destroy", "1", "-c", cfg, str(data))
    assert not_retired.returncode == 1 and "retire it first" in not_retired.stderr

    retired = run("keys", "retire", "1", "-c", cfg, str(data))
    assert retired.returncode == 0, retired.stderr
    assert keyring_section(cfg)["keys"][0]["state"] == "retired"
    listed = run("keys", "list", "-c", cfg, str(data), "--format", "csv")
    assert listed.stdout.splitlines()[1:] == ["1,retired,file,k1.hex,0", "2,current,file,k2.hex,4"]

    # a retired key is not loaded: its file may go, the files under key 2 still read
    (tmp_path / "k1.hex").rename(tmp_path / "k1.moved")
    with cryptdisk.open(data / "f0.cdk", "rb", keyring=Keyring.from_config(cfg)) as f:
        assert f.read() == b"file 0" * 100
    (tmp_path / "k1.moved").rename(tmp_path / "k1.hex")

    # a file that comes back under the retired key stops destroy, named
    with cryptdisk.open(old, "wb", keyring=Keyring([Key.generate(1)])) as f:
        f.write(b"late")
    os.replace(old, data / "late.cdk")
    late = run("keys", "destroy", "1", "-c", cfg, str(data))
    assert late.returncode == 1
    assert "destroying it would lose them" in late.stderr and "late.cdk" in late.stderr
    assert (tmp_path / "k1.hex").exists()
    (data / "late.cdk").unlink()

    # so does a cryptdisk file whose header cannot be read: any key may be its
    (data / "damaged.cdk").write_bytes(b"CRYPTDSK" + b"\xff" * 120)
    damaged = run("keys", "destroy", "1", "-c", cfg, str(data))
    assert damaged.returncode == 1
    assert f"{data / 'damaged.cdk'} (header unreadable)" in damaged.stderr
    (data / "damaged.cdk").unlink()

    destroyed = run("keys", "destroy", "1", "-c", cfg, str(data))
    assert destroyed.returncode == 0, destroyed.stderr
    assert f"deleted key file {tmp_path / 'k1.hex'}" in destroyed.stdout
    assert not (tmp_path / "k1.hex").exists()
    assert [k["id"] for k in keyring_section(cfg)["keys"]] == [2]
    assert "# the team's config" in Path(cfg).read_text()
    assert run("decrypt", "--keyring", cfg, str(data / "f1.cdk"), "-").stdout == "file 1" * 100


def test_the_lifecycle_over_a_database_written_with_the_config(tmp_path):
    cfg, _ = setup(tmp_path, files=0)
    db = tmp_path / "sales.db"
    with cryptdisk.connect(db, cfg) as conn:
        conn.sql("CREATE TABLE t (x BIGINT)")
        conn.sql("INSERT INTO t SELECT range FROM range(100)")
        conn.sql("INSERT INTO t SELECT range FROM range(100, 200)")
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex")
               ).returncode == 0
    listed = run("keys", "list", "-c", cfg, "--db", str(db), "--format", "json")
    assert [(r["id"], r["state"], r["files"]) for r in json.loads(listed.stdout)] == [
        (1, "current", 3), (2, "active", 0)]
    current = run("keys", "promote", "2", "-c", cfg)  # new files only: nothing rewrapped
    assert current.returncode == 0 and "stay under their keys until rewrapped" in current.stdout
    refused = run("keys", "retire", "1", "-c", cfg, "--db", str(db))
    assert refused.returncode == 1 and "still used by 3 file(s)" in refused.stderr
    assert "catalog" in refused.stderr
    promoted = run("keys", "promote", "2", "-c", cfg, "--db", str(db))
    assert promoted.returncode == 0, promoted.stderr
    assert "rewrapped 3 file(s) of" in promoted.stdout
    assert run("keys", "retire", "1", "-c", cfg, "--db", str(db)).returncode == 0
    assert run("keys", "destroy", "1", "-c", cfg, "--db", str(db)).returncode == 0
    with cryptdisk.connect(db, cfg) as conn:
        assert conn.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 200}]
        assert conn.sql("SELECT id, files FROM system.keys").to_pylist() == [
            {"id": 2, "files": 3}]


def test_a_file_reached_twice_is_counted_once(tmp_path):
    """A database's part that also lies under a given directory (the disk's store), and a
    file under two of the given paths, count once in list and in retire's refusal."""
    cfg, data = setup(tmp_path, files=3)
    db = tmp_path / "sales.db"
    with cryptdisk.connect(db, cfg) as conn:
        conn.sql("CREATE TABLE t (x BIGINT)")
        conn.sql("INSERT INTO t SELECT range FROM range(100)")
        conn.sql("INSERT INTO t SELECT range FROM range(100, 200)")
    store = tmp_path / "store"  # the parts of sales.db: 2 parts, and its catalog in sales.db
    assert sum(1 for p in store.rglob("*") if p.is_file()) == 2
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex")
               ).returncode == 0
    assert run("keys", "promote", "2", "-c", cfg).returncode == 0  # no file rewrapped
    for scope in ([str(store), str(data)], [str(store), str(data), str(data / "f0.cdk"),
                                            str(tmp_path / "." / "store")]):
        listed = run("keys", "list", "-c", cfg, "--db", str(db), *scope, "--format", "json")
        assert [(r["id"], r["files"]) for r in json.loads(listed.stdout)] == [(1, 6), (2, 0)], \
            scope
        refused = run("keys", "retire", "1", "-c", cfg, "--db", str(db), *scope)
        assert refused.returncode == 1 and "still used by 6 file(s)" in refused.stderr, scope
    alone = run("keys", "list", "-c", cfg, str(store), str(data), str(data), "--format", "json")
    assert [(r["id"], r["files"]) for r in json.loads(alone.stdout)] == [(1, 5), (2, 0)]


def test_the_files_beside_a_database_count_once_and_keep_their_key_in_use(tmp_path):
    """The outside pin beside a database (sealed with the config's keys) is one of its
    files: counted once when the directory holding it is also given, and rewrapped by
    promote --db, so that key 1 can be retired and the database still opens with its pin."""
    cfg, data = setup(tmp_path, files=1)
    db = tmp_path / "sales.db"
    with cryptdisk.connect(db, cfg, pin=True) as conn:
        conn.sql("CREATE TABLE t (x BIGINT)")
        conn.sql("INSERT INTO t SELECT range FROM range(100)")
    assert Header.parse((tmp_path / "sales.db.pin").read_bytes()[:128]).key_id == 1
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex")
               ).returncode == 0
    listed = run("keys", "list", "-c", cfg, "--db", str(db), str(tmp_path), "--format", "json")
    # the catalog, one part, the outside pin and data/f0.cdk (PATH/pin is the catalog's)
    assert [(r["id"], r["files"]) for r in json.loads(listed.stdout)] == [(1, 4), (2, 0)]
    promoted = run("keys", "promote", "2", "-c", cfg, "--db", str(db))
    assert promoted.returncode == 0, promoted.stderr
    refused = run("keys", "retire", "1", "-c", cfg, "--db", str(db), str(tmp_path))
    assert refused.returncode == 1 and "still used by 1 file(s)" in refused.stderr
    assert str(data / "f0.cdk") in refused.stderr
    assert Header.parse((tmp_path / "sales.db.pin").read_bytes()[:128]).key_id == 2
    assert run("keys", "promote", "2", "-c", cfg, str(data)).returncode == 0
    retired = run("keys", "retire", "1", "-c", cfg, "--db", str(db), str(tmp_path))
    assert retired.returncode == 0, retired.stderr
    with cryptdisk.connect(db, cfg, pin=True, read_only=True) as conn:
        assert conn.query("SELECT count(*) FROM t") == [(100,)]


def test_the_server_files_a_config_names_are_rotated_with_the_database(tmp_path):
    """A user file kept where the config's [server] says (not beside the database) is
    sealed with the same keys: promote --db rewraps it and retire refuses while it is
    under the old key."""
    cfg, _data = setup(tmp_path, files=0)
    users = tmp_path / "srv" / "users.sealed"
    users.parent.mkdir()
    with open(cfg, "a") as f:
        f.write(f'\n[server]\nusers = "{users}"\n')
    db = tmp_path / "sales.db"
    with cryptdisk.connect(db, cfg) as conn:
        conn.sql("CREATE TABLE t (x BIGINT)")
    with cryptdisk.open(users, "wb", keyring=Keyring.from_config(cfg)) as f:
        f.write(b"{}")
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex")
               ).returncode == 0
    assert run("keys", "promote", "2", "-c", cfg).returncode == 0  # no file rewrapped
    refused = run("keys", "retire", "1", "-c", cfg, "--db", str(db))
    assert refused.returncode == 1 and str(users) in refused.stderr, refused.stderr
    promoted = run("keys", "promote", "2", "-c", cfg, "--db", str(db))
    assert promoted.returncode == 0, promoted.stderr
    assert Header.parse(users.read_bytes()[:128]).key_id == 2
    retired = run("keys", "retire", "1", "-c", cfg, "--db", str(db))
    assert retired.returncode == 0, retired.stderr


def test_a_sqlite_file_given_brings_its_wal_and_journal(tmp_path):
    """An encrypted SQLite database given as a path brings its -wal (and -journal): a WAL
    holding committed transactions not yet checkpointed is under the key it was begun
    with, so list counts it, retire refuses for it and promote rewraps it; otherwise
    retire and destroy of that key lose those transactions once the writer stops."""
    import cryptdisk.sqlite

    cfg, _data = setup(tmp_path, files=0)
    db = tmp_path / "app.sqlite"
    writer = cryptdisk.sqlite.connect(db, keyring=Keyring.from_config(cfg))
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
        wal = Path(f"{db}-wal")
        assert wal.stat().st_size > 0 and Header.parse(wal.read_bytes()[:128]).key_id == 1
        assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex")
                   ).returncode == 0
        assert run("keys", "promote", "2", "-c", cfg).returncode == 0  # nothing rewrapped
        listed = run("keys", "list", "-c", cfg, str(db), "--format", "json")
        assert [(r["id"], r["files"]) for r in json.loads(listed.stdout)] == [(1, 2), (2, 0)]
        refused = run("keys", "retire", "1", "-c", cfg, str(db))
        assert refused.returncode == 1 and "app.sqlite-wal" in refused.stderr, refused.stderr
        promoted = run("keys", "promote", "2", "-c", cfg, str(db), "-v")
        assert promoted.returncode == 0 and f"rewrapped: {wal}" in promoted.stdout, \
            promoted.stdout
        assert Header.parse(wal.read_bytes()[:128]).key_id == 2
        assert run("keys", "retire", "1", "-c", cfg, str(db)).returncode == 0
        writer.execute("INSERT INTO t VALUES (2)")  # the writer goes on under its keys
    finally:
        writer.close()
    reader = cryptdisk.sqlite.connect(db, keyring=Keyring.from_config(cfg))
    assert reader.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    reader.close()


def test_promote_verbose_tells_rewrapped_files_from_those_already_under_the_key(tmp_path):
    cfg, data = setup(tmp_path, files=2)
    db = tmp_path / "sales.db"
    with cryptdisk.connect(db, cfg) as conn:
        conn.sql("CREATE TABLE t (x BIGINT)")
        conn.sql("INSERT INTO t SELECT range FROM range(100)")
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex")
               ).returncode == 0
    with cryptdisk.open(data / "new.cdk", "wb",
                        keyring=Keyring.from_config(cfg).with_current(2)) as f:
        f.write(b"written under key 2")
    (data / "plain.txt").write_text("not encrypted")
    argv = ["keys", "promote", "2", "-c", cfg, "--db", str(db), str(data), "-v"]
    first = run(*argv)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    part = next(p for p in (tmp_path / "store").rglob("*") if p.is_file())
    named = sorted(line for line in lines if line.startswith(("rewrapped: ", "already ")))
    assert named == sorted([
        f"already under key 2: {data / 'new.cdk'}",
        "rewrapped: catalog",
        f"rewrapped: {data / 'f0.cdk'}",
        f"rewrapped: {data / 'f1.cdk'}",
        f"rewrapped: {part.relative_to(tmp_path / 'store' / 'secure')}",
    ])
    again = run(*argv)
    assert again.returncode == 0, again.stderr
    assert not any(line.startswith("rewrapped: ") for line in again.stdout.splitlines())
    assert sum(line.startswith("already under key 2: ") for line in again.stdout.splitlines()
               ) == 5
    assert "plain.txt" not in again.stdout


def test_a_database_without_a_config_keeps_its_older_spelling(tmp_path):
    db = tmp_path / "own.db"
    assert run("sql", str(db), "--create", "-q", "CREATE TABLE t (x INT)").returncode == 0
    old = run("keys", str(db), "--format", "csv")
    assert old.returncode == 0, old.stderr
    assert old.stdout.splitlines()[1] == "1,aes-256-gcm,file,true,1"
    listed = run("keys", "list", "--db", str(db), "--format", "csv")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].startswith("1,current,file,")
    current = run("keys", "destroy", "1", "--db", str(db))
    assert current.returncode == 1 and "current key" in current.stderr


def test_add_refuses_a_key_that_does_not_load_and_duplicate_ids(tmp_path):
    cfg, _ = setup(tmp_path, files=0)
    before = Path(cfg).read_text()
    missing = run("keys", "add", "3", "-c", cfg, "--env", "CD_NOT_SET_ANYWHERE")
    assert missing.returncode == 1 and "CD_NOT_SET_ANYWHERE" in missing.stderr
    dup = run("keys", "add", "1", "-c", cfg, "--generate", str(tmp_path / "k9.hex"))
    assert dup.returncode == 1 and "already has a key with id 1" in dup.stderr
    assert not (tmp_path / "k9.hex").exists()
    pin = run("keys", "add", "4", "-c", cfg, "--source", "pkcs11", "--set", "pin=1234",
              "--set", "module=/x.so", "--set", "token=t", "--set", "key=k")
    assert pin.returncode == 1 and "does not take pin" in pin.stderr
    assert "1234" not in pin.stderr
    assert Path(cfg).read_text() == before
    hexkey = Key.generate(5)
    from cryptdisk.keys import export_key_material

    ok = run("keys", "add", "5", "-c", cfg, "--env", "CD_K5",
             CD_K5=export_key_material(hexkey).hex())
    assert ok.returncode == 0, ok.stderr
    assert keyring_section(cfg)["keys"][-1] == {"id": 5, "from_env": "CD_K5"}
    # destroying a key whose material cryptdisk cannot reach says so and exits 1
    nowhere = run("keys", "retire", "5", "-c", cfg, str(tmp_path / "nothing-here"))
    assert nowhere.returncode == 1 and "no such file or directory" in nowhere.stderr
    (tmp_path / "nothing-here").mkdir()
    assert run("keys", "retire", "5", "-c", cfg, str(tmp_path / "nothing-here"),
               CD_K5="00" * 32).returncode == 0
    env_key = run("keys", "destroy", "5", "-c", cfg, str(tmp_path / "nothing-here"))
    assert env_key.returncode == 1
    assert "environment variable CD_K5" in env_key.stderr
    assert [k["id"] for k in keyring_section(cfg)["keys"]] == [1]


def test_add_generate_into_a_missing_directory_names_it(tmp_path):
    cfg, _ = setup(tmp_path, files=0)
    before = Path(cfg).read_text()
    done = run("keys", "add", "2", "-c", cfg, "--generate", "keys/k2.hex", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == (
        f"cryptdisk: error: cannot write the key file keys/k2.hex: the directory "
        f"{tmp_path / 'keys'} does not exist")
    assert "cryptdisk-new" not in done.stderr and "Traceback" not in done.stderr
    assert Path(cfg).read_text() == before and not (tmp_path / "keys").exists()
    (tmp_path / "keys").mkdir(mode=0o700)
    done = run("keys", "add", "2", "-c", cfg, "--generate", "keys/k2.hex", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert keyring_section(cfg)["keys"][-1] == {"id": 2, "file": "keys/k2.hex"}


def test_a_config_laid_out_otherwise_is_refused_unchanged(tmp_path):
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    write_key_file(tmp_path / "k2.hex", Key.generate(2))
    cfg = tmp_path / "inline.toml"
    text = ('keyring = { current_key_id = 1, keys = [{ id = 1, file = "k1.hex" }, '
            '{ id = 2, file = "k2.hex" }] }\n')
    cfg.write_text(text)
    (tmp_path / "none").mkdir()
    for args in (("promote", "2"), ("retire", "2", str(tmp_path / "none"))):
        r = run("keys", *args, "-c", str(cfg))
        assert r.returncode == 1, r.stdout
        assert "the config is unchanged" in r.stderr or "by hand" in r.stderr
        assert cfg.read_text() == text


def test_retired_keys_are_not_loaded_and_say_so(tmp_path):
    write_key_file(tmp_path / "k2.hex", Key.generate(2))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keyring]\ncurrent_key_id = 2\n[[keyring.keys]]\nid = 1\nstate = "retired"\n'
                   'from_env = "CD_UNSET_RETIRED"\n[[keyring.keys]]\nid = 2\nfile = "k2.hex"\n')
    ring = Keyring.from_config(cfg)  # the retired key's variable is not read
    assert ring.ids == [2] and ring.retired == {1}
    with pytest.raises(KeyNotFoundError, match="key 1 is retired"):
        ring.key_by_id(1)
    cfg.write_text(cfg.read_text().replace("current_key_id = 2", "current_key_id = 1"))
    with pytest.raises(ConfigError, match="names a retired key"):
        Keyring.from_config(cfg)
    cfg.write_text(cfg.read_text().replace('"retired"', '"gone"'))
    with pytest.raises(ConfigError, match="a key's state is"):
        Keyring.from_config(cfg)


def test_list_reports_a_source_no_provider_answers_to(tmp_path):
    """keys list loads no key, but a source = "NAME" that names no provider is the error
    loading the config gives: listed, then reported with a non-zero exit."""
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    cfg = tmp_path / "c.toml"
    cfg.write_text('[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\nfile = "k1.hex"\n'
                   '[[keyring.keys]]\nid = 2\nsource = "nosuch"\n')
    with pytest.raises(ConfigError, match="key 2: unknown source 'nosuch'"):
        Keyring.from_config(cfg)
    listed = run("keys", "list", "-c", str(cfg), "--format", "csv")
    assert listed.returncode == 1, listed
    assert "2,active,nosuch," in listed.stdout
    assert listed.stderr.strip().splitlines()[-1] == (
        f"cryptdisk: error: {cfg}: key 2: unknown source 'nosuch' (sources: aws-kms, kmip, "
        "pkcs11)")
    cfg.write_text(cfg.read_text().replace('"nosuch"', '"pkcs11"'))  # a known one lists
    assert run("keys", "list", "-c", str(cfg)).returncode == 0


def test_lifecycle_events_go_to_the_audit_log_without_material(tmp_path):
    cfg, data = setup(tmp_path)
    log = tmp_path / "audit.jsonl"
    extra = {AUDIT_ENV: str(log)}
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex"),
               **extra).returncode == 0
    assert run("keys", "promote", "2", "-c", cfg, str(data), **extra).returncode == 0
    assert run("keys", "retire", "1", "-c", cfg, str(data), **extra).returncode == 0
    assert run("keys", "destroy", "1", "-c", cfg, str(data), **extra).returncode == 0
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(e["event"], e["key_id"]) for e in events] == [
        ("add", 2), ("promote", 2), ("retire", 1), ("destroy", 1)]
    assert events[1]["previous"] == 1 and all(e["config"] == cfg for e in events)
    assert log.stat().st_mode & 0o777 == 0o600
    text = log.read_text()
    for name in ("k2.hex",):
        material = (tmp_path / name).read_text().split()[-1]
        assert material not in text


# -- kill -9 at every write of every step --------------------------------------------------


def _kill_at(n: int, args: list[str]) -> str:
    """Run the step with a pause before its n-th write; kill it there. The child's last line."""
    child = subprocess.Popen([sys.executable, CHILD, str(n), *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env())
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(("paused", "finished")):
                break
        else:
            raise AssertionError(f"the child ended without a report: {child.stderr.read()}")
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]
    return line.strip()


STEPS = [
    ("add", ["keys", "add", "2", "--generate", "K2"]),
    ("promote", ["keys", "promote", "2", "DATA"]),
    ("retire", ["keys", "retire", "1", "DATA"]),
    ("destroy", ["keys", "destroy", "1", "DATA"]),
]


def _state(cfg: str) -> str:
    """Which lifecycle state the config and key files are in (they must be consistent)."""
    ring = keyring_section(cfg)  # must parse
    keys = {k["id"]: k for k in ring["keys"]}
    if 2 not in keys:
        return "start"
    if ring["current_key_id"] == 1:
        return "added"
    if 1 not in keys:
        return "destroyed"
    return "retired" if keys[1].get("state") == "retired" else "promoted"


@pytest.mark.parametrize("step", range(len(STEPS)), ids=[s[0] for s in STEPS])
def test_kill_9_at_every_write_of_a_step_leaves_the_old_or_new_state(tmp_path, step):
    work, snapshot = tmp_path / "work", tmp_path / "snapshot"
    work.mkdir()
    cfg, data = setup(work)
    subs = {"K2": str(work / "k2.hex"), "DATA": str(data)}
    for name, args in STEPS[:step]:  # bring the config to this step's start
        done = run(*[subs.get(a, a) for a in args], "-c", cfg)
        assert done.returncode == 0, (name, done.stderr)
    shutil.copytree(work, snapshot)
    name, args = STEPS[step]
    argv = [subs.get(a, a) for a in args] + ["-c", cfg]
    before = _state(cfg)
    after = {"add": "added", "promote": "promoted", "retire": "retired",
             "destroy": "destroyed"}[name]
    kills = 0
    for n in range(1, 200):
        line = _kill_at(n, argv)
        if line.startswith("finished"):
            assert line == "finished 0"
            break
        kills += 1
        state = _state(cfg)
        assert state in (before, after), (n, line, state)
        # whatever state it is in, every file opens with the config's keys
        ring = Keyring.from_config(cfg)
        for path in data.iterdir():
            with cryptdisk.open(path, "rb", keyring=ring) as f:
                assert f.read().startswith(b"file ")
        ring.close()
        again = run(*argv)  # running the step again finishes it
        assert again.returncode == 0, (n, line, again.stderr)
        assert _state(cfg) == after
        shutil.rmtree(work)  # back to the step's start for the next kill point
        shutil.copytree(snapshot, work)
    else:
        raise AssertionError("the step never finished")
    assert kills >= 2  # at least the config's temporary file and its rename
    assert _state(cfg) == after


def _reported(line: str) -> bool:
    """A line of ``promote -v`` naming a file it is done with."""
    return line.startswith(("rewrapped: ", "already under key 2: "))


def _promote_db_killed_after(done: int, argv: list[str]) -> list[str]:
    """Run ``keys promote --db -v`` as a child; kill -9 it as soon as it reports its
    ``done``-th rewrapped file (0: once it reports the config's new current key). Its
    progress lines up to then."""
    child = subprocess.Popen([sys.executable, "-m", "cryptdisk", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env())
    seen: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            seen.append(line.strip())
            if line.startswith("key 2 is the current key") and done == 0:
                break
            if _reported(line) and sum(map(_reported, seen)) == done:
                break
        else:
            raise AssertionError(f"the child ended before file {done}: {seen} "
                                 f"{child.stderr.read()}")  # type: ignore[union-attr]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]
    return seen


def test_kill_9_during_promote_of_a_database_then_a_rerun_finishes(tmp_path):
    """``keys promote 2 --db`` is killed after each file it reports rewrapped: the database
    then reads every row with the config's keys, and running the command again rewraps
    what was left, leaving every file (parts and catalog) under key 2."""
    work, snapshot = tmp_path / "work", tmp_path / "snapshot"
    work.mkdir()
    cfg, _ = setup(work, files=0)
    db = work / "sales.db"
    with cryptdisk.connect(db, cfg) as conn:
        conn.sql("CREATE TABLE t (x BIGINT)")
        for i in range(5):  # a part each
            conn.sql(f"INSERT INTO t SELECT range FROM range({i * 100}, {(i + 1) * 100})")
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(work / "k2.hex")
               ).returncode == 0
    files = 6  # the parts and the catalog
    shutil.copytree(work, snapshot)
    argv = ["keys", "promote", "2", "-c", cfg, "--db", str(db), "-v"]
    left_by_reruns = []
    for done in range(files):
        seen = _promote_db_killed_after(done, argv)
        assert sum(map(_reported, seen)) == done
        with cryptdisk.connect(db, cfg, read_only=True) as conn:  # old or new key per file
            assert conn.sql("SELECT count(*) AS n, sum(x) AS s FROM t").to_pylist() == [
                {"n": 500, "s": 499 * 500 // 2}]
        again = run(*argv)
        assert again.returncode == 0, (done, again.stderr)
        rewrapped = int(again.stdout.split("rewrapped ")[1].split()[0])
        assert rewrapped <= files - done
        left_by_reruns.append(rewrapped)
        with cryptdisk.connect(db, cfg) as conn:
            assert conn.sql("SELECT count(*) AS n, sum(x) AS s FROM t").to_pylist() == [
                {"n": 500, "s": 499 * 500 // 2}]
            assert conn.files_under_key(1) == [] and len(conn.files_under_key(2)) == files
        parts = [p for p in (work / "store").rglob("*") if p.is_file()]
        assert len(parts) == files - 1
        assert all(Header.parse(p.read_bytes()[:128]).key_id == 2 for p in parts)
        shutil.rmtree(work)  # back to before the promote for the next kill point
        shutil.copytree(snapshot, work)
    print("files the reruns rewrapped, per kill point:", left_by_reruns)
    assert any(0 < n < files for n in left_by_reruns)  # some kill landed mid-rotation


def test_promote_to_a_missing_database_or_path_changes_nothing(tmp_path):
    """A typo in --db or a PATH made the key current and then failed ('no cryptdisk
    database at ...', 'N failed'), leaving the config changed and nothing rewrapped; now
    promote checks them first, as retire does, and the config stays as it was."""
    cfg, data = setup(tmp_path)
    assert run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex")
               ).returncode == 0
    before = Path(cfg).read_text()
    for argv, says in ((["--db", str(tmp_path / "typo.db")],
                        f"no cryptdisk database at {tmp_path / 'typo.db'}"),
                       ([str(data), str(tmp_path / "nothere")],
                        f"{tmp_path / 'nothere'}: no such file or directory")):
        done = run("keys", "promote", "2", "-c", cfg, *argv)
        assert done.returncode == 1, done.stderr
        assert says in done.stderr, done.stderr
        assert "is the current key" not in done.stdout
        assert Path(cfg).read_text() == before
        assert key_ids(data) == [1, 1, 1]


def test_edits_by_two_processes_at_once_are_all_kept(tmp_path):
    """Two edits made from the same read of the config (two ``cryptdisk keys add`` at
    once): the second wrote its copy over the first's, so 'added key 2' was said and key 2
    was gone from the config; and 'retire 2' made beside 'promote 2' retired the key that
    had become current. Now each edit is made again on the file as it is when it writes."""
    from cryptdisk.keys._lifecycle import KeyConfig

    cfg, _ = setup(tmp_path, files=0)
    for n in (2, 3, 4):
        write_key_file(tmp_path / f"k{n}.hex", Key.generate(n))
    first, second = KeyConfig(cfg), KeyConfig(cfg)  # both read before either writes
    first.add({"id": 2, "file": "k2.hex"})
    second.add({"id": 3, "file": "k3.hex"})
    assert [k["id"] for k in keyring_section(cfg)["keys"]] == [1, 2, 3]
    assert "# the first key" in Path(cfg).read_text()  # the layout survives the redo
    stale = KeyConfig(cfg)
    KeyConfig(cfg).promote(2)
    with pytest.raises(cryptdisk.KeyringError, match="key 2 is the current key"):
        stale.retire(2)  # its check is made again on the config as it is now
    assert keyring_section(cfg)["current_key_id"] == 2
    assert "state" not in keyring_section(cfg)["keys"][1]
    # and with real processes: every add that says it added its key did
    procs = [subprocess.Popen([sys.executable, "-m", "cryptdisk", "keys", "add", str(n), "-c",
                               cfg, "--generate", str(tmp_path / f"g{n}.hex")],
                              env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for n in range(10, 16)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    assert sorted(k["id"] for k in keyring_section(cfg)["keys"]) == [1, 2, 3, *range(10, 16)]
    Keyring.from_config(cfg)  # and the config loads


_DIES_DURING_AN_EDIT = """
import cryptdisk.keys._lifecycle as lifecycle
lifecycle.atomic_write_text = lambda path, text: fork_and_die()  # the config locked
lifecycle.KeyConfig(sys.argv[1]).add({"id": 2, "file": "k2.hex"})
"""


def test_a_forked_child_does_not_keep_the_edit_lock_of_a_dead_edit(tmp_path):
    """An edit of the config holds an flock of its directory while it writes. A process
    forked during the edit shared that open file: after the edit died the child kept the
    flock, and every `cryptdisk keys add|promote|retire|destroy` of a config in that
    directory waited for the child to exit. The child now closes its copy as it starts."""
    import fcntl

    from tests.forked import child_of_a_dead_holder

    cfg, _ = setup(tmp_path, files=0)
    for n in (2, 3):
        write_key_file(tmp_path / f"k{n}.hex", Key.generate(n))
    with child_of_a_dead_holder(_DIES_DURING_AN_EDIT, cfg, env=env()):
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError before
        finally:
            os.close(fd)
        done = run("keys", "add", "3", "-c", cfg, "--file", str(tmp_path / "k3.hex"))
        assert done.returncode == 0, done.stderr
    assert [k["id"] for k in keyring_section(cfg)["keys"]] == [1, 3]


def test_retire_and_destroy_refuse_the_names_key_of_an_encrypted_disk(tmp_path):
    """A disk with encrypt_names derives its names key from names_key_id for its life:
    retiring that key made the config unloadable, and destroying it lost every name on
    the disk, though no file's header was under it any more."""
    write_key_file(tmp_path / "k1.hex", Key.generate(1))
    write_key_file(tmp_path / "k2.hex", Key.generate(2))
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace('disk = "secure_local"\n',
                                  'disk = "secure_local"\nencrypt_names = true\n'
                                  'names_key_id = 1\n'))
    fs = cryptdisk.fs.CryptdiskFileSystem(config=str(cfg), skip_instance_cache=True)
    with fs.open("secure/dir/a.txt", "wb") as f:
        f.write(b"named")
    store = str(tmp_path / "store")
    assert run("keys", "add", "2", "-c", str(cfg), "--file", "k2.hex", cwd=tmp_path).returncode == 0
    assert run("keys", "promote", "2", "-c", str(cfg), store).returncode == 0
    refused = run("keys", "retire", "1", "-c", str(cfg), store)
    assert refused.returncode == 1, refused
    assert "key 1 is the names key (names_key_id) of disk 'secure'" in refused.stderr
    assert keyring_section(str(cfg))["keys"][0].get("state") is None
    text = cfg.read_text()
    cfg.write_text(text.replace('file = "k1.hex"', 'state = "retired"\nfile = "k1.hex"'))
    refused = run("keys", "destroy", "1", "-c", str(cfg), store)  # (retired by hand)
    assert refused.returncode == 1, refused
    assert "key 1 is the names key (names_key_id) of disk 'secure'" in refused.stderr
    assert (tmp_path / "k1.hex").exists()
    cfg.write_text(text)
    fs = cryptdisk.fs.CryptdiskFileSystem(config=str(cfg), skip_instance_cache=True)
    assert fs.cat("secure/dir/a.txt") == b"named"
    # the disk's keys named by id (keys = [1, 2]), as disks.md shows it
    cfg.write_text(text.replace("names_key_id = 1\n", "names_key_id = 1\nkeys = [1, 2]\n"))
    refused = run("keys", "retire", "1", "-c", str(cfg), store)
    assert "key 1 is the names key (names_key_id) of disk 'secure'" in refused.stderr
    # a disk's own key by that id is not the keyring's
    cfg.write_text(text.replace("names_key_id = 1\n", "names_key_id = 1\nkeys = [2, "
                                "{ id = 1, file = \"k1.hex\" }]\n"))
    assert run("keys", "retire", "1", "-c", str(cfg), store).returncode == 0


def test_retire_refuses_a_key_a_disk_names_by_id(tmp_path):
    """A retired key is not loaded, so a disk that lists it in keys, or has it as its
    current_key_id, made the config unloadable once retire had succeeded."""
    cfg, data = setup(tmp_path)
    added = run("keys", "add", "2", "-c", cfg, "--generate", str(tmp_path / "k2.hex"))
    assert added.returncode == 0
    assert run("keys", "promote", "2", "-c", cfg, str(data)).returncode == 0
    text = Path(cfg).read_text()
    for setting, line in (("keys", "keys = [1, 2]\ncurrent_key_id = 2\n"),
                          ("current_key_id", "current_key_id = 1\n")):
        Path(cfg).write_text(text.replace('disk = "secure_local"\n',
                                          f'disk = "secure_local"\n{line}'))
        refused = run("keys", "retire", "1", "-c", cfg, str(data))
        assert refused.returncode == 1, refused
        assert f"disk 'secure' names key 1 in its {setting}" in refused.stderr
        assert Keyring.from_config(cfg).ids == [1, 2]  # unchanged, and loads


def test_destroy_of_a_hex_key_leaves_no_copy_in_a_killed_edits_temporary_file(tmp_path):
    """An edit killed after writing the config's temporary file left it beside the config,
    with the config's text: a hex key's material stayed there after destroy said it was
    gone. Each edit (under the edit lock, so no other edit is live) deletes such files."""
    material = Key.generate(1)
    hex_material = (tmp_path / "tmp.hex")
    write_key_file(hex_material, material)
    secret = hex_material.read_text().split()[-1]
    hex_material.unlink()
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.replace('file = "k1.hex"   # made by cryptdisk keygen',
                                  f'hex = "{secret}"'))
    cfg.chmod(0o600)
    data = tmp_path / "data"
    data.mkdir()
    with cryptdisk.open(data / "f.cdk", "wb", keyring=Keyring.from_config(cfg)) as f:
        f.write(b"file 0")
    assert run("keys", "add", "2", "-c", str(cfg), "--generate",
               str(tmp_path / "k2.hex")).returncode == 0
    line = _kill_at(2, ["keys", "promote", "2", str(data), "-c", str(cfg)])
    assert line == "paused 2 fsync", line  # the temporary file written whole, then killed
    assert any(secret in p.read_text() for p in tmp_path.glob(".c.toml.*.tmp"))
    for verb in ("promote", "retire", "destroy"):
        done = run("keys", verb, "1" if verb != "promote" else "2", "-c", str(cfg), str(data))
        assert done.returncode == 0, (verb, done.stderr)
    left = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert left == []


def test_a_clickhouse_xml_config_is_refused_by_name(tmp_path):
    """The lifecycle edits TOML; an XML config (which the rest of cryptdisk takes) was
    refused as "not valid TOML: Invalid statement"."""
    xml = tmp_path / "storage.xml"
    xml.write_text("<clickhouse><storage_configuration><disks><d><type>local</type>"
                   f"<path>{tmp_path}/d/</path></d></disks></storage_configuration>"
                   "</clickhouse>\n")
    xml.chmod(0o600)
    for argv in (["list"], ["add", "2", "--generate", str(tmp_path / "k2.hex")],
                 ["retire", "1", str(tmp_path)]):
        refused = run("keys", *argv, "-c", str(xml))
        assert refused.returncode == 1, refused
        assert "a ClickHouse XML config's keys are its disks' and edited by hand" in \
            refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
    assert not (tmp_path / "k2.hex").exists()

"""cryptdisk backup init|create|list|verify|restore|prune|keys as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cryptdisk
from cryptdisk.keys import Key, write_key_file

from .helpers import content, make_db

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, PYTHONPATH=SRC, BK_PASS="hunter2", BK_OTHER="other pass",
             BK_WRONG="nope", **(env or {}))
    return subprocess.run([sys.executable, "-m", "cryptdisk", "backup", *argv],
                          capture_output=True, text=True, env=e, timeout=300)


def test_cli_round_trip(tmp_path: Path) -> None:
    src, repo = tmp_path / "a.db", str(tmp_path / "repo")
    make_db(src, rows=3000)
    r = run("init", repo, "--passphrase-env", "BK_PASS")
    assert r.returncode == 0, r.stderr
    r = run("create", repo, str(src), "--passphrase-env", "BK_PASS", "--json")
    assert r.returncode == 0, r.stderr
    bid = json.loads(r.stdout)["id"]
    r = run("list", repo, "--passphrase-env", "BK_PASS", "--json")
    assert [b["id"] for b in json.loads(r.stdout)] == [bid]
    r = run("verify", repo, "--passphrase-env", "BK_PASS")
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r.stderr
    r = run("verify", repo, "--passphrase-env", "BK_PASS", "--sample", "50%")
    assert r.returncode == 0 and " of " in r.stdout, r.stderr
    r = run("verify", repo, "--passphrase-env", "BK_PASS", "--sample", "0")
    assert r.returncode == 2 and "percentage in (0, 100]" in r.stderr
    r = run("restore", repo, "latest", str(tmp_path / "r.db"), "--passphrase-env", "BK_PASS")
    assert r.returncode == 0, r.stderr
    assert content(tmp_path / "r.db") == content(src)

    r = run("keys", repo, "--passphrase-env", "BK_PASS", "--add-passphrase-env", "BK_OTHER")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("passphrase (argon2id") == 2
    assert run("list", repo, "--passphrase-env", "BK_OTHER").returncode == 0

    r = run("list", repo, "--passphrase-env", "BK_WRONG")
    assert r.returncode == 1
    assert "error: wrong passphrase for this backup repository" in r.stderr
    assert "Traceback" not in r.stderr
    r = run("list", repo)
    assert r.returncode == 1 and "locked" in r.stderr

    chunk = next(p for p in (tmp_path / "repo" / "chunks").rglob("*") if p.is_file())
    chunk.unlink()
    r = run("verify", repo, "--passphrase-env", "BK_PASS")
    assert r.returncode == 1
    assert f"chunk {chunk.name}: missing; affects backups {bid}" in r.stdout

    r = run("prune", repo, "--passphrase-env", "BK_PASS", "--keep-last", "1")
    assert r.returncode == 0 and "deleted 0 backup(s)" in r.stdout, r.stderr


def test_cli_sqlite_with_keyring_wrapping(tmp_path: Path) -> None:
    import cryptdisk.sqlite
    from cryptdisk.keys import Key, Keyring, key_from_file, write_key_file

    key = tmp_path / "db.key"
    write_key_file(key, os.urandom(32))
    kr = Keyring.single(Key(1, key_from_file(key)))
    c = cryptdisk.sqlite.connect(tmp_path / "app.db", keyring=kr)
    c.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1), (2)")
    c.close()
    repo_key = tmp_path / "repo.key"
    write_key_file(repo_key, os.urandom(32))
    repo = str(tmp_path / "repo")
    opts = ["--repo-key-file", str(repo_key)]
    assert run("init", repo, *opts).returncode == 0
    r = run("create", repo, str(tmp_path / "app.db"), *opts, "--key-file", str(key))
    assert r.returncode == 0, r.stderr
    r = run("restore", repo, "latest", str(tmp_path / "r.db"), *opts, "--key-file", str(key))
    assert r.returncode == 0, r.stderr
    c = cryptdisk.sqlite.connect(tmp_path / "r.db", keyring=kr)
    assert c.execute("SELECT x FROM t ORDER BY x").fetchall() == [(1,), (2,)]
    c.close()
    other = tmp_path / "other.key"
    write_key_file(other, os.urandom(32))
    r = run("list", repo, "--repo-key-file", str(other))
    assert r.returncode == 1 and "none of the given keyring keys" in r.stderr


def test_restore_names_the_new_key_where_it_ends_up(tmp_path: Path) -> None:
    """A database restored without --config gets a new key in TARGET.key: the message
    names that file (not the work-in-progress name it was made under)."""
    src, repo = tmp_path / "a.db", str(tmp_path / "repo")
    make_db(src, rows=100)
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    assert run("create", repo, str(src), "--passphrase-env", "BK_PASS").returncode == 0
    target = tmp_path / "r.db"
    r = run("restore", repo, "latest", str(target), "--passphrase-env", "BK_PASS")
    assert r.returncode == 0, r.stderr
    assert "restoring-" not in r.stdout + r.stderr
    assert f"the new key of {target} is in {target}.key (mode 0600)" in r.stderr
    assert content(target) == content(src)


def test_restoring_sqlite_without_keys_says_what_is_needed(tmp_path: Path) -> None:
    import cryptdisk.sqlite
    from cryptdisk.keys import Key, Keyring, key_from_file, write_key_file

    key = tmp_path / "db.key"
    write_key_file(key, os.urandom(32))
    c = cryptdisk.sqlite.connect(tmp_path / "app.db",
                                 keyring=Keyring.single(Key(1, key_from_file(key))))
    c.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
    c.close()
    repo = str(tmp_path / "repo")
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    r = run("create", repo, str(tmp_path / "app.db"), "--passphrase-env", "BK_PASS",
            "--key-file", str(key))
    assert r.returncode == 0, r.stderr
    r = run("restore", repo, "latest", str(tmp_path / "r.db"), "--passphrase-env", "BK_PASS")
    assert r.returncode == 1 and not (tmp_path / "r.db").exists()
    first = r.stderr.splitlines()[0]
    assert first.startswith("cryptdisk: error: backup ") and "is of a SQLite database" in first
    assert "--config CONFIG or --key-file FILE" in r.stderr


def test_cli_refuses_credentials_in_the_repository_url_or_options(tmp_path: Path) -> None:
    secret = "s3cr3t-do-not-leak"
    for argv in (["init", f"memory://user:{secret}@bucket/repo"],
                 ["init", "memory://bucket/repo", "--repo-option",
                  f"endpoint_url=http://AKID:{secret}@127.0.0.1:9000"],
                 ["list", f"memory://user:{secret}@bucket/repo"]):
        r = run(*argv, "--passphrase-env", "BK_PASS")
        assert r.returncode == 1, r.stderr
        assert "may not hold credentials" in r.stderr and "Traceback" not in r.stderr
        assert secret not in r.stderr + r.stdout


def test_a_plain_file_and_a_file_for_a_repository_are_named_for_what_they_are(
        tmp_path: Path) -> None:
    """`create` of an unencrypted file says it is not encrypted (not that no key was
    given), with or without keys; `init` on a file says it is not a directory."""
    repo, plain = str(tmp_path / "repo"), tmp_path / "notes.txt"
    plain.write_text("id,name\n1,alice\n")
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    key = tmp_path / "k.hex"
    key.write_text("00" * 32 + "\n")
    key.chmod(0o600)
    for keys in ([], ["--key-file", str(key)]):
        r = run("create", repo, str(plain), "--passphrase-env", "BK_PASS", *keys)
        assert r.returncode == 1
        assert r.stderr == (
            f"cryptdisk: error: {plain} is not encrypted (no cryptdisk header): backups are of "
            "cryptdisk databases (a directory) and encrypted SQLite databases\n"
            "cryptdisk: hint: encrypt a plain SQLite database first: cryptdisk sqlite encrypt "
            "SRC DST\n"), keys
    r = run("init", str(plain), "--passphrase-env", "BK_PASS")
    assert r.returncode == 1
    assert r.stderr == (f"cryptdisk: error: {plain} is a file, not a directory: a backup "
                        "repository is a directory\ncryptdisk: hint: give a new path or an "
                        "empty directory\n")
    assert plain.read_text() == "id,name\n1,alice\n"
    # a file given as the repository of the other commands: 'PATH/config: Not a
    # directory' before
    db = tmp_path / "db"
    make_db(db, rows=10)
    for argv in (["list", str(plain)], ["create", str(plain), str(db)],
                 ["restore", str(plain), "latest", str(tmp_path / "out")],
                 ["verify", str(plain)], ["prune", str(plain), "--keep-last", "1"]):
        r = run(*argv, "--passphrase-env", "BK_PASS")
        assert r.returncode == 1, argv
        assert r.stderr == (f"cryptdisk: error: {plain} is a file, not a backup repository "
                            "(a directory)\ncryptdisk: hint: give the repository's "
                            "directory (or URL)\n"), (argv, r.stderr)
    assert plain.read_text() == "id,name\n1,alice\n" and not (tmp_path / "out").exists()


def test_a_repository_wrapped_by_a_rotated_keyring_key_says_so_until_rewrapped(
        tmp_path: Path) -> None:
    """A repository opened through a keyring key that is no longer the config's current key
    warns (with the command that wraps it under the current key), so the old key is not
    retired and destroyed with the repository's only wrapping; after that command, the
    repository opens with the config alone once the old key is destroyed."""
    cfg, repo = tmp_path / "c.toml", str(tmp_path / "repo")
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    cfg.write_text("[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\n"
                   'file = "keys/k1.hex"\n')

    def keys_cmd(*argv: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([sys.executable, "-m", "cryptdisk", "keys", *argv, "-c", str(cfg)],
                           capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, PYTHONPATH=SRC))
        assert r.returncode == 0, r.stderr
        return r

    write_key_file(keys / "k1.hex", Key.generate(1))
    r = run("init", repo, "--repo-keyring", str(cfg))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    keys_cmd("add", "2", "--generate", str(keys / "k2.hex"))
    keys_cmd("promote", "2")
    r = run("list", repo, "--repo-keyring", str(cfg))
    assert r.returncode == 0, r.stderr
    assert "warning: keyring key 2, the current key" in r.stderr
    assert f"cryptdisk backup keys {repo} --repo-keyring {cfg} --add-keyring {cfg}" in r.stderr
    r = run("keys", repo, "--repo-keyring", str(cfg), "--add-keyring", str(cfg))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    assert "keyring key id 2" in r.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    keys_cmd("retire", "1", str(empty))
    keys_cmd("destroy", "1", str(empty))
    r = run("list", repo, "--repo-keyring", str(cfg))
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


def test_a_database_backup_refuses_a_single_key_instead_of_ignoring_it(
        tmp_path: Path) -> None:
    """--key-file/--key-env/--key-hex give a SQLite file's key; a database takes --config
    (or its PATH.key). Given for a database, they are refused, not passed over: a restore
    would otherwise make a new key in TARGET.key, not the one asked for, and exit 0."""
    src, repo, key = tmp_path / "a.db", str(tmp_path / "repo"), tmp_path / "other.key"
    make_db(src, rows=100)
    write_key_file(key, Key.generate(1))
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    r = run("create", repo, str(src), "--passphrase-env", "BK_PASS", "--key-file", str(key))
    assert r.returncode == 1 and "--key-file" in r.stderr and "--config" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert run("create", repo, str(src), "--passphrase-env", "BK_PASS").returncode == 0
    r = run("restore", repo, "latest", str(tmp_path / "r.db"), "--passphrase-env", "BK_PASS",
            "--key-file", str(key))
    assert r.returncode == 1 and "--key-file" in r.stderr and "--config" in r.stderr, r.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("r.db")]


def test_a_store_that_is_down_or_refuses_its_options_is_an_error_not_a_traceback(
        tmp_path: Path) -> None:
    """S3 on a loopback port where nothing listens, and a storage option the store does not
    take: 'cryptdisk: error: ...' naming the repository, exit status 1."""
    import socket

    with socket.socket() as s:  # a free port: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_MAX_ATTEMPTS": "1"}
    endpoint = f"endpoint_url=http://127.0.0.1:{port}"
    for extra in ([], ["--repo-option", "no_such_option=1"]):
        r = run("list", "s3://bucket/repo", "--passphrase-env", "BK_PASS", "--repo-option",
                endpoint, *extra, env=env)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        first = r.stderr.splitlines()[0]
        assert first.startswith("cryptdisk: error: s3://bucket/repo: "), first
        assert "testing" not in r.stderr


def test_restore_latest_names_the_source_when_the_repository_holds_several(
        tmp_path: Path) -> None:
    a, b, repo = tmp_path / "a.db", tmp_path / "b.db", str(tmp_path / "repo")
    make_db(a, rows=30)
    make_db(b, rows=40)
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    for src in (a, b):
        r = run("create", repo, str(src), "--passphrase-env", "BK_PASS")
        assert r.returncode == 0, r.stderr
    r = run("restore", repo, "latest", str(tmp_path / "r.db"), "--passphrase-env", "BK_PASS")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(a) in r.stderr and str(b) in r.stderr and "--source" in r.stderr
    assert not (tmp_path / "r.db").exists()
    r = run("restore", repo, "latest", str(tmp_path / "r.db"), "--source", str(a),
            "--passphrase-env", "BK_PASS")
    assert r.returncode == 0, r.stderr
    assert content(tmp_path / "r.db") == content(a)


def test_init_refuses_a_missing_bucket_unless_asked_to_create_it(tmp_path: Path) -> None:
    """A typo in the bucket name is an error, not a new bucket; --create-bucket creates it.
    S3 is moto's server on loopback (its buckets live as long as this process: the names
    are this test's own)."""
    import s3fs

    from tests.disks.s3server import ENV, make_bucket, s3_server

    with s3_server() as endpoint:
        make_bucket(endpoint, "cli-backups")
        env = dict(ENV, AWS_EC2_METADATA_DISABLED="true")
        opts = ("--passphrase-env", "BK_PASS", "--repo-option", f"endpoint_url={endpoint}")
        r = run("init", "s3://bakcups/repo", *opts, env=env)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert r.stderr.startswith("cryptdisk: error: "), r.stderr
        assert "bucket bakcups does not exist" in r.stderr and "--create-bucket" in r.stderr
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
        assert "bakcups" not in fs.ls("")
        r = run("init", "s3://cli-backups/repo", *opts, env=env)  # an existing bucket
        assert r.returncode == 0, r.stderr
        r = run("init", "s3://cli-new-bucket/repo", *opts, "--create-bucket", env=env)
        assert r.returncode == 0, r.stderr
        fs.invalidate_cache()
        assert "cli-new-bucket" in fs.ls("")
        for url in ("s3://cli-backups/repo", "s3://cli-new-bucket/repo"):
            r = run("list", url, *opts, env=env)
            assert r.returncode == 0 and "no backups" in r.stdout, r.stderr


def test_a_part_missing_from_the_source_names_a_way_to_check_that_exists(
        tmp_path: Path) -> None:
    db = cryptdisk.connect(tmp_path / "a.db")
    db.sql("CREATE TABLE t (id BIGINT)")
    db.sql("INSERT INTO t SELECT range FROM range(10)")
    (tmp_path / "a.db" / "data" / db.table("t").parts[0].path).unlink()
    db.close()
    repo = str(tmp_path / "repo")
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    p = run("create", repo, str(tmp_path / "a.db"), "--passphrase-env", "BK_PASS")
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "is missing (catalog version" in p.stderr and "damaged" in p.stderr
    assert "cryptdisk check" not in p.stderr  # no such command
    assert "check()" in p.stderr and "restore" in p.stderr


def _file_size_limit(limit: int):  # type: ignore[no-untyped-def]
    """A disk that fills up after ``limit`` bytes of a file, for an unprivileged test:
    writes past it fail with EFBIG (Python ignores SIGXFSZ), as ENOSPC fails them."""
    import resource

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_full_disk_during_a_sqlite_backup_or_restore_is_an_error_naming_the_file(
        tmp_path: Path) -> None:
    """SQLite's SQLITE_FULL / SQLITE_IOERR while the snapshot or the restored file is
    written is a one-line error naming the file, not 'internal error: FullError'."""
    import cryptdisk.sqlite
    from cryptdisk.keys import Keyring, key_from_file

    key = tmp_path / "db.key"
    write_key_file(key, os.urandom(32))
    kr = Keyring.single(Key(1, key_from_file(key)))
    c = cryptdisk.sqlite.connect(tmp_path / "app.db", keyring=kr)
    c.execute("CREATE TABLE t(x)")
    c.executemany("INSERT INTO t VALUES (?)", [("x" * 1000,) for _ in range(2000)])
    c.close()
    repo = str(tmp_path / "repo")
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    argv = ["create", repo, str(tmp_path / "app.db"), "--passphrase-env", "BK_PASS",
            "--key-file", str(key)]
    e = dict(os.environ, PYTHONPATH=SRC, BK_PASS="hunter2")
    full = subprocess.run([sys.executable, "-m", "cryptdisk", "backup", *argv],
                          capture_output=True, text=True, env=e, timeout=300,
                          preexec_fn=_file_size_limit(1 << 20))
    assert full.returncode == 1
    assert "internal error" not in full.stderr and "Traceback" not in full.stderr
    assert "app.db.backup-" in full.stderr and "no backup was taken" in full.stderr
    assert not [n for n in os.listdir(tmp_path) if ".backup-" in n]
    assert run("list", repo, "--passphrase-env", "BK_PASS").stdout == "no backups\n"

    assert run(*argv).returncode == 0
    target = tmp_path / "r.db"
    argv = ["restore", repo, "latest", str(target), "--passphrase-env", "BK_PASS",
            "--key-file", str(key)]
    full = subprocess.run([sys.executable, "-m", "cryptdisk", "backup", *argv],
                          capture_output=True, text=True, env=e, timeout=300,
                          preexec_fn=_file_size_limit(1 << 20))
    assert full.returncode == 1
    assert "internal error" not in full.stderr and "Traceback" not in full.stderr
    assert full.stderr.startswith(f"cryptdisk: error: {target}.restoring-"), full.stderr
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("r.db")) == []
    r = run(*argv)
    assert r.returncode == 0, r.stderr


def test_repo_options_are_typed_and_a_nested_credential_is_refused(tmp_path: Path) -> None:
    """--repo-option values were all strings: a dict option (config_kwargs) was an
    'internal error: AttributeError', anon=false was the true string "false", and a
    credential inside a JSON dict escaped the credential check as a string. Now TOML (or
    JSON) values are typed; S3 is moto's server on loopback."""
    from tests.disks.s3server import ENV, make_bucket, s3_server

    with s3_server() as endpoint:
        make_bucket(endpoint, "typed-options")
        env = dict(ENV, AWS_EC2_METADATA_DISABLED="true")
        url = "s3://typed-options/repo"
        base = ("--passphrase-env", "BK_PASS", "--repo-option", f"endpoint_url={endpoint}")
        r = run("init", url, *base, "--repo-option", 'config_kwargs={ signature_version = '
                '"s3v4" }', "--repo-option", "anon=false", env=env)
        assert r.returncode == 0, r.stderr
        for value in ('config_kwargs={"signature_version": "s3v4"}', "max_concurrency=2",
                      "use_ssl=false"):
            r = run("list", url, *base, "--repo-option", value, env=env)
            assert r.returncode == 0 and "no backups" in r.stdout, (value, r.stderr)
        for value in ('client_kwargs={"aws_secret_access_key": "zz-secret-zz"}',
                      'client_kwargs={ aws_secret_access_key = "zz-secret-zz" }'):
            r = run("list", url, *base, "--repo-option", value, env=env)
            assert r.returncode == 1, r.stderr
            assert "'aws_secret_access_key' looks like a credential" in r.stderr, r.stderr
            assert "zz-secret-zz" not in r.stderr
        r = run("list", url, *base, "--repo-option", "config_kwargs={not json zz-secret-zz",
                env=env)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert "--repo-option config_kwargs: the value is neither" in r.stderr
        assert "zz-secret-zz" not in r.stderr
        r = run("list", url, *base, "--repo-option", "config_kwargs=plain", env=env)
        assert r.returncode == 1 and "internal error" not in r.stderr, r.stderr
        assert r.stderr.startswith(f"cryptdisk: error: {url}: the store failed"), r.stderr


def test_restore_refuses_a_target_whose_directory_does_not_exist(tmp_path: Path) -> None:
    """Like `backup init`, a restore does not turn a typo into new directories: a TARGET
    whose directory is missing (or is a file) is refused, naming it, and nothing is made."""
    src, repo = tmp_path / "a.db", str(tmp_path / "repo")
    make_db(src, rows=10)
    assert run("init", repo, "--passphrase-env", "BK_PASS").returncode == 0
    assert run("create", repo, str(src), "--passphrase-env", "BK_PASS").returncode == 0
    (tmp_path / "file").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    for parent, what in ((tmp_path / "nope" / "deeper", "does not exist"),
                         (tmp_path / "file", "is not a directory")):
        target = parent / "t1.db"
        r = run("restore", repo, "latest", str(target), "--passphrase-env", "BK_PASS")
        assert r.returncode == 1, r.stderr
        assert f"cannot restore to {target}: its directory {parent} {what}" in r.stderr
        assert "create the directory first" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "nope").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_create_bucket_with_an_invalid_name_names_the_bucket(tmp_path: Path) -> None:
    """S3 refuses the name with a bare "The specified bucket is not valid."; the error
    names the URL and the bucket, and the hint what a bucket name may be."""
    from tests.disks.s3server import ENV, s3_server

    with s3_server() as endpoint:
        env = dict(ENV, AWS_EC2_METADATA_DISABLED="true")
        r = run("init", "s3://ab/repo", "--passphrase-env", "BK_PASS", "--repo-option",
                f"endpoint_url={endpoint}", "--create-bucket", env=env)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("cryptdisk: error: s3://ab/repo: cannot create bucket ab: "
                               "The specified bucket is not valid."), r.stderr
    assert "cryptdisk: hint: check the bucket's name (S3: 3 to 63" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_repo_option_that_looks_like_a_toml_date_stays_the_string_given(
        tmp_path: Path) -> None:
    """--repo-option values are read as TOML: key_prefix=2026-01-01 became a date object
    (07:30:00 a time), which no store takes. Now a date or time stays the text given, at
    the top level and inside a table or array."""
    import argparse

    from cryptdisk.cli.backup import _options

    given = ["prefix=2026-01-01", "at=07:30:00", "when=1979-05-27T07:32:00Z",
             "tags={ day = 2026-01-02 }", "days=[2026-01-03]", "anon=false", "n=4",
             "endpoint_url=http://127.0.0.1:9/"]
    opts = _options(argparse.Namespace(repo_option=given))
    assert opts == {"prefix": "2026-01-01", "at": "07:30:00",
                    "when": "1979-05-27T07:32:00Z", "tags": {"day": "2026-01-02"},
                    "days": ["2026-01-03"], "anon": False, "n": 4,
                    "endpoint_url": "http://127.0.0.1:9/"}


def test_a_repository_and_a_restored_database_make_everything_owner_only(
        tmp_path: Path) -> None:
    """Under umask 022 a restored database's data/ directories (made by its local disk)
    were 0755 inside its 0700 directory. Now every directory a repository, a backup or a
    restore makes is 0700 and every file 0600 (the database's are checked too)."""
    import stat

    src, repo, target = tmp_path / "a.db", tmp_path / "repo", tmp_path / "r.db"
    old = os.umask(0o022)
    try:
        make_db(src, rows=500)
        for argv in (("init", str(repo)), ("create", str(repo), str(src)),
                     ("restore", str(repo), "latest", str(target))):
            r = run(*argv, "--passphrase-env", "BK_PASS")
            assert r.returncode == 0, r.stderr
    finally:
        os.umask(old)
    for top in (repo, target, src):
        made = [top, *top.rglob("*")]
        assert any(p.is_dir() for p in made[1:]) and any(p.is_file() for p in made)
        wrong = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode))
                 for p in made
                 if stat.S_IMODE(p.stat().st_mode) != (0o700 if p.is_dir() else 0o600)}
        assert not wrong, wrong
    assert stat.S_IMODE((tmp_path / "r.db.key").stat().st_mode) == 0o600

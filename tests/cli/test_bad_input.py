"""Bad input as users give it, to every command, run as a user runs it (subprocess).

Each case must end with a clear error: a non-zero status, ``cryptdisk: error: ...`` (or
argparse's ``cryptdisk CMD: error: ...`` and status 2 for a malformed argument), no
Python traceback, no "internal error", no key material, and no new file left behind.
The cases run in a copy of one small workspace: a key file, a config, an encrypted file,
an embedded database and an encrypted SQLite database, plus the usual wrong things
(a file that is not encrypted, a truncated one, a directory, a config with a typo).
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "cryptdisk"]
SRC = Path(__file__).resolve().parents[2] / "src"

CONFIG = """\
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
file = "cryptdisk.key"

[disks.local]
type = "local"
path = "data"

[disks.secure]
type = "encrypted"
disk = "local"

[policies.default]
volumes = [{ name = "main", disks = ["secure"] }]
"""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRYPTDISK_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None,
         prefix: list[str] | None = None,
         preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), *CLI, *args], cwd=cwd, env=_env(env),
                          capture_output=True, text=True, errors="replace", timeout=120,
                          preexec_fn=preexec_fn)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The files every case starts from (copied for each case)."""
    w = tmp_path_factory.mktemp("workspace")
    for name in ("cryptdisk.key", "key.hex", "other.hex"):
        assert _cli(w, "keygen", "-o", name).returncode == 0
    (w / "cryptdisk.toml").write_text(CONFIG)
    (w / "data.csv").write_text("id,name\n1,alice\n2,bob\n")
    assert _cli(w, "encrypt", "data.csv", "data.csv.cd", "--key-file", "key.hex").returncode == 0
    whole = (w / "data.csv.cd").read_bytes()
    (w / "truncated.cd").write_bytes(whole[:-20])
    (w / "short-header.cd").write_bytes(whole[:50])
    (w / "notcd.bin").write_bytes(b"this is not a cryptdisk file\n" * 10)
    (w / "empty").write_bytes(b"")
    (w / "adir").mkdir()
    (w / "notadb").mkdir()
    (w / "typo.toml").write_text(CONFIG.replace("current_key_id", "curent_key_id"))
    (w / "typo-type.toml").write_text(CONFIG.replace('"encrypted"', '"encryptd"'))
    (w / "bad.toml").write_text("[keyring\ncurrent_key_id = 1\n")
    (w / "keyfield.toml").write_text(CONFIG.replace('file = "cryptdisk.key"',
                                                    'file = "cryptdisk.key"\nfiel = "x"'))
    (w / "nosource.toml").write_text(CONFIG.replace('file = "cryptdisk.key"', ''))
    (w / "badkey.hex").write_text("zzzz\n")
    (w / "badkey.hex").chmod(0o600)
    plain = sqlite3.connect(w / "plain.sqlite")
    plain.execute("CREATE TABLE x (a)")
    plain.commit()
    plain.close()
    done = _cli(w, "sql", "sales.db", "--create", "-q", "CREATE TABLE t (a BIGINT) ORDER BY a; "
                "INSERT INTO t SELECT range FROM range(100)")
    assert done.returncode == 0, done.stderr
    done = _cli(w, "sqlite", "encrypt", "plain.sqlite", "app.db", "-c", "cryptdisk.toml")
    assert done.returncode == 0, done.stderr
    return w


def _secrets(w: Path) -> list[str]:
    found = []
    for name in ("cryptdisk.key", "key.hex", "other.hex", "sales.db.key"):
        found += re.findall(r"[0-9a-fA-F]{32,}", (w / name).read_text())
    assert found
    return found


K = ("--key-file", "key.hex")
C = ("-c", "cryptdisk.toml")
# (id, argv, status, what the error says); status 2: argparse's usage error
CASES = [
    # numbers out of range are usage errors, not tracebacks
    ("keygen-id-negative", ["keygen", "-o", "n.key", "--id", "-1"], 2, "a key id is from 0"),
    ("keygen-id-huge", ["keygen", "-o", "n.key", "--id", "1" + "0" * 25], 2, "a key id is from 0"),
    ("encrypt-key-id-huge", ["encrypt", "data.csv", "o.cd", "--key-hex", "00" * 32,
                             "--key-id", "1" + "0" * 25], 2, "a key id is from 0"),
    ("encrypt-segment-zero", ["encrypt", "data.csv", "o.cd", *K, "--segment-size", "0"], 2,
     "a segment size is a power of two"),
    ("encrypt-segment-odd", ["encrypt", "data.csv", "o.cd", *K, "--segment-size", "1000"], 2,
     "a segment size is a power of two"),
    ("encrypt-segment-huge", ["encrypt", "data.csv", "o.cd", *K, "--segment-size",
                              "9" * 20], 2, "a segment size is a power of two"),
    ("keys-add-id-huge", ["keys", "add", *C, "9" * 25, "--generate", "n.key"], 2,
     "a key id is from 0"),
    ("backup-repo-key-id-negative", ["backup", "init", "repo", "--repo-keyring",
                                     "cryptdisk.toml", "--repo-key-id", "-1"], 2,
     "a key id is from 0"),
    ("demo-rows-huge", ["demo", "--rows", "9" * 20], 2, "must be at most 2**63-1"),
    # a key or passphrase where a variable's name goes is refused, never echoed
    ("key-env-given-a-key", ["encrypt", "data.csv", "o.cd", "--key-env", "KEY"], 2,
     "takes the NAME of an environment variable"),
    ("key-env-given-a-letter-key", ["encrypt", "data.csv", "o.cd", "--key-env", "dKEY"], 2,
     "takes the NAME of an environment variable"),
    ("passphrase-env-given-a-passphrase", ["backup", "init", "repo", "--passphrase-env",
                                           "correct horse battery staple"], 2,
     "takes the NAME of an environment variable"),
    ("keys-add-env-given-a-key", ["keys", "add", "2", *C, "--env", "KEY"], 2,
     "takes the NAME of an environment variable"),
    # paths: missing, a directory, not encrypted, cut short, the wrong key
    ("encrypt-missing-input", ["encrypt", "nope.csv", "o.cd", *K], 1, "nope.csv"),
    ("encrypt-directory-input", ["encrypt", "adir", "o.cd", *K], 1, "Is a directory"),
    ("encrypt-directory-output", ["encrypt", "data.csv", "adir", *K], 1, "Is a directory"),
    ("encrypt-existing-output", ["encrypt", "data.csv", "data.csv.cd", *K], 1,
     "already exists"),
    ("encrypt-missing-output-dir", ["encrypt", "data.csv", "nodir/o.cd", *K], 1, "nodir/o.cd"),
    # an OUTPUT ending in / names a directory: the error named the temporary file
    # (..RANDOM.cdtmp: No such file or directory) instead of it
    ("encrypt-output-a-missing-directory", ["encrypt", "data.csv", "nodir/", *K], 1,
     "error: nodir/: Not a directory"),
    ("encrypt-force-output-a-missing-directory", ["encrypt", "data.csv", "nodir/", *K,
                                                  "--force"], 1,
     "error: nodir/: Not a directory"),
    ("decrypt-output-a-missing-directory", ["decrypt", "data.csv.cd", "nodir/", *K], 1,
     "error: nodir/: Not a directory"),
    ("encrypt-no-key", ["encrypt", "data.csv", "o.cd"], 1, "no key given"),
    ("encrypt-missing-key-file", ["encrypt", "data.csv", "o.cd", "--key-file", "no.key"], 1,
     "does not exist"),
    ("encrypt-bad-key-file", ["encrypt", "data.csv", "o.cd", "--key-file", "badkey.hex"], 1,
     "not valid hex"),
    ("encrypt-unset-key-env", ["encrypt", "data.csv", "o.cd", "--key-env", "NO_SUCH_VAR"], 1,
     "NO_SUCH_VAR is not set"),
    ("encrypt-config-typo", ["encrypt", "data.csv", "o.cd", "-c", "typo.toml"], 1,
     "unknown setting(s) in [keyring]: curent_key_id"),
    ("encrypt-config-not-toml", ["encrypt", "data.csv", "o.cd", "-c", "bad.toml"], 1,
     "not valid TOML"),
    ("encrypt-config-missing", ["encrypt", "data.csv", "o.cd", "-c", "no.toml"], 1,
     "config file does not exist"),
    ("decrypt-not-encrypted", ["decrypt", "notcd.bin", "o.csv", *K], 1, "not an encrypted file"),
    ("decrypt-empty", ["decrypt", "empty", "o.csv", *K], 1, "not an encrypted file"),
    ("decrypt-truncated", ["decrypt", "truncated.cd", "o.csv", *K], 1, "truncated"),
    ("decrypt-short-header", ["decrypt", "short-header.cd", "o.csv", *K], 1,
     "header is truncated"),
    ("decrypt-wrong-key", ["decrypt", "data.csv.cd", "o.csv", "--key-file", "other.hex"], 1,
     "is not the key this file was encrypted with"),
    ("cat-truncated", ["cat", "truncated.cd", *K], 1, "truncated"),
    ("cat-directory", ["cat", "adir", *K], 1, "Is a directory"),
    ("inspect-not-encrypted", ["inspect", "notcd.bin"], 1, "not an encrypted file"),
    ("inspect-missing", ["inspect", "nope"], 1, "No such file"),
    ("verify-wrong-key", ["verify", "data.csv.cd", "--key-file", "other.hex"], 1,
     "is not the key"),
    ("rewrap-wrong-key", ["rewrap", "data.csv.cd", "--key-file", "other.hex"], 1,
     "is not the key"),
    ("disks-config-typo", ["disks", "-c", "typo-type.toml"], 1, "unknown type 'encryptd'"),
    ("policies-config-not-toml", ["policies", "-c", "bad.toml"], 1, "not valid TOML"),
    ("convert-missing-source", ["convert", "nope", "out", *C], 1, "not a directory"),
    ("sql-a-file", ["sql", "data.csv", "-q", "SELECT 1"], 1, "is a file, not a database"),
    ("sql-no-table", ["sql", "sales.db", "-q", "SELECT * FROM nope"], 1, "no table 'nope'"),
    ("rotate-missing", ["rotate", "nope.db"], 1, "no cryptdisk database"),
    ("rotate-bad-new-key", ["rotate", "sales.db", "--new-key", "badkey.hex"], 1,
     "not valid hex"),
    ("reencrypt-not-a-database", ["reencrypt", "notadb"], 1, "no cryptdisk database"),
    ("keys-remove-unknown", ["keys", "sales.db", "--remove", "9"], 1, "has no key with id 9"),
    ("keys-list-no-config", ["keys", "list"], 1, "no config given"),
    ("keys-list-config-typo", ["keys", "list", "-c", "typo.toml"], 1,
     "unknown setting(s) in [keyring]: curent_key_id"),
    ("keys-list-key-field-typo", ["keys", "list", "-c", "keyfield.toml"], 1,
     "unknown field(s) fiel in a key entry"),
    ("keys-list-key-without-source", ["keys", "list", "-c", "nosource.toml"], 1,
     "key 1 needs exactly one of"),
    ("encrypt-key-field-typo", ["encrypt", "data.csv", "o.cd", "-c", "keyfield.toml"], 1,
     "unknown field(s) fiel in a key entry"),
    ("cat-extra-argument", ["cat", "data.csv.cd", "b", *K], 2,
     "cryptdisk cat: error: unrecognized arguments: b"),
    ("keys-list-extra-option", ["keys", "list", "-c", "cryptdisk.toml", "--nope"], 2,
     "cryptdisk keys list: error: unrecognized arguments: --nope"),
    ("keys-promote-config-typo", ["keys", "promote", "1", "-c", "typo.toml"], 1,
     "unknown setting(s) in [keyring]: curent_key_id"),
    ("sqlite-encrypt-not-sqlite", ["sqlite", "encrypt", "data.csv", "o.db", *C], 1,
     "not a plain SQLite database"),
    ("sqlite-encrypt-missing-dir", ["sqlite", "encrypt", "plain.sqlite", "nodir/o.db", *C], 1,
     "nodir/o.db: cannot create the database: its directory does not exist"),
    ("sqlite-decrypt-missing-dir", ["sqlite", "decrypt", "app.db", "nodir/o.db", *C], 1,
     "nodir/o.db: cannot create the database: its directory does not exist"),
    ("sqlite-decrypt-wrong-key", ["sqlite", "decrypt", "app.db", "o.db", "--key-file",
                                  "other.hex"], 1, "is not the key"),
    ("serve-no-database", ["serve", "nope.db", "--check"], 1, "no cryptdisk database at nope.db"),
    ("serve-no-database-add-user", ["serve", "nope.db", "--add-user", "a"], 1,
     "no cryptdisk database at nope.db"),
    ("serve-users-directory", ["serve", "sales.db", "--users", "adir", "--check"], 1,
     "the user file adir is a directory"),
    ("serve-check-no-users", ["serve", "sales.db", "--check"], 1, "no users in"),
    ("backup-init-no-passphrase", ["backup", "init", "repo"], 1, "needs a passphrase"),
    ("backup-list-not-a-repo", ["backup", "list", "adir", "--passphrase-env", "P"], 1,
     "not a backup repository"),
    ("protect-unknown-column", ["protect", "data.csv", "o.parquet", *C, "-r",
                                "nope=mask_email"], 1, "no column 'nope'"),
    ("protect-unknown-function", ["protect", "data.csv", "o.parquet", *C, "-r",
                                  "name=frob"], 1, "unknown function 'frob'"),
    # a binary file given as the config was an 'internal error: UnicodeDecodeError'
    ("protect-config-not-text", ["protect", "data.csv", "o.parquet", "-c", "data.csv.cd",
                                 "-r", "name=mask_full"], 1, "not valid TOML: not UTF-8 text"),
    # -o "" (an unset variable in -o "$KEYFILE") printed a new key on stdout, into any log
    ("keygen-output-empty", ["keygen", "-o", ""], 1, "-o names no file"),
]


@pytest.mark.parametrize("argv, status, says", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_gets_one_clear_error(workspace, tmp_path, argv, status, says):
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    before = set(os.listdir(w))
    key = _secrets(w)[0]  # "KEY" stands for a key of the workspace, given by mistake
    argv = [a.replace("KEY", key) for a in argv]
    done = _cli(w, *argv, env={"P": "a passphrase"})
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, done.stderr
    assert says in errors[0], done.stderr
    if status == 1:  # a usage error (2) comes after argparse's usage lines
        assert errors[0].startswith("cryptdisk: error: "), done.stderr
        assert len(done.stderr.splitlines()) <= 2, done.stderr  # the error and a hint
    for secret in [*_secrets(w), "correct horse"]:
        assert secret not in done.stdout + done.stderr
    assert set(os.listdir(w)) == before, "a failed command left files behind"


def test_serve_check_creates_and_changes_nothing(workspace, tmp_path):
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    done = _cli(w, "serve", "sales.db", "--add-user", "a", env={"CRYPTDISK_PASSWORD": "pw"})
    assert done.returncode == 0, done.stderr
    for name in ("sales.db.audit", "sales.db.users.lock"):  # as a copy without them has it
        os.remove(w / name)
    before = {str(p.relative_to(w)): p.read_bytes() for p in w.rglob("*") if p.is_file()}
    for extra in (["--plaintext-loopback"], ["--self-signed"]):
        done = _cli(w, "serve", "sales.db", "--check", *extra)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("ok: sales.db opens"), done.stdout
    after = {str(p.relative_to(w)): p.read_bytes() for p in w.rglob("*") if p.is_file()}
    assert after == before, "--check made or changed a file"


def _without_dac_override() -> list[str] | None:
    """How to run a command that file permissions apply to (root bypasses them)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


@pytest.mark.parametrize("argv, says", [
    (["encrypt", "locked", "o.cd", *K], "locked: Permission denied"),
    (["decrypt", "locked.cd", "o.csv", *K], "locked.cd: Permission denied"),
    (["encrypt", "data.csv", "o.cd", "--key-file", "locked.key"], "cannot be read"),
    (["encrypt", "data.csv", "rodir/o.cd", *K], "rodir/o.cd: Permission denied"),
    (["sqlite", "encrypt", "plain.sqlite", "rodir/o.db", *C],
     "rodir/o.db: cannot create the database: its directory is not writable"),
    (["disks", "-c", "locked"], "Permission denied"),
], ids=["input", "encrypted-input", "key-file", "output-dir", "sqlite-output-dir", "config"])
def test_unreadable_and_unwritable_paths(workspace, tmp_path, argv, says):
    prefix = _without_dac_override()
    if prefix is None:
        pytest.skip("running as root without setpriv: permissions do not apply")
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    shutil.copy(w / "data.csv", w / "locked")
    shutil.copy(w / "data.csv.cd", w / "locked.cd")
    shutil.copy(w / "key.hex", w / "locked.key")
    (w / "rodir").mkdir()
    for name in ("locked", "locked.cd", "locked.key"):
        (w / name).chmod(0)
    (w / "rodir").chmod(0o555)
    try:
        done = _cli(w, *argv, prefix=prefix)
    finally:
        (w / "rodir").chmod(0o755)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("cryptdisk: error: ") and says in done.stderr, done.stderr
    assert os.listdir(w / "rodir") == []


def _read_fifo_in_background(path: Path) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, got


@pytest.mark.parametrize("command", ["encrypt", "decrypt"])
def test_an_output_that_is_a_fifo_is_written_through_not_replaced(workspace, tmp_path, command):
    """A named pipe (as a device) is written to as a stream, as ``cp`` does; renaming a
    temporary file over it would put a file in its place (as root, over /dev/full too)."""
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    fifo = w / "pipe"
    os.mkfifo(fifo)
    reader, got = _read_fifo_in_background(fifo)
    source = "data.csv" if command == "encrypt" else "data.csv.cd"
    done = _cli(w, command, source, "pipe", *K)
    reader.join(30)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    if command == "decrypt":
        assert got == [(w / "data.csv").read_bytes()]
    else:
        (w / "got.cd").write_bytes(got[0])
        back = _cli(w, "cat", "got.cd", *K)
        assert back.stdout == (w / "data.csv").read_text()
    assert not [n for n in os.listdir(w) if n.endswith(".cdtmp")]


@pytest.mark.parametrize("command", ["encrypt", "decrypt"])
def test_an_output_that_is_a_character_device_is_written_not_replaced(workspace, tmp_path,
                                                                        command):
    source = "data.csv" if command == "encrypt" else "data.csv.cd"
    done = _cli(workspace, command, source, os.devnull, *K)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    if os.path.exists("/dev/full"):  # a full device: the error names it
        done = _cli(workspace, command, source, "/dev/full", *K)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert done.stderr.startswith("cryptdisk: error: /dev/full: No space left on device")
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_protect_refuses_an_output_that_is_not_a_regular_file(workspace, tmp_path):
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    os.mkfifo(w / "pipe")
    done = _cli(w, "protect", "data.csv", "pipe", "--output-format", "csv", *C, "-r",
                "name=mask_email")
    assert done.returncode == 1, done.stderr
    assert "cannot write pipe: not a regular file" in done.stderr
    assert stat.S_ISFIFO(os.lstat(w / "pipe").st_mode)
    assert sorted(os.listdir(w)) == sorted([*os.listdir(workspace), "pipe"])


def test_protect_refuses_an_existing_output_unless_force(workspace, tmp_path):
    """cryptdisk protect replaced an existing output with no question (an encrypted
    database became a Parquet file, "protected 2 rows ... into app.db"); and - was a file
    named -, not stdout."""
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    (w / "app.db").write_bytes(b"an encrypted database")
    done = _cli(w, "protect", "data.csv", "app.db", *C, "-r", "name=mask_email")
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("cryptdisk: error: app.db already exists; refusing")
    assert "--force" in done.stderr and "Traceback" not in done.stderr
    assert (w / "app.db").read_bytes() == b"an encrypted database"
    done = _cli(w, "protect", "data.csv", "-", *C, "-r", "name=mask_email")
    assert done.returncode == 1 and "not stdout" in done.stderr, done.stderr
    assert not (w / "-").exists()
    done = _cli(w, "protect", "data.csv", "app.db", "--force", *C, "-r", "name=mask_email")
    assert done.returncode == 0, done.stderr
    assert (w / "app.db").read_bytes()[:4] == b"PAR1"


def _file_size_limit(limit: int) -> Callable[[], None]:
    """A disk that fills up after ``limit`` bytes of a file, for an unprivileged test:
    writes past it fail with EFBIG (Python ignores SIGXFSZ), as ENOSPC fails them."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.parametrize("argv, says", [
    (["encrypt", "big.bin", "o.cd", *K], "o.cd: File too large"),
    (["encrypt", "big.bin", "data.csv.cd", "--force", *K], "data.csv.cd: File too large"),
    (["decrypt", "big.cd", "o.bin", *K], "o.bin: File too large"),
    (["keygen", "-o", "new.key"], "new.key: File too large"),
    (["sqlite", "encrypt", "big.sqlite", "o.db", *C], "o.db: I/O error while copying into it"),
    (["convert", "tree", "out", *C, "--to", "cryptdisk"], "out/big.bin: File too large"),
], ids=["encrypt", "encrypt-force", "decrypt", "keygen", "sqlite-encrypt", "convert"])
def test_a_full_disk_names_the_output_and_leaves_nothing(workspace, tmp_path, argv, says):
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    (w / "big.bin").write_bytes(os.urandom(300_000))
    assert _cli(w, "encrypt", "big.bin", "big.cd", *K).returncode == 0
    (w / "tree").mkdir()
    shutil.copy(w / "big.bin", w / "tree" / "big.bin")
    big = sqlite3.connect(w / "big.sqlite")
    big.execute("CREATE TABLE x (a)")
    big.executemany("INSERT INTO x VALUES (?)", [(os.urandom(1000),) for _ in range(300)])
    big.commit()
    big.close()
    before = {str(p.relative_to(w)): p.read_bytes() for p in w.rglob("*") if p.is_file()}
    done = _cli(w, *argv, preexec_fn=_file_size_limit(100 if argv[0] == "keygen" else 65536))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("cryptdisk: error: ") and says in done.stderr, done.stderr
    after = {str(p.relative_to(w)): p.read_bytes() for p in w.rglob("*") if p.is_file()}
    assert after == before, "a failed write left a file, or changed one"


@pytest.mark.parametrize("argv, says", [
    (["sql", "sales.db", "-q", "INSERT INTO t SELECT range FROM range(300000)"],
     r"^cryptdisk: error: \S*/sales\.db/\S+\.parquet: File too large$"),
    (["backup", "create", "repo", "sales.db", "--passphrase-env", "P"],
     r"^cryptdisk: error: \S*/repo/\S+: File too large$"),
], ids=["sql-insert", "backup-create"])
def test_a_full_disk_under_a_database_or_a_repository_names_the_file(workspace, tmp_path,
                                                                      argv, says):
    w = tmp_path / "w"
    shutil.copytree(workspace, w, symlinks=True)
    done = _cli(w, "backup", "init", "repo", "--passphrase-env", "P", env={"P": "a passphrase"})
    assert done.returncode == 0, done.stderr
    catalog = (w / "sales.db" / "catalog").read_bytes()
    done = _cli(w, *argv, env={"P": "a passphrase"},
                preexec_fn=_file_size_limit(1024 if argv[0] == "backup" else 65536))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert re.match(says, done.stderr.strip()), done.stderr
    assert (w / "sales.db" / "catalog").read_bytes() == catalog  # the insert did not commit
    left = [p for p in w.rglob("*") if "tmp" in p.name and p.name != "tmp"]
    assert left == [], left
    done = _cli(w, "backup", "list", "repo", "--passphrase-env", "P",
                env={"P": "a passphrase"})
    assert done.returncode == 0 and "sales.db" not in done.stdout, done.stdout


def _command_paths() -> list[tuple[tuple[str, ...], bool]]:
    """Every command and subcommand, and whether it has a required positional argument."""
    import argparse

    from cryptdisk.cli._app import build_parser

    out = []

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        positional = [a for a in parser._actions if not a.option_strings
                      and not isinstance(a, argparse._SubParsersAction)
                      and a.nargs not in ("?", "*")]
        out.append((path, bool(positional) or any(s.required for s in subs)))
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, (*path, name))

    walk(build_parser(), ())
    return out


COMMAND_PATHS = _command_paths()


@pytest.mark.parametrize("path, needs_args", COMMAND_PATHS,
                         ids=[" ".join(p) or "cryptdisk" for p, _ in COMMAND_PATHS])
def test_every_command_explains_itself_and_asks_for_what_it_needs(tmp_path, path, needs_args):
    done = _cli(tmp_path, *path, "--help")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith(f"usage: cryptdisk {' '.join(path)}".rstrip()), done.stdout
    if needs_args:  # nothing given: the usage and what is missing, status 2, nothing made
        done = _cli(tmp_path, *path)
        assert done.returncode == 2, (done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
        assert re.search(r"^cryptdisk[\w ]*: error: (the following arguments are required|"
                         r"one of the arguments .* is required)", done.stderr, re.M), done.stderr
        assert os.listdir(tmp_path) == []


def test_a_config_without_keyring_points_at_an_example_that_works(tmp_path):
    """The hint of 'no [keyring] section' names a --help whose example config, written
    as it says, encrypts a file."""
    (tmp_path / "empty.toml").write_text("")
    (tmp_path / "data.csv").write_text("a\n1\n")
    done = _cli(tmp_path, "encrypt", "data.csv", "o.cd", "-c", "empty.toml")
    assert done.returncode == 1 and "no [keyring] section" in done.stderr, done.stderr
    pointed = re.search(r"see '(cryptdisk [\w ]+--help)' for an example config", done.stderr)
    assert pointed, done.stderr
    shown = _cli(tmp_path, *pointed.group(1).split()[1:]).stdout
    example = re.search(r"^(  cryptdisk keygen .*?\n  EOF)$", shown, re.M | re.S)
    assert example, shown
    script = "\n".join(line[2:] for line in example.group(1).splitlines())
    made = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    done = _cli(tmp_path, "encrypt", "data.csv", "o.cd", "-c", "cryptdisk.toml")
    assert done.returncode == 0, done.stderr

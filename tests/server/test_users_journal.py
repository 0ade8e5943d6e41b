"""The user file and the database's record of committed user changes (`cryptdisk serve
--sqlite`): the record applies only as the user file's next generation (a COMMIT whose
process died before saving the file); a user file or database restored from an older copy
stops the server with both generations named, until `--resolve-users` picks one side; and
once a DROP USER commits, no byte of the dropped user's verifier is left in the user file,
the record, or any page of the database."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import apsw
import psycopg
import pytest

from cryptdisk import Keyring
from cryptdisk import open as cd_open
from cryptdisk.server._engines import USERS_JOURNAL
from cryptdisk.sqlite import connect as sqlite_connect
from tests.server.test_user_commit_crash import Serve, _children, servers  # noqa: F401


def _keyring(root: Path) -> Keyring:
    return Keyring.from_config(str(root / "c.toml"))


def _user_file(root: Path) -> dict[str, Any]:
    with cd_open(str(root / "app.db.users"), "rb", keyring=_keyring(root)) as f:
        data: dict[str, Any] = json.loads(f.read())
    return data


def _record(root: Path) -> tuple[int, bytes]:
    db = sqlite_connect(str(root / "app.db"), keyring=_keyring(root))
    try:
        ((serial, text),) = list(db.execute(f"SELECT serial, users FROM {USERS_JOURNAL}"))
    finally:
        db.close()
    return int(serial), bytes(text)


def _pages(root: Path) -> bytes:
    """Every page of the database, decrypted (free pages too): a page-by-page copy."""
    copy = root / "pages.db"
    copy.unlink(missing_ok=True)
    db = sqlite_connect(str(root / "app.db"), keyring=_keyring(root))
    plain = apsw.Connection(str(copy))
    try:
        with plain.backup("main", db, "main") as b:
            b.step()
    finally:
        plain.close()
        db.close()
    data = copy.read_bytes()
    copy.unlink()
    return data


def _stop(s: Serve) -> None:
    s.proc.terminate()  # SIGTERM: drains and exits
    s.proc.wait(120)
    s.kill()


def _serve(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`cryptdisk serve` run to its end: with a user file that does not belong with the
    database it exits at once; one that serves is stopped and makes the test fail."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cryptdisk", "serve", str(root / "app.db"), "--sqlite",
         "--config", str(root / "c.toml"), "--listen", "127.0.0.1:0", "--workers", "2",
         *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=root)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    if first.startswith("serving"):
        workers = _children(proc.pid)
        proc.kill()
        proc.communicate(timeout=60)
        for pid in workers:
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)
        pytest.fail(f"the server started: {first}")
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, first + out, err)


def _users(s: Serve) -> set[str]:
    with s.connect() as admin:
        return {r[0] for r in admin.execute("SELECT * FROM system.users")}


def _change_users(s: Serve) -> None:
    with s.connect() as admin:
        admin.execute("BEGIN")
        admin.execute("CREATE USER carol PASSWORD 'carol pw'")
        admin.execute("COMMIT")
        admin.execute("DROP USER bob")  # outside a transaction


def _served_with_bob(root: Path, started: list[Serve]) -> None:
    """A fresh server on ``root`` (admin ``u``) creates user bob, and stops."""
    s = Serve(root)
    started.append(s)
    with s.connect() as admin:
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
    _stop(s)


def test_a_restored_older_user_file_stops_the_server(tmp_path: Path,
                                                     servers: list[Serve]) -> None:  # noqa: F811
    _served_with_bob(tmp_path, servers)
    older = (tmp_path / "app.db.users").read_bytes()
    old_generation = _user_file(tmp_path)["serial"]
    s = Serve(tmp_path, fresh=False)
    servers.append(s)
    _change_users(s)  # carol created, bob dropped: two generations on
    _stop(s)
    generation = _user_file(tmp_path)["serial"]
    assert _record(tmp_path)[0] == generation == old_generation + 2

    (tmp_path / "app.db.users").write_bytes(older)  # the operator restores an older copy
    for args in [(), ("--check",)]:
        done = _serve(tmp_path, *args)
        assert done.returncode == 1, done
        assert f"is at generation {old_generation}, but the database's record of committed " \
               f"user changes is at generation {generation}" in done.stderr, done.stderr
        assert "--resolve-users" in done.stderr
    assert (tmp_path / "app.db.users").read_bytes() == older  # nothing applied

    done = _serve(tmp_path, "--resolve-users", "file")  # keep the restored file's users
    assert done.returncode == 0, done
    s = Serve(tmp_path, fresh=False)
    servers.append(s)
    assert _users(s) == {"u", "bob"}
    with s.connect() as admin:  # changes work again, in and outside transactions
        admin.execute("BEGIN")
        admin.execute("CREATE USER dave PASSWORD 'dave pw'")
        admin.execute("COMMIT")
        admin.execute("CREATE USER erin PASSWORD 'erin pw'")
    assert _users(s) == {"u", "bob", "dave", "erin"}
    _stop(s)
    assert _record(tmp_path)[0] == _user_file(tmp_path)["serial"]


def test_a_restored_older_database_stops_the_server(tmp_path: Path,
                                                    servers: list[Serve]) -> None:  # noqa: F811
    _served_with_bob(tmp_path, servers)
    backup = tmp_path / "backup"
    backup.mkdir()
    for f in tmp_path.glob("app.db*"):
        if f.name.startswith("app.db") and not f.name.startswith("app.db.users"):
            shutil.copy2(f, backup / f.name)
    old_generation = _record(tmp_path)[0]
    s = Serve(tmp_path, fresh=False)
    servers.append(s)
    _change_users(s)
    _stop(s)
    generation = _user_file(tmp_path)["serial"]
    for f in tmp_path.glob("app.db*"):
        if not f.name.startswith("app.db.users") and not (backup / f.name).exists():
            f.unlink()
    for f in backup.iterdir():
        shutil.copy2(f, tmp_path / f.name)  # the operator restores the database
    done = _serve(tmp_path)
    assert done.returncode == 1, done
    assert f"is at generation {generation}, but the database's record of committed user " \
           f"changes is at generation {old_generation}" in done.stderr, done.stderr

    done = _serve(tmp_path, "--resolve-users", "database")  # the users the database had
    assert done.returncode == 0, done
    assert _user_file(tmp_path)["serial"] == old_generation
    s = Serve(tmp_path, fresh=False)
    servers.append(s)
    assert _users(s) == {"u", "bob"}


def _verifier_parts(root: Path, name: str) -> list[bytes]:
    """The salt, StoredKey and ServerKey of ``name``'s verifier, as the user file (and the
    record) hold them, and as raw bytes."""
    verifier = _user_file(root)["users"][name]["verifier"]
    _, rest = verifier.split("$", 1)
    salt = rest.split("$")[0].split(":")[1]
    stored, server = rest.split("$")[1].split(":")
    parts = [salt, stored, server]
    return [p.encode() for p in parts] + [base64.b64decode(p) for p in parts]


def _assert_gone(root: Path, parts: list[bytes]) -> None:
    user_file = json.dumps(_user_file(root)).encode()
    record = _record(root)[1]
    pages = _pages(root)
    for part in parts[:3]:
        assert part not in user_file
        assert part not in record
    for part in parts:
        assert part not in pages


def test_no_verifier_of_a_dropped_user_is_left(tmp_path: Path,
                                               servers: list[Serve]) -> None:  # noqa: F811
    s = Serve(tmp_path)
    servers.append(s)
    with s.connect() as admin:
        for name in ("victim", "victim2"):
            admin.execute("BEGIN")
            admin.execute(f"CREATE USER {name} PASSWORD '{name} pw'")
            admin.execute("COMMIT")
        secrets = {name: _verifier_parts(tmp_path, name) for name in ("victim", "victim2")}
        assert all(part in _record(tmp_path)[1] for part in secrets["victim"][:3])
        admin.execute("DROP USER victim")  # outside a transaction
        _assert_gone(tmp_path, secrets["victim"])
        admin.execute("BEGIN")
        admin.execute("DROP USER victim2")
        admin.execute("COMMIT")
        for parts in secrets.values():
            _assert_gone(tmp_path, parts)
        assert _users(s) == {"u"}
    with pytest.raises(psycopg.OperationalError):
        s.connect("victim", "victim pw")

"""A user file, or the database's record of committed user changes (`cryptdisk serve
--sqlite`), that authenticates but is malformed (not JSON, a field missing or of the wrong
type, a column of the wrong type) is a clear error naming the file, the record and the
field: `cryptdisk serve` prints `cryptdisk: error: ...` and exits 1, never a traceback,
never a silent skip, and never shows a verifier. The malformed records are written
through the keyring, so they pass authentication and reach the parser."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cryptdisk import Keyring, UsersFileError
from cryptdisk import open as cd_open
from cryptdisk.server import SQLiteEngine, UserStore
from cryptdisk.server._engines import USERS_JOURNAL
from cryptdisk.sqlite import connect as sqlite_connect
from tests.forked import child_of_a_dead_holder
from tests.json_edits import Change, set_at
from tests.server.certs import sqlite_serve_config
from tests.server.test_users_journal import _record, _serve, _user_file

KEY_HEX = "cd" * 32

#: (id, bytes or a change to the good JSON, what the message says, only for the record)
CASES: list[tuple[str, bytes | Change, str, bool]] = [
    ("bad JSON", b'{"version": 1, "serial": ', "not JSON (JSONDecodeError at line 1", False),
    ("not UTF-8", b"{\x80}", "not JSON (UnicodeDecodeError at byte 1)", False),
    ("an array", b"[1, 2]", "a list, not an object", False),
    ("no version", set_at("version", ...), "not a cryptdisk user file (version 1)", False),
    ("version true", set_at("version", True), "not a cryptdisk user file (version 1)", False),
    ("no serial", set_at("serial", ...), "serial is missing", True),
    ("serial a string", set_at("serial", "1"), "serial is not a generation number", False),
    ("serial negative", set_at("serial", -1), "serial is not a generation number", False),
    ("serial not the record's", lambda d: d.update(serial=d["serial"] + 5),
     "but is filed as generation", True),
    ("no users", set_at("users", ...), "users is missing", False),
    ("users a list", set_at("users", []), "users is a list, not an object", False),
    ("roles a string", set_at("roles", "r"), "roles is a string, not an object", False),
    ("a user a string", set_at("users.u", "x"), "users['u'] is a string, not an object", False),
    ("no verifier", set_at("users.u.verifier", ...), "users['u'].verifier is missing", False),
    ("verifier a number", set_at("users.u.verifier", 5),
     "users['u'].verifier is a number, not a string", False),
    ("verifier a list", lambda d: d["users"]["u"].update(verifier=[d["users"]["u"]["verifier"]]),
     "users['u'].verifier is a list, not a string", False),
    ("verifier not SCRAM", set_at("users.u.verifier", "SCRAM-SHA-256$4096:AA==$x:y"),
     "users['u'].verifier is not a SCRAM-SHA-256 verifier", False),
    ("admin a string", set_at("users.u.admin", "yes"),
     "users['u'].admin is a string, not true or false", False),
    ("clientcert null", set_at("users.u.clientcert", None),
     "users['u'].clientcert is null, not true or false", False),
    ("roles of a user a string", set_at("users.u.roles", "r"),
     "users['u'].roles is not a list of role names", False),
    ("grants a list", set_at("users.u.grants", []), "users['u'].grants is a list, not an object",
     False),
    ("an unknown privilege", set_at("users.u.grants", {"t": ["DROP"]}),
     "users['u'].grants['t'] is not a list of privileges", False),
    ("a role a number", set_at("roles", {"r": 1}), "roles['r'] is a number, not an object",
     False),
    ("admin option names a number", set_at("roles", {"r": {"admin_roles": [1]}}),
     "roles['r'].admin_roles is not a list of role names", False),
    ("a user and a role", set_at("roles", {"u": {}}), "'u' is both a user and a role", False),
]


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A served SQLite database with one admin user ``u`` (a user file and a record)."""
    root = tmp_path_factory.mktemp("users-template")
    _ca, _cert, config = sqlite_serve_config(root, "c.toml", KEY_HEX)
    subprocess.run([sys.executable, "-m", "cryptdisk", "serve", str(root / "app.db"),
                    "--sqlite", "--config", str(config), "--add-user", "u", "--admin"],
                   env={**os.environ, "CRYPTDISK_PASSWORD": "pw"}, check=True,
                   capture_output=True, timeout=120)
    return root


@pytest.fixture
def root(template: Path, tmp_path: Path) -> Path:
    """A copy of the template (c.toml's certificate paths still point into it)."""
    shutil.copytree(template, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _keyring(root: Path) -> Keyring:
    return Keyring.from_config(str(root / "c.toml"))


def _malformed(good: bytes, case: bytes | Change) -> bytes:
    if isinstance(case, bytes):
        return case
    data = json.loads(good)
    case(data)
    return json.dumps(data).encode()


def _write_record(root: Path, serial: Any, users: Any) -> None:
    """Write the record as the server would: through the keyring (it authenticates)."""
    db = sqlite_connect(str(root / "app.db"), keyring=_keyring(root))
    try:
        db.execute(f"UPDATE {USERS_JOURNAL} SET serial = ?, users = ? WHERE id = 1",
                   (serial, users))
        written = list(db.execute(f"SELECT serial, users FROM {USERS_JOURNAL}"))
    finally:
        db.close()
    assert written == [(serial, users)]


def _write_user_file(root: Path, text: bytes) -> None:
    with cd_open(str(root / "app.db.users"), "wb", keyring=_keyring(root)) as f:
        f.write(text)


def _store(root: Path) -> tuple[UserStore, SQLiteEngine]:
    db = str(root / "app.db")
    engine = SQLiteEngine(db, _keyring(root))
    return UserStore(root / "app.db.users", engine.keyring, iterations=4096,
                     journal=engine.read_users_record, journal_path=db), engine


def _assert_names_the_record(root: Path, exc: UsersFileError, what: str, secret: str) -> None:
    message = str(exc)
    assert message.startswith(f"{root / 'app.db'}: the database's record of committed user "
                              f"changes (table {USERS_JOURNAL}, record 1) is malformed: "), message
    assert what in message, message
    assert secret not in message and secret not in (exc.hint or "")
    assert exc.path == str(root / "app.db") and exc.record == 1
    assert "--resolve-users file" in (exc.hint or "")


@pytest.mark.parametrize("case,what", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_record_is_an_error_naming_the_database_and_the_record(
        root: Path, case: bytes | Change, what: str) -> None:
    serial, good = _record(root)
    secret = _user_file(root)["users"]["u"]["verifier"]
    before = (root / "app.db.users").read_bytes()
    _write_record(root, serial, _malformed(good, case))
    store, engine = _store(root)
    try:
        with pytest.raises(UsersFileError) as check:
            store.check_journal()  # cryptdisk serve --check
        _assert_names_the_record(root, check.value, what, secret)
        with pytest.raises(UsersFileError) as start:
            store.recover()  # cryptdisk serve, at start and before every change
        assert str(start.value) == str(check.value)
        with pytest.raises(UsersFileError):  # as a COMMIT with user changes reads it
            store.set_user("v", "v pw", create=True)
    finally:
        engine.close()
    assert (root / "app.db.users").read_bytes() == before  # nothing applied


@pytest.mark.parametrize("case,what", [(c[1], c[2]) for c in CASES if not c[3]],
                         ids=[c[0] for c in CASES if not c[3]])
def test_a_malformed_user_file_is_an_error_naming_it(root: Path, case: bytes | Change,
                                                     what: str) -> None:
    good = json.dumps(_user_file(root)).encode()
    secret = _user_file(root)["users"]["u"]["verifier"]
    _write_user_file(root, _malformed(good, case))
    with pytest.raises(UsersFileError) as exc:
        _store(root)
    path = str(root / "app.db.users")
    assert str(exc.value).startswith(f"the user file {path} is malformed: "), exc.value
    assert what in str(exc.value) and secret not in str(exc.value)
    assert exc.value.path == path and exc.value.record is None


@pytest.mark.parametrize("serial,users,what", [
    ("one", b"{}", "its serial is text, not a generation number"),
    (-3, b"{}", "its serial is a negative integer, not a generation"),
    (1, "{}", "its users are text, not a blob of JSON"),
    (1, 10 ** 12, "its users are an integer, not a blob of JSON"),  # never bytes(10 ** 12)
], ids=["serial text", "serial negative", "users text", "users a number"])
def test_a_record_column_of_the_wrong_type_is_an_error(root: Path, serial: Any, users: Any,
                                                       what: str) -> None:
    _write_record(root, serial, users)
    store, engine = _store(root)
    try:
        with pytest.raises(UsersFileError) as exc:
            store.check_journal()
        _assert_names_the_record(root, exc.value, what, "SCRAM-SHA-256$")
        session = engine.open_session()  # a COMMIT's and --resolve-users' own reader
        try:
            with pytest.raises(UsersFileError):
                session.resolve_users(store, "database")
        finally:
            session.close()
    finally:
        engine.close()


def _assert_cli_error(done: subprocess.CompletedProcess[str], *parts: str) -> None:
    assert done.returncode == 1, done
    assert done.stderr.startswith("cryptdisk: error: "), done.stderr
    assert "Traceback" not in done.stderr and "SCRAM-SHA-256$" not in done.stderr
    for part in parts:
        assert part in done.stderr, done.stderr


@pytest.mark.parametrize("case", ["bad JSON", "no users", "verifier a number", "column"])
def test_serve_reports_a_malformed_record_and_resolve_users_file_repairs_it(
        root: Path, case: str) -> None:
    serial, good = _record(root)
    if case == "column":
        _write_record(root, serial, "{}")
        what = "its users are text"
    else:
        _, change, what, _only = next(c for c in CASES if c[0] == case)
        _write_record(root, serial, _malformed(good, change))
    where = f"{root / 'app.db'}: the database's record of committed user changes " \
            f"(table {USERS_JOURNAL}, record 1) is malformed: "
    for args in [("--check",), (), ("--resolve-users", "database")]:
        _assert_cli_error(_serve(root, *args), where, what,
                          "cryptdisk: hint: `cryptdisk serve PATH --sqlite --resolve-users "
                          "file`")
    done = _serve(root, "--resolve-users", "file")  # the user file's users, over it
    assert done.returncode == 0, done
    assert _record(root) == (serial, good) or json.loads(_record(root)[1]) == json.loads(good)
    done = _serve(root, "--check")
    assert done.returncode == 0 and done.stdout.startswith("ok: "), done


def test_serve_reports_a_malformed_user_file(root: Path) -> None:
    _write_user_file(root, b'{"version": 1, "serial": 1, "users": {"u": {"admin": true}}}')
    for args in [("--check",), ()]:
        _assert_cli_error(_serve(root, *args),
                          f"the user file {root / 'app.db.users'} is malformed: "
                          "users['u'].verifier is missing", "cryptdisk: hint: restore it")


def test_a_running_server_keeps_its_users_when_another_process_leaves_a_malformed_file(
        root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A login reads the users in again when another process changed them (refresh): a
    malformed user file is logged as the error it is, the users read before stay, and
    every change to users fails with the same error until it is repaired."""
    from cryptdisk.server._users import _ChangeCounter

    store, engine = _store(root)
    try:
        users = dict(store.users)
        _write_user_file(root, b'{"version": 1, "serial": 9, "users": []}')
        counter = _ChangeCounter(str(root / "app.db.users.lock"))
        with counter.locked():
            counter.bump()  # as another process's save does
        with caplog.at_level("ERROR", logger="cryptdisk.server"):
            store.refresh()
        assert store.users == users
        assert f"the user file {root / 'app.db.users'} is malformed: users is a list" \
            in caplog.text
        with pytest.raises(UsersFileError, match="users is a list"):
            store.set_user("v", "v pw", create=True)
    finally:
        engine.close()


def test_close_releases_the_files_a_store_holds_open(tmp_path: Any, keyring: Keyring) -> None:
    """A store holds its lock file open (read before each statement, and locked at each
    change) until closed: a test session making a store per server ran past 1024
    descriptors."""
    def open_files() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = open_files()
    for _ in range(5):
        store = UserStore(tmp_path / "users", keyring, iterations=4096)
        store.set_user("alice", "pw", admin=True, create="alice" not in store.users)
        store.close()
    assert open_files() == before


_DIES_HOLDING_THE_USERS_LOCK = """
from cryptdisk.server._users import _ChangeCounter
counter = _ChangeCounter(sys.argv[1])
assert counter.try_lock()  # a change to users under way
fork_and_die()
"""


def test_a_forked_child_does_not_keep_the_users_lock_of_a_parent_that_died(
        tmp_path: Path) -> None:
    """A process forked while its parent held the user file's lock shared the lock file's
    open file, which holds the flock: after the parent died the child (which changes no
    user) kept it, and every change to users in every worker waited for the child to
    exit. The child now closes its copy as it starts."""
    import fcntl

    path = str(tmp_path / "app.db.users.lock")
    with child_of_a_dead_holder(_DIES_HOLDING_THE_USERS_LOCK, path):
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError before
        finally:
            os.close(fd)

"""The user file and the database's record of committed user changes (`cryptdisk serve
--sqlite`): once a DROP USER commits, in a transaction or outside one, no byte of the
dropped user's verifier is left in the user file, the record, or any page of the
database."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import apsw
import psycopg
import pytest

from cryptdisk import Keyring
from cryptdisk import open as cd_open
from cryptdisk.server._engines import USERS_JOURNAL
from cryptdisk.sqlite import connect as sqlite_connect
from tests.server.test_user_commit_crash import Serve, servers  # noqa: F401


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


def _users(s: Serve) -> set[str]:
    with s.connect() as admin:
        return {r[0] for r in admin.execute("SELECT * FROM system.users")}


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

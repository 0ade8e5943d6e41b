"""A policy file (``PATH.policies``) or audit log (``PATH.audit``) that authenticates but
is malformed (not JSON, a field missing or of the wrong type, a table set to a policy the
file does not hold) is a clear :class:`PolicyFileError` naming the file, the record and the
field, never a value: ``cryptdisk serve`` prints ``cryptdisk: error: ...`` and exits 1 at
start, a statement reading the audit log gets an ErrorResponse and the connection goes on.
The malformed records are written through the keyring, so they pass authentication and
reach the parser."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

import cryptdisk.fields  # noqa: F401  (what cryptdisk serve imports: the SQL functions)
from cryptdisk import FieldPolicyError, Keyring, PolicyFileError
from cryptdisk import open as cd_open
from cryptdisk.db import read_policies
from cryptdisk.server import AnalyticalEngine, AuditLog, PolicyStore
from tests.json_edits import Change, set_at
from tests.server.conftest import certs, start_server  # noqa: F401  (fixtures)

#: a body no message may repeat
SECRET = "'s3cr3t-body'"
GOOD: dict[str, Any] = {
    "version": 1,
    "masking": {"pan_mask": {"args": [["v", "VARCHAR"]], "returns": "VARCHAR",
                             "body": f"mask_last4(v) || {SECRET}"}},
    "row_access": {"no_eu": {"args": [["r", "VARCHAR"]], "returns": "BOOLEAN",
                             "body": f"r <> {SECRET}"}},
    "columns": {"cards": {"pan": "pan_mask"}},
    "rows": {"cards": ["no_eu", ["region"]]},
    "apply": ["officers"],
    "audit": ["auditor"],
}

#: (id, bytes or a change to GOOD, what the message says)
CASES: list[tuple[str, bytes | Change, str]] = [
    ("bad JSON", b'{"version": 1, "masking": ', "not JSON (JSONDecodeError at line 1"),
    ("not UTF-8", b"{\x80}", "not JSON (UnicodeDecodeError at byte 1)"),
    ("an array", b"[1, 2]", "a list, not an object"),
    ("no version", set_at("version", ...), "not a cryptdisk policy file (version 1)"),
    ("version true", set_at("version", True), "not a cryptdisk policy file (version 1)"),
    ("masking a list", set_at("masking", []), "masking is a list, not an object"),
    ("apply an object", set_at("apply", {}), "apply is an object, not a list"),
    ("audit of numbers", set_at("audit", [1]), "audit is not a list of role names"),
    ("a policy a string", set_at("masking.pan_mask", "x"),
     "masking['pan_mask'] is a string, not an object"),
    ("no args", set_at("masking.pan_mask.args", ...), "masking['pan_mask'].args is missing"),
    ("args empty", set_at("masking.pan_mask.args", []),
     "masking['pan_mask'].args is not a list of [name, type] pairs"),
    ("an arg a string", set_at("row_access.no_eu.args", ["r"]),
     "row_access['no_eu'].args is not a list of [name, type] pairs"),
    ("no body", set_at("row_access.no_eu.body", ...), "row_access['no_eu'].body is missing"),
    ("body a number", set_at("masking.pan_mask.body", 5),
     "masking['pan_mask'].body is a number, not a string"),
    ("returns a list", set_at("masking.pan_mask.returns", ["VARCHAR"]),
     "masking['pan_mask'].returns is a list, not a string"),
    ("columns of a table a list", set_at("columns.cards", ["pan"]),
     "columns['cards'] is a list, not an object"),
    ("a column's policy a number", set_at("columns.cards.pan", 1),
     "columns['cards']['pan'] is a number, not a policy name"),
    ("a column's policy unknown", set_at("columns.cards.pan", "gone"),
     "columns['cards']['pan'] names masking policy 'gone', which the file does not hold"),
    ("rows of a table a string", set_at("rows.cards", "no_eu"),
     "rows['cards'] is not a [policy name, [column, ...]] pair"),
    ("a row policy unknown", set_at("rows.cards", ["gone", ["region"]]),
     "rows['cards'] names row access policy 'gone', which the file does not hold"),
    ("a row policy's columns short", set_at("rows.cards", ["no_eu", []]),
     "rows['cards'] gives 0 column(s) to row access policy 'no_eu', which takes 1"),
]


def _keyring(config: Path) -> Keyring:
    return Keyring.from_config(str(config))


def _malformed(case: bytes | Change) -> bytes:
    if isinstance(case, bytes):
        return case
    data = copy.deepcopy(GOOD)
    case(data)
    return json.dumps(data).encode()


def _write(path: Path, config: Path, text: bytes, mode: str = "wb") -> None:
    """Write as the server would: through the keyring (it authenticates)."""
    with cd_open(str(path), mode, keyring=_keyring(config)) as f:
        f.write(text)


def test_a_well_formed_policy_file_loads(tmp_path: Path, config: Path) -> None:
    _write(tmp_path / "db.policies", config, json.dumps(GOOD).encode())
    engine = AnalyticalEngine(tmp_path / "db", config)
    store = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
    want = {k: v for k, v in GOOD.items() if k != "version"}
    assert store.data == want
    assert read_policies(tmp_path / "db.policies", engine.keyring) == want


@pytest.mark.parametrize("case,what", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_a_malformed_policy_file_is_an_error_naming_it_and_the_field(
        tmp_path: Path, config: Path, case: bytes | Change, what: str) -> None:
    path = tmp_path / "db.policies"
    _write(path, config, _malformed(case))
    engine = AnalyticalEngine(tmp_path / "db", config)
    # cryptdisk serve's reader and an embedded connection's (cryptdisk.db, with a role)
    for read in (lambda: PolicyStore(path, engine.keyring, engine),
                 lambda: read_policies(path, engine.keyring)):
        with pytest.raises(PolicyFileError) as exc:
            read()
        message = str(exc.value)
        assert message.startswith(f"the policy file {path} is malformed: "), message
        assert what in message, message
        assert "s3cr3t" not in message and "mask_last4" not in message
        assert exc.value.path == str(path) and exc.value.record is None
        assert exc.value.sqlstate == "XX001" and isinstance(exc.value, FieldPolicyError)
        assert "restore it from a backup" in (exc.value.hint or "")


def _serve(db: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cryptdisk", "serve", str(db), "--config",
                           str(config), *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CRYPTDISK_PASSWORD": "pw"})


@pytest.mark.parametrize("case", ["bad JSON", "no body", "a column's policy unknown"])
def test_serve_reports_a_malformed_policy_file_and_exits_1(tmp_path: Path, config: Path,
                                                            case: str) -> None:
    db = tmp_path / "db"
    done = subprocess.run([sys.executable, "-m", "cryptdisk", "sql", str(db), "--create",
                           "-c", str(config), "-q", "SELECT 1"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done
    done = _serve(db, config, "--add-user", "u", "--admin")
    assert done.returncode == 0, done
    _, change, what = next(c for c in CASES if c[0] == case)
    _write(tmp_path / "db.policies", config, _malformed(change))
    for args in [("--check",), ("--self-signed", "--listen", "127.0.0.1:0")]:
        done = _serve(db, config, *args)
        assert done.returncode == 1, done
        assert done.stderr.startswith("cryptdisk: error: the policy file "
                                      f"{tmp_path / 'db.policies'} is malformed: "), done.stderr
        assert what in done.stderr and "cryptdisk: hint: restore it" in done.stderr
        assert "Traceback" not in done.stderr and "s3cr3t" not in done.stderr


#: (id, an audit line, what the message says)
AUDIT_CASES = [
    ("bad JSON", b'{"time": ', "line 2: not JSON (JSONDecodeError at line 1"),
    ("an array", b"[1]", "line 2: a list, not an object"),
    ("no prev", {"prev": ...}, "line 2: prev is missing"),
    ("functions a string", {"functions": "fpe_decrypt"},
     "line 2: functions is not a list of names"),
    ("rows a string", {"rows": "3"}, "line 2: rows is a string, not a whole number or null"),
    ("kind a number", {"kind": 1}, "line 2: kind is a number, not a string"),
]


def _audit_line(change: bytes | dict[str, Any]) -> bytes:
    if isinstance(change, bytes):
        return change
    entry = {"time": "2026-01-01T00:00:00.000+00:00", "session_user": "s3cr3t-user",
             "current_user": "s3cr3t-user", "kind": "function", "functions": ["decrypt"],
             "tables": ["cards"], "columns": [], "rows": 1, "prev": "0" * 64}
    for key, value in change.items():
        if value is ...:
            del entry[key]
        else:
            entry[key] = value
    return json.dumps(entry).encode()


@pytest.mark.parametrize("line,what", [(c[1], c[2]) for c in AUDIT_CASES],
                         ids=[c[0] for c in AUDIT_CASES])
def test_a_malformed_audit_line_is_an_error_naming_the_log_and_the_line(
        tmp_path: Path, config: Path, line: bytes | dict[str, Any], what: str) -> None:
    path = tmp_path / "db.audit"
    _write(path, config, _audit_line({}) + b"\n" + _audit_line(line) + b"\n",
           "ab")  # as AuditLog writes it: a mutable file
    log = AuditLog(path, _keyring(config))
    try:
        with pytest.raises(PolicyFileError) as exc:
            log.entries()
        message = str(exc.value)
        assert message.startswith(f"the audit log {path} is malformed: "), message
        assert what in message and "s3cr3t" not in message, message
        assert exc.value.path == str(path) and exc.value.record == 2
        assert log.verify() == 2  # the chain check names the line too, and does not raise
    finally:
        log.close()


def test_a_statement_reading_a_malformed_audit_log_gets_an_error_response(
        start_server, tmp_path: Path, config: Path) -> None:  # noqa: F811
    engine = AnalyticalEngine(tmp_path / "db", config)
    _write(tmp_path / "db.audit", config, b'{"time": "x", "rows": []}\n', "ab")
    engine.policies = PolicyStore(tmp_path / "db.policies", engine.keyring, engine,
                                  audit=AuditLog(tmp_path / "db.audit", engine.keyring))
    srv = start_server(engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("GRANT AUDIT TO u")
        with pytest.raises(psycopg.errors.DataCorrupted) as exc:
            admin.execute("SELECT * FROM system.audit")
        assert f"the audit log {tmp_path / 'db.audit'} is malformed: line 1: " \
            "session_user is missing" in str(exc.value)
        assert admin.execute("SELECT 40 + 2").fetchone() == (42,)  # the session goes on

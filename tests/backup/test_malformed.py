"""A malformed repository config or manifest is a clear BackupError naming the document and
the field (never a KeyError or TypeError from whatever reads it later, never a value)."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import cryptdisk.sqlite
from cryptdisk.backup import Repository, create, find_backup, list_backups, prune, restore, verify
from cryptdisk.backup._ops import _manifest_chunks, _part_keys
from cryptdisk.backup._repo import check_config, check_manifest
from cryptdisk.errors import BackupError
from cryptdisk.keys import Keyring
from tests.json_edits import set_at

from .helpers import FAST_KDF, make_db

SRC = str(Path(__file__).resolve().parents[2] / "src")
KEYRING = Keyring.generate()


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> tuple[Path, str, str]:
    """A repository with a database backup and a SQLite backup (copied per test)."""
    base = tmp_path_factory.mktemp("malformed")
    make_db(base / "a.db", rows=50)
    lite = cryptdisk.sqlite.connect(str(base / "s.db"), keyring=KEYRING)
    lite.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, s TEXT)")
    lite.execute("INSERT INTO t(s) VALUES ('x')")
    lite.close()
    repo = Repository.init(str(base / "repo"), passphrase="pw", kdf_params=FAST_KDF)
    db_id = create(repo, base / "a.db").id
    sqlite_id = create(repo, base / "s.db", keyring=KEYRING).id
    return base / "repo", db_id, sqlite_id


@pytest.fixture
def repo_path(template, tmp_path) -> Path:
    shutil.copytree(template[0], tmp_path / "repo")
    return tmp_path / "repo"


def _open(path: Path) -> Repository:
    return Repository.open(str(path), passphrase="pw")


def _seal(repo: Repository, backup_id: str, text: bytes) -> None:
    """Write ``text`` as backup ``backup_id``'s manifest, sealed as the repository seals
    one: it authenticates, whatever it holds."""
    nonce = os.urandom(12)
    packed = zstandard.ZstdCompressor().compress(text)
    blob = nonce + repo._aead_manifest.encrypt(nonce, packed, repo._manifest_ad(backup_id))
    (Path(repo.root) / "manifests" / backup_id).write_bytes(blob)


def _doc(repo: Repository, backup_id: str) -> dict[str, Any]:
    return copy.deepcopy(repo.read_manifest(backup_id))


# (which backup, edit, what the error must say)
DB_CASES = [
    ("time", set_at("time", ...), "time is missing"),
    ("time-number", set_at("time", 5), "time is a number, not a string"),
    ("time-words", set_at("time", "yesterday"), "time is not an ISO 8601 time"),
    ("time-naive", set_at("time", "2026-12-02T10:00:00"), "time has no time zone"),
    ("id", set_at("id", ...), "id is missing"),
    ("kind", set_at("kind", "tape"), 'kind is neither "db" nor "sqlite"'),
    ("tables", set_at("tables", ...), "tables is missing"),
    ("tables-object", set_at("tables", {}), "tables is an object, not a list"),
    ("table-string", set_at("tables.0", "t"), "tables[0] is a string, not an object"),
    ("columns", set_at("tables.0.columns.0", ["id"]), "tables[0].columns[0] is not a list of"),
    ("policy", set_at("tables.0.policy", None), "tables[0].policy is null, not a string"),
    ("parts", set_at("tables.0.parts", None), "tables[0].parts is null, not a list"),
    ("rows", set_at("tables.0.parts.0.rows", "12"), "tables[0].parts[0].rows is a string"),
    ("bytes-bool", set_at("tables.0.parts.0.bytes", True), "parts[0].bytes is true or false"),
    ("bytes-negative", set_at("tables.0.parts.0.bytes", -1), "parts[0].bytes is negative"),
    ("sha256", set_at("tables.0.parts.0.sha256", ...), "tables[0].parts[0].sha256 is missing"),
    ("chunks-string", set_at("tables.0.parts.0.chunks", "ab"), "parts[0].chunks is a string"),
    ("chunk-number", set_at("tables.0.parts.0.chunks", [7]), "not a chunk name"),
    ("chunk-path", set_at("tables.0.parts.0.chunks", ["../../config"]), "not a chunk name"),
    ("prev", set_at("prev", 3), "prev is a number, not an object or null"),
    ("prev-id", set_at("prev", {"sha256": "00"}), "prev.id is missing"),
    ("bytes-total", set_at("bytes", "many"), "bytes is a string, not a count"),
]
SQLITE_CASES = [
    ("file", set_at("file", ...), "file is missing"),
    ("file-list", set_at("file", []), "file is a list, not an object"),
    ("file-chunks", set_at("file.chunks", ...), "file.chunks is missing"),
    ("file-bytes", set_at("file.bytes", 1.5), "file.bytes is a number, not a count"),
    ("wal", set_at("wal", "yes"), "wal is a string, not true or false"),
]


@pytest.mark.parametrize(("name", "edit", "says"), DB_CASES + SQLITE_CASES,
                         ids=[c[0] for c in DB_CASES + SQLITE_CASES])
def test_a_malformed_manifest_is_a_clear_error_everywhere(repo_path, template, tmp_path,
                                                          name, edit, says):
    _path, db_id, sqlite_id = template
    bid = sqlite_id if (name, edit, says) in SQLITE_CASES else db_id
    repo = _open(repo_path)
    doc = _doc(repo, bid)
    edit(doc)
    _seal(repo, bid, json.dumps(doc).encode())
    with pytest.raises(BackupError, match="is malformed") as err:
        repo.read_manifest(bid)
    assert says in str(err.value) and bid in str(err.value)
    # every reader of manifests reports it the same way
    assert [b.get("error") for b in list_backups(repo) if b["id"] == bid] == [str(err.value)]
    assert verify(repo).bad_manifests == {bid: str(err.value)}
    with pytest.raises(BackupError, match="is malformed"):
        restore(repo, bid, tmp_path / "restored", keyring=KEYRING)
    with pytest.raises(BackupError, match="is malformed"):
        find_backup(repo, "@2999-01-01")
    with pytest.raises(BackupError, match="is malformed"):
        prune(repo, keep_last=5)


@pytest.mark.parametrize(("text", "says"), [
    (b"", "not JSON (JSONDecodeError at line 1 column 1)"),
    (b"{not json", "not JSON (JSONDecodeError at line 1 column 2)"),
    (b'{"a": "\xff"}', "not JSON (UnicodeDecodeError at byte 7)"),
    (b"[]", "a list, not an object"),
    (b"null", "null, not an object"),
], ids=["empty", "not-json", "not-utf8", "list", "null"])
def test_a_manifest_that_is_not_a_json_object(repo_path, template, text, says):
    repo = _open(repo_path)
    _seal(repo, template[1], text)
    with pytest.raises(BackupError, match="is malformed") as err:
        repo.read_manifest(template[1])
    assert says in str(err.value)


def test_a_truncated_manifest_text(repo_path, template):
    """Cut anywhere (sealed after the cut, so it authenticates): an error, never a traceback."""
    repo = _open(repo_path)
    text = json.dumps(_doc(repo, template[1])).encode()
    for cut in range(0, len(text), max(1, len(text) // 40)):
        _seal(repo, template[1], text[:cut])
        with pytest.raises(BackupError, match="is malformed"):
            repo.read_manifest(template[1])


CONFIG_CASES = [
    (b"", "the repository config is malformed: not JSON"),
    (b'{"format": 1, "id": "ab", "wrapp', "the repository config is malformed: not JSON"),
    (b"\x00\x01", "the repository config is malformed: not JSON"),
    (b"[1]", "malformed: a list, not an object"),
    (b'{"id": ' + b"[" * 100_000, "malformed: not JSON (RecursionError at a nesting too deep"),
    (b'{"format": ' + b"1" * 5000 + b"}", "malformed: not JSON (ValueError at its start)"),
]


def _config_edits(config: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    out = []
    for path, value, says in [
        ("id", ..., "id is missing"),
        ("id", 7, "id is a number, not a string"),
        ("format", ..., "repository format missing is not 1"),
        ("format", "1", "repository format a string is not 1"),
        ("format", 2, "repository format 2 is not 1"),
        ("format", True, "repository format true or false is not 1"),
        ("wrappings", ..., "wrappings is missing"),
        ("wrappings", {}, "wrappings is an object, not a list"),
        ("wrappings.0", "pw", "wrappings[0] is a string, not an object"),
        ("wrappings.0.blob", ..., "wrappings[0].blob is missing"),
        ("wrappings.0.kind", None, "wrappings[0].kind is null, not a string"),
        ("wrappings.0.salt", 5, "wrappings[0].salt is a number, not a string"),
        ("wrappings.0.params", [], "wrappings[0].params is a list, not an object"),
        ("wrappings.0.params.memory_cost", "lots", "params.memory_cost is a string"),
        ("chunker", ..., "chunker is missing"),
        ("chunker.avg", "big", "chunker.avg is a string, not a count"),
        ("params_mac", 1, "params_mac is a number, not a string"),
    ]:
        edited = copy.deepcopy(config)
        set_at(path, value)(edited)
        out.append((edited, says))
    return out


def test_a_malformed_config_is_a_clear_error(repo_path):
    cfg = repo_path / "config"
    good = json.loads(cfg.read_text())
    cases = CONFIG_CASES + [(json.dumps(c).encode(), says) for c, says in _config_edits(good)]
    for text, says in cases:
        cfg.write_bytes(text)
        with pytest.raises(BackupError) as err:
            Repository.open(str(repo_path), passphrase="pw")
        assert says in str(err.value), (text, str(err.value))
        assert "salt" not in str(err.value) or "salt is" in str(err.value)
        for w in good["wrappings"]:  # no wrapped key material in the message
            assert w["blob"] not in str(err.value)


def test_the_cli_reports_a_truncated_config_without_a_traceback(repo_path):
    cfg = repo_path / "config"
    cfg.write_bytes(cfg.read_bytes()[:40])
    r = subprocess.run([sys.executable, "-m", "cryptdisk", "backup", "list", str(repo_path),
                        "--passphrase-env", "BK_PASS"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=SRC, BK_PASS="pw"), timeout=120)
    assert r.returncode != 0
    assert "the repository config is malformed: not JSON" in r.stderr
    assert "Traceback" not in r.stderr


# -- property: whatever the JSON, only BackupError escapes, and what passes is usable ---

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=8)
    | st.sampled_from(["db", "sqlite", "a" * 64, "2026-12-02T10:00:00+00:00"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["id", "time", "kind", "tables", "parts", "chunks", "file", "bytes",
                         "rows", "sha256", "name", "columns", "policy", "prev", "wal",
                         "format", "wrappings", "chunker", "blob", "salt", "params"]),
        inner, max_size=6),
    max_leaves=20)

_GOOD_DB = {"id": "b1", "time": "2026-12-02T10:00:00+00:00", "kind": "db", "prev": None,
            "tables": [{"name": "t", "columns": [["id", "BIGINT"]], "policy": "default",
                        "order_by": "id", "parts": [{"id": "p", "rows": 1, "bytes": 2,
                                                     "sha256": "00", "chunks": ["a" * 64]}]}]}


def _mutated(doc: dict[str, Any], paths: list[str], value: Any) -> Any:
    """``doc`` with ``value`` set at each of ``paths`` that still exists."""
    doc = copy.deepcopy(doc)
    for p in paths:
        try:
            set_at(p, copy.deepcopy(value))(doc)
        except (KeyError, IndexError, TypeError, ValueError):
            pass  # the path is not there (any more)
    return doc


_mutated_manifest = st.builds(
    lambda paths, value: _mutated(_GOOD_DB, paths, value),
    st.lists(st.sampled_from(["id", "time", "kind", "prev", "tables", "tables.0",
                              "tables.0.name", "tables.0.columns", "tables.0.columns.0",
                              "tables.0.parts", "tables.0.parts.0", "tables.0.parts.0.chunks",
                              "tables.0.parts.0.chunks.0", "tables.0.parts.0.bytes",
                              "tables.0.parts.0.rows", "tables.0.parts.0.id"]), max_size=3),
    _json_values)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_json_values, _mutated_manifest))
# a sqlite backup's manifest with a junk "tables": its readers never look at it
@example({"id": "b", "time": "2026-12-02T10:00:00+00:00", "kind": "sqlite", "tables": [None],
          "file": {"bytes": 1, "sha256": "00", "chunks": ["a" * 64]}})
def test_any_json_manifest_is_accepted_usable_or_a_backup_error(value):
    text = json.dumps(value).encode()
    try:
        m = check_manifest(text, "the manifest of backup x")
    except BackupError:
        return
    # what the readers of a manifest do with it now cannot fail on its shape
    list(_manifest_chunks(m))
    for t in m["tables"] if m["kind"] == "db" else []:
        for p in t["parts"]:
            _part_keys(p["sha256"], p.get("id"), p["bytes"])
        {n for n, _t in t["columns"]}


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_json_values, st.binary(max_size=64)))
def test_any_config_is_accepted_or_a_backup_error(value):
    text = value if isinstance(value, bytes) else json.dumps(value).encode()
    try:
        config = check_config(text, "repo")
    except BackupError:
        return
    Repository._params_doc(config)  # what open() reads next
    {w.get("kind") for w in config["wrappings"]}

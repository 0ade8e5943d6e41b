"""A part file cut short (truncated in place, not replaced) while a scan reads it: the
scan raises the part's clear error in the reading thread, and the process lives on and
answers the next query (a memory-mapped file would end it with SIGBUS)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

import cryptdisk
from cryptdisk.db import _parts as part_writer

CHILD = os.path.join(os.path.dirname(__file__), "truncate_child.py")


def _database(root, monkeypatch, policy):
    """A database at ``root/db``: table t, 400,000 rows in one part of 200 row groups on
    ``policy``'s disk, and a small table u; the path of t's part file."""
    monkeypatch.setattr(part_writer, "ROW_GROUP_ROWS", 2_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        db = cryptdisk.connect(root / "db", cache_bytes=0)
    try:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR, c_float DOUBLE) ORDER BY c_int"
               f" SETTINGS storage_policy = '{policy}'")
        db.sql("INSERT INTO t SELECT i::BIGINT, md5(i::VARCHAR), i / 7 "
               "FROM range(400000) r(i)")
        db.sql("CREATE TABLE u (a BIGINT)")
        db.sql("INSERT INTO u SELECT * FROM range(10)")
        (part,) = db.table("t").parts
    finally:
        db.close()
    name = os.path.basename(part.path)
    (path,) = [os.path.join(d, f) for d, _, files in os.walk(root / "db") for f in files
               if f == name]
    return path


@pytest.mark.parametrize(("policy", "env", "error"), [
    ("default", {}, "TruncatedFileError"),
    ("default", {"CRYPTDISK_SEALED_AEAD": "cryptography"}, "TruncatedFileError"),
    ("plain", {}, "CatalogError"),
])
def test_a_part_cut_short_mid_scan_raises_and_the_process_answers_on(
        tmp_path, monkeypatch, policy, env, error):
    """The child's stream has given its first batch (the part open, being read) when the
    parent cuts the part file to half its size: the rest of the stream raises the part's
    error (never a short result), and the same process then answers a query on table u."""
    path = _database(tmp_path, monkeypatch, policy)
    size = os.path.getsize(path)
    child = subprocess.Popen([sys.executable, CHILD, str(tmp_path / "db"), "t"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline() == "ready\n"
        os.truncate(path, size // 2)
        child.stdin.write("go\n")
        child.stdin.flush()
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, (child.returncode, out, err)  # -7: killed by SIGBUS
    lines = out.splitlines()
    assert lines[0].startswith(f"error {error} "), lines
    assert "cut short" in lines[0] and os.path.basename(path) in lines[0], lines
    assert lines[1] == "intact [(10, 45)]", lines


def test_a_part_cut_short_after_its_scan_opened_it_raises_on_the_next_query(
        tmp_path, monkeypatch):
    """A database keeps its parts open between queries: a part cut short after one query
    read it fails the next query that reads it (an AuthenticationError: tampered data),
    and the database answers queries on its other tables."""
    path = _database(tmp_path, monkeypatch, "default")
    with cryptdisk.connect(tmp_path / "db", read_only=True, cache_bytes=0) as db:
        assert db.query("SELECT count(*), max(c_int) FROM t") == [(400_000, 399_999)]
        os.truncate(path, os.path.getsize(path) // 3)
        with pytest.raises(cryptdisk.errors.AuthenticationError, match="cut short"):
            db.query("SELECT max(c_str) FROM t")
        assert db.query("SELECT count(*), sum(a) FROM u") == [(10, 45)]

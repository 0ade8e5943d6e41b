"""A real `cryptdisk serve` (the analytical engine) whose table's part file is cut short in
place after a query read it: the next query reading it gets an ErrorResponse, and the
server, alive, serves other connections (a part read through a memory map ended the
whole server with SIGBUS)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import psycopg
import pytest

import cryptdisk
from cryptdisk.db import _parts as part_writer


def _database(root: Path, policy: str) -> str:
    """``root/app.db`` with table t (400,000 rows in one part of 200 row groups, on
    ``policy``'s disk) and a small table u; the path of t's part file."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generated-key warning
        db = cryptdisk.connect(root / "app.db", cache_bytes=0)
    try:
        db.sql("CREATE TABLE t (c_int BIGINT, c_str VARCHAR) ORDER BY c_int"
               f" SETTINGS storage_policy = '{policy}'")
        db.sql("INSERT INTO t SELECT i::BIGINT, md5(i::VARCHAR) FROM range(400000) r(i)")
        db.sql("CREATE TABLE u (a BIGINT)")
        db.sql("INSERT INTO u SELECT * FROM range(10)")
        (part,) = db.table("t").parts
    finally:
        db.close()
    name = os.path.basename(part.path)
    (path,) = [os.path.join(d, f) for d, _, files in os.walk(root / "app.db")
               for f in files if f == name]
    return path


@pytest.mark.parametrize(("policy", "sqlstate"), [("default", "XX001"), ("plain", "XX000")])
def test_a_part_cut_short_fails_its_query_and_the_server_serves_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str,
        sqlstate: str) -> None:
    monkeypatch.setattr(part_writer, "ROW_GROUP_ROWS", 2_000)
    path = _database(tmp_path, policy)
    db = str(tmp_path / "app.db")
    env = {**os.environ, "CRYPTDISK_PASSWORD": "pw"}
    subprocess.run([sys.executable, "-m", "cryptdisk", "serve", db, "--add-user", "u",
                    "--admin"], env=env, check=True, capture_output=True, timeout=120,
                   cwd=tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "cryptdisk", "serve", db, "--self-signed",
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=tmp_path, env=env)
    try:
        assert proc.stdout is not None
        port = next(int(m[1]) for line in proc.stdout
                    if (m := re.search(r"on 127\.0\.0\.1:(\d+) ", line)))
        conninfo = (f"host=localhost port={port} user=u password=pw dbname=app "
                    f"sslmode=verify-full sslrootcert={tmp_path / 'app.db.server.pem'}")
        with psycopg.connect(conninfo, autocommit=True) as c:
            assert c.execute("SELECT count(*), max(c_str) FROM t").fetchone() == (
                400_000, "fffffe98d0963d27015c198262d97221")
            os.truncate(path, os.path.getsize(path) // 2)
            with pytest.raises(psycopg.Error, match="cut short") as failed:
                c.execute("SELECT max(c_str) FROM t")
            assert isinstance(failed.value, psycopg.DatabaseError)
            # an encrypted part's TruncatedFileError is data_corrupted; a plain part's
            # CatalogError goes out as the server sends other CatalogErrors
            assert failed.value.sqlstate == sqlstate
            assert c.execute("SELECT sum(a) FROM u").fetchone() == (45,)
        with psycopg.connect(conninfo, autocommit=True) as c:  # a second connection
            assert c.execute("SELECT count(*), sum(a) FROM u").fetchone() == (10, 45)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()

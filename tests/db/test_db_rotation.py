"""Key rotation: after rotating (or re-encrypting), the old key can go."""

import os
import subprocess
import sys

import pytest
from dbhelpers import SCHEMA, gen, write_config

import cryptdisk
from cryptdisk.errors import KeyNotFoundError


def make_db(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path, write_config(tmp_path, [1], 1, "c1.toml")) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}; CREATE TABLE p {SCHEMA} SETTINGS storage_policy='plain'")
        db.sql("INSERT INTO t " + gen(1000))
        db.sql("INSERT INTO t " + gen(1000, 1000))
        db.sql("INSERT INTO p " + gen(10))
    return path


def contents(db):
    return db.query("SELECT (SELECT sum(c_int) FROM t), (SELECT count(*) FROM t), "
                    "(SELECT sum(c_int) FROM p)")


def test_sql_rotate_then_old_key_can_go(tmp_path):
    path = make_db(tmp_path)
    with cryptdisk.connect(path, write_config(tmp_path, [1, 2], 2, "c12.toml")) as db:
        expected = contents(db)
        assert db.query("SELECT id, files FROM system.keys ORDER BY id") == [(1, 3), (2, 0)]
        db.sql("SYSTEM ROTATE KEYS")
        assert db.query("SELECT id, files FROM system.keys ORDER BY id") == [(1, 0), (2, 3)]
        assert db.query("SELECT DISTINCT key_id FROM system.parts WHERE disk = 'secure'") == \
            [(2,)]
    only2 = write_config(tmp_path, [2], 2, "c2.toml")
    with cryptdisk.connect(path, only2) as db:
        assert contents(db) == expected
        assert db.check() == 3


def test_without_rotation_the_old_key_is_needed(tmp_path):
    path = make_db(tmp_path)
    with pytest.raises(KeyNotFoundError):
        cryptdisk.connect(path, write_config(tmp_path, [2], 2, "c2.toml"))


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "src"),
         os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_cli_reencrypt_gives_new_data_keys(tmp_path):
    path = make_db(tmp_path)
    with cryptdisk.connect(path, read_only=True,
                           config=write_config(tmp_path, [1], 1, "c1.toml")) as db:
        before_parts = {r[0] for r in db.query("SELECT part FROM system.parts")}
        expected = contents(db)
    done = run_cli("reencrypt", str(path), "--config", str(write_config(tmp_path, [1, 2], 2,
                                                                        "c12.toml")))
    assert done.returncode == 0, done.stderr
    assert "re-encrypted 2 table(s)" in done.stdout
    with cryptdisk.connect(path, write_config(tmp_path, [2], 2, "c2.toml")) as db:
        parts = db.query("SELECT part, key_id, disk FROM system.parts ORDER BY disk")
        assert len(parts) == 2  # merged
        assert not before_parts & {p for p, _k, _d in parts}
        assert [k for _p, k, d in parts if d == "secure"] == [2]
        assert contents(db) == expected


def test_cli_rotate(tmp_path):
    path = make_db(tmp_path)
    done = run_cli("rotate", str(path), "--config",
                   str(write_config(tmp_path, [1, 2], 2, "c12.toml")))
    assert done.returncode == 0, done.stderr
    assert "rewrapped 3 file(s)" in done.stdout
    again = run_cli("rotate", str(path), "--config", str(tmp_path / "c12.toml"))
    assert "rewrapped 0 file(s)" in again.stdout  # idempotent
    with cryptdisk.connect(path, write_config(tmp_path, [2], 2, "c2.toml")) as db:
        assert contents(db)[0][1] == 2000

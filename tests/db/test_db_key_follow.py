"""A writer that holds a database open while ``cryptdisk keys promote`` runs in another
process writes its new files under the key the config makes current at the write."""

import pytest

import cryptdisk
from cryptdisk.errors import ConfigError
from cryptdisk.format import Header

from .dbhelpers import SCHEMA, gen, run_cli, write_config


def header_key_ids(folder):
    return {Header.parse(p.read_bytes()[:128]).key_id
            for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")}


def test_open_writer_takes_the_promoted_key(tmp_path):
    cfg = write_config(tmp_path, [1, 2], 1)
    path = tmp_path / "db"
    store = tmp_path / "store" / "secure"
    with cryptdisk.connect(path, cfg) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql("INSERT INTO t " + gen(100))
        assert header_key_ids(store) == {1}
        done = run_cli("keys", "promote", "2", "-c", str(cfg), "--db", str(path))
        assert done.returncode != 0  # the writer holds the lock: --db is refused
        done = run_cli("keys", "promote", "2", "-c", str(cfg))
        assert done.returncode == 0, done.stderr
        before = {p for p in store.rglob("*") if p.is_file()}
        db.sql("INSERT INTO t " + gen(100, 100))
        new = [p for p in store.rglob("*") if p.is_file() and p not in before]
        assert new
        assert {Header.parse(p.read_bytes()[:128]).key_id for p in new} == {2}
        catalog = (path / "catalog").read_bytes()[:128]
        assert Header.parse(catalog).key_id == 2  # the catalog written by that insert
        assert db.query("SELECT count(*) FROM t") == [(200,)]
    # the old part is still under key 1: retire refuses; rewrapped, key 1 goes
    done = run_cli("keys", "retire", "1", "-c", str(cfg), str(store), str(path))
    assert done.returncode != 0
    done = run_cli("keys", "promote", "2", "-c", str(cfg), "--db", str(path))
    assert done.returncode == 0, done.stderr
    for step in ("retire", "destroy"):
        done = run_cli("keys", step, "1", "-c", str(cfg), "--db", str(path))
        assert done.returncode == 0, done.stderr
    with cryptdisk.connect(path, cfg) as db:
        assert db.query("SELECT count(*) FROM t") == [(200,)]


def test_writer_keeps_its_keys_while_the_config_does_not_load(tmp_path):
    import pyarrow as pa

    import cryptdisk.fields  # (its field functions, as in any process that imported them)

    cfg = write_config(tmp_path, [1, 2], 1)
    path = tmp_path / "db"
    with cryptdisk.connect(path, cfg) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        text = cfg.read_text()
        cfg.write_text(text.replace("current_key_id = 1", "current_key_id = ["))  # half edited
        # a statement's field functions fail on the config until it loads (docs/fields.md)
        with pytest.raises(ConfigError, match="not valid TOML"):
            db.sql("INSERT INTO t " + gen(100))
        # the at-rest keys stay as they were: an insert of Arrow data is written under key 1
        rows = pa.table({"c_int": pa.array(range(100), pa.int64()),
                         "c_str": pa.array([str(i) for i in range(100)]),
                         "c_float": pa.array([i / 7 for i in range(100)])})
        assert db.insert("t", rows) == 100
        assert header_key_ids(tmp_path / "store" / "secure") == {1}
        cfg.write_text(text.replace("current_key_id = 1", "current_key_id = 2"))
        db.sql("INSERT INTO t " + gen(100, 100))
        assert db.query("SELECT DISTINCT key_id FROM system.parts ORDER BY 1") == [(1,), (2,)]

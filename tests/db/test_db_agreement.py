"""A config that disagrees with the catalog is refused; it never writes plaintext into an
encrypted table, and a part that is not what the catalog recorded is a CatalogError."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk import open as cd_open
from cryptdisk.db._catalog import load_catalog
from cryptdisk.errors import CatalogError

from .dbhelpers import SCHEMA, gen, write_config

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def run(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def parquet_files(root):
    return sorted(str(p) for p in root.rglob("*.parquet"))


def test_a_plain_default_disk_over_an_encrypted_database_is_refused(tmp_path):
    """The issue's case: keyring and [policies.default] only, in the database directory."""
    path = tmp_path / "sales.db"
    made = run("sql", str(path), "--create", "-q",
               "CREATE TABLE t (x INT); INSERT INTO t VALUES (1), (2)")
    assert made.returncode == 0, made.stderr
    cfg = path / "keys-only.toml"  # its implicit `default` disk is sales.db/data, plain
    cfg.write_text('[keyring]\n[[keyring.keys]]\nid = 1\nfile = "../sales.db.key"\n'
                   '[policies.default]\nvolumes = [{ name = "main", disks = ["default"] }]\n')
    before = parquet_files(path)
    for sql in ("SELECT sum(x) FROM t", "INSERT INTO t VALUES (3)"):
        done = run("sql", str(path), "--config", str(cfg), "-q", sql)
        assert done.returncode == 1, done.stdout
        assert "Traceback" not in done.stderr and "ArrowInvalid" not in done.stderr
        assert "table t" in done.stderr, done.stderr
        assert "disk 'default' (type encrypted, encrypted)" in done.stderr
        assert "type local, not encrypted" in done.stderr
        assert "MODIFY SETTING storage_policy" in done.stderr  # the hint
    assert parquet_files(path) == before  # nothing written
    for f in before:
        with open(f, "rb") as fh:
            assert fh.read(4) != b"PAR1"
    ok = run("sql", str(path), "-q", "SELECT sum(x) AS s FROM t", "--format", "csv")
    assert ok.stdout == "s\n3\n", ok.stderr


def make_db(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path, write_config(tmp_path, [1], 1, "a.toml")) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}; CREATE TABLE e {SCHEMA}")
        db.sql("INSERT INTO t " + gen(100))
    return path


def plain_default(tmp_path):
    """Config A's disks, but its default policy writes to the plain disk `open`."""
    text = (tmp_path / "a.toml").read_text().replace(
        '[policies.default]\nvolumes = [{ name = "main", disks = ["secure"] }]',
        '[policies.default]\nvolumes = [{ name = "main", disks = ["open"] }]')
    assert "disks = [\"open\"] }]\n[policies.plain]" in text
    cfg = tmp_path / "b.toml"
    cfg.write_text(text)
    return cfg


def test_a_policy_that_turned_plain_is_refused_until_the_table_moves(tmp_path):
    path = make_db(tmp_path)
    cfg_b = plain_default(tmp_path)
    for read_only in (False, True):
        with pytest.raises(CatalogError) as err:
            cryptdisk.connect(path, cfg_b, read_only=read_only)
        msg = str(err.value)
        assert "table t: its storage policy 'default' encrypted" in msg
        assert "table e: its storage policy 'default' encrypted" in msg  # empty, still recorded
        assert "disk 'open' (type local, not encrypted" in msg
    # the explicit move, under the config the tables were written with
    with cryptdisk.connect(path, tmp_path / "a.toml") as db:
        db.sql("ALTER TABLE t MODIFY SETTING storage_policy = 'plain'; DROP TABLE e")
    with cryptdisk.connect(path, cfg_b) as db:
        db.sql("INSERT INTO t " + gen(10, 100))
        assert db.query("SELECT count(*) FROM t") == [(110,)]
        assert db.query("SELECT DISTINCT disk FROM system.parts") == [("open",)]


def reseal_without_new_fields(path, keyring):
    """Rewrite the catalog as a version without the storage fields wrote it."""
    catalog = load_catalog(str(path), keyring)
    doc = json.loads(catalog.to_json())
    for t in doc["tables"]:
        del t["encrypted"]
        for p in t["parts"]:
            del p["encrypted"], p["disk_type"]
    with cd_open(os.path.join(path, "catalog"), "wb", keyring=keyring) as f:
        f.write(json.dumps(doc).encode())


def test_an_older_catalog_opens_and_is_recorded(tmp_path):
    path = make_db(tmp_path)
    cfg_a = tmp_path / "a.toml"
    keyring = cryptdisk.Keyring.from_config(cfg_a)
    reseal_without_new_fields(path, keyring)
    with pytest.raises(CatalogError, match="table t: part .* was written to disk 'secure' "
                       r"\(encrypted\); this config's is disk 'secure' \(type local"):
        cfg = tmp_path / "c.toml"  # `secure` a plain disk over the same files
        cfg.write_text(cfg_a.read_text().replace(
            '[disks.secure]\ntype = "encrypted"\ndisk = "secure_local"',
            '[disks.secure]\ntype = "local"\npath = "store/secure"'))
        cryptdisk.connect(path, cfg)
    with cryptdisk.connect(path, cfg_a) as db:
        assert db.query("SELECT count(*) FROM t") == [(100,)]
        assert load_catalog(str(path), keyring).tables["t"].encrypted is None  # opening writes
        db.sql("INSERT INTO t " + gen(1, 100))  # the next change records what was inferred
    recorded = load_catalog(str(path), keyring)
    assert recorded.tables["t"].encrypted is True and recorded.tables["e"].encrypted is True
    assert [(p.encrypted, p.disk_type) for p in recorded.tables["t"].parts] == \
        [(True, "encrypted"), (True, "encrypted")]


def test_a_part_that_is_not_what_the_catalog_recorded_is_a_catalog_error(tmp_path):
    path = make_db(tmp_path)
    cfg = tmp_path / "a.toml"
    with cryptdisk.connect(path, cfg) as db:
        db.sql(f"CREATE TABLE p {SCHEMA} SETTINGS storage_policy = 'plain'")
        db.sql("INSERT INTO p " + gen(10))
        files = dict(db.query("SELECT disk, path FROM system.parts"))
    secure = tmp_path / "store" / "secure" / files["secure"]
    plain = tmp_path / "store" / "open" / files["open"]
    encrypted_bytes = secure.read_bytes()
    pq.write_table(pa.table({"c_int": [1]}), secure)  # plain Parquet where encrypted was
    plain.write_bytes(encrypted_bytes)  # encrypted bytes where plain Parquet was
    with cryptdisk.connect(path, cfg) as db:
        for table, disk in (("t", "secure"), ("p", "open")):
            with pytest.raises(CatalogError, match=f"on disk '{disk}' is not what the catalog"):
                db.query(f"SELECT sum(c_int) FROM {table}")
        with pytest.raises(CatalogError):
            db.check()

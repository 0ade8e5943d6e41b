"""Key rotation: after rotating (or re-encrypting), the old key can go."""

import os

import pytest

import cryptdisk
from cryptdisk.errors import KeyNotFoundError, RotationError

from .dbhelpers import SCHEMA, gen, run_cli, write_config


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


def header_key_id(path):
    from cryptdisk.format import read_header

    with open(path, "rb") as f:
        return read_header(f).key_id


def configless_db(tmp_path):
    """The issue's setup: a database made by the CLI with no config, one insert."""
    path = tmp_path / "sales.db"
    made = run_cli("sql", str(path), "--create", "-q", "CREATE TABLE t (x INT); "
                   "INSERT INTO t VALUES (1), (2), (3)")
    assert made.returncode == 0, made.stderr
    (tmp_path / "new.key").unlink(missing_ok=True)
    assert run_cli("keygen", "-o", str(tmp_path / "new.key"), "--id", "2").returncode == 0
    return path


def keyring_toml(tmp_path, extra, name="new-key.toml"):
    cfg = tmp_path / name
    cfg.write_text('[keyring]\ncurrent_key_id = 2\n'
                   '[[keyring.keys]]\nid = 1\nfile = "sales.db.key"\n'
                   '[[keyring.keys]]\nid = 2\nfile = "new.key"\n' + extra)
    return cfg


def part_files(path):
    return sorted(str(p) for p in (path / "data").rglob("*.parquet"))


@pytest.mark.parametrize("disk", [
    # the config: `default` is the implicit plain disk at ./data
    '[policies.default]\nvolumes = [{ name = "main", disks = ["default"] }]\n',
    # an encrypted disk, but over another directory: the parts are not there
    '[disks.raw]\ntype = "local"\npath = "elsewhere"\n'
    '[disks.default]\ntype = "encrypted"\ndisk = "raw"\n'
    '[policies.default]\nvolumes = [{ name = "main", disks = ["default"] }]\n',
])
def test_rotate_refuses_when_a_part_is_not_found(tmp_path, disk):
    path = configless_db(tmp_path)
    parts = part_files(path)
    assert len(parts) == 1
    done = run_cli("rotate", str(path), "--config", str(keyring_toml(tmp_path, disk)))
    assert done.returncode == 1, done.stdout
    assert "rewrapped" not in done.stdout
    assert "Traceback" not in done.stderr
    rel = os.path.relpath(parts[0], path / "data")
    assert rel in done.stderr  # names the file left
    # nothing was changed: every file is still under key 1, and the database opens as before
    assert header_key_id(path / "catalog") == 1 and header_key_id(parts[0]) == 1
    with cryptdisk.connect(path) as db:
        assert db.query("SELECT id, files FROM system.keys") == [(1, 2)]
        assert db.query("SELECT sum(x) FROM t") == [(6,)]


def test_rotation_checks_the_headers_after_the_fact(tmp_path, monkeypatch):
    """A rewrap that reported success but left a header alone is caught and named."""
    from cryptdisk.db import _rotation
    from cryptdisk.errors import RotationError

    path = make_db(tmp_path)
    skipped = []

    def lazy_rewrap(disk, part_path):
        if not skipped:
            skipped.append(part_path)
            return True  # claims to have rewrapped, did nothing
        return disk.rewrap(part_path)

    monkeypatch.setattr(_rotation, "rewrap_on_disk", lazy_rewrap)
    with cryptdisk.connect(path, write_config(tmp_path, [1, 2], 2, "c12.toml")) as db:
        with pytest.raises(RotationError) as err:
            db.sql("SYSTEM ROTATE KEYS")
        assert skipped[0] in str(err.value) and "under key 1, not 2" in str(err.value)
        assert any(skipped[0] in f for f in err.value.files)
        monkeypatch.undo()
        db.sql("SYSTEM ROTATE KEYS")  # running it again finishes the job
        assert db.query("SELECT id, files FROM system.keys ORDER BY id") == [(1, 0), (2, 3)]


def test_reencrypt_changes_nothing_when_a_part_is_missing(tmp_path):
    from cryptdisk.errors import RotationError

    path = make_db(tmp_path)
    cfg = write_config(tmp_path, [1, 2], 2, "c12.toml")
    with cryptdisk.connect(path, cfg) as db:
        before = db.query("SELECT part, key_id FROM system.parts ORDER BY part")
        plain = db.query("SELECT path FROM system.parts WHERE disk = 'open'")[0][0]
    os.remove(tmp_path / "store" / "open" / plain)
    done = run_cli("reencrypt", str(path), "--config", str(cfg))
    assert done.returncode == 1 and plain in done.stderr, done.stderr
    assert "stopped before changing anything" in done.stderr
    with cryptdisk.connect(path, cfg) as db:
        assert db.query("SELECT part, key_id FROM system.parts ORDER BY part") == before
        with pytest.raises(RotationError):
            db.sql("SYSTEM REENCRYPT")


def test_reencrypt_on_a_remote_encrypted_disk(tmp_path):
    """Headers there cannot be rewritten in place: re-encryption writes new files instead."""
    import uuid

    from cryptdisk.errors import RotationError

    def config(keys, current, name):
        base = write_config(tmp_path, keys, current, name).read_text()
        text = base.replace('[disks.secure_local]\ntype = "local"\npath = "store/secure"',
                            f'[disks.secure_local]\ntype = "fsspec"\nurl = "memory://{bucket}"')
        (tmp_path / name).write_text(text)
        return tmp_path / name

    bucket = uuid.uuid4().hex
    path = tmp_path / "db"
    with cryptdisk.connect(path, config([1], 1, "r1.toml")) as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql("INSERT INTO t " + gen(500))
    with cryptdisk.connect(path, config([1, 2], 2, "r12.toml")) as db:
        with pytest.raises(RotationError, match="cannot rewrite a header in place"):
            db.sql("SYSTEM ROTATE KEYS")
        db.sql("SYSTEM REENCRYPT")
        assert db.query("SELECT id, files FROM system.keys ORDER BY id") == [(1, 0), (2, 2)]
        db.sql("SYSTEM ROTATE KEYS")  # nothing left to rewrap there
    with cryptdisk.connect(path, config([2], 2, "r2.toml")) as db:
        assert db.query("SELECT count(*), sum(c_int) FROM t") == [(500, 124750)]


def test_rotate_refuses_a_disk_whose_own_current_key_is_not_the_configs(tmp_path):
    """A disk limited to its keys = [1] writes and rewraps under key 1 whatever the
    keyring's current key: a rotation to key 2 rewrapped the catalog only, then failed
    ('did not finish ... run the rotation again'), which could never finish."""
    path = make_db(tmp_path)
    cfg = write_config(tmp_path, [1, 2], 2, "c12.toml")
    cfg.write_text(cfg.read_text().replace('disk = "secure_local"\n',
                                           'disk = "secure_local"\nkeys = [1]\n'))
    catalog = (path / "catalog").read_bytes()
    with cryptdisk.connect(path, cfg) as db:
        with pytest.raises(RotationError, match="stopped before changing anything") as err:
            db.sql("SYSTEM ROTATE KEYS")
        assert "disk 'secure' writes under its current key 1, not the keyring's 2" in \
            str(err.value)
    assert (path / "catalog").read_bytes() == catalog

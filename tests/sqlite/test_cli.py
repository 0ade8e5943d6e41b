"""``cryptdisk sqlite encrypt|decrypt|rotate`` end to end, as a user runs them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import apsw
import pytest

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk.format import HEADER_SIZE, Header


def run(*args, env=None, cwd=None):
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                **(env or {})}
    return subprocess.run([sys.executable, "-m", "cryptdisk", *map(str, args)],
                          capture_output=True, text=True, env=full_env, cwd=cwd, timeout=120)


@pytest.fixture
def key_env():
    return {"SQLITE_TEST_KEY": os.urandom(32).hex()}


def plain_db(path, rows=500):
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA page_size=8192")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)")
    conn.execute("CREATE INDEX t_v ON t(v)")
    with conn:
        conn.executemany("INSERT INTO t(v) VALUES(?)", [(f"PLAINTEXT-{i}",) for i in range(rows)])
    conn.close()


def rows_of(conn):
    return conn.execute("SELECT * FROM t ORDER BY id").fetchall()


def test_encrypt_then_decrypt(tmp_path, key_env):
    plain_db(tmp_path / "p.db")
    r = run("sqlite", "encrypt", tmp_path / "p.db", tmp_path / "e.db", "--key-env",
            "SQLITE_TEST_KEY", env=key_env)
    assert r.returncode == 0, r.stderr
    raw = (tmp_path / "e.db").read_bytes()
    assert b"PLAINTEXT-" not in raw and Header.parse(raw[:HEADER_SIZE]).segment_size == 8192
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(key_env["SQLITE_TEST_KEY"]))])
    conn = csql.connect(str(tmp_path / "e.db"), keyring=keyring)
    expected = rows_of(apsw.Connection(str(tmp_path / "p.db")))
    assert rows_of(conn) == expected and len(expected) == 500
    conn.close()
    r = run("sqlite", "decrypt", tmp_path / "e.db", tmp_path / "d.db", "--key-env",
            "SQLITE_TEST_KEY", env=key_env)
    assert r.returncode == 0, r.stderr
    assert rows_of(apsw.Connection(str(tmp_path / "d.db"))) == expected


def test_refuses_to_overwrite_and_bad_inputs(tmp_path, key_env):
    plain_db(tmp_path / "p.db")
    (tmp_path / "exists.db").write_bytes(b"x")
    r = run("sqlite", "encrypt", tmp_path / "p.db", tmp_path / "exists.db", "--key-env",
            "SQLITE_TEST_KEY", env=key_env)
    assert r.returncode == 1 and "already exists" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "exists.db").read_bytes() == b"x"
    r = run("sqlite", "decrypt", tmp_path / "p.db", tmp_path / "d.db", "--key-env",
            "SQLITE_TEST_KEY", env=key_env)
    assert r.returncode == 1 and "not a cryptdisk-encrypted database" in r.stderr
    assert not (tmp_path / "d.db").exists()
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    r = run("sqlite", "encrypt", tmp_path / "junk.db", tmp_path / "e.db", "--key-env",
            "SQLITE_TEST_KEY", env=key_env)
    assert r.returncode == 1 and "not a plain SQLite database" in r.stderr
    assert not (tmp_path / "e.db").exists()
    r = run("sqlite", "encrypt", tmp_path / "p.db", tmp_path / "e.db")
    assert r.returncode == 1 and "no key given" in r.stderr


def test_wrong_key_on_decrypt(tmp_path, key_env):
    plain_db(tmp_path / "p.db")
    assert run("sqlite", "encrypt", tmp_path / "p.db", tmp_path / "e.db", "--key-env",
               "SQLITE_TEST_KEY", env=key_env).returncode == 0
    r = run("sqlite", "decrypt", tmp_path / "e.db", tmp_path / "d.db", "--key-env", "OTHER",
            env={"OTHER": os.urandom(32).hex()})
    assert r.returncode == 1 and "not the key this file was encrypted with" in r.stderr
    assert key_env["SQLITE_TEST_KEY"] not in r.stderr + r.stdout


def test_encrypt_from_sqlcipher(tmp_path, key_env):
    sqlcipher3 = pytest.importorskip("sqlcipher3", reason="sqlcipher3 is a bench extra")
    src = tmp_path / "cipher.db"
    conn = sqlcipher3.connect(str(src))
    conn.execute("PRAGMA key = 'correct horse'")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY AUTOINCREMENT, v TEXT)")
    conn.execute("CREATE INDEX t_v ON t(v)")
    conn.execute("CREATE VIEW v AS SELECT count(*) FROM t")
    conn.executemany("INSERT INTO t(v) VALUES(?)", [(f"row-{i}",) for i in range(300)])
    conn.execute("PRAGMA user_version=7")
    conn.commit()
    conn.close()
    env = {**key_env, "PASS": "correct horse"}
    r = run("sqlite", "encrypt", src, tmp_path / "e.db", "--key-env", "SQLITE_TEST_KEY",
            "--sqlcipher-passphrase-env", "PASS", env=env)
    assert r.returncode == 0, r.stderr
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(key_env["SQLITE_TEST_KEY"]))])
    enc = csql.connect(str(tmp_path / "e.db"), keyring=keyring)
    assert rows_of(enc) == [(i + 1, f"row-{i}") for i in range(300)]
    assert enc.execute("SELECT * FROM v").fetchall() == [(300,)]
    assert enc.execute("PRAGMA user_version").fetchall() == [(7,)]
    assert enc.execute("SELECT seq FROM sqlite_sequence").fetchall() == [(300,)]
    assert enc.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    enc.close()
    r = run("sqlite", "encrypt", src, tmp_path / "f.db", "--key-env", "SQLITE_TEST_KEY",
            "--sqlcipher-passphrase-env", "PASS", env={**key_env, "PASS": "wrong"})
    assert r.returncode == 1 and "passphrase" in r.stderr
    assert not (tmp_path / "f.db").exists()


def test_rotate_rewraps_db_and_wal(tmp_path):
    old, new = os.urandom(32), os.urandom(32)
    config = tmp_path / "keys.toml"
    config.write_text(f'[keyring]\ncurrent_key_id = 2\n[[keyring.keys]]\nid = 1\nhex = '
                      f'"{old.hex()}"\n[[keyring.keys]]\nid = 2\nhex = "{new.hex()}"\n')
    os.chmod(config, 0o600)
    db = tmp_path / "r.db"
    conn = csql.connect(str(db), keyring=cryptdisk.Keyring([cryptdisk.Key(1, old)]))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO t VALUES(1, 'kept in the wal')")
    r = run("sqlite", "rotate", db, "--keyring", config)  # while the database is open
    assert r.returncode == 0, r.stderr
    assert "r.db: rewrapped" in r.stdout and "r.db-wal: rewrapped" in r.stdout
    for name in (db, tmp_path / "r.db-wal"):
        assert Header.parse(name.read_bytes()[:HEADER_SIZE]).key_id == 2
    assert conn.execute("SELECT v FROM t").fetchall() == [("kept in the wal",)]
    conn.execute("INSERT INTO t VALUES(2, 'after rotation')")
    conn.close()
    only_new = cryptdisk.Keyring([cryptdisk.Key(2, new)])
    again = csql.connect(str(db), keyring=only_new)
    assert again.execute("SELECT count(*) FROM t").fetchall() == [(2,)]
    again.close()
    r = run("sqlite", "rotate", db, "--keyring", config)
    assert r.returncode == 0 and "already under the current key" in r.stdout


@pytest.mark.parametrize("command", ["sqlite rotate", "keys promote", "rewrap"])
def test_rotate_never_puts_an_old_journal_header_over_a_new_one(tmp_path, command):
    """A writer in TRUNCATE mode starts each transaction's journal with a new header (a new
    data key). A rotation that read the header of one transaction's journal and wrote it
    back, rewrapped, after the next transaction had begun would leave that journal under
    the old data key: after a crash it no longer rolls back and the half-written
    transaction stays in the database. The rotation holds SQLite's lock instead, and so do
    the commands that rewrap an SQLite database given among files."""
    old, new = os.urandom(32), os.urandom(32)
    config = tmp_path / "keys.toml"
    config.write_text(f'[keyring]\ncurrent_key_id = 2\n[[keyring.keys]]\nid = 1\nhex = '
                      f'"{old.hex()}"\n[[keyring.keys]]\nid = 2\nhex = "{new.hex()}"\n')
    os.chmod(config, 0o600)
    db = str(tmp_path / "j.db")
    conn = csql.connect(db, keyring=cryptdisk.Keyring([cryptdisk.Key(1, old)]))
    conn.execute("PRAGMA journal_mode=TRUNCATE")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB, n INT)")
    with conn:
        conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                     "WHERE x < 200) INSERT INTO t(v, n) SELECT randomblob(3000), 0 FROM c")
    conn.close()
    child = os.path.join(os.path.dirname(__file__), "rotate_race_child.py")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    writer = subprocess.Popen([sys.executable, child, "writer", db, str(tmp_path), old.hex()],
                              env=env)
    for _ in range(3000):
        if (tmp_path / "journal").exists() or writer.poll() is not None:
            break
        time.sleep(0.01)
    assert (tmp_path / "journal").exists()
    argv = {"sqlite rotate": ["sqlite", "rotate", db, "--keyring", str(config)],
            "keys promote": ["keys", "promote", "2", "-c", str(config), db],
            "rewrap": ["rewrap", "-c", str(config), db]}[command]
    rotation = subprocess.run([sys.executable, child, "rotate", str(tmp_path), *argv],
                              env=env, capture_output=True, text=True, timeout=120)
    assert writer.wait(timeout=120) == 0 and (tmp_path / "died").exists()
    assert rotation.returncode == 0, rotation.stderr
    conn = csql.connect(db, keyring=cryptdisk.Keyring([cryptdisk.Key(1, old),
                                                       cryptdisk.Key(2, new)], 2))
    assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    # the transaction the writer died in is rolled back: no row has n = 1
    assert conn.execute("SELECT count(*), sum(n) FROM t").fetchall() == [(200, 0)]
    conn.close()
    assert Header.parse((tmp_path / "j.db").read_bytes()[:HEADER_SIZE]).key_id == 2


@pytest.mark.parametrize("command", ["rotate", "reencrypt"])
def test_database_commands_on_an_sqlite_file_point_to_cryptdisk_sqlite(tmp_path, command):
    """'cryptdisk rotate|reencrypt PATH' take a database directory; given an encrypted
    SQLite file they say so and name the command that handles it."""
    key = tmp_path / "k.key"
    assert run("keygen", "-o", key).returncode == 0
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, cryptdisk.keys.read_key_file(str(key))[0])])
    conn = csql.connect(str(tmp_path / "app.db"), keyring=keyring)
    conn.execute("CREATE TABLE t(x)")
    conn.close()
    (tmp_path / "c.toml").write_text(
        f'[keyring]\ncurrent_key_id = 1\n[[keyring.keys]]\nid = 1\nfile = "{key}"\n')
    r = run(command, tmp_path / "app.db", "-c", tmp_path / "c.toml")
    assert r.returncode == 1
    assert r.stderr.startswith(f"cryptdisk: error: no cryptdisk database at {tmp_path / 'app.db'}")
    assert "cryptdisk: hint: " in r.stderr and "cryptdisk sqlite rotate" in r.stderr
    assert "VACUUM INTO" in r.stderr


def test_new_encrypted_databases_are_owner_only_whatever_the_umask(tmp_path, key_env):
    """`sqlite encrypt`'s OUTPUT and a database connect() creates are mode 0600 (SQLite
    alone makes 0644 under umask 022), and the WAL takes the database's mode."""
    plain_db(tmp_path / "p.db", rows=10)
    keyring = cryptdisk.Keyring([cryptdisk.Key(1, bytes.fromhex(key_env["SQLITE_TEST_KEY"]))])
    old = os.umask(0o022)
    try:
        r = run("sqlite", "encrypt", tmp_path / "p.db", tmp_path / "e.db", "--key-env",
                "SQLITE_TEST_KEY", env=key_env)
        assert r.returncode == 0, r.stderr
        conn = csql.connect(str(tmp_path / "w.db"), keyring=keyring)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t(x); INSERT INTO t VALUES (1)")
        modes = {n: (tmp_path / n).stat().st_mode & 0o777 for n in ("e.db", "w.db", "w.db-wal")}
        conn.close()
        assert modes == {"e.db": 0o600, "w.db": 0o600, "w.db-wal": 0o600}
        r = run("sqlite", "decrypt", tmp_path / "e.db", tmp_path / "d.db", "--key-env",
                "SQLITE_TEST_KEY", env=key_env)  # the plaintext copy: owner-only too
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "d.db").stat().st_mode & 0o777 == 0o600
        assert csql.connect(str(tmp_path / "e.db"), keyring=keyring).execute(
            "SELECT count(*) FROM t").fetchall() == [(10,)]
        assert csql.connect(":memory:", keyring=keyring).execute("SELECT 1").fetchall() == [(1,)]
        with pytest.raises(apsw.CantOpenError):
            csql.connect(str(tmp_path / "none.db"), keyring=keyring,
                         flags=apsw.SQLITE_OPEN_READONLY)
        assert not (tmp_path / "none.db").exists()
    finally:
        os.umask(old)


@pytest.mark.parametrize("command", ["encrypt", "decrypt"])
def test_an_empty_or_directory_source_is_an_error_not_an_empty_database(tmp_path, key_env,
                                                                        command):
    """A 0-byte SRC (a mistyped path that sqlite3.connect created) was copied, exit 0, to an
    empty database, since SQLite opens an empty file as a new one: encrypt made an encrypted
    empty database and decrypt a plain one from a file that is not encrypted at all. Both
    now refuse it, one line, and write nothing; a directory is named as one."""
    (tmp_path / "empty.db").write_bytes(b"")
    r = run("sqlite", command, tmp_path / "empty.db", tmp_path / "out.db", "--key-env",
            "SQLITE_TEST_KEY", env=key_env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[0] == (f"cryptdisk: error: {tmp_path / 'empty.db'}: empty "
                                        "file (0 bytes), not a database to copy")
    assert sorted(os.listdir(tmp_path)) == ["empty.db"]
    r = run("sqlite", command, tmp_path, tmp_path / "out.db", "--key-env", "SQLITE_TEST_KEY",
            env=key_env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr == f"cryptdisk: error: {tmp_path}: is a directory, not a database file\n"
    assert sorted(os.listdir(tmp_path)) == ["empty.db"]

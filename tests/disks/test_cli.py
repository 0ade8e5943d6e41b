"""``cryptdisk disks``, ``policies`` and ``convert``, run as a user runs them (subprocess)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import cryptdisk
from cryptdisk.config import load_config
from tests.configs import encrypted_over_local

K1 = "ab" * 32
#: The source tree of the cryptdisk being tested, for child processes.
SRC_ROOT = str(Path(cryptdisk.__file__).resolve().parents[1])

CONFIG = encrypted_over_local(K1, "segment_size = 4096", """
[policies.main]
[[policies.main.volumes]]
name = "hot"
disks = ["secure", "raw"]
[[policies.main.volumes]]
name = "cold"
disks = ["raw"]
""")


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=120)


@pytest.fixture
def config(tmp_path: Path) -> str:
    p = tmp_path / "c.toml"
    p.write_text(CONFIG)
    return str(p)


def test_disks_table_csv_json(config: str, tmp_path: Path) -> None:
    table = cli("disks", "--config", config)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["name", "path", "type", "is_encrypted", "disk", "algorithm"]
    assert any(line.split()[:4] == ["secure", f"{tmp_path}/raw/enc/", "encrypted", "true"]
               for line in lines)
    rows = list(csv.DictReader(io.StringIO(cli("disks", "-c", config, "--format", "csv").stdout)))
    assert {r["name"]: r["is_encrypted"] for r in rows} == {"default": "false", "raw": "false",
                                                           "secure": "true"}
    data = json.loads(cli("disks", "-c", config, "--format", "json").stdout)
    assert [d["name"] for d in data] == ["default", "raw", "secure"]
    assert [d["is_encrypted"] for d in data] == [False, False, True]
    assert K1 not in table.stdout


def test_policies(config: str) -> None:
    out = json.loads(cli("policies", "-c", config, "--format", "json").stdout)
    assert out == [
        {"policy_name": "default", "volume_name": "default", "volume_priority": 1,
         "disks": ["default"]},
        {"policy_name": "main", "volume_name": "hot", "volume_priority": 1,
         "disks": ["secure", "raw"]},
        {"policy_name": "main", "volume_name": "cold", "volume_priority": 2, "disks": ["raw"]},
    ]


def test_bad_config_is_a_clean_error(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("[disks.x]\ntype = 'encrypted'\ndisk = 'missing'\n")
    done = cli("disks", "-c", str(p))
    assert done.returncode == 1
    assert done.stderr.startswith("cryptdisk: error: ")
    assert str(p) in done.stderr and "line 1" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_misspelt_xml_setting_is_refused_not_defaulted(tmp_path: Path) -> None:
    p = tmp_path / "storage.xml"
    p.write_text("<clickhouse><storage_configuration><disks>\n"
                 f"<d><path>{tmp_path}/d/</path></d>\n"
                 "<enc><type>encrypted</type><disk>d</disk>\n"
                 f"<key_hex>{K1}</key_hex>\n"
                 "<algoritm>AES_256_CTR</algoritm></enc>\n"
                 "</disks></storage_configuration></clickhouse>\n")
    done = cli("disks", "-c", str(p))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(f"cryptdisk: error: {p}:storage_configuration/disks/enc/"
                                  "algoritm, line 5: unknown element <algoritm>")
    assert K1 not in done.stderr and "Traceback" not in done.stderr


def _tree(root: Path) -> dict[str, bytes]:
    files = {"a/one.txt": b"MARKER-ONE\n" * 100, "b.bin": os.urandom(70_000), "empty": b"",
             "deep/er/x.csv": b"1,2,3\n"}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_convert_round_trip_and_resume(config: str, tmp_path: Path) -> None:
    src, enc, back = tmp_path / "src", tmp_path / "enc", tmp_path / "back"
    files = _tree(src)
    first = cli("convert", str(src), str(enc), "-c", config)
    assert first.returncode == 0, first.stderr
    assert "converted 4 file(s)" in first.stdout
    for rel in files:
        stored = (enc / rel).read_bytes()
        assert stored.startswith(b"CRYPTDSK") and b"MARKER" not in stored
    # An interrupted earlier run: one file missing, one stray temp file, one stale target.
    (enc / "b.bin").unlink()
    (enc / "a" / ".one.txt.123abc.cdtmp").write_bytes(b"half")
    again = cli("convert", str(src), str(enc), "-c", config)
    assert again.returncode == 0, again.stderr
    assert "converted 1 file(s)" in again.stdout and "skipped 3" in again.stdout
    assert "removed 1 unfinished" in again.stdout
    assert not (enc / "a" / ".one.txt.123abc.cdtmp").exists()
    plain = cli("convert", str(enc), str(back), "-c", config, "--to", "plain")
    assert plain.returncode == 0, plain.stderr
    for rel, data in files.items():
        assert (back / rel).read_bytes() == data


def test_convert_into_a_disk_that_encrypts_names(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG.replace('segment_size = 4096',
                                     'segment_size = 4096\nencrypt_names = true\n'
                                     'names_key_id = 1'))
    src, enc = tmp_path / "src", tmp_path / "raw" / "enc"
    files = _tree(src)
    done = cli("convert", str(src), str(enc), "-c", str(config), "--disk", "secure")
    assert done.returncode == 0, done.stderr
    stored = [p.name for p in enc.rglob("*")]
    assert stored and not any(rel.split("/")[-1] in stored for rel in files)
    disk = load_config(config).disks["secure"]
    assert {rel: disk.read_bytes(rel) for rel in disk.list()} == files


def test_convert_refuses_overlapping_trees(config: str, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    done = cli("convert", str(tmp_path / "src"), str(tmp_path / "src" / "out"), "-c", config)
    assert done.returncode == 1 and "separate trees" in done.stderr


def test_convert_names_file_with_missing_key(config: str, tmp_path: Path) -> None:
    src, enc = tmp_path / "src", tmp_path / "enc"
    _tree(src)
    assert cli("convert", str(src), str(enc), "-c", config).returncode == 0
    other = tmp_path / "other.toml"
    other.write_text("[keyring]\n[[keyring.keys]]\nid = 9\nhex = '" + "cd" * 32 + "'\n")
    done = cli("convert", str(enc), str(tmp_path / "out"), "-c", str(other), "--to", "plain")
    assert done.returncode == 1
    assert "id 1" in done.stderr and str(enc) in done.stderr


def test_convert_clickhouse_disks_whose_key_ids_coincide_with_the_keyrings(
        tmp_path: Path) -> None:
    # Disk "ring" takes the keyring's keys 1 and 2; disk "own" has its own key 1, another
    # key. Ids are per key set: each file is found by its key's fingerprint.
    config = tmp_path / "c.toml"
    config.write_text(f"""
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
hex = "{K1}"
[[keyring.keys]]
id = 2
hex = "{'cd' * 32}"
[disks.raw]
type = "local"
path = "raw"
[disks.ring]
type = "clickhouse"
disk = "raw"
path = "ring/"
algorithm = "AES_256_CTR"
[disks.own]
type = "clickhouse"
disk = "raw"
path = "own/"
current_key_id = 1
[[disks.own.keys]]
id = 1
hex = "00112233445566778899aabbccddeeff"
""")
    cfg = load_config(config)
    cfg.disks["ring"].write_bytes("a.bin", b"RING-DATA" * 500)
    cfg.disks["own"].write_bytes("b.bin", b"OWN-DATA" * 500)
    done = cli("convert", str(tmp_path / "raw"), str(tmp_path / "enc"), "-c", str(config))
    assert done.returncode == 0, done.stderr
    assert "converted 2 file(s)" in done.stdout and "sources: 2 clickhouse" in done.stdout
    back = cli("convert", str(tmp_path / "enc"), str(tmp_path / "back"), "-c", str(config),
               "--to", "plain")
    assert back.returncode == 0, back.stderr
    assert (tmp_path / "back" / "ring" / "a.bin").read_bytes() == b"RING-DATA" * 500
    assert (tmp_path / "back" / "own" / "b.bin").read_bytes() == b"OWN-DATA" * 500


def test_convert_reads_a_torn_log_through_its_saved_segment_and_leaves_that_out(
        tmp_path: Path) -> None:
    """A tree holding an append-only log (the server's access or audit log) whose last write
    a crash cut holds ``NAME-cdlogtail`` beside it. convert read the log through it (as every
    reader does) but also converted ``NAME-cdlogtail`` as a plain file of its own: a
    sealed copy of the raw record in DST, read by nothing, counted as converted. Now it is
    left out (and said so); the log converts as it was before the cut write, and a second
    run skips it."""
    from cryptdisk import Key, Keyring
    from cryptdisk.format import open_log

    key = bytes(range(32))
    config = tmp_path / "c.toml"
    config.write_text(encrypted_over_local(key.hex()))
    src, enc, back = tmp_path / "src", tmp_path / "enc", tmp_path / "back"
    (src / "logs").mkdir(parents=True)
    log = src / "logs" / "access.log"
    ring = Keyring([Key(1, key)])
    with open_log(log, keys=ring, durable=False) as f:
        for i in range(400):
            f.write(b"line %d\n" % i + b"x" * 190)
    old = log.read_bytes()
    with cryptdisk.open(log, "rb", keyring=ring) as f:
        before = f.read()
    with open_log(log, keys=ring, durable=False) as f:
        f.write(b"the torn line\n")
    new = log.read_bytes()
    last = len(old) - (len(old) - 128) % (65536 + 32)  # where the last segment starts
    log.write_bytes(new[:last + 4096] + old[last + 4096:])  # the write cut after a page
    assert os.path.exists(str(log) + "-cdlogtail")

    done = cli("convert", str(src), str(enc), "-c", str(config))
    assert done.returncode == 0, done.stderr
    assert "converted 1 file(s)" in done.stdout, done.stdout
    assert "left out 1 -cdlogtail file(s)" in done.stdout
    assert sorted(os.listdir(enc / "logs")) == ["access.log"]
    again = cli("convert", str(src), str(enc), "-c", str(config))
    assert again.returncode == 0 and "skipped 1" in again.stdout, again.stdout
    plain = cli("convert", str(enc), str(back), "-c", str(config), "--to", "plain")
    assert plain.returncode == 0, plain.stderr
    assert (back / "logs" / "access.log").read_bytes() == before


def _encrypted_wal_db(where: Path, key: bytes) -> Any:
    """An encrypted SQLite database in WAL mode at ``where/app.db``, its connection open,
    one row committed in the WAL (not checkpointed)."""
    import cryptdisk.sqlite as csql
    from cryptdisk import Key, Keyring

    where.mkdir(parents=True, exist_ok=True)
    conn = csql.connect(str(where / "app.db"), keyring=Keyring([Key(1, key)]))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO t VALUES(1, 'first')")
    return conn


def _copy_db(live: Path, to: Path, *suffixes: str) -> None:
    """Copy app.db and the files beside it named by ``suffixes``, as a crash leaves them."""
    import shutil

    to.mkdir(parents=True, exist_ok=True)
    for suffix in ("", *suffixes):
        shutil.copy(str(live / "app.db") + suffix, to / ("app.db" + suffix))


def _refused(done: subprocess.CompletedProcess[str], db: Path, why: str) -> None:
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == (
        f"cryptdisk: error: {db} is a SQLite database whose file alone does not hold its "
        f"state: {why}; convert copies files one by one and would leave it out"), done.stderr
    assert "cryptdisk: hint: close every connection to it" in done.stderr
    assert done.stdout == ""


def test_convert_refuses_a_sqlite_database_whose_wal_or_journal_holds_its_state(
        tmp_path: Path) -> None:
    """convert copied a SQLite database's -wal and -journal as files of their own (reading
    an encrypted one without its -cdtail) and said it converted every file: the copy of a
    live database could be torn by a write during the copy, and a converted database
    depended on a converted WAL or journal beside it. Now a database that a connection
    has open, or that has a WAL holding frames or a hot journal beside it, is refused (as
    decrypt and cat refuse it) and nothing is written."""
    import shutil

    import cryptdisk.sqlite as csql
    from cryptdisk import Key, Keyring

    key = bytes(range(32))
    config = tmp_path / "c.toml"
    config.write_text(encrypted_over_local(key.hex()))
    config.chmod(0o600)
    live, src = tmp_path / "live", tmp_path / "src"
    conn = _encrypted_wal_db(live, key)
    try:  # a connection has it open
        done = cli("convert", str(live), str(tmp_path / "out1"), "-c", str(config))
        _refused(done, live / "app.db", "a connection has it open (it holds SQLite's lock)")
        _copy_db(live, src / "db", "-wal")  # a killed writer's WAL
    finally:
        conn.close()
    done = cli("convert", str(src), str(tmp_path / "out2"), "-c", str(config))
    _refused(done, src / "db" / "app.db", f"its WAL ({src / 'db' / 'app.db'}-wal) holds "
             "changes not yet copied into the file")
    assert not (tmp_path / "out2").exists()
    csql.connect(str(src / "db" / "app.db"), keyring=Keyring([Key(1, key)])).close()
    assert sorted(os.listdir(src / "db")) == ["app.db"]  # as the hint says: applied
    done = cli("convert", str(src), str(tmp_path / "out2"), "-c", str(config))
    assert done.returncode == 0, done.stderr

    # a transaction under way that wrote to the database: a hot journal
    hot = tmp_path / "hot"
    conn = csql.connect(str(live / "j.db"), keyring=Keyring([Key(1, key)]))
    conn.execute("PRAGMA journal_mode=PERSIST")
    conn.execute("CREATE TABLE t(v)")
    conn.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 400) "
                 "INSERT INTO t SELECT zeroblob(500) FROM n")
    conn.execute("PRAGMA cache_size=2")  # the transaction spills pages into the database
    conn.execute("BEGIN")
    conn.execute("UPDATE t SET v = zeroblob(600)")
    hot.mkdir()
    for suffix in ("", "-journal"):
        shutil.copy(str(live / "j.db") + suffix, str(hot / "j.db") + suffix)
    conn.execute("ROLLBACK")
    conn.close()
    done = cli("convert", str(hot), str(tmp_path / "out3"), "-c", str(config))
    _refused(done, hot / "j.db", f"its journal ({hot / 'j.db'}-journal) holds a transaction "
             "to roll back")


def test_convert_leaves_out_the_files_sqlite_keeps_beside_a_database(tmp_path: Path) -> None:
    """Beside a checkpointed database a crash leaves files that hold none of its data: the
    -shm (plain SQLite's WAL index, which it rebuilds; the encrypted VFS's names its index
    elsewhere), an empty WAL, and the -wal-cdtail of an encrypted WAL. convert took the
    -shm and -wal for user files and wrote encrypted copies of them, read by nothing (a
    -shm that is not SQLite's own beside a converted plain database). Now they are left
    out, and said so; a file of such a name with no database is still converted, and the
    databases convert to plain SQLite databases that read back."""
    import sqlite3

    from cryptdisk.format import TailSave

    key = bytes(range(32))
    config = tmp_path / "c.toml"
    config.write_text(encrypted_over_local(key.hex()))
    config.chmod(0o600)
    src, enc, back = tmp_path / "src", tmp_path / "enc", tmp_path / "back"
    live = tmp_path / "live"
    conn = _encrypted_wal_db(live, key)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _copy_db(live, src / "db", "-wal", "-shm")
    conn.close()
    wal = src / "db" / "app.db-wal"
    saved = TailSave(str(wal))  # what the VFS saves before it rewrites a shared segment
    saved.save(0, memoryview(b"\0" * 100))
    saved.close()
    (live / "plain").mkdir()
    with sqlite3.connect(live / "plain" / "app.db") as plain:
        plain.execute("PRAGMA journal_mode=WAL")
        plain.execute("CREATE TABLE p(v)")
        plain.execute("INSERT INTO p VALUES ('plain')")
        plain.commit()
        plain.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        _copy_db(live / "plain", src / "plain", "-wal", "-shm")
    plain.close()
    (src / "notes-wal-cdtail").write_bytes(b"a user's file\n")  # no WAL, no database
    (src / "notes-shm").write_bytes(b"another\n")

    done = cli("convert", str(src), str(enc), "-c", str(config))
    assert done.returncode == 0, done.stderr
    assert "converted 4 file(s)" in done.stdout, done.stdout
    assert "left out 5 file(s) of SQLite's beside a database" in done.stdout, done.stdout
    assert sorted(os.listdir(enc / "db")) == ["app.db"]
    assert sorted(os.listdir(enc / "plain")) == ["app.db"]
    # sealed, as every converted file: the VFS does not open it, and the output says so
    assert "note: 2 SQLite database(s) converted into sealed files" in done.stdout, done.stdout
    import cryptdisk.sqlite as csql
    from cryptdisk.errors import CryptdiskError
    with pytest.raises(CryptdiskError, match="a sealed cryptdisk file, not a database"):
        csql.connect(str(enc / "db" / "app.db"), keyring=cryptdisk.Keyring.from_config(config))
    plain_out = cli("convert", str(enc), str(back), "-c", str(config), "--to", "plain")
    assert plain_out.returncode == 0, plain_out.stderr
    assert "SQLite database(s) converted into sealed" not in plain_out.stdout
    assert (back / "notes-wal-cdtail").read_bytes() == b"a user's file\n"
    assert (back / "notes-shm").read_bytes() == b"another\n"
    with sqlite3.connect(back / "db" / "app.db") as reader:
        assert reader.execute("SELECT * FROM t").fetchall() == [(1, "first")]
    reader.close()
    with sqlite3.connect(back / "plain" / "app.db") as reader:
        assert reader.execute("SELECT * FROM p").fetchall() == [("plain",)]
    reader.close()

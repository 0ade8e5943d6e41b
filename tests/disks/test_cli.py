"""``cryptdisk disks``, ``policies`` and ``convert``, run as a user runs them (subprocess)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_convert_leaves_out_sqlite_journal_and_wal_side_files(tmp_path: Path) -> None:
    """An encrypted SQLite database's WAL may have a ``-wal-cdtail`` beside it (the saved
    record of its last segment, under the WAL's own key and file id). convert took it for a
    plain user file and wrote a copy of it, read by nothing. Now it is left out (and said so)
    when its WAL or database is there; a file of that name with neither is still converted,
    and the database itself converts to a plain SQLite database that reads back."""
    import shutil
    import sqlite3

    import cryptdisk.sqlite as csql
    from cryptdisk import Key, Keyring
    from cryptdisk.format import TailSave

    key = bytes(range(32))
    config = tmp_path / "c.toml"
    config.write_text(encrypted_over_local(key.hex()))
    src, enc, back = tmp_path / "src", tmp_path / "enc", tmp_path / "back"
    (src / "db").mkdir(parents=True)
    live = tmp_path / "live"
    live.mkdir()
    conn = csql.connect(str(live / "app.db"), keyring=Keyring([Key(1, key)]))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    conn.execute("INSERT INTO t VALUES(1, 'first')")
    for suffix in ("", "-wal"):  # as a crash would leave them
        shutil.copy(str(live / "app.db") + suffix, src / "db" / ("app.db" + suffix))
    conn.close()
    wal = src / "db" / "app.db-wal"
    saved = TailSave(str(wal))  # what the VFS saves before it rewrites a shared segment
    saved.save(0, memoryview(wal.read_bytes()[128:1000]))
    saved.close()
    (src / "notes-wal-cdtail").write_bytes(b"a user's file\n")  # no WAL, no database

    done = cli("convert", str(src), str(enc), "-c", str(config))
    assert done.returncode == 0, done.stderr
    assert "converted 3 file(s)" in done.stdout, done.stdout
    assert "left out 1 SQLite -journal-cdtail/-wal-cdtail file(s)" in done.stdout
    assert sorted(os.listdir(enc / "db")) == ["app.db", "app.db-wal"]
    plain = cli("convert", str(enc), str(back), "-c", str(config), "--to", "plain")
    assert plain.returncode == 0, plain.stderr
    assert (back / "notes-wal-cdtail").read_bytes() == b"a user's file\n"
    with sqlite3.connect(back / "db" / "app.db") as reader:
        assert reader.execute("SELECT * FROM t").fetchall() == [(1, "first")]

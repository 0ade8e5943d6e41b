"""Migrating real ClickHouse data: ClickHouse ENC -> cryptdisk -> ClickHouse ENC, with chdb.

ClickHouse (chdb, in a child process per session) writes a MergeTree table to
an encrypted disk configured by XML; ``cryptdisk convert`` re-encrypts the
disk's tree into cryptdisk's authenticated format and back into ClickHouse's
format, and a fresh ClickHouse reads the converted-back files. The same XML
loads as a cryptdisk config, and its disk reads ClickHouse's files directly.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cryptdisk

# found, not imported: chdb starts a dozen threads and fork handlers on import, and
# a child forked by a later test in this process (tests/format/test_fork.py,
# tests/sqlite/test_cvfs.py, tests/server/test_workers.py) could hang in them; ClickHouse
# itself only ever runs in child processes here
CHDB_MISSING = ("" if importlib.util.find_spec("chdb") is not None  # CI installs chdb
                else "chdb is not installed; pip install '.[bench]'")

#: The source tree of the cryptdisk being tested, for child processes.
SRC_ROOT = str(Path(cryptdisk.__file__).resolve().parents[1])
KEY = "00112233445566778899aabbccddeeff"
MARKER = "MIGRATION-MARKER"
ROWS = 20_000

SESSION = r"""
import json, sys
import chdb.session as cs
spec = json.load(sys.stdin)
s = cs.Session(spec["path"] + "?config-file=" + spec["config"])
out = []
try:
    for q in spec["queries"]:
        out.append(str(s.query(q, "TabSeparated")).strip())
finally:
    s.close()
print(json.dumps(out))
"""


def chdb_run(db: Path, config: Path, queries: list[str]) -> list[str]:
    spec = json.dumps({"path": str(db), "config": str(config), "queries": queries})
    done = subprocess.run([sys.executable, "-c", SESSION], input=spec, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "cryptdisk", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.chdb
@pytest.mark.skipif(bool(CHDB_MISSING), reason=CHDB_MISSING or "chdb present")
def test_clickhouse_to_cryptdisk_and_back(tmp_path: Path) -> None:
    from cryptdisk.config import load_config

    data = tmp_path / "disk"
    xml = tmp_path / "storage.xml"
    xml.write_text(f"""<clickhouse><storage_configuration>
  <disks>
    <raw><type>local</type><path>{data}/</path></raw>
    <enc><type>encrypted</type><disk>raw</disk><path>enc/</path>
         <key_hex id="0">{KEY}</key_hex><current_key_id>0</current_key_id></enc>
  </disks>
  <policies><secure><volumes><main><disk>enc</disk></main></volumes></secure></policies>
</storage_configuration></clickhouse>
""")
    db = tmp_path / "db"
    total = chdb_run(db, xml, [
        "CREATE TABLE t (n UInt64, s String) ENGINE = MergeTree ORDER BY n "
        "SETTINGS storage_policy = 'secure'",
        f"INSERT INTO t SELECT number, concat('{MARKER}-', toString(number)) "
        f"FROM numbers({ROWS})",
        "SELECT sum(n), count() FROM t",
    ])[-1]
    assert total == f"{ROWS * (ROWS - 1) // 2}\t{ROWS}"
    enc = data / "enc"
    files = [p for p in enc.rglob("*") if p.is_file()]
    assert files and all(MARKER.encode() not in p.read_bytes() for p in files)

    # The same XML is a cryptdisk config; its disk reads ClickHouse's files.
    cfg = load_config(xml)
    assert cfg.disks["enc"].type == "clickhouse"
    assert cfg.policy("secure").choose_disk().name == "enc"
    plaintext = b"".join(cfg.disks["enc"].read_bytes(p) for p in cfg.disks["enc"].list())
    assert MARKER.encode() in plaintext

    # ClickHouse ENC -> cryptdisk (keys from a TOML config holding the same key).
    toml = tmp_path / "c.toml"
    toml.write_text(f"""[keyring]
[[keyring.keys]]
id = 1
hex = "{"77" * 32}"
[disks.raw]
type = "local"
path = "{data}"
[disks.ch]
type = "clickhouse"
disk = "raw"
path = "enc/"
[[disks.ch.keys]]
id = 0
hex = "{KEY}"
""")
    crypt = tmp_path / "cryptdisk-tree"
    done = cli("convert", str(enc), str(crypt), "--config", str(toml), "--to", "cryptdisk")
    assert done.returncode == 0, done.stderr
    assert f"converted {len(files)} file(s)" in done.stdout
    for p in crypt.rglob("*"):
        if p.is_file():
            head = p.read_bytes()
            assert head.startswith(b"CRYPTDSK") and MARKER.encode() not in head

    # cryptdisk -> ClickHouse ENC, in place of the original; a fresh ClickHouse reads it.
    back = tmp_path / "back"
    done = cli("convert", str(crypt), str(back), "-c", str(toml), "--to", "clickhouse",
               "--disk", "ch")
    assert done.returncode == 0, done.stderr
    shutil.rmtree(enc)
    shutil.move(str(back), str(enc))
    again = chdb_run(db, xml, ["SELECT sum(n), count(), max(s) FROM t"])[0]
    assert again == f"{ROWS * (ROWS - 1) // 2}\t{ROWS}\t{MARKER}-9999"

"""Readers open files while another process rotates their keys back and forth.

A rewrap replaces a file's 128-byte header in one ``pwrite``; a reader's read of the
header during that write may get bytes of both (Linux does not make the two atomic to
each other). Readers read such a header again (format/_reread.py): here a real second
process (rotate_loop_child.py) rewraps a sealed file, a file of an encrypted disk, an
encrypted SQLite database and a database's parts and catalog between two keys as fast
as it can, while this process opens and reads them in a loop: no open may fail.

How often a read meets a write depends on the machine. On a loaded 2-core one, this test
run for 20 s with readers that read the header once (``REREAD_DELAYS = ()``) failed 5 of
168,200 header opens (2.56 million header writes; none of the 4,205 whole opens), and with
the second read none (one header read again in 118,400). tests/format/test_torn_header.py
tears headers deterministically; this test checks the real thing end to end.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import cryptdisk
import cryptdisk.sqlite as csql
from cryptdisk import Keyring
from cryptdisk.disks import EncryptedDisk, LocalDisk
from cryptdisk.errors import CryptdiskError
from cryptdisk.format import HEADER_SIZE, read_open_header

from ..db.dbhelpers import SCHEMA, gen, write_config

CHILD = Path(__file__).with_name("rotate_loop_child.py")
SECONDS = 4.0
ROUNDS = 10  # at least, however slow the machine
HEADER_OPENS = 200  # per round of opens


def test_no_reader_fails_while_another_process_rotates(tmp_path):
    config = write_config(tmp_path, [1, 2], 1)
    ring = Keyring.from_config(config)
    data = os.urandom(70000)
    sealed = tmp_path / "f.cd"
    with cryptdisk.open(sealed, "wb", keyring=ring, segment_size=4096) as f:
        f.write(data)
    disk = EncryptedDisk("enc", LocalDisk("raw", str(tmp_path / "raw")), ring, cache_bytes=0)
    with disk.open_write("part.bin") as f:
        f.write(data)
    sqlite_path = tmp_path / "a.db"
    conn = csql.connect(str(sqlite_path), keyring=ring)
    with conn:
        conn.execute("CREATE TABLE t(v)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(1000)])
    conn.close()
    db_path = tmp_path / "db"
    with cryptdisk.connect(db_path, config) as db:
        db.sql(f"CREATE TABLE t {SCHEMA} SETTINGS storage_policy='default'")
        db.sql("INSERT INTO t " + gen(1000))
        db.sql("INSERT INTO t " + gen(1000, 1000))
    db_files = [str(db_path / "catalog")] + [
        str(p) for p in (tmp_path / "store" / "secure").rglob("*") if p.is_file()]
    assert len(db_files) >= 3  # the catalog and two parts

    stop = tmp_path / "stop"
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(config), str(stop), str(sealed),
         str(tmp_path / "raw" / "part.bin"), str(sqlite_path), *db_files],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(Path(cryptdisk.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])})
    opens: Counter[str] = Counter()
    failures: Counter[str] = Counter()
    calls = reads = 0

    def read_sealed_header() -> bytes:
        nonlocal reads
        reads += 1
        return os.pread(fd, HEADER_SIZE, 0)

    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        fd = os.open(sealed, os.O_RDONLY)
        reader = None
        try:
            reader = cryptdisk.connect(db_path, config, read_only=True, cache_bytes=0)
            end = time.monotonic() + SECONDS
            rounds = 0
            while time.monotonic() < end or rounds < ROUNDS:
                rounds += 1
                for name, read in (
                        ("sealed", lambda: _read_sealed(sealed, ring)),
                        ("disk", lambda: _read_disk(disk)),
                        ("sqlite-c", lambda: _sqlite_sum(sqlite_path, ring, "c")),
                        ("sqlite-python", lambda: _sqlite_sum(sqlite_path, ring, "python")),
                        ("db", lambda: _db_sum(reader))):
                    try:
                        got = read()
                    except CryptdiskError as exc:
                        failures[f"{name}: {type(exc).__name__}: {exc}"] += 1
                        continue
                    expected = {"sealed": data, "disk": data, "sqlite-c": 499500,
                                "sqlite-python": 499500, "db": [(1999000, 2000)]}[name]
                    assert got == expected, name
                    opens[name] += 1
                for _ in range(HEADER_OPENS):  # the header alone, many times more often
                    calls += 1
                    try:
                        read_open_header(read_sealed_header, ring)
                    except CryptdiskError as exc:
                        failures[f"header: {type(exc).__name__}: {exc}"] += 1
        finally:
            os.close(fd)
            if reader is not None:
                reader.close()
    finally:
        stop.touch()
        out, _ = child.communicate(timeout=60)
    written, child_rounds = map(int, out.split()[-2:])
    assert child.returncode == 0
    # reads - calls: the header opens whose first read failed (torn), each a failed open
    # for a reader that reads once
    assert not failures, (f"{sum(failures.values())} failed of {sum(opens.values())} opens "
                          f"and {calls} header opens ({reads - calls} read again), "
                          f"{written} header writes: {dict(failures)}")
    assert child_rounds >= 2, out  # the headers changed while they were read
    assert len(opens) == 5 and min(opens.values()) >= ROUNDS, opens


def _read_sealed(path, ring):
    with cryptdisk.open(path, "rb", keyring=ring) as f:
        return f.read()


def _read_disk(disk):
    with disk.open_read("part.bin") as f:
        return f.read()


def _sqlite_sum(path, ring, implementation):
    conn = csql.connect(str(path), keyring=ring, implementation=implementation)
    try:
        return conn.execute("SELECT sum(v) FROM t").fetchall()[0][0]
    finally:
        conn.close()


def _db_sum(db):
    return db.query("SELECT sum(c_int), count(*) FROM t")

"""Part reads: in-place decryption into the reusable arena never leaks into results."""

import pyarrow as pa
import pytest
from dbhelpers import SCHEMA, gen

from cryptdisk.db import _partread as _parts


def test_results_do_not_alias_the_arena(db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(50_000))
    table = db.arrow_table("t")
    expected = db.con.sql(gen(50_000)).to_arrow_table()
    arena = _parts._ARENA._map
    arena.seek(0)
    arena.write(b"\xff" * len(arena))  # scribble over everything decrypted so far
    assert table.column("c_int").to_pylist() == expected.column(0).to_pylist()
    assert table.column("c_str").to_pylist() == expected.column(1).to_pylist()
    assert table.column("c_float").to_pylist() == expected.column(2).to_pylist()


def test_compact_file_decrypts_reads_outside_prepared_ranges(tmp_path, db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(1000))
    part = db.table("t").parts[0]
    disk = db.config.disks[part.disk]
    with disk.open_read(part.path) as f:
        plain = f.read()
        arena = memoryview(bytearray(b"x" * 10))
        compact = _parts._CompactFile(f, len(plain), [(100, 110, 0)], arena)
        compact.seek(100)
        assert bytes(compact.read(10)) == b"x" * 10  # served from the arena
        compact.seek(50)
        assert bytes(compact.read(100)) == plain[50:150]  # decrypted on demand
        compact.seek(-8, 2)
        assert bytes(compact.read()) == plain[-8:]


@pytest.mark.parametrize("columns", [None, ["c_str"], ["c_float", "c_int"]])
def test_read_part_matches_for_any_projection(db, columns):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(3000))
    part = db.table("t").parts[0]
    got = _parts.read_part(db.config.disks[part.disk], part, columns)
    full = db.con.sql(gen(3000)).to_arrow_table().rename_columns(["c_int", "c_str", "c_float"])
    want = full if columns is None else full.select(columns)
    assert got.cast(want.schema).equals(want) or got.to_pylist() == want.to_pylist()
    assert isinstance(got, pa.Table)

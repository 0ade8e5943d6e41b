"""The embedded database end to end: storage, SQL, errors, encryption at rest."""

import logging
import os
import re
import stat
import subprocess
import sys
from decimal import Decimal

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk.errors import (
    AuthenticationError,
    CatalogError,
    ConfigError,
    DatabaseError,
    DatabaseLockedError,
    KeyFileError,
    PolicyError,
    TableNotFoundError,
)

from .dbhelpers import SCHEMA, gen


def files_under(root):
    return sorted(os.path.join(r, f) for r, _d, fs in os.walk(root) for f in fs)


def test_default_key_beside_directory_and_warning(tmp_path, caplog):
    path = tmp_path / "db"
    with caplog.at_level(logging.WARNING, logger="cryptdisk.db"):
        db = cryptdisk.connect(path)
    key = tmp_path / "db.key"
    assert key.exists()
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert str(key) in caplog.text and "losing it loses the data" in caplog.text
    assert not any(f.endswith(".key") or f.endswith(".hex") for f in files_under(path))
    db.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="cryptdisk.db"):
        cryptdisk.connect(path).close()  # reopening says nothing new
    assert "created" not in caplog.text


def test_a_database_is_created_only_at_a_new_path_or_in_an_empty_directory(tmp_path):
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"...")
    with pytest.raises(DatabaseError, match=r"not empty .*'cat\.jpg'"):
        cryptdisk.connect(other)
    assert sorted(os.listdir(other)) == ["cat.jpg"]  # nothing written into it
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DatabaseError, match="is a file, not a database"):
        cryptdisk.connect(tmp_path / "notes.txt")
    with pytest.raises(DatabaseError, match="does not exist") as info:
        cryptdisk.connect(tmp_path / "no" / "such" / "db")
    assert "mkdir -p" in (info.value.hint or "")
    assert not (tmp_path / "no").exists()
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "photos"]  # and no key files
    (tmp_path / "empty").mkdir()
    cryptdisk.connect(tmp_path / "empty").close()
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "LOCK").touch()  # a creation killed before its first catalog
    cryptdisk.connect(tmp_path / "half").close()
    cryptdisk.connect(tmp_path / "half").close()  # a database now: opens


def test_missing_key_file_is_a_clear_error(tmp_path):
    cryptdisk.connect(tmp_path / "db").close()
    os.remove(tmp_path / "db.key")
    with pytest.raises(KeyFileError, match=r"db\.key"):
        cryptdisk.connect(tmp_path / "db")


def test_everything_on_disk_is_ciphertext_except_plain_tables(tmp_path):
    db = cryptdisk.connect(tmp_path / "db")
    db.sql(f"CREATE TABLE secret {SCHEMA}; CREATE TABLE open {SCHEMA} "
           "SETTINGS storage_policy = 'plain'")
    db.sql("INSERT INTO secret SELECT 1, 'TOPSECRETVALUE', 1.5; "
           "INSERT INTO open SELECT 2, 'publicvalue', 2.5")
    db.close()
    plain_root = str(tmp_path / "db" / "plain")
    for f in files_under(tmp_path / "db"):
        with open(f, "rb") as fh:
            data = fh.read()
        if f.endswith("LOCK"):
            assert data == b""
        elif f.startswith(plain_root):
            assert data[:4] == b"PAR1"
        else:
            assert data[:8] == b"CRYPTDSK", f
            assert b"TOPSECRETVALUE" not in data and b"secret" not in data


def test_create_insert_select_reopen(tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql(f"CREATE TABLE t {SCHEMA}")
        db.sql("INSERT INTO t " + gen(1000))
        db.sql("INSERT INTO t VALUES (-1, 'x', 0.5), (-2, NULL, NULL)")
        db.sql("INSERT INTO t (c_str, c_int) VALUES ('only', 7)")
        assert db.query("SELECT count(*), sum(c_int) FROM t") == [(1003, 499500 - 3 + 7)]
    with cryptdisk.connect(tmp_path / "db") as db:
        assert db.query("SELECT c_int, c_float FROM t WHERE c_str = 'only'") == [(7, None)]
        assert db.query("SELECT count(*) FROM t") == [(1003,)]
        assert db.query("SELECT count(*) FROM system.parts WHERE \"table\" = 't'") == [(3,)]


def test_insert_from_python_objects_and_files(tmp_path, db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    assert db.insert("t", pa.table({"c_int": [1, 2], "c_float": [0.5, 1.5]})) == 2
    assert db.insert("t", pd.DataFrame({"c_str": ["a"], "c_int": [3]})) == 1
    pq.write_table(pa.table({"c_int": [4], "c_str": ["p"], "c_float": [4.0]}),
                   tmp_path / "x.parquet")
    assert db.insert("t", tmp_path / "x.parquet") == 1
    (tmp_path / "x.csv").write_text("c_int,c_str\n5,c\n6,d\n")
    assert db.insert("t", str(tmp_path / "x.csv")) == 2
    assert db.query("SELECT list(c_int ORDER BY c_int) FROM t") == [([1, 2, 3, 4, 5, 6],)]
    with pytest.raises(DatabaseError, match="no column"):
        db.insert("t", pa.table({"nope": [1]}))
    with pytest.raises(TypeError):
        db.insert("t", [1, 2, 3])


def test_insert_of_local_parquet_reads_without_prefetching(tmp_path, db, monkeypatch):
    """A local Parquet file is read with DuckDB's prefetching off (fresh buffers per row
    group: CPU and page faults, see _insert._local_parquet_reads), CSV with the setting
    as it was; the connection's setting is the same afterwards, and one the caller set
    stays set."""
    from cryptdisk.db._database import Database

    setting = "SELECT current_setting('disable_parquet_prefetching')"
    seen = []
    original = Database.insert_query

    def spy(self, table, query, **kwargs):
        seen.append(self.con.execute(setting).fetchall()[0][0])
        return original(self, table, query, **kwargs)

    monkeypatch.setattr(Database, "insert_query", spy)
    db.sql(f"CREATE TABLE t {SCHEMA}")
    pq.write_table(pa.table({"c_int": [4, 3], "c_str": ["p", "q"], "c_float": [4.0, 3.0]}),
                   tmp_path / "x.parquet")
    (tmp_path / "x.csv").write_text("c_int,c_str\n5,c\n")
    assert db.insert("t", tmp_path / "x.parquet") == 2
    assert db.insert("t", str(tmp_path / "x.csv")) == 1
    assert seen == [True, False]
    assert db.con.execute(setting).fetchall() == [(False,)]
    db.con.execute("SET disable_parquet_prefetching = true")
    assert db.insert("t", tmp_path / "x.parquet") == 2
    assert db.con.execute(setting).fetchall() == [(True,)]
    assert db.query("SELECT list(c_int ORDER BY c_int) FROM t") == [([3, 3, 4, 4, 5],)]


def test_insert_error_with_prefetching_already_off_is_the_insert_error(tmp_path, db,
                                                                      monkeypatch):
    """An error of the insert itself, with the caller's prefetching already off, comes out
    as raised (the setting's context manager caught it and yielded again: RuntimeError)."""
    import duckdb

    from cryptdisk.db._database import Database

    def failing(self, table, query, **kwargs):
        raise duckdb.IOException("the insert's own error")

    db.sql(f"CREATE TABLE t {SCHEMA}")
    pq.write_table(pa.table({"c_int": [1], "c_str": ["p"], "c_float": [1.0]}),
                   tmp_path / "x.parquet")
    monkeypatch.setattr(Database, "insert_query", failing)
    for already_off in (True, False):
        db.con.execute(f"SET disable_parquet_prefetching = {already_off}")
        with pytest.raises(duckdb.IOException, match="the insert's own error"):
            db.insert("t", tmp_path / "x.parquet")
        assert db.con.execute("SELECT current_setting('disable_parquet_prefetching')"
                              ).fetchall() == [(already_off,)]


def test_insert_of_unreadable_input_is_a_database_error(tmp_path, db):
    """A file that is not Parquet (named .parquet), an Arrow table or DataFrame of no
    columns: DuckDB's own exceptions came out of insert() before."""
    db.sql(f"CREATE TABLE t {SCHEMA}")
    (tmp_path / "junk.parquet").write_bytes(b"not a parquet file at all" * 4)
    with pytest.raises(DatabaseError, match=r"cannot read .*junk\.parquet"):
        db.insert("t", tmp_path / "junk.parquet")
    for empty in (pa.table({}), pd.DataFrame()):
        with pytest.raises(DatabaseError, match="cannot read the data"):
            db.insert("t", empty)
    assert db.insert("t", pa.table({"c_int": [1]})) == 1  # the connection goes on
    assert db.query("SELECT count(*) FROM t") == [(1,)]



def test_insert_of_python_rows_and_columns(db):
    """A list of dicts (rows) and a dict of lists (columns) were refused with TypeError."""
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    assert db.insert("t", [{"c_int": 2, "c_str": "b"}, {"c_int": 1, "C_FLOAT": 0.5}]) == 2
    assert db.insert("t", {"c_int": [3, None], "c_float": [1, 2]}) == 2  # ints for a DOUBLE
    assert db.query("SELECT * FROM t ORDER BY c_int NULLS LAST") == [
        (1, None, 0.5), (2, "b", None), (3, None, 1.0), (None, None, 2.0)]
    with pytest.raises(DatabaseError, match="insert into t: cannot read the data"):
        db.insert("t", [{"c_int": 1}, {"c_int": "x"}])  # one column, two types
    with pytest.raises(DatabaseError, match=r"insert into t: cannot read the data"):
        db.insert("t", {"c_int": [1, 2], "c_str": ["a"]})  # columns of two lengths
    with pytest.raises(TypeError, match="list of dicts"):
        db.insert("t", [(1, "a", 0.5)])  # rows without names
    assert db.insert("t", []) == 0
    with pytest.raises(TableNotFoundError):
        db.insert("nope", [])
    assert db.query("SELECT count(*) FROM t") == [(4,)]


def test_insert_of_values_of_the_wrong_type_names_the_column_not_cryptdisks_statement(
        tmp_path, db):
    """A value DuckDB cannot cast quoted the statement cryptdisk wrote to cast the data
    ("LINE 1: SELECT CAST(#1 AS BIGINT) AS "c_int", CAST(NULL AS VARCHAR) ...")."""
    db.sql(f"CREATE TABLE t {SCHEMA}")
    (tmp_path / "bad.csv").write_text("c_int,c_str\n1,a\nx,b\n")
    for data in (pa.table({"c_int": ["1", "x"]}), pd.DataFrame({"c_int": [[1]]}),
                 tmp_path / "bad.csv"):
        # (a CSV file's, read in the table's types, is DuckDB's CSV error naming the line)
        with pytest.raises(DatabaseError, match=r"(?s)^INSERT INTO t: Conversion Error: .*"
                           r"column \"?c_int") as e:
            db.insert("t", data)
        assert "CAST(" not in str(e.value) and "LINE" not in str(e.value)
        assert not str(e.value).endswith("\n")
    assert db.query("SELECT count(*) FROM t") == [(0,)]


def test_insert_of_a_csv_file_without_a_header_or_rows_says_so(tmp_path, db):
    """An empty CSV file gave 'no column(s) column0' (DuckDB's name for the column of a
    file it found no header in); so did a file of rows without a header line."""
    db.sql("CREATE TABLE t (id BIGINT, s VARCHAR)")
    for name, text in (("empty.csv", ""), ("blank.csv", "\n\n")):
        (tmp_path / name).write_text(text)
        with pytest.raises(DatabaseError, match=re.escape(f"{name} is empty")) as e:
            db.insert("t", tmp_path / name)
        assert "column0" not in str(e.value)
    (tmp_path / "rows.csv").write_text("1,a\n2,b\n")
    with pytest.raises(DatabaseError, match=r"rows\.csv has no header") as e:
        db.insert("t", tmp_path / "rows.csv")
    assert "header = false" in e.value.hint and "id,s" in e.value.hint
    (tmp_path / "header.csv").write_text("id,s\n")  # a header and no rows: nothing to add
    assert db.insert("t", tmp_path / "header.csv") == 0
    assert db.query("SELECT count(*) FROM t") == [(0,)]


def test_insert_of_a_csv_file_reads_it_in_the_tables_types(tmp_path, db):
    """A CSV file's text is read as the table's columns' types, as DuckDB's own INSERT ...
    SELECT * FROM 'file.csv' and COPY read it: read in the types DuckDB's sniffer guessed
    and then cast, '1.50' became '1.5' in a VARCHAR, '01:02' '01:02:00', and a DECIMAL(38,34)
    lost its digits past a DOUBLE's (silently, every one)."""
    ddl = ('CREATE TABLE t (s VARCHAR, "Clock" VARCHAR, d DECIMAL(38,34), '
           "big DECIMAL(38,0), f VARCHAR, n INTEGER)")
    (tmp_path / "x.csv").write_text(
        "s,clock,d,big,f,n\n"
        "1.50,01:02,0.1000000000000000055511151231257827,12345678901234567890123,NaN,7\n"
        "2.00,23:59,1.5,1,1e3,\n")
    db.sql(ddl)
    assert db.insert("t", tmp_path / "x.csv") == 2
    ref = duckdb.connect()
    ref.execute(ddl)
    ref.execute(f"INSERT INTO t BY NAME SELECT * FROM '{tmp_path / 'x.csv'}'")
    want = ref.execute("SELECT * FROM t ORDER BY s").fetchall()
    assert want[0][:3] == ("1.50", "01:02", Decimal("0.1000000000000000055511151231257827"))
    assert db.query("SELECT * FROM t ORDER BY s") == want
    db.sql(f"COPY t FROM '{tmp_path / 'x.csv'}'")  # COPY reads it the same
    assert db.query("SELECT * FROM t ORDER BY s") == sorted(want * 2)


@pytest.mark.parametrize("name", ["x.jsonl", "x.json", "x.ndjson"])
def test_insert_of_a_json_file_reads_its_values_as_written(tmp_path, db, name):
    """A JSON file (newline-delimited or an array) is read as JSON, in the table's types: it
    was read as CSV, each line a column name ('no column(s) {"s": ...'), and DuckDB's own
    read of it makes a string that looks like a timestamp a TIMESTAMP and a number a DOUBLE
    before the cast."""
    db.sql("CREATE TABLE t (s VARCHAR, ts VARCHAR, d DECIMAL(38,34), n INTEGER DEFAULT 9)")
    rows = ['{"s": "007", "ts": "2024-01-01T10:00:00", '
            '"d": 0.1000000000000000055511151231257827}',
            '{"s": "", "ts": null, "d": 1}']
    text = "[" + ",".join(rows) + "]" if name == "x.json" else "\n".join(rows) + "\n"
    (tmp_path / name).write_text(text)
    assert db.insert("t", tmp_path / name) == 2
    assert db.query("SELECT * FROM t ORDER BY s") == [
        ("", None, Decimal("1." + "0" * 34), 9),
        ("007", "2024-01-01T10:00:00", Decimal("0.1000000000000000055511151231257827"), 9)]
    (tmp_path / "extra.jsonl").write_text('{"s": "a", "zz": 1}\n')
    with pytest.raises(DatabaseError, match="no column"):
        db.insert("t", tmp_path / "extra.jsonl")


def test_a_closed_database_refuses_every_use_clearly(tmp_path):
    db = cryptdisk.connect(tmp_path / "db")
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(10))
    db.close()
    uses = [lambda: db.sql("SELECT 1"), lambda: db.query("SELECT * FROM t"),
            lambda: db.insert("t", pa.table({"c_int": [1]})),
            lambda: db.insert("t", pd.DataFrame({"c_int": [1]})),
            lambda: db.insert_query("t", "SELECT 1, 'x', 1.0"),
            lambda: db.optimize("t", final=True), lambda: db.reader(),
            lambda: db.arrow_table("t"), lambda: db.sql("OPTIMIZE TABLE t FINAL")]
    for use in uses:
        with pytest.raises(DatabaseError, match="is closed") as e:
            use()
        assert e.value.hint and "connect" in e.value.hint
    db.close()  # closing again is harmless
    with cryptdisk.connect(tmp_path / "db") as again:  # the lock went with the close
        assert again.query("SELECT count(*) FROM t") == [(10,)]


def test_joins_across_encrypted_and_plain(db):
    db.sql(f"CREATE TABLE e {SCHEMA}; CREATE TABLE p {SCHEMA} SETTINGS storage_policy='plain'")
    db.sql("INSERT INTO e " + gen(100))
    db.sql("INSERT INTO p " + gen(50, 25))
    assert db.query("SELECT count(*), sum(e.c_int) FROM e JOIN p USING (c_int)") == \
        [(50, sum(range(25, 75)))]
    assert db.query("SELECT count(*) FROM e, p WHERE e.c_str = p.c_str") == [(50,)]
    first = db.query("SELECT * FROM e ORDER BY c_int LIMIT 1")[0]
    assert first[:2] == (0, "cfcd208495d565ef66e7dff9f98764da")


@pytest.mark.parametrize("ref", ["main.t", "temp.t", "memory.main.t", 'main."T"'])
def test_a_table_named_with_a_schema_is_refused_with_a_hint(db, ref):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t SELECT 1, 'a', 1.0")
    with pytest.raises(TableNotFoundError, match=r"cryptdisk's tables are not in a DuckDB "
                       r"schema") as info:
        db.sql(f"SELECT count(*) FROM t JOIN {ref} u USING (c_int)")
    assert info.value.hint is not None and info.value.hint.lower().endswith(": t")
    # a qualified column, or an alias named like a schema, is not a table reference
    assert db.sql("SELECT main.c_int FROM t AS main").to_pylist() == [{"c_int": 1}]


def test_an_error_names_the_line_of_the_statement_as_written(db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t SELECT 1, 'a', 1.0")
    with pytest.raises(DatabaseError) as info:
        db.sql("SELECT nope FROM t")
    assert "LINE 1: SELECT nope FROM t\n               ^" in str(info.value)
    query = "SELECT c_int\nFROM t\n" + "\n" * 7 + "WHERE nope = 1"  # line 10
    with pytest.raises(DatabaseError) as info:
        db.sql(query)
    assert "LINE 10: WHERE nope = 1\n               ^" in str(info.value)
    r = db.reader()
    with pytest.raises(DatabaseError) as info:
        r.query("SELECT c_int\nFROM t WHERE nope = 1")
    r.close()
    assert "LINE 2: FROM t WHERE nope" in str(info.value)


def test_errors_are_clear(db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    with pytest.raises(TableNotFoundError, match="nope"):
        db.sql("INSERT INTO nope SELECT 1, 'a', 1.0")
    with pytest.raises(TableNotFoundError):
        db.sql("DROP TABLE nope")
    db.sql("DROP TABLE IF EXISTS nope")
    with pytest.raises(PolicyError, match="nowhere"):
        db.sql(f"CREATE TABLE u {SCHEMA} SETTINGS storage_policy = 'nowhere'")
    with pytest.raises(DatabaseError, match="unknown table setting"):
        db.sql(f"CREATE TABLE u {SCHEMA} SETTINGS index_granularity = 8192")
    with pytest.raises(DatabaseError, match="already exists"):
        db.sql(f"CREATE TABLE t {SCHEMA}")
    with pytest.raises(DatabaseError, match="3 columns"):
        db.sql("INSERT INTO t SELECT 1")
    with pytest.raises(DatabaseError):
        db.sql("CREATE TABLE u (a NOTATYPE)")
    with pytest.raises(TableNotFoundError, match=r"no table 'nope' in .* \(tables: t\)"):
        db.sql("SELECT * FROM nope")
    with pytest.raises(DatabaseError, match="no column zz"):
        db.sql("UPDATE t SET zz = 1")
    with pytest.raises(PolicyError):
        db.sql("ALTER TABLE t MODIFY SETTING storage_policy = 'nowhere'")


def test_drop_and_truncate_remove_files(tmp_path, db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(10))
    data = tmp_path / "db" / "data"
    assert len(files_under(data)) == 1
    db.sql("TRUNCATE TABLE t")
    assert db.query("SELECT count(*) FROM t") == [(0,)]
    assert files_under(data) == []
    db.sql("INSERT INTO t " + gen(10))
    db.sql("DROP TABLE t")
    assert files_under(data) == []
    with pytest.raises(DatabaseError):
        db.sql("SELECT * FROM t")


def test_move_between_policies(tmp_path, db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(500))
    db.sql("INSERT INTO t " + gen(500, 500))
    before = db.query("SELECT sum(c_int), string_agg(c_str, '' ORDER BY c_int) FROM t")
    db.sql("ALTER TABLE t MODIFY SETTING storage_policy = 'plain'")
    assert files_under(tmp_path / "db" / "data") == []
    assert len(files_under(tmp_path / "db" / "plain")) == 2
    assert db.query("SELECT storage_policy, is_encrypted FROM system.tables") == [("plain", False)]
    db.cache.clear()
    assert db.query("SELECT sum(c_int), string_agg(c_str, '' ORDER BY c_int) FROM t") == before
    db.sql("ALTER TABLE t MODIFY SETTING storage_policy = 'default'")
    assert files_under(tmp_path / "db" / "plain") == []
    db.cache.clear()
    assert db.query("SELECT sum(c_int), string_agg(c_str, '' ORDER BY c_int) FROM t") == before


def test_optimize_merges_and_orders(db):
    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    for start in (300, 0, 600):
        db.sql("INSERT INTO t " + gen(300, start))
    old = {r[0] for r in db.query("SELECT part FROM system.parts")}
    assert len(old) == 3
    db.sql("OPTIMIZE TABLE t")
    parts = db.query("SELECT part, rows FROM system.parts")
    assert len(parts) == 1 and parts[0][1] == 900 and parts[0][0] not in old
    db.cache.clear()
    assert db.query("SELECT c_int FROM t LIMIT 3") == [(0,), (1,), (2,)]
    db.sql("OPTIMIZE TABLE t")  # one part under the current key: nothing to do
    assert db.query("SELECT part FROM system.parts") == [(parts[0][0],)]
    db.sql("OPTIMIZE TABLE t FINAL")  # always rewrites
    assert db.query("SELECT part FROM system.parts") != [(parts[0][0],)]


def test_system_tables(db):
    db.sql(f"CREATE TABLE t {SCHEMA}; CREATE TABLE p {SCHEMA} SETTINGS storage_policy='plain'")
    db.sql("INSERT INTO t " + gen(10))
    db.sql("INSERT INTO p " + gen(10))
    assert db.query("SELECT name, type, is_encrypted FROM system.disks ORDER BY name") == [
        ("default", "encrypted", True), ("plain", "local", False)]
    assert db.query("SELECT policy_name, disks FROM system.storage_policies ORDER BY 1") == [
        ("default", ["default"]), ("plain", ["plain"])]
    assert db.query("SELECT name, rows, is_encrypted FROM system.tables ORDER BY name") == [
        ("p", 10, False), ("t", 10, True)]
    rows = db.query("SELECT \"table\", disk, key_id, algorithm FROM system.parts ORDER BY 1")
    assert rows == [("p", "plain", None, None), ("t", "default", 1, "aes-256-gcm")]
    sizes = db.query("SELECT \"table\", bytes, bytes_on_disk FROM system.parts ORDER BY 1")
    assert sizes[0][1] == sizes[0][2]  # plain: stored as is
    assert sizes[1][2] > sizes[1][1] + 128  # encrypted: header and one tag per segment
    keys = db.query("SELECT id, algorithm, source, is_current, files FROM SYSTEM.KEYS")
    assert keys == [(1, "aes-256-gcm", "file", True, 2)]  # one part + the catalog
    text = str(db.sql("SELECT * FROM system.keys").to_pylist())
    assert "hex" not in text.lower() or "file" in text


def test_part_swapped_for_another_valid_part_is_detected(tmp_path, db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(10))
    db.sql("INSERT INTO t " + gen(10, 10))
    a, b = (os.path.join(tmp_path / "db" / "data", p)
            for (p,) in db.query("SELECT path FROM system.parts"))
    os.replace(b, a + ".x")
    os.link(a, b)  # b now holds a's (valid, authenticated) bytes
    db.cache.clear()
    with pytest.raises(CatalogError, match="not the part the catalog recorded"):
        db.query("SELECT sum(c_int) FROM t")


def test_tampered_part_fails_authentication(tmp_path, db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(1000))
    (path,) = db.query("SELECT path FROM system.parts")[0]
    full = os.path.join(tmp_path / "db" / "data", path)
    with open(full, "rb") as fh:
        data = bytearray(fh.read())
    data[300] ^= 1
    with open(full, "wb") as fh:
        fh.write(data)
    db.cache.clear()
    with pytest.raises(AuthenticationError):
        db.query("SELECT sum(c_int) FROM t")
    with pytest.raises(AuthenticationError):
        db.check()


def test_catalog_rollback_seen_by_reader(tmp_path):
    path = tmp_path / "db"
    db = cryptdisk.connect(path)
    db.sql(f"CREATE TABLE t {SCHEMA}")
    old = (path / "catalog").read_bytes()
    db.sql("INSERT INTO t " + gen(10))
    reader = cryptdisk.connect(path, read_only=True)
    assert reader.query("SELECT count(*) FROM t") == [(10,)]
    (path / "catalog").write_bytes(old)
    with pytest.raises(CatalogError, match="rolled back"):
        reader.query("SELECT count(*) FROM t")
    reader.close()
    db.close()


def test_reader_sees_writer_commits(tmp_path):
    db = cryptdisk.connect(tmp_path / "db")
    db.sql(f"CREATE TABLE t {SCHEMA}")
    reader = cryptdisk.connect(tmp_path / "db", read_only=True)
    assert reader.query("SELECT count(*) FROM t") == [(0,)]
    db.sql("INSERT INTO t " + gen(10))
    assert reader.query("SELECT count(*) FROM t") == [(10,)]
    db.sql("OPTIMIZE TABLE t FINAL")  # deletes the part the reader knew
    db.sql("INSERT INTO t " + gen(5))
    assert reader.query("SELECT count(*) FROM t") == [(15,)]
    with pytest.raises(DatabaseError, match="read-only"):
        reader.sql("INSERT INTO t " + gen(1))
    reader.close()
    db.close()


@pytest.mark.parametrize(("options", "said"), [
    ({"memory_limit": "lots"}, r"memory_limit 'lots': .*Memory must have a number"),
    ({"memory_limit": 5}, "memory_limit must be text"),
    ({"threads": 0}, "threads must be a whole number"),
    ({"threads": "2"}, "threads must be a whole number"),
])
def test_bad_connect_options_are_config_errors_leaving_nothing(tmp_path, options, said):
    """memory_limit='lots' raised DuckDB's ParserException, threads=0 its SyntaxException,
    and the failed connect left the new database's directory (its LOCK) and key file."""
    with pytest.raises(ConfigError, match=said):
        cryptdisk.connect(tmp_path / "db", **options)
    assert os.listdir(tmp_path) == []
    with cryptdisk.connect(tmp_path / "db", memory_limit="64MB", threads=1) as db:
        assert db.query("SELECT current_setting('threads')") == [(1,)]


def test_a_failed_connect_leaves_an_existing_database_as_it_was(tmp_path):
    cryptdisk.connect(tmp_path / "db").close()
    before = files_under(tmp_path)
    with pytest.raises(ConfigError):
        cryptdisk.connect(tmp_path / "db", memory_limit="lots")
    assert files_under(tmp_path) == before


def test_second_writer_is_refused(tmp_path):
    """A second writer in the same process was told the database was open "in another
    process"; it is told it is another connection of its own."""
    db = cryptdisk.connect(tmp_path / "db")
    with pytest.raises(DatabaseLockedError, match="another connection in this process"):
        cryptdisk.connect(tmp_path / "db")
    other = subprocess.run(
        [sys.executable, "-c", "import sys, cryptdisk\ntry:\n cryptdisk.connect(sys.argv[1])\n"
         "except cryptdisk.DatabaseLockedError as e:\n print(e)", str(tmp_path / "db")],
        capture_output=True, text=True, check=True)
    assert "is open for writing in another process" in other.stdout
    db.close()
    cryptdisk.connect(tmp_path / "db").close()  # the lock went with the first


def test_spilling_is_refused(db):
    db.sql("SET memory_limit = '30MB'")
    with pytest.raises(DatabaseError, match="spill"):
        db.sql("SELECT count(*) FROM (SELECT md5(i::VARCHAR) s FROM range(3000000) r(i) "
               "ORDER BY s)")
    with pytest.raises(DatabaseError, match="plaintext"):
        db.sql("SET temp_directory = '/tmp/x'")
    assert db.query("SELECT current_setting('temp_directory')") == [("",)]


def test_no_extension_is_downloaded_or_loaded_by_a_query(db):
    """DuckDB's autoinstall and autoload were on: a query of an https:// path had DuckDB
    download its httpfs extension (native code) and load it."""
    assert db.query("SELECT current_setting('autoinstall_known_extensions'), "
                    "current_setting('autoload_known_extensions')") == [(False, False)]
    with pytest.raises(DatabaseError, match="httpfs") as e:
        db.sql("SELECT * FROM 'https://127.0.0.1:9/x.parquet'")
    assert "download" not in str(e.value).lower()
    assert db.query("SELECT count(*) FROM duckdb_extensions() WHERE loaded AND "
                    "install_mode <> 'STATICALLY_LINKED'") == [(0,)]
    # what is built in stays: time zones (icu), JSON, Parquet
    assert db.query("SELECT json_extract('{\"a\": 1}', '$.a')::INT, "
                    "strftime(TIMESTAMPTZ '2020-01-01 00:00+00', '%Y')") == [(1, "2020")]


_PROGRESS_BAR = """
import sys, cryptdisk
db = cryptdisk.connect(sys.argv[1])
db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
sql = "SELECT current_setting('enable_progress_bar') FROM (SELECT 1)"
print(db.query(sql), db.reader().query(sql))
db.close()
print(cryptdisk.connect(sys.argv[1], read_only=True).query(sql))
"""


def test_a_long_statement_prints_no_progress_bar(tmp_path):
    """DuckDB's progress bar was on (in a program of its own; under pytest DuckDB turns it
    off, hence the child): a statement running over two seconds drew it on the stdout of
    the program using the database, a pipe included (`cryptdisk sql ... > out.csv` got
    the bar's text in its CSV). Off on the connection and the readers' cursors (a `SET
    progress_bar_time` turns DuckDB's bar back on, as DuckDB documents)."""
    out = subprocess.run([sys.executable, "-c", _PROGRESS_BAR, str(tmp_path / "db")],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "[(False,)] [(False,)]\n[(False,)]\n"


def test_cache_stays_within_its_bound(tmp_path):
    db = cryptdisk.connect(tmp_path / "db", cache_bytes=300_000)
    db.sql(f"CREATE TABLE t {SCHEMA}")
    for i in range(4):
        db.sql("INSERT INTO t " + gen(5000, i * 5000))
    for q in ("SELECT sum(c_int) FROM t", "SELECT max(c_str) FROM t", "SELECT * FROM t"):
        db.query(q)
        db.query(q)  # the second run fills the cache (admitted on the second offer)
        assert 0 < db.cache.size <= db.cache.bound
    assert db.cache.peak <= db.cache.bound
    assert db.query("SELECT count(*), sum(c_int) FROM t") == [(20000, sum(range(20000)))]
    tiny = cryptdisk.connect(tmp_path / "db", cache_bytes=10, read_only=True)
    for _ in range(2):
        assert tiny.query("SELECT sum(c_int) FROM t") == [(sum(range(20000)),)]
    assert tiny.cache.size == 0  # each column is larger than the bound: used, not kept
    tiny.close()
    db.close()


def test_queries_load_only_the_columns_they_name(db):
    def read():  # the columns offered to the cache (kept from their second read)
        return {k[1] for k in [*db.cache._items, *db.cache._offered]}

    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(100))
    db.query("SELECT avg(c_float) FROM t")
    assert read() == {"c_float"}
    db.query("SELECT count(*) FROM t")
    db.query("SELECT t.c_int FROM t AS t WHERE t.c_int > 5")
    assert read() == {"c_float", "c_int"}
    db.query("SELECT * FROM t LIMIT 1")
    assert read() == {"c_float", "c_int", "c_str"}


def test_repr_and_pickle(db):
    import pickle

    assert "tables=0" in repr(db)
    with pytest.raises(TypeError):
        pickle.dumps(db)


def test_table_names_in_literals_load_nothing_and_views_do_not_go_stale(db):
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(100))
    assert db.query("SELECT 't' AS name -- FROM t") == [("t",)]
    assert len(db.cache) == 0
    assert db.query("SELECT count(*) FROM t") == [(100,)]
    db.sql("INSERT INTO t " + gen(5))
    # Every statement registers what it reads afresh: nothing is left from the last one.
    assert db.query("SELECT count(*) FROM (SELECT c_int FROM t)") == [(105,)]
    import duckdb

    with pytest.raises(duckdb.CatalogException, match="does not exist"):
        db.con.sql("SELECT * FROM t")  # the raw DuckDB connection holds no views between


def test_inserts_stream_into_parts_of_bounded_size(db, monkeypatch):
    from cryptdisk.db import _insert

    monkeypatch.setattr(_insert, "BATCH_ROWS", 512)
    monkeypatch.setattr(_insert, "PART_ROWS", 2048)
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(9000))
    rows = [r for (r,) in db.query("SELECT rows FROM system.parts ORDER BY part")]
    assert sum(rows) == 9000 and len(rows) >= 4 and max(rows) <= 2048 + 512
    assert db.query("SELECT count(DISTINCT c_int), min(c_int), max(c_int) FROM t") == \
        [(9000, 0, 8999)]


def test_threads_share_one_database(db):
    from concurrent.futures import ThreadPoolExecutor

    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(2000))

    def work(i):
        if i % 4 == 0:
            db.sql("INSERT INTO t " + gen(10, 10_000 + i * 10))
        return db.query("SELECT count(*) FROM t")[0][0]

    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(work, range(40)))
    assert all(c >= 2000 and (c - 2000) % 10 == 0 for c in counts)
    assert db.query("SELECT count(*) FROM t") == [(2000 + 10 * 10,)]


def test_tampered_catalog_is_refused(tmp_path):
    cryptdisk.connect(tmp_path / "db").close()
    path = tmp_path / "db" / "catalog"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(CatalogError, match="cannot be trusted"):
        cryptdisk.connect(tmp_path / "db")


@pytest.mark.parametrize("extra, message", [
    ('[disks.x]\ntype = "weird"\npath = "x"\n', "unknown type 'weird'"),
    ('[policies.p]\nvolumes = [{ name = "v", disks = ["nope"] }]\n', "unknown disk"),
    ('[disks.y]\ntype = "local"\n', "missing setting 'path'"),
])
def test_config_errors_name_the_problem(tmp_path, extra, message):
    from cryptdisk.errors import ConfigError

    from .dbhelpers import write_config

    cfg = write_config(tmp_path, [1], 1)
    cfg.write_text(cfg.read_text() + extra)
    with pytest.raises(ConfigError, match=message):
        cryptdisk.connect(tmp_path / "db", cfg)


def test_a_database_url_holding_credentials_is_refused_before_anything_quotes_it(tmp_path):
    import cryptdisk.db
    from cryptdisk.errors import ConfigError

    from .dbhelpers import write_config

    secret = "s3cr3t-do-not-leak"
    cfg = write_config(tmp_path, [1], 1)
    attempts = [
        lambda: cryptdisk.connect(f"s3://AKID:{secret}@bucket/db"),  # no config: refused too
        lambda: cryptdisk.connect(f"memory://u:{secret}@bucket/db", cfg, read_only=True),
        lambda: cryptdisk.connect(f"memory://bucket/db?X-Amz-Signature={secret}", cfg,
                                  read_only=True),
        lambda: cryptdisk.connect("memory://bucket/db", cfg, read_only=True, storage_options={
            "endpoint_url": f"http://AKID:{secret}@127.0.0.1:9000"}),
        lambda: cryptdisk.db.location(f"s3://{secret}@bucket/db"),
    ]
    for attempt in attempts:
        with pytest.raises(ConfigError, match="credentials") as info:
            attempt()
        assert secret not in str(info.value) and secret not in repr(info.value)
    with cryptdisk.connect(tmp_path / "db", cfg) as db, \
            pytest.raises(ConfigError, match="credentials") as info:
        cryptdisk.db.publish(db, f"memory://u:{secret}@bucket/db")
    assert secret not in str(info.value)


def test_config_without_default_policy(tmp_path):
    from .dbhelpers import write_config

    cfg = write_config(tmp_path, [1], 1)
    cfg.write_text(cfg.read_text().replace("[policies.default]", "[policies.other]"))
    with pytest.raises(DatabaseError, match="no storage policy named 'default'"):
        cryptdisk.connect(tmp_path / "db", cfg)
    assert not os.path.exists(tmp_path / "db" / "catalog")


def test_a_dropped_database_releases_its_lock(tmp_path):
    import gc

    cryptdisk.connect(tmp_path / "db")  # never closed
    gc.collect()
    cryptdisk.connect(tmp_path / "db").close()


def test_no_key_material_in_catalog_logs_or_reprs(tmp_path, caplog):
    from cryptdisk.keys import key_from_file

    with caplog.at_level(logging.DEBUG):
        db = cryptdisk.connect(tmp_path / "db")
    key_hex = key_from_file(tmp_path / "db.key").hex()
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(10))
    with cryptdisk.open(tmp_path / "db" / "catalog", keyring=db.keyring) as f:
        catalog = f.read().decode()
    assert '"t"' in catalog  # it is the catalog...
    shown = [catalog, caplog.text, repr(db), repr(db.config), repr(db.keyring),
             str(db.sql("SELECT * FROM system.keys").to_pylist()),
             str(db.sql("SELECT * FROM system.disks").to_pylist())]
    for text in shown:
        assert key_hex not in text.lower()
    db.close()


def test_check_on_a_reader_follows_a_merge_that_removed_its_parts(tmp_path, monkeypatch):
    from cryptdisk.db import _maintenance

    path = tmp_path / "db"
    writer = cryptdisk.connect(path)
    writer.sql(f"CREATE TABLE t {SCHEMA}")
    for i in range(3):
        writer.sql(f"INSERT INTO t {gen(100, 100 * i)}")
    reader = cryptdisk.connect(path, read_only=True)
    assert reader.check() == 3
    real = _maintenance.verify_part
    merged = []

    def verify_after_a_merge(disk, part):
        if not merged:  # the writer merges (and deletes) the parts the reader loaded
            merged.append(None)
            merged[0] = writer.optimize("t", final=True)
        real(disk, part)

    monkeypatch.setattr(_maintenance, "verify_part", verify_after_a_merge)
    assert reader.check() == 1  # the merged part, in the catalog that replaced the old one
    assert merged == [True]
    # Damage that persists in an unchanged catalog is still reported.
    part = writer.query("SELECT path FROM system.parts")[0][0]
    os.unlink(path / "data" / part)
    with pytest.raises(CatalogError, match="missing"):
        reader.check()
    reader.close()
    writer.close()


def test_connect_warms_duckdb_on_the_calling_thread(tmp_path):
    """connect runs DuckDB's first JSON function itself (the first query's parse then
    does not pay it) and starts no thread but the scan pool's (made once a process, by
    its first connect); a connect that fails leaves none either."""
    import threading

    from cryptdisk.errors import CatalogError

    path = tmp_path / "db"
    cryptdisk.connect(path).close()
    before = set(threading.enumerate())
    with cryptdisk.connect(path) as db:
        assert set(threading.enumerate()) == before
        assert db.con.execute("SELECT json_serialize_sql('SELECT 1')").fetchall()
        db.sql("CREATE TABLE t (a BIGINT)")
        assert db.query("SELECT count(*) FROM t WHERE a > 1") == [(0,)]
    raw = bytearray((path / "catalog").read_bytes())
    raw[-20] ^= 1
    (path / "catalog").write_bytes(bytes(raw))
    before = set(threading.enumerate())
    with pytest.raises(CatalogError):
        cryptdisk.connect(path, read_only=True)
    assert set(threading.enumerate()) == before


@pytest.mark.parametrize("typ", ["INTERVAL", "INTERVAL[]", "STRUCT(a INTEGER, b INTERVAL)",
                                 "MAP(VARCHAR, INTERVAL)"])
def test_a_column_parquet_cannot_store_is_refused_at_create_table(db, typ):
    with pytest.raises(DatabaseError, match=r"column d of type .*INTERVAL.* not supported") as e:
        db.sql(f"CREATE TABLE iv (a INTEGER, d {typ})")
    assert e.value.hint and "BIGINT" in e.value.hint
    assert "iv" not in db.catalog.tables  # nothing created
    db.sql("CREATE TABLE iv (a INTEGER, d BIGINT, l INTEGER[], s STRUCT(x VARCHAR))")
    db.sql("INSERT INTO iv VALUES (1, 3, [1, 2], {'x': 'a'})")
    assert db.sql("SELECT a, d FROM iv").to_pylist() == [{"a": 1, "d": 3}]


@pytest.mark.parametrize(("typ", "value", "lost"), [
    ("TIMETZ", "TIMETZ '12:00:00+05'", "TIME WITH TIME ZONE"),
    ("TIME WITH TIME ZONE[]", "[TIMETZ '12:00:00+05']", "TIME WITH TIME ZONE"),
    ("STRUCT(a INTEGER, \"b c\" TIMETZ)", "{'a': 1, 'b c': TIMETZ '12:00:00+05'}",
     "TIME WITH TIME ZONE"),
    ("BIT", "'0101'::BIT", "BIT"), ("BITSTRING", "'0101'::BIT", "BIT"),
    ("MAP(VARCHAR, BIT)", "MAP {'k': '01'::BIT}", "BIT"),
    ("VARINT", "123456789012345678901234567890::VARINT", "BIGNUM"),
])
def test_a_type_arrow_stores_without_part_of_its_value_is_refused(db, typ, value, lost):
    """DuckDB hands TIMETZ to Arrow without its offset, BIT and BIGNUM as their internal
    bytes: a part would hold another value (TIMETZ '12:00:00+05' read back as TIME
    '12:00:00'; '0101'::BIT as a BLOB no longer equal to it)."""
    with pytest.raises(DatabaseError, match=rf"column d of type .* not supported.*{lost}") as e:
        db.sql(f"CREATE TABLE lossy (a INTEGER, d {typ})")
    assert e.value.hint
    assert "lossy" not in db.catalog.tables
    assert db.query(f"SELECT ({value})::VARCHAR IS NOT NULL") == [(True,)]  # DuckDB's type


def test_names_and_labels_that_spell_a_lossy_type_are_not_refused(db):
    db.sql("CREATE TABLE ok (\"bit\" INTEGER, s STRUCT(\"bit\" INTEGER, \"time with time zone\" "
           "VARCHAR), e ENUM('BIT', 'BIGNUM'), t TIME, b BLOB)")
    db.sql("INSERT INTO ok VALUES (1, {'bit': 2, 'time with time zone': 'x'}, 'BIT', "
           "TIME '12:00:00', '\\x01'::BLOB)")
    assert db.query("SELECT \"bit\", s['bit'], e, t FROM ok")[0][:3] == (1, 2, "BIT")


def test_connect_in_a_fresh_process_starts_the_scan_pool_only_and_imports_no_pandas(tmp_path):
    """A fresh process's connect starts the scan pool's threads, idle, and no other thread
    (no warm-up thread), and makes pyarrow's first allocation, so that the first query's
    part open waits for neither; it imports no pandas (a third of a second), nor does
    CREATE TABLE. A connect that
    fails starts no thread; a process forked after connect starts its own pool."""
    import subprocess
    import sys

    good, bad = tmp_path / "db", tmp_path / "bad"
    code = f"""
import os, shutil, sys, threading
import pyarrow as pa
import cryptdisk
from cryptdisk.db import _scan
cryptdisk.connect({str(good)!r}).close()
shutil.copytree({str(good)!r}, {str(bad)!r})
shutil.copy({str(good) + ".key"!r}, {str(bad) + ".key"!r})
raw = bytearray(open({str(bad / 'catalog')!r}, "rb").read())
raw[-20] ^= 1
open({str(bad / 'catalog')!r}, "wb").write(bytes(raw))
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    code = f"""
import os, sys, threading
import pyarrow as pa
import cryptdisk
from cryptdisk.db import _scan
from cryptdisk.errors import CatalogError
def names():
    return sorted(t.name.split("_")[0] for t in threading.enumerate())
try:
    cryptdisk.connect({str(bad)!r}, read_only=True)
except CatalogError:
    pass
assert names() == ["MainThread"], threading.enumerate()
assert pa.default_memory_pool().max_memory() == 0
db = cryptdisk.connect({str(good)!r})
want = min(_scan.scan_workers(), _scan._PRESTART)
assert names() == ["MainThread"] + ["cryptdisk-scan"] * want, threading.enumerate()
assert pa.default_memory_pool().max_memory() > 0
assert "pandas" not in sys.modules
pid = os.fork()
if pid == 0:
    ok = len(threading.enumerate()) == 1
    child = cryptdisk.connect({str(good)!r}, read_only=True)
    ok = ok and names() == ["MainThread"] + ["cryptdisk-scan"] * want
    child.close()
    os._exit(0 if ok else 3)
assert os.waitpid(pid, 0)[1] == 0
db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
assert "pandas" not in sys.modules  # (nor does CREATE TABLE)
db.sql("INSERT INTO t SELECT range, range::VARCHAR FROM range(100)")
assert db.query("SELECT s FROM t WHERE k = 42") == [("42",)]
db.close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_connect_opens_a_few_parts_so_the_first_query_reads_at_once(tmp_path, monkeypatch):
    """connect opens the parts of tables that hold few (at most _CONNECT_OPENS in all, on
    local disks) before it returns, so a first point query opens none; a table of more
    parts is left for the statements that read it; a part that cannot be opened fails
    the query that reads it, not connect."""
    from cryptdisk.db import _database, _scan

    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql(f"CREATE TABLE few {SCHEMA} ORDER BY c_int")
        db.sql(f"CREATE TABLE p {SCHEMA} ORDER BY c_int SETTINGS storage_policy = 'plain'")
        db.sql(f"CREATE TABLE many {SCHEMA} ORDER BY c_int")
        db.sql("INSERT INTO few " + gen(100))
        db.sql("INSERT INTO p " + gen(100))
        for i in range(_database._CONNECT_OPENS):
            db.sql("INSERT INTO many " + gen(10, 10 * i))
        assert len(db.table("few").parts) == len(db.table("p").parts) == 1
        few = db.table("few").parts[0].path
    opened = []
    open_part = _scan.open_part
    monkeypatch.setattr(_scan, "open_part", lambda disk, part: (
        opened.append(part.path), open_part(disk, part))[1])
    with cryptdisk.connect(path, read_only=True) as cold:
        assert sorted(opened) == sorted([few, cold.table("p").parts[0].path])
        opened.clear()
        assert cold.query("SELECT c_int, c_float FROM few WHERE c_int = 42") == [(42, 6.0)]
        assert cold.query("SELECT c_str FROM p WHERE c_int = 7") == [
            ("8f14e45fceea167a5a36dedd4bea2543",)]
        assert opened == []
        assert cold.query("SELECT count(*) FROM many WHERE c_int < 25") == [(25,)]
        assert opened and set(opened) <= {p.path for p in cold.table("many").parts}
    os.remove(path / "data" / few)
    opened.clear()
    with cryptdisk.connect(path, read_only=True) as cold:  # (no error: not read yet)
        assert few in opened
        with pytest.raises(CatalogError, match="missing on disk"):
            cold.query("SELECT c_int FROM few WHERE c_int = 42")


def test_only_parts_on_plain_disks_have_a_sha256_and_check_verifies_both(tmp_path, db):
    """An encrypted part has no SHA-256 (AES-GCM authenticates it; NULL in system.parts), a
    plain part has one. check() reads both: an encrypted part swapped for another valid part
    of the database fails on its footer's part id, a flipped byte of a plain part on its
    SHA-256."""
    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql(f"CREATE TABLE p {SCHEMA} SETTINGS storage_policy = 'plain'")
    for _ in range(2):  # the same rows twice: two parts of the same size
        db.sql("INSERT INTO t " + gen(10))
    db.sql("INSERT INTO p " + gen(10))
    digests = db.query("SELECT \"table\", sha256 FROM system.parts ORDER BY 1")
    assert [(t, d is None or len(d)) for t, d in digests] == [("p", 64), ("t", True),
                                                              ("t", True)]
    assert all(p.sha256 == "" for p in db.table("t").parts)
    assert db.check() == 3

    a, b = (os.path.join(tmp_path / "db" / "data", p) for (p,) in db.query(
        "SELECT path FROM system.parts WHERE \"table\" = 't'"))
    os.replace(b, b + ".x")
    os.link(a, b)  # b now holds a's (valid, authenticated) bytes
    with pytest.raises(CatalogError, match=r"not what the catalog recorded.*part id"):
        db.check()
    os.replace(b + ".x", b)
    assert db.check() == 3

    (path,) = db.query("SELECT path FROM system.parts WHERE \"table\" = 'p'")[0]
    full = os.path.join(tmp_path / "db" / "plain", path)
    with open(full, "r+b") as fh:
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 1]))
    with pytest.raises(CatalogError, match="SHA-256"):
        db.check()


def test_a_part_moved_to_a_plain_disk_gets_a_sha256(tmp_path, db):
    """Moving an encrypted table to the plain policy records each part's SHA-256 (computed
    from the bytes copied); check() then verifies it, and moving back keeps it."""
    import hashlib

    db.sql(f"CREATE TABLE t {SCHEMA}")
    db.sql("INSERT INTO t " + gen(100))
    assert db.table("t").parts[0].sha256 == ""
    db.move("t", "plain")
    part = db.table("t").parts[0]
    with open(os.path.join(tmp_path / "db" / "plain", part.path), "rb") as fh:
        assert part.sha256 == hashlib.sha256(fh.read()).hexdigest()
    assert db.check() == 1
    db.move("t", "default")
    assert db.table("t").parts[0].sha256 == part.sha256
    assert db.check() == 1
    assert db.query("SELECT count(*) FROM t") == [(100,)]


def test_commit_parts_refuses_a_plain_part_without_its_sha256(tmp_path, db):
    """A staged part entry on a plain disk must carry its SHA-256: one without it is
    refused before the catalog names it."""
    db.sql(f"CREATE TABLE p {SCHEMA} SETTINGS storage_policy = 'plain'")
    entries = db.stage_parts("p", pa.table({"c_int": [1], "c_str": ["a"], "c_float": [1.0]}),
                             db.catalog.version + 1)
    assert len(entries[0]["sha256"]) == 64
    entries[0]["sha256"] = ""
    with pytest.raises(CatalogError, match="no SHA-256"):
        db.commit_parts("p", entries)
    assert db.query("SELECT count(*) FROM p") == [(0,)]


@pytest.mark.parametrize(("change", "words"), [
    (lambda r: r.sql("INSERT INTO t VALUES (1)"), "INSERT INTO t:"),
    (lambda r: r.sql("CREATE TABLE u (a INT)"), "CREATE TABLE u:"),
    (lambda r: r.sql("DROP TABLE t"), "DROP TABLE t:"),
    (lambda r: r.sql("TRUNCATE t"), "TRUNCATE t:"),
    (lambda r: r.sql("ALTER TABLE t MODIFY SETTING storage_policy = 'plain'"),
     "ALTER TABLE t MODIFY SETTING:"),
    (lambda r: r.sql("OPTIMIZE TABLE t FINAL"), "OPTIMIZE TABLE t:"),
    (lambda r: r.sql("SYSTEM ROTATE KEYS"), "SYSTEM ROTATE KEYS:"),
    (lambda r: r.sql("SYSTEM REENCRYPT"), "SYSTEM REENCRYPT:"),
    (lambda r: r.insert("t", pa.table({"a": pa.array([1], pa.int64())})), "insert into t:"),
    (lambda r: r.insert("t", pa.table({"a": [1.5]})), "insert into t:"),
    (lambda r: r.optimize("t", final=True), "optimize table t:"),
    (lambda r: r.move("t", "plain"), "move table t to policy plain:"),
    (lambda r: r.rotate_keys(), "rotate keys:"),
])
def test_a_read_only_connection_says_which_change_it_refuses_in_the_users_words(
        tmp_path, change, words):
    """The error named cryptdisk's classes ('Insert: the database is open read-only',
    'CreateTable: ...')."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (a BIGINT)")
        db.sql("INSERT INTO t VALUES (7)")
    with cryptdisk.connect(tmp_path / "db", read_only=True) as reader:
        with pytest.raises(DatabaseError) as e:
            change(reader)
        assert str(e.value) == f"{words} the database is open read-only"
        assert "read_only=True" in e.value.hint and "--read-only" in e.value.hint
        assert reader.query("SELECT a FROM t") == [(7,)]


def test_column_names_keep_their_case_and_are_found_in_any_case(tmp_path, db):
    """CREATE TABLE T2 (Col INT) named the column col, where DuckDB keeps Col (its names
    are case-insensitive and case-preserving); the names are found in any case, in SQL
    and in the methods that take column names."""
    db.sql("CREATE TABLE T2 (Key BIGINT, Col VARCHAR, \"Quoted\" INT) ORDER BY KEY")
    meta = db.table("t2")
    assert meta.columns == [("Key", "BIGINT"), ("Col", "VARCHAR"), ("Quoted", "INT")]
    assert meta.order_by == "Key"
    db.sql("INSERT INTO t2 (key, COL, quoted) VALUES (2, 'b', 20), (1, 'a', 10)")
    db.sql("INSERT INTO t2 BY NAME SELECT 3 AS KEY")
    db.insert("t2", pa.table({"key": pa.array([4], pa.int64()), "col": ["d"]}))
    got = db.sql("SELECT * FROM t2 WHERE key < 3 ORDER BY Key")
    assert got.column_names == ["Key", "Col", "Quoted"]
    assert got.to_pylist() == [{"Key": 1, "Col": "a", "Quoted": 10},
                               {"Key": 2, "Col": "b", "Quoted": 20}]
    assert db.query("SELECT min(KEY), max(key), count(DISTINCT col) FROM t2") == [(1, 4, 3)]
    assert db.arrow_table("t2", ["col", "KEY"]).column_names == ["Col", "Key"]
    plan = db.scan_plan("t2", [("KEY", "<=", 2)])
    assert plan
    rows = pa.concat_tables(db.read_part("t2", part, ["col"], [("key", "<=", 2)])
                            for part, _groups in plan)
    assert rows.column_names == ["Col"] and sorted(rows.column("Col").to_pylist()) == ["a", "b"]
    assert db.query("SELECT columns FROM system.tables WHERE name = 'T2'") == [
        ("Key BIGINT, Col VARCHAR, Quoted INT",)]
    with pytest.raises(DatabaseError, match="duplicate column"):
        db.sql("CREATE TABLE d (a INT, A BIGINT)")
    with pytest.raises(DatabaseError, match="no such column"):
        db.sql("CREATE TABLE d (a INT) ORDER BY b")


def test_a_table_of_lower_case_column_names_reads_and_writes_as_before(tmp_path):
    """Catalogs written while unquoted names were folded to lower case keep their names;
    statements in any case reach them."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, v VARCHAR) ORDER BY k")
        db.sql("INSERT INTO t VALUES (1, 'a')")
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("INSERT INTO t (K, V) VALUES (2, 'b')")
        assert db.sql("SELECT K, V FROM t ORDER BY K").to_pylist() == [  # (DuckDB names
            {"k": 1, "v": "a"}, {"k": 2, "v": "b"}]                      # them so)
        assert db.arrow_table("t", ["V"]).column_names == ["v"]
        assert db.table("t").columns == [("k", "BIGINT"), ("v", "VARCHAR")]


def test_arrow_table_of_no_columns_has_the_tables_rows_and_no_column(tmp_path):
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, v VARCHAR) ORDER BY k")
        db.sql("INSERT INTO t SELECT range, 'x' FROM range(1000)")
        db.sql("INSERT INTO t SELECT range, 'y' FROM range(1000, 1500)")  # two parts
        got = db.arrow_table("t", [])
        assert got.num_columns == 0 and got.column_names == []
        assert got.num_rows == 1500
        db.sql("CREATE TABLE e (a INT)")
        assert db.arrow_table("e", []).num_rows == 0


def test_table_names_keep_their_case_and_are_found_in_any_case(tmp_path):
    """CREATE TABLE "T3" could be read only as "T3" (unquoted names were folded to lower
    case before the lookup); DuckDB keeps a table's name as declared and finds it in any
    case, quoted or not."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql('CREATE TABLE "T3" (k BIGINT, v VARCHAR) ORDER BY k')
        db.sql("CREATE TABLE Mixed (m BIGINT)")
        assert sorted(db.catalog.tables) == ["Mixed", "T3"]
        for name in ("t3", "T3", '"T3"', '"t3"'):
            db.sql(f"INSERT INTO {name} VALUES ({len(name)}, '{name}')")
        db.sql("INSERT INTO mixed SELECT k FROM t3")
        db.sql("INSERT INTO MIXED BY NAME SELECT 9 AS m")
        db.insert("MiXeD", pa.table({"m": pa.array([10], pa.int64())}))
        for q in ("SELECT sum(k) FROM t3", "SELECT sum(k) FROM T3 WHERE k > 0",
                  'SELECT sum(x.k) FROM "t3" x'):
            assert db.query(q) == [(2 + 2 + 4 + 4,)], q
        assert db.query("SELECT count(*) FROM t3 JOIN Mixed ON k = m") == [(8,)]
        assert db.query("SELECT count(*) FROM MIXED") == [(6,)]
        assert db.query("SELECT min(K), max(k) FROM t3") == [(2, 4)]
        assert db.query("SELECT count(DISTINCT v) FROM t3") == [(4,)]
        assert db.query("SELECT name FROM system.tables ORDER BY name") == [("Mixed",), ("T3",)]
        assert db.query('SELECT DISTINCT "table" FROM system.parts WHERE "table" = \'T3\''
                        ) == [("T3",)]
        assert db.table("t3").name == "T3" and db.table('MIXED').name == "Mixed"
        assert db.arrow_table("t3", ["K"]).num_rows == 4
        plan = db.scan_plan("t3", [("k", ">", 2)])
        assert sum(db.read_part("t3", part, ["v"]).num_rows for part, _g in plan) == 4
        r = db.reader()
        try:
            assert r.execute("SELECT count(*) FROM t3").to_pylist() == [{"count_star()": 4}]
        finally:
            r.close()
        db.sql("ALTER TABLE t3 MODIFY SETTING storage_policy = 'default'")
        db.sql("OPTIMIZE TABLE t3 FINAL")
        for dup in ("t3", '"t3"', "T3"):
            with pytest.raises(DatabaseError, match="already exists"):
                db.sql(f"CREATE TABLE {dup} (a INT)")
        db.sql("CREATE TABLE IF NOT EXISTS t3 (a INT)")
        assert db.table("T3").columns == [("k", "BIGINT"), ("v", "VARCHAR")]
        db.sql("TRUNCATE t3")
        assert db.query("SELECT count(*) FROM T3") == [(0,)]
        db.sql("DROP TABLE t3")
        db.sql("DROP TABLE IF EXISTS t3")
        assert list(db.catalog.tables) == ["Mixed"]
    with cryptdisk.connect(tmp_path / "db", read_only=True) as db:
        assert list(db.catalog.tables) == ["Mixed"]
        assert db.query('SELECT count(*) FROM "mixed"') == [(6,)]


def test_a_catalog_of_lower_case_table_names_is_found_in_any_case(tmp_path):
    """Catalogs written while unquoted table names were folded to lower case keep their
    names and are found in any spelling, quoted or not."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT)")
        db.sql("INSERT INTO t VALUES (1)")
    with cryptdisk.connect(tmp_path / "db") as db:
        assert list(db.catalog.tables) == ["t"]
        db.sql('INSERT INTO "T" VALUES (2)')
        db.sql("INSERT INTO T VALUES (3)")
        assert db.query('SELECT sum(k) FROM "T"') == [(6,)]
        assert db.query("SELECT sum(k) FROM T") == [(6,)]
        with pytest.raises(DatabaseError, match="already exists"):
            db.sql('CREATE TABLE "T" (a INT)')
        db.sql('DROP TABLE "T"')
        assert not db.catalog.tables


def test_a_read_only_connect_of_a_missing_path_says_nothing_is_there(tmp_path):
    """A typo in the path of a read-only connect said "is not a cryptdisk database (no
    catalog)", as of a directory of other files; now that nothing is at the path, and the
    path is still not created. An existing directory without a catalog says as before."""
    missing = tmp_path / "sales.bd"
    with pytest.raises(DatabaseError, match=f"^no database at {re.escape(str(missing))} "
                       r"\(no such file or directory\)$") as e:
        cryptdisk.connect(missing, read_only=True)
    assert "read_only=True opens a database that exists" in e.value.hint
    assert not os.path.lexists(missing)
    missing.mkdir()
    with pytest.raises(DatabaseError, match=r"is not a cryptdisk database \(no catalog\)$"):
        cryptdisk.connect(missing, read_only=True)


def test_table_names_match_as_duckdb_matches_them_ascii_letters_in_any_case_only(db):
    """Python's str.lower folds É to é, DuckDB only A-Z: the catalog found "é" as the
    table "É", so INSERT INTO "é" and DROP TABLE "é" wrote into and dropped "É" while
    DuckDB (SELECT * FROM "é") said there was no such table. Now the catalog matches names
    as DuckDB does (_names.fold): "é" names no table, whatever the statement; "ÉTAT" is
    "État" (the ASCII letters fold); a new table, view or rename to "é" beside "É" is
    refused with a clear error (the database cannot keep both); "É" renames to "é"."""
    from cryptdisk.db._names import NameDict, fold

    assert fold("ÉtAT") == "État" and fold("K") == "k" and fold("ä") != fold("Ä")
    names = NameDict({"É": 1})
    assert "é" not in names and names.get("é") is None and names.twin("é") == "É"
    db.sql('CREATE TABLE "É" (k INT)')
    db.sql('INSERT INTO "É" VALUES (1)')
    db.sql('CREATE TABLE "État" (k INT)')
    db.sql('INSERT INTO "ÉTAT" VALUES (5)')  # (É as written, the ASCII letters in any case)
    assert db.query('SELECT k FROM "ÉtAt"') == [(5,)]
    for statement in ['INSERT INTO "é" VALUES (2)', 'DROP TABLE "é"', 'SELECT k FROM "é"']:
        with pytest.raises(TableNotFoundError, match=r"^no table 'é'"):
            db.sql(statement)
    with pytest.raises(TableNotFoundError):
        db.table("é")
    assert db.query('SELECT k FROM "É"') == [(1,)]
    for statement, what in [('CREATE TABLE "é" (k INT)', "CREATE TABLE é"),
                            ('CREATE TABLE "é" AS SELECT 1 AS k', "CREATE TABLE é"),
                            ('CREATE VIEW "é" AS SELECT 1 AS k', "CREATE VIEW é"),
                            ('ALTER TABLE "État" RENAME TO "é"', "ALTER TABLE État RENAME TO é")]:
        with pytest.raises(DatabaseError, match=f"^{what}: 'É' is named so too, but for the "
                           "case of letters outside ASCII"):
            db.sql(statement)
    db.sql('ALTER TABLE "É" RENAME TO "é"')
    assert db.query('SELECT k FROM "é"') == [(1,)]
    assert sorted(db.catalog.tables) == ["État", "é"]


def test_a_name_in_upper_case_outside_ascii_names_no_lower_case_table(db):
    """db.table("É") and db.insert("É", ...) with only a table "é" found "é" (the lookup
    tried the name again through str.lower, which folds É): the row went into "é" while
    SQL (INSERT INTO "É") says there is no such table. Now "É" names no table there."""
    db.sql('CREATE TABLE "é" (k INT)')
    with pytest.raises(TableNotFoundError, match=r"^no table 'É'"):
        db.table("É")
    with pytest.raises(TableNotFoundError, match=r"^no table 'É'"):
        db.insert("É", [{"k": 1}])
    assert db.query('SELECT count(*) FROM "é"') == [(0,)]
    assert db.table("é").name == "é"


@pytest.mark.parametrize("written", ['DONNÉES_€', '"DONNÉES_€"', '"Données_€"'])
def test_a_table_named_with_other_case_non_ascii_letters_says_how_duckdb_matches(
        db, written):
    """DuckDB folds the case of ASCII letters only: SELECT * FROM "DONNÉES_€"
    said "table 'DONNÉES_€' is a cryptdisk table: DuckDB reads it only where a statement
    names it as a table", which it did. Now the error says how DuckDB matches the name
    and how to write it; ASCII letters in another case still read the table."""
    db.sql('CREATE TABLE "données_€" (k INT)')
    db.sql('INSERT INTO "Données_€" VALUES (1)')
    if written == '"Données_€"':
        assert db.query(f"SELECT k FROM {written}") == [(1,)]
        return
    with pytest.raises(TableNotFoundError, match=r"^no table 'DONNÉES_€' in .* \(tables: "
                       r"données_€\): DuckDB matches a name's ASCII letters in any case, its "
                       r"other letters as written; the table is 'données_€'$") as e:
        db.query(f"SELECT k FROM {written}")
    assert e.value.hint == 'write the name as the table has it: "données_€"'
    # the server says no more than for any missing table (no other table's name)
    from cryptdisk.server._engines import statement_error
    assert str(statement_error(e.value)) == 'relation "DONNÉES_€" does not exist'

"""COPY t FROM 'file': DuckDB's COPY of a CSV or Parquet file, written as one insert."""

from __future__ import annotations

import duckdb
import pyarrow as pa
import pytest

from cryptdisk.errors import DatabaseError, NotSupportedError, TableNotFoundError


@pytest.fixture
def files(tmp_path):
    parquet = tmp_path / "p.parquet"
    duckdb.sql(f"COPY (SELECT range AS k, 'v' || range AS s FROM range(5)) TO '{parquet}'")
    csv = tmp_path / "h.csv"
    csv.write_text("k,s\n007,x\n2,y\n")
    plain = tmp_path / "n.txt"
    plain.write_text("8|a\n9|b\n")
    return parquet, csv, plain


def test_copy_from_parquet_is_one_insert(db, files):
    parquet, _csv, _plain = files
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    version = db.catalog.version
    assert db.sql(f"COPY t FROM '{parquet}'") is None
    assert db.query("SELECT k, s FROM t ORDER BY k") == [(i, f"v{i}") for i in range(5)]
    assert db.catalog.version == version + 1  # one catalog commit
    assert len(db.table("t").parts) == 1
    # nothing of DuckDB's left behind
    assert db.query("SELECT count(*) FROM duckdb_tables() WHERE temporary") == [(0,)]


def test_copy_from_csv_with_duckdb_options_and_a_column_list(db, files):
    _parquet, csv, plain = files
    db.sql("CREATE TABLE t (k VARCHAR, s VARCHAR, n INTEGER) ORDER BY k")
    # HEADER: the first line is skipped; the file's columns go to (k, s) by position,
    # read as the table's types (007 stays '007'), and n is NULL
    db.sql(f"COPY t (k, s) FROM '{csv}' (FORMAT csv, HEADER)")
    assert db.query("SELECT * FROM t ORDER BY k") == [("007", "x", None), ("2", "y", None)]
    db.sql(f"COPY t (S, K) FROM '{plain}' WITH (FORMAT csv, DELIMITER '|', HEADER false)")
    assert db.query("SELECT k, s FROM t WHERE n IS NULL ORDER BY k") == [
        ("007", "x"), ("2", "y"), ("a", "8"), ("b", "9")]


def test_copy_from_casts_as_duckdb_does_and_fails_whole(db, files, tmp_path):
    _parquet, _csv, _plain = files
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    bad = tmp_path / "bad.csv"
    bad.write_text("k,s\n1,a\nnot a number,b\n")
    with pytest.raises(DatabaseError, match=r"(?s)COPY t FROM: .*not a number"):
        db.sql(f"COPY t FROM '{bad}' (HEADER)")
    assert db.query("SELECT count(*) FROM t") == [(0,)]
    assert db.table("t").parts == []


@pytest.mark.parametrize(("sql", "error", "message"), [
    ("COPY t (k, nope) FROM '{p}'", DatabaseError, r"no column\(s\) nope"),
    ("COPY t (k, K) FROM '{p}'", DatabaseError, "named twice"),
    ("COPY missing FROM '{p}'", TableNotFoundError, "missing"),
    ("COPY t FROM '/nonexistent/x.csv'", DatabaseError, "No files found"),
    ("COPY t FROM STDIN", NotSupportedError, "STDIN"),
])
def test_copy_from_errors(db, files, sql, error, message):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR)")
    with pytest.raises(error, match=message):
        db.sql(sql.format(p=files[0]))
    assert db.query("SELECT count(*) FROM t") == [(0,)]


def test_copy_into_a_temporary_table_is_duckdbs(db, files):
    db.sql("CREATE TEMP TABLE scratch (k BIGINT, s VARCHAR)")
    db.sql(f"COPY scratch FROM '{files[0]}'")
    assert db.query("SELECT count(*) FROM scratch") == [(5,)]
    assert "scratch" not in db.catalog.tables


def test_copy_from_on_a_read_only_connection_is_refused(tmp_path, files):
    import cryptdisk

    path = tmp_path / "ro"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR)")
    with cryptdisk.connect(path, read_only=True) as ro, pytest.raises(DatabaseError):
        ro.sql(f"COPY t FROM '{files[0]}'")


def test_copy_to_a_file_it_cannot_write_names_the_statement_and_its_target(db, tmp_path):
    """DuckDB's "IO Error: Cannot open file ..." said nothing of the COPY it came from
    (before: the bare IO Error, no hint); now the error names it as other statements'
    errors do, with a hint when the target's directory is missing."""
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("INSERT INTO t VALUES (1)")
    missing = tmp_path / "nonexistent"
    with pytest.raises(DatabaseError) as e:
        db.sql(f"COPY t TO '{missing}/x.csv'")
    assert str(e.value).startswith(f"COPY t TO '{missing}/x.csv': IO Error: ")
    assert e.value.hint == f"the directory {missing} does not exist: create it first"
    with pytest.raises(DatabaseError) as e:
        db.sql(f"copy (SELECT k FROM t) TO '{missing}/x.parquet' (FORMAT parquet)")
    assert str(e.value).startswith(f"COPY (query) TO '{missing}/x.parquet': IO Error: ")
    with pytest.raises(DatabaseError, match=r"^COPY t TO '.*': IO Error: ") as e:
        db.sql(f"COPY t TO '{tmp_path}'")  # a directory: it exists, so no hint
    assert e.value.hint is None
    db.sql(f"COPY t TO '{tmp_path}/ok.csv'")
    assert (tmp_path / "ok.csv").read_text() == "k\n1\n"


@pytest.mark.parametrize("target", [
    "'cryptdisk://out/t.parquet'",
    "'CRYPTDISK://out/t.csv' (HEADER, DELIMITER ',')",
    "'cryptdisk:///out/t.parquet' (FORMAT parquet)",
    "$$cryptdisk://out/t.csv$$",
    "E'cryptdisk://out/t.csv'",
    "'cryptdisk:'\n'//out/t.csv'",
    '"cryptdisk://out/t.csv"',
    "/* a comment */ 'cryptdisk://out/t.csv' WITH (FORMAT csv)",
])
@pytest.mark.parametrize("source", ["t", "(SELECT 'TO ''x''' AS a, s FROM t)"])
def test_copy_to_a_cryptdisk_url_is_refused_and_writes_nothing(db, tmp_path, monkeypatch,
                                                               source, target):
    """The database's DuckDB has no cryptdisk filesystem: COPY t TO 'cryptdisk://out/x'
    wrote the rows in plaintext under a local directory named cryptdisk: (before: with
    cryptdisk:/out present, 14 of these 16 wrote the file, the other two failed only for
    want of a directory CRYPTDISK:); now every way of writing the target is refused before
    anything is written."""
    work = tmp_path / "work"
    (work / "cryptdisk:" / "out").mkdir(parents=True)
    (work / "out").mkdir()
    monkeypatch.chdir(work)
    db.sql("CREATE TABLE t (s VARCHAR)")
    db.sql("INSERT INTO t VALUES ('secret')")
    with pytest.raises(DatabaseError, match=r"^COPY (t|\(query\)) TO '(?i:cryptdisk:)//.*': the "
                       r"database writes a COPY's file itself, in plaintext, and not to a "
                       r"cryptdisk:// URL") as e:
        db.sql(f"COPY {source} TO {target}")
    assert "fsspec.filesystem('cryptdisk'" in e.value.hint
    assert [p for p in work.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize("target", ["'a b.csv'", "'it''s.csv'",
                                    "$$a b.csv$$", "'x.csv' -- cryptdisk://out"])
def test_copy_to_a_quoted_path_writes_that_file(db, tmp_path, monkeypatch, target):
    """Spaces, doubled quotes, escapes and dollar quotes name the file DuckDB writes."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    db.sql("CREATE TABLE t (s VARCHAR)")
    db.sql("INSERT INTO t VALUES ('v')")
    db.sql(f"COPY t TO {target}")
    assert [p.name for p in work.iterdir()] == [
        {"'a b.csv'": "a b.csv", "$$a b.csv$$": "a b.csv",
         "'x.csv' -- cryptdisk://out": "x.csv"}.get(target, "it's.csv")]
    assert next(work.iterdir()).read_text() == "s\nv\n"


def test_copy_to_error_names_the_target_after_a_to_in_the_query(db, tmp_path):
    """The error of a COPY (query) TO whose query holds 'TO ''x''' named the target ''
    (the regex stopped at the string in the query); now the target DuckDB writes."""
    db.sql("CREATE TABLE t (s VARCHAR)")
    missing = tmp_path / "nonexistent"
    with pytest.raises(DatabaseError) as e:
        db.sql(f"COPY (SELECT 'TO ''x''' AS a FROM t) TO '{missing}/it''s.csv'")
    assert str(e.value).startswith(f"COPY (query) TO '{missing}/it's.csv': IO Error: ")
    assert e.value.hint == f"the directory {missing} does not exist: create it first"


def test_copy_from_database_is_not_named_as_a_copy_to_a_file(db):
    """COPY FROM DATABASE a TO b copies a DuckDB database into another, no file: its
    error named it "COPY FROM TO 'memory'" (a file target read from the tokens)."""
    with pytest.raises(DatabaseError, match=r"^Binder Error: Cannot copy from \"memory\""):
        db.sql("COPY FROM DATABASE memory TO memory")


@pytest.mark.parametrize("statement", [
    "SELECT * FROM read_parquet('cryptdisk://secure/t.parquet')",
    "SELECT * FROM 'CRYPTDISK://secure/t.parquet'",
    "SELECT count(*) FROM read_parquet(['cryptdisk://secure/*.parquet'])",
    "INSERT INTO t SELECT * FROM read_parquet('cryptdisk://secure/t.parquet')",
    "COPY t FROM 'cryptdisk://secure/t.parquet'",
])
def test_reading_a_cryptdisk_url_in_sql_says_how_to_read_it(db, tmp_path, monkeypatch,
                                                             statement):
    """The database's DuckDB has no cryptdisk filesystem: a statement reading a
    cryptdisk:// file failed with DuckDB's 'No files found that match the pattern', as if
    the file were missing. Now the DatabaseError says the SQL does not read cryptdisk://
    URLs and the hint how to: the file through the cryptdisk filesystem, inserted with
    db.insert, which (followed here) reads it."""
    import fsspec
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from tests.configs import encrypted_over_local

    cfg = tmp_path / "cryptdisk.toml"
    cfg.write_text(encrypted_over_local("00" * 32))
    fs = fsspec.filesystem("cryptdisk", config=str(cfg), skip_instance_cache=True)
    pq.write_table(pa.table({"k": [7, 8]}), "secure/t.parquet", filesystem=fs)
    db.sql("CREATE TABLE t (k BIGINT)")
    with pytest.raises(DatabaseError, match=r"(?i)cryptdisk://secure/.*: the database's SQL "
                       r"does not read cryptdisk:// URLs") as e:
        db.sql(statement)
    assert "No files found" not in str(e.value)
    assert "db.insert('t', 'cryptdisk://DISK/path.parquet')" in e.value.hint
    assert "fs = fsspec.filesystem('cryptdisk', config=PATH); db.insert('t', " \
        "pyarrow.dataset.dataset('DISK/path.parquet', format='parquet', filesystem=fs))" \
        in e.value.hint
    assert db.insert("t", ds.dataset("secure/t.parquet", format="parquet", filesystem=fs)) == 2
    monkeypatch.setenv("CRYPTDISK_CONFIG", str(cfg))  # (the database has no config file)
    assert db.insert("t", "cryptdisk://secure/t.parquet") == 2
    assert db.query("SELECT k FROM t ORDER BY k") == [(7,), (7,), (8,), (8,)]

"""Python rows of a query's result (``Database.query``, ``Reader.query``, ``cryptdisk
sql``): every column kept, also those that share a name, and values Python's types hold
only as DuckDB converts them (infinite dates and timestamps), as DuckDB's ``fetchall``
gives them."""

import json

import duckdb
import pytest

from cryptdisk.db import python_rows

from .test_db_cli import run

_EDGES = ("SELECT 'infinity'::DATE, '-infinity'::DATE, 'infinity'::TIMESTAMP, "
          "'-infinity'::TIMESTAMP, TIMESTAMP '0001-01-01', 'infinity'::TIMESTAMPTZ, 1 AS x")


@pytest.mark.parametrize("sql", [
    "SELECT 1 AS a, 2 AS a, 'x' AS A",
    "SELECT * FROM t, t AS u ORDER BY t.k, u.k",
    "SELECT t.k, u.k, t.s, u.s FROM t JOIN t AS u ON t.k < u.k ORDER BY 1, 2",
    "SELECT * FROM t WHERE false",
    _EDGES,
    "SELECT d FROM t, (SELECT 'infinity'::DATE AS d UNION ALL SELECT NULL) ORDER BY k, d",
])
def test_query_rows_are_duckdbs(db, sql):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1, 'a'), (2, NULL), (3, '')")
    ref = duckdb.connect()
    ref.execute("CREATE TABLE t (k BIGINT, s VARCHAR)")
    ref.execute("INSERT INTO t VALUES (1, 'a'), (2, NULL), (3, '')")
    want = ref.execute(sql).fetchall()
    assert db.query(sql) == want
    reader = db.reader()
    try:
        assert reader.query(sql) == want
    finally:
        reader.close()
    table = db.sql(sql)
    assert python_rows(table) == want
    assert all(len(r) == table.num_columns for r in python_rows(table))


def test_cli_prints_every_column_and_infinite_dates(tmp_path):
    db = str(tmp_path / "db")
    csv_out = run("sql", db, "--create", "-q", "SELECT 1 AS a, 2 AS a, 3 AS b",
                  "--format", "csv")
    assert csv_out.returncode == 0, csv_out.stderr
    assert csv_out.stdout == "a,a,b\n1,2,3\n"
    table = run("sql", db, "-q", "SELECT 1 AS a, 2 AS a")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[2].split() == ["1", "|", "2"]
    edges = run("sql", db, "-q", _EDGES, "--format", "json")
    assert edges.returncode == 0 and "Traceback" not in edges.stderr, edges.stderr
    (row,) = json.loads(edges.stdout)
    assert list(row.values())[:3] == ["9999-12-31", "0001-01-01", "9999-12-31 23:59:59.999999"]

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


@pytest.mark.parametrize("key", ["DATE", "TIMESTAMP", "TIMESTAMPTZ"])
def test_infinite_dates_and_timestamps_are_stored_keyed_and_merged(db, key):
    """'infinity' and '-infinity' in an ORDER BY key and in other columns: the insert,
    OPTIMIZE and filtered queries answer as DuckDB does. pyarrow cannot make Python values
    of their statistics (a date past year 9999), which failed the insert and OPTIMIZE with
    an OverflowError."""
    ref = duckdb.connect()
    statements = [
        f"CREATE TABLE t (k {key}, d DATE, n INT) ORDER BY k",
        "INSERT INTO t VALUES ('infinity', '-infinity', 1), ('2024-01-01', 'infinity', 2),"
        " ('-infinity', '2024-01-01', 3), (NULL, NULL, 4)",
        f"INSERT INTO t SELECT ('2000-01-01'::{key}) + INTERVAL (i) DAY,"
        " DATE '2000-01-01' + i::INT, i + 10 FROM range(3000) r(i)",
        "INSERT INTO t VALUES ('infinity', 'infinity', 5)",
    ]
    for statement in statements:
        db.sql(statement)
        ref.execute(statement.replace(" ORDER BY k", ""))
    queries = [
        "SELECT n FROM t WHERE k > '3000-01-01' ORDER BY n",
        "SELECT n FROM t WHERE k < '1000-01-01' ORDER BY n",
        "SELECT n FROM t WHERE d > '3000-01-01' ORDER BY n",
        "SELECT n FROM t ORDER BY k DESC NULLS LAST, n LIMIT 3",
        "SELECT count(*), min(k)::VARCHAR, max(k)::VARCHAR, max(d)::VARCHAR FROM t",
    ]
    for q in queries:
        assert db.query(q) == ref.execute(q).fetchall(), q
    db.sql("OPTIMIZE TABLE t FINAL")
    assert db.query("SELECT parts FROM system.tables") == [(1,)]
    for q in queries:
        assert db.query(q) == ref.execute(q).fetchall(), q

"""Column names match as DuckDB matches them: ASCII letters in any case, other letters as
written (``Ä`` and ``ä`` are two columns, ``K`` and ``k`` one). Each statement runs on a
DuckDB in-memory connection and on a cryptdisk database (an encrypted and a plain table)
holding the same rows, and both answer alike: the filters and projections the scan applies
itself (pushdown), INSERT by column list and BY NAME, ``db.insert`` of Arrow and pandas
data, COPY, UPDATE, DELETE, RENAME and ADD COLUMN, and the catalog opened again."""

import duckdb
import pyarrow as pa
import pytest

import cryptdisk
from cryptdisk.errors import DatabaseError

_CREATE = 'CREATE TABLE t ("Ä" VARCHAR, "ä" VARCHAR, k BIGINT, "É" BIGINT, "é" BIGINT)'
_ROWS = [
    "INSERT INTO t VALUES ('A1', 'a1', 1, 10, 100), ('A2', 'a2', 2, 20, 200)",
    'INSERT INTO t ("ä", K, "é") VALUES (\'a3\', 3, 300)',
    'INSERT INTO t ("Ä", k, "É") VALUES (\'A4\', 4, 40)',
    'INSERT INTO t BY NAME SELECT 5 AS k, \'a5\' AS "ä", 500 AS "é"',
    'INSERT INTO t BY NAME SELECT 6 AS K, \'A6\' AS "Ä", 60 AS "É"',
]
_QUERIES = [
    "SELECT * FROM t ORDER BY k",
    'SELECT "ä", "Ä" FROM t ORDER BY k',
    'SELECT k FROM t WHERE "ä" = \'a3\'',
    'SELECT k FROM t WHERE "Ä" = \'a3\'',
    'SELECT k FROM t WHERE "Ä" = \'A4\'',
    'SELECT k FROM t WHERE "é" > 150 ORDER BY k',
    'SELECT k FROM t WHERE "É" > 15 ORDER BY k',
    'SELECT k FROM t WHERE "é" IS NULL ORDER BY k',
    'SELECT k FROM t WHERE "É" IS NULL ORDER BY k',
    'SELECT k FROM t WHERE "é" IN (100, 300) ORDER BY k',
    'SELECT k FROM t WHERE "É" BETWEEN 10 AND 20 ORDER BY k',
    'SELECT "é" FROM t WHERE K >= 3 ORDER BY K',
    'SELECT min("é"), max("é"), min("É"), max("É") FROM t',
    'SELECT count(DISTINCT "ä"), count(DISTINCT "Ä") FROM t',
    'SELECT count("ä"), count("Ä"), count(*) FROM t',
    'SELECT x.k FROM t AS x WHERE x."é" = 200',
    'SELECT v.k FROM (SELECT k, "é" AS w FROM t) AS v WHERE v.w = 500',
    'SELECT k FROM (SELECT * FROM t) AS v WHERE "É" = 60',
    'SELECT a.k, b.k FROM t a JOIN t b ON a."é" = b."É" * 10 ORDER BY a.k',
    'SELECT k FROM t ORDER BY "é" NULLS FIRST, k LIMIT 3',
    'SELECT k FROM t ORDER BY "É" DESC NULLS LAST, k LIMIT 2',
    'SELECT upper("ä"), lower("Ä") FROM t ORDER BY k',
    'SELECT k FROM t WHERE "ä" = \'a1\' AND "É" = 10',
]


def _duckdb() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(_CREATE)
    for statement in _ROWS:
        con.execute(statement)
    return con


def _answers(run, queries=_QUERIES):
    out = []
    for q in queries:
        try:
            out.append(sorted(run(q), key=repr) if "ORDER BY" not in q else run(q))
        except (duckdb.Error, DatabaseError) as exc:
            out.append(type(exc).__name__)
    return out


@pytest.fixture(params=["encrypted", "plain"])
def setting(request):
    """The SETTINGS of a table on an encrypted disk, or on a plain one."""
    return " SETTINGS storage_policy = 'plain'" if request.param == "plain" else ""


@pytest.fixture
def table_db(setting, tmp_path):
    d = cryptdisk.connect(tmp_path / "db")
    d.sql(_CREATE + " ORDER BY k" + setting)
    for statement in _ROWS:
        d.sql(statement)
    yield d
    d.close()


def test_columns_differing_in_non_ascii_case_are_two_columns_as_in_duckdb(table_db, tmp_path):
    """CREATE TABLE refused "Ä" beside "ä" ('duplicate column names (in any case...)')
    though DuckDB keeps both; the insert, pushdown and catalog maps folded names with
    str.lower. Now every query answers as DuckDB's over the same rows, the table opened
    again too."""
    con = _duckdb()
    expected = _answers(lambda q: con.execute(q).fetchall())
    assert _answers(table_db.query) == expected
    assert [c for c, _t in table_db.table("t").columns] == ["Ä", "ä", "k", "É", "é"]
    path = table_db.path
    table_db.close()
    again = cryptdisk.connect(path)
    try:
        assert _answers(again.query) == expected
    finally:
        again.close()


def test_a_column_named_in_other_non_ascii_case_names_no_column(db, setting):
    """With only "Ö" in a table, "ö" names no column in DuckDB: a filter on it is an error,
    never a filter on "Ö" (a pushdown on the wrong column answers wrongly)."""
    table_db, con = db, duckdb.connect()
    con.execute('CREATE TABLE o ("Ö" BIGINT, "Straße" BIGINT)')
    table_db.sql('CREATE TABLE o ("Ö" BIGINT, "Straße" BIGINT) ORDER BY "Ö"' + setting)
    for run in (con.execute, table_db.sql):
        run("INSERT INTO o VALUES (1, 2), (3, 4)")
    for q in ['SELECT count(*) FROM o WHERE "ö" = 1', 'SELECT "ö" FROM o',
              'SELECT min("ö") FROM o', 'SELECT count(*) FROM o WHERE "STRASSE" = 2']:
        with pytest.raises(duckdb.Error):
            con.execute(q)
        with pytest.raises(DatabaseError):
            table_db.query(q)
    assert table_db.query('SELECT "ö" FROM (SELECT 5 AS "ö")') == [(5,)]
    assert table_db.query('SELECT "STRAßE" FROM o WHERE "straße" = 4') == [(4,)]
    for q in ['SELECT "Ö" FROM (SELECT * FROM o) AS v WHERE "Ö" = 3',
              'SELECT w FROM (SELECT "Ö" AS w FROM o) WHERE w = 3',
              'SELECT "Ö" FROM o WHERE "Ö" = 3', 'SELECT max("Ö") FROM o']:
        assert table_db.query(q) == con.execute(q).fetchall() == [(3,)]
    for q in ['INSERT INTO o ("ö") VALUES (1)', 'UPDATE o SET "ö" = 1',
              'ALTER TABLE o RENAME COLUMN "ö" TO x', 'ALTER TABLE o DROP COLUMN "ö"']:
        with pytest.raises(duckdb.Error):
            con.execute(q)
        with pytest.raises(DatabaseError):
            table_db.sql(q)
    assert table_db.query('SELECT * FROM o ORDER BY 1') == [(1, 2), (3, 4)]


def test_inserts_updates_and_renames_keep_the_columns_apart(table_db, tmp_path):
    """db.insert of Arrow and pandas data, COPY with a column list, UPDATE, DELETE, RENAME
    COLUMN, ADD COLUMN and CREATE TABLE AS with "Ä" beside "ä", as DuckDB does them."""
    pd = pytest.importorskip("pandas")
    con = _duckdb()
    csv = tmp_path / "rows.csv"
    csv.write_text("ä,k\na9,9\n")
    arrow = pa.table({"ä": ["a7"], "Ä": ["A7"], "K": pa.array([7], pa.int64()),
                      "é": pa.array([700], pa.int64())})
    frame = pd.DataFrame({"É": [80], "k": [8], "Ä": ["A8"]})
    table_db.insert("t", arrow)
    table_db.insert("t", frame)
    con.execute("INSERT INTO t BY NAME SELECT * FROM arrow")
    con.execute("INSERT INTO t BY NAME SELECT * FROM frame")
    statements = [
        f"COPY t (\"ä\", k) FROM '{csv}' (HEADER)",
        'UPDATE t SET "ä" = "Ä" || \'!\' WHERE "é" IS NULL',
        'UPDATE t SET "É" = "é" + 1 WHERE "ä" = \'a3\'',
        'DELETE FROM t WHERE "Ä" = \'A2\'',
        'ALTER TABLE t RENAME COLUMN "ä" TO "ö"',
        'ALTER TABLE t ADD COLUMN "Ö" BIGINT DEFAULT 5',
        'ALTER TABLE t RENAME COLUMN "É" TO "Ǆ"',
        'CREATE TABLE c AS SELECT "Ö", "ö", "Ǆ", "ǆ" FROM (SELECT 1 AS "Ö", 2 AS "ö", '
        '3 AS "Ǆ", 4 AS "ǆ")',
    ]
    for statement in statements:
        con.execute(statement)
        table_db.sql(statement)
    queries = ["SELECT * FROM t ORDER BY k", 'SELECT k FROM t WHERE "ö" = \'a9\'',
               'SELECT k, "Ǆ" FROM t WHERE "é" > 0 ORDER BY k', "SELECT * FROM c",
               'SELECT count(*) FROM t WHERE "Ö" = 5']
    assert _answers(table_db.query, queries) == _answers(lambda q: con.execute(q).fetchall(),
                                                         queries)
    assert [c for c, _t in table_db.table("t").columns] == \
        [r[0] for r in con.execute("DESCRIBE t").fetchall()]


def test_duplicate_columns_are_still_refused_as_duckdb_refuses_them(db):
    """"K" and "k" are one name for DuckDB: CREATE TABLE, ADD COLUMN and RENAME COLUMN
    still refuse a second one (and the data given to db.insert that names it twice)."""
    with pytest.raises(DatabaseError, match="duplicate column names"):
        db.sql('CREATE TABLE t ("K" INT, k INT)')
    db.sql('CREATE TABLE t ("Ä" INT, k INT)')
    with pytest.raises(DatabaseError, match=r"the table has a column k$"):
        db.sql('ALTER TABLE t ADD COLUMN "K" INT')
    with pytest.raises(DatabaseError, match="has a column"):
        db.sql('ALTER TABLE t RENAME COLUMN "Ä" TO "K"')
    with pytest.raises(DatabaseError, match="the data has column k twice"):
        db.insert("t", pa.table([pa.array([1]), pa.array([2])], names=["K", "k"]))
    with pytest.raises(DatabaseError):  # (DuckDB: no column "ä")
        db.insert("t", pa.table({"ä": [1], "k": [2]}))
    db.insert("t", pa.table({"Ä": [1], "K": [2]}))
    assert db.query('SELECT * FROM t') == [(1, 2)]

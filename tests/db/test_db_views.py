"""Views of the embedded database: kept in the sealed catalog, read as their query.

A view's query is written out in the statement that reads it (in subqueries, CTEs,
joins, UNIONs, EXPLAIN, COPY ... TO, INSERT ... SELECT, CREATE TABLE ... AS, DELETE's
and UPDATE's WHERE), so the scans' pushdown and a role's policies see the tables it
reads; the answers are DuckDB's own views' answers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import duckdb
import pytest

import cryptdisk
from cryptdisk.errors import (
    DatabaseError,
    FieldPolicyError,
    NotSupportedError,
    TableNotFoundError,
)
from tests.db.test_db_crash import env
from tests.db.test_db_roles import MASKED, PANS, made, served  # noqa: F401 (fixtures)

ROWS = 3000
VIEWS = [
    "CREATE VIEW mid AS SELECT id, name, id % 10 AS bucket FROM t WHERE id BETWEEN 500 AND 1500",
    "CREATE VIEW renamed (k, label) AS SELECT id, name FROM t",
    "CREATE VIEW over AS SELECT k, upper(label) AS big FROM renamed WHERE k < 2000",
    "CREATE VIEW grouped AS SELECT bucket, count(*) AS n, max(id) AS top FROM mid GROUP BY bucket",
    "CREATE VIEW latest AS SELECT id, name FROM t ORDER BY id DESC LIMIT 10",
    "CREATE VIEW joined AS SELECT t.id, u.tag FROM t JOIN u ON t.id = u.id",
    "CREATE VIEW own_cte AS WITH x AS (SELECT id FROM t WHERE id < 5) SELECT id * 2 AS d FROM x",
]
QUERIES = [
    "SELECT count(*) FROM mid",
    "SELECT min(id), max(id), count(DISTINCT name) FROM mid",
    "SELECT * FROM mid WHERE id = 777",
    "SELECT k, label FROM renamed WHERE k IN (1, 2999) ORDER BY k",
    "SELECT * FROM over WHERE k BETWEEN 10 AND 12 ORDER BY k",
    "SELECT * FROM grouped ORDER BY bucket",
    "SELECT count(*) FROM latest WHERE id < 2995",
    "SELECT * FROM joined ORDER BY id",
    "SELECT * FROM own_cte ORDER BY d",
    "SELECT m.id FROM mid AS m JOIN renamed r ON m.id = r.k WHERE r.k < 503 ORDER BY 1",
    "SELECT id FROM t WHERE id IN (SELECT top FROM grouped) ORDER BY id",
    "WITH mid AS (SELECT 42 AS id) SELECT * FROM mid",  # a CTE hides the view
    "WITH a AS (SELECT * FROM mid WHERE id < 503) SELECT * FROM a ORDER BY id",
    "SELECT id FROM mid WHERE id < 502 UNION ALL SELECT k FROM renamed WHERE k < 2 ORDER BY 1",
    "SELECT id FROM mid ORDER BY id DESC LIMIT 3",
    "SELECT * FROM \"MID\" WHERE id = 500",
]


def _fill(run):
    run("CREATE TABLE t (id BIGINT, name VARCHAR) ORDER BY id")
    for lo in range(0, ROWS, 1000):  # three parts
        run(f"INSERT INTO t SELECT i, 'n' || (i % 7) FROM range({lo}, {lo + 1000}) r(i)")
    run("CREATE TABLE u (id BIGINT, tag VARCHAR)")
    run("INSERT INTO u VALUES (1, 'a'), (777, 'b'), (5000, 'c')")
    for sql in VIEWS:
        run(sql)


@pytest.fixture
def views_db(tmp_path):
    db = cryptdisk.connect(tmp_path / "db")
    _fill(db.sql)
    yield db
    db.close()


@pytest.fixture(scope="module")
def duck():
    con = duckdb.connect()
    _fill(lambda sql: con.execute(sql.replace(" ORDER BY id", "")
                                  if sql.startswith("CREATE TABLE") else sql))
    yield con
    con.close()


@pytest.mark.parametrize("query", QUERIES)
def test_a_view_answers_as_duckdbs_own_view(views_db, duck, query):
    assert views_db.query(query) == duck.execute(query).fetchall()


@pytest.mark.parametrize("query", [
    "WITH t AS (SELECT 99 AS id, 'x' AS name) SELECT count(*) FROM mid",
    "WITH t AS (SELECT 99 AS id, 'x' AS name) SELECT * FROM (SELECT * FROM grouped) g",
    "WITH t AS (SELECT 99 AS id, 'x' AS name) SELECT * FROM u WHERE id IN "
    "(SELECT k FROM over)",                                   # through a view over a view
    "SELECT * FROM (WITH \"T\" AS (SELECT 1 AS id) SELECT * FROM latest) x",
])
def test_a_ctes_name_does_not_hide_a_table_a_view_reads(views_db, duck, query):
    """DuckDB's view reads its tables whatever CTEs the statement reading it names; a
    view written out under a CTE of one of its tables' names would read the CTE: such a
    statement is refused, saying which name to change, never answered from the CTE."""
    assert duck.execute(query).fetchall() != [(1,)]  # (DuckDB reads the table)
    with pytest.raises(DatabaseError, match=r"CTE named (t|T)") as e:
        views_db.query(query)
    assert "another name" in e.value.hint
    # a CTE of another name, or of the table's name where no view is read, runs
    assert views_db.query("WITH c AS (SELECT 1) SELECT count(*) FROM mid, c") == [(1001,)]
    assert views_db.query("WITH t AS (SELECT 5 AS id) SELECT * FROM t") == [(5,)]


def test_views_live_in_the_sealed_catalog_and_survive_reopen(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        _fill(db.sql)
        assert db.query("SELECT name FROM system.views ORDER BY name") == sorted(
            [(s.split()[2],) for s in VIEWS])
    catalog = (path / "catalog").read_bytes()
    for text in (b"bucket", b"upper(label)", b"CREATE VIEW", b"renamed"):
        assert text not in catalog  # sealed: neither the names nor the queries in clear
    with cryptdisk.connect(path) as db:  # another connection, after reopen
        assert db.query("SELECT * FROM mid WHERE id = 777") == [(777, "n0", 7)]
        assert db.query("SELECT columns, reads FROM system.views WHERE name = 'renamed'") \
            == [(["k", "label"], ["t"])]
    # another process, read-only, beside nothing: the view is the catalog's
    code = ("import cryptdisk, sys; db = cryptdisk.connect(sys.argv[1], read_only=True); "
            "print(db.query('SELECT count(*) FROM over'))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], env=env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(2000,)]"


def test_a_point_query_through_a_view_uses_the_key_index(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        _fill(db.sql)
    scans = {}
    for query in ("SELECT id, name FROM t WHERE id = 1777",
                  "SELECT k, label FROM renamed WHERE k = 1777",
                  "SELECT * FROM over WHERE k = 1777"):
        with cryptdisk.connect(path, cache_bytes=0) as db:  # (nothing decoded yet)
            assert len(db.query(query)) == 1
            scans[query] = db.last_scans["t"]
    direct, *through = scans.values()
    assert direct["parts_skipped"] == 2 and direct["row_groups_read"] == 1
    for seen in through:
        assert seen == direct


def test_filters_do_not_cross_a_view_that_changes_its_rows(views_db):
    """An outer WHERE is no filter of the table's rows through a LIMIT, a GROUP BY, a
    DISTINCT or a window: the answers stay DuckDB's."""
    db = views_db
    db.sql("CREATE VIEW ranked AS SELECT id, row_number() OVER (ORDER BY id) AS id2 FROM t")
    db.sql("CREATE VIEW twice AS SELECT DISTINCT id % 2 AS id FROM t")
    assert db.query("SELECT id FROM latest WHERE id > 2997 ORDER BY id") == [(2998,), (2999,)]
    assert db.query("SELECT id2 FROM ranked WHERE id2 = 5") == [(5,)]
    assert db.query("SELECT * FROM twice WHERE id = 1") == [(1,)]
    assert db.query("SELECT n FROM grouped WHERE top = 1500") == [(101,)]


def test_create_or_replace_rename_and_drop(views_db):
    db = views_db
    with pytest.raises(DatabaseError, match="view mid already exists") as e:
        db.sql("CREATE VIEW mid AS SELECT 1")
    assert "CREATE OR REPLACE VIEW" in e.value.hint
    db.sql("CREATE VIEW IF NOT EXISTS mid AS SELECT 1 AS one")  # kept as it was
    assert db.query("SELECT count(*) FROM mid") == [(1001,)]
    db.sql("CREATE OR REPLACE VIEW mid AS SELECT id, name, 0 AS bucket FROM t WHERE id < 3")
    assert db.query("SELECT count(*) FROM mid") == [(3,)]
    assert db.query("SELECT count(*) FROM grouped") == [(1,)]  # reads the new mid
    db.sql("ALTER VIEW latest RENAME TO newest")
    assert db.query("SELECT count(*) FROM newest") == [(10,)]
    with pytest.raises(DatabaseError, match="latest"):
        db.sql("SELECT * FROM latest")
    db.sql("DROP VIEW newest")
    db.sql("DROP VIEW IF EXISTS newest")
    with pytest.raises(DatabaseError, match="no view 'newest'"):
        db.sql("DROP VIEW newest")
    assert "newest" not in [n for (n,) in db.query("SHOW TABLES")]
    assert {"mid", "renamed", "t", "u"} <= {n for (n,) in db.query("SHOW TABLES")}


@pytest.mark.parametrize(("sql", "message"), [
    ("CREATE VIEW x AS SELECT * FROM nope", "no table 'nope'"),
    ("CREATE VIEW t AS SELECT 1", "a table t has the name"),
    ("CREATE VIEW T AS SELECT 1", "a table t has the name"),
    ("CREATE TABLE mid (a INT)", "a view mid has the name"),
    ("ALTER TABLE u RENAME TO MID", "a view mid has the name"),
    ("ALTER VIEW mid RENAME TO u", "has the name"),
    ("CREATE VIEW main.x AS SELECT 1", "without a schema"),
    ("CREATE VIEW x AS DELETE FROM t", "expected AS and a query"),
    ("CREATE VIEW x (a, b, c) AS SELECT 1, 2", "CREATE VIEW x"),
    ("CREATE OR REPLACE VIEW renamed AS SELECT * FROM over", "reads itself"),
    ("CREATE VIEW selfish AS SELECT * FROM selfish", r"reads itself \(selfish -> selfish\)"),
    ("DROP VIEW t", "t is a table, not a view"),
    ("DROP VIEW mid CASCADE", "CASCADE is not supported"),
    ("ALTER VIEW mid AS SELECT 1", "RENAME TO"),
    ("INSERT INTO mid VALUES (1, 'a', 1)", "mid is a view"),
    ("DELETE FROM mid WHERE id = 1", "mid is a view"),
    ("UPDATE mid SET name = 'x'", "mid is a view"),
    ("CREATE VIEW duckdb_settings AS SELECT 1", "a name of DuckDB's catalog"),
    ("CREATE OR REPLACE VIEW DuckDB_Tables AS SELECT 1", "a name of DuckDB's catalog"),
    ("CREATE VIEW pg_tables AS SELECT 1", "a name of DuckDB's catalog"),
    ('CREATE VIEW "information_schema" AS SELECT 1', "a name of DuckDB's catalog"),
    ("CREATE VIEW schemata AS SELECT 1", "a name of DuckDB's catalog"),
    ("ALTER VIEW mid RENAME TO duckdb_views", "a name of DuckDB's catalog"),
    ("CREATE VIEW x WITH (security_definer = true) AS SELECT 1", "unknown view option"),
    ("CREATE VIEW x WITH (security_invoker = 2) AS SELECT 1", "true or false"),
    ("ALTER VIEW mid SET (check_option = local)", "unknown view option"),
    ("ALTER VIEW nothing SET (security_invoker = false)", "no view 'nothing'"),
    ("ALTER VIEW t SET (security_invoker = false)", "t is a table, not a view"),
])
def test_bad_view_statements_say_what_is_wrong(views_db, sql, message):
    before = views_db.query("SELECT name, query FROM system.views ORDER BY name")
    with pytest.raises(DatabaseError, match=message):
        views_db.sql(sql)
    assert views_db.query("SELECT name, query FROM system.views ORDER BY name") == before
    assert views_db.query("SELECT count(*) FROM over") == [(2000,)]


def test_alter_view_of_a_table_points_to_alter_table(views_db):
    with pytest.raises(NotSupportedError, match="t is a table, not a view") as e:
        views_db.sql("ALTER VIEW t RENAME TO t2")
    assert e.value.hint == "ALTER TABLE t RENAME TO t2"


def test_a_view_fails_when_what_it_reads_is_gone(views_db):
    """DROP TABLE, RENAME TO and DROP COLUMN do not look at views (as DuckDB's and
    ClickHouse's): the view fails when read, naming what it misses."""
    db = views_db
    db.sql("ALTER TABLE u RENAME TO u2")
    with pytest.raises(DatabaseError, match="view joined reads u, which does not exist") as e:
        db.sql("SELECT * FROM joined")
    assert "CREATE OR REPLACE VIEW joined" in e.value.hint
    db.sql("ALTER TABLE u2 RENAME TO u")
    assert len(db.query("SELECT * FROM joined")) == 2
    db.sql("ALTER TABLE t DROP COLUMN name")
    with pytest.raises(DatabaseError, match="name"):
        db.sql("SELECT * FROM mid")
    db.sql("DROP TABLE t")
    for view in ("over", "renamed", "grouped"):  # (over -> renamed -> t)
        with pytest.raises(DatabaseError, match=r"reads (t|mid|renamed)\b.*does not exist|"
                           r"reads t, which"):
            db.sql(f"SELECT * FROM {view}")
    db.sql("DROP VIEW renamed")
    with pytest.raises(DatabaseError, match="view over reads renamed, which does not exist"):
        db.sql("SELECT * FROM over")


def test_statements_that_read_a_view(views_db, tmp_path):
    db = views_db
    assert "id" in db.sql("EXPLAIN SELECT * FROM mid WHERE id = 777").to_pylist()[0][
        "explain_value"]
    out = tmp_path / "mid.csv"
    db.sql(f"COPY (SELECT id FROM mid WHERE id < 503 ORDER BY id) TO '{out}' (HEADER false)")
    assert out.read_text().split() == ["500", "501", "502"]
    assert db.query("DESCRIBE renamed") == [("k", "BIGINT", "YES", None, None, None),
                                            ("label", "VARCHAR", "YES", None, None, None)]
    assert db.query("SHOW over")[0][:2] == ("k", "BIGINT")
    assert [r[0] for r in db.query("SUMMARIZE mid")] == ["id", "name", "bucket"]
    db.sql("CREATE TABLE copy ORDER BY k AS SELECT * FROM over WHERE k < 10")
    db.sql("INSERT INTO copy SELECT k, label FROM renamed WHERE k = 2999")
    assert db.query("SELECT count(*), max(k) FROM copy") == [(11, 2999)]
    db.sql("DELETE FROM copy WHERE k IN (SELECT id FROM latest) OR k IN (SELECT k FROM renamed "
           "WHERE k < 3)")
    assert db.query("SELECT k FROM copy ORDER BY k") == [(k,) for k in range(3, 10)]
    db.sql("UPDATE copy SET big = (SELECT max(name) FROM mid) WHERE k IN (SELECT d FROM own_cte)")
    assert db.query("SELECT k FROM copy WHERE big = 'n6' ORDER BY k") == [(4,), (6,), (8,)]
    db.sql("PREPARE p AS SELECT count(*) FROM mid WHERE id < $1")
    assert db.query("EXECUTE p(600)") == [(100,)]
    reader = db.reader()
    try:
        assert reader.query("SELECT count(*) FROM over") == [(2000,)]
        assert reader.query("DESCRIBE mid")[2][:2] == ("bucket", "BIGINT")
    finally:
        reader.close()
    with pytest.raises(DatabaseError, match="'mid' is a view"):
        db.sql("SELECT * FROM pragma_table_info('mid')")  # (a name in a string: no view read)


def test_an_attached_databases_statements_read_views_too(views_db):
    db = views_db
    db.sql("ATTACH ':memory:' AS m")
    db.sql("CREATE TABLE m.copy AS SELECT * FROM over WHERE k < 3")
    db.sql("INSERT INTO m.copy (k, big) SELECT k, label FROM renamed WHERE k = 2999")
    db.sql("INSERT INTO m.copy BY NAME SELECT 7 AS k")
    db.sql("CREATE VIEW m2 AS SELECT 1 AS x")  # (a view named like the database: no matter)
    assert db.query("SELECT k, big FROM m.copy ORDER BY k") == [
        (0, "N0"), (1, "N1"), (2, "N2"), (7, None), (2999, "n3")]
    db.sql("DELETE FROM m.copy WHERE k IN (SELECT id FROM latest)")
    assert db.query("SELECT count(*) FROM m.copy") == [(4,)]


def test_views_are_seen_by_a_read_only_connection_as_committed(tmp_path):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        _fill(db.sql)
        with cryptdisk.connect(path, read_only=True) as ro:
            assert ro.query("SELECT count(*) FROM mid") == [(1001,)]
            db.sql("CREATE OR REPLACE VIEW mid AS SELECT id FROM t WHERE id < 7")
            db.sql("CREATE VIEW fresh AS SELECT 1 AS one")
            assert ro.query("SELECT count(*) FROM mid") == [(7,)]
            assert ro.query("SELECT * FROM fresh") == [(1,)]


# -- invoker rights: a role reads a view through the policies of the tables it reads --------


def test_a_view_reads_through_the_invokers_policies(made):  # noqa: F811
    path, config = made
    with cryptdisk.connect(path, config) as db:  # made by a connection without a role
        db.sql("CREATE VIEW all_cards AS SELECT pan, region, n FROM cards")
        db.sql("CREATE VIEW card_view AS SELECT * FROM all_cards")  # a view over a view
        db.sql("CREATE VIEW pans (p) AS SELECT pan FROM cards")
        db.sql("CREATE VIEW pans_joined AS SELECT c.pan, d.pan AS pan2 FROM cards c JOIN cards "
               "d ON c.n = d.n")
        db.sql("CREATE VIEW us AS SELECT pan FROM cards WHERE region = 'EU'")
        assert sorted(r[0] for r in db.query("SELECT pan FROM card_view")) != sorted(MASKED)
    with cryptdisk.connect(path, config, role="analyst") as db:
        masked = [MASKED[0], MASKED[2]]
        for query in ["SELECT pan FROM card_view ORDER BY n",
                      "SELECT p FROM pans ORDER BY p DESC",
                      "SELECT pan FROM (SELECT * FROM all_cards) ORDER BY n",
                      "WITH c AS (SELECT * FROM card_view) SELECT pan FROM c ORDER BY n",
                      "SELECT pan FROM card_view WHERE n = 0 UNION ALL "
                      "SELECT pan FROM card_view WHERE n = 2",
                      "SELECT pan2 FROM pans_joined ORDER BY pan2 DESC"]:
            got = [r[0] for r in db.query(query)]
            assert sorted(got) == sorted(masked), query
        assert db.query("SELECT count(*) FROM us") == [(0,)]  # no EU row for the analyst
        assert db.query("SELECT count(*) FROM card_view WHERE pan LIKE '4111%'") == [(0,)]
        for statement in ["EXPLAIN SELECT * FROM card_view",
                          "COPY (SELECT * FROM card_view) TO '/dev/null'"]:
            with pytest.raises(FieldPolicyError):
                db.sql(statement)
        db.sql("CREATE VIEW mine AS SELECT pan FROM cards")  # a role may make a view ...
        assert sorted(r[0] for r in db.query("SELECT pan FROM mine")) == sorted(masked)
        db.sql("CREATE TABLE copied AS SELECT * FROM card_view")  # ... and copy masked rows
    with cryptdisk.connect(path, config, role="auditor") as db:
        assert sorted(r[0] for r in db.query("SELECT pan FROM mine")) == sorted(PANS)
        assert sorted(r[0] for r in db.query("SELECT pan FROM copied")) == sorted(masked)


@pytest.mark.parametrize("sql", [
    "CREATE OR REPLACE VIEW all_cards AS SELECT '4111111111111111' AS pan, 'US' AS region, 0 AS n",
    "DROP VIEW all_cards",
    "DROP VIEW IF EXISTS ALL_CARDS",
    "ALTER VIEW all_cards RENAME TO gone",
    "DROP VIEW card_view",  # reads cards through all_cards
])
def test_a_role_cannot_change_a_view_over_a_table_with_policies(made, sql):  # noqa: F811
    """Whoever reads a view runs its query: a role connection may not replace, drop or
    rename one that reads a table with policies (as it may not drop the table)."""
    path, config = made
    with cryptdisk.connect(path, config) as db:
        db.sql("CREATE VIEW all_cards AS SELECT pan, region, n FROM cards")
        db.sql("CREATE VIEW card_view AS SELECT * FROM all_cards")
        db.sql("CREATE TABLE plain (a INTEGER)")
        db.sql("CREATE VIEW plain_view AS SELECT a FROM plain")
        before = db.query("SELECT name, query FROM system.views ORDER BY name")
    for role in ["analyst", "auditor"]:
        with cryptdisk.connect(path, config, role=role) as db:
            with pytest.raises(FieldPolicyError, match="the view reads cards, which has "
                               "policies") as info:
                db.sql(sql)
            assert info.value.sqlstate == "42501"
            assert info.value.hint
            assert db.query("SELECT name, query FROM system.views ORDER BY name") == before
    with cryptdisk.connect(path, config, role="analyst") as db:  # a view over no policy: runs
        db.sql("CREATE OR REPLACE VIEW plain_view AS SELECT a + 1 AS a FROM plain")
        db.sql("ALTER VIEW plain_view RENAME TO plain_view2")
        db.sql("DROP VIEW plain_view2")
        db.sql("CREATE VIEW new_one AS SELECT pan FROM cards")  # a new view runs, as CREATE TABLE
    with cryptdisk.connect(path, config) as db:  # without a role: runs
        db.sql(sql)
        assert db.query("SELECT name, query FROM system.views ORDER BY name") != before


# -- crash safety ------------------------------------------------------------------------

_REPLACER = """
import sys, cryptdisk
db = cryptdisk.connect(sys.argv[1])
for i in range(1, 100000):
    db.sql(f"CREATE OR REPLACE VIEW v AS SELECT {i} AS n FROM t")
    db.sql(f"CREATE VIEW v{i} AS SELECT n FROM v")
    if i > 1:
        db.sql(f"DROP VIEW v{i - 1}")
    print(f"committed {i}", flush=True)
"""


@pytest.mark.parametrize("trial", range(3))
def test_kill_9_while_views_change_leaves_the_last_commit(tmp_path, trial):
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (a BIGINT)")
        db.sql("INSERT INTO t VALUES (1)")
    with subprocess.Popen([sys.executable, "-c", _REPLACER, str(path)], env=env(),
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          text=True) as child:
        try:
            last = 0
            for _ in range(5 + 7 * trial):
                line = child.stdout.readline()
                assert line.startswith("committed"), line
                last = int(line.split()[1])
            child.send_signal(signal.SIGKILL)
        finally:
            child.kill()
    with cryptdisk.connect(path) as db:
        [(n,)] = db.query("SELECT n FROM v")
        assert n in (last, last + 1)
        names = {name for (name,) in db.query("SELECT name FROM system.views")}
        assert "v" in names and names <= {"v", f"v{last}", f"v{last + 1}"}
        for name in names:
            assert db.query(f"SELECT * FROM {name}") == [(n,)]
        assert not [f for f in os.listdir(path) if f.endswith(".cdtmp")]


def test_a_view_change_replaces_the_views_a_checker_may_hold(views_db):
    """The server checks statements on its sessions' threads, beside the writer: the views
    they read are never changed in place (a new set replaces them at each commit)."""
    db = views_db
    held = db.catalog.views
    names = sorted(held)
    db.sql("CREATE VIEW fresh AS SELECT 1 AS one")
    db.sql("DROP VIEW mid")
    db.sql("ALTER VIEW latest RENAME TO newest")
    db.sql("CREATE OR REPLACE VIEW renamed (k, label) AS SELECT id, name FROM t WHERE id < 2")
    assert sorted(held) == names and held["renamed"].query == "SELECT id, name FROM t"
    assert {"fresh", "newest"} <= set(db.catalog.views) and "mid" not in db.catalog.views
    with pytest.raises(DatabaseError):  # a failed commit leaves the views as they were
        db.sql("CREATE VIEW broken AS SELECT nope FROM t")
    assert "broken" not in db.catalog.views


def test_a_view_named_past_ascii_is_found_as_duckdb_finds_it(db):
    """Views were written out by their names in lower case (str.lower folds É): with a
    view "É", "é" read it too (in a join beside "É", a wrong answer where DuckDB has no
    "é"), or alone was called "'É' is a view: DuckDB reads it only in a query". Now "é"
    names no view: a TableNotFoundError that says how the view is written, as for a
    table; "É" and "ÉTAT" in another case of its ASCII letters read it."""
    db.sql("CREATE TABLE t (k INT)")
    db.sql("INSERT INTO t VALUES (1)")
    db.sql('CREATE VIEW "É" AS SELECT k FROM t')
    db.sql('CREATE VIEW "État" AS SELECT k + 1 AS k FROM "É"')
    assert db.query('SELECT * FROM "É" AS x JOIN "ÉTAT" AS y ON true') == [(1, 2)]
    for q in ['SELECT * FROM "é"', 'SELECT * FROM "É" AS x JOIN "é" AS y ON true',
              'SELECT * FROM "éTAT"', 'WITH c AS (SELECT * FROM "é") SELECT * FROM c']:
        with pytest.raises(TableNotFoundError, match=r"^no table 'é(TAT)?' in .*: DuckDB "
                           r"matches a name's ASCII letters in any case, its other letters "
                           r"as written; the view is '(É|État)'$"):
            db.query(q)


def test_security_invoker_is_kept_with_the_view(tmp_path):
    """``WITH (security_invoker = false)`` and ``ALTER VIEW ... SET``/``RESET`` are kept in
    the catalog (the server checks owner-rights views against their owner; through the
    Python API there are no grants, so a view reads the same either way)."""
    path = tmp_path / "db"
    with cryptdisk.connect(path) as db:
        db.sql("CREATE TABLE t (a BIGINT)")
        db.sql("INSERT INTO t VALUES (1)")
        db.sql("CREATE VIEW o (x) WITH (security_invoker = false) AS SELECT a FROM t")
        db.sql("CREATE VIEW i WITH (security_invoker) AS SELECT a FROM t")
        db.sql("CREATE VIEW p AS SELECT a FROM t")
        db.sql("ALTER VIEW p SET (security_invoker = off)")
        db.sql("ALTER VIEW o RENAME TO o2")
        assert db.query("SELECT * FROM o2") == [(1,)]
    with cryptdisk.connect(path) as db:
        assert db.query("SELECT name, security_invoker, owner FROM system.views ORDER BY "
                        "name") == [("i", True, None), ("o2", False, None), ("p", False, None)]
        db.sql("ALTER VIEW p RESET (security_invoker)")
        assert db.query("SELECT security_invoker FROM system.views WHERE name = 'p'") \
            == [(True,)]

"""An embedded connection that names its role reads tables through the masking and row
access policies ``cryptdisk serve`` keeps for the database (``PATH.policies``).

The policies are made the server's way (its ``PolicyStore`` statements); the embedded
connection reads them: an analyst gets masked card numbers and no EU rows, an auditor
the clear numbers, a connection without a role the stored values.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

import cryptdisk
import cryptdisk.fields  # (the SQL functions the policy bodies call)
from cryptdisk.db import read_policies, role_query
from cryptdisk.errors import CryptdiskError, DatabaseError, FieldPolicyError
from cryptdisk.server import AnalyticalEngine, PolicyStore
from tests.db.test_db_crash import PAUSE_CHILD, env
from tests.fields.conftest import CONFIG

PANS = ["4111111111111111", "5500005555555559", "340000000000009"]
MASKED = ["************1111", "************5559", "***********0009"]
MASK = "CASE WHEN current_role() IN ('auditor') THEN fpe_decrypt(v, 'cards') " \
    "ELSE mask_last4(fpe_decrypt(v, 'cards')) END"
NOTE = "CASE WHEN is_role_in_session('auditor') THEN decrypt(v, 'cards') ELSE mask_full(v) END"


def _policy_statements() -> list[str]:
    return [f"CREATE MASKING POLICY pan_mask AS (v VARCHAR) RETURNS VARCHAR -> {MASK}",
            "ALTER TABLE cards ALTER COLUMN pan SET MASKING POLICY pan_mask",
            "CREATE ROW ACCESS POLICY no_eu AS (r VARCHAR) RETURNS BOOLEAN -> "
            "is_role_in_session('auditor') OR r <> 'EU'",
            "ALTER TABLE cards ADD ROW ACCESS POLICY no_eu ON (region)",
            f"CREATE MASKING POLICY note_mask AS (v VARCHAR) RETURNS VARCHAR -> {NOTE}",
            "ALTER TABLE notes ALTER COLUMN secret SET MASKING POLICY note_mask"]


@pytest.fixture
def served(tmp_path, monkeypatch):
    """The database and its policies as cryptdisk serve leaves them: (engine, store)."""
    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config = tmp_path / "cryptdisk.toml"
    config.write_text(CONFIG)
    engine = AnalyticalEngine(tmp_path / "db", config)
    store = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
    engine.db.sql("CREATE TABLE cards (pan VARCHAR, region VARCHAR, n INTEGER)")
    for i, pan in enumerate(PANS):
        engine.db.sql(f"INSERT INTO cards SELECT fpe_encrypt('{pan}', 'cards'), "
                      f"'{['US', 'EU', 'US'][i]}', {i}")
    engine.db.sql("CREATE TABLE notes (secret VARCHAR)")
    engine.db.sql("INSERT INTO notes SELECT encrypt('call me', 'cards')")
    for sql in _policy_statements():
        store.handle(None, sql)  # a server without users: its caller may manage policies
    yield engine, store, tmp_path / "db", config
    engine.close()


@pytest.fixture
def made(served):
    engine, _store, path, config = served
    engine.close()
    return path, config


def _col(db, sql, parameters=None):
    return [r[0] for r in db.query(sql, parameters)]


def test_a_role_reads_through_the_policies(made):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert _col(db, "SELECT pan FROM cards ORDER BY n") == [MASKED[0], MASKED[2]]
        [note] = _col(db, "SELECT secret FROM notes")  # the ciphertext's length, in stars
        assert set(note) == {"*"} and len(note) > len("call me")
    with cryptdisk.connect(path, config, role="auditor") as db:
        assert _col(db, "SELECT pan FROM cards ORDER BY n") == PANS
        assert _col(db, "SELECT secret FROM notes") == ["call me"]
    with cryptdisk.connect(path, config) as db:  # no role: the stored values
        stored = _col(db, "SELECT pan FROM cards ORDER BY n")
        assert len(stored) == 3 and not set(stored) & set(PANS)


@pytest.mark.parametrize("sql", [
    "SELECT pan FROM (SELECT * FROM cards) AS s ORDER BY pan",
    "WITH cards AS (SELECT * FROM cards) SELECT pan FROM cards ORDER BY pan",
    "SELECT c.pan FROM cards AS c JOIN cards AS d ON c.pan = d.pan ORDER BY 1",
    "SELECT pan FROM cards WHERE pan LIKE '%1111' OR true ORDER BY pan",
    "SELECT pan FROM cards UNION SELECT pan FROM main.cards ORDER BY 1",
    "SELECT max(pan) FROM cards GROUP BY region ORDER BY 1",
])
def test_every_way_to_the_column_is_masked(made, sql):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        got = _col(db, sql)
        assert got and set(got) <= {MASKED[0], MASKED[2]}


def test_the_branch_a_role_does_not_get_is_folded_away(made):
    """The role functions become constants, so DuckDB keeps one branch of the CASE: the
    plan of the analyst's query has no decrypt at all, the auditor's has it."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as analyst, \
            cryptdisk.connect(path, config, role="auditor", read_only=True) as auditor, \
            cryptdisk.connect(path, config) as plain:
        for db, decrypts in ((analyst, False), (auditor, True)):
            text = role_query(db, "SELECT secret FROM notes")
            assert "is_role_in_session" not in text
            assert f"WHEN ({str(decrypts).lower()})" in text, text
            # without the column alias, EXPLAIN names the expression DuckDB kept
            bare = text.replace(' AS "secret" FROM', " FROM", 1).replace(
                'SELECT "secret" FROM', "SELECT * FROM", 1)
            plan = str(plain.sql(f"EXPLAIN {bare}").to_pylist())
            assert ("decrypt" in plan) == decrypts, plan


def test_a_role_readers_describe_show_and_explain_go_as_its_connections(made):
    """A reader of a role connection (read-only or not) describes and summarizes tables
    through the policies, and refuses EXPLAIN of a table with policies as the connection
    does (a plan would show what the role's masking hides)."""
    path, config = made
    for read_only in (True, False):
        with cryptdisk.connect(path, config, role="analyst", read_only=read_only) as db:
            r = db.reader()
            try:
                for q in ("DESCRIBE cards", "SHOW cards", "SHOW TABLES", "SUMMARIZE cards"):
                    assert r.query(q) == db.query(q), q
                summary = {row[0]: row for row in r.query("SUMMARIZE cards")}
                assert not set(summary["pan"]) & set(PANS)  # min and max are masked
                for q in ("EXPLAIN SELECT pan FROM cards",
                          "EXPLAIN ANALYZE SELECT pan FROM cards"):
                    for run in (r.execute, db.execute):
                        with pytest.raises(FieldPolicyError, match="queries only"):
                            run(q)
            finally:
                r.close()


def test_policy_changes_reach_an_open_role_connection(served):
    _engine, store, path, config = served
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        assert _col(db, "SELECT pan FROM cards ORDER BY n") == [MASKED[0], MASKED[2]]
        store.handle(None, "ALTER TABLE cards ALTER COLUMN pan UNSET MASKING POLICY")
        stored = _col(db, "SELECT pan FROM cards ORDER BY n")
        assert len(stored) == 2 and not set(stored) & set(MASKED)  # still no EU row


def test_a_role_connection_runs_queries_only_while_tables_have_policies(made, tmp_path):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        with pytest.raises(FieldPolicyError, match="read through queries only"):
            db.sql(f"COPY cards TO '{tmp_path / 'out.csv'}'")
        assert not (tmp_path / "out.csv").exists()
    with pytest.raises(DatabaseError, match="role"):
        cryptdisk.connect(path, config, role="")


def test_a_role_query_reads_only_the_columns_it_names(made):
    """The policy subquery lists the columns the query names (the row policy's are read
    underneath), so the database decodes no others; * or a whole-row name keeps all."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        for query in ("SELECT n FROM cards WHERE n > 0", "SELECT n AS n FROM cards AS k"):
            text = role_query(db, query)
            assert "fpe_decrypt" not in text and '"pan"' not in text, text
        assert "'EU'" in text  # the row policy still filters
        assert _col(db, "SELECT n FROM cards ORDER BY n") == [0, 2]
        assert _col(db, "SELECT count(*) FROM cards") == [2]
        for whole in ("SELECT * FROM cards", "SELECT cards FROM cards",
                      "SELECT c FROM cards AS c", "SELECT COLUMNS('p.*') FROM cards",
                      "WITH w AS (SELECT 1) SELECT w FROM cards, w"):
            assert "fpe_decrypt" in role_query(db, whole), whole
        rows = db.query("SELECT * FROM cards ORDER BY n")
        assert [r[0] for r in rows] == [MASKED[0], MASKED[2]] and len(rows[0]) == 3


def test_column_aliases_and_tablesample_of_a_table_with_policies_stay(made):
    """``FROM cards AS c(x, y)`` names the table's first columns by their place, as for
    an admin; the rewrite keeps them (and every column, in order), and the table's
    TABLESAMPLE, instead of dropping them (a Binder error on x, or all rows)."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT y, x FROM cards AS c(x, y) ORDER BY n") == \
            [("US", MASKED[0]), ("US", MASKED[2])]
        table = db.sql("SELECT * FROM cards c(x) ORDER BY n")
        assert table.column_names == ["x", "region", "n"]
        assert table.column("x").to_pylist() == [MASKED[0], MASKED[2]]
        assert db.query("SELECT count(*) FROM cards TABLESAMPLE 0%") == [(0,)]
        assert db.query("SELECT count(*) FROM cards TABLESAMPLE 100%") == [(2,)]


def test_count_star_counts_the_rows_a_role_may_read(made):
    """count(*) of a table alone is answered from the catalog's row counts only where no
    row access policy applies: under a role, the table is read through its policy."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT count(*) FROM cards") == [(2,)]  # no EU rows
    with cryptdisk.connect(path, config, role="auditor") as db:
        assert db.query("SELECT count(*) FROM cards") == [(3,)]
    with cryptdisk.connect(path, config) as db:
        assert db.query("SELECT count(*) FROM cards") == [(3,)]
        assert db.last_scans["cards"]["parts_from_index"] == 3  # from the catalog


def test_a_role_inserts_only_the_rows_and_values_it_may_read(made):
    """INSERT ... SELECT on a role connection reads through the policies like its queries:
    copying a masked table to another one (which has no policy) copies the masked values
    and only the rows the role may read, so reading the copy reveals nothing more."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        db.sql("CREATE TABLE copy (pan VARCHAR, region VARCHAR, n INTEGER)")
        db.sql("INSERT INTO copy SELECT * FROM cards")
        db.sql("INSERT INTO copy (pan, n) SELECT pan, n + 10 FROM (SELECT * FROM cards)")
        db.insert_query("copy", "WITH c AS (SELECT pan, region, n + 20 FROM cards) FROM c")
        rows = db.query("SELECT pan, region, n FROM copy ORDER BY n")
        assert rows == [(MASKED[0], "US", 0), (MASKED[2], "US", 2),
                        (MASKED[0], None, 10), (MASKED[2], None, 12),
                        (MASKED[0], "US", 20), (MASKED[2], "US", 22)]
        with pytest.raises(CryptdiskError):  # the stars are no ciphertext to decrypt
            db.query("SELECT fpe_decrypt(pan, 'cards') FROM copy")
        db.sql("CREATE TABLE secrets (secret VARCHAR)")
        db.sql("INSERT INTO secrets SELECT secret FROM notes")
        with pytest.raises(CryptdiskError):  # the masked text is no ciphertext
            db.query("SELECT decrypt(secret, 'cards') FROM secrets")
        db.sql("CREATE TABLE made ORDER BY n AS SELECT * FROM cards")  # (CTAS: the same)
    with cryptdisk.connect(path, config) as db:  # what was stored: the masked values
        assert _col(db, "SELECT pan FROM copy ORDER BY n") == [MASKED[0], MASKED[2]] * 3
        assert _col(db, "SELECT secret FROM secrets") != ["call me"]
        assert db.query("SELECT pan, n FROM made ORDER BY n") == [(MASKED[0], 0),
                                                                  (MASKED[2], 2)]
    with cryptdisk.connect(path, config, role="auditor") as db:  # the auditor's copy: clear
        db.sql("CREATE TABLE audited (pan VARCHAR)")
        db.sql("INSERT INTO audited SELECT pan FROM cards ORDER BY n")
        assert sorted(_col(db, "SELECT pan FROM audited")) == sorted(PANS)


@pytest.mark.parametrize(("sql", "error"), [
    ("CREATE TEMP TABLE copy AS SELECT * FROM cards", FieldPolicyError),  # DuckDB's
    ("CREATE OR REPLACE TABLE copy AS SELECT * FROM cards", FieldPolicyError),
])
def test_a_role_cannot_copy_a_table_around_its_policies(made, sql, error):
    """Statements that would make a table or view of a query outside cryptdisk's INSERT
    are refused on a role connection, and leave nothing behind to read."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        with pytest.raises(error):
            db.sql(sql)
        with pytest.raises(DatabaseError):
            db.query("SELECT pan FROM copy")


OWN_STATEMENTS = ["DROP TABLE {t}", "DROP TABLE IF EXISTS {t}", "TRUNCATE TABLE {t}",
                  "TRUNCATE {t}", "OPTIMIZE TABLE {t} FINAL",
                  "ALTER TABLE {t} MODIFY SETTING storage_policy = 'default'"]


def _rows(path, config):
    with cryptdisk.connect(path, config) as db:
        return db.query("SELECT pan, region, n FROM cards ORDER BY n"), \
            db.query("SELECT secret FROM notes")


@pytest.mark.parametrize("sql", OWN_STATEMENTS)
@pytest.mark.parametrize("table", ["cards", "notes", "CARDS"])
def test_a_role_cannot_drop_or_rewrite_a_table_with_policies(made, sql, table):
    """cryptdisk's own statements on a table with a masking or row access policy are
    refused on a role connection, and the table is left as it was."""
    path, config = made
    before = _rows(path, config)
    with cryptdisk.connect(path, config, role="analyst") as db:
        with pytest.raises(FieldPolicyError, match="has policies") as info:
            db.sql(sql.format(t=table))
        assert info.value.sqlstate == "42501"
        assert _col(db, "SELECT pan FROM cards ORDER BY n") == [MASKED[0], MASKED[2]]
    assert _rows(path, config) == before
    with cryptdisk.connect(path, config, role="auditor") as db:  # any role, also a privileged one
        with pytest.raises(FieldPolicyError):
            db.sql(sql.format(t=table))
    assert _rows(path, config) == before


@pytest.mark.parametrize("sql", ["SYSTEM ROTATE KEYS", "SYSTEM REENCRYPT"])
def test_a_role_cannot_run_system_commands_while_tables_have_policies(made, sql):
    path, config = made
    before = _rows(path, config)
    with cryptdisk.connect(path, config, role="analyst") as db:
        with pytest.raises(FieldPolicyError, match="while tables have policies") as info:
            db.sql(sql)
        assert info.value.sqlstate == "42501"
    assert _rows(path, config) == before
    with cryptdisk.connect(path, config) as db:  # without a role: runs
        db.sql(sql)
    assert _rows(path, config) == before


@pytest.mark.parametrize("sql", OWN_STATEMENTS)
def test_a_role_still_drops_and_rewrites_a_table_without_policies(made, sql):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        db.sql("CREATE TABLE plain (pan VARCHAR, region VARCHAR, n INTEGER)")
        db.sql("INSERT INTO plain VALUES ('x', 'US', 1)")
        db.sql("INSERT INTO plain VALUES ('y', 'EU', 2)")
        db.sql(sql.format(t="plain"))
        if sql.startswith("DROP"):
            assert "plain" not in db.catalog.tables
        elif sql.startswith("TRUNCATE"):
            assert db.query("SELECT count(*) FROM plain") == [(0,)]
        else:
            assert db.query("SELECT pan FROM plain ORDER BY n") == [("x",), ("y",)]


@pytest.mark.parametrize("sql", OWN_STATEMENTS)
def test_a_connection_without_a_role_drops_and_rewrites_a_table_with_policies(made, sql):
    path, config = made
    with cryptdisk.connect(path, config) as db:
        db.sql(sql.format(t="cards"))
        if sql.startswith("DROP"):
            assert "cards" not in db.catalog.tables
        elif sql.startswith("TRUNCATE"):
            assert db.query("SELECT count(*) FROM cards") == [(0,)]
        else:
            assert db.query("SELECT count(*) FROM cards") == [(3,)]


@pytest.mark.parametrize("sql", ["SYSTEM ROTATE KEYS", "SYSTEM REENCRYPT"])
def test_system_commands_run_on_a_role_connection_without_policies(tmp_path, monkeypatch,
                                                                   sql):
    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config = tmp_path / "cryptdisk.toml"
    config.write_text(CONFIG)
    with cryptdisk.connect(tmp_path / "db", config) as db:
        db.sql("CREATE TABLE t (n INTEGER)")
        db.sql("INSERT INTO t VALUES (1), (2)")
    with cryptdisk.connect(tmp_path / "db", config, role="analyst") as db:
        db.sql(sql)
        assert db.query("SELECT n FROM t ORDER BY n") == [(1,), (2,)]


def test_arrow_table_on_a_role_connection_reads_through_the_policies(made):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        got = db.arrow_table("cards", ["pan", "region"])
        assert sorted(got.column("pan").to_pylist()) == sorted([MASKED[0], MASKED[2]])
        assert got.column("region").to_pylist() == ["US", "US"]  # no EU row
        assert db.arrow_table("notes").column("secret").to_pylist() == ["*" * len(
            db.query("SELECT secret FROM notes")[0][0])]
        none = db.arrow_table("cards", [])  # the rows the role may read, no column
        assert (none.num_rows, none.num_columns) == (2, 0)
    with cryptdisk.connect(path, config, role="auditor") as db:
        assert sorted(db.arrow_table("cards", ["pan"]).column(0).to_pylist()) == sorted(PANS)


@pytest.mark.parametrize(("table", "call"), [
    ("cards", lambda db, t, part: db.read_part(t, part)),
    ("notes", lambda db, t, part: db.read_part(t, part, ["secret"])),
    ("cards", lambda db, t, part: db.scan_plan(t, [("pan", ">", "5")])),
    ("cards", lambda db, t, part: db.optimize(t, final=True)),
    ("notes", lambda db, t, part: db.optimize(t, final=True)),
    ("cards", lambda db, t, part: db.move(t, "default")),
])
def test_methods_around_the_sql_are_refused_on_tables_with_policies(made, table, call):
    path, config = made
    before = _rows(path, config)
    with cryptdisk.connect(path, config) as plain:
        part = plain.table(table).parts[0].id
    with cryptdisk.connect(path, config, role="analyst") as db:
        with pytest.raises(FieldPolicyError, match="has policies") as info:
            call(db, table, part)
        assert info.value.sqlstate == "42501"
    assert _rows(path, config) == before


@pytest.mark.parametrize("method", ["rotate_keys", "reencrypt"])
def test_key_methods_are_refused_to_a_role_while_tables_have_policies(made, method):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        with pytest.raises(FieldPolicyError, match="while tables have policies"):
            getattr(db, method)()
    with cryptdisk.connect(path, config) as db:  # without a role: runs
        getattr(db, method)()


def test_methods_still_run_on_tables_without_policies_for_a_role(made):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        db.sql("CREATE TABLE plain (pan VARCHAR)")
        db.sql("INSERT INTO plain VALUES ('x')")
        db.sql("INSERT INTO plain VALUES ('y')")
        part = db.table("plain").parts[0].id
        assert db.read_part("plain", part).num_rows == 1
        assert db.scan_plan("plain")
        assert db.optimize("plain", final=True)
        assert sorted(db.arrow_table("plain").column(0).to_pylist()) == ["x", "y"]


# -- the rewrite cache: reused while nothing it depends on changes ------------------------


def _rewrites(db) -> int:
    from cryptdisk.db._policies import _embedded

    return _embedded(db).rewriter.rewrites


def test_a_repeated_query_is_rewritten_once(made):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        for _ in range(3):
            assert _col(db, "SELECT pan FROM cards ORDER BY n") == [MASKED[0], MASKED[2]]
        assert _rewrites(db) == 1
        assert _col(db, "SELECT pan FROM cards ORDER BY n DESC") == [MASKED[2], MASKED[0]]
        assert _rewrites(db) == 2


@pytest.mark.parametrize(("change", "expected"), [
    (["CREATE OR REPLACE MASKING POLICY pan_mask AS (v VARCHAR) RETURNS VARCHAR -> 'x'"],
     [("x", 0), ("x", 2)]),
    (["ALTER TABLE cards DROP ROW ACCESS POLICY no_eu", "DROP ROW ACCESS POLICY no_eu"],
     [(MASKED[0], 0), (MASKED[1], 1), (MASKED[2], 2)]),
    (["CREATE MASKING POLICY n_mask AS (v INTEGER) RETURNS INTEGER -> v + 10",
      "ALTER TABLE cards ALTER COLUMN n SET MASKING POLICY n_mask"],
     [(MASKED[0], 10), (MASKED[2], 12)]),
], ids=["policy replaced", "row policy dropped", "policy assigned"])
def test_a_policy_change_reaches_the_next_repeated_query(served, change, expected):
    _engine, store, path, config = served
    sql = "SELECT pan, n FROM cards ORDER BY n"
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        for _ in range(2):
            assert db.query(sql) == [(MASKED[0], 0), (MASKED[2], 2)]
        for statement in change:
            store.handle(None, statement)
        assert db.query(sql) == expected


def test_new_columns_of_a_table_reach_the_next_repeated_query(served):
    engine, _store, path, config = served
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        for _ in range(2):
            assert len(db.sql("SELECT * FROM notes").column_names) == 1
        engine.db.sql("ALTER TABLE notes ADD COLUMN extra VARCHAR")  # (policy kept)
        engine.db.sql("INSERT INTO notes SELECT 'abc', 'more'")
        rows = db.query("SELECT * FROM notes")
        assert len(rows) == 2 and ("***", "more") in rows


def test_a_rewrite_is_kept_per_role_membership(tmp_path):
    """One rewriter serves every session of a server: a session whose roles differ (a
    role granted or revoked) gets its own rewrite."""
    import duckdb

    from cryptdisk.db import PolicyRewriter, PolicySession

    data = {"masking": {"m": {"args": [["v", "VARCHAR"]], "returns": "VARCHAR", "body":
                              "CASE WHEN is_role_in_session('auditor') THEN v ELSE 'x' END"}},
            "row_access": {}, "columns": {"t": {"c": "m"}}, "rows": {}}
    rewriter = PolicyRewriter(lambda: data, lambda table: {"c": "VARCHAR"})
    con = duckdb.connect()
    con.sql("CREATE TABLE t (c VARCHAR)")
    con.sql("INSERT INTO t VALUES ('clear')")

    def read(roles):
        text, _ = rewriter.rewrite_query("SELECT c FROM t", PolicySession("bob", roles=roles),
                                         con)
        return con.sql(text).fetchall()

    assert read(frozenset()) == [("x",)]
    assert read(frozenset({"auditor"})) == [("clear",)]  # granted
    assert read(frozenset()) == [("x",)]  # revoked
    assert rewriter.rewrites == 2


@pytest.mark.parametrize("role, how", [(None, "db.sql"), (None, "db.con"),
                                       ("analyst", "db.con")])  # (a role's db.sql: no SET)
def test_a_kept_parse_tree_or_rewrite_follows_the_parser_settings(made, how, role):
    """A statement's kept parse tree (pushed field functions) and policy rewrite depend on
    its text alone: ``SET integer_division`` through ``db.sql`` or on ``db.con`` behind
    the database's back changes what ``/`` means for the next run of the same text, as it
    does for DuckDB's own statements."""
    path, config = made
    # (without a role a field function over a stored column is pushed into the scan, and
    # DuckDB runs the statement made from the kept tree; with one, the policies' rewrite)
    sql = ("SELECT (n + 1) / 2 AS h, " + ("pan" if role else "mask_last4(fpe_decrypt(pan, "
                                           "'cards'))") + " AS p FROM cards ORDER BY n")
    with cryptdisk.connect(path, config, role=role) as db:
        def division(integer):
            statement = f"SET integer_division = {str(integer).lower()}"
            db.sql(statement) if how == "db.sql" else db.con.execute(statement)
            return _col(db, sql)

        halves = [0.5, 1.5] if role else [0.5, 1.0, 1.5]
        assert division(True) == [int(h) for h in halves]
        assert division(False) == halves
        assert division(True) == [int(h) for h in halves]
        assert [r[1] for r in db.query(sql)] == ([MASKED[0], MASKED[2]] if role else MASKED)


def test_a_prepared_query_reads_through_the_policies_as_they_are_at_each_execute(served):
    """PREPARE/EXECUTE on a role connection: each EXECUTE reads the tables through the
    role's policies of that moment, on the database and on a reader."""
    _engine, store, path, config = served
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        reader = db.reader()
        for run in (db, reader):
            run.sql("PREPARE p AS SELECT pan FROM cards WHERE n >= $1 ORDER BY n")
        for run in (db, reader):
            assert _col(run, "EXECUTE p(0)") == [MASKED[0], MASKED[2]]  # no EU row
        store.handle(None, "CREATE OR REPLACE MASKING POLICY pan_mask AS (v VARCHAR) "
                     "RETURNS VARCHAR -> 'x'")
        for run in (db, reader):
            assert _col(run, "EXECUTE p(1)") == ["x"]
        reader.close()


def test_a_column_named_in_mixed_case_gets_its_policy_in_any_spelling(served):
    """Column names keep their case (Pan); a policy set on "Pan" (quoted, as psql and ORMs
    write it) or pan applies to it."""
    engine, store, path, config = served
    engine.db.sql("CREATE TABLE people (Pan VARCHAR, Region VARCHAR)")
    engine.db.sql(f"INSERT INTO people SELECT fpe_encrypt('{PANS[0]}', 'cards'), 'EU'")
    store.handle(None, 'ALTER TABLE people ALTER COLUMN "Pan" SET MASKING POLICY pan_mask')
    store.handle(None, 'ALTER TABLE people ADD ROW ACCESS POLICY no_eu ON ("Region")')
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        assert db.query("SELECT count(*) FROM people") == [(0,)]  # no EU row
    store.handle(None, "ALTER TABLE people DROP ROW ACCESS POLICY no_eu")
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        assert _col(db, "SELECT pan FROM people") == [MASKED[0]]
    store.handle(None, "ALTER TABLE people ALTER COLUMN PAN UNSET MASKING POLICY")
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        assert _col(db, "SELECT Pan FROM people") != [MASKED[0]]


def test_a_table_named_in_mixed_case_gets_its_policies_in_any_spelling(served):
    """A table keeps the name it is created with ("Wallet"); policies set on it in any
    spelling, quoted or not, apply to every spelling of it in a query."""
    engine, store, path, config = served
    engine.db.sql('CREATE TABLE "Wallet" (pan VARCHAR, region VARCHAR) ORDER BY region')
    engine.db.sql(f"INSERT INTO wallet SELECT fpe_encrypt('{PANS[0]}', 'cards'), 'US'")
    engine.db.sql(f"INSERT INTO WALLET SELECT fpe_encrypt('{PANS[1]}', 'cards'), 'EU'")
    store.handle(None, 'ALTER TABLE "Wallet" ALTER COLUMN pan SET MASKING POLICY pan_mask')
    store.handle(None, "ALTER TABLE WALLET ADD ROW ACCESS POLICY no_eu ON (region)")
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        for name in ("wallet", "Wallet", '"WALLET"', '"Wallet"'):
            assert _col(db, f"SELECT pan FROM {name}") == [MASKED[0]], name
        assert db.query('SELECT key_min FROM system.parts WHERE "table" = \'Wallet\'') == [
            (None,), (None,)]  # (the key of a table with policies is not shown)
    store.handle(None, 'ALTER TABLE "wallet" DROP ROW ACCESS POLICY no_eu')
    store.handle(None, "ALTER TABLE Wallet ALTER COLUMN pan UNSET MASKING POLICY")
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        assert sorted(_col(db, "SELECT pan FROM wallet")) != sorted(MASKED[:2])
        assert db.query("SELECT count(*) FROM Wallet") == [(2,)]


def test_a_masked_column_keeps_its_declared_name(served):
    """A column read through its masking policy is named as the table declares it (Pan),
    as every other column of the result is, not in lower case."""
    engine, store, path, config = served
    engine.db.sql("CREATE TABLE people (Pan VARCHAR, Region VARCHAR)")
    engine.db.sql(f"INSERT INTO people SELECT fpe_encrypt('{PANS[0]}', 'cards'), 'EU'")
    store.handle(None, "ALTER TABLE people ALTER COLUMN pan SET MASKING POLICY pan_mask")
    with cryptdisk.connect(path, config, role="analyst", read_only=True) as db:
        got = db.sql("SELECT * FROM people")
        assert got.column_names == ["Pan", "Region"]
        assert got.to_pylist() == [{"Pan": MASKED[0], "Region": "EU"}]
        assert db.sql("SELECT Pan FROM people").column_names == ["Pan"]


def test_renames_carry_the_policies(made):
    """ALTER TABLE cards RENAME TO ... would leave the policies on a name no table has (the
    renamed table unprotected): they follow the table, and a masked column's rename
    carries its masking policy."""
    path, config = made
    with cryptdisk.connect(path, config) as db:
        db.sql("ALTER TABLE cards RENAME TO Payments")
        db.sql("ALTER TABLE payments RENAME COLUMN pan TO card")
        db.sql("ALTER TABLE payments ADD COLUMN note VARCHAR")
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT card, region, n, note FROM payments ORDER BY n") == [
            (MASKED[0], "US", 0, None), (MASKED[2], "US", 2, None)]
        with pytest.raises(DatabaseError):
            db.query("SELECT * FROM cards")
    with cryptdisk.connect(path, config) as db:
        data = read_policies(f"{path}.policies", db.keyring)
    assert data["columns"] == {"payments": {"card": "pan_mask"},
                               "notes": {"secret": "note_mask"}}
    assert data["rows"] == {"payments": ["no_eu", ["region"]]}


def test_a_rename_killed_before_its_commit_leaves_the_table_protected(made):
    """kill -9 between the policy file written with both names and the catalog's commit:
    the table keeps its name and its policies (the new name's copy protects nothing)."""
    path, config = made
    child = subprocess.Popen([sys.executable, PAUSE_CHILD, str(path), "catalog",
                              "ALTER TABLE cards RENAME TO payments", str(config)],
                             stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert child.stdout.readline().strip() == "open"
        assert child.stdout.readline().startswith("paused")
    finally:
        child.send_signal(signal.SIGKILL)
        child.stdout.close()
        child.wait()
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert sorted(db.catalog.tables) == ["cards", "notes"]
        assert db.query("SELECT pan FROM cards ORDER BY n") == [(MASKED[0],), (MASKED[2],)]
    with cryptdisk.connect(path, config) as db:  # the rename again: whole
        db.sql("ALTER TABLE cards RENAME TO payments")
        assert read_policies(f"{path}.policies", db.keyring)["rows"] == {
            "payments": ["no_eu", ["region"]]}


@pytest.mark.parametrize(("sql", "match"), [
    ("ALTER TABLE cards DROP COLUMN pan", "a masking policy is set on the column"),
    ("ALTER TABLE cards DROP COLUMN region", "row access policy is set on the column"),
    ("ALTER TABLE cards RENAME COLUMN region TO r", "row access policy names the column"),
    ("ALTER TABLE cards ALTER COLUMN pan TYPE BLOB", "a masking policy is set on the column"),
    ("ALTER TABLE cards ALTER COLUMN region TYPE BLOB", "a row access policy names"),
])
def test_a_protected_column_is_not_dropped_or_left_unprotected(made, sql, match):
    path, config = made
    with cryptdisk.connect(path, config) as db:
        with pytest.raises(DatabaseError, match=match) as e:
            db.sql(sql)
        assert "POLICY" in e.value.hint
        assert [c for c, _t in db.catalog.tables["cards"].columns] == ["pan", "region", "n"]
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT pan FROM cards ORDER BY n") == [(MASKED[0],), (MASKED[2],)]
        with pytest.raises(FieldPolicyError):  # a role may not change a protected table
            db.sql("ALTER TABLE cards ADD COLUMN x INT")


def test_a_rename_through_the_server_keeps_the_stores_policies(served):
    """The server's PolicyStore kept the policies in memory: after the database carried
    them to the new name in the file, the store's next change wrote its stale copy back
    (the renamed table unprotected). The store reads the file again after such a change."""
    engine, store, path, config = served
    engine.policies = store  # (as cryptdisk serve sets it)
    session = engine.open_session()
    session.run("ALTER TABLE cards RENAME TO payments", [])
    session.run("ALTER TABLE payments RENAME COLUMN pan TO card", [])
    assert store.data["rows"] == {"payments": ["no_eu", ["region"]]}
    assert store.data["columns"]["payments"] == {"card": "pan_mask"}
    store.handle(None, "ALTER TABLE notes ALTER COLUMN secret UNSET MASKING POLICY")
    engine.close()
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT card FROM payments ORDER BY n") == [(MASKED[0],),
                                                                  (MASKED[2],)]
        assert read_policies(f"{path}.policies", db.keyring)["columns"] == {
            "payments": {"card": "pan_mask"}}


RECREATE = ["CREATE TABLE cards (pan VARCHAR, region VARCHAR, n INTEGER)",
            "CREATE TABLE cards AS SELECT 'clear' AS pan, 'EU' AS region, 7 AS n",
            "CREATE TABLE other (pan VARCHAR, region VARCHAR, n INTEGER);"
            "ALTER TABLE other RENAME TO Cards"]


def _recreate(db, sql):
    for statement in sql.split(";"):
        db.sql(statement)
    if "AS SELECT" not in sql:
        db.sql("INSERT INTO cards VALUES ('clear', 'EU', 7)")


@pytest.mark.parametrize("sql", RECREATE)
def test_a_dropped_tables_policies_do_not_pass_to_a_new_table_of_its_name(made, sql):
    """DROP TABLE left the table's policy attachments under its name: a table created
    later with the name was read through them (masked, EU rows hidden). They go with the
    table; the policies themselves stay."""
    path, config = made
    with cryptdisk.connect(path, config) as db:
        db.sql("DROP TABLE cards")
        db.sql("DROP TABLE IF EXISTS cards")  # missing: nothing to do, no error
        data = read_policies(f"{path}.policies", db.keyring)
        assert data["columns"] == {"notes": {"secret": "note_mask"}}
        assert data["rows"] == {}
        assert sorted(data["masking"]) == ["note_mask", "pan_mask"]  # policies stay
        assert sorted(data["row_access"]) == ["no_eu"]
        _recreate(db, sql)
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT pan, region, n FROM cards") == [("clear", "EU", 7)]
        assert db.query("SELECT secret FROM notes") != [("call me",)]  # still masked


def test_drop_table_if_exists_of_a_missing_table_keeps_the_policy_file(made):
    path, config = made
    before = (path.parent / "db.policies").read_bytes()
    with cryptdisk.connect(path, config) as db:
        db.sql("DROP TABLE IF EXISTS nothing")
        with pytest.raises(DatabaseError):
            db.sql("DROP TABLE nothing")
    assert (path.parent / "db.policies").read_bytes() == before


@pytest.mark.parametrize("sql", RECREATE)
def test_a_drop_killed_before_its_policies_go_leaves_none_to_a_new_table(made, sql):
    """kill -9 after DROP TABLE's catalog commit, as the policy file is about to be
    written without the table: the attachments are left on a name no table has, and the
    next table given the name (CREATE, CREATE ... AS, RENAME TO) removes them before its
    own commit."""
    path, config = made
    child = subprocess.Popen([sys.executable, PAUSE_CHILD, str(path), "db.policies",
                              "DROP TABLE cards", str(config)],
                             stdout=subprocess.PIPE, text=True, env=env())
    try:
        assert child.stdout.readline().strip() == "open"
        assert child.stdout.readline().startswith("paused")
    finally:
        child.send_signal(signal.SIGKILL)
        child.stdout.close()
        child.wait()
    with cryptdisk.connect(path, config) as db:
        assert sorted(db.catalog.tables) == ["notes"]  # dropped, the attachments left
        assert "cards" in read_policies(f"{path}.policies", db.keyring)["rows"]
        _recreate(db, sql)
        data = read_policies(f"{path}.policies", db.keyring)
        assert data["columns"] == {"notes": {"secret": "note_mask"}} and data["rows"] == {}
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT pan, region, n FROM cards") == [("clear", "EU", 7)]


def test_the_server_shows_no_policy_references_of_a_dropped_table(served):
    engine, store, path, config = served
    engine.policies = store  # (as cryptdisk serve sets it)
    session = engine.open_session()
    session.run("DROP TABLE cards", [])
    refs = store.handle(None, "SELECT * FROM system.policy_references").rows
    assert refs == [("notes", "secret", "note_mask", "masking")]
    session.run("CREATE TABLE cards (pan VARCHAR, region VARCHAR, n INTEGER)", [])
    session.run("INSERT INTO cards VALUES ('clear', 'EU', 7)", [])
    assert store.handle(None, "SELECT * FROM system.policy_references").rows == refs
    names = [r[0] for r in store.handle(None, "SELECT * FROM system.policies").rows]
    assert sorted(names) == ["no_eu", "note_mask", "pan_mask"]
    session.close()
    engine.close()
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert db.query("SELECT pan, region FROM cards") == [("clear", "EU")]


def test_the_server_removes_attachments_a_killed_drop_left(served):
    """What a drop killed between the catalog's commit and the policy file's left (here
    written back by hand) is removed when the server starts (forget_dropped), so
    system.policy_references never lists a table that is gone."""
    engine, store, path, _config = served
    data = read_policies(f"{path}.policies", engine.keyring)
    engine.db.sql("DROP TABLE cards")
    with cryptdisk.open(f"{path}.policies", "wb", keyring=engine.keyring) as f:
        f.write(json.dumps({**data, "version": 1}).encode())
    assert "cards" in read_policies(f"{path}.policies", engine.keyring)["rows"]
    assert store.forget_dropped() == ["cards"]
    after = read_policies(f"{path}.policies", engine.keyring)
    assert after["rows"] == {} and after["columns"] == {"notes": {"secret": "note_mask"}}
    assert store.forget_dropped() == []


def test_a_role_query_with_parameters_reads_through_the_policies(made):
    """Parameters bind before the policy rewrite: a role's row access policy and masks
    apply to a parameterised query as to one written out, and a hostile value stays a
    value."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        assert _col(db, "SELECT pan FROM cards WHERE region = ? ORDER BY n", ["US"]) == \
            [MASKED[0], MASKED[2]]
        assert _col(db, "SELECT pan FROM cards WHERE region = $r", {"r": "EU"}) == []
        assert _col(db, "SELECT pan FROM cards WHERE region = ?", ["EU' OR 'x' = 'x"]) == []
        db.execute("CREATE TABLE copy AS SELECT pan FROM cards WHERE n >= ?", [0])
        assert sorted(_col(db, "SELECT pan FROM copy")) == sorted([MASKED[0], MASKED[2]])


def test_a_roles_errors_quote_no_rewritten_text(made):
    """DuckDB quotes the text it ran (``LINE 1: ...``) and, for a column it cannot find,
    the columns it could have meant: for a role's query that is the rewrite (the row
    policy's expression, the mask's internal names, the columns the rewrite kept). A
    role's error keeps DuckDB's message without them; a connection without a role keeps
    DuckDB's quote."""
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        for sql in ("SELECT nosuch FROM cards", "SELECT n::TINYINT * 200::TINYINT FROM cards",
                    "SELECT CAST(region AS INTEGER) FROM cards", "SELECT pan + 1 FROM cards",
                    "INSERT INTO notes SELECT nosuch FROM cards",
                    "INSERT INTO notes SELECT region::INTEGER FROM cards"):
            with pytest.raises(DatabaseError) as info:
                db.query(sql)
            text = str(info.value)
            for leak in ("LINE", "__cd_", "EU", "false", "Candidate bindings", PANS[0]):
                assert leak not in text, (sql, text)
        with pytest.raises(DatabaseError, match=r"column \"nosuch\" not found"):
            db.query("SELECT nosuch FROM cards")
        with pytest.raises(DatabaseError, match='Table "cards" does not have a column named'):
            db.query("SELECT cards.nosuch FROM cards")  # (not DuckDB's "Values list")
    with cryptdisk.connect(path, config) as db:
        with pytest.raises(DatabaseError, match=r"(?s)Candidate bindings.*LINE 1"):
            db.query("SELECT nosuch FROM cards")


def test_policies_on_columns_named_with_capitals_past_ascii(tmp_path, monkeypatch):
    """Policies keep a column by its name in lower case. A row access policy on "ÉTAT"
    (kept as "état") filtered on "état", which DuckDB does not find ("É" is not "é"): every
    query of the table failed. Now it filters on the column the name is ("ÉTAT"). Beside
    columns "Ä" and "ä" (two columns, as DuckDB has them) a masking policy kept as "ä"
    masks both, stays when one of them is renamed, and a row access policy on one of them
    refuses the query (which of the two it names is not known): never the other's values."""
    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config = tmp_path / "cryptdisk.toml"
    config.write_text(CONFIG)
    engine = AnalyticalEngine(tmp_path / "db", config)
    store = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
    engine.db.sql('CREATE TABLE g ("ÉTAT" VARCHAR, "Ä" VARCHAR, "ä" VARCHAR, n INTEGER)')
    engine.db.sql("INSERT INTO g VALUES ('EU', 'A1', 'a1', 1), ('US', 'A2', 'a2', 2)")
    engine.db.sql('CREATE TABLE h ("Ä" VARCHAR, "ä" VARCHAR)')
    engine.db.sql("INSERT INTO h VALUES ('EU', 'US')")
    for sql in ["CREATE ROW ACCESS POLICY no_eu AS (r VARCHAR) RETURNS BOOLEAN -> r <> 'EU'",
                'ALTER TABLE g ADD ROW ACCESS POLICY no_eu ON ("ÉTAT")',
                'ALTER TABLE h ADD ROW ACCESS POLICY no_eu ON ("Ä")',
                "CREATE MASKING POLICY hide AS (v VARCHAR) RETURNS VARCHAR -> '***'",
                'ALTER TABLE g ALTER COLUMN "ä" SET MASKING POLICY hide']:
        store.handle(None, sql)
    engine.close()
    with cryptdisk.connect(tmp_path / "db", config, role="analyst") as db:
        assert db.query('SELECT n, "ÉTAT", "Ä", "ä" FROM g') == [(2, "US", "***", "***")]
        with pytest.raises(FieldPolicyError, match='row access policy of h names column ä, '
                           r'which names 2 columns \(Ä, ä\)'):
            db.query("SELECT * FROM h")
    with cryptdisk.connect(tmp_path / "db", config) as db:
        db.sql('ALTER TABLE g RENAME COLUMN "Ä" TO "Ö"')
        assert db.query('SELECT "Ö", "ä" FROM g ORDER BY n') == [("A1", "a1"), ("A2", "a2")]
    with cryptdisk.connect(tmp_path / "db", config, role="analyst") as db:
        assert db.query('SELECT n, "Ö", "ä" FROM g') == [(2, "***", "***")]

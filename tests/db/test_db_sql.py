"""The statement recogniser: what cryptdisk handles itself, what goes to DuckDB."""

import itertools

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _columns, _partread, _sql
from cryptdisk.errors import DatabaseError, NotSupportedError, TableNotFoundError


def test_create_table_full():
    st = _sql.parse("create table IF NOT EXISTS T (c_int BIGINT, \"Odd Name\" DECIMAL(10, 2)) "
                    "ENGINE = MergeTree() ORDER BY (c_int, \"Odd Name\") "
                    "SETTINGS storage_policy = 'plain';")
    assert st == _sql.CreateTable("T", [("c_int", "BIGINT"), ("Odd Name", "DECIMAL(10, 2)")],
                                  ["c_int", "Odd Name"], {"storage_policy": "plain"}, True)


def test_create_table_minimal_and_order_by_single():
    assert _sql.parse("CREATE TABLE t (a INT)") == _sql.CreateTable("t", [("a", "INT")])
    assert _sql.parse("CREATE TABLE t (a INT) ORDER BY a").order_by == ["a"]


@pytest.mark.parametrize("bad", [
    "CREATE TABLE t AS DELETE FROM u",
    "CREATE TABLE t ORDER BY a",
    "CREATE TABLE t (a INT) PARTITION BY a",
    "CREATE TABLE t ()",
    "CREATE TABLE t (a INT) SETTINGS storage_policy",
    "CREATE TABLE t (a)",
])
def test_create_table_errors(bad):
    with pytest.raises(DatabaseError):
        _sql.parse(bad)


def test_insert_forms():
    assert _sql.parse("INSERT INTO t SELECT 1") == _sql.Insert("t", "SELECT 1")
    assert _sql.parse("insert into t values (1, 'a')") == _sql.Insert("t", "values (1, 'a')")
    assert _sql.parse("INSERT INTO t (a, B) VALUES (1, 2)") == _sql.Insert(
        "t", "VALUES (1, 2)", ["a", "B"])
    assert _sql.parse("INSERT INTO t (SELECT 1)").query == "(SELECT 1)"
    assert _sql.parse("INSERT INTO t WITH x AS (SELECT 1) SELECT * FROM x").columns is None
    assert _sql.parse("INSERT INTO t DEFAULT VALUES") == _sql.Insert("t", "DEFAULT VALUES")
    with pytest.raises(DatabaseError):
        _sql.parse("INSERT INTO t (a) DEFAULT VALUES")


def test_other_statements():
    assert _sql.parse("DROP TABLE IF EXISTS t") == _sql.DropTable("t", True)
    assert _sql.parse("drop table t") == _sql.DropTable("t", False)
    assert _sql.parse("TRUNCATE t") == _sql.Truncate("t")
    assert _sql.parse("TRUNCATE TABLE t") == _sql.Truncate("t")
    assert _sql.parse("ALTER TABLE t MODIFY SETTING storage_policy = 'x'") == \
        _sql.AlterSetting("t", {"storage_policy": "x"})
    assert _sql.parse("OPTIMIZE TABLE t FINAL") == _sql.Optimize("t", True)
    assert _sql.parse("OPTIMIZE TABLE t") == _sql.Optimize("t", False)
    assert _sql.parse("SYSTEM ROTATE KEYS") == _sql.SystemCommand("rotate")
    assert _sql.parse("system reencrypt") == _sql.SystemCommand("reencrypt")


def test_passthrough_and_refusals():
    assert _sql.parse("SELECT * FROM t") == _sql.Passthrough("SELECT * FROM t")
    assert _sql.parse("SET threads = 1") == _sql.Passthrough("SET threads = 1")
    assert _sql.parse("DELETE FROM t") == _sql.Delete("t")
    assert _sql.parse('delete from "T" AS x where x.a = 1 AND b IN (SELECT 1)') == \
        _sql.Delete("T", "x.a = 1 AND b IN (SELECT 1)", "x")
    assert _sql.parse("UPDATE t SET a = 1, \"B\" = f(x, [1, 2]) WHERE (a = 'where, set')") == \
        _sql.Update("t", [("a", "1"), ("B", "f(x, [1, 2])")], "(a = 'where, set')")
    for bad in ("UPDATE t a = 1", "DELETE t", "SET temp_directory = '/tmp'",
                "PRAGMA temp_directory='/x'", "SET max_temp_directory_size = '1GB'"):
        with pytest.raises(DatabaseError):
            _sql.parse(bad)


def test_split_statements_respects_quotes_and_comments():
    sql = "SELECT ';' AS a; -- a comment; still comment\nSELECT \"x;y\" FROM t;/* ; */ SELECT 3;;"
    assert _sql.split_statements(sql) == ["SELECT ';' AS a", 'SELECT "x;y" FROM t', "SELECT 3"]
    assert _sql.split_statements("SELECT 'it''s; fine'") == ["SELECT 'it''s; fine'"]


def _duckdb_pieces(text: str) -> list[str]:
    """``text`` cut where DuckDB's tokenizer reads a ``;`` (no comment dropped)."""
    raw = text.encode()
    cuts = [at for at, kind in duckdb.tokenize(text)
            if kind == duckdb.token_type.operator and raw[at:at + 1] == b";"]
    bounds = [-1, *cuts, len(raw)]
    return [raw[a + 1:b].decode() for a, b in itertools.pairwise(bounds)]


def _without_comments(text: str) -> str:
    """``text`` with the comments DuckDB's tokenizer reads blanked to a space."""
    raw = text.encode()
    out, pos = [], 0
    for at, kind in duckdb.tokenize(text):
        if at < pos or kind != duckdb.token_type.comment:
            continue
        out.append(raw[pos:at])
        if raw.startswith(b"--", at):
            end = raw.find(b"\n", at)
            pos = len(raw) if end < 0 else end
        else:
            out.append(b" ")
            pos = _sql._comment_end(raw, at)
    out.append(raw[pos:])
    return b"".join(out).decode()


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abeE1 -/*;'\"`$\\\n\t")), max_size=40))
def test_split_statements_cuts_random_text_where_duckdb_reads_its_semicolons(text):
    """Text of quotes, dollars, E, digits, ``;`` and comment marks: the statements are the
    pieces between the ``;`` DuckDB's tokenizer reads (``1$$;$$``: a number and a string;
    ``1E'\\';'``: a number and an E-string), and as many as ``extract_statements`` finds
    where DuckDB can parse the text; text with none of those is one statement as it is."""
    got = _sql.split_statements(text)
    want = [_without_comments(p).strip() for p in _duckdb_pieces(text)]
    assert got == [p for p in want if p]
    try:
        parsed = duckdb.extract_statements(text)
    except duckdb.Error:
        parsed = None
    if parsed is not None:
        assert len(got) == len(parsed)
    if not any(c in text for c in ";'\"`") and "--" not in text and "/*" not in text \
            and "$" not in text:
        assert got == ([text.strip()] if text.strip() else [])


@pytest.mark.parametrize(("text", "pieces"), [
    ("SELECT 1$$;$$", ["SELECT 1$$;$$"]),                       # a number, a $$ string
    ("SELECT 1$a$;$a$; SELECT 2", ["SELECT 1$a$;$a$", "SELECT 2"]),
    ("SELECT $1$$;$$", ["SELECT $1$$;$$"]),                    # a parameter, a string
    ("SELECT 1E'\\';'; SELECT 2", ["SELECT 1E'\\';'", "SELECT 2"]),  # a number, E'...'
    ("SELECT 1.5e'\\';'", ["SELECT 1.5e'\\';'"]),
    ("SELECT 1_e'\\';'", ["SELECT 1_e'\\'", "'"]),           # a name _e, then '...'
    ("SELECT 12e$$;$$", ["SELECT 12e$$", "$$"]),                # a name e$$
    ("SELECT a$$;$$", ["SELECT a$$", "$$"]),
])
def test_split_statements_reads_numbers_before_quotes_as_duckdb(text, pieces):
    assert _sql.split_statements(text) == pieces
    assert [p.strip() for p in _duckdb_pieces(text) if p.strip()] == pieces


def test_split_statements_keeps_dollar_quoted_strings_whole():
    assert _sql.split_statements("SELECT $$a;b$$") == ["SELECT $$a;b$$"]
    assert _sql.split_statements("SELECT $tag$a;$$;b$tag$ AS x; SELECT 2") == [
        "SELECT $tag$a;$$;b$tag$ AS x", "SELECT 2"]
    # a parameter or a name's $ opens nothing
    assert _sql.split_statements("SELECT $1; SELECT a$$b") == ["SELECT $1", "SELECT a$$b"]
    assert _sql.split_statements("SELECT E'it\\'s; fine'; SELECT 2") == [
        "SELECT E'it\\'s; fine'", "SELECT 2"]
    assert _sql.split_statements("SELECT 1 /* a /* b; */ c; */ + 1; SELECT a/**/b") == [
        "SELECT 1   + 1", "SELECT a b"]


_BODY = st.text(alphabet=st.sampled_from(list("ab ;'\"$`-/*\n\\")), max_size=12)


@st.composite
def _split_literal(draw):
    """An expression whose text holds ``;``, quotes, ``$`` or comment marks."""
    kind = draw(st.sampled_from(["str", "estr", "dollar", "num"]))
    body = draw(_BODY)
    if kind == "str":
        return "'" + body.replace("'", "''") + "'"
    if kind == "estr":
        return "E'" + body.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if kind == "dollar":
        tag = draw(st.sampled_from(["", "t", "x_1", "é"]))
        delim = f"${tag}$"
        body = body.replace("$", "")  # the body cannot close its own quote
        return delim + body + delim
    return str(draw(st.integers(0, 99)))


@st.composite
def _split_gap(draw):
    """What may stand between two tokens: space, comments (nested ones too)."""
    body = draw(_BODY).replace("*", "").replace("/", "")
    return draw(st.sampled_from([" ", "\n", f" -- {body.replace(chr(10), ' ')}\n",
                                 f"/*{body}*/", f"/* /*{body}*/ {body} */"]))


@st.composite
def _split_statement(draw):
    items = draw(st.lists(st.tuples(_split_literal(), _BODY.filter(lambda b: b != "")),
                          min_size=1, max_size=3))
    parts = []
    for k, (expr, alias) in enumerate(items):
        alias = '"' + alias.replace('"', '""') + f'{k}"'  # distinct names
        parts.append(expr + draw(_split_gap()) + "AS" + draw(_split_gap()) + alias)
    return "SELECT" + draw(_split_gap()) + ("," + draw(_split_gap())).join(parts)


@settings(max_examples=200, deadline=None)
@given(st.lists(_split_statement(), min_size=1, max_size=3),
       st.lists(st.sampled_from([";", "; ", ";\n", ";;", "; -- c\n"]), min_size=3, max_size=3),
       st.booleans())
def test_split_statements_splits_as_duckdb_does(statements, seps, final):
    """Random statements with strings, E-strings, dollar quotes, quoted names, comments and
    ``;`` in them: the pieces run in DuckDB give what DuckDB's own split gives."""
    text = "".join(s + seps[k] for k, s in enumerate(statements[:-1])) + statements[-1]
    text += seps[-1] if final else ""
    con = duckdb.connect()
    want = [con.execute(s.query).fetchall() for s in duckdb.extract_statements(text)]
    pieces = _sql.split_statements(text)
    assert [con.execute(p).fetchall() for p in pieces] == want
    assert len(pieces) == len(statements)


def test_insert_values_casts_each_value_to_its_column_as_duckdb_does(db):
    """A VALUES list's values are cast one by one to the table's types, as DuckDB's own
    INSERT does: read as a query first, VALUES gave a column one type for all its rows,
    so (1), (1.5) into a VARCHAR column stored '1.0', (0.10), (2) stored '2.00', and
    'NaN' beside numbers into a DOUBLE column failed."""
    ref = duckdb.connect()
    statements = ["INSERT INTO t VALUES (1, 1, 1), (1.5, 2.5, 'NaN')",
                  "INSERT INTO t (s) VALUES (0.10), (2)",
                  "INSERT INTO t VALUES (true, '3', -0.0), ('x', 4, 2)"]
    for run in (db.sql, ref.execute):
        run("CREATE TABLE t (s VARCHAR, i INTEGER, f DOUBLE)")
        for sql in statements:
            run(sql)
    want = ref.execute("FROM t").fetchall()
    assert repr(db.query("FROM t")) == repr(want)  # NaN and -0.0 as DuckDB has them
    with pytest.raises(DatabaseError, match='table "t" has 3 columns but 2 values'):
        db.sql("INSERT INTO t VALUES (1, 2)")
    with pytest.raises(DatabaseError, match="INT32"):
        db.sql("INSERT INTO t (i) VALUES ('x')")
    assert len(db.query("FROM t")) == len(want)
    assert "__cd_insert_values" not in str(db.con.sql("FROM duckdb_tables()").fetchall())


@pytest.mark.parametrize(("sql", "message", "hint"), [
    ("ALTER TABLE main.t RENAME TO u", "RENAME TO is not supported.*ALTER TABLE t MODIFY "
     "SETTING", "ALTER TABLE t RENAME TO u (the table named alone"),
    ("alter table if exists \"t\" ADD COLUMN c INT", "ADD COLUMN is not supported.*ALTER "
     "TABLE t RENAME TO, ADD, DROP", "ALTER TABLE t ADD COLUMN c INT"),
    ("ALTER TABLE main.t DROP COLUMN s", "DROP COLUMN is not supported.*ALTER TABLE t "
     "MODIFY", "ALTER TABLE t DROP COLUMN s"),
    ("ALTER TABLE t ALTER COLUMN s SET DATA TYPE INTEGER USING length(s)",
     "ALTER COLUMN s TYPE is not", "CAST(s AS new_type)"),
    ("ALTER TABLE main.t RENAME s TO z", "RENAME COLUMN is not supported", "RENAME s TO z"),
    ("ALTER TABLE t ADD PRIMARY KEY (k)", "ADD CONSTRAINT is not supported",
     "NOT NULL and DEFAULT"),
    ("ALTER VIEW t RENAME TO u", "t is a table, not a view", "ALTER TABLE t RENAME TO u"),
    ("CREATE OR REPLACE TABLE n AS SELECT 1 AS x", "in memory", "CREATE TABLE n"),
    ("CREATE OR REPLACE TABLE t (k BIGINT)", "in memory", "DROP TABLE IF EXISTS t"),
    ("CREATE TEMP TABLE t AS SELECT 1 AS x", "would hide the table t", "another name"),
    ("CREATE OR REPLACE TEMP VIEW v AS SELECT * FROM t JOIN t u USING (k)",
     "CREATE VIEW over", "WITH"),
    ("DROP VIEW t", "t is a table, not a view", "DROP TABLE t"),
    ("COPY main.t FROM '/nonexistent.csv'", "named without a schema", "COPY t FROM"),
    ("INSERT OR REPLACE INTO t VALUES (1, 'x')", "INSERT OR", "INSERT INTO t"),
    ("INSERT OR IGNORE INTO t VALUES (1, 'x')", "INSERT OR", "INSERT INTO t"),
    ("WITH q AS (SELECT 7, 'w') INSERT INTO t SELECT * FROM q", "put the WITH after INSERT",
     "INSERT INTO t WITH"),
    ("WITH q AS (SELECT 1) DELETE FROM t", "WITH ... DELETE t", "subquery of the WHERE"),
    ("WITH q AS (SELECT 1) UPDATE t SET k = 2", "WITH ... UPDATE t", "subquery of the WHERE"),
    ("EXPLAIN INSERT INTO t VALUES (3, 'c')", "cryptdisk runs that statement itself",
     "EXPLAIN SELECT"),  # DuckDB said "t is not an table"
    ("EXPLAIN ANALYZE insert into t SELECT * FROM t", "DuckDB has no plan", "EXPLAIN"),
    # COMMENT ON commented the statement's view (reported success, kept nothing)
    ("COMMENT ON TABLE t IS 'sales'", "keep no comments", "CREATE TABLE notes"),
    ("COMMENT ON COLUMN T.k IS 'id'", "keep no comments", "CREATE TABLE notes"),
    ("MERGE INTO t USING (SELECT 5 AS k, 'e' AS s) n ON t.k = n.k "
     "WHEN NOT MATCHED THEN INSERT VALUES (n.k, n.s)", "MERGE INTO t", "INSERT INTO t"),
])
def test_statements_on_a_table_that_duckdb_would_run_on_its_view_are_refused(db, sql, message,
                                                                              hint):
    """DuckDB reads a cryptdisk table through a view made for one statement: run there,
    ALTER TABLE t RENAME renamed that view (the table kept its name; the new name held
    the rows of that moment, stale after the next insert), CREATE OR REPLACE TABLE made
    a DuckDB table gone at close, a view over t failed when queried, and COPY t FROM,
    INSERT OR REPLACE and WITH ... INSERT failed with "t is not an table"."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    with pytest.raises(DatabaseError, match=message) as e:
        db.sql(sql)
    assert e.value.hint and hint in e.value.hint
    if sql.upper().startswith("ALTER"):  # a correct statement of a form not supported
        assert isinstance(e.value, NotSupportedError)
    db.sql("INSERT INTO t VALUES (3, 'c')")
    assert db.query("SELECT count(*), max(k) FROM t") == [(3, 3)]
    assert db.query("SELECT table_name FROM duckdb_tables() WHERE NOT internal") == [("t",)]
    assert db.query("SELECT count(*) FROM duckdb_views() WHERE NOT internal") == [(0,)]
    assert sorted(db.catalog.tables) == ["t"]


def test_duckdb_statements_on_other_names_still_run(db):
    db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1), (2)")
    db.sql("CREATE TEMP TABLE scratch AS SELECT 5 AS x")
    db.sql("WITH q AS (SELECT 6) INSERT INTO scratch SELECT * FROM q")
    db.sql("ALTER TABLE scratch RENAME TO scratch2")
    db.sql("CREATE VIEW lit AS SELECT 'FROM t' AS a, 'INSERT INTO t' AS b")
    assert db.query("SELECT x FROM scratch2 ORDER BY x") == [(5,), (6,)]
    assert db.query("SELECT a FROM lit") == [("FROM t",)]
    assert db.query("WITH q AS (SELECT 'UPDATE t' AS u) SELECT count(*) FROM q, t") == [(2,)]
    db.sql("DROP VIEW lit")


def test_prepare_and_execute_read_the_tables_as_they_are_at_each_execute(db):
    """DuckDB read the table of a PREPARE through a view made for that statement alone,
    so EXECUTE failed with "Table with name t does not exist"."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    assert db.sql("PREPARE p AS SELECT s FROM t WHERE k >= $1 ORDER BY k") is None
    assert db.query("EXECUTE p(1)") == [("a",), ("b",)]
    assert db.query("EXECUTE p(2)") == [("b",)]
    db.sql("INSERT INTO t VALUES (3, 'c')")  # an insert since: EXECUTE sees it
    assert db.query("EXECUTE p(2)") == [("b",), ("c",)]
    db.sql("OPTIMIZE TABLE t FINAL")  # other parts: EXECUTE reads those
    assert db.query("EXECUTE p(3)") == [("c",)]
    db.sql("PREPARE q AS SELECT count(*) FROM t, system.tables WHERE name = $name")
    assert db.query("EXECUTE q(name := 't')") == [(3,)]
    db.sql("DEALLOCATE p")
    with pytest.raises(DatabaseError, match="p"):
        db.sql("EXECUTE p(1)")
    assert db.query("EXECUTE q(name := 't')") == [(3,)]  # another name stays
    # DuckDB holds no statement over the table's sources between two statements
    assert db.query("SELECT count(*) FROM duckdb_prepared_statements()") == [(0,)]
    assert db.query("SELECT count(*) FROM duckdb_views() WHERE NOT internal") == [(0,)]


def test_prepare_of_a_statement_on_a_table_other_than_a_query_is_refused(db):
    db.sql("CREATE TABLE t (k BIGINT)")
    for sql in ("PREPARE w AS INSERT INTO t VALUES ($1)", "PREPARE w AS DELETE FROM t",
                "PREPARE w AS WITH q AS (SELECT 1) INSERT INTO t SELECT * FROM q"):
        with pytest.raises(DatabaseError, match="PREPARE") as e:
            db.sql(sql)
        assert e.value.hint
    db.sql("CREATE TEMP TABLE scratch (x BIGINT)")  # DuckDB's own statements still prepare
    db.sql("PREPARE w AS INSERT INTO scratch VALUES ($1)")
    db.sql("EXECUTE w(5)")
    assert db.query("SELECT x FROM scratch") == [(5,)]


@pytest.mark.parametrize(("sql", "what", "hint"), [
    ("CREATE TABLE t1 (id INT PRIMARY KEY)", "column id: PRIMARY KEY", "ORDER BY id"),
    ("CREATE TABLE t1 (id INT, s VARCHAR UNIQUE)", "column s: UNIQUE", "ORDER BY s"),
    ("CREATE TABLE t1 (id INT CHECK (id > 0))", "column id: CHECK", "WHERE"),
    ("CREATE TABLE t1 (id INT REFERENCES u (id))", "column id: REFERENCES", "JOIN"),
    ("CREATE TABLE t1 (s VARCHAR COLLATE nocase)", "column s: COLLATE", "COLLATE nocase"),
    ("CREATE TABLE t1 (id INT, d INT GENERATED ALWAYS AS (id * 2))", "column d: GENERATED",
     "SELECT"),
    ("CREATE TABLE t1 (id INT, d INT AS (id * 2))", "column d: AS", "SELECT"),
    ("CREATE TABLE t1 (id INT, PRIMARY KEY (id))", "PRIMARY KEY (id)", "ORDER BY"),
    ("CREATE TABLE t1 (id INT, u INT, UNIQUE (id, u))", "UNIQUE (id, u)", "ORDER BY"),
    ("CREATE TABLE t1 (id INT, CHECK (id > 0))", "CHECK (id > 0)", "WHERE"),
    ("CREATE TABLE t1 (id INT, FOREIGN KEY (id) REFERENCES u (id))", "FOREIGN KEY", "JOIN"),
    ("CREATE TABLE t1 (id INT, CONSTRAINT c CHECK (id > 0))", "CONSTRAINT", "constraints"),
])
def test_create_table_names_the_constraint_it_does_not_support(db, sql, what, hint):
    """A constraint reached DuckDB as part of the column's type: 'Parser Error: syntax
    error at or near "PRIMARY"' on cryptdisk's own SELECT CAST(NULL AS INT PRIMARY KEY)."""
    with pytest.raises(DatabaseError, match="not supported") as e:
        db.sql(sql)
    assert what in str(e.value) and "CAST" not in str(e.value)
    assert e.value.hint and hint in e.value.hint
    assert "t1" not in db.catalog.tables


def test_create_table_takes_null_and_constraint_words_inside_names_and_strings(db):
    st = _sql.parse("CREATE TABLE t (a INT NULL, \"not null\" ENUM('PRIMARY KEY', 'x'), "
                    "s STRUCT(\"default\" INT))")
    assert st.columns == [("a", "INT"), ("not null", "ENUM('PRIMARY KEY', 'x')"),
                          ("s", 'STRUCT("default" INT)')]
    db.sql("CREATE TABLE t (a INT NULL, b VARCHAR)")
    db.sql("INSERT INTO t VALUES (NULL, 'x')")
    assert db.query("SELECT a, b FROM t") == [(None, "x")]
    assert _sql.parse("CREATE TABLE t (e ENUM('a  b') NULL)").columns == [("e", "ENUM('a  b')")]


def test_insert_by_name_matches_columns_by_name_as_duckdb_does(db):
    """INSERT INTO t BY NAME was refused ('INSERT needs SELECT ... after the table name');
    DuckDB matches the query's columns to the table's by name (any case), NULL for the
    others. The same statements run on DuckDB's own table give the same rows."""
    assert _sql.parse("insert into t by  name select 1 AS id") == _sql.Insert(
        "t", "select 1 AS id", None, True)
    assert _sql.parse("INSERT INTO t BY POSITION SELECT 1, 2") == _sql.Insert("t", "SELECT 1, 2")
    ref = duckdb.connect()
    statements = ["INSERT INTO t BY NAME SELECT 'x' AS s, 1 AS ID",
                  "INSERT INTO t BY NAME (SELECT 5 AS n)",
                  "INSERT INTO t BY NAME FROM (SELECT 6 AS id)",
                  "INSERT INTO t BY NAME WITH q AS (SELECT 7 AS id, 'w' AS s) SELECT * FROM q",
                  "INSERT INTO t BY POSITION SELECT 8, 'p', 9"]
    for run in (db.sql, ref.execute):
        run("CREATE TABLE t (id BIGINT, s VARCHAR, n INTEGER)")
        for sql in statements:
            run(sql)
    assert db.query("FROM t ORDER BY id") == ref.execute("FROM t ORDER BY id").fetchall()
    for sql, message in (("INSERT INTO t BY NAME SELECT 1 AS nope", "no column.*nope"),
                         ("INSERT INTO t BY NAME SELECT 1 AS id, 2 AS ID", "id.*twice"),
                         ("INSERT INTO t (id, id) SELECT 1, 2", "id.*twice"),
                         ("INSERT INTO t BY NAME VALUES (1)", "BY NAME")):
        with pytest.raises(DatabaseError, match=message):
            db.sql(sql)
    assert db.query("SELECT count(*) FROM t") == [(5,)]


def test_referenced_tables_reads_a_doubled_quote_inside_a_quoted_name(db):
    """A table named a"b is written "a""b": the analysis took the name as a""b and found
    no table, so DuckDB answered "Table with name a"b does not exist"."""
    assert _columns.referenced_tables('SELECT * FROM "a""b" JOIN "c" ON 1',
                                      {'a"b', "c", "a"}) == {'a"b', "c"}
    db.sql('CREATE TABLE "a""b" (x BIGINT) ORDER BY x')
    db.sql('INSERT INTO "a""b" VALUES (1), (2)')
    assert db.query('SELECT sum(x) FROM "a""b"') == [(3,)]
    db.sql('PREPARE p AS SELECT count(*) FROM "a""b" WHERE x > $1')
    assert db.query("EXECUTE p(1)") == [(1,)]
    assert db.query('SELECT name FROM system.tables') == [('a"b',)]


def _three_parts(db):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE, pad VARCHAR) ORDER BY k")
    for lo in (0, 1000, 2000):  # one part each, key ranges apart
        db.sql(f"INSERT INTO t SELECT i, 's' || i, i / 2, repeat('x', 50) "
               f"FROM range({lo}, {lo + 1000}) r(i)")


def _columns_read(monkeypatch):
    got: list = []
    read = _partread.OpenPart.read
    monkeypatch.setattr(_partread.OpenPart, "read",
                        lambda self, rgs, cols, *j: got.extend(cols) or read(self, rgs, cols, *j))
    return got


def test_execute_reads_the_columns_and_parts_its_query_and_arguments_read(db, monkeypatch):
    """EXECUTE read every column of every part of its tables (the text DuckDB ran, PREPARE
    then EXECUTE, has no parse tree): it now skips as the query written out does."""
    _three_parts(db)
    cols = _columns_read(monkeypatch)
    db.sql("PREPARE p AS SELECT s FROM t WHERE k = $1")
    cols.clear()
    assert db.query("EXECUTE p(1500)") == [("s1500",)]
    assert db.last_scans["t"]["parts_skipped"] == 2
    assert set(cols) <= {"k", "s"} and "s" in cols
    assert db.query("EXECUTE p('1500')") == [("s1500",)]  # DuckDB casts it: nothing skipped
    assert db.last_scans["t"]["parts_skipped"] == 0
    assert db.query("EXECUTE p(1500 + 1)") == [("s1501",)]  # an expression: nothing skipped
    assert db.last_scans["t"]["parts_skipped"] == 0
    db.sql("PREPARE n AS SELECT count(*), min(f) FROM t WHERE k BETWEEN $Lo AND $hi")
    assert db.query("EXECUTE n(lo := 2100, HI := 2199)") == [(100, 1050.0)]
    assert db.last_scans["t"]["parts_skipped"] == 2
    db.sql("PREPARE r AS SELECT k FROM t WHERE s IN ($1, $2) AND f < $3 ORDER BY k")
    cols.clear()
    assert db.query("EXECUTE r('s5', 's2500', 1000.5)") == [(5,)]
    assert "pad" not in cols
    # a string argument for a float column: no skipping, DuckDB's answer
    assert db.query("EXECUTE r('s5', 's2500', '2000')") == [(5,), (2500,)]
    db.sql("PREPARE top AS SELECT k FROM t ORDER BY k DESC LIMIT $1")
    assert db.query("EXECUTE top(2)") == [(2999,), (2998,)]
    assert db.last_scans["t"]["row_groups_skipped"] == 2
    db.sql("PREPARE e AS SELECT count(*) FROM t")  # no argument expected: DuckDB says so
    with pytest.raises(DatabaseError):
        db.sql("EXECUTE e(1)")
    assert db.query("EXECUTE e") == [(3000,)]


def test_execute_on_a_reader_skips_as_on_the_database(db):
    _three_parts(db)
    r = db.reader()
    try:
        r.execute("PREPARE p AS SELECT s FROM t WHERE k >= $1 AND k < $2")
        assert r.query("EXECUTE p(2998, 3000)") == [("s2998",), ("s2999",)]
        assert r.last_scans["t"]["parts_skipped"] == 2
    finally:
        r.close()


def test_unquoted_names_past_ascii_are_cryptdisk_tables(tmp_path):
    """DuckDB reads ünï unquoted as a name; cryptdisk's statement patterns took ASCII
    only, so CREATE TABLE ünï (é BIGINT) went to DuckDB, which made a table in memory:
    the insert reported success and the rows were gone at close."""
    db = cryptdisk.connect(tmp_path / "db")
    db.sql("CREATE TABLE ünï (é BIGINT, 名前 VARCHAR) ORDER BY é")
    db.sql("INSERT INTO ünï VALUES (2, 'b'), (1, 'a')")
    assert _sql.parse("OPTIMIZE TABLE ünï FINAL") == _sql.Optimize("ünï", True)
    db.sql("OPTIMIZE TABLE ünï FINAL")
    db.close()
    db = cryptdisk.connect(tmp_path / "db")
    try:
        assert db.query("SELECT name, order_by FROM system.tables") == [("ünï", "é")]
        assert db.query("SELECT 名前 FROM ünï WHERE é = 1") == [("a",)]
        db.sql("TRUNCATE ünï")
        assert db.query("SELECT count(*) FROM ünï") == [(0,)]
        db.sql("DROP TABLE ünï")
        assert db.query("SELECT count(*) FROM system.tables") == [(0,)]
    finally:
        db.close()


def test_a_dataframe_named_in_sql_is_refused_pointing_at_db_insert(db):
    """``INSERT INTO t SELECT * FROM df`` with a local DataFrame ``df`` failed with DuckDB's
    "Table with name df does not exist! Did you mean "pg_depend"?" (DuckDB's lookup of
    Python variables does not reach the caller of cryptdisk): it is a TableNotFoundError
    naming db.insert, and nothing is inserted; db.insert inserts the frame."""
    import pandas as pd

    db.sql("CREATE TABLE t (a BIGINT)")
    df = pd.DataFrame({"a": [1, 2]})
    said = r"no table 'df' in .*; a Python variable is not read by its name: " \
        r"db\.insert\(table, df\) inserts a DataFrame's or Arrow table's rows"
    for sql in ("INSERT INTO t SELECT * FROM df", "INSERT INTO t (a) SELECT a FROM df",
                "CREATE TABLE u AS SELECT * FROM df", "SELECT * FROM df"):
        with pytest.raises(TableNotFoundError, match=said):
            db.execute(sql)
    assert db.query("SELECT count(*) FROM t") == [(0,)]
    assert db.query("SELECT name FROM system.tables") == [("t",)]
    assert len(df) == 2  # (the frame is in scope: DuckDB's own connection would read it)
    db.insert("t", df)
    assert db.query("SELECT a FROM t ORDER BY a") == [(1,), (2,)]


def test_a_table_duckdb_does_not_find_is_named_in_cryptdisks_words(db):
    """DuckDB said "Table with name enx does not exist! Did you mean "pg_enum"?": its
    suggestions are its own catalog's tables, never the database's."""
    db.sql("CREATE TABLE sales (k BIGINT)")
    with pytest.raises(TableNotFoundError, match=r"no table 'salse' in .*\(tables: sales\); a "
                       r"Python variable is not read by its name: db.insert\(table, salse\)") \
            as e:
        db.sql("SELECT * FROM salse")
    assert e.value.hint == "did you mean sales?"
    with pytest.raises(TableNotFoundError, match=r"no system table system\.column \(system "
                       r"tables: system\.disks, .*system\.parts") as e:
        db.sql("SELECT * FROM system.column")
    assert e.value.hint is None
    # the server's users, roles and grants: said so, embedded, for any query over them
    with pytest.raises(TableNotFoundError, match=r"no system table system\.users") as e:
        db.sql("SELECT name FROM system.users WHERE is_admin")
    assert e.value.hint is not None and "cryptdisk serve" in e.value.hint
    with pytest.raises(DatabaseError, match="'sales' is a cryptdisk table") as e:
        db.sql("PRAGMA table_info('sales')")
    assert "DESCRIBE sales" in e.value.hint and "pg_" not in str(e.value)
    r = db.reader()
    try:
        with pytest.raises(TableNotFoundError, match="no table 'nope'"):
            r.execute("SELECT * FROM sales JOIN nope USING (k)")
    finally:
        r.close()


def test_show_tables_lists_the_databases_tables(db):
    """SHOW TABLES answered DuckDB's catalog alone, which holds no cryptdisk table: an
    empty list for a database of tables."""
    db.sql("CREATE TABLE b (k BIGINT)")
    db.sql("CREATE TABLE a (k BIGINT) SETTINGS storage_policy = 'plain'")
    db.sql("CREATE TEMP TABLE scratch (x INT)")
    got = db.sql("SHOW TABLES")
    assert got.column_names == ["name"]
    assert got.column("name").to_pylist() == ["a", "b", "scratch"]
    assert db.query("show tables;") == [("a",), ("b",), ("scratch",)]


def test_a_transaction_block_holds_queries_only(db):
    """BEGIN, INSERT, ROLLBACK reported success for all three and the insert stayed:
    cryptdisk commits each change as it runs. A change in a block is now refused."""
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("INSERT INTO t VALUES (1)")
    db.sql("BEGIN")
    assert db.query("SELECT count(*) FROM t") == [(1,)]  # queries run in the block
    for change in ("INSERT INTO t VALUES (2)", "CREATE TABLE u (k BIGINT)", "TRUNCATE t",
                   "DROP TABLE t", "OPTIMIZE TABLE t FINAL"):
        with pytest.raises(DatabaseError, match="holds queries only") as e:
            db.sql(change)
        assert "ROLLBACK" in e.value.hint
    with pytest.raises(DatabaseError, match=r"insert into t: .*holds queries only"):
        db.insert("t", pa.table({"k": [3]}))
    db.sql("ROLLBACK")
    assert db.query("SELECT k FROM t") == [(1,)]
    db.sql("START TRANSACTION")
    db.sql("COMMIT")
    db.sql("INSERT INTO t VALUES (2)")  # outside a block: as ever
    assert db.query("SELECT count(*) FROM t") == [(2,)]
    with pytest.raises(DatabaseError):
        db.sql("COMMIT")  # no transaction: DuckDB says so, and writes go on
    db.sql("INSERT INTO t VALUES (3)")
    assert db.query("SELECT count(*) FROM t") == [(3,)]


def test_statements_on_a_temporary_table_are_duckdbs(db):
    """CREATE TEMP TABLE made DuckDB's table, but INSERT INTO, TRUNCATE and DROP TABLE of
    it failed with "no table 'scratch'" (cryptdisk took them as its own), and CREATE TABLE
    of its name made a table that statements could no longer tell from it."""
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("INSERT INTO t VALUES (1), (2)")
    db.sql("CREATE TEMP TABLE Scratch (x BIGINT)")
    db.sql("INSERT INTO scratch VALUES (5)")
    db.sql("INSERT INTO scratch SELECT k FROM t")
    assert db.query("SELECT x FROM scratch ORDER BY x") == [(1,), (2,), (5,)]
    with pytest.raises(DatabaseError, match="temporary table scratch") as e:
        db.sql("CREATE TABLE IF NOT EXISTS scratch (x BIGINT)")
    assert "DROP TABLE scratch" in e.value.hint
    db.sql("BEGIN")  # DuckDB's own table changes in a block, and roll back
    db.sql("INSERT INTO scratch VALUES (6)")
    db.sql("ROLLBACK")
    assert db.query("SELECT count(*) FROM scratch") == [(3,)]
    db.sql("TRUNCATE scratch")
    assert db.query("SELECT count(*) FROM scratch") == [(0,)]
    db.sql("DROP TABLE scratch")
    db.sql("CREATE TABLE scratch (x BIGINT)")  # the name is free again: a table
    assert db.query("SELECT name FROM system.tables ORDER BY name") == [("scratch",), ("t",)]
    assert db.query("SELECT count(*) FROM t") == [(2,)]


def test_a_temporary_tables_name_matches_as_duckdb_matches_names(db):
    """A temporary table created quoted in mixed case is named in any case of its ASCII
    letters, as DuckDB does; but a name differing from it only in the case of a letter
    outside ASCII ("été" beside "Été") is another name to DuckDB, and was refused as the
    temporary table's (SQL's lower() folds É): now it is the database's table, both
    read and written apart, as in DuckDB."""
    ref = duckdb.connect()
    for con in (ref, db):
        con.sql('CREATE TEMP TABLE "MyTemp" (a INT)')
        con.sql("INSERT INTO mytemp VALUES (1)")
        con.sql('INSERT INTO "MYTEMP" VALUES (2)')
        con.sql('CREATE TEMP TABLE "Été" (a INT)')
        con.sql('CREATE TABLE "été" (a INT)')
        con.sql('INSERT INTO "été" VALUES (5)')
        con.sql('INSERT INTO "Été" VALUES (6)')
    for sql in ["SELECT a FROM MyTemp ORDER BY a", 'SELECT a FROM "été"',
                'SELECT a FROM "Été"']:
        assert db.query(sql) == ref.sql(sql).fetchall(), sql
    assert db.query("SELECT name FROM system.tables") == [("été",)]
    with pytest.raises(DatabaseError, match="temporary table"):
        db.sql("CREATE TABLE mytemp (a INT)")  # (ASCII case: the temporary table's name)


def test_system_columns_lists_every_tables_columns(db):
    """There was no system.columns (DuckDB answered "Table with name columns does not
    exist! Did you mean information_schema.columns?", which holds no cryptdisk table)."""
    db.sql('CREATE TABLE t (k BIGINT, "Note" VARCHAR, d DECIMAL(10,2)) ORDER BY (k, "Note")')
    db.sql("CREATE TABLE u (x DOUBLE) SETTINGS storage_policy = 'plain'")
    got = db.query("SELECT * FROM system.columns ORDER BY \"table\", position")
    assert got == [("t", "k", 1, "BIGINT", True, True, None),
                   ("t", "Note", 2, "VARCHAR", True, True, None),
                   ("t", "d", 3, "DECIMAL(10,2)", False, True, None),
                   ("u", "x", 1, "DOUBLE", False, True, None)]
    assert db.query("SELECT count(*) FROM system.columns c JOIN system.tables t "
                    "ON c.\"table\" = t.name WHERE t.is_encrypted") == [(3,)]


@pytest.mark.parametrize(("sql", "said", "hint"), [
    ("CREATE TABLE s.u (x INT)", r"CREATE TABLE s\.u: a table is named without a schema",
     "CREATE TABLE u"),
    ('CREATE TABLE "main"."U" (x INT)', r"CREATE TABLE main\.U: .*without a schema",
     "CREATE TABLE U"),
    ("EXPORT DATABASE '{dir}'", "would export none of them", "cryptdisk backup"),
    ("IMPORT DATABASE '{dir}'", "gone at close", "INSERT INTO t SELECT"),
])
def test_statements_that_would_miss_the_databases_tables_are_refused(db, tmp_path, sql,
                                                                      said, hint):
    """CREATE TABLE s.u said "give the columns ... AS SELECT is not supported"; EXPORT
    DATABASE reported success having exported DuckDB's catalog, which holds no table of
    the database; IMPORT DATABASE made DuckDB tables that were gone at close."""
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("INSERT INTO t VALUES (1)")
    out = tmp_path / "export"
    with pytest.raises(DatabaseError, match=said) as e:
        db.sql(sql.format(dir=out))
    assert hint in e.value.hint
    assert not out.exists()
    assert db.query("SELECT name FROM system.tables") == [("t",)]


def test_execute_runs_one_statement_and_refuses_text_holding_more(db):
    """db.execute("SELECT 1; SET temp_directory = '/tmp/x'") ran both, past the refusal of
    that setting (DuckDB could then spill plaintext), and "SELECT 1; CREATE TABLE x (a
    INT)" made a DuckDB table in memory; a reader's execute ran them on its cursor too."""
    db.sql("CREATE TABLE t (k BIGINT)")
    r = db.reader()
    try:
        for run in (db.execute, r.execute):
            for text in ("SELECT 1; SET temp_directory = '/tmp/x'",
                         "SELECT 1; CREATE TABLE x (a INT)", "SELECT 1;SELECT 2"):
                with pytest.raises(DatabaseError, match="runs one statement, and this text "
                                   "holds 2") as e:
                    run(text)
                assert ".sql(text)" in e.value.hint
            assert run("SELECT 1; -- a comment").to_pylist() == [{"1": 1}]
            assert run("  -- only a comment") is None
            with pytest.raises(TypeError, match="str"):
                run(b"SELECT 1")
        with pytest.raises(TypeError, match="str"):
            db.sql(b"SELECT 1")
    finally:
        r.close()
    assert db.query("SELECT current_setting('temp_directory')") == [("",)]
    assert db.query("SHOW TABLES") == [("t",)]
    assert db.sql("SELECT 1; SELECT 2").to_pylist() == [{"2": 2}]  # sql runs each


def test_cryptdisks_own_statements_written_otherwise_are_named_not_parser_errors(db):
    """OPTIMIZE t and SYSTEM FLUSH LOGS got DuckDB's "syntax error at or near OPTIMIZE";
    DROP TABLE t CASCADE went to DuckDB, which said "Existing object t is of type View"."""
    db.sql("CREATE TABLE t (k BIGINT)")
    for sql, said in (("OPTIMIZE t", r"OPTIMIZE is OPTIMIZE TABLE t \[FINAL\]"),
                      ("OPTIMIZE TABLE t FINAL DEDUPLICATE", "OPTIMIZE is OPTIMIZE TABLE"),
                      ("SYSTEM FLUSH LOGS", "SYSTEM ROTATE KEYS and SYSTEM REENCRYPT")):
        with pytest.raises(DatabaseError, match=said) as e:
            db.sql(sql)
        assert "Parser Error" not in str(e.value)
    db.sql("DROP TABLE t CASCADE")
    db.sql("CREATE TABLE t (k BIGINT)")
    db.sql("DROP TABLE IF EXISTS t RESTRICT")
    assert db.query("SELECT count(*) FROM system.tables") == [(0,)]


def test_a_key_column_named_with_a_comma_is_refused_at_create(db):
    """The catalog keeps ORDER BY as the key's names joined by commas: a key column named
    "x,y" was created, and every insert then failed ("Referenced column x not found")."""
    with pytest.raises(DatabaseError, match="cannot hold a comma"):
        db.sql('CREATE TABLE c ("x,y" INT, z INT) ORDER BY "x,y"')
    assert db.query("SELECT count(*) FROM system.tables") == [(0,)]
    db.sql('CREATE TABLE c ("x,y" INT, z INT) ORDER BY z')  # another column may hold one
    db.sql("INSERT INTO c VALUES (2, 1), (1, 2)")
    assert db.query('SELECT "x,y" FROM c ORDER BY z') == [(2,), (1,)]

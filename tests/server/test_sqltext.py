"""The server's SQL lexing: statements, parameters, and what strings and comments hide."""

from __future__ import annotations

import itertools

import duckdb
import hypothesis
import hypothesis.strategies as st
import pytest

from cryptdisk.errors import ServerError
from cryptdisk.server import _sqltext
from cryptdisk.server._sqltext import (
    first_words,
    placeholders,
    split_statements,
    substitute,
)


def test_split_respects_strings_comments_and_triggers() -> None:
    sql = ("SELECT ';' AS a; -- ; comment\nSELECT \"x;y\" FROM t /* ; */;"
           "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO u VALUES (1); "
           "DELETE FROM v; END; SELECT $$;$$;;")
    assert split_statements(sql) == [
        "SELECT ';' AS a", "-- ; comment\nSELECT \"x;y\" FROM t /* ; */",
        "CREATE TRIGGER tr AFTER INSERT ON t BEGIN INSERT INTO u VALUES (1); "
        "DELETE FROM v; END", "SELECT $$;$$"]
    assert split_statements(" ; -- nothing\n ;") == []


def test_parameters_outside_strings_only() -> None:
    sql = "SELECT $1, '$2', \"$3\", E'\\'$4', $tag$ $5 $tag$, a$6, $2 -- $7"
    assert placeholders(sql) == 2
    assert substitute(sql, lambda n: f"<{n}>") == \
        "SELECT <1>, '$2', \"$3\", E'\\'$4', $tag$ $5 $tag$, a$6, <2> -- $7"


@pytest.mark.parametrize("bad", ["SELECT 'open", 'SELECT "open', "SELECT /* open",
                                 "SELECT $x$ open"])
def test_unterminated(bad: str) -> None:
    with pytest.raises(ServerError):
        split_statements(bad)


def test_replace_words_only_bare_words() -> None:
    sql = ("SELECT current_user, \"current_user\", 'current_user', t.current_user -- current_user\n"
           "/* current_user */ , $$current_user$$, CURRENT_USER, xcurrent_user FROM t")
    out = _sqltext.replace_words(sql, lambda w: "'u'" if w.lower() == "current_user" else None)
    assert out == ("SELECT 'u', \"current_user\", 'current_user', t.current_user -- current_user\n"
                   "/* current_user */ , $$current_user$$, 'u', xcurrent_user FROM t")


def test_strip_strings() -> None:
    assert _sqltext.strip_strings("GRANT r TO \"on\" -- ON\n") == "GRANT r TO      " + " " * 6


@pytest.mark.parametrize("sql", [
    "SELECT 1;", "  ;  ", "", "SELECT 1 ;  \n", "UPDATE a SET b = b + -5 WHERE c = 3;",
    "SELECT 1; SELECT 2", "select 'a;b';", "SELECT 1 -- c\n;", "SELECT /* x */ 1;",
    "CREATE TRIGGER t AFTER INSERT ON x BEGIN SELECT 1;", "SELECT $1;", "END;",
    "SELECT a/b FROM t;", ";;", "SELECT 1;;", "\t\n", "select -1 - -2;", "select 1 -",
])
def test_split_statements_fast_path_agrees_with_the_scan(sql, monkeypatch) -> None:
    fast = split_statements(sql)
    monkeypatch.setattr(_sqltext, "_single_statement", lambda _sql: None)
    assert fast == split_statements(sql)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.text(alphabet="SELECTfromab_ \t\n(1;-*/'", max_size=30))
def test_first_words_fast_path_agrees_with_the_scan(sql: str) -> None:
    from cryptdisk.server._sqltext import _ALPHA, _strip_comments

    words = [m.group().upper() for m in _ALPHA.finditer(_strip_comments(sql))]
    assert first_words(sql, 2) == words[:2]
    assert first_words(sql, 1) == words[:1]


@pytest.mark.parametrize(("sql", "shape", "values"), [
    ("SELECT abalance FROM pgbench_accounts WHERE aid = 12345",
     "SELECT abalance FROM pgbench_accounts WHERE aid = ?1", (12345,)),
    ("UPDATE acc SET bal = bal + -4047 WHERE aid = 77",
     "UPDATE acc SET bal = bal + -?1 WHERE aid = ?2", (4047, 77)),
    ("INSERT INTO h (tid, aid, delta, t) VALUES (3, 5, -123, CURRENT_TIMESTAMP)",
     "INSERT INTO h (tid, aid, delta, t) VALUES (?1, ?2, -?3, CURRENT_TIMESTAMP)", (3, 5, 123)),
    ("DELETE FROM t WHERE a>=5", "DELETE FROM t WHERE a>=?1", (5,)),
    ("SELECT a = 1 FROM t WHERE b=2", "SELECT a = 1 FROM t WHERE b=?1", (2,)),  # names kept
    ("SELECT a FROM t WHERE CAST(a AS NUMERIC(10,2)) = 5 AND b IN (1, 2)",
     "SELECT a FROM t WHERE CAST(a AS NUMERIC(10,2)) = ?1 AND b IN (1, 2)", (5,)),
    ("SELECT a FROM t1 WHERE t1.a=3", "SELECT a FROM t1 WHERE t1.a=?1", (3,)),
    # in WHERE only a comparison's operands: an index on a + 5 is matched by its text
    ("SELECT a FROM t WHERE a + 5 = 10 OR a <> - 2",
     "SELECT a FROM t WHERE a + 5 = ?1 OR a <> - ?2", (10, 2)),
    ("UPDATE t SET b = b * 3 WHERE a % 4 = 1", "UPDATE t SET b = b * ?1 WHERE a % 4 = ?2", (3, 1)),
])
def test_lift_literals(sql: str, shape: str, values: tuple[int, ...]) -> None:
    assert _sqltext.lift_literals(sql) == (shape, values)
    assert _sqltext.lift_literals(sql) == (shape, values)  # the remembered plan agrees


@pytest.mark.parametrize("sql", [
    "SELECT 1", "SELECT a FROM t ORDER BY 1", "SELECT a FROM t WHERE a = 1 ORDER BY 1",
    "SELECT a FROM t GROUP BY 1 HAVING a > 1", "SELECT a FROM t WHERE a = 1 LIMIT 1",
    "SELECT (SELECT 1) FROM t WHERE a = 1", "SELECT a FROM t WHERE a IN (SELECT 1 + 1)",
    "SELECT a FROM t JOIN u ON u.x = t.a WHERE a = 1", "UPDATE t SET a = 1 RETURNING a + 1",
    "INSERT INTO t VALUES (1), (2)", "INSERT INTO t VALUES (1) RETURNING a",
    "INSERT INTO t SELECT 1", "INSERT INTO t VALUES (abs(1))",
    "SELECT a FROM t WHERE a = 1.5", "SELECT a FROM t WHERE a = 1e5",
    "SELECT a FROM t WHERE a = 0x10", "SELECT a FROM t WHERE a = 12345678901234567890",
    "SELECT a FROM t WHERE a = 'x' AND b = 1", "SELECT a FROM t WHERE a = ?1 AND b = 1",
    "SELECT a FROM t WHERE a = :x AND b = 1", "SELECT a FROM [t] WHERE [a = 1] = 1",
    "SELECT a FROM t WHERE a = 1 -- c", "SELECT a FROM t WHERE a = 1 /* c */",
    "SELECT a FROM t WHERE a LIKE 1 || 2", "CREATE TABLE t (a INT DEFAULT 1)",
    "WITH x AS (SELECT 1) SELECT * FROM x WHERE 1 = 1",
    # SQLite reads \u0663 (ARABIC-INDIC DIGIT THREE) as a name, not the number 3
    "SELECT a FROM t WHERE a = 1 + \u0663", "SELECT a FROM t WHERE a = \u0663\u0661",
    "SELECT a FROM t WHERE \u00e9 = 1",
])
def test_lift_literals_leaves_these_alone(sql: str) -> None:
    assert _sqltext.lift_literals(sql) is None


@pytest.mark.parametrize("first, second, expected", [
    # a literal kept as written (after a binary minus, in a WHERE) differs
    ("SELECT b FROM t WHERE a = -2 OR a = 1 - 2", "SELECT b FROM t WHERE a = -5 OR a = 3 - 4",
     ("SELECT b FROM t WHERE a = -?1 OR a = ?2 - 4", (5, 3))),
    # a name's digits differ: the second reads column a2, not a1
    ("SELECT a1 FROM t WHERE a = 5", "SELECT a2 FROM t WHERE a = 7",
     ("SELECT a2 FROM t WHERE a = ?1", (7,))),
    ("UPDATE t1 SET a = 3 WHERE a = 4", "UPDATE t2 SET a = 5 WHERE a = 6",
     ("UPDATE t2 SET a = ?1 WHERE a = ?2", (5, 6))),
    # every digit lifted: the shape is shared
    ("SELECT b FROM t WHERE a = 1", "SELECT b FROM t WHERE a = 9",
     ("SELECT b FROM t WHERE a = ?1", (9,))),
])
def test_texts_alike_but_for_digits_keep_their_own_digits(first, second, expected) -> None:
    """Lifting is planned once per text with its digits blanked out; a second text of
    that key lifts its own integers and keeps its own other digits."""
    _sqltext._LIFT_PLANS.clear()
    assert _sqltext.lift_literals(first) is not None
    assert _sqltext.lift_literals(second) == expected


_SHAPES = [
    "SELECT a, b FROM t WHERE a = {0}",
    "SELECT a * 2 AS x, b FROM t WHERE a >= {0} AND a < {1} + {2}",
    "SELECT count(*) FROM t WHERE a % {0} = {1} OR b = {2}",
    "SELECT b FROM t WHERE a = -{0} OR a = {1} - {2}",
    "UPDATE t SET a = a + -{0}, b = {1} * 2 WHERE a > {2}",
    "DELETE FROM t WHERE a = {0} OR a <> -{1}",
    "INSERT INTO t (a, b) VALUES ({0}, -{1})",
]


@hypothesis.settings(max_examples=60, deadline=None, database=None)
@hypothesis.given(shape=st.sampled_from(_SHAPES),
                  values=st.lists(st.integers(0, 10 ** 18 - 1), min_size=3, max_size=3))
def test_lifted_statements_do_what_their_text_does(shape: str, values: list[int]) -> None:
    """The lifted statement's rows, column names and changes are the literal text's."""
    import apsw

    sql = shape.format(*values)
    lifted = _sqltext.lift_literals(sql)
    assert lifted is not None
    out = []
    for text, params in ((sql, ()), lifted):
        db = apsw.Connection(":memory:")
        db.execute("CREATE TABLE t (a INTEGER, b TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?)",
                       [(v, str(v)) for v in (0, 1, 7, -7, 2 ** 62, *values)])
        try:
            cur = db.execute(text, params)
            rows = list(cur)
            names = [d[0] for d in cur.description] if rows else []
            got: object = (rows, names, db.changes(), sorted(db.execute("SELECT * FROM t")))
        except apsw.Error as exc:  # an overflow fails either way
            got = type(exc)
        out.append(got)
    assert out[0] == out[1]


# --- a simple query's plan, shared by the texts of one digit key --------------------------


def _planned(plan: _sqltext.QueryPlan | None, sql: str) -> object:
    """What the session runs ``sql`` as, by ``plan`` (made from any text of its key)."""
    if plan is None:
        return None
    statement = sql[plan.start:plan.end]
    if plan.shape is None:
        return statement, plan.head, None
    return statement, plan.head, (plan.shape, tuple(int(sql[a:b]) for a, b in plan.spans))


def _unplanned(sql: str) -> object:
    """What the session makes of ``sql`` without a plan: its statements split, its first
    word, and the lift of its integers (when they are all its digits)."""
    statements = split_statements(sql)
    if len(statements) != 1:
        return None
    head = (first_words(statements[0], 1) or [""])[0]
    lifted = _sqltext.lift_literals(statements[0])
    digits = sum(c.isdigit() for c in sql)
    if lifted is not None and sum(len(str(v)) for v in lifted[1]) != digits:
        lifted = None  # some digits stay in the text: each text is lifted on its own
    return statements[0], head, lifted


@pytest.mark.parametrize("sql", [
    "SELECT 1; SELECT 2", "SELECT '1'", "SELECT $1", "SELECT $a1$x$a1$", "SELECT 1 -- 2",
    "SELECT /* 1 */ 1", 'SELECT "c1" FROM t', "COPY t FROM STDIN", "", " ; ",
    "CREATE TABLE t1 (a INTEGER)",
])
def test_no_plan_for_texts_whose_digits_could_change_their_split(sql: str) -> None:
    """Quotes, comments and $ (a dollar quote's tag can hold digits: $a1$ ... $a2$ does not
    end where $a1$ ... $a1$ does), several statements, COPY and CREATE (a trigger's body)
    are split by the session itself, for every text."""
    assert _sqltext.query_plan(sql) is None


def test_a_plan_holds_for_every_text_of_its_key() -> None:
    first = "  UPDATE pgbench_accounts SET abalance = abalance + -123 WHERE aid = 4567;\n"
    second = "  UPDATE pgbench_accounts SET abalance = abalance + -987 WHERE aid = 1000;\n"
    assert _sqltext.digit_key(first) == _sqltext.digit_key(second)
    plan = _sqltext.query_plan(first)
    assert plan is not None and plan.head == "UPDATE"
    assert _planned(plan, second) == (
        "UPDATE pgbench_accounts SET abalance = abalance + -987 WHERE aid = 1000", "UPDATE",
        ("UPDATE pgbench_accounts SET abalance = abalance + -?1 WHERE aid = ?2", (987, 1000)))
    # a digit the lift keeps (a + 5) makes every text of the key lift on its own
    kept = _sqltext.query_plan("SELECT a + 5 FROM t WHERE a = 10")
    assert kept is not None and kept.shape is None and kept.head == "SELECT"
    assert _sqltext.query_plan("END;") == _sqltext.QueryPlan(0, 3, "END", None, ())


_TEMPLATES = [
    "SELECT abalance FROM pgbench_accounts WHERE aid = {0};",
    "UPDATE t SET a = a + -{0}, b = {1} * 2 WHERE a > {2}",
    "INSERT INTO h (a, b, c) VALUES ({0}, {1}, -{2}) ;  ",
    "SELECT a{0} FROM t WHERE a = {1} + {2}",
    "SELECT b FROM t{0} WHERE a = {1} OR a = {2} - 1;",
    "DELETE FROM t WHERE a = {0};;",
    "BEGIN;", "  END ;", "SELECT {0}; SELECT {1}", "SELECT '{0}' FROM t WHERE a = {1}",
    "SELECT $1 FROM t WHERE a = {0}", "SELECT a -- {0}\nFROM t WHERE a = {1}",
    "UPDATE t SET a = {0} WHERE b = {1} RETURNING a",
]


@hypothesis.settings(max_examples=300, deadline=None, database=None)
@hypothesis.given(template=st.sampled_from(_TEMPLATES),
                  first=st.lists(st.integers(0, 10 ** 6), min_size=3, max_size=3),
                  data=st.data())
def test_a_plan_made_from_one_text_runs_another_of_its_key_as_itself(
        template: str, first: list[int], data: st.DataObject) -> None:
    """Any two texts of one key: the plan made from the first runs the second exactly as
    splitting and lifting the second would (same statement, first word, shape, values)."""
    second = [data.draw(st.integers(0 if v < 10 else 10 ** (len(str(v)) - 1),
                                    10 ** len(str(v)) - 1)) for v in first]
    a, b = template.format(*first), template.format(*second)
    assert _sqltext.digit_key(a) == _sqltext.digit_key(b)
    plan = _sqltext.query_plan(a)
    assert _planned(plan, b) == (None if plan is None else _unplanned(b))
    if plan is not None and "{0}" in template and "'" not in template:
        assert (plan.shape is not None) == (_unplanned(a)[2] is not None)  # type: ignore[index]


def test_drop_pg_catalog_before_functions_and_types_only() -> None:
    from cryptdisk.server._sqltext import drop_pg_catalog

    assert drop_pg_catalog("SELECT pg_catalog.lower(b) FROM t") == "SELECT lower(b) FROM t"
    assert drop_pg_catalog('SELECT $1::"pg_catalog"."int8"::text') == 'SELECT $1::"int8"::text'
    assert drop_pg_catalog("SELECT CAST(x AS pg_catalog.text) FROM pg_catalog.pg_class") == \
        "SELECT CAST(x AS text) FROM pg_catalog.pg_class"
    for same in ("SELECT 'pg_catalog.lower(x)'", "SELECT x.pg_catalog.f(1)",
                 "SELECT * FROM pg_catalog.pg_type"):
        assert drop_pg_catalog(same) == same


def test_replace_calls_matches_parentheses_outside_strings() -> None:
    from cryptdisk.server._sqltext import replace_calls

    sql = "SELECT quote_literal(f(')', x)), Quote_Literal($1) -- quote_literal("
    assert replace_calls(sql, "quote_literal", "q[{}]") == \
        "SELECT q[f(')', x)], q[$1] -- quote_literal("
    assert replace_calls("SELECT quote_literal(", "quote_literal", "q[{}]") == \
        "SELECT quote_literal("


def test_parameter_types_from_context() -> None:
    from cryptdisk.server import _types as T
    from cryptdisk.server._paramtypes import infer

    cols = {"t": [("a", T.INT8), ("b", T.TEXT), ("d", T.DATE), ("c", T.FLOAT8)],
            "u": [("a", T.INT4), ("z", T.NUMERIC)]}
    tables = {"t": "t", "u": "u"}

    def types(sql: str, count: int) -> list[int]:
        return infer(sql, count, tables, lambda name: cols[name])

    assert types("SELECT * FROM t WHERE a = $1 AND $2 < d", 2) == [T.INT8, T.DATE]
    assert types("SELECT * FROM t WHERE c * 2 > $1 AND b LIKE $2", 2) == [T.FLOAT8, T.TEXT]
    assert types("SELECT $1 + 1, $2::numeric(10, 2), CAST($3 AS DOUBLE PRECISION)", 3) == \
        [T.INT8, T.NUMERIC, T.FLOAT8]
    assert types("SELECT $1::int[], $2::timestamp with time zone", 2) == [0, T.TIMESTAMPTZ]
    assert types("SELECT b FROM t WHERE a IN ($1, $2) OR d BETWEEN $3 AND $4", 4) == \
        [T.INT8, T.INT8, T.DATE, T.DATE]
    assert types("SELECT b FROM t LIMIT $1 OFFSET $2", 2) == [T.INT8, T.INT8]
    assert types("INSERT INTO t (d, b) VALUES ($1, $2), ($3, upper($4))", 4) == \
        [T.DATE, T.TEXT, T.DATE, 0]
    assert types("INSERT INTO public.t VALUES ($1, $2, $3, $4)", 4) == \
        [T.INT8, T.TEXT, T.DATE, T.FLOAT8]
    # a column in two tables with two types: qualified, or not told
    assert types("SELECT 1 FROM t JOIN u ON t.a = u.a WHERE u.a = $1 AND a = $2", 2) == \
        [T.INT4, 0]
    # a table the caller does not let it see is not looked at
    assert infer("SELECT 1 FROM u WHERE z = $1", 1, {"t": "t"}, lambda n: cols[n]) == [0]
    assert types("SELECT lower($1), '$2' = $1", 1) == [0]


def _duckdb_statements(sql: str) -> list[str]:
    """``sql`` cut where DuckDB's tokenizer reads a ``;``, without pieces of only comments."""
    raw = sql.encode()
    cuts = [at for at, kind in duckdb.tokenize(sql)
            if kind == duckdb.token_type.operator and raw[at:at + 1] == b";"]
    pieces = [raw[a + 1:b].decode().strip() for a, b in itertools.pairwise([-1, *cuts, len(raw)])]
    comments = {p for p in pieces if p and all(
        kind == duckdb.token_type.comment for _, kind in duckdb.tokenize(p))}
    return [p for p in pieces if p and p not in comments]


@pytest.mark.parametrize(("sql", "statements"), [
    ("SELECT 1$$;$$", ["SELECT 1$$;$$"]),                       # a number, a $$ string
    ("SELECT 1$a$;$a$; SELECT 2", ["SELECT 1$a$;$a$", "SELECT 2"]),
    ("SELECT $1$$;$$", ["SELECT $1$$;$$"]),                    # a parameter, a string
    ("SELECT 1E'\\';'; SELECT 2", ["SELECT 1E'\\';'", "SELECT 2"]),  # a number, E'...'
    ("SELECT 1.5e'\\';'", ["SELECT 1.5e'\\';'"]),
    ("SELECT 1_e'\\';';x'", ["SELECT 1_e'\\'", "';x'"]),      # a name _e, then '...'
    ("SELECT 1abc$$;x", ["SELECT 1abc$$", "x"]),                # a name abc$$
    ("SELECT $1e5$a$;$a$", ["SELECT $1e5$a$;$a$"]),             # $, 1e5, a string
    ("SELECT é$$a$;$a$$a$", ["SELECT é$$a$", "$a$$a$"]),        # a name é$$a$
    ("SELECT $é$;$é$", ["SELECT $é$;$é$"]),                     # a tag é
    ("SELECT '';'x'$a$;$a$", ["SELECT ''", "'x'$a$;$a$"]),      # a string, then $a$...
])
def test_split_reads_numbers_before_quotes_as_duckdb(sql: str, statements: list[str]) -> None:
    assert _sqltext.split_statements(sql) == statements
    assert _duckdb_statements(sql) == statements


@hypothesis.settings(max_examples=500, deadline=None)
@hypothesis.given(st.lists(st.sampled_from(
    ["1", "12", "E", "e", "a", "_", ".", " ", "\n", ";", "'", '"', "\\", "$", "$$", "$a$",
     "$1", "--", "/*", "*/", "x", "5e", "0x", "+", "é", "$é$"]), max_size=16).map("".join))
def test_split_cuts_where_duckdb_reads_semicolons(sql: str) -> None:
    """Random text of quotes, dollars, E, digits, ``;`` and comment marks: the statements
    the server runs one by one are the pieces between the ``;`` DuckDB's tokenizer reads
    (text DuckDB reads as holding an unterminated string or comment is refused whole)."""
    try:
        got = _sqltext.split_statements(sql)
    except ServerError:
        return  # (an unterminated string, name or comment: 42601, nothing runs)
    hypothesis.assume("CREATE" not in sql.upper())
    assert got == _duckdb_statements(sql)

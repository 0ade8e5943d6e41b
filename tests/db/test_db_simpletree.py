"""A simple query's parse tree, written out without asking DuckDB (``._simpletree``), is
exactly the tree DuckDB's ``json_serialize_sql`` gives, or there is none."""

import hashlib
import json

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db import _database, _simpletree
from cryptdisk.db._columns import parser_cursor


@pytest.fixture(scope="module")
def parser():
    return parser_cursor(duckdb.connect())


def _duckdb_tree(parser, sql):
    tree = json.loads(parser.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()[0])
    return None if tree.get("error") else tree


def test_the_builder_agrees_with_this_duckdb(parser):
    assert _simpletree.agrees(parser.execute(
        "SELECT json_serialize_sql(?)", [_simpletree.probe_text()]).fetchone()[0])
    assert _simpletree._build(_simpletree.probe_text()) is not None


def test_no_keyword_of_duckdb_is_taken_for_a_name(parser):
    words = {r[0].lower() for r in parser.execute(
        "SELECT keyword_name FROM duckdb_keywords()").fetchall()}
    assert words <= _simpletree.KEYWORDS
    assert _simpletree.simple_tree("SELECT year FROM t") is None
    assert _simpletree.simple_tree("SELECT a FROM t ORDER BY value") is None


_space = st.sampled_from([" ", "  ", "\n", "\t", " \r\n "])
_gap = st.one_of(st.just(""), _space)
_name = st.one_of(st.sampled_from(["a", "B", "c_int", "Col_9", "_x", "count", "sum", "t",
                                   "year", "select", "order", "between", "asc", "limit"]),
                  st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,6}", fullmatch=True))
_int = st.one_of(st.integers(-10**40, 10**40).map(str),
                 st.from_regex(r"-?0[0-9]{1,3}", fullmatch=True))
_kw = st.sampled_from


@st.composite
def _query(draw):
    """Text of the builder's forms (with names that may be keywords, numbers that may be
    too long, spaces of any kind): whatever it builds must be DuckDB's tree."""
    sp = lambda: draw(_space)  # noqa: E731
    gap = lambda: draw(_gap)  # noqa: E731

    def item():
        kind = draw(st.integers(0, 2))
        if kind == 0:
            return draw(_name)
        fn = draw(st.sampled_from(["count", "COUNT", "Sum", "avg", "MIN", "max"]))
        arg = "*" if kind == 1 and fn.lower() == "count" else draw(_name)
        return f"{fn}{gap()}({gap()}{arg}{gap()})"

    def cond():
        if draw(st.booleans()):
            return (f"{draw(_name)}{sp()}{draw(_kw(['BETWEEN', 'between']))}{sp()}"
                    f"{draw(_int)}{sp()}{draw(_kw(['AND', 'and']))}{sp()}{draw(_int)}")
        return f"{draw(_name)}{sp()}{draw(_kw(['=', '<', '<=', '>', '>=']))}{sp()}{draw(_int)}"

    items = [item() for _ in range(draw(st.integers(1, 4)))]
    sql = f"{gap()}{draw(_kw(['SELECT', 'select', 'Select']))}{sp()}"
    sql += "".join(f"{gap()},{gap()}" * (i > 0) + it for i, it in enumerate(items))
    sql += f"{sp()}{draw(_kw(['FROM', 'from']))}{sp()}{draw(_name)}"
    conds = [cond() for _ in range(draw(st.integers(0, 3)))]
    if conds:
        sql += f"{sp()}WHERE{sp()}" + f"{sp()}AND{sp()}".join(conds)
    if draw(st.booleans()):
        direction = draw(_kw(["", " ASC", " desc", " Desc"]))
        sql += f"{sp()}ORDER{sp()}BY{sp()}{draw(_name)}{direction}"
    if draw(st.booleans()):
        sql += f"{sp()}LIMIT{sp()}{draw(_int)}"
    return sql + gap()


@settings(max_examples=400, deadline=None)
@given(_query())
def test_a_simple_query_gets_exactly_duckdbs_tree(parser, sql):
    built = _simpletree.simple_tree(sql)
    if built is not None:
        assert built == _duckdb_tree(parser, sql)


def test_the_benchmark_shapes_are_built():
    for sql in ("SELECT c_int, c_str, c_float FROM t_enc WHERE c_int = 2454886589211414944",
                "SELECT c_int, c_str, c_float FROM t_enc ORDER BY c_int LIMIT 10",
                "SELECT count(*), sum(c_float) FROM t_enc WHERE c_int BETWEEN -5 AND 7",
                "select a, B from T where a >= 1 and b < -2 order by a desc limit 0"):
        assert _simpletree.simple_tree(sql) is not None


_noise = st.text(alphabet=st.sampled_from(list("abt SELECTFROMWHERE,()*=<>-09;.'\"\n/")),
                 max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_noise, _query().flatmap(lambda q: st.tuples(
    st.just(q), st.integers(0, len(q)), _noise)).map(lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:])))
def test_any_text_gets_duckdbs_tree_or_none(parser, sql):
    built = _simpletree.simple_tree(sql)
    if built is not None:
        assert built == _duckdb_tree(parser, sql)


@pytest.mark.parametrize("sql", [
    "SELECT a FROM t WHERE a=1", "SELECT a b FROM t", "SELECT t.a FROM t", "SELECT a FROM t;",
    'SELECT "a" FROM t', "SELECT a FROM t -- c", "SELECT a FROM t WHERE a = 5a",
    "SELECT a FROM t WHERE a = - 5", "SELECT a FROM t LIMIT -1", "SELECT DISTINCT a FROM t",
    "SELECT a FROM t AS x", "SELECT a FROM t WHERE a = 1 OR a = 2", "SELECT * FROM t",
    "SELECT a FROM t WHERE a = 'x'", "SELECT a FROM t WHERE a = 1.5", "SELECT ä FROM t",
    "SELECT a FROM t WHERE a <> 1", "SELECT a FROM t ORDER BY a NULLS FIRST",
])
def test_anything_else_is_left_to_duckdb(sql):
    assert _simpletree.simple_tree(sql) is None


def test_a_builder_that_disagrees_with_duckdb_is_not_used(monkeypatch):
    monkeypatch.setattr(_simpletree, "_AGREES", None)
    assert not _simpletree.agrees('{"error": false, "statements": []}')
    assert _simpletree.simple_tree("SELECT a FROM t") is None
    monkeypatch.setattr(_simpletree, "_AGREES", None)
    assert not _simpletree.agrees(None)
    assert _simpletree.simple_tree("SELECT a FROM t") is None


def test_a_simple_query_runs_no_statement_for_its_tree(tmp_path, monkeypatch):
    """The point, range and top-N queries on the key answer without DuckDB's parse tree
    (``json_serialize_sql``), with the answers they had, the first too (while the table's
    part opens); another query still asks it."""
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, s VARCHAR, f DOUBLE) ORDER BY k")
        db.sql("INSERT INTO t SELECT i, md5(i::VARCHAR), i / 3 FROM range(5000) r(i)")
    asked = []
    real = _database.parse_tree_text

    def counted(con, sql):
        asked.append(sql)
        return real(con, sql)

    monkeypatch.setattr(_database, "parse_tree_text", counted)
    with cryptdisk.connect(tmp_path / "db", read_only=True) as db:
        # the first opens the table's part meanwhile (see _parse_tree)
        assert db.query("SELECT k FROM t WHERE k = 1") == [(1,)]
        assert asked == []
        assert db.query("SELECT k, s, f FROM t WHERE k = 4321") == [
            (4321, hashlib.md5(b"4321").hexdigest(), 4321 / 3)]
        assert db.query("SELECT count(*), sum(k) FROM t WHERE k BETWEEN 10 AND 19") == [
            (10, 145)]
        assert db.query("SELECT k FROM t ORDER BY k DESC LIMIT 2") == [(4999,), (4998,)]
        assert asked == []
        assert db.query("SELECT k FROM t WHERE k = 7 OR k = 9 ORDER BY k") == [(7,), (9,)]
        assert len(asked) == 1


def test_connect_decides_whether_the_builder_is_used(tmp_path):
    """The check of the builder against DuckDB runs in connect (its first JSON function
    parses the probe), so a process's first simple statement, such as a cold
    ``count(*)`` the catalog answers, does not pay for it (it took 1.0 -> 2.2 ms)."""
    import subprocess
    import sys

    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
        db.sql("INSERT INTO t SELECT * FROM range(10)")
    script = (
        "import sys\n"
        "import cryptdisk\n"
        "from cryptdisk.db import _simpletree as st\n"
        "print(st._AGREES)\n"
        "db = cryptdisk.connect(sys.argv[1], read_only=True)\n"
        "print(st._AGREES)\n"
        "asked = []\n"
        "real = db._parser.execute\n"
        "class Spy:\n"
        "    def __getattr__(self, n):\n"
        "        return getattr(db._parser, n)\n"
        "    def execute(self, sql, *a):\n"
        "        asked.append(sql)\n"
        "        return real(sql, *a)\n"
        "db._parser = Spy()\n"
        "print(db.query('SELECT count(*) FROM t'), asked)\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "db")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["None", "True", "[(10,)] []"]

"""Column pruning never changes a result: queries give what DuckDB gives on native tables."""

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.db import _sql

from .dbhelpers import SCHEMA, gen

QUERIES = [
    "SELECT count(*) FROM t",
    "SELECT avg(c_float) FROM t",
    "SELECT * FROM t ORDER BY c_int LIMIT 3",
    "SELECT t.* FROM t ORDER BY 1 LIMIT 2",
    "SELECT COLUMNS('c_.*') FROM t ORDER BY c_int LIMIT 2",
    "SELECT x.c_str FROM t AS x WHERE x.c_int = 7",
    "SELECT t FROM t ORDER BY c_int LIMIT 1",  # the whole row as a struct
    "SELECT c_int + 1 AS y FROM t ORDER BY y DESC LIMIT 1",
    "WITH a AS (SELECT c_int AS k FROM t) SELECT count(*) FROM a JOIN u ON a.k = u.c_int",
    "SELECT count(*) FROM t JOIN u USING (c_int)",
    "SELECT count(*) FROM t NATURAL JOIN u",
    "SELECT count(*) FROM t NATURAL JOIN v",  # v matches t on c_int only
    "SELECT count(*) FROM t JOIN v USING (c_int, c_str)",
    "SELECT list_transform([c_int], lambda x: x * 2)[1] FROM t ORDER BY c_int LIMIT 1",
    "SELECT c_int, row_number() OVER (ORDER BY c_float DESC) FROM t ORDER BY 2 LIMIT 2",
    "SELECT (SELECT max(c_str) FROM u) AS m, min(c_float) FROM t",
    "SELECT count(*) FROM t WHERE c_int IN (SELECT c_int FROM u WHERE c_float > 1)",
    "SELECT C_INT FROM T ORDER BY 1 LIMIT 1",
    "SELECT \"c_int\" FROM \"t\" ORDER BY 1 LIMIT 1",
    "SELECT max(length(c_str)) FROM t GROUP BY ALL",
    "DESCRIBE t",
    "SELECT #2 FROM t ORDER BY #1 LIMIT 2",
    "SELECT count(*) FROM t POSITIONAL JOIN v",
    "SELECT * EXCLUDE (c_str) FROM t ORDER BY c_int LIMIT 2",
    "SELECT max(c_int) FROM (UNPIVOT (SELECT c_int, c_float FROM t) ON c_float INTO NAME k "
    "VALUE val)",
    "SELECT count(*) FROM t ASOF JOIN v ON t.c_int >= v.c_int",
    "SELECT sum(c_int) FILTER (WHERE c_str > 'a') FROM t",
    "SUMMARIZE SELECT c_int FROM t",
    "SELECT * FROM t EXCEPT SELECT * FROM u ORDER BY 1 LIMIT 2",
    "PIVOT (SELECT c_int % 2 AS k, c_float FROM t) ON k USING sum(c_float)",
    "SELECT substr(c_str, 1, 1) AS p, count(*) FROM t GROUP BY p ORDER BY p",
    "SELECT c_float * 2 AS d FROM t ORDER BY d DESC LIMIT 2",
    "SELECT c_int AS x FROM t x ORDER BY x LIMIT 1",  # x: a column alias and the table's
    "WITH u AS (SELECT c_int AS u FROM t) SELECT u FROM u ORDER BY 1 LIMIT 1",
    "WITH w AS (SELECT c_str AS s FROM t) SELECT max(s) FROM w",
]


@pytest.mark.parametrize(("query", "columns"), [
    ("SELECT substr(c_str, 1, 2) AS p, count(*) FROM t GROUP BY p ORDER BY p", ["c_str"]),
    ("SELECT c_float * 2 AS d FROM t ORDER BY d LIMIT 3", ["c_float"]),
    ("WITH w AS (SELECT c_str AS s FROM t) SELECT max(s) FROM w", ["c_str"]),
    ("SELECT c_int AS x FROM t x ORDER BY x", None),  # x may be the whole row: every column
    ("SELECT c_int AS t FROM t ORDER BY t", None),
    ("SELECT p FROM t", None),  # no such alias: unclear, every column
])
def test_select_list_aliases_load_only_what_their_expressions_read(query, columns):
    from cryptdisk.db._columns import needed_columns, parse_tree

    tree = parse_tree(duckdb.connect(), query)
    assert needed_columns(tree, {"t": ["c_int", "c_str", "c_float"]}) == {"t": columns}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    import cryptdisk

    db = cryptdisk.connect(tmp_path_factory.mktemp("c") / "db")
    native = duckdb.connect()
    for name, n, start in (("t", 300, 0), ("u", 100, 250)):
        db.sql(f"CREATE TABLE {name} {SCHEMA}")
        db.sql(f"INSERT INTO {name} " + gen(n, start))
        native.execute(f"CREATE TABLE {name} {SCHEMA}")
        native.execute(f"INSERT INTO {name} " + gen(n, start))
    other = "SELECT i::BIGINT, md5((i + 1)::VARCHAR), i / 7 FROM range(100) r(i)"
    db.sql(f"CREATE TABLE v {SCHEMA}; INSERT INTO v {other}")
    native.execute(f"CREATE TABLE v {SCHEMA}; INSERT INTO v {other}")
    yield db, native
    db.close()
    native.close()


@pytest.mark.parametrize("query", QUERIES)
def test_same_result_as_native_duckdb(pair, query):
    db, native = pair
    db.cache.clear()  # start cold, so pruning decides what gets loaded
    got = db.sql(query).to_pylist()
    want = native.sql(query).to_arrow_table().to_pylist()
    assert got == want


statement = st.text(alphabet=st.sampled_from(list("ab ';\"-/*\n")), max_size=40)


@settings(deadline=None)
@given(st.lists(statement, max_size=5))
def test_split_statements_never_loses_text_outside_separators(parts):
    joined = ";".join(parts)
    pieces = _sql.split_statements(joined)
    assert all(p.strip() == p and p for p in pieces)
    assert len(pieces) <= joined.count(";") + 1


def test_has_where_sees_the_keyword_not_literals_or_names():
    from cryptdisk.db._columns import has_where

    assert has_where("SELECT a FROM t WHERE a = 1")
    assert has_where("select a from t\nwhere(a = 1)")
    assert not has_where("SELECT 'where' FROM t")
    assert not has_where('SELECT "where" FROM t -- where\n')
    assert not has_where("SELECT nowhere, where_x FROM t /* WHERE */")


def _walked(node):
    """The parse-tree walk as a recursive generator: every dict, each before what it
    holds, in the order of the values."""
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walked(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walked(v)


class _Dict(dict):
    pass


class _Text(str):
    pass


_LEAVES = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | \
    st.text(max_size=3) | st.builds(_Text, st.text(max_size=3))
_TREES = st.recursive(_LEAVES, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
    st.text(max_size=2), kids, max_size=4) | st.builds(_Dict, st.dictionaries(
        st.text(max_size=2), kids, max_size=3)), max_leaves=30)


@settings(deadline=None)
@given(_TREES)
def test_the_tree_walk_visits_every_dict_in_order(tree):
    """Every dict (a subclass too) under a list or dict of any nesting, parent first, in
    the order of the values: the same nodes, the same objects, as a recursive walk."""
    from cryptdisk.db._columns import _walk

    got, want = _walk(tree), list(_walked(tree))
    assert len(got) == len(want) and all(a is b for a, b in zip(got, want, strict=True))


def test_a_shared_tree_is_walked_once_until_forgotten():
    """After share_walks, walks of the tree's statements share one list, walked on first
    use; forget_walks (what changes a tree in place calls it) makes the next walk see the
    tree as it is; another tree, or a part of one, is walked on its own."""
    from cryptdisk.db import _columns

    tree = {"statements": [{"node": {"class": "A"}}]}
    _columns.share_walks(tree)
    try:
        first = _columns._walk(tree["statements"])
        assert _columns._walk(tree["statements"]) is first
        assert [n.get("class") for n in first] == [None, "A"]
        tree["statements"][0]["more"] = {"class": "B"}
        _columns.forget_walks()
        assert [n.get("class") for n in _columns._walk(tree["statements"])] == [None, "A", "B"]
        part = tree["statements"][0]["node"]
        assert _columns._walk(part) == [part] and _columns._walk(part) is not first
    finally:
        _columns.share_walks(None)


def test_a_statement_walks_its_parse_tree_once(db, monkeypatch):
    """The analyses of a statement (which tables, columns, filters, top-N, min/max, count)
    walk its tree's statements once between them."""
    from cryptdisk.db import _columns

    db.sql(f"CREATE TABLE t {SCHEMA} ORDER BY c_int")
    db.sql("INSERT INTO t " + gen(100))
    roots = []
    walk_all = _columns._walk_all
    # (the nodes themselves, kept: an id of a temporary list walked may be reused)
    monkeypatch.setattr(_columns, "_walk_all", lambda node: (roots.append(node),
                                                             walk_all(node))[1])
    for sql in ("SELECT c_int, c_str FROM t WHERE c_int = 7",
                "SELECT c_int FROM t ORDER BY c_int LIMIT 2",
                "SELECT count(*), sum(c_float) FROM t WHERE c_int BETWEEN 3 AND 9"):
        roots.clear()
        assert db.query(sql)
        assert roots and max(sum(x is r for x in roots) for r in roots) == 1, sql

"""min/max of the key from the catalog: the answer and the schema (names, types) are
DuckDB's for any spelling, the first time a statement runs as on its repeats."""

import duckdb
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
from cryptdisk.db._columns import parse_tree, parser_cursor
from cryptdisk.db._database import Database
from cryptdisk.db._pushdown import key_extremes_names


def _q(name):
    return '"' + name.replace('"', '""') + '"'


#: key names: plain, with capitals, keywords (reserved or not, any case), names DuckDB
#: must quote, and names starting with ``_`` or a digit (quoted or not: not certain here)
_KEYS = ["k", "Key_2", "year", "Name", "select", "Weird Col", 'a"b', "é", "_a", "_4", "9x"]
_TYPES = ["BIGINT", "INTEGER", "SMALLINT", "TINYINT", "UBIGINT", "UINTEGER"]
_ALIASES = ["lo", "Hi", "x y", "select", '"q"', "min(k)", "count_star()"]


def _reference(key, typ, inserts):
    ref = duckdb.connect()
    ref.execute(f"CREATE TABLE t ({_q(key)} {typ}, s VARCHAR)")
    for rows in inserts:
        for v in rows:
            ref.execute("INSERT INTO t VALUES (?, 'x')", [v])
    return ref


@st.composite
def _select(draw, key):
    """A select list of min/max of ``key``, spelled as a user might, and its FROM."""
    qualifier = draw(st.sampled_from(["", "t.", "T.", '"t".', "x.", "X."]))
    items = []
    for _ in range(draw(st.integers(1, 3))):
        function = draw(st.sampled_from(["min", "max", "MIN", "Max"]))
        spelled = draw(st.sampled_from([_q(key), key])) if key.isidentifier() and \
            key.isascii() else _q(key)
        item = f"{function}({qualifier}{spelled}{draw(st.sampled_from(['', ' ']))})"
        alias = draw(st.one_of(st.just(""), st.sampled_from(_ALIASES)))
        if alias:
            written = alias if alias.isidentifier() and alias.isascii() and \
                alias not in ("select",) else _q(alias)
            item += draw(st.sampled_from([" AS ", " "])) + written
        items.append(item)
    source = "t AS x" if qualifier.lower() == "x." else draw(st.sampled_from(
        ["t", "T", '"t"', "t AS x", "t AS x(a)"]))  # (t.k, then k, unknown to DuckDB)
    return f"SELECT {', '.join(items)} FROM {source}"


_INSERTS = st.lists(st.lists(st.one_of(st.none(), st.integers(0, 120)), max_size=30),
                    max_size=3)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), key=st.sampled_from(_KEYS), typ=st.sampled_from(_TYPES),
       inserts=_INSERTS, plain=st.booleans())
def test_first_and_repeated_runs_equal_duckdb(tmp_path_factory, data, key, typ, inserts,
                                             plain):
    """Empty tables, empty inserts (no part), parts of NULL keys only (no key range) and
    NULLs beside keys; on the first run of a statement the catalog answers whenever the
    parse tree names the columns for certain and every part with rows has a range."""
    policy = "plain" if plain else "default"
    with cryptdisk.connect(tmp_path_factory.mktemp("x") / "db") as db:
        db.sql(f"CREATE TABLE t ({_q(key)} {typ}, s VARCHAR) ORDER BY {_q(key)} "
               f"SETTINGS storage_policy = '{policy}'")
        for rows in inserts:
            db.insert("t", pa.table({key: pa.array(rows, db.arrow_schema(db.table("t"))
                                                   .field(0).type),
                                     "s": pa.array(["x"] * len(rows), pa.string())}))
        ref = _reference(key, typ, inserts)
        sql = data.draw(_select(key))
        try:
            want = ref.sql(sql).to_arrow_table()
        except duckdb.Error:
            with pytest.raises(cryptdisk.errors.DatabaseError):
                db.sql(sql)
            return
        tree = parse_tree(parser_cursor(ref), sql)
        certain = key_extremes_names(tree) is not None
        ranged = all(any(v is not None for v in rows) for rows in inserts if rows)
        answered = []
        extremes = db._key_extremes
        db._key_extremes = lambda *a: answered.append(got := extremes(*a)) or got
        for run in range(2):
            answered.clear()
            got = db.sql(sql)
            assert got.schema == want.schema, (sql, run)
            assert got.to_pylist() == want.to_pylist(), (sql, run)
            from_catalog = any(a is not None for a in answered)
            assert from_catalog == (ranged and (certain or run > 0)), (sql, run)


def test_the_first_run_reads_no_part_and_runs_no_duckdb_query(db, monkeypatch):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t SELECT i * 5 - 40, 'a' FROM range(1000) r(i)")
    db.sql("INSERT INTO t SELECT NULL, 'n' UNION ALL SELECT 7, 'b'")
    ran = []
    monkeypatch.setattr(db, "con", _Recorder(db.con, ran))
    got = db.sql("SELECT min(k) AS lo, MAX(t.k), max(k) FROM t")
    assert got.to_pylist() == [{"lo": -40, "max(t.k)": 4955, "max(k)": 4955}]
    assert got.schema == pa.schema([("lo", pa.int64()), ("max(t.k)", pa.int64()),
                                    ("max(k)", pa.int64())])
    assert ran == []  # no statement on DuckDB's connection: neither the query nor a bind
    assert db.last_scans["t"]["parts_from_index"] == 2


class _Recorder:
    """A DuckDB connection that records the statements run on it."""

    def __init__(self, con, ran):
        self._con, self._ran = con, ran

    def __getattr__(self, name):
        return getattr(self._con, name)

    def sql(self, query, *args, **kwargs):
        self._ran.append(query)
        return self._con.sql(query, *args, **kwargs)

    def execute(self, query, *args, **kwargs):
        self._ran.append(query)
        return self._con.execute(query, *args, **kwargs)


@pytest.mark.parametrize("how", ["execute", "reader"])
def test_after_a_set_the_names_are_duckdbs_under_it(db, how):
    """A SET may change how DuckDB folds identifiers (``preserve_identifier_case``): after
    one, DuckDB names the result (the catalog still answers the repeats), for min/max of
    the key and for an aliased count(*)."""
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t SELECT i, 'a' FROM range(10) r(i)")
    ref = duckdb.connect()
    ref.execute("CREATE TABLE t AS SELECT i::BIGINT AS k, 'a' AS s FROM range(10) r(i)")
    setting = "SET preserve_identifier_case = 'lowercase'"
    ref.execute(setting)
    runner = db
    if how == "reader":
        runner = db.reader()
        runner.configure(setting)
    else:
        db.execute(setting)
    for sql in ("SELECT MIN(K) AS Lo, max(k) FROM t", "SELECT count(*) AS N FROM t",
                "SELECT count(*) FROM t"):
        want = ref.sql(sql).to_arrow_table()
        for _ in range(2):
            got = runner.execute(sql)
            assert got.schema == want.schema, sql
            assert got.to_pylist() == want.to_pylist(), sql
    assert want.schema.names == ["count_star()"]


def test_after_truncate_and_inserts_of_null_keys_the_answer_follows(db):
    """A TRUNCATE leaves no part (NULLs), a part of NULL keys only has no key range (its
    rows are read), later parts widen the range, a DELETE narrows it."""
    db.sql("CREATE TABLE t (k INTEGER, s VARCHAR) ORDER BY k")
    sql = "SELECT max(k) AS hi, min(k) FROM t"
    assert db.query(sql) == [(None, None)]
    db.sql("INSERT INTO t VALUES (3, 'a'), (9, 'b')")
    assert db.query(sql) == [(9, 3)]
    db.sql("TRUNCATE TABLE t")
    assert db.query(sql) == [(None, None)]
    assert db.last_scans["t"]["parts_from_index"] == 0
    db.sql("INSERT INTO t VALUES (NULL, 'n')")
    assert db.query(sql) == [(None, None)]
    assert db.last_scans["t"]["row_groups_read"] == 1  # no range: read
    db.sql("INSERT INTO t VALUES (-2, 'c'), (NULL, 'd')")
    assert db.query(sql) == [(-2, -2)]
    db.sql("INSERT INTO t VALUES (5, 'e')")
    assert db.query(sql) == [(5, -2)]
    db.sql("DELETE FROM t WHERE k = -2")  # its part rewritten with the key range it has now
    assert db.query(sql) == [(5, 5)]
    assert db.last_scans["t"]["row_groups_read"] == 2  # the parts of NULL keys only
    got = db.sql(sql)
    assert got.schema == pa.schema([("hi", pa.int32()), ("min(k)", pa.int32())])


@pytest.mark.parametrize("name", ["k", "Key", "year", "Weird Col", 'a"b', "é", "select"])
def test_names_equal_duckdbs_for_any_key_name(name):
    """What :func:`key_extremes_names` gives is what DuckDB names the columns, keywords
    and names DuckDB quotes included."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t ({_q(name)} BIGINT)")
    parser = parser_cursor(con)
    for sql in (f"SELECT min({_q(name)}), max(t.{_q(name)}) FROM t",
                f"SELECT MIN({_q(name)}) AS {_q(name)}, Max(x.{_q(name)}) FROM t x"):
        names = key_extremes_names(parse_tree(parser, sql))
        assert names == con.sql(sql).columns, sql


def test_names_not_certain_are_none():
    parser = parser_cursor(duckdb.connect())
    for sql in ('SELECT min("_4") FROM t', 'SELECT max("9x") FROM t',
                "SELECT min(t.k) AS a FROM t AS x", "SELECT min(k) AS a FROM t AS x(a)",
                "SELECT min(y.k) FROM t",
                "SELECT min(k ORDER BY k) FROM t", "SELECT min(k) FILTER (WHERE k > 0) FROM t",
                "SELECT main.min(k) FROM t", "SELECT min(1) FROM t"):
        assert key_extremes_names(parse_tree(parser, sql)) is None, sql
    assert key_extremes_names(parse_tree(parser, 'SELECT min("_4") AS a FROM t')) == ["a"]


def test_a_database_counts_no_set_until_one_runs(db):
    assert db._settings_untouched
    db.sql("CREATE TABLE t (k BIGINT) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1)")
    db.query("SELECT min(k) FROM t")
    assert db._settings_untouched  # cryptdisk's statements and queries change nothing
    db.execute("SET threads = 2")  # changes no column's name nor min/max
    assert db._settings_untouched
    db.execute("SET preserve_identifier_case = false")
    assert not db._settings_untouched
    assert isinstance(db, Database)


def test_count_star_with_column_aliases_is_duckdbs(db):
    db.sql("CREATE TABLE t (k BIGINT, s VARCHAR) ORDER BY k")
    db.sql("INSERT INTO t VALUES (1, 'a')")
    with pytest.raises(cryptdisk.errors.DatabaseError, match="columns available"):
        db.sql("SELECT count(*) FROM t AS x(a, b, c)")
    for aliases in ("a", "a, b"):
        assert db.query(f"SELECT count(*) FROM t AS x({aliases})") == [(1,)]
        assert db.last_scans["t"]["row_groups_read"] == 0

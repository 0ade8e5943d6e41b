"""Field functions computed by the embedded database's scan (derived columns) and cached.

Every pushed query is compared with the same query computed by DuckDB's UDFs and
macros (``db.push_field_functions = False``): same rows, same column names, same
errors. ``db.last_scans`` names the derived view when the scan computed a function.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cryptdisk
import cryptdisk.fields
from cryptdisk.errors import DatabaseError
from cryptdisk.fields import (
    FieldKeys,
    encrypt,
    encrypt_deterministic,
    fpe_encrypt,
    tokenize,
)
from tests.fields.conftest import CONFIG

PUSHED = "__cd_derived_0"


@pytest.fixture
def db(tmp_path, config):
    d = cryptdisk.connect(tmp_path / "db", config=config)
    d.sql("CREATE TABLE t (n BIGINT, s VARCHAR, g VARCHAR, d VARCHAR, f VARCHAR, "
          "k VARCHAR, p VARCHAR)")
    yield d
    d.close()


def _load(db, config, texts: list[str | None], pans: list[str | None]) -> None:
    keys = FieldKeys.from_config(config)
    cards = keys["cards"]
    db.sql("TRUNCATE t")
    data = pa.table({
        "n": pa.array(range(len(texts)), pa.int64()),
        "s": pa.array(texts, pa.string()),
        "g": encrypt(pa.array(texts, pa.string()), cards, output="base64"),
        "d": encrypt_deterministic(pa.array(texts, pa.string()), cards, output="base64"),
        "f": fpe_encrypt(pa.array(pans, pa.string()), cards, "pan"),
        "k": tokenize(pa.array(pans, pa.string()), cards, "pan", keep_first=6, keep_last=4,
                      luhn=False),
        "p": pa.array(pans, pa.string()),
    })
    db.insert("t", data)


QUERIES = [
    "SELECT n, decrypt(g, 'cards') FROM t ORDER BY n",
    "SELECT n, decrypt_deterministic(d, 'cards') AS v FROM t ORDER BY n",
    "SELECT n, fpe_decrypt(f, 'cards', col := 'pan') FROM t ORDER BY n",
    "SELECT n, detokenize(k, 'cards', col := 'pan', keep_first := 6, keep_last := 4) "
    "FROM t ORDER BY n",
    "SELECT n, mask_full(s), mask_last4(s), mask_email(s), mask_null(s), "
    "mask_hash(s, 'cards') FROM t ORDER BY n",
    "SELECT n, mask_last4(fpe_decrypt(f, 'cards', col := 'pan')) AS m FROM t ORDER BY n",
    "SELECT n, fpe_decrypt(f, 'cards', col := 'pan', version := 1), detokenize(k, 'cards', "
    "col := 'pan', keep_first := 6, keep_last := 4, version := 1) FROM t ORDER BY n",
    "SELECT n, mask_hash(s, 'cards', version := 1) AS h FROM t ORDER BY n",
    "SELECT sum(length(decrypt(g, 'cards'))), count(mask_last4(s)) FROM t",
    "SELECT mask_last4(decrypt(g, 'cards')) AS m, count(*) AS c FROM t "
    "GROUP BY mask_last4(decrypt(g, 'cards')) ORDER BY c DESC, m NULLS FIRST",
    "SELECT x.n, decrypt(x.g, 'cards') FROM t AS x ORDER BY x.n",
    "SELECT * FROM (SELECT n, decrypt(g, 'cards') AS v FROM t) WHERE v IS NOT NULL "
    "ORDER BY n",
    # a plain WHERE on stored columns: the scan keeps the rows first
    "SELECT n, decrypt(g, 'cards') AS v FROM t WHERE n > 2 AND s IS NOT NULL ORDER BY n",
    "SELECT x.n, mask_last4(x.s) FROM t AS x WHERE x.s LIKE '%a%' OR n IN (1, 3) "
    "ORDER BY x.n",
    "SELECT count(*) AS c, max(fpe_decrypt(f, 'cards', col := 'pan')) AS m FROM t "
    "WHERE NOT (n BETWEEN 2 AND 5) AND length(p) = 16",
]


def _both(db, sql):
    db.push_field_functions = True
    pushed = db.sql(sql)
    scans = set(db.last_scans)
    db.push_field_functions = False
    try:
        plain = db.sql(sql)
    finally:
        db.push_field_functions = True
    return pushed, plain, scans


TEXT = st.one_of(st.none(), st.text(max_size=24))
PAN = st.one_of(st.none(), st.text("0123456789", min_size=16, max_size=16))


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(TEXT, PAN), min_size=1, max_size=40))
def test_pushed_functions_give_what_duckdb_gives(db, config, rows):
    _load(db, config, [r[0] for r in rows], [r[1] for r in rows])
    for sql in QUERIES:
        for _repeat in range(3):  # computed, then kept in the cache, then served from it
            pushed, plain, scans = _both(db, sql)
            assert PUSHED in scans, sql
            assert pushed.schema.names == plain.schema.names, sql
            assert pushed.to_pylist() == plain.to_pylist(), sql


@pytest.mark.parametrize("sql", [
    # a WHERE the scan does not apply itself (arithmetic, a function of the values, a
    # volatile function, a subquery): the scan would compute the rows it drops
    "SELECT decrypt(g, 'cards') FROM t WHERE n + 1 > 1",
    "SELECT decrypt(g, 'cards') FROM t WHERE decrypt(g, 'cards') <> 'a'",
    "SELECT decrypt(g, 'cards') FROM t WHERE random() < 2",
    "SELECT decrypt(g, 'cards') FROM t WHERE n IN (SELECT 1)",
    "SELECT * , decrypt(g, 'cards') FROM t",  # * would show the derived column
    "SELECT decrypt(g, 'cards') FROM t JOIN t AS u USING (n)",
    "SELECT decrypt(g, n::VARCHAR) FROM t",  # not a constant key
    "SELECT decrypt(g, 'nokey') FROM t",  # unknown key: DuckDB's error
    "SELECT decrypt(n::VARCHAR, 'cards') FROM t",  # not a stored text column
    "SELECT list_transform([g], x -> decrypt(x, 'cards')) FROM t",
    "WITH t AS (SELECT mask_last4(s) AS g FROM main.t) SELECT decrypt(g, 'cards') FROM t",
])
def test_calls_the_scan_does_not_take_stay_with_duckdb(db, config, sql):
    _load(db, config, ["a", None], ["4111111111111111", None])
    try:
        db.sql(sql)
    except Exception:  # some are errors either way; none is pushed
        pass
    assert not any(name.startswith("__cd_derived") for name in db.last_scans), sql


def test_a_cte_named_like_the_table_is_not_the_table(db, config):
    """decrypt over a CTE's masked column must not become decrypt of the stored one."""
    _load(db, config, ["secret"], ["4111111111111111"])
    with pytest.raises(Exception, match=r"(?i)format|base64|ciphertext"):
        db.sql("WITH t AS (SELECT mask_full(g) AS g FROM t) SELECT decrypt(g, 'cards') FROM t")


def test_a_value_the_scan_cannot_compute_runs_again_in_duckdb(db, config):
    """A tampered value: the same error as without the scan; a CASE that never evaluates
    it: the same answer."""
    _load(db, config, ["one", "two"], [None, None])
    db.sql("CREATE TABLE u (ok BOOLEAN, g VARCHAR)")
    good = db.sql("SELECT g FROM t ORDER BY n").column(0).to_pylist()
    bad = good[1][:-4] + ("AAAA" if not good[1].endswith("AAAA") else "BBBB")
    db.sql(f"INSERT INTO u VALUES (true, '{good[0]}'), (false, '{bad}')")
    errors = []
    for push in (True, False):
        db.push_field_functions = push
        with pytest.raises(DatabaseError, match="does not authenticate") as exc:
            db.sql("SELECT decrypt(g, 'cards') FROM u")
        errors.append((type(exc.value), str(exc.value)))
    assert errors[0] == errors[1]
    db.push_field_functions = True
    sql = "SELECT CASE WHEN ok THEN decrypt(g, 'cards') END AS v FROM u ORDER BY ok"
    pushed, plain, _scans = _both(db, sql)
    assert pushed.to_pylist() == plain.to_pylist() == [{"v": None}, {"v": "one"}]


def test_a_where_keeps_its_rows_before_the_scan_computes(db, config):
    """Rows first: a value in a row the WHERE drops is never decrypted (a tampered one
    there fails nothing), and the cache holds values for the kept rows only."""
    _load(db, config, ["one", "two", "three"], [None, None, None])
    db.sql("CREATE TABLE u (n BIGINT, g VARCHAR)")
    good = db.sql("SELECT g FROM t ORDER BY n").column(0).to_pylist()
    bad = good[1][:-4] + ("AAAA" if not good[1].endswith("AAAA") else "BBBB")
    db.sql(f"INSERT INTO u VALUES (0, '{good[0]}'), (1, '{bad}'), (2, '{good[2]}')")
    sql = "SELECT n, decrypt(g, 'cards') AS v FROM u WHERE n <> 1 ORDER BY n"
    for _ in range(3):  # computed, kept, served from the cache
        assert db.query(sql) == [(0, "one"), (2, "three")]
        assert PUSHED in db.last_scans  # not run again by DuckDB: nothing failed
    sizes = [len(arr) for (_part, col), (arr, *_rest) in db.cache._items.items()
             if col.startswith("g\x00decrypt")]
    assert sizes == [2]
    with pytest.raises(DatabaseError, match="does not authenticate"):
        db.sql("SELECT decrypt(g, 'cards') FROM u WHERE n >= 1")


def test_a_where_on_the_key_skips_parts_in_the_scan_that_computes(tmp_path, config):
    """The WHERE's conditions on the sorting key skip parts and row groups as for a
    stored table: a point query decrypts its one part's rows."""
    with cryptdisk.connect(tmp_path / "db", config=config) as db:
        db.sql("CREATE TABLE s (n BIGINT, g VARCHAR) ORDER BY n")
        for lo in (0, 100, 200):
            db.sql(f"INSERT INTO s SELECT range, encrypt('v' || range, 'cards') "
                   f"FROM range({lo}, {lo + 100})")
        for _ in range(2):
            assert db.query("SELECT n, decrypt(g, 'cards') FROM s WHERE n = 150 "
                            "AND g IS NOT NULL") == [(150, "v150")]
            assert db.last_scans[PUSHED]["parts_skipped"] == 2


ROWS = "is_role_in_session('auditor') OR r <> 'EU'"


def test_a_row_access_policy_is_applied_by_the_scan_rows_first(tmp_path, config):
    """A table with a row access policy and a decrypting masking policy: a role's
    query is computed by the scan, from the rows its policy keeps only (a hidden row's
    ciphertext is never decrypted, nor cached), with the mask its policy gives."""
    from cryptdisk.server import AnalyticalEngine, PolicyStore

    engine = AnalyticalEngine(tmp_path / "db", config)
    try:
        engine.db.sql("CREATE TABLE notes (secret VARCHAR, r VARCHAR, n INTEGER)")
        engine.db.sql("INSERT INTO notes SELECT encrypt('call me ' || range, 'cards'), "
                      "CASE WHEN range % 3 = 0 THEN 'EU' ELSE 'US' END, range FROM range(30)")
        # a hidden row's value does not decrypt: computing it would fail the scan
        engine.db.sql("INSERT INTO notes VALUES ('AQAAAAEAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
                      "AAAAAAA=', 'EU', 99)")
        store = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
        for sql in (f"CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> {NOTE}",
                    "ALTER TABLE notes ALTER COLUMN secret SET MASKING POLICY m",
                    f"CREATE ROW ACCESS POLICY p AS (r VARCHAR) RETURNS BOOLEAN -> {ROWS}",
                    "ALTER TABLE notes ADD ROW ACCESS POLICY p ON (r)"):
            store.handle(None, sql)
    finally:
        engine.close()
    queries = ["SELECT n, secret FROM notes ORDER BY n",
               "SELECT secret, r FROM notes WHERE n < 10 ORDER BY secret",
               "SELECT count(*), max(secret) FROM notes"]
    with cryptdisk.connect(tmp_path / "db", config, role="analyst") as db:
        for sql in queries:
            db.push_field_functions = False
            want = db.query(sql)
            db.push_field_functions = True
            for _ in range(3):
                assert db.query(sql) == want, sql
                assert PUSHED in db.last_scans, sql
        rows = db.query(queries[0])
        assert [n for n, _v in rows] == [i for i in range(30) if i % 3]  # no EU row
        assert all(set(v) == {"*"} for _n, v in rows)  # masked
        sizes = sorted(len(arr) for (_part, col), (arr, *_rest) in db.cache._items.items()
                       if col.startswith("secret\x00"))
        # the 20 US rows of the first part, masked, and none of the second part's one
        # row (99, EU): the EU rows were never computed
        assert sizes == [0, 20]
    with cryptdisk.connect(tmp_path / "db", config, role="auditor") as db:
        for push in (True, False):  # the auditor's rows include 99: it decrypts it
            db.push_field_functions = push
            with pytest.raises(DatabaseError, match="does not authenticate"):
                db.query(queries[0])
        assert db.query("SELECT n, secret FROM notes WHERE n = 1") == [(1, "call me 1")]


def _derived_entries(db) -> int:
    return sum(1 for _part, col in db.cache._items if "\x00" in col)


def _warm(db, sql, times=3):
    for _ in range(times):
        got = db.sql(sql)
    return got


def test_derived_columns_are_cached_and_served_like_stored_ones(db, config):
    _load(db, config, [f"v{i}" for i in range(100)], ["4111111111111111"] * 100)
    sql = "SELECT decrypt(g, 'cards') AS v FROM t ORDER BY n"
    first = db.sql(sql)
    assert _derived_entries(db) == 0  # a first offer is remembered, not kept
    db.sql(sql)
    assert _derived_entries(db) == 1 and db.cache.derived_size() > 0
    hits = db.cache.hits
    assert _warm(db, sql, 1) == first
    assert db.cache.hits > hits
    # another function, or the same one under other arguments, is another entry
    _warm(db, "SELECT mask_last4(decrypt(g, 'cards')) FROM t", 2)
    _warm(db, "SELECT fpe_decrypt(f, 'cards', col := 'pan') FROM t", 2)
    _warm(db, "SELECT fpe_decrypt(f, 'cards', col := 'other') FROM t", 2)
    assert _derived_entries(db) == 4
    db.close()
    assert db.cache.derived_size() == 0 and len(db.cache) == 0


def test_changing_or_dropping_a_field_key_drops_cached_values(db, config, monkeypatch):
    _load(db, config, ["alpha", "beta"], [None, None])
    sql = "SELECT decrypt(g, 'cards') AS v FROM t ORDER BY n"
    want = _warm(db, sql).to_pylist()
    assert _derived_entries(db) == 1
    # rotation: a second version of the key (new values use it, old ones stay readable)
    text = config.read_text().replace(
        "[fields.keys.cards]\nhex =", "[[fields.keys.cards]]\nid = 1\nhex =")
    text += '\n[[fields.keys.cards]]\nid = 2\nhex = "' + "77" * 32 + '"\n'
    config.write_text(text)
    db.sql("SELECT 1")
    assert _derived_entries(db) == 0
    assert _warm(db, sql).to_pylist() == want  # computed again under the new key set
    assert _derived_entries(db) == 1
    # removal: the key is gone from the config: nothing cached answers for it
    config.write_text(CONFIG.replace("[fields.keys.cards]", "[fields.keys.gone]"))
    with pytest.raises(DatabaseError, match=r"no field key named .cards."):
        db.sql(sql)
    assert _derived_entries(db) == 0


def test_rotating_the_at_rest_keys_drops_cached_values(db, config):
    _load(db, config, ["alpha", "beta"], [None, None])
    _warm(db, "SELECT mask_last4(s) FROM t")
    assert _derived_entries(db) == 1
    db.rotate_keys()
    assert _derived_entries(db) == 0
    db.sql("SELECT 1")
    _warm(db, "SELECT mask_last4(s) FROM t")
    db.reencrypt()
    assert _derived_entries(db) == 0


NOTE = "CASE WHEN is_role_in_session('auditor') THEN decrypt(v, 'cards') ELSE mask_full(v) END"


def test_a_role_gets_its_policy_branch_from_the_scan_and_the_cache(tmp_path, config):
    """A masking policy's rewrite is computed by the scan: the analyst's cache holds the
    mask of the column, the auditor's its decryption; both equal DuckDB's answers."""
    from cryptdisk.server import AnalyticalEngine, PolicyStore

    engine = AnalyticalEngine(tmp_path / "db", config)
    try:
        engine.db.sql("CREATE TABLE notes (secret VARCHAR, n INTEGER)")
        engine.db.sql("INSERT INTO notes SELECT encrypt('call me ' || range, 'cards'), range "
                      "FROM range(50)")
        store = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
        for sql in (f"CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> {NOTE}",
                    "ALTER TABLE notes ALTER COLUMN secret SET MASKING POLICY m"):
            store.handle(None, sql)
    finally:
        engine.close()
    sql = "SELECT secret FROM notes ORDER BY n"
    for role, function in (("analyst", "mask_full"), ("auditor", "decrypt")):
        with cryptdisk.connect(tmp_path / "db", config, role=role) as db:
            db.push_field_functions = False
            want = db.query(sql)
            db.push_field_functions = True
            for _ in range(3):
                assert db.query(sql) == want
                assert PUSHED in db.last_scans
            tags = [col.split("\x00")[1:] for _part, col in db.cache._items if "\x00" in col]
            assert tags and all(len(t) == 1 and t[0].startswith(function) for t in tags)
        if role == "analyst":
            assert all(set(v) == {"*"} for (v,) in want)
        else:
            assert want == [(f"call me {i}",) for i in range(50)]


@pytest.mark.parametrize("sql", [
    "SELECT decrypt(secret, 'cards') FROM notes",
    "SELECT decrypt(x.secret, 'cards') FROM notes AS x",
    "WITH c AS (SELECT secret FROM notes) SELECT decrypt(secret, 'cards') FROM c",
    "SELECT decrypt(secret, 'cards') FROM (SELECT * FROM notes)",
    "SELECT (SELECT max(decrypt(secret, 'cards')) FROM notes) AS v",
])
def test_a_role_cannot_have_the_scan_decrypt_around_its_policy(tmp_path, config, sql):
    """A role's own decrypt over the column reads the masked values (the rewrite put the
    policy's subquery under it): it fails as before, and nothing decrypted is computed."""
    from cryptdisk.server import AnalyticalEngine, PolicyStore

    engine = AnalyticalEngine(tmp_path / "db", config)
    try:
        engine.db.sql("CREATE TABLE notes (secret VARCHAR, n INTEGER)")
        engine.db.sql("INSERT INTO notes SELECT encrypt('call me', 'cards'), 1")
        store = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
        for stmt in (f"CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> {NOTE}",
                     "ALTER TABLE notes ALTER COLUMN secret SET MASKING POLICY m"):
            store.handle(None, stmt)
    finally:
        engine.close()
    with cryptdisk.connect(tmp_path / "db", config, role="analyst") as db:
        for _ in range(2):
            with pytest.raises(DatabaseError, match=r"(?i)base64|format|ciphertext"):
                db.sql(sql)
        assert not any("decrypt" in col for _part, col in db.cache._items)


def test_the_scan_decrypts_a_blob_column(db, config):
    """Ciphertexts stored as bytes (BLOB): the scan computes decrypt and
    decrypt_deterministic over them (as it does over base64 text), and gives what DuckDB
    gives; a mask of a BLOB is DuckDB's (an error), never computed by the scan."""
    cards = FieldKeys.from_config(config)["cards"]
    texts = ["a", None, "", "ü" * 30, "4111111111111111"]
    db.sql("CREATE TABLE b (n BIGINT, g BLOB, d BLOB)")
    db.insert("b", pa.table({"n": pa.array(range(len(texts)), pa.int64()),
                             "g": encrypt(pa.array(texts, pa.string()), cards),
                             "d": encrypt_deterministic(pa.array(texts, pa.string()), cards)}))
    for sql in ("SELECT n, decrypt(g, 'cards') AS v FROM b ORDER BY n",
                "SELECT n, decrypt_deterministic(d, 'cards') FROM b WHERE n > 0 ORDER BY n",
                "SELECT mask_last4(decrypt(g, 'cards')) AS m FROM b ORDER BY n",
                "SELECT sum(length(decrypt(g, 'cards'))) AS s FROM b"):
        for _repeat in range(3):  # computed, then kept in the cache, then served from it
            pushed, plain, scans = _both(db, sql)
            assert PUSHED in scans, sql
            assert pushed.schema.names == plain.schema.names, sql
            assert pushed.to_pylist() == plain.to_pylist(), sql
    assert db.sql("SELECT decrypt(g, 'cards') AS v FROM b ORDER BY n").column(0).to_pylist() \
        == texts
    with pytest.raises(DatabaseError, match="mask_last4"):
        db.sql("SELECT mask_last4(g) FROM b")
    assert not any(name.startswith("__cd_derived") for name in db.last_scans)

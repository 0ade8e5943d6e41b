"""The field functions in the embedded database's SQL, keyed by [fields.keys] names."""

import duckdb
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cryptdisk
import cryptdisk.fields
from cryptdisk.errors import ConfigError, DatabaseError
from cryptdisk.fields import (
    FieldKeys,
    fpe_encrypt,
    mask_email,
    mask_full,
    mask_last4,
    mask_null,
    register_sql_functions,
)
from tests.fields.conftest import CARDS


@pytest.fixture
def db(tmp_path, config):
    d = cryptdisk.connect(tmp_path / "db", config=config)
    d.sql("CREATE TABLE t (pan VARCHAR, email VARCHAR)")
    d.sql("INSERT INTO t VALUES ('4111111111111111', 'alice@example.com'), "
          "('5500005555555559', 'bob@example.org'), (NULL, NULL)")
    yield d
    d.close()


def _rows(db, sql):
    return db.sql(sql).to_pylist()


def test_field_keys_come_from_the_config(config):
    keys = FieldKeys.from_config(config)
    assert sorted(keys) == ["cards", "emails"]
    assert keys["emails"].ids == [3]
    assert CARDS not in repr(keys["cards"]) and "ff" not in repr(keys["cards"])
    with pytest.raises(TypeError, match="pickled"):
        import pickle
        pickle.dumps(keys["cards"])


def test_round_trips_in_sql(db):
    rows = _rows(db, """SELECT decrypt(encrypt(pan, 'cards'), 'cards') AS g,
        decrypt_deterministic(encrypt_deterministic(email, 'emails'), 'emails') AS d,
        fpe_decrypt(fpe_encrypt(pan, 'cards', col := 'pan'), 'cards', col := 'pan') AS f,
        detokenize(tokenize(pan, 'cards', keep_first := 6, keep_last := 4, luhn := true),
                   'cards', keep_first := 6, keep_last := 4, luhn := true) AS t,
        pan, email FROM t""")
    for row in rows:
        assert row["g"] == row["f"] == row["t"] == row["pan"]
        assert row["d"] == row["email"]


def test_sql_matches_the_python_api(db, config):
    keys = FieldKeys.from_config(config)
    sql = [r["e"] for r in _rows(db, "SELECT fpe_encrypt(pan, 'cards', col := 'pan') AS e "
                                     "FROM t ORDER BY pan")]
    py = fpe_encrypt(["4111111111111111", "5500005555555559", None], keys["cards"], "pan")
    assert sql == py.to_pylist()


def test_randomised_encryption_is_not_folded_into_one_value(db):
    rows = _rows(db, "SELECT encrypt('same', 'cards') AS e FROM range(5)")
    assert len({r["e"] for r in rows}) == 5


def test_deterministic_ciphertexts_group_and_join(db):
    db.sql("CREATE TABLE e (c VARCHAR)")
    for _ in range(2):
        db.sql("INSERT INTO e SELECT encrypt_deterministic(email, 'emails') FROM t")
    rows = _rows(db, "SELECT count(*) AS n FROM e WHERE c IS NOT NULL GROUP BY c")
    assert [r["n"] for r in rows] == [2, 2]


def test_masks_in_sql(db):
    rows = _rows(db, "SELECT mask_full(pan) AS f, mask_last4(pan) AS l, mask_email(email) AS m, "
                     "mask_null(email) AS z, mask_hash(email, 'emails') AS h FROM t "
                     "WHERE pan IS NOT NULL ORDER BY pan")
    assert rows[0]["f"] == "*" * 16 and rows[0]["l"] == "*" * 12 + "1111"
    assert rows[0]["m"] == "****@example.com" and rows[0]["z"] is None
    assert len(rows[0]["h"]) == 64


_MASKS = {"mask_full": mask_full, "mask_last4": mask_last4, "mask_email": mask_email,
          "mask_null": mask_null}
_MASK_CON = duckdb.connect()
register_sql_functions(_MASK_CON, FieldKeys())
_TEXT = st.text(st.characters(codec="utf-8"), max_size=80)  # code points of 1-4 bytes


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.none(), _TEXT, st.sampled_from(
    ["", "@", "a@", "@b", "a@b@c.org", "1234", "12345", "\u00e9\u00e9\u00e9\u00e9\u00e9",
     "e\u0301xyz", "\U0001f468\u200d\U0001f469\u200d\U0001f467", "*" * 70, "x" * 69])),
    max_size=20))
def test_sql_masks_equal_the_python_ones(values):
    """The SQL masks are DuckDB macros; they give the Python API's (C's) text exactly."""
    arr = pa.array(values, pa.string())
    _MASK_CON.register("vals", pa.table({"i": pa.array(range(len(values)), pa.int64()),
                                         "v": arr}))
    try:
        for name, fn in _MASKS.items():
            got = [r[0] for r in _MASK_CON.execute(
                f"SELECT {name}(v) FROM vals ORDER BY i").fetchall()]
            assert got == fn(arr).to_pylist(), name
    finally:
        _MASK_CON.unregister("vals")


def test_keyless_masks_are_duckdb_macros(db):
    """No Python per batch: DuckDB runs them itself, on all its threads."""
    kinds = dict(db.con.execute(
        "SELECT function_name, function_type FROM duckdb_functions() "
        "WHERE function_name IN ('mask_full', 'mask_last4', 'mask_email', 'mask_null', "
        "'mask_hash', '__cd_mask_hash')").fetchall())
    assert kinds == {"mask_full": "macro", "mask_last4": "macro", "mask_email": "macro",
                     "mask_null": "macro", "mask_hash": "macro", "__cd_mask_hash": "scalar"}
    with pytest.raises(DatabaseError, match="mask_last4"):  # VARCHAR only, as documented
        db.sql("SELECT mask_last4(42)")


def test_errors_name_the_problem_and_never_the_key(db):
    secrets = (CARDS, "ab" * 32, CARDS.upper())
    with pytest.raises(DatabaseError, match="no field key named 'nope'") as info:
        db.sql("SELECT encrypt(pan, 'nope') FROM t")
    messages = [str(info.value)]
    blob = _rows(db, "SELECT encrypt('secret', 'cards') AS e")[0]["e"]
    tampered = blob[:-4] + ("AAAA" if blob[-4:] != "AAAA" else "BBBB")
    with pytest.raises(DatabaseError, match="does not authenticate") as info:
        db.sql(f"SELECT decrypt('{tampered}', 'cards')")
    messages.append(str(info.value))
    with pytest.raises(DatabaseError, match="outside the alphabet") as info:
        db.sql("SELECT fpe_encrypt(email, 'cards') FROM t")
    messages.append(str(info.value))
    plan = db.sql("EXPLAIN SELECT encrypt(pan, 'cards') FROM t")
    messages.append(str(plan))
    for text in messages:
        assert not any(s in text or s in text.lower() for s in secrets)


def test_a_bad_fields_section_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[fields.keys.cards]\nhex = \"00\"\n")
    with pytest.raises(cryptdisk.errors.InvalidKeyError):
        FieldKeys.from_config(path)
    path.write_text("[fields]\nkyes = 1\n")
    with pytest.raises(ConfigError, match="kyes"):
        FieldKeys.from_config(path)


def test_cryptdisk_sql_has_the_functions(tmp_path, config):
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(cryptdisk.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": src}
    run = subprocess.run(
        [sys.executable, "-m", "cryptdisk", "sql", str(tmp_path / "cli.db"), "--create", "-c",
         str(config), "-q",
         "SELECT fpe_decrypt(fpe_encrypt('4111111111111111', 'cards'), 'cards') AS p, "
         "mask_email('bob@example.org') AS m", "--format", "csv"],
        capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "4111111111111111,****@example.org"
    bad = subprocess.run(
        [sys.executable, "-m", "cryptdisk", "sql", str(tmp_path / "cli.db"), "-c", str(config),
         "-q", "SELECT decrypt('AQAAAAE=', 'cards')"],
        capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 1 and "not a cryptdisk field ciphertext" in bad.stderr
    assert CARDS not in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize("names", [["cards", "emails"], ["cards", "cardz"],
                                   ["cards"] * 3000 + ["cardsx"], ["cards", "cards", "card"]])
def test_a_key_name_that_varies_by_row_is_refused(db, names):
    """Key names must be constants: a batch mixing names is an error, never an encryption
    under the first row's key (a NULL name gives NULL: DuckDB skips such rows)."""
    db.con.register("names", pa.table({"k": pa.array(names, pa.string())}))
    try:
        with pytest.raises(DatabaseError, match="same for every row"):
            db.sql("SELECT encrypt_deterministic('x', k) FROM names")
    finally:
        db.con.unregister("names")
    assert _rows(db, "SELECT count(encrypt_deterministic(pan, 'cards')) AS n FROM t") == \
        [{"n": 2}]


def test_decrypting_takes_a_ciphertext_as_text_or_as_bytes(db, config):
    """decrypt / decrypt_deterministic of a BLOB (the Python API's default output) give
    what they give of the base64 text; a tampered BLOB fails as a tampered text does."""
    cards = FieldKeys.from_config(config)["cards"]
    values = pa.array(["4111111111111111", None, "", "é"], pa.string())
    db.sql("CREATE TABLE b (n INTEGER, g BLOB, d BLOB, gt VARCHAR)")
    db.insert("b", pa.table({
        "n": pa.array(range(4), pa.int32()),
        "g": cryptdisk.fields.encrypt(values, cards),
        "d": cryptdisk.fields.encrypt_deterministic(values, cards),
        "gt": cryptdisk.fields.encrypt(values, cards, output="base64")}))
    for push in (True, False):
        db.push_field_functions = push
        got = _rows(db, "SELECT decrypt(g, 'cards') AS g, decrypt_deterministic(d, 'cards') "
                        "AS d, decrypt(gt, 'cards') AS t FROM b ORDER BY n")
        assert got == [{"g": v, "d": v, "t": v} for v in values.to_pylist()]
    assert _rows(db, "SELECT decrypt(from_base64(encrypt('x', 'cards')), 'cards') AS v, "
                     "decrypt(NULL, 'cards') AS z") == [{"v": "x", "z": None}]
    good = bytes(cryptdisk.fields.encrypt(pa.array(["secret"]), cards)[0].as_py())
    bad = good[:-1] + bytes([good[-1] ^ 1])
    db.insert("b", pa.table({"n": pa.array([9], pa.int32()), "g": pa.array([bad]),
                             "d": pa.nulls(1, pa.binary()), "gt": pa.nulls(1, pa.string())}))
    errors = []
    for push in (True, False):
        db.push_field_functions = push
        with pytest.raises(DatabaseError, match="row 0 of DuckDB's batch of values does "
                           "not authenticate") as info:
            db.sql("SELECT decrypt(g, 'cards') FROM b WHERE n = 9")
        errors.append(str(info.value))
        assert "secret" not in errors[-1] and CARDS not in errors[-1]
    assert errors[0] == errors[1]
    with pytest.raises(DatabaseError, match="mask_last4"):  # a mask takes text only
        db.sql("SELECT mask_last4(g) FROM b")


@pytest.mark.parametrize("push", [True, False])
def test_an_error_in_sql_says_its_row_is_of_duckdbs_batch(db, push):
    """DuckDB hands a function 2,048 values at a time: the row an error names is one of
    that batch, which the message says (row 5000 of the table is row 904 of its batch)."""
    db.push_field_functions = push
    db.sql("CREATE TABLE many (id BIGINT, c VARCHAR)")
    db.sql("INSERT INTO many SELECT i, CASE WHEN i = 5000 THEN 'AQAAAAE=' ELSE "
           "encrypt('x', 'cards') END FROM range(10000) r(i)")
    with pytest.raises(DatabaseError, match=r"FormatError: row 904 of DuckDB's batch of "
                       r"values: not a cryptdisk field ciphertext \(5 bytes\)"):
        db.sql("SELECT decrypt(c, 'cards') FROM many")
    with pytest.raises(DatabaseError, match=r"fpe_encrypt: row 0 of DuckDB's batch of "
                       "values has a character outside the alphabet"):
        db.sql("SELECT fpe_encrypt('12345x', 'cards')")


def test_an_ff1_option_given_as_null_is_refused(db):
    # the FF1 functions take NULL arguments (a missing version := is NULL); an option
    # that is NULL is an error, not a NULL result
    for sql in ("SELECT fpe_encrypt('4111111111111111', 'cards', col := NULL)",
                "SELECT tokenize('4111111111111111', 'cards', keep_last := NULL)"):
        with pytest.raises(DatabaseError, match="must not be NULL"):
            db.sql(sql)
    assert db.sql("SELECT fpe_decrypt(fpe_encrypt('4111111111111111', 'cards', "
                  "version := NULL), 'cards', version := 1) AS v").to_pylist() == [
        {"v": "4111111111111111"}]
    assert db.sql("SELECT fpe_encrypt(NULL, 'cards') AS v").to_pylist() == [{"v": None}]


@pytest.mark.parametrize("push", [True, False], ids=["in the scan", "as DuckDB UDFs"])
def test_fpe_decrypt_cannot_detokenize_through_a_token_column_name(db, push):
    """fpe_decrypt(v, k, col := 'token:pan') used the tweak of pan's tokens: it read
    them in clear outside tokenize's options and policies. It is refused."""
    db.push_field_functions = push
    db.sql("CREATE TABLE tok AS SELECT tokenize(pan, 'cards', col := 'pan') AS t FROM t")
    for sql in ("SELECT fpe_decrypt(t, 'cards', col := 'token:pan') FROM tok",
                "SELECT fpe_encrypt(t, 'cards', col := 'token:pan') FROM tok"):
        with pytest.raises(DatabaseError, match="column name beginning with 'token:' is "
                           "refused") as info:
            db.sql(sql)
        assert "4111111111111111" not in str(info.value) and CARDS not in str(info.value)
    assert sorted(db.sql("SELECT detokenize(t, 'cards', col := 'pan') AS v FROM tok")
                  .to_pylist(), key=str) == [
        {"v": "4111111111111111"}, {"v": "5500005555555559"}, {"v": None}]

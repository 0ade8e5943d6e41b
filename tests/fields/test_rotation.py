"""Rotating a field key of a table, as docs/fields-rotation.md tells an operator.

A table holds values encrypted (base64 text), deterministically encrypted (bytes in a
BLOB column) and FF1-encrypted under version 1 of ``cards``. The operator adds version 2:
FF1 values and tokens name no version, so from then on every FF1 call on ``cards`` must
say which (``version :=``) and a call without it is an error, never other digits. The
operator copies the rows re-encrypted into a new table, counts the values per key
version, puts the rows back, and removes version 1: every value still reads as it did.
"""

import pyarrow as pa
import pytest

import cryptdisk
import cryptdisk.fields  # the SQL functions
from cryptdisk.errors import DatabaseError
from tests.fields.conftest import CARDS, CONFIG

CARDS_2 = "0f" * 32
V1 = f'[fields.keys.cards]\nhex = "{CARDS}"\n'
V1_V2 = (f'[[fields.keys.cards]]\nid = 1\nhex = "{CARDS}"\n'
         f'[[fields.keys.cards]]\nid = 2\nhex = "{CARDS_2}"\n')
V2 = f'[[fields.keys.cards]]\nid = 2\nhex = "{CARDS_2}"\n'
ROWS = [(1, "Zoë 名前", "a@x.org", "4111111111111111"), (2, "", "a@x.org", "5500005555555559"),
        (3, None, None, None)]
COLUMNS = "(id BIGINT, name VARCHAR, email BLOB, pan VARCHAR)"
KEY_IDS = ("SELECT ('0x' || hex(from_base64(name)[2:5]))::BIGINT AS name_key, "
           "('0x' || hex(email[2:5]))::BIGINT AS email_key FROM {t} ORDER BY id")
CLEAR = ("SELECT id, decrypt(name, 'cards') AS name, decrypt_deterministic(email, 'cards') "
         "AS email, fpe_decrypt(pan, 'cards', col := 'pan'{version}) AS pan FROM {t} "
         "ORDER BY id")


def _keys(path, fields):
    path.write_text(CONFIG.split("[fields.keys.cards]")[0] + fields)


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config = tmp_path / "cryptdisk.toml"
    _keys(config, V1)
    db = cryptdisk.connect(tmp_path / "db", str(config))
    db.sql(f"CREATE TABLE customers {COLUMNS}")
    for row in ROWS:
        values = ", ".join("NULL" if v is None else repr(v) for v in row)
        db.sql("INSERT INTO customers SELECT v.id, encrypt(v.n, 'cards'), "
               "from_base64(encrypt_deterministic(v.e, 'cards')), "
               f"fpe_encrypt(v.p, 'cards', col := 'pan') FROM (VALUES ({values})) "
               "AS v(id, n, e, p)")
    yield db, config
    db.close()


def _clear(db, table="customers", version=None):
    sql = CLEAR.format(t=table, version="" if version is None else f", version := {version}")
    return [tuple(r.values()) for r in db.sql(sql).to_pylist()]


@pytest.mark.parametrize("push", [True, False], ids=["in the scan", "as DuckDB UDFs"])
def test_rotating_a_field_key_re_encrypts_every_value(setup, push):
    db, config = setup
    db.push_field_functions = push
    assert _clear(db) == ROWS  # one version: FF1 needs no version
    before = db.sql("SELECT pan FROM customers ORDER BY id").to_pylist()
    _keys(config, V1_V2)  # the next statement reads the changed config
    # FF1 output names no version: without one, an error says which versions there are
    with pytest.raises(DatabaseError) as info:
        _clear(db)
    text = str(info.value)
    assert "fpe_decrypt: field key 'cards' has versions 1, 2" in text
    assert "version := 2 in SQL" in text
    assert CARDS not in text.lower() and CARDS_2 not in text.lower()
    # AES-GCM and AES-SIV values name their version; FF1 reads with the one named
    assert _clear(db, version=1) == ROWS
    db.sql("SELECT fpe_decrypt(pan, 'cards', col := 'pan', version := 1) FROM customers")
    assert ("__cd_derived_0" in db.last_scans) is push  # the table's scan computes it
    with pytest.raises(DatabaseError, match="has no version 3"):
        _clear(db, version=3)

    db.sql(f"CREATE TABLE customers_new {COLUMNS}")
    db.sql("INSERT INTO customers_new SELECT id, encrypt(decrypt(name, 'cards'), 'cards'), "
           "from_base64(encrypt_deterministic(decrypt_deterministic(email, 'cards'), "
           "'cards')), fpe_encrypt(fpe_decrypt(pan, 'cards', col := 'pan', version := 1), "
           "'cards', col := 'pan', version := 2) FROM customers")
    assert db.sql(KEY_IDS.format(t="customers")).to_pylist()[0] == {"name_key": 1,
                                                                    "email_key": 1}
    assert db.sql(KEY_IDS.format(t="customers_new")).to_pylist() == [
        {"name_key": 2, "email_key": 2}, {"name_key": 2, "email_key": 2},
        {"name_key": None, "email_key": None}]
    db.sql("TRUNCATE customers")
    db.sql("INSERT INTO customers SELECT * FROM customers_new")
    db.sql("DROP TABLE customers_new")

    assert _clear(db, version=2) == ROWS
    _keys(config, V2)  # version 1 removed: nothing needs it
    assert _clear(db) == ROWS == _clear(db, version=2)
    with pytest.raises(DatabaseError, match="has no version 1"):
        _clear(db, version=1)
    after = db.sql("SELECT pan FROM customers ORDER BY id").to_pylist()
    assert after[0] != before[0] and len(after[0]["pan"]) == 16
    # deterministic values of one version group together again
    assert db.sql("SELECT count(DISTINCT email) AS n FROM customers").to_pylist() == [{"n": 1}]


def test_deterministic_values_of_two_versions_do_not_match(setup):
    db, config = setup
    _keys(config, V1_V2)
    db.sql("INSERT INTO customers SELECT 4, NULL, from_base64(encrypt_deterministic("
           "'a@x.org', 'cards')), NULL")
    # one clear value, two ciphertexts: equality on ciphertext finds the new one only
    assert db.sql("SELECT count(DISTINCT email) AS n, count(DISTINCT "
                  "decrypt_deterministic(email, 'cards')) AS clear FROM customers "
                  "WHERE email IS NOT NULL").to_pylist() == [{"n": 2, "clear": 1}]
    assert db.sql("SELECT id FROM customers WHERE email = from_base64(encrypt_deterministic("
                  "'a@x.org', 'cards'))").to_pylist() == [{"id": 4}]
    _keys(config, V2)
    with pytest.raises(DatabaseError, match="has no version 1"):
        db.sql("SELECT decrypt_deterministic(email, 'cards') FROM customers")


def test_ff1_and_tokens_of_a_key_with_versions_need_the_version(tmp_path):
    from cryptdisk.errors import FieldError
    from cryptdisk.fields import (
        FieldKey,
        FieldKeys,
        detokenize,
        fpe_decrypt,
        fpe_encrypt,
        parse_rule,
        protect_table,
        tokenize,
    )
    from cryptdisk.keys import Key

    v1 = FieldKey("cards", Key(1, bytes.fromhex(CARDS)))
    both = FieldKey("cards", {1: Key(1, bytes.fromhex(CARDS)),
                              2: Key(2, bytes.fromhex(CARDS_2))})
    pans = ["4111111111111111", None]
    old_ff1 = fpe_encrypt(pans, v1, "pan")
    old_tokens = tokenize(pans, v1, "pan", keep_first=6, keep_last=4, luhn=True)
    for call in (lambda: fpe_encrypt(pans, both, "pan"),
                 lambda: fpe_decrypt(old_ff1, both, "pan"),
                 lambda: tokenize(pans, both, "pan"),
                 lambda: detokenize(old_tokens, both, "pan", keep_first=6, keep_last=4,
                                    luhn=True)):
        with pytest.raises(FieldError, match=r"field key 'cards' has versions 1, 2.*"
                           r"version=2 in Python") as info:
            call()
        assert CARDS not in str(info.value).lower() and CARDS_2 not in str(info.value)
    # the version named gives what that version gave, and the inverse reads it back
    assert fpe_encrypt(pans, both, "pan", version=1) == old_ff1
    assert fpe_decrypt(old_ff1, both, "pan", version=1).to_pylist() == pans
    assert detokenize(old_tokens, both, "pan", keep_first=6, keep_last=4, luhn=True,
                      version=1).to_pylist() == pans
    assert fpe_encrypt(pans, both, "pan", version=2) != old_ff1
    with pytest.raises(TypeError, match="version is a key id"):
        fpe_encrypt(pans, both, "pan", version="1")
    # a protect rule names it too
    keys = FieldKeys({"cards": both})
    table = pa.table({"pan": pans})
    with pytest.raises(FieldError, match="column 'pan': tokenize: field key 'cards' has "
                       "versions 1, 2"):
        protect_table(table, [parse_rule("pan=tokenize:cards,keep_first=6,keep_last=4,"
                                         "luhn=true")], keys)
    done = protect_table(table, [parse_rule("pan=tokenize:cards,keep_first=6,keep_last=4,"
                                            "luhn=true,version=1")], keys)
    assert done.column("pan").combine_chunks() == old_tokens
    with pytest.raises(FieldError, match="version takes a number"):
        parse_rule("pan=fpe_encrypt:cards,version=two")


#: mask_hash("4111111111111111") under version 1 of ``cards``: what it gives before and
#: after a version is added, when the call names version 1
PAN_HASH_V1 = "3623cfc36cc66e2b24fdc998fd537876952c93b9dd0bed32b520aaadca8a501a"


def test_mask_hash_of_a_key_with_versions_needs_the_version():
    from cryptdisk.errors import FieldError, KeyNotFoundError
    from cryptdisk.fields import FieldKey, FieldKeys, mask_hash, parse_rule, protect_table
    from cryptdisk.keys import Key

    v1 = FieldKey("cards", Key(1, bytes.fromhex(CARDS)))
    both = FieldKey("cards", {1: Key(1, bytes.fromhex(CARDS)),
                              2: Key(2, bytes.fromhex(CARDS_2))})
    three = FieldKey("cards", {1: Key(1, bytes.fromhex(CARDS)),
                               2: Key(2, bytes.fromhex(CARDS_2)),
                               3: Key(3, bytes.fromhex("1e" * 32))})
    pans = ["4111111111111111", None]
    # one version: no version needed, the hashes of before
    assert mask_hash(pans, v1).to_pylist() == [PAN_HASH_V1, None]
    assert mask_hash(pans, v1, version=1).to_pylist() == [PAN_HASH_V1, None]
    # several: without a version, an error naming the key, its versions and the way out
    with pytest.raises(FieldError, match=r"mask_hash: field key 'cards' has versions 1, 2"
                       r".*version := 2 in SQL, version=2 in Python") as info:
        mask_hash(pans, both)
    assert CARDS not in str(info.value).lower() and CARDS_2 not in str(info.value)
    # the version named gives the same hashes however many versions the key gets
    assert mask_hash(pans, both, version=1).to_pylist() == [PAN_HASH_V1, None]
    assert mask_hash(pans, three, version=1).to_pylist() == [PAN_HASH_V1, None]
    assert mask_hash(pans, both, version=2).to_pylist()[0] != PAN_HASH_V1
    assert mask_hash(pans, both, version=2) == mask_hash(pans, three, version=2)
    with pytest.raises(KeyNotFoundError, match="field key 'cards' has no version 3"):
        mask_hash(pans, both, version=3)
    with pytest.raises(TypeError, match="version is a key id"):
        mask_hash(pans, both, version="1")
    # a protect rule names it too
    keys = FieldKeys({"cards": both})
    table = pa.table({"pan": pans})
    with pytest.raises(FieldError, match="column 'pan': mask_hash: field key 'cards' has "
                       "versions 1, 2"):
        protect_table(table, [parse_rule("pan=mask_hash:cards")], keys)
    done = protect_table(table, [parse_rule("pan=mask_hash:cards,version=1")], keys)
    assert done.column("pan").to_pylist() == [PAN_HASH_V1, None]
    with pytest.raises(FieldError, match="version takes a number"):
        parse_rule("pan=mask_hash:cards,version=two")


@pytest.mark.parametrize("push", [True, False], ids=["in the scan", "as DuckDB UDFs"])
def test_mask_hash_in_sql_names_its_version(setup, push):
    db, config = setup
    db.push_field_functions = push
    hashes = "SELECT mask_hash(fpe_decrypt(pan, 'cards', col := 'pan'{v}), 'cards'{v}) " \
        "AS h FROM customers ORDER BY id"
    one = [r["h"] for r in db.sql(hashes.format(v="")).to_pylist()]
    assert one[0] == PAN_HASH_V1 and one[2] is None
    assert [r["h"] for r in db.sql(hashes.format(v=", version := 1")).to_pylist()] == one
    _keys(config, V1_V2)
    with pytest.raises(DatabaseError) as info:
        db.sql("SELECT mask_hash(pan, 'cards') FROM customers")
    text = str(info.value)
    assert "mask_hash: field key 'cards' has versions 1, 2" in text
    assert "version := 2 in SQL" in text
    assert CARDS not in text.lower() and CARDS_2 not in text.lower()
    # the hashes of version 1 stay what they were: joins against them still match
    assert [r["h"] for r in db.sql(hashes.format(v=", version := 1")).to_pylist()] == one
    db.sql("SELECT mask_hash(pan, 'cards', version := 1) FROM customers")
    assert ("__cd_derived_0" in db.last_scans) is push  # the table's scan computes it
    assert db.sql("SELECT mask_hash('4111111111111111', 'cards', version := 2) AS h"
                  ).to_pylist()[0]["h"] not in one
    with pytest.raises(DatabaseError, match="has no version 3"):
        db.sql("SELECT mask_hash(pan, 'cards', version := 3) FROM customers")


def test_a_masking_policy_hashing_under_a_named_version_keeps_its_hashes(setup):
    from cryptdisk.server import AnalyticalEngine, PolicyStore

    db, config = setup
    db.close()
    path = config.parent / "db"
    engine = AnalyticalEngine(path, str(config))
    try:
        store = PolicyStore(config.parent / "db.policies", engine.keyring, engine)
        for sql in ("CREATE MASKING POLICY h1 AS (v VARCHAR) RETURNS VARCHAR -> "
                    "mask_hash(fpe_decrypt(v, 'cards', col := 'pan', version := 1), 'cards', "
                    "version := 1)",
                    "CREATE MASKING POLICY h AS (v VARCHAR) RETURNS VARCHAR -> "
                    "mask_hash(v, 'cards')",
                    "ALTER TABLE customers ALTER COLUMN pan SET MASKING POLICY h1",
                    "ALTER TABLE customers ALTER COLUMN name SET MASKING POLICY h"):
            store.handle(None, sql)
    finally:
        engine.close()
    pans = "SELECT pan FROM customers ORDER BY id"
    with cryptdisk.connect(path, str(config), role="analyst") as analyst:
        assert analyst.query(pans)[0] == (PAN_HASH_V1,)
        assert analyst.query("SELECT count(name) FROM customers") == [(2,)]
    _keys(config, V1_V2)
    with cryptdisk.connect(path, str(config), role="analyst") as analyst:
        for push in (True, False):
            analyst.push_field_functions = push
            assert analyst.query(pans)[0] == (PAN_HASH_V1,)  # the same hash as before
            # the policy that names no version stops, it does not change its hashes
            with pytest.raises(DatabaseError, match="mask_hash: field key 'cards' has "
                               "versions 1, 2"):
                analyst.query("SELECT name FROM customers")


def _key_file(path, material_hex, mode=0o600):
    """Replace the key file at ``path`` as a rotation does: a new file renamed over it."""
    import os

    new = path.with_name(path.name + ".new")
    new.write_text(material_hex + "\n")
    new.chmod(mode)
    os.replace(new, path)


@pytest.mark.parametrize("push", [True, False], ids=["in the scan", "as DuckDB UDFs"])
def test_a_replaced_key_file_reaches_an_open_database(tmp_path, monkeypatch, push):
    """A field key read from a key file that another process replaces (the config
    unchanged): the open database's next statement reads the new file, and drops what
    its scan computed under the old material. Before, it kept the old material: a token
    of the new key detokenized to other digits without an error, a ciphertext of it
    failed to authenticate."""
    from cryptdisk.errors import KeyFileError
    from cryptdisk.fields import FieldKeys, encrypt, tokenize

    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config = tmp_path / "cryptdisk.toml"
    key_file = tmp_path / "cards.key"
    _key_file(key_file, CARDS)
    _keys(config, '[fields.keys.cards]\nfile = "cards.key"\n')
    pan = "4111111111111111"
    db = cryptdisk.connect(tmp_path / "db", str(config))
    try:
        db.push_field_functions = push
        old_ct = db.sql(f"SELECT encrypt('{pan}', 'cards') AS c").to_pylist()[0]["c"]
        # what the other process makes under the new material (its own FieldKeys)
        _key_file(key_file, CARDS_2)
        new = FieldKeys.from_config(config)["cards"]
        _key_file(key_file, CARDS)
        token = tokenize([pan], new, "pan", keep_first=6, keep_last=4).to_pylist()[0]
        new_ct = encrypt([pan], new, output="base64").to_pylist()[0]
        db.sql(f"CREATE TABLE t AS SELECT '{token}' AS tok, '{new_ct}' AS c")
        detok = "SELECT detokenize(tok, 'cards', col := 'pan', keep_first := 6, " \
                "keep_last := 4) AS v FROM t"
        assert db.sql(detok).to_pylist() != [{"v": pan}]  # the old key's digits (cached)
        assert ("__cd_derived_0" in db.last_scans) is push
        with pytest.raises(DatabaseError, match="does not authenticate"):
            db.sql("SELECT decrypt(c, 'cards') FROM t")

        _key_file(key_file, CARDS_2)  # the config is not touched
        assert db.sql(detok).to_pylist() == [{"v": pan}]
        assert db.sql("SELECT decrypt(c, 'cards') AS v FROM t").to_pylist() == [{"v": pan}]
        with pytest.raises(DatabaseError, match="does not authenticate"):
            db.sql(f"SELECT decrypt('{old_ct}', 'cards')")

        # a key file the database cannot use fails statements, with its error, until
        # it is fixed; never the old material
        _key_file(key_file, CARDS, mode=0o644)
        with pytest.raises(KeyFileError, match="accessible by group or others") as info:
            db.sql(detok)
        assert CARDS not in str(info.value) and CARDS_2 not in str(info.value)
        with pytest.raises(KeyFileError):
            db.sql("SELECT 1")
        _key_file(key_file, CARDS_2)
        assert db.sql(detok).to_pylist() == [{"v": pan}]
    finally:
        db.close()

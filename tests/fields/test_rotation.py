"""Rotating a field key of a table, as docs/fields.md (Rotating a field key) tells an operator.

A table holds values encrypted (base64 text), deterministically encrypted (bytes in a
BLOB column) and FF1-encrypted under version 1 of ``cards``. The operator adds version 2,
keeps version 1's material under another name for FF1, copies the rows re-encrypted
into a new table, counts the values per key version, puts the rows back, and removes
version 1: every value still reads as it did.
"""

import pytest

import cryptdisk
import cryptdisk.fields  # the SQL functions
from cryptdisk.errors import DatabaseError
from tests.fields.conftest import CARDS, CONFIG

CARDS_2 = "0f" * 32
V1 = f'[fields.keys.cards]\nhex = "{CARDS}"\n'
V1_V2 = (f'[[fields.keys.cards]]\nid = 1\nhex = "{CARDS}"\n'
         f'[[fields.keys.cards]]\nid = 2\nhex = "{CARDS_2}"\n'
         f'[fields.keys.cards_ff1_v1]\nhex = "{CARDS}"\n')
V2 = f'[[fields.keys.cards]]\nid = 2\nhex = "{CARDS_2}"\n'
ROWS = [(1, "Zoë 名前", "a@x.org", "4111111111111111"), (2, "", "a@x.org", "5500005555555559"),
        (3, None, None, None)]
COLUMNS = "(id BIGINT, name VARCHAR, email BLOB, pan VARCHAR)"
KEY_IDS = ("SELECT ('0x' || hex(from_base64(name)[2:5]))::BIGINT AS name_key, "
           "('0x' || hex(email[2:5]))::BIGINT AS email_key FROM {t} ORDER BY id")
CLEAR = ("SELECT id, decrypt(name, 'cards') AS name, decrypt_deterministic(email, 'cards') "
         "AS email, fpe_decrypt(pan, '{ff1}', col := 'pan') AS pan FROM {t} ORDER BY id")


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


def _clear(db, table="customers", ff1="cards"):
    return [tuple(r.values()) for r in db.sql(CLEAR.format(t=table, ff1=ff1)).to_pylist()]


def test_rotating_a_field_key_re_encrypts_every_value(setup):
    db, config = setup
    assert _clear(db) == ROWS
    before = db.sql("SELECT pan FROM customers ORDER BY id").to_pylist()
    _keys(config, V1_V2)  # the next statement reads the changed config
    # AES-GCM and AES-SIV values name their version: they still decrypt
    assert _clear(db, ff1="cards_ff1_v1") == ROWS
    # FF1 output names none: under version 2 it decrypts to other digits, silently
    assert _clear(db)[0][3] != ROWS[0][3]

    db.sql(f"CREATE TABLE customers_new {COLUMNS}")
    db.sql("INSERT INTO customers_new SELECT id, encrypt(decrypt(name, 'cards'), 'cards'), "
           "from_base64(encrypt_deterministic(decrypt_deterministic(email, 'cards'), "
           "'cards')), fpe_encrypt(fpe_decrypt(pan, 'cards_ff1_v1', col := 'pan'), 'cards', "
           "col := 'pan') FROM customers")
    assert db.sql(KEY_IDS.format(t="customers")).to_pylist()[0] == {"name_key": 1,
                                                                    "email_key": 1}
    assert db.sql(KEY_IDS.format(t="customers_new")).to_pylist() == [
        {"name_key": 2, "email_key": 2}, {"name_key": 2, "email_key": 2},
        {"name_key": None, "email_key": None}]
    db.sql("TRUNCATE customers")
    db.sql("INSERT INTO customers SELECT * FROM customers_new")
    db.sql("DROP TABLE customers_new")

    _keys(config, V2)  # version 1 removed: nothing needs it
    assert _clear(db) == ROWS
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

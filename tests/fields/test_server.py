"""The field functions through cryptdisk serve (analytical engine), for a granted user."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

import cryptdisk.fields  # noqa: F401  (what cryptdisk serve imports: the SQL functions)
from cryptdisk.server import AnalyticalEngine
from tests.fields.conftest import CARDS
from tests.server.conftest import certs, start_server  # noqa: F401  (fixtures)


@pytest.fixture
def engine(tmp_path, config):
    return AnalyticalEngine(tmp_path / "db", config)


def _cards_for_bob(srv) -> psycopg.Connection:
    """An admin connection that has made table cards (one FPE-encrypted card number) and user
    bob, who may SELECT it."""
    admin = psycopg.connect(**srv.dsn, autocommit=True)
    try:
        admin.execute("CREATE TABLE cards (pan VARCHAR)")
        admin.execute("INSERT INTO cards SELECT fpe_encrypt('4111111111111111', 'cards')")
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
        admin.execute("GRANT SELECT ON cards TO bob")
    except BaseException:
        admin.close()
        raise
    return admin


def _as_bob(srv) -> psycopg.Connection:
    return psycopg.connect(**{**srv.dsn, "user": "bob", "password": "bob pw"}, autocommit=True)


def test_field_functions_through_the_server(start_server, engine):  # noqa: F811
    srv = start_server(engine)
    with _cards_for_bob(srv) as admin:
        assert admin.execute("SELECT mask_last4(fpe_decrypt(pan, 'cards')) FROM cards"
                             ).fetchone()[0] == "************1111"
        with pytest.raises(psycopg.Error) as info:
            admin.execute("SELECT decrypt(pan, 'cards') FROM cards")
        assert CARDS not in str(info.value) and "not a cryptdisk field ciphertext" in str(
            info.value)
    with _as_bob(srv) as bob:
        stored = bob.execute("SELECT pan FROM cards").fetchone()[0]
        assert stored != "4111111111111111" and len(stored) == 16
        assert bob.execute("SELECT mask_full(pan) FROM cards").fetchone()[0] == "*" * 16


@pytest.mark.parametrize("sql", [
    "SELECT fpe_decrypt(pan, 'cards') FROM cards",
    "SELECT decrypt(encrypt(pan, 'cards'), 'cards') FROM cards",
    "SELECT * FROM cards WHERE pan = fpe_encrypt('4111111111111111', 'cards')",  # guessing
    "SELECT tokenize('4111111111111111', 'cards')",
    "SELECT mask_hash(pan, 'cards') FROM cards",
    "WITH x AS (SELECT detokenize(pan, 'cards') AS p FROM cards) SELECT * FROM x",
    "SELECT (SELECT DECRYPT_DETERMINISTIC(encrypt_deterministic(pan, 'cards'), 'cards')) "
    "FROM cards",
    "SELECT list_transform([pan], lambda v: __cd_fpe_decrypt(v, 'cards', '', 'digits', NULL)) "
    "FROM cards",
    "SELECT __cd_mask_hash(pan, 'cards', NULL) FROM cards",
])
def test_keyed_field_functions_are_for_admins_only(start_server, engine, sql):  # noqa: F811
    srv = start_server(engine)
    with _cards_for_bob(srv) as admin:
        admin.execute(sql)  # an admin may
    with _as_bob(srv) as bob:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="field key"):
            bob.execute(sql)
        assert bob.execute("SELECT mask_last4(pan) FROM cards").fetchone()[0].endswith(
            bob.execute("SELECT right(pan, 4) FROM cards").fetchone()[0])

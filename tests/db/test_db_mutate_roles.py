"""DELETE and UPDATE on a connection with a role: the WHERE and the SET expressions read the
table through its policies as the role's queries do, so a role changes only rows its row
access policy lets it see and cannot probe clear values through a masked column; a role
may not SET a masked column. The stored values of the other columns stay as they were."""

from __future__ import annotations

import pytest

import cryptdisk
import cryptdisk.fields  # (registers the SQL functions the policy bodies call)
from cryptdisk.errors import FieldPolicyError

from .test_db_roles import MASKED, PANS, _col, _policy_statements


@pytest.fixture
def made(tmp_path, monkeypatch):
    from cryptdisk.server import AnalyticalEngine, PolicyStore
    from tests.fields.conftest import CONFIG

    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    config = tmp_path / "cryptdisk.toml"
    config.write_text(CONFIG)
    engine = AnalyticalEngine(tmp_path / "db", config)
    store = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
    engine.db.sql("CREATE TABLE cards (pan VARCHAR, region VARCHAR, n INTEGER)")
    for i, pan in enumerate(PANS):
        engine.db.sql(f"INSERT INTO cards SELECT fpe_encrypt('{pan}', 'cards'), "
                      f"'{['US', 'EU', 'US'][i]}', {i}")
    engine.db.sql("CREATE TABLE notes (secret VARCHAR)")
    for sql in _policy_statements():
        store.handle(None, sql)
    engine.close()
    return tmp_path / "db", config


def _count(result):
    return result.column(0)[0].as_py()


def test_a_role_deletes_only_the_rows_its_policy_lets_it_see(made):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        # refused in effect: the EU row is not the role's to see, so it matches nothing
        assert _count(db.execute("DELETE FROM cards WHERE region = 'EU'")) == 0
        assert _count(db.execute("DELETE FROM cards WHERE n = 1")) == 0
        # permitted: the rows it sees (no WHERE: every row it sees, not the table)
        assert _count(db.execute("DELETE FROM cards WHERE n = 2")) == 1
        assert _count(db.execute("DELETE FROM cards")) == 1
        assert _col(db, "SELECT n FROM cards") == []
    with cryptdisk.connect(path, config, role="auditor") as db:
        assert _col(db, "SELECT pan FROM cards") == [PANS[1]]  # the EU row is still there


def test_a_role_cannot_name_the_row_numbers_a_statement_reads_by(made):
    """A DELETE or UPDATE reads its table with each row's number in its part (``__cd_row``,
    not a column of the table): named in its WHERE or SET it would tell a role where the
    rows it may not see are (``n = __cd_row`` writes 0 and 2: row 1 is hidden)."""
    from cryptdisk.errors import DatabaseError

    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        for sql in ("DELETE FROM cards WHERE __cd_row = 1",
                    "DELETE FROM cards AS c WHERE c.__CD_ROW <> 1",
                    "UPDATE cards SET n = \"__cd_row\"",
                    "UPDATE cards SET n = 5 WHERE n IN (SELECT __cd_row)"):
            with pytest.raises(DatabaseError, match='column "__cd_row" does not exist'):
                db.execute(sql)
        assert _col(db, "SELECT n FROM cards ORDER BY n") == [0, 2]  # nothing changed
        assert _count(db.execute("DELETE FROM cards WHERE region = '__cd_row'")) == 0
    with cryptdisk.connect(path, config) as db:  # (nor a session without a role)
        with pytest.raises(DatabaseError, match='column "__cd_row" does not exist'):
            db.execute("DELETE FROM cards WHERE __cd_row = 1")
        assert _col(db, "SELECT n FROM cards ORDER BY n") == [0, 1, 2]


def test_a_where_on_a_masked_column_sees_what_a_select_sees(made):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        for clear in (PANS[0], PANS[2]):  # a probe of a clear value matches nothing
            assert _count(db.execute(f"DELETE FROM cards WHERE pan = '{clear}'")) == 0
            assert _count(db.execute(f"UPDATE cards SET n = 9 WHERE pan = '{clear}'")) == 0
        assert _count(db.execute(f"UPDATE cards SET n = n + 10 WHERE pan = '{MASKED[0]}'")) == 1
        assert _col(db, "SELECT n FROM cards ORDER BY n") == [2, 10]
    with cryptdisk.connect(path, config, role="auditor") as db:
        # the row's stored card number was kept (not its masked form)
        assert db.query("SELECT pan, n FROM cards ORDER BY n") == [
            (PANS[1], 1), (PANS[2], 2), (PANS[0], 10)]


def test_a_role_may_not_set_a_masked_column(made):
    path, config = made
    for role in ("analyst", "auditor"):  # (even one that reads it in clear)
        with cryptdisk.connect(path, config, role=role) as db:
            for sql in ("UPDATE cards SET pan = 'x'", "UPDATE cards SET PAN = pan WHERE n = 0",
                        "UPDATE cards SET n = 1, pan = NULL"):
                with pytest.raises(FieldPolicyError, match="masking policy") as err:
                    db.execute(sql)
                assert err.value.sqlstate == "42501"
    with cryptdisk.connect(path, config, role="analyst") as db:
        # copying a masked value into another column copies what the role sees
        assert _count(db.execute("UPDATE cards SET region = pan WHERE n = 0")) == 1
    with cryptdisk.connect(path, config) as db:  # no role: the stored values, all of them
        assert db.query("SELECT region FROM cards WHERE n = 0") == [(MASKED[0],)]
        assert _count(db.execute("UPDATE cards SET pan = fpe_encrypt('4000000000000002', "
                                 "'cards') WHERE n = 1")) == 1
    with cryptdisk.connect(path, config, role="auditor") as db:
        assert _col(db, "SELECT pan FROM cards WHERE n = 1") == ["4000000000000002"]


def test_subqueries_of_a_role_read_other_tables_through_their_policies(made):
    path, config = made
    with cryptdisk.connect(path, config, role="analyst") as db:
        db.sql("CREATE TABLE probe (n INTEGER)")
        db.sql("INSERT INTO probe SELECT n FROM cards")  # the rows the role sees: 0, 2
        # a subquery over cards through its policy: the EU row (n = 1) is not there
        assert _count(db.execute("DELETE FROM probe WHERE n IN (SELECT n FROM cards "
                                 "WHERE pan LIKE '%1111')")) == 1
        assert _col(db, "SELECT n FROM probe") == [2]

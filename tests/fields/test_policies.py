"""Masking and row access policies by role through cryptdisk serve (analytical engine).

An admin makes table ``cards`` (card numbers FPE-encrypted, a region), roles
``auditor`` and ``analyst``, a masking policy showing auditors the clear number
and everyone else its last four digits, and a row policy hiding EU rows from
non-auditors; a policy officer holding APPLY POLICY sets them. Then each way
to read the column around the policy returns masked values to an analyst.
"""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import psycopg
import pytest

import cryptdisk.fields  # noqa: F401  (what cryptdisk serve imports: the SQL functions)
from cryptdisk import open as cd_open
from cryptdisk.server import AnalyticalEngine, AuditLog, PolicyStore
from tests.server.conftest import certs, start_server  # noqa: F401  (fixtures)

DENIED = psycopg.errors.InsufficientPrivilege
PANS = ["4111111111111111", "5500005555555559", "340000000000009"]
MASK = "CASE WHEN current_role() IN ('auditor') THEN fpe_decrypt(v, 'cards') " \
    "ELSE mask_last4(fpe_decrypt(v, 'cards')) END"


@pytest.fixture
def engine(tmp_path, config):
    eng = AnalyticalEngine(tmp_path / "db", config)
    eng.policies = PolicyStore(tmp_path / "db.policies", eng.keyring, eng,
                               audit=AuditLog(tmp_path / "db.audit", eng.keyring))
    return eng


def connect(srv, user: str | None = None) -> psycopg.Connection:
    dsn = dict(srv.dsn)
    if user is not None:
        dsn.update(user=user, password=f"{user} pw")
    return psycopg.connect(**dsn, autocommit=True)


def setup(srv) -> None:
    with connect(srv) as admin:
        admin.execute("CREATE TABLE cards (pan VARCHAR, region VARCHAR, n INTEGER)")
        for i, pan in enumerate(PANS):
            admin.execute(f"INSERT INTO cards SELECT fpe_encrypt('{pan}', 'cards'), "
                          f"'{['US', 'EU', 'US'][i]}', {i}")
        admin.execute("CREATE TABLE other (pan VARCHAR)")
        admin.execute(f"INSERT INTO other SELECT fpe_encrypt('{PANS[0]}', 'cards')")
        for role in ("auditor", "analyst", "officers"):
            admin.execute(f"CREATE ROLE {role}")
        for user, role in (("alice", "auditor"), ("bob", "analyst"), ("olga", "officers")):
            admin.execute(f"CREATE USER {user} PASSWORD '{user} pw'")
            admin.execute(f"GRANT {role} TO {user}")
        admin.execute("GRANT SELECT ON cards TO auditor, analyst")
        admin.execute("GRANT SELECT ON other TO analyst")
        admin.execute("GRANT INSERT ON other TO analyst")
        with pytest.raises(DENIED, match="APPLY POLICY"):  # admins do not hold it
            admin.execute(f"CREATE MASKING POLICY pan_mask AS (v VARCHAR) RETURNS VARCHAR "
                          f"-> {MASK}")
        admin.execute("GRANT APPLY POLICY TO officers")
    with connect(srv, "olga") as officer:
        officer.execute(f"CREATE MASKING POLICY pan_mask AS (v VARCHAR) RETURNS VARCHAR "
                        f"-> {MASK}")
        officer.execute("ALTER TABLE cards ALTER COLUMN pan SET MASKING POLICY pan_mask")
        officer.execute("CREATE ROW ACCESS POLICY no_eu AS (r VARCHAR) RETURNS BOOLEAN -> "
                        "is_role_in_session('auditor') OR r <> 'EU'")
        officer.execute("ALTER TABLE cards ADD ROW ACCESS POLICY no_eu ON (region)")


def test_roles_see_what_the_policies_allow(start_server, engine):  # noqa: F811
    srv = start_server(engine)
    setup(srv)
    with connect(srv, "alice") as auditor:
        # a member of auditor: the row policy (is_role_in_session) lets every row through,
        # the mask (current_role() IN ('auditor')) wants the role taken with SET ROLE
        assert auditor.execute("SELECT pan FROM cards ORDER BY n").fetchall() == \
            [("************1111",), ("************5559",), ("***********0009",)]
        auditor.execute("SET ROLE auditor")
        assert auditor.execute("SELECT pan FROM cards ORDER BY n").fetchall() == \
            [(p,) for p in PANS]
    with connect(srv, "bob") as analyst:
        assert analyst.execute("SELECT pan, region FROM cards ORDER BY n").fetchall() == \
            [("************1111", "US"), ("***********0009", "US")]
    with connect(srv) as admin:  # admins hold the keys and are not subject to policies
        admin.execute("CREATE TABLE policy_notes (masking VARCHAR)")  # not policy statements
        admin.execute("DROP TABLE policy_notes")
        stored = admin.execute("SELECT pan FROM cards ORDER BY n").fetchall()
        assert len(stored) == 3 and stored[0][0] != PANS[0]
        assert admin.execute("SELECT * FROM system.policy_references").fetchall() == [
            ("cards", "pan", "pan_mask", "masking"), ("cards", "region", "no_eu", "row access")]
        assert [r[0] for r in admin.execute("SELECT * FROM system.policies").fetchall()] == \
            ["pan_mask", "no_eu"]
        admin.execute("SET ROLE analyst")  # an admin acting as a role is subject to them
        assert admin.execute("SELECT count(*) FROM cards").fetchone()[0] == 2
        assert admin.execute("SELECT pan FROM cards WHERE n = 0").fetchone()[0] == \
            "************1111"


@pytest.mark.parametrize("sql", [
    "SELECT pan FROM (SELECT * FROM cards) AS s",
    "WITH s AS (SELECT pan FROM cards) SELECT * FROM s",
    "WITH cards AS (SELECT * FROM cards) SELECT pan FROM cards",  # a CTE named as the table
    "SELECT pan FROM cards UNION ALL SELECT pan FROM cards WHERE false",
    "SELECT c.pan FROM cards AS c JOIN cards AS d ON c.pan = d.pan",
    "SELECT pan FROM cards WHERE pan LIKE '%1111'",
    "SELECT pan FROM cards ORDER BY pan",
    "SELECT max(pan) FROM cards GROUP BY region",
    "SELECT first_value(pan) OVER (ORDER BY n) FROM cards",
    "SELECT (SELECT max(pan) FROM cards)",
    "SELECT pan FROM main.cards",
    "SELECT pan FROM cards WHERE region = 'EU' OR true",
    "SELECT pan FROM cards, (SELECT 1) AS x WHERE pan IN (SELECT pan FROM cards)",
    "FROM cards SELECT pan",
    "SELECT * FROM query_table('cards')",
    "SUMMARIZE cards",
    "PIVOT cards ON region USING max(pan)",
    "SELECT cards FROM cards",
    "SELECT list(pan) FROM cards",
    "SELECT * FROM cards TABLESAMPLE 100%",
])
def test_bypass_attempts_see_masked_values(start_server, engine, sql):  # noqa: F811
    srv = start_server(engine)
    setup(srv)
    with connect(srv, "bob") as analyst:
        try:
            rows = analyst.execute(sql).fetchall()
        except psycopg.Error as exc:  # refusing is fine too; leaking is not
            assert not any(p in str(exc) for p in PANS)
            return
    values = {str(v) for row in rows for v in row}
    assert values and not any(p in v for v in values for p in PANS)
    assert not any("5559" in v for v in values)  # the EU row stays hidden
    assert all("*" in v for v in values if len(v) >= 12 and v.isdigit()), values


def test_a_role_sees_neither_the_rewritten_text_nor_the_policies_in_it(
        start_server, engine):  # noqa: F811
    """The rewrite is the server's: a column the rewrite changed keeps the name the query
    gives it (an admin's), and an error quotes no rewritten text (DuckDB's ``LINE 1:``,
    which held the row policy's expression and the mask's internal names)."""
    srv = start_server(engine)
    setup(srv)
    query = "SELECT (SELECT max(pan) FROM cards), (SELECT count(*) FROM cards) AS k, n " \
        "FROM cards ORDER BY n"
    with connect(srv) as admin:  # (a scalar subquery is named as PostgreSQL names it)
        names = [d.name for d in admin.execute(query).description]
    assert names == ["max", "k", "n"]
    with connect(srv, "bob") as analyst:
        cur = analyst.execute(query)
        assert [d.name for d in cur.description] == names
        assert cur.fetchall() == [("***********0009", 2, 0), ("***********0009", 2, 2)]
        for sql in ("SELECT nosuch FROM cards", "SELECT n::TINYINT * 200::TINYINT FROM cards",
                    "SELECT CAST(region AS INTEGER) FROM cards",
                    "INSERT INTO other SELECT nosuch FROM cards",
                    "INSERT INTO other SELECT CAST(region AS INTEGER) FROM cards"):
            with pytest.raises(psycopg.Error) as info:
                analyst.execute(sql)
            text = str(info.value)
            assert "EU" not in text and "__cd_" not in text and "LINE" not in text, text
            # DuckDB's candidates would be the columns the rewrite kept ("pan" alone)
            assert "Candidate bindings" not in text, text
        with pytest.raises(psycopg.Error, match='Table "c" does not have a column named '
                                                '"nosuch"') as info:
            analyst.execute("SELECT c.nosuch FROM cards AS c")  # (as an admin's error says)
        # errors that quote values quote what the role reads: a masked number, a region
        # of a row it sees (the row policy filters before the query's own WHERE runs)
        for sql, shown in (("SELECT error(pan) FROM cards WHERE n = 0", "************1111"),
                           ("SELECT CAST(pan AS INTEGER) FROM cards WHERE n = 0",
                            "************1111"),
                           ("SELECT * FROM cards WHERE error(region) IS NULL", "US")):
            with pytest.raises(psycopg.Error, match=r"\*{12}1111|US") as info:
                analyst.execute(sql)
            assert shown in str(info.value) and PANS[0] not in str(info.value)
        for sql in ("SELECT * FROM cards WHERE region <> 'US' AND error(region) IS NULL",
                    "SELECT * FROM cards WHERE region <> 'US' AND region::INTEGER = 1",
                    "SELECT * FROM cards WHERE n // (CASE WHEN region = 'EU' THEN 0 ELSE 1 "
                    "END) > 5"):
            assert analyst.execute(sql).fetchall() == []  # the EU row is never reached
    with connect(srv) as admin:  # an admin's query is not rewritten: DuckDB's quote stays
        with pytest.raises(psycopg.Error, match=r"(?s)Candidate bindings.*LINE 1"):
            admin.execute("SELECT nosuch FROM cards")


def test_policy_bodies_are_for_policy_officers(start_server, engine):  # noqa: F811
    """A policy's body (its expression, the roles it reveals values to, its key names)
    and its arguments are shown to holders of APPLY POLICY and admins; another role sees
    the names of the policies set on the tables it may read, and where they are set."""
    srv = start_server(engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("CREATE TABLE hidden (s VARCHAR)")
        admin.execute("CREATE USER nobody PASSWORD 'nobody pw'")
    with connect(srv, "olga") as officer:
        officer.execute("CREATE MASKING POLICY s_mask AS (x VARCHAR) RETURNS VARCHAR -> "
                        "CASE WHEN is_role_in_session('auditor') THEN x ELSE mask_full(x) END")
        officer.execute("ALTER TABLE hidden ALTER COLUMN s SET MASKING POLICY s_mask")
        officer.execute("CREATE MASKING POLICY unused AS (x VARCHAR) RETURNS VARCHAR -> x")
        full = officer.execute("SELECT * FROM system.policies").fetchall()
        assert [(r[0], r[2]) for r in full] == [
            ("pan_mask", "(v VARCHAR) RETURNS VARCHAR"), ("s_mask", "(x VARCHAR) RETURNS VARCHAR"),
            ("unused", "(x VARCHAR) RETURNS VARCHAR"), ("no_eu", "(r VARCHAR) RETURNS BOOLEAN")]
        assert full[0][3] == MASK
        assert len(officer.execute("SELECT * FROM system.policy_references").fetchall()) == 3
    with connect(srv) as admin:
        assert admin.execute("SELECT * FROM system.policies").fetchall() == full
        admin.execute("SET ROLE analyst")  # acting as the role: the role's view
        assert admin.execute("SELECT * FROM system.policies").fetchall() == [
            ("pan_mask", "masking", None, None), ("no_eu", "row access", None, None)]
    with connect(srv, "bob") as analyst:
        policies = analyst.execute("SELECT * FROM system.policies").fetchall()
        assert policies == [("pan_mask", "masking", None, None),
                            ("no_eu", "row access", None, None)]
        assert analyst.execute("SELECT * FROM system.policy_references").fetchall() == [
            ("cards", "pan", "pan_mask", "masking"), ("cards", "region", "no_eu", "row access")]
        seen = [policies]
        for table in ("grants", "users", "roles"):
            seen.append(analyst.execute(f"SELECT * FROM system.{table}").fetchall())
        for sql in ("SELECT * FROM system.audit", "EXPLAIN SELECT pan FROM cards",
                    "SELECT * FROM duckdb_functions()", "SELECT * FROM duckdb_views()"):
            with pytest.raises(DENIED) as info:
                analyst.execute(sql)
            seen.append(str(info.value))
        seen.append(analyst.execute("SELECT * FROM information_schema.columns").fetchall())
        text = repr(seen)  # (system.grants shows roles and their members, as pg_roles does)
        for secret in ("fpe_decrypt", "'cards')", "'EU'", "is_role_in_session", "mask_",
                       "(v VARCHAR)", "s_mask", "hidden", "unused"):
            assert secret not in text, secret
    with connect(srv, "nobody") as nobody:  # reads no table: sees no policy
        assert nobody.execute("SELECT * FROM system.policies").fetchall() == []
        assert nobody.execute("SELECT * FROM system.policy_references").fetchall() == []


def test_a_mask_is_not_set_on_one_of_two_columns_named_alike_in_lower_case(
        start_server, engine):  # noqa: F811
    """DuckDB tells columns "Ü" and "ü" apart, but a mask is kept by the lower-case name
    and masks both: a lenient mask set on "ü" silently replaced the strict one set on
    "Ü", and an analyst read "Ü" in the clear. Now that SET is refused (a clear error)
    while another policy is kept under the name; both stay masked by the strict one."""
    srv = start_server(engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute('CREATE TABLE twins ("Ü" VARCHAR, "ü" VARCHAR, a VARCHAR)')
        admin.execute("INSERT INTO twins VALUES ('secret', 'open', 'also secret')")
        admin.execute("GRANT SELECT ON twins TO analyst")
    with connect(srv, "olga") as officer:
        officer.execute("CREATE MASKING POLICY strict AS (x VARCHAR) RETURNS VARCHAR -> "
                        "mask_full(x)")
        officer.execute("CREATE MASKING POLICY lenient AS (x VARCHAR) RETURNS VARCHAR -> x")
        officer.execute('ALTER TABLE twins ALTER COLUMN "Ü" SET MASKING POLICY strict')
        officer.execute('ALTER TABLE twins ALTER COLUMN "ü" SET MASKING POLICY strict')
        with pytest.raises(psycopg.errors.AmbiguousColumn, match="masked by strict"):
            officer.execute('ALTER TABLE twins ALTER COLUMN "ü" SET MASKING POLICY lenient')
        officer.execute("ALTER TABLE twins ALTER COLUMN a SET MASKING POLICY lenient")
    with connect(srv, "bob") as analyst:
        got = analyst.execute('SELECT "Ü", "ü", a FROM twins').fetchall()
        assert got[0][2] == "also secret" and "secret" not in got[0][:2] and \
            "open" not in got[0][:2], got


def test_other_ways_around_are_refused(start_server, engine):  # noqa: F811
    srv = start_server(engine)
    setup(srv)
    with connect(srv, "bob") as analyst:
        for sql in ("EXPLAIN SELECT pan FROM cards", "COPY cards TO '/tmp/x.csv'",
                    "COPY (SELECT pan FROM cards) TO '/tmp/x.csv'", "EXPORT DATABASE '/tmp/x'",
                    "CREATE MACRO peek(x) AS x", "CREATE TEMP TABLE c2 AS SELECT * FROM cards",
                    "SELECT * FROM read_parquet('x/*.parquet')",
                    "SELECT fpe_decrypt(pan, 'cards') FROM cards",
                    "ALTER TABLE cards ALTER COLUMN pan UNSET MASKING POLICY",
                    "DROP MASKING POLICY pan_mask"):
            with pytest.raises(psycopg.Error) as info:
                analyst.execute(sql)
            assert not any(p in str(info.value) for p in PANS)
        # an INSERT's source query is read through the policies too
        analyst.execute("INSERT INTO other SELECT pan FROM cards")
    with connect(srv) as admin:
        copied = [r[0] for r in admin.execute("SELECT pan FROM other").fetchall()]
    assert sorted(copied[1:]) == ["************1111", "***********0009"]


def test_only_apply_policy_holders_change_policies_and_state_persists(
        start_server, engine, tmp_path):  # noqa: F811
    srv = start_server(engine)
    setup(srv)
    with connect(srv, "olga") as officer:
        with pytest.raises(psycopg.Error, match=r"is set on cards\.pan"):
            officer.execute("DROP MASKING POLICY pan_mask")
        with pytest.raises(psycopg.Error, match="takes VARCHAR"):
            officer.execute("ALTER TABLE cards ALTER COLUMN n SET MASKING POLICY pan_mask")
        with pytest.raises(psycopg.Error, match="returns its argument's type"):
            officer.execute("CREATE MASKING POLICY bad AS (v VARCHAR) RETURNS INTEGER -> 1")
    reopened = PolicyStore(tmp_path / "db.policies", engine.keyring, engine)
    assert reopened.data["columns"] == {"cards": {"pan": "pan_mask"}}
    assert b"pan_mask" not in (tmp_path / "db.policies").read_bytes()  # sealed
    with connect(srv) as admin:
        admin.execute("REVOKE APPLY POLICY FROM officers")
    with connect(srv, "olga") as officer:
        with pytest.raises(DENIED, match="APPLY POLICY"):
            officer.execute("ALTER TABLE cards ALTER COLUMN pan UNSET MASKING POLICY")
    with connect(srv) as admin:
        admin.execute("GRANT APPLY POLICY TO officers")
    with connect(srv, "olga") as officer:
        officer.execute("ALTER TABLE cards ALTER COLUMN pan UNSET MASKING POLICY")
        officer.execute("ALTER TABLE cards DROP ROW ACCESS POLICY no_eu")
        officer.execute("DROP MASKING POLICY pan_mask")
    with connect(srv, "bob") as analyst:  # no policy left: the stored values, all rows
        assert analyst.execute("SELECT count(*) FROM cards").fetchone()[0] == 3


def test_system_parts_hides_sort_keys_of_protected_tables(start_server, engine):  # noqa: F811
    srv = start_server(engine)
    with connect(srv) as admin:
        admin.execute("CREATE TABLE s (pan VARCHAR) ORDER BY pan")
        admin.execute("INSERT INTO s VALUES ('4111111111111111')")
        admin.execute("CREATE ROLE officers")
        admin.execute("CREATE USER olga PASSWORD 'olga pw'")
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
        admin.execute("GRANT officers TO olga")
        admin.execute("GRANT APPLY POLICY TO officers")
        admin.execute("GRANT SELECT ON system.parts TO bob")
    with connect(srv, "olga") as officer:
        officer.execute("CREATE MASKING POLICY m AS (v VARCHAR) RETURNS VARCHAR -> mask_full(v)")
        officer.execute("ALTER TABLE s ALTER COLUMN pan SET MASKING POLICY m")
    with connect(srv, "bob") as bob:
        rows = bob.execute("SELECT \"table\", key_min, key_max FROM system.parts").fetchall()
    assert rows == [("s", None, None)]


@pytest.mark.parametrize("push", [True, False])
def test_decryptions_are_audited_for_auditors_only(start_server, engine, tmp_path,  # noqa: F811
                                                   push):
    """The same lines whether the scan computes the decryptions or DuckDB does."""
    engine.db.push_field_functions = push
    srv = start_server(engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("SELECT fpe_decrypt(pan, 'cards') FROM cards").fetchall()
        admin.execute("SELECT count(*) FROM cards WHERE n > 0").fetchall()  # nothing revealed
        admin.execute("SELECT 'decrypt(' AS not_a_call").fetchall()
    with connect(srv, "bob") as analyst:
        analyst.execute("SELECT pan FROM cards").fetchall()
        # through the row policy, but pan is not read: nothing decrypted, no line
        analyst.execute("SELECT region FROM cards").fetchall()
        analyst.execute("INSERT INTO other SELECT pan FROM cards")
        with pytest.raises(DENIED, match="AUDIT"):
            analyst.execute("SELECT * FROM system.audit")
    with connect(srv) as admin:
        with pytest.raises(DENIED, match="AUDIT"):  # admins read it only if granted
            admin.execute("SELECT * FROM system.audit")
        admin.execute("GRANT AUDIT TO auditor")
    with connect(srv, "alice") as auditor:
        cur = auditor.execute("SELECT * FROM system.audit")
        names = [d.name for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    assert [(r["session_user"], r["kind"], r["functions"], r["tables"], r["columns"],
             r["rows"]) for r in rows] == [
        ("u", "function", "fpe_decrypt", "cards", "", 3),
        ("bob", "policy", "fpe_decrypt", "cards", "cards.pan", 2),
        ("bob", "policy", "fpe_decrypt", "cards", "cards.pan", 2)]  # the INSERT: rows written
    assert engine.policies.audit.verify() is None
    raw = (tmp_path / "db.audit").read_bytes()
    with cd_open(tmp_path / "db.audit", "rb", keyring=engine.keyring) as f:
        plain = f.read()
    # needles of 8+ bytes the lines hold (a 3-byte one, such as bob, is in random
    # ciphertext of this size about once in 10,000 runs)
    needles = [b"fpe_decrypt", b'"session_user":"bob"', b"cards.pan"]
    assert all(n in plain for n in needles)
    assert not any(n in raw for n in needles)  # encrypted
    assert not any(p.encode() in raw for p in PANS)
    # a line slipped in with the key but without the chain is found
    engine.policies.audit.close()
    with cd_open(tmp_path / "db.audit", "ab", keyring=engine.keyring) as f:
        f.write(b'{"time":"x","kind":"function","prev":"' + b"0" * 64 + b'"}\n')
    assert AuditLog(tmp_path / "db.audit", engine.keyring).verify() == 4


def test_an_audit_line_names_the_columns_the_query_decrypted(start_server,  # noqa: F811
                                                             engine):
    """Of a table with two decrypting masks, a query reading one names that one."""
    srv = start_server(engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("CREATE TABLE people (name VARCHAR, email VARCHAR)")
        admin.execute("INSERT INTO people SELECT encrypt('Zoë', 'cards'), "
                      "encrypt_deterministic('z@x.org', 'cards')")
        admin.execute("GRANT SELECT ON people TO analyst")
        admin.execute("GRANT AUDIT TO auditor")
    with connect(srv, "olga") as officer:
        for column, fn in (("name", "decrypt"), ("email", "decrypt_deterministic")):
            officer.execute(f"CREATE MASKING POLICY {column}_mask AS (v VARCHAR) RETURNS "
                            f"VARCHAR -> mask_full({fn}(v, 'cards'))")
            officer.execute(f"ALTER TABLE people ALTER COLUMN {column} SET MASKING POLICY "
                            f"{column}_mask")
    with connect(srv, "bob") as analyst:
        assert analyst.execute("SELECT name FROM people").fetchall() == [("***",)]
        assert analyst.execute("SELECT length(email) FROM people").fetchall() == [(7,)]
        analyst.execute("SELECT * FROM people").fetchall()
    with connect(srv, "alice") as auditor:
        cur = auditor.execute("SELECT * FROM system.audit")
        names = [d.name for d in cur.description]
        rows = [(r[names.index("functions")], r[names.index("columns")]) for r in cur]
    assert rows == [("decrypt", "people.name"), ("decrypt_deterministic", "people.email"),
                    ("decrypt, decrypt_deterministic", "people.email, people.name")]


def test_system_audit_answers_select_star_only(start_server, engine):  # noqa: F811
    srv = start_server(engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("GRANT AUDIT TO auditor")
    query = "SELECT time, rows FROM system.audit WHERE session_user = 'bob'"
    with connect(srv, "bob") as analyst:
        with pytest.raises(DENIED, match="holders of AUDIT"):  # before anything else
            analyst.execute(query)
    with connect(srv, "alice") as auditor:
        with pytest.raises(psycopg.errors.FeatureNotSupported,
                           match=r"system.audit answers SELECT \* FROM system.audit only"):
            auditor.execute(query)
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"system\.policies answers"):
            auditor.execute("SELECT name FROM system.policies")
        # the store's tables in a literal are not a mention
        assert auditor.execute("SELECT 'system.audit' AS t").fetchall() == [("system.audit",)]
        assert auditor.execute("SELECT * FROM system.audit").fetchall() == []


@pytest.mark.parametrize("push", [True, False])
def test_decrypting_bytes_is_audited_and_for_admins_only(start_server, engine, push):  # noqa: F811
    """decrypt of a BLOB ciphertext, and the UDFs behind the decrypt macros called by
    their own names: audited as decrypt, refused to users who are not admins."""
    engine.db.push_field_functions = push
    srv = start_server(engine)
    with connect(srv) as admin:
        admin.execute("CREATE TABLE b (g BLOB)")
        admin.execute("INSERT INTO b SELECT from_base64(encrypt(x, 'cards')) "
                      "FROM (VALUES ('one'), ('two')) AS v(x)")
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
        admin.execute("GRANT SELECT ON b TO bob")
        assert sorted(admin.execute("SELECT decrypt(g, 'cards') FROM b").fetchall()) == \
            [("one",), ("two",)]
        assert admin.execute("SELECT count(__cd_decrypt_bytes(g, 'cards')) FROM b"
                             ).fetchall() == [(2,)]
    rows = [(e["session_user"], e["kind"], e["functions"], e["tables"], e["rows"])
            for e in engine.policies.audit.entries()]
    assert rows == [("u", "function", ["decrypt"], ["b"], 2),  # rows returned
                    ("u", "function", ["decrypt"], ["b"], 1)]
    with connect(srv, "bob") as bob:
        assert len(bob.execute("SELECT g FROM b").fetchall()) == 2  # the stored bytes
        for sql in ("SELECT decrypt(g, 'cards') FROM b",
                    "SELECT __cd_decrypt_bytes(g, 'cards') FROM b",
                    "SELECT __cd_decrypt(CAST(g AS VARCHAR), 'cards') FROM b",
                    "SELECT __cd_decrypt_deterministic_bytes(g, 'cards') FROM b"):
            with pytest.raises(DENIED, match="uses a field key"):
                bob.execute(sql)


def test_a_policy_failing_on_a_stored_value_is_not_named_to_a_role(start_server,  # noqa: F811
                                                                   engine):
    """A stored value a policy's function cannot read (here no FPE ciphertext): the role's
    error says a policy failed, not which function (that would tell it what the policy
    does); an admin's own call is named."""
    srv = start_server(engine)
    setup(srv)
    with connect(srv) as admin:
        admin.execute("INSERT INTO cards VALUES ('12ab34567890123', 'US', 9)")
    with connect(srv, "bob") as analyst:
        for sql in ("SELECT pan FROM cards", "SELECT count(pan) FROM cards"):
            with pytest.raises(psycopg.Error, match="policy of a table the statement reads "
                                                    "failed on a stored value") as info:
                analyst.execute(sql)
            assert "fpe" not in str(info.value) and "alphabet" not in str(info.value)
        assert len(analyst.execute("SELECT n FROM cards").fetchall()) == 3  # (reads no pan)
    with connect(srv) as admin:
        with pytest.raises(psycopg.Error, match="fpe_decrypt: row"):
            admin.execute("SELECT fpe_decrypt(pan, 'cards') FROM cards")

"""The real psql's \\d NAME, \\dt, \\du against the server (TLS, verify-full), on both engines."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from tests.server.conftest import PASSWORD, USER


def psql(srv, certs, *commands: str, user: str = USER, password: str = PASSWORD,
         unaligned: bool = True) -> subprocess.CompletedProcess[str]:
    conninfo = (f"host=localhost port={srv.port} user={user} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    args = ["psql", conninfo, "-X", "-v", "ON_ERROR_STOP=1"] + (["-A"] if unaligned else [])
    for c in commands:
        args += ["-c", c]
    return subprocess.run(args, env={**os.environ, "PGPASSWORD": password},
                          capture_output=True, text=True, timeout=60)


def test_describe_sqlite_table_and_view(start_server, sqlite_engine, certs) -> None:
    srv = start_server(sqlite_engine)
    out = psql(srv, certs, "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL "
               "DEFAULT 'x', price REAL)", "CREATE VIEW cheap AS SELECT id FROM items",
               "\\d items", "\\d cheap", "\\d public.items", unaligned=False)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert 'Table "public.items"' in text and 'View "public.cheap"' in text
    rows = [[c.strip() for c in line.split("|")] for line in text.splitlines()
            if line.count("|") == 4 and "Column" not in line]
    assert rows[:3] == [["id", "integer", "", "", ""], ["name", "text", "", "not null", "'x'"],
                        ["price", "real", "", "", ""]]
    assert rows[3] == ["id", "integer", "", "", ""]   # the view's column
    assert rows[4:] == rows[:3]                        # \d public.items: the same table
    missing = psql(srv, certs, "\\d nosuch")
    assert 'Did not find any relation named "nosuch"' in missing.stderr


def test_describe_analytical_table_types(start_server, analytical, certs) -> None:
    srv = start_server(analytical)
    out = psql(srv, certs, "CREATE TABLE m (a BIGINT, b VARCHAR, c DECIMAL(10,2), "
               "d TIMESTAMPTZ, e DOUBLE, f BOOLEAN, g DATE)", "\\d m")
    assert out.returncode == 0, out.stderr
    rows = [line.split("|")[:2] for line in out.stdout.splitlines()
            if line.count("|") == 4 and not line.startswith("Column")]
    assert rows == [["a", "bigint"], ["b", "text"], ["c", "numeric(10,2)"],
                    ["d", "timestamp with time zone"], ["e", "double precision"],
                    ["f", "boolean"], ["g", "date"]]


def test_du_lists_users_roles_and_memberships(start_server, sqlite_engine, certs) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for st in ["CREATE USER bob PASSWORD 'bob pw'", "CREATE ROLE readers",
                   "CREATE ROLE staff", "GRANT readers, staff TO bob",
                   "CREATE TABLE t (a INTEGER)"]:
            admin.execute(st)
    out = psql(srv, certs, "\\du", "\\du bo*")
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.count("|") == 2]
    assert lines == [
        "Role name|Attributes|Member of",
        "bob||{readers,staff}",
        "readers|Cannot login|{}",
        "staff|Cannot login|{}",
        f"{USER}|Superuser, Create role, Create DB, Bypass RLS|{{}}",
        "Role name|Attributes|Member of",
        "bob||{readers,staff}",
    ]
    denied = psql(srv, certs, "SELECT * FROM t", user="bob", password="bob pw")
    assert denied.returncode != 0 and "permission denied" in denied.stderr


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_d_and_dt_show_a_user_only_the_tables_it_may_read(start_server, request, engine,
                                                          certs) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for st in ["CREATE USER bob PASSWORD 'bob pw'", "CREATE TABLE m (a BIGINT)",
                   "CREATE TABLE n (b BIGINT)", "GRANT SELECT ON n TO bob"]:
            admin.execute(st)
    lists = psql(srv, certs, "\\dt", "\\d", "\\d n", user="bob", password="bob pw")
    assert lists.returncode == 0, lists.stderr
    assert "public|n|table|cryptdisk" in lists.stdout and "b|bigint" in lists.stdout
    assert "public|m|" not in lists.stdout
    for command in ("\\d m", "\\d+ m", "\\d public.m", "\\d m*", "\\dt m"):
        hidden = psql(srv, certs, command, user="bob", password="bob pw")
        assert '"public.m"' not in hidden.stdout and "a|bigint" not in hidden.stdout, command
        assert "public|m|" not in hidden.stdout, command
        assert "Did not find any relation" in hidden.stderr, (command, hidden.stderr)
    # the admin sees both; a grant shows m to bob
    seen = psql(srv, certs, "\\dt", "\\d m")
    assert "public|m|table|cryptdisk" in seen.stdout and 'Table "public.m"' in seen.stdout
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("GRANT SELECT ON m TO bob")
    granted = psql(srv, certs, "\\d+ m", user="bob", password="bob pw")
    assert granted.returncode == 0, granted.stderr
    assert 'Table "public.m"' in granted.stdout and "a|bigint||||plain|||" in granted.stdout


def test_bad_catalog_pattern_is_an_error(start_server, sqlite_engine, certs) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        with pytest.raises(psycopg.errors.InvalidRegularExpression):
            c.execute("SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c "
                      "WHERE c.relname OPERATOR(pg_catalog.~) '^((' ORDER BY 2, 3")


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_l_dn_d_plus_df_dx_and_conninfo(start_server, request, engine, certs) -> None:
    srv = start_server(request.getfixturevalue(engine))
    out = psql(srv, certs, "CREATE TABLE m (a BIGINT, c DECIMAL(10,2))", "\\l", "\\dn",
               "\\d+ m", "\\df", "\\dx", "\\db", "\\conninfo")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "db|cryptdisk|UTF8|C|C||libc|" in lines            # \l: the one database
    assert "public|cryptdisk" in lines                        # \dn
    assert "a|bigint||||plain|||" in lines                    # \d+ m: with storage
    assert "c|numeric(10,2)||||plain|||" in lines
    assert "Access method: heap" in lines
    assert lines.count("(0 rows)") == 2                       # \df, \dx: none
    assert "pg_default|cryptdisk|" in lines                   # \db
    assert any(line.startswith('You are connected to database "db" as user "u"')
               for line in lines)
    # \d+ of a table the user may not read: pg_catalog's tables list only readable ones
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        admin.execute("CREATE USER bob PASSWORD 'bob pw'")
    hidden = psql(srv, certs, "\\d+ m", user="bob", password="bob pw")
    assert "c|numeric" not in hidden.stdout and 'Table "public.m"' not in hidden.stdout
    assert 'Did not find any relation named "m"' in hidden.stderr


@pytest.mark.parametrize("engine", ["analytical", "sqlite_engine"])
def test_dp_and_z_show_the_grants_a_user_may_see(start_server, request, engine,
                                                 certs) -> None:
    srv = start_server(request.getfixturevalue(engine))
    with psycopg.connect(**srv.dsn, autocommit=True) as admin:
        for st in ["CREATE USER bob PASSWORD 'bob pw'", "CREATE USER carol PASSWORD 'c pw'",
                   'CREATE ROLE "Readers"', 'GRANT "Readers" TO bob',
                   "CREATE TABLE sales (a BIGINT)", "CREATE TABLE hr (b BIGINT)",
                   "CREATE TABLE plain (c BIGINT)",
                   "GRANT SELECT, INSERT ON sales TO bob", 'GRANT SELECT ON hr TO "Readers"',
                   "GRANT SELECT, DELETE ON hr TO carol"]:
            admin.execute(st)
    out = psql(srv, certs, "\\dp", "\\z hr", "\\dL")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = "Schema|Name|Type|Access privileges|Column privileges|Policies"
    assert lines[:7] == [
        "Access privileges", header,
        'public|hr|table|"Readers"=r/cryptdisk', "carol=rd/cryptdisk||",
        "public|plain|table|||", "public|sales|table|bob=ar/cryptdisk||", "(3 rows)"]
    assert lines[7:12] == ["Access privileges", header, 'public|hr|table|"Readers"=r/cryptdisk',
                           "carol=rd/cryptdisk||", "(1 row)"]
    assert "List of languages" in out.stdout and "(0 rows)" in lines[-1]
    # bob: the tables he may read, the grants to him and his roles only (not carol's)
    bob = psql(srv, certs, "\\dp", user="bob", password="bob pw")
    assert bob.returncode == 0, bob.stderr
    assert bob.stdout.splitlines()[2:5] == ['public|hr|table|"Readers"=r/cryptdisk||',
                                            "public|sales|table|bob=ar/cryptdisk||", "(2 rows)"]


@pytest.mark.parametrize("engine", ["sqlite_engine", "analytical"])
def test_unquoted_patterns_find_names_in_any_case(start_server, request, engine,
                                                  certs) -> None:
    """psql lower-cases an unquoted pattern (as PostgreSQL folds names); cryptdisk keeps a
    table's declared case and matches names in any case, so \\dt sal* finds Sales. A quoted
    pattern with capitals matches exactly."""
    srv = start_server(request.getfixturevalue(engine))
    made = psql(srv, certs, "CREATE TABLE Sales (a INTEGER)", "CREATE TABLE hr (a INTEGER)")
    assert made.returncode == 0, made.stderr

    def names(command: str) -> list[str]:
        out = psql(srv, certs, command, unaligned=True)
        assert out.returncode == 0, out.stderr
        return [line.split("|")[1] for line in out.stdout.splitlines()
                if line.startswith("public|")]

    assert names("\\dt sal*") == ["Sales"]
    assert names("\\dt SAL*") == ["Sales"]
    assert names("\\dt public.sales") == ["Sales"]
    assert names('\\dt "Sales"') == ["Sales"]
    assert names('\\dt "SALES"') == []
    assert names("\\dt") == ["Sales", "hr"]
    assert names("\\dp sal*") == ["Sales"]
    described = psql(srv, certs, "\\d sales", "\\d+ SALES")
    assert described.returncode == 0, described.stderr
    assert described.stdout.count('Table "public.Sales"') == 2
    assert "Did not find" in psql(srv, certs, '\\d "SALES"').stderr


def test_d_shows_a_tables_columns_after_alter_table(start_server, analytical, certs) -> None:
    srv = start_server(analytical)
    out = psql(srv, certs, "CREATE TABLE m (a BIGINT, b VARCHAR)",
               "INSERT INTO m VALUES (1, 'x')", "ALTER TABLE m ADD COLUMN c DECIMAL(10,2)",
               "ALTER TABLE m RENAME COLUMN b TO label", "ALTER TABLE m DROP COLUMN a",
               "ALTER TABLE m RENAME TO n", "\\d n")
    assert out.returncode == 0, out.stderr
    rows = [line.split("|")[:2] for line in out.stdout.splitlines()
            if line.count("|") == 4 and not line.startswith("Column")]
    assert rows == [["label", "text"], ["c", "numeric(10,2)"]]
    assert 'Did not find any relation named "m"' in psql(srv, certs, "\\d m").stderr

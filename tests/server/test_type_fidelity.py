"""Values keep their PostgreSQL types through the server: numeric scale and precision on
SQLite tables, ..."""

from __future__ import annotations

from decimal import Decimal

import psycopg
import pytest


def test_sqlite_numeric_keeps_its_declared_scale(start_server, sqlite_engine) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (a NUMERIC(10,3), b DECIMAL(8, 2), c NUMERIC(5), d NUMERIC)")
        conn.execute("INSERT INTO n VALUES (1.5, 0.125, 4.6, 3.5)")
        conn.execute("INSERT INTO n VALUES (%s, %s, %s, %s)",
                     (Decimal("1.234"), Decimal("0.1"), 7, Decimal("2.25")))
        rows = conn.execute("SELECT a, b, c, d FROM n ORDER BY a").fetchall()
        assert [[str(v) for v in r] for r in rows] == [
            ["1.234", "0.10", "7", "2.25"], ["1.500", "0.13", "5", "3.5"]]


@pytest.mark.parametrize("value", [Decimal("123456789012345.12345"), Decimal("NaN"),
                                   Decimal("12345678901234567890")])
def test_sqlite_refuses_a_numeric_parameter_it_would_change(start_server, sqlite_engine,
                                                            value) -> None:
    srv = start_server(sqlite_engine)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INTEGER, b NUMERIC(25,5))")
        with pytest.raises(psycopg.Error) as info:
            conn.execute("INSERT INTO n VALUES (1, %s)", (value,))
        assert info.value.sqlstate == "22003"
        assert "analytical engine" in str(info.value)
        assert conn.execute("SELECT count(*) FROM n").fetchone()[0] == 0
        conn.execute("INSERT INTO n VALUES (2, %s)", (Decimal("1234567.125"),))
        assert conn.execute("SELECT b FROM n").fetchone()[0] == Decimal("1234567.125")

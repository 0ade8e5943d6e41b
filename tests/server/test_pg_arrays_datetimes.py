"""Values Python's datetime cannot hold (infinite, BC and after-9999 dates and
timestamps, ``24:00:00``), nanosecond timestamps (rounded to microseconds) and lists
(PostgreSQL arrays) through the analytical engine, as PostgreSQL 15 sends them: the type
in RowDescription, the text in the simple and extended protocol's DataRows and COPY TO's
text and CSV, the binary in DataRows and binary COPY. The expected values were read from
a real PostgreSQL 15 by ``tests/server/pg_text_vectors.py`` (the inputs, SPECIAL, are
imported from there)."""

from __future__ import annotations

import datetime as dt
import struct

import psycopg
import pytest

from tests.server.pg_text_vectors import SPECIAL
from tests.server.test_text_format import _texts

# --- PostgreSQL 15.x (tests/server/pg_text_vectors.py): (type OID, text, binary hex) ---
SPECIAL_PG = [
    (1114, 'infinity', '7fffffffffffffff'),
    (1114, '-infinity', '8000000000000000'),
    (1184, 'infinity', '7fffffffffffffff'),
    (1184, '-infinity', '8000000000000000'),
    (1082, 'infinity', '7fffffff'),
    (1082, '-infinity', '80000000'),
    (1082, '0044-03-15 BC', 'fff49d7b'),
    (1082, '0001-12-31 BC', 'fff4dbf8'),
    (1082, '4713-01-01 BC', 'ffda97cd'),
    (1082, '10000-01-01', '002c95d4'),
    (1114, '0044-03-15 12:00:00.5 BC', 'ff1af9e8fb4e7120'),
    (1114, '0001-12-31 23:59:59.999999 BC', 'ff1fe2ffc59c5fff'),
    (1114, '294000-01-01 01:02:03', '7fe0f12712e438c0'),
    (1083, '24:00:00', '000000141dd76000'),
    (1114, '2024-01-02 03:04:05.123457', '0002b0ec8517d581'),
    (1114, 'infinity', '7fffffffffffffff'),
    (1016, '{1,2,NULL}',
     '00000001000000010000001400000003000000010000000800000000000000010000000800000000'
     '00000002ffffffff'),
    (1007, '{1,NULL}', '00000001000000010000001700000002000000010000000400000001ffffffff'),
    (1005, '{1,2}', '0000000100000000000000150000000200000001000000020001000000020002'),
    (1022, '{1.5,0.1,NaN,-Infinity}',
     '0000000100000000000002bd0000000400000001000000083ff8000000000000000000083fb99999'
     '9999999a000000087ff800000000000000000008fff0000000000000'),
    (1021, '{0.1}', '0000000100000000000002bc0000000100000001000000043dcccccd'),
    (1000, '{t,f,NULL}', '000000010000000100000010000000030000000100000001010000000100ffffffff'),
    (1009, '{"a b","c\\"d",NULL,"","null",NULLx,"x{","}","a,b","back\\\\slash",'
           '"tab\t",nbsp\xa0,plain}',
     '0000000100000001000000190000000d000000010000000361206200000003632264ffffffff0000'
     '0000000000046e756c6c000000054e554c4c7800000002787b000000017d00000003612c62000000'
     '0a6261636b5c736c6173680000000474616209000000066e627370c2a000000005706c61696e'),
    (1016, '{}', '000000000000000000000014'),
    (1007, '{{1,2},{3,NULL}}',
     '00000002000000010000001700000002000000010000000200000001000000040000000100000004'
     '000000020000000400000003ffffffff'),
    (1009, '{{{a}},{{"b c"}}}',
     '00000003000000000000001900000002000000010000000100000001000000010000000100000001'
     '6100000003622063'),
    (1115, '{"2024-01-02 03:04:05.5",infinity,"0044-03-15 00:00:00 BC"}',
     '00000001000000000000045a0000000300000001000000080002b0ec851d9460000000087fffffff'
     'ffffffff00000008ff1af9deec5b2000'),
    (1182, '{2024-02-29,-infinity}',
     '00000001000000000000043a000000020000000100000004000022790000000480000000'),
    (1183, '{12:00:00,24:00:00}',
     '00000001000000000000043b0000000200000001000000080000000a0eebb0000000000800000014'
     '1dd76000'),
    (1231, '{1.50,-2.00}',
     '0000000100000000000006a400000002000000010000000c0002000000000002000113880000000a'
     '00010000400000020002'),
    (1001, '{"\\\\x00ff"}', '00000001000000000000001100000001000000010000000200ff'),
]
# ---------------------------------------------------------------------------------------


@pytest.fixture
def srv(start_server, analytical):
    return start_server(analytical)


def _binary_copy(conn: psycopg.Connection, sql: str) -> list[bytes | None]:
    """The first field of each row of binary COPY TO's output."""
    with conn.cursor().copy(f"COPY ({sql}) TO STDOUT (FORMAT binary)") as copy:
        data = b"".join(bytes(b) for b in copy)
    assert data[:11] == b"PGCOPY\n\xff\r\n\x00"
    at = 19 + struct.unpack("!i", data[15:19])[0]
    fields: list[bytes | None] = []
    while (count := struct.unpack("!h", data[at:at + 2])[0]) != -1:
        assert count == 1
        size = struct.unpack("!i", data[at + 2:at + 6])[0]
        fields.append(None if size < 0 else data[at + 6:at + 6 + size])
        at += 6 + max(size, 0)
    return fields


@pytest.mark.parametrize(("duckdb", "want"), [(d, w) for (_, d), w in
                                             zip(SPECIAL, SPECIAL_PG, strict=True)],
                         ids=[p for p, _ in SPECIAL])
def test_values_are_sent_as_postgresql_sends_them(srv, duckdb, want) -> None:
    oid, text, binary = want
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        sql = f"SELECT {duckdb} AS v"
        got = _texts(conn, sql)
        assert got == {k: [(text,)] for k in ("simple", "extended", "copy", "csv")}
        res = conn.pgconn.exec_params(sql.encode(), [], result_format=1)
        assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
        assert res.ftype(0) == oid
        assert res.get_value(0, 0).hex() == binary
        assert [f.hex() for f in _binary_copy(conn, sql)] == [binary]
        # from a table too (stored, streamed), beside ordinary values and a NULL
        conn.execute(f"CREATE TABLE t AS SELECT 1 AS i, {duckdb} AS v")
        conn.execute("INSERT INTO t (i) VALUES (2)")
        res = conn.pgconn.exec_(b"SELECT v FROM t ORDER BY i")
        assert [res.get_value(r, 0) for r in range(2)] == [text.encode(), None]
        assert res.ftype(0) == oid


def test_timestamptz_before_year_1_and_after_9999_in_a_zone(srv) -> None:
    """The zone's local mean time before its first rule (as PostgreSQL's), its rules
    after 9999; binary is the instant whatever the zone (PostgreSQL 15's answers)."""
    values = ["-0043-03-15 12:00:00.25+00", "0000-12-31 23:00:00+00",
              "10000-07-01 12:00:00+00", "12000-01-01 12:00:00+00"]
    want = {"America/New_York": ["0044-03-15 07:03:58.25-04:56:02 BC",
                                 "0001-12-31 18:03:58-04:56:02 BC",
                                 "10000-07-01 08:00:00-04", "12000-01-01 07:00:00-05"],
            "Asia/Kolkata": ["0044-03-15 17:53:28.25+05:53:28 BC", "0001-01-01 04:53:28+05:53:28",
                             "10000-07-01 17:30:00+05:30", "12000-01-01 17:30:00+05:30"]}
    binary = ["ff1af9e8fb4aa090", "ff1fe2feef08bc00", "0380f562d7457000", "046120d884761000"]
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE z (i INTEGER, t TIMESTAMPTZ)")
        for i, v in enumerate(values):
            conn.execute(f"INSERT INTO z VALUES ({i}, '{v}')")
        for zone, texts in want.items():
            conn.execute(f"SET TimeZone = '{zone}'")
            got = _texts(conn, "SELECT t FROM z ORDER BY i")
            rows = [(t,) for t in texts]
            assert got == {"simple": rows, "extended": rows, "copy": rows, "csv": rows}, zone
            res = conn.pgconn.exec_params(b"SELECT t FROM z ORDER BY i", [], result_format=1)
            assert [res.get_value(r, 0).hex() for r in range(4)] == binary


def test_arrays_read_by_psycopg(srv) -> None:
    """psycopg reads the arrays as lists, in text and in binary (by their types' OIDs)."""
    sql = ("SELECT [1, NULL]::BIGINT[] AS a, ['a b', NULL, '']::VARCHAR[] AS b, "
           "[[1.5, 2.0], [3.0, 4.0]]::DOUBLE[][] AS c, ['2024-02-29']::DATE[] AS d")
    want = ([1, None], ["a b", None, ""], [[1.5, 2.0], [3.0, 4.0]], [dt.date(2024, 2, 29)])
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert conn.execute(sql).fetchone() == want
        assert conn.cursor(binary=True).execute(sql).fetchone() == want


@pytest.mark.parametrize("value", ["[[1, 2], [3]]", "[[1], NULL]", "[[1], []]"])
def test_a_list_of_lists_that_is_not_rectangular_is_refused(srv, value) -> None:
    """PostgreSQL's arrays are rectangular: 2202E (array_subscript_error) before any row;
    the session goes on."""
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE r (i INTEGER, v INTEGER[][])")
        conn.execute(f"INSERT INTO r VALUES (1, [[5, 6]]), (2, {value})")
        for binary in (False, True):
            with pytest.raises(psycopg.errors.ArraySubscriptError, match="rectangular"):
                conn.cursor(binary=binary).execute("SELECT v FROM r ORDER BY i").fetchall()
        with pytest.raises(psycopg.errors.ArraySubscriptError, match="rectangular"):
            with conn.cursor().copy("COPY (SELECT v FROM r ORDER BY i) TO STDOUT") as copy:
                list(copy)
        assert conn.execute("SELECT CAST(v AS VARCHAR) FROM r ORDER BY i").fetchall()[0] == \
            ("[[5, 6]]",)

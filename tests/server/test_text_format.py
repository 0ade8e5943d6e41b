"""Result values in text format are PostgreSQL 15's, byte for byte, on both engines: in
the simple and the extended protocol's DataRows and in COPY TO's text and CSV, floats
with the session's extra_float_digits. The expected text below was read from a real
PostgreSQL 15 by ``tests/server/pg_text_vectors.py`` (its inputs are imported from there)."""

from __future__ import annotations

import re
import struct
from decimal import Decimal
from fractions import Fraction

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cryptdisk.server._textout import float4_text, float8_text
from tests.server.pg_text_vectors import DIGITS, FLOAT4, FLOAT8, INSTANTS, OTHERS, ZONES
from tests.server.rawclient import Raw, cstr, msg

# --- written by PostgreSQL 15.x (tests/server/pg_text_vectors.py) ----------------------
FLOAT8_TEXT = {-15: ['1', '0.1', '-0', '0', '1e+02', '0.3', '-2', '1e+14', '1e+14', '1e+15',
                     '2e+15', '1e+15', '1e+16', '1e+16', '5e+16', '5e+16', '1e+18', '1e+17',
                     '0.0001', '0.0001', '1e-05', '2e-05', '-1e-07', '1e+22', '1e+300',
                     '5e-324', '2e+308', '2e-308', '9e+15', '1e+07', '0.3', 'NaN', 'Infinity',
                     '-Infinity'],
               -3: ['1', '0.1', '-0', '0', '100', '0.333333333333', '-2.5', '1e+14',
                    '1.23456789012e+14', '1e+15', '1.5e+15', '1e+15', '1e+16', '1e+16',
                    '5.29906483487e+16', '5.01714884074e+16', '1.15292150461e+18', '1e+17',
                    '0.0001', '0.00012345', '1e-05', '1.5e-05', '-1.25e-07', '1e+22', '1e+300',
                    '4.94065645841e-324', '1.79769313486e+308', '2.22507385851e-308',
                    '9.00719925474e+15', '12345678.9', '0.3', 'NaN', 'Infinity', '-Infinity'],
               0: ['1', '0.1', '-0', '0', '100', '0.333333333333333', '-2.5', '100000000000000',
                   '123456789012346', '1e+15', '1.5e+15', '1e+15', '1e+16', '1e+16',
                   '5.29906483487138e+16', '5.01714884073711e+16', '1.15292150460685e+18',
                   '1e+17', '0.0001', '0.00012345', '1e-05', '1.5e-05', '-1.25e-07', '1e+22',
                   '1e+300', '4.94065645841247e-324', '1.79769313486232e+308',
                   '2.2250738585072e-308', '9.00719925474099e+15', '12345678.9', '0.3', 'NaN',
                   'Infinity', '-Infinity'],
               1: ['1', '0.1', '-0', '0', '100', '0.3333333333333333', '-2.5',
                   '100000000000000', '123456789012345.6', '1e+15', '1.5e+15',
                   '1.0000000000000005e+15', '9.999999999999998e+15', '1e+16',
                   '5.2990648348713776e+16', '5.0171488407371104e+16', '1.152921504606847e+18',
                   '1e+17', '0.0001', '0.00012345', '1e-05', '1.5e-05', '-1.25e-07', '1e+22',
                   '1e+300', '5e-324', '1.7976931348623157e+308', '2.2250738585072014e-308',
                   '9.007199254740992e+15', '12345678.9', '0.3', 'NaN', 'Infinity',
                   '-Infinity']}
FLOAT4_TEXT = {-15: ['1', '0.1', '-0', '0.3', '0.3', '1e+05', '1e+05', '1e+06', '1e+06',
                     '1e+06', '2e+07', '6e+07', '0.0001', '1e-05', '1e-05', '3e+38', '1e-45',
                     '1e-38', '1e+12', '1e-06', '1e+27', '1e+04', 'NaN', 'Infinity',
                     '-Infinity'],
               -3: ['1', '0.1', '-0', '0.3', '0.333', '1e+05', '1.23e+05', '1e+06', '1e+06',
                    '1.23e+06', '1.68e+07', '5.68e+07', '0.0001', '1e-05', '1.5e-05', '3.4e+38',
                    '1.4e-45', '1.18e-38', '1.1e+12', '9.54e-07', '1.24e+27', '1.23e+04', 'NaN',
                    'Infinity', '-Infinity'],
               0: ['1', '0.1', '-0', '0.3', '0.333333', '100000', '123456', '999999', '1e+06',
                   '1.23457e+06', '1.67772e+07', '5.67956e+07', '0.0001', '1e-05', '1.5e-05',
                   '3.40282e+38', '1.4013e-45', '1.17549e-38', '1.09951e+12', '9.53674e-07',
                   '1.23794e+27', '12345.7', 'NaN', 'Infinity', '-Infinity'],
               1: ['1', '0.1', '-0', '0.3', '0.33333334', '100000', '123456', '999999', '1e+06',
                   '1.234567e+06', '1.6777216e+07', '5.6795592e+07', '0.0001', '1e-05',
                   '1.5e-05', '3.4028235e+38', '1e-45', '1.1754944e-38', '1.0995116e+12',
                   '9.536743e-07', '1.2379401e+27', '12345.678', 'NaN', 'Infinity',
                   '-Infinity']}
#: any extra_float_digits above 0 is shortest digits (PostgreSQL 15 gave 3 the same as 1)
FLOAT8_TEXT[3] = FLOAT8_TEXT[1]
FLOAT4_TEXT[3] = FLOAT4_TEXT[1]
OTHERS_TEXT = ['2024-01-02 03:04:05.5', '2024-01-02 03:04:05', '2024-01-02 03:04:05.000001',
               '2024-01-02 03:04:05.1234', '0099-01-01 00:00:00', '2024-01-02 03:04:05.5+00',
               '2024-12-31 23:59:59.999999+00', '03:04:05.5', '00:00:00', '12:00:00.00012',
               '2024-02-29', '0099-12-31', '0.000000100', '0.000000000', '1.500000000',
               '-12345.123456789', 't', 'f', '\\x00ff61625c', '\\x',
               'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'tab\there, \'quoted\' "dq" back\\slash',
               '']
ZONED_TEXT = {'America/New_York': ['2024-01-01 22:04:05.5-05', '2024-07-01 08:00:00-04'],
              'Asia/Kathmandu': ['2024-01-02 08:49:05.5+05:45', '2024-07-01 17:45:00+05:45'],
              'Asia/Kolkata': ['2024-01-02 08:34:05.5+05:30', '2024-07-01 17:30:00+05:30']}
# ---------------------------------------------------------------------------------------

#: the declared type of each of OTHERS's kinds, on both engines
_DECLARED = {"timestamp": "TIMESTAMP", "timestamptz": "TIMESTAMPTZ", "time": "TIME",
             "date": "DATE", "numeric(18,9)": "NUMERIC(18,9)", "boolean": "BOOLEAN",
             "bytea": "BYTEA", "uuid": "UUID", "text": "TEXT"}


@pytest.fixture(params=["analytical", "sqlite_engine"])
def srv(request, start_server):
    return start_server(request.getfixturevalue(request.param))


def _texts(conn: psycopg.Connection, sql: str) -> dict[str, list[tuple[str | None, ...]]]:
    """The rows of ``sql`` as the server wrote them (bytes decoded, NULL as None): in the
    simple and the extended protocol's DataRows and in COPY TO's text and CSV (its fields
    unescaped: what they stand for is what a DataRow holds)."""
    out = {}
    for name, res in (("simple", conn.pgconn.exec_(sql.encode())),
                      ("extended", conn.pgconn.exec_params(sql.encode(), []))):
        assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
        out[name] = [tuple(None if (v := res.get_value(r, c)) is None else v.decode()
                           for c in range(res.nfields)) for r in range(res.ntuples)]
    with conn.cursor().copy(f"COPY ({sql}) TO STDOUT") as copy:  # (psycopg unescapes it)
        out["copy"] = [tuple(row) for row in copy.rows()]
    with conn.cursor().copy(f"COPY ({sql}) TO STDOUT (FORMAT csv)") as copy:
        text = b"".join(bytes(b) for b in copy).decode()
    out["csv"] = [tuple(None if f == "" else f[1:-1].replace('""', '"') if f[:1] == '"'
                        else f for f in _CSV_FIELD.findall(line))
                  for line in text.splitlines()]  # (none of the values has a newline)
    return out


#: a CSV field: quoted (an empty string) or not (empty: NULL)
_CSV_FIELD = re.compile(r'(?:^|(?<=,))("(?:[^"]|"")*"|[^,]*)')


def _sqlite_keeps(value: float) -> bool:
    """SQLite stores a NaN as NULL and -0.0 as 0 (its storage, not the text format)."""
    return value == value and not (value == 0 and struct.pack("<d", value)[0:8] !=
                                   struct.pack("<d", 0.0))


@pytest.mark.parametrize("digits", DIGITS)
def test_floats_are_written_as_postgresql_writes_them(srv, digits) -> None:
    sqlite = srv.server.engine.transactions
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE f (i INTEGER, d DOUBLE" + ("" if sqlite else ", r REAL")
                     + ")")
        rows = [(i, x, *([] if sqlite else [FLOAT4[i] if i < len(FLOAT4) else None]))
                for i, x in enumerate(FLOAT8) if not sqlite or _sqlite_keeps(x)]
        conn.cursor().executemany("INSERT INTO f VALUES (" + ", ".join(["%s"] * len(rows[0]))
                                  + ")", rows)
        conn.execute(f"SET extra_float_digits = {digits}")
        want = [(FLOAT8_TEXT[digits][i],
                 *([] if sqlite else [FLOAT4_TEXT[digits][i] if i < len(FLOAT4) else None]))
                for i, *_ in rows]
        got = _texts(conn, "SELECT d" + ("" if sqlite else ", r") + " FROM f ORDER BY i")
        assert got == {"simple": want, "extended": want, "copy": want, "csv": want}


def test_other_types_are_written_as_postgresql_writes_them(srv) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        for kind, declared in _DECLARED.items():
            conn.execute(f"CREATE TABLE t_{declared.split('(')[0].lower()} "
                         f"(i INTEGER, v {declared})")
        for i, (kind, value) in enumerate(OTHERS):
            conn.execute(f"INSERT INTO t_{_DECLARED[kind].split('(')[0].lower()} "
                         "VALUES (%s, %s)", (i, value))
        for kind, declared in _DECLARED.items():
            want = [(text,) for (k, _), text in zip(OTHERS, OTHERS_TEXT, strict=True)
                    if k == kind]
            got = _texts(conn, f"SELECT v FROM t_{declared.split('(')[0].lower()} ORDER BY i")
            assert got == {"simple": want, "extended": want, "copy": want, "csv": want}, kind


def test_timestamptz_in_the_session_time_zone(start_server, analytical) -> None:
    """PostgreSQL writes an instant in the session's TimeZone, its offset's minutes only
    when not zero (``-05``, ``+05:30``)."""
    srv = start_server(analytical)
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE z (i INTEGER, t TIMESTAMPTZ)")
        conn.cursor().executemany("INSERT INTO z VALUES (%s, %s)", list(enumerate(INSTANTS)))
        for zone in ZONES:
            conn.execute(f"SET TimeZone = '{zone}'")
            want = [(t,) for t in ZONED_TEXT[zone]]
            got = _texts(conn, "SELECT t FROM z ORDER BY i")
            assert got == {"simple": want, "extended": want, "copy": want, "csv": want}, zone


def test_extra_float_digits_is_checked_as_postgresql_checks_it(srv) -> None:
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("1",)
        for value, message in (("4", '4 is outside the valid range for parameter '
                                     '"extra_float_digits" (-15 .. 3)'),
                               ("-16", "-16 is outside the valid range"),
                               ("'abc'", 'invalid value for parameter "extra_float_digits": '
                                         '"abc"')):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=re.escape(message)):
                conn.execute(f"SET extra_float_digits = {value}")
        conn.execute("SET extra_float_digits = 2.5")  # (rounded to even, as PostgreSQL's)
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("2",)
        conn.execute("CREATE TABLE x (d DOUBLE)")
        conn.execute("INSERT INTO x VALUES (%s)", (0.1 + 0.2,))
        conn.execute("SET extra_float_digits TO -4")
        assert conn.pgconn.exec_(b"SELECT d FROM x").get_value(0, 0) == b"0.3"
        conn.execute("RESET extra_float_digits")
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("1",)
        assert conn.pgconn.exec_(b"SELECT d FROM x").get_value(0, 0) == b"0.30000000000000004"
        conn.execute("BEGIN")  # a SET is undone with its transaction
        conn.execute("SET extra_float_digits = 0")
        conn.execute("ROLLBACK")
        assert conn.pgconn.exec_(b"SELECT d FROM x").get_value(0, 0) == b"0.30000000000000004"


def test_extra_float_digits_at_startup(srv) -> None:
    """As JDBC sends it (a startup parameter) and libpq's ``options``; a value out of its
    range refuses the connection, as PostgreSQL does."""
    with psycopg.connect(**srv.dsn, autocommit=True,
                         options="-c extra_float_digits=-10") as conn:
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("-10",)
        conn.execute("CREATE TABLE x (d DOUBLE)")
        conn.execute("INSERT INTO x VALUES (%s)", (1 / 3,))
        assert conn.pgconn.exec_(b"SELECT d FROM x").get_value(0, 0) == b"0.33333"
    with pytest.raises(psycopg.OperationalError, match=r"7 is outside the valid range"):
        psycopg.connect(**srv.dsn, options="-c extra_float_digits=7")


def test_extra_float_digits_as_a_startup_parameter(start_server, analytical) -> None:
    """JDBC's startup message has ``extra_float_digits=3``."""
    srv = start_server(analytical, secure=False)
    for value, want in ((b"0", b"0"), (b"3", b"3"), (b"9", None)):
        raw = Raw(srv.port)
        try:
            body = struct.pack("!i", 196608) + cstr("user") + cstr("u") + \
                cstr("extra_float_digits") + value + b"\0\0"
            raw.send(struct.pack("!i", len(body) + 4) + body)
            if want is None:  # refused, as PostgreSQL refuses it (FATAL 22023)
                error = raw.until(b"E")[-1]
                assert error[0] == b"E" and b"C22023" in error[1] and b"9 is outside" in error[1]
                continue
            assert raw.until(b"Z")[-1][0] == b"Z"
            raw.send(msg(b"Q", cstr("SHOW extra_float_digits")))
            rows = [m for m in raw.until(b"Z") if m[0] == b"D"]
            assert len(rows) == 1 and rows[0][1].endswith(want)
        finally:
            raw.sock.close()


# --- every float: reads back as itself, in as few digits as PostgreSQL's Ryu takes -----

def _digits(text: str) -> int:
    """The significant digits of a float's text."""
    mantissa = text.lstrip("-").split("e")[0].replace(".", "")
    return len(mantissa.lstrip("0").rstrip("0")) or 1


def _midway(shortest: str, value: float, width: str) -> bool:
    """Whether decimal ``shortest`` is exactly halfway between ``value`` and a neighbour
    of it in format ``width`` (``d`` or ``f``): a decimal that reads back as ``value``
    only by the tie going to it, which PostgreSQL's Ryu never writes."""
    step = "<Q" if width == "d" else "<I"
    bits = struct.unpack(step, struct.pack("<" + width, abs(value)))[0]
    exact = Fraction(abs(value))
    halves = [(exact + Fraction(struct.unpack("<" + width, struct.pack(step, b))[0])) / 2
              for b in (bits - 1, bits + 1)]
    return abs(Fraction(Decimal(shortest))) in halves


def _f32(x: float) -> float:
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:  # (beyond the largest float4 by more than half its gap)
        return float("inf")


def _check(value: float, text: str, width: str) -> None:
    back = float(text)
    if width == "f":
        back = _f32(back)  # (an exact tie cannot occur: see _midway)
    assert struct.pack("<d", back) == struct.pack("<d", value), (value, text)
    shortest = repr(value) if width == "d" else \
        next(t for p in range(1, 10) if _f32(float(t := f"{value:.{p - 1}e}")) == value)
    if _digits(text) > _digits(shortest):  # only where the shortest is a tie
        assert _midway(shortest, value, width), (value, text, shortest)


finite = st.floats(allow_nan=False, allow_infinity=False)


@given(st.lists(finite, min_size=1, max_size=40),
       st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1,
                max_size=40))
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_float_reads_back_as_itself(srv, doubles, singles) -> None:
    sqlite = srv.server.engine.transactions
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        for width, values, cast in (("d", doubles, "DOUBLE"), ("f", singles, "REAL")):
            if sqlite and width == "f":
                continue  # (SQLite has no float4: its REAL is a double)
            values = [v for v in values if not sqlite or _sqlite_keeps(v)]
            if not values:
                continue
            rows = " UNION ALL ".join(f"SELECT {i} AS i, CAST('{v!r}' AS {cast}) AS v"
                                      for i, v in enumerate(values))
            res = conn.pgconn.exec_(f"SELECT v FROM ({rows}) AS t ORDER BY i".encode())
            assert res.status == psycopg.pq.ExecStatus.TUPLES_OK, res.error_message
            for i, value in enumerate(values):
                _check(value, res.get_value(i, 0).decode(), width)


@given(st.floats(allow_nan=False, allow_infinity=False))
@settings(max_examples=3000)
def test_every_double_reads_back_as_itself(value) -> None:
    _check(value, float8_text(value), "d")


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
@settings(max_examples=3000)
def test_every_float4_reads_back_as_itself(value) -> None:
    _check(value, float4_text(value), "f")


def test_a_timestamptz_stored_with_another_offset_is_written_in_utc(start_server,
                                                                    sqlite_engine) -> None:
    """SQLite keeps a timestamptz's text as the client gave it (``+02``); PostgreSQL
    writes the instant in the session's TimeZone, which is UTC there (as PostgreSQL 15
    writes these with TimeZone UTC)."""
    srv = start_server(sqlite_engine)
    values = ["2024-07-02 03:04:05.25+02", "2024-01-02 03:04:05-05:30",
              "2024-01-02 03:04:05", "2024-03-01 00:30:00+01"]
    want = [("2024-07-02 01:04:05.25+00",), ("2024-01-02 08:34:05+00",),
            ("2024-01-02 03:04:05+00",), ("2024-02-29 23:30:00+00",)]
    with psycopg.connect(**srv.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE z (i INTEGER, t TIMESTAMPTZ)")
        for i, v in enumerate(values):
            conn.execute(f"INSERT INTO z VALUES ({i}, '{v}')")
        got = _texts(conn, "SELECT t FROM z ORDER BY i")
        assert got == {"simple": want, "extended": want, "copy": want, "csv": want}

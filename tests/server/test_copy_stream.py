"""COPY ... TO STDOUT on the analytical engine is streamed (server/_session.py's
_copy_out): its CopyData go out a batch at a time, byte for byte what the buffered
result gave; a cancel, the statement timeout or a client gone mid-COPY ends the stream,
the access log counts the rows, masking applies, and a server's memory stays bounded by
a batch, not by the result."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import datetime as dt
import decimal
import socket
import struct
import subprocess
import time
from typing import Any

import psycopg
import pytest

from cryptdisk.server import AccessLog, AnalyticalEngine, _copy, _types
from cryptdisk.server._rowstream import BATCH_ROWS, RowStream
from tests.server.conftest import PASSWORD, USER, masked_reader
from tests.server.rawclient import Raw, cstr, msg, sqlstate
from tests.server.test_access_log import lines
from tests.server.test_streaming import _open_streams, _wait_for, peak_growth

ROWS = 3 * BATCH_ROWS + 123
#: the rows of ``i % 3 <> 1``
THIRDS = sum(i % 3 != 1 for i in range(ROWS))

#: every kind of value COPY escapes or encodes: NULLs, NaN and infinities, text with
#: tabs, newlines, carriage returns, backslashes, quotes, delimiters and \N, unicode,
#: decimals, timestamps (with a zone too), dates, booleans, bytea
FILL = f"""
INSERT INTO t SELECT i,
  CASE i % 9 WHEN 0 THEN NULL WHEN 1 THEN 'tab' || chr(9) || 'nl' || chr(10) || 'cr' || chr(13)
    WHEN 2 THEN 'back\\slash \\N "dq" ''sq'' a,b;c' WHEN 3 THEN 'ünïcødé € 😀 ' || i
    WHEN 4 THEN '' WHEN 5 THEN 'NULL' ELSE 'v' || (i % 977) END,
  CASE i % 5 WHEN 0 THEN 'nan'::DOUBLE WHEN 1 THEN 'inf'::DOUBLE WHEN 2 THEN NULL
    WHEN 3 THEN '-inf'::DOUBLE ELSE i / 7.0 END,
  CASE WHEN i % 11 = 0 THEN NULL ELSE (i * 1.2345 - 5000)::DECIMAL(18,4) END,
  TIMESTAMP '2024-02-29 23:59:59.123456' + INTERVAL (i * 37) SECOND,
  TIMESTAMPTZ '1999-12-31 12:00:00+00' + INTERVAL (i * 1001) MILLISECOND,
  DATE '1970-01-01' + (i % 20000)::INTEGER,
  CASE WHEN i % 13 = 0 THEN NULL ELSE '\\x00\\x09\\x5C\\xFF'::BLOB || i::VARCHAR::BLOB END,
  CASE i % 3 WHEN 0 THEN NULL WHEN 1 THEN true ELSE false END
FROM range({ROWS}) r(i)"""

STATEMENTS = [
    "COPY t TO STDOUT",
    "COPY t (s, i, b) TO STDOUT WITH (FORMAT text, HEADER)",
    "COPY t TO STDOUT WITH (FORMAT csv, HEADER)",
    "COPY (SELECT * FROM t ORDER BY f, i) TO STDOUT WITH (FORMAT csv, DELIMITER ';', "
    "NULL 'NULL', HEADER true)",
    "COPY (SELECT s, i FROM t WHERE i % 3 <> 1 ORDER BY i DESC) TO STDOUT CSV HEADER",
    "COPY t TO STDOUT (FORMAT binary)",
    "COPY (SELECT i, s, d, tz, b FROM t ORDER BY s, i) TO STDOUT WITH BINARY",
]


@pytest.fixture
def filled(analytical: AnalyticalEngine) -> AnalyticalEngine:
    analytical.db.execute("CREATE TABLE t (i BIGINT, s VARCHAR, f DOUBLE, d DECIMAL(18,4), "
                          "ts TIMESTAMP, tz TIMESTAMPTZ, dd DATE, b BLOB, ok BOOLEAN)")
    analytical.db.execute(FILL)
    return analytical


VALUES = [
    (1, "plain", 1.5, decimal.Decimal("12.3400"), dt.datetime(2024, 2, 29, 23, 59, 59, 1),
     b"\x00\t\\\xff", True),
    (-2, 'tab\tnl\ncr\r back\\slash "q" \'s\' a,b;c \\N', float("nan"),
     decimal.Decimal("-0.0001"), dt.datetime(1970, 1, 1), b"", False),
    (None, None, None, None, None, None, None),
    (3, "ünïcødé € 😀", float("-inf"), decimal.Decimal("1E+3"), None, b"x", None),
]
OIDS = [_types.INT8, _types.TEXT, _types.FLOAT8, _types.NUMERIC, _types.TIMESTAMP,
        _types.BYTEA, _types.BOOL]


@pytest.mark.parametrize("sql", [
    "COPY t TO STDOUT", "COPY t TO STDOUT (FORMAT text, HEADER)", "COPY t TO STDOUT CSV",
    "COPY t TO STDOUT (FORMAT csv, HEADER, DELIMITER ';', NULL 'NULL')",
    "COPY t TO STDOUT (FORMAT binary)"])
@pytest.mark.parametrize("rows", [[], VALUES[:1], VALUES * 5])
def test_a_result_encoded_in_batches_is_the_result_encoded_whole(sql, rows) -> None:
    """_copy's encoders given the rows a batch at a time (the first and last batches
    said, as _copy_out gives them): the chunks of the whole result encoded at once."""
    st = _copy.parse_copy(sql)
    names = ["a", "b", "c", "d", "e", "f", "g"]

    def encode(batch: list[Any], first: bool, last: bool) -> list[bytes]:
        return list(_copy.encode_binary(OIDS, batch, first=first, last=last) if st.binary
                    else _copy.encode_rows(st, names, batch, first=first))

    whole = encode(rows, True, True)
    for size in (1, 2, 3, 7):
        batches = [rows[i:i + size] for i in range(0, len(rows), size)]
        got = [c for i, b in enumerate(batches) for c in encode(b, i == 0, False)]
        got += encode([], not batches, True)
        assert got == whole, size


def _copy_out(cur: Any, sql: str) -> list[bytes]:
    """The CopyData of ``sql``, one block per message, as psycopg reads them."""
    with cur.copy(sql) as copy:
        return [bytes(block) for block in copy]


def test_streamed_copy_is_byte_for_byte_the_buffered_copy(start_server, filled, certs,
                                                          tmp_path, monkeypatch) -> None:
    """Each format and option (text, CSV with HEADER, DELIMITER and NULL, binary; a table,
    a column list, a query) over TLS: the streamed COPY's CopyData are the messages, byte
    for byte, the same COPY sends from a held result (a session with a ``SET VARIABLE``
    value runs its queries whole), and psql's ``\\copy`` writes those bytes to its file."""
    pulled: list[int] = []
    next_rows = RowStream.next_rows

    def counted(self: RowStream, in_turn: bool = False) -> Any:
        pulled.append(1)
        return next_rows(self, in_turn)

    monkeypatch.setattr(RowStream, "next_rows", counted)
    srv = start_server(filled)
    with psycopg.connect(**srv.dsn, autocommit=True) as streamed, \
            psycopg.connect(**srv.dsn, autocommit=True) as held:
        held.execute("SET VARIABLE whole = 1")
        for sql in STATEMENTS:
            pulled.clear()
            with held.cursor() as cur:
                want = _copy_out(cur, sql)
                assert cur.rowcount == (THIRDS if "% 3" in sql else ROWS)
            assert not pulled, "the held session streamed"
            with streamed.cursor() as cur:
                got = _copy_out(cur, sql)
                assert cur.rowcount == (THIRDS if "% 3" in sql else ROWS)
            assert len(pulled) > 3, f"not streamed: {sql}"
            assert len(got) == len(want) and got == want, sql
        assert _open_streams(srv) == 0
        with held.cursor() as cur:
            want_csv = b"".join(_copy_out(cur, STATEMENTS[3]))
    out = tmp_path / "t.csv"
    conninfo = (f"host=localhost port={srv.port} user={USER} dbname=db sslmode=verify-full "
                f"sslrootcert={certs[0]}")
    query = STATEMENTS[3].removeprefix("COPY ").replace(" TO STDOUT ", f" TO '{out}' ")
    done = subprocess.run(["psql", conninfo, "-X", "-v", "ON_ERROR_STOP=1", "-c",
                           f"\\copy {query}"], env={**os.environ, "PGPASSWORD": PASSWORD},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"COPY {ROWS}"
    assert out.read_bytes() == want_csv


def _copy_data_until_ready(raw: Raw) -> tuple[dict[bytes, int], bytes | None]:
    counts: dict[bytes, int] = {}
    error = None
    while True:
        m = raw.read()
        assert m is not None, "the server closed the connection"
        counts[m[0]] = counts.get(m[0], 0) + 1
        if m[0] == b"E":
            error = m[1]
        if m[0] == b"Z":
            return counts, error


def test_a_cancel_mid_copy_ends_it_with_57014_after_the_data(start_server, filled,
                                                             tmp_path) -> None:
    """A CancelRequest while a slow client reads an endless COPY: CopyData, then
    ErrorResponse 57014 and no CopyDone; the stream is released, the access-log line
    says 57014, and the session goes on."""
    log_path = tmp_path / "access.log"
    srv = start_server(filled, secure=False, access_log=AccessLog(log_path))
    raw = Raw(srv.port)
    start = raw.startup()
    pid, key = struct.unpack("!ii", next(b for k, b in start if k == b"K"))
    raw.send(msg(b"Q", cstr("COPY (SELECT x.i, y.s FROM t x, t y) TO STDOUT")))
    assert raw.read()[0] == b"H"  # type: ignore[index]
    got = 0
    while got < 1000:
        m = raw.read()
        assert m is not None and m[0] == b"d"
        got += 1
    assert _open_streams(srv) == 1
    cancel = socket.create_connection(("127.0.0.1", srv.port))
    cancel.sendall(struct.pack("!iiii", 16, 80877102, pid, key))
    cancel.close()
    counts, error = _copy_data_until_ready(raw)
    assert error is not None and sqlstate(error) == "57014"
    assert b"c" not in counts and b"C" not in counts
    _wait_for(lambda: _open_streams(srv) == 0, "the stream was released")
    raw.send(msg(b"Q", cstr("COPY (SELECT 1 AS one) TO STDOUT")))
    assert raw.until(b"Z") == [(b"H", b"\0\0\x01\0\0"), (b"d", b"1\n"), (b"c", b""),
                               (b"C", b"COPY 1\0"), (b"Z", b"I")]
    raw.close()
    srv.stop()
    copies = [(e["rows"], e.get("sqlstate")) for e in lines(log_path.read_bytes())
              if e["kind"] == "COPY"]
    assert copies == [(0, "57014"), (1, None)]


def test_the_statement_timeout_ends_a_streamed_copy(start_server, filled) -> None:
    """The statement timeout counts from the COPY's start over sending its rows: psycopg
    reads blocks of an endless COPY, then gets QueryCanceled (statement timeout)."""
    srv = start_server(filled)
    with psycopg.connect(**srv.dsn, autocommit=True) as c:
        c.execute("SET statement_timeout = 1000")
        blocks = 0
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            with c.cursor().copy("COPY (SELECT x.i, y.s FROM t x, t y) TO STDOUT") as copy:
                for _ in copy:
                    blocks += 1
        assert blocks > 1000
        assert _open_streams(srv) == 0
        assert c.execute("SELECT count(*) FROM t").fetchone() == (ROWS,)


def test_a_client_gone_mid_copy_ends_its_session_and_stream(start_server, filled) -> None:
    """A client that closes its socket in the middle of an endless COPY: its session and
    stream end (the parts it held released), other sessions go on."""
    srv = start_server(filled, secure=False)
    raw = Raw(srv.port)
    raw.startup()
    raw.send(msg(b"Q", cstr("COPY (SELECT x.i, y.s FROM t x, t y) TO STDOUT (FORMAT binary)")))
    size = 0
    while size < 1 << 20:
        m = raw.read()
        assert m is not None and m[0] in (b"H", b"d")
        size += len(m[1])
    raw.close()
    _wait_for(lambda: _open_streams(srv) == 0 and not srv.server.sessions,
              "the session and its stream ended")
    assert filled.db._readers_running == 0
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="x") as c:
        assert c.execute("SELECT count(*) FROM t").fetchall() == [(ROWS,)]


def test_masking_and_the_access_log_apply_to_a_streamed_copy(start_server, filled,
                                                             tmp_path) -> None:
    """A reader's masking policy rewrites the COPY's query before it starts (every row
    masked); the access-log line counts the rows sent."""
    from cryptdisk.server import PolicyStore

    filled.policies = PolicyStore(tmp_path / "a.policies", filled.keyring, filled)
    log_path = tmp_path / "access.log"
    srv = start_server(filled, access_log=AccessLog(log_path))
    bob_dsn = masked_reader(srv, "t", "s")
    with psycopg.connect(**bob_dsn, autocommit=True) as bob, bob.cursor() as cur:
        text = b"".join(_copy_out(cur, "COPY t (i, s) TO STDOUT")).decode()
        assert {line.split("\t")[1] for line in text.splitlines()} == {"***"}
        assert len(text.splitlines()) == ROWS
        text = b"".join(_copy_out(cur, "COPY (SELECT s FROM t WHERE i < 20000) TO STDOUT "
                                  "(FORMAT csv)")).decode()
        assert text == "***\n" * 20000
    srv.stop()
    bobs = [(e["kind"], e["rows"], e.get("sqlstate"), e["tables"])
            for e in lines(log_path.read_bytes()) if e["user"] == "bob"]
    assert bobs == [("COPY", ROWS, None, ["t"]), ("COPY", 20000, None, ["t"])]


#: 400,000 rows of about 610 bytes: 245 MB of CopyData, almost 4x the server's 64 MB
BIG = "COPY (SELECT i, repeat('x', 600) || i AS pad FROM range(400000) r(i)) TO STDOUT"


def test_memory_of_a_large_copy_stays_bounded_in_a_server_process(tmp_path) -> None:
    """A real server process (memory_limit 64MB) sends a 245 MB COPY: its peak RSS grows
    by far less than the data (23-42 MB in 3 runs; the held result grew it by 530 MB)."""
    started = time.monotonic()
    count, size, tag, grew = peak_growth(
        tmp_path, "COPY (SELECT i, repeat('x', 600) || i FROM range(40000) r(i)) TO STDOUT",
        BIG, b"d")
    took = time.monotonic() - started
    assert (count, tag) == (400_000, b"COPY 400000") and size > 3.5 * (64 << 20)
    assert grew < 64 << 20, f"the peak RSS grew by {grew >> 20} MB ({took:.1f} s)"

"""The audit line of a streamed query that decrypts is written before its rows go out:
written at the stream's end, a portal suspended mid-stream had sent thousands of
decrypted values with no line in the log, and a server killed then (or a client that
kept the portal open until the server's end) left none."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import struct

import psycopg

from cryptdisk.server._rowstream import BATCH_ROWS
from tests.server.rawclient import Raw, cstr, msg
from tests.server.test_mutate_server import engine  # noqa: F401 (a fixture)
from tests.server.test_streaming import _execute


def test_a_streamed_query_that_decrypts_is_audited_before_its_rows_go_out(
        start_server, engine) -> None:  # noqa: F811
    srv = start_server(engine, secure=False)
    n = 3 * BATCH_ROWS  # past the first two batches: streamed
    with psycopg.connect(host="127.0.0.1", port=srv.port, user="u", dbname="x",
                         autocommit=True) as c:
        c.execute("CREATE TABLE cards (pan VARCHAR, n BIGINT)")
        c.execute(f"INSERT INTO cards SELECT encrypt('4111' || i::VARCHAR, 'cards'), i "
                  f"FROM range({n}) r(i)")
    audit = engine.policies.audit
    before = len(audit.entries())
    raw = Raw(srv.port)
    raw.startup()
    raw.send(msg(b"Q", cstr("BEGIN")))
    raw.until(b"Z")
    raw.send(msg(b"P", cstr("s") + cstr("SELECT decrypt(pan, 'cards') FROM cards")
                 + struct.pack("!h", 0))
             + msg(b"B", cstr("p") + cstr("s") + struct.pack("!hhh", 0, 0, 0)))
    out = _execute(raw, "p", BATCH_ROWS)
    assert out[-1][0] == b"s"  # suspended, the decrypted rows sent
    assert sum(kind == b"D" for kind, _ in out) == BATCH_ROWS
    (line,) = audit.entries()[before:]
    assert (line["kind"], line["functions"], line["tables"]) == (
        "function", ["decrypt"], ["cards"])
    assert line["rows"] is None  # (not known before the stream ends)
    raw.send(msg(b"C", b"P" + cstr("p")) + msg(b"S"))
    raw.until(b"Z")
    raw.send(msg(b"Q", cstr("SELECT decrypt(pan, 'cards') FROM cards LIMIT 5")))
    raw.until(b"Z")  # a result of one batch: its line, with its count, as before
    raw.close()
    entries = audit.entries()[before:]
    assert len(entries) == 2 and entries[1]["rows"] == 5

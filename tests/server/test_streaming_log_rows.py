"""The access-log line of a streamed query closed before its end counts the rows sent,
as docs/server.md says: it counted the rows read, the first two batches (16,384 rows)
for a portal that sent 10 and was closed."""

from __future__ import annotations

import os

os.environ["PSYCOPG_IMPL"] = "python"  # as tests/server/conftest.py explains

import struct

from cryptdisk.server import AccessLog
from tests.server.rawclient import Raw, cstr, msg
from tests.server.test_access_log import lines
from tests.server.test_streaming import _execute, filled  # noqa: F401 (a fixture)


def test_a_stream_closed_midway_logs_the_rows_it_sent(start_server, filled,  # noqa: F811
                                                      tmp_path) -> None:
    log_path = tmp_path / "access.log"
    srv = start_server(filled, secure=False, access_log=AccessLog(log_path))
    raw = Raw(srv.port)
    raw.startup()
    for portal, sent in (("p", 10), ("q", 3)):
        raw.send(msg(b"P", cstr("") + cstr("SELECT a FROM t") + struct.pack("!h", 0))
                 + msg(b"B", cstr(portal) + cstr("") + struct.pack("!hhh", 0, 0, 0)))
        assert _execute(raw, portal, sent)[-1][0] == b"s"
        if portal == "p":  # closed; q is left open until the session ends
            raw.send(msg(b"C", b"P" + cstr(portal)) + msg(b"S"))
            raw.until(b"Z")
    raw.send(msg(b"X"))
    raw.close()
    srv.stop()
    got = [(e["kind"], e["rows"]) for e in lines(log_path.read_bytes())]
    assert got == [("SELECT", 10), ("SELECT", 3)]

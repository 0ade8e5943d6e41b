"""Fuzz target for the server's parsers of untrusted bytes: the startup packet, every
frontend message, COPY messages, the SCRAM exchange and the SQL lexer.

Run with atheris for coverage-guided fuzzing:

    PYTHONPATH=src python tests/fuzz/fuzz_server_protocol.py -atheris_runs=200000

`tests/fuzz/test_fuzz_server_protocol.py` runs the same target on hypothesis inputs in CI.
"""

from __future__ import annotations

import struct
import sys

from cryptdisk.errors import CryptdiskError
from cryptdisk.server import ScramServer, _sqltext, make_verifier
from cryptdisk.server import _protocol as P

VERIFIER = make_verifier("pencil", 4096, salt=b"0123456789abcdef")


def target(data: bytes) -> None:
    """Only cryptdisk's own errors (ProtocolError, LoginError, ServerError) may escape."""
    try:
        P.parse_startup(data[4:4 + max(0, min(len(data), struct.unpack("!i", data[:4])[0]
                                             if len(data) >= 4 else 0))])
    except CryptdiskError:
        pass
    pos = 4
    while pos + 5 <= len(data):  # the rest: a stream of typed messages
        kind = data[pos:pos + 1]
        length = struct.unpack("!i", data[pos + 1:pos + 5])[0]
        body = data[pos + 5:pos + 5 + max(length - 4, 0)]
        pos += 5 + max(length - 4, 0)
        for parse in (P.parse_frontend, P.parse_copy_message):
            try:
                parse(kind, body)
            except CryptdiskError:
                pass
    scram = ScramServer(VERIFIER, VERIFIER, b"\x01" * 32 if data[:1] == b"p" else None)
    half = len(data) // 2
    try:
        scram.first("SCRAM-SHA-256-PLUS" if data[:1] == b"p" else "SCRAM-SHA-256", data[:half])
        scram.final(data[half:])
    except CryptdiskError:
        pass
    text = data.decode("utf-8", "replace")
    try:
        _sqltext.split_statements(text)
        _sqltext.substitute(text, lambda n: "NULL")
        _sqltext.placeholders(text)
    except CryptdiskError:
        pass


if __name__ == "__main__":
    import atheris

    atheris.Setup(sys.argv, target)
    atheris.Fuzz()

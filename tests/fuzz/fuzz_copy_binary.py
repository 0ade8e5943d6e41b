"""Fuzz target for the server's reader of PostgreSQL's binary COPY format (untrusted bytes
from a client's COPY ... FROM STDIN (FORMAT binary)).

Run with atheris for coverage-guided fuzzing:

    PYTHONPATH=src python tests/fuzz/fuzz_copy_binary.py -atheris_runs=200000

`tests/fuzz/test_fuzz_copy_binary.py` runs the same target on hypothesis inputs in CI.
"""

from __future__ import annotations

import sys

from cryptdisk.server import _copy, _copyin, _types
from cryptdisk.server._engines import StatementError

#: column types the reader decodes differently; the first byte of the input picks 0-3 of them
OIDS = [_types.INT8, _types.TEXT, _types.FLOAT8, _types.BOOL, _types.DATE, _types.TIMESTAMP,
        _types.TIMESTAMPTZ, _types.NUMERIC, _types.BYTEA, _types.UUID, _types.INT4,
        _types.TIME, _types.INTERVAL]


def columns(seed: int) -> list[int]:
    return [OIDS[(seed >> (2 * i)) % len(OIDS)] for i in range(seed % 4)]


def target(data: bytes) -> None:
    """Rows or a StatementError (22P04 malformed, 22P03 a bad value); nothing else; the
    same read whole or split into CopyData of any size."""
    oids = columns(data[0]) if data else []
    step = 1 + (data[1] % 13 if len(data) > 1 else 0)
    try:
        rows = _copy.decode_binary(data[1:], oids)
    except StatementError as exc:
        assert exc.sqlstate in ("22P04", "22P03"), exc.sqlstate
        try:
            _pieces(data[1:], oids, step)
        except StatementError as again:
            assert again.sqlstate == exc.sqlstate, (again, exc)
        else:
            raise AssertionError("read whole it fails, split it does not") from None
        return
    assert all(len(r) == len(oids) for r in rows)
    assert _pieces(data[1:], oids, step) == rows


def _pieces(data: bytes, oids: list[int], step: int) -> list[list[object]]:
    dec = _copyin.decoder(_copy.parse_copy("COPY t FROM STDIN BINARY"), 1 << 62, oids=oids)
    return [r for i in range(0, len(data), step) for r in dec.feed(data[i:i + step])] + \
        dec.finish()


if __name__ == "__main__":
    import atheris

    atheris.Setup(sys.argv, lambda b: target(bytes(b)))
    atheris.Fuzz()

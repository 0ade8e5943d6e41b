"""Fuzz target for the server's reader of PostgreSQL's binary COPY format (untrusted bytes
from a client's COPY ... FROM STDIN (FORMAT binary)).

Run with atheris for coverage-guided fuzzing:

    PYTHONPATH=src python tests/fuzz/fuzz_copy_binary.py -atheris_runs=200000

`tests/fuzz/test_fuzz_copy_binary.py` runs the same target on hypothesis inputs in CI.
"""

from __future__ import annotations

import sys

from cryptdisk.server import _copy, _types
from cryptdisk.server._engines import StatementError

#: column types the reader decodes differently; the first byte of the input picks 0-3 of them
OIDS = [_types.INT8, _types.TEXT, _types.FLOAT8, _types.BOOL, _types.DATE, _types.TIMESTAMP,
        _types.TIMESTAMPTZ, _types.NUMERIC, _types.BYTEA, _types.UUID, _types.INT4,
        _types.TIME, _types.INTERVAL]


def columns(seed: int) -> list[int]:
    return [OIDS[(seed >> (2 * i)) % len(OIDS)] for i in range(seed % 4)]


def target(data: bytes) -> None:
    """Rows or a StatementError (22P04 malformed, 22P03 a bad value); nothing else."""
    oids = columns(data[0]) if data else []
    try:
        rows = _copy.decode_binary(data[1:], oids)
    except StatementError as exc:
        assert exc.sqlstate in ("22P04", "22P03"), exc.sqlstate
        return
    assert all(len(r) == len(oids) for r in rows)


if __name__ == "__main__":
    import atheris

    atheris.Setup(sys.argv, lambda b: target(bytes(b)))
    atheris.Fuzz()

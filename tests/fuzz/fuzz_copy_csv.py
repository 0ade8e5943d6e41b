"""Fuzz target for the server's reader of PostgreSQL's CSV COPY format (untrusted bytes
from a client's COPY ... FROM STDIN (FORMAT csv)).

Run with atheris for coverage-guided fuzzing:

    PYTHONPATH=src python tests/fuzz/fuzz_copy_csv.py -atheris_runs=200000

`tests/fuzz/test_fuzz_copy_csv.py` runs the same target on hypothesis inputs in CI.
"""

from __future__ import annotations

import sys

from cryptdisk.server import _copy, _copyin
from cryptdisk.server._engines import StatementError

#: option sets the reader parses differently; the first byte of the input picks one
OPTIONS = ["CSV", "(FORMAT csv, NULL 'NULL', HEADER)", "(FORMAT csv, DELIMITER ';')",
           "(FORMAT csv, QUOTE '''', ESCAPE '\\')", "(FORMAT csv, ESCAPE '\\', NULL '\\N')",
           "(FORMAT csv, DELIMITER '\t', QUOTE '|')"]


def _pieces(st: _copy.CopyStatement, data: bytes, step: int) -> list[list[str | None]]:
    """``data`` read as the server reads CopyData of ``step`` bytes each."""
    dec = _copyin.decoder(st, 1 << 20)
    return [r for i in range(0, len(data), step) for r in dec.feed(data[i:i + step])] + \
        dec.finish()


def target(data: bytes) -> None:
    """Rows or a StatementError (22P04 malformed, 22021 not UTF-8); nothing else; the
    same read whole or split into CopyData of any size. Rows read, written again and read
    back are the same rows."""
    options = OPTIONS[data[0] % len(OPTIONS)] if data else "CSV"
    st = _copy.parse_copy(f"COPY t FROM STDIN {options}")
    step = 1 + (data[1] % 7 if len(data) > 1 else 0)
    try:
        rows = _copy.decode_rows(st, data[1:])
    except StatementError as exc:
        assert exc.sqlstate in ("22P04", "22021"), exc.sqlstate
        try:
            _pieces(st, data[1:], step)
        except StatementError as again:
            assert again.sqlstate == exc.sqlstate, (again, exc)
        else:
            raise AssertionError("read whole it fails, split it does not") from None
        return
    assert _pieces(st, data[1:], step) == rows
    out = _copy.parse_copy(f"COPY t TO STDOUT {options.replace(', HEADER', '')}")
    again = b"".join(b"".join(_copy.encode_rows(out, ["c"] * len(row), [tuple(row)]))
                     for row in rows)
    st.header = False
    assert _copy.decode_rows(st, again) == rows


if __name__ == "__main__":
    import atheris

    atheris.Setup(sys.argv, lambda b: target(bytes(b)))
    atheris.Fuzz()

"""Fuzz target for a part's lookup block parser (``cryptdisk.db._lookup.parse``).

A plain part's lookup block is read unauthenticated, so its parser takes untrusted bytes:
it must answer a :class:`~cryptdisk.db._lookup.Lookup` or None, and a parsed block's
chunk and codec lookups only a :class:`~cryptdisk.errors.FormatError`.

Run with atheris for coverage-guided fuzzing:

    PYTHONPATH=src python -m tests.fuzz.fuzz_lookup -atheris_runs=200000

`tests/fuzz/test_fuzz_lookup.py` runs the same target on hypothesis-generated inputs in CI.
"""

from __future__ import annotations

import sys

from cryptdisk.db import _lookup
from cryptdisk.errors import FormatError


def target(data: bytes) -> None:
    """Only documented outcomes; anything else is a bug."""
    at = int.from_bytes(data[:3], "little")
    found = _lookup.parse(data[3:], at)
    if found is None:
        return
    assert isinstance(found, _lookup.Lookup)
    assert sum(found.groups) == found.rows
    for rg in range(min(len(found.groups), 64)):
        for j in range(min(len(found.leaves), 64)):
            try:
                start, end, values = found.chunk(rg, j)
            except FormatError:
                pass
            else:
                assert 4 <= start <= end <= found.at and values >= 0
            codec, encodings = found.codec(rg, j)
            assert isinstance(codec, str) and all(isinstance(e, str) for e in encodings)


def main() -> None:  # pragma: no cover - run by hand under atheris
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()

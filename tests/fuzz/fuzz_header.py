"""Fuzz target for the parsers of untrusted bytes: the header and a whole-file open.

Covers every kind, framed files (kind 3) included: their header bytes 12-15
(lead, frame extra) decide where every record lies, so a parsed header's
geometry is measured against the input's size, and the file is opened both
read-only and for update (``"r+b"`` reads it, never writes).

Run with atheris for coverage-guided fuzzing:

    PYTHONPATH=src python tests/fuzz/fuzz_header.py -atheris_runs=200000

`tests/fuzz/test_fuzz_header.py` runs the same target on hypothesis-generated inputs in CI.
"""

from __future__ import annotations

import os
import sys
import tempfile

from cryptdisk import Key, Keyring
from cryptdisk import open as cd_open
from cryptdisk.errors import CryptdiskError
from cryptdisk.format import Header, Kind, SegmentLayout

RING = Keyring([Key(1, bytes(range(32))), Key(2, bytes(range(16)))], current_key_id=1)
_DIR = tempfile.mkdtemp(prefix="cryptdisk-fuzz-")
_PATH = os.path.join(_DIR, "input.cd")


def target(data: bytes) -> None:
    """Only documented errors may escape; anything else is a bug."""
    try:
        header = Header.parse(data)
    except CryptdiskError:
        pass
    else:
        if header.kind in Kind.WRITABLE:
            count, size, cut = SegmentLayout.of(header).measure(len(data))
            assert count >= 0 and size >= 0 and 0 <= cut <= 32, (count, size, cut)
    for mode in ("rb", "r+b"):
        with open(_PATH, "wb") as f:
            f.write(data)
        try:
            with cd_open(_PATH, mode, keyring=RING) as f:
                f.read()
        except CryptdiskError:
            pass


def main() -> None:  # pragma: no cover - run by hand under atheris
    import atheris

    atheris.instrument_all()
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()

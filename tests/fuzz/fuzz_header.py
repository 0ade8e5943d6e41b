"""Fuzz target for the parsers of untrusted bytes: the header and a whole-file open.

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
from cryptdisk.format import Header

RING = Keyring([Key(1, bytes(range(32))), Key(2, bytes(range(16)))], current_key_id=1)
_DIR = tempfile.mkdtemp(prefix="cryptdisk-fuzz-")
_PATH = os.path.join(_DIR, "input.cd")


def target(data: bytes) -> None:
    """Only documented errors may escape; anything else is a bug."""
    try:
        Header.parse(data)
    except CryptdiskError:
        pass
    with open(_PATH, "wb") as f:
        f.write(data)
    try:
        with cd_open(_PATH, "rb", keyring=RING) as f:
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

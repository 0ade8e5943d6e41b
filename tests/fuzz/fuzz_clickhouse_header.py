"""Fuzz target: ClickHouse ``ENC`` header parsing and reading arbitrary bytes as a ClickHouse file.

Run with atheris::

    PYTHONPATH=src python tests/fuzz/fuzz_clickhouse_header.py -runs=200000

CI runs :func:`check` on hypothesis-generated inputs (``test_fuzz_clickhouse_header.py``).
Only the documented exceptions may escape the parser; a header that parses must
serialise back to the same bytes, and reading its body must always succeed.
"""

from __future__ import annotations

import io
import sys
from types import SimpleNamespace

_KEY = bytes(range(32))
_mods = SimpleNamespace()


def _load() -> SimpleNamespace:
    """Import cryptdisk lazily, so atheris can instrument exactly those imports."""
    if not vars(_mods):
        from cryptdisk import errors
        from cryptdisk.format import clickhouse, source_for

        _mods.ch, _mods.source_for = clickhouse, source_for
        _mods.WrongKeyError = errors.WrongKeyError
        #: What CHHeader.parse documents that it raises.
        _mods.documented = (errors.NotEncryptedError, errors.UnsupportedVersionError,
                            errors.MalformedHeaderError)
    return _mods


def check(data: bytes) -> None:
    """Parse ``data`` as a ClickHouse file; raise AssertionError on any undocumented behaviour."""
    m = _load()
    ch = m.ch
    try:
        header = ch.CHHeader.parse(data, "fuzz-input")
    except m.documented:
        return
    assert ch.is_clickhouse_header(data)
    if data[3:5] != b"\x00\x01":  # big-endian v1 is re-serialised little-endian
        assert header.to_bytes() == data[: ch.CH_HEADER_SIZE]
    assert ch.CHHeader.parse(header.to_bytes()) == header
    key = _KEY[: header.algorithm.key_size]
    try:
        ch.check_key(header, key, "fuzz-input")
    except m.WrongKeyError:
        pass
    reader = ch.CHReader(m.source_for(io.BytesIO(data)), header, key, "fuzz-input")
    assert reader.size == len(data) - ch.CH_HEADER_SIZE
    whole = reader.read_at(0, len(data))
    assert len(whole) == reader.size
    mid = reader.size // 2
    assert reader.read_at(mid, 21) == whole[mid : mid + 21]


def TestOneInput(data: bytes) -> None:
    check(data)


def main() -> None:
    import atheris

    with atheris.instrument_imports(include=["cryptdisk"]):
        _load()
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

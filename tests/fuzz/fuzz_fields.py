"""Fuzz target: the field ciphertext readers (decrypt, decrypt_deterministic, base64 text).

Run with atheris::

    PYTHONPATH=src python tests/fuzz/fuzz_fields.py -runs=200000

CI runs :func:`check` on hypothesis-generated inputs (``test_fuzz_fields.py``). Only
FormatError, AuthenticationError and KeyNotFoundError may escape; nothing decrypts
except a genuine ciphertext, which decrypts to its plaintext.
"""

from __future__ import annotations

import base64
import sys
from types import SimpleNamespace

_mods = SimpleNamespace()


def _load() -> SimpleNamespace:
    """Import cryptdisk lazily, so atheris can instrument exactly those imports."""
    if not vars(_mods):
        import pyarrow as pa

        from cryptdisk import errors, fields
        from cryptdisk.keys import Key

        _mods.pa, _mods.fields = pa, fields
        _mods.key = fields.FieldKey("fuzz", Key(1, bytes(range(32))))
        _mods.genuine = {
            bytes(fields.encrypt_deterministic([b"plain"], _mods.key)[0].as_py()): b"plain"}
        _mods.documented = (errors.FormatError, errors.AuthenticationError,
                            errors.KeyNotFoundError)
    return _mods


def check(data: bytes) -> None:
    """Decrypt ``data`` every way; raise AssertionError on any undocumented behaviour."""
    m = _load()
    f = m.fields
    for decrypt in (f.decrypt, f.decrypt_deterministic):
        for values in (m.pa.array([data], m.pa.binary()),
                       m.pa.array([data.decode("latin-1")], m.pa.string())):
            try:
                out = decrypt(values, m.key, output="binary")
            except m.documented:
                continue
            blob = data if values.type == m.pa.binary() else base64.b64decode(data)
            assert decrypt is f.decrypt_deterministic
            assert m.genuine.get(blob) == out[0].as_py()


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

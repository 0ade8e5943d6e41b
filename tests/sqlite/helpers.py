"""Helpers shared by the encrypted-SQLite tests (imported by them; not a test module)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import apsw

import cryptdisk.sqlite as csql

__all__ = ["old_layout"]


@contextlib.contextmanager
def old_layout(monkeypatch, path, keyring) -> Iterator[apsw.Connection]:
    """A connection (Python VFS) that writes WALs and journals as mutable files (kind 2),
    as cryptdisk did before they became framed files (and without claiming safe append
    then); closed at the end."""
    with monkeypatch.context() as patch:
        patch.setattr(csql._vfs, "framing", lambda *args: (0, 0))
        patch.setattr(csql._vfs, "_SAFE_APPEND", 0)
        conn = csql.connect(str(path), keyring=keyring, implementation="python")
        try:
            yield conn
        finally:
            conn.close()

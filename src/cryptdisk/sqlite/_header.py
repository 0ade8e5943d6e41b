"""Headers of the files SQLite writes: made for new files, authenticated for existing ones.

Both VFSes (Python and C) go through :func:`header_and_key`, the one place of
the SQLite store that touches keys.
"""

from __future__ import annotations

from ..errors import MalformedHeaderError
from ..format import HEADER_SIZE, Header, Kind, new_header, open_header
from ..format import KeyLookup as _KeyLookup

__all__ = ["header_and_key"]


def header_and_key(keyring: _KeyLookup, path: str, header: bytes | None,
                   segment_size: int) -> tuple[bytes, bytes]:
    """A new file's header and data key, or an existing file's (authenticated) ones."""
    if header is None:
        new, dek = new_header(Kind.MUTABLE, keyring.current_key(), segment_size=segment_size)
        return new.to_bytes(), dek
    parsed = Header.parse(header, path)
    if parsed.kind != Kind.MUTABLE:
        raise MalformedHeaderError(
            f"{path}: a {parsed.kind_name} cryptdisk file, not a database "
            "(SQLite files are stored as mutable files)"
        )
    return bytes(header[:HEADER_SIZE]), open_header(parsed, keyring, path)

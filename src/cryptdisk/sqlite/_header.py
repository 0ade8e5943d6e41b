"""Headers of the files SQLite writes: made for new files, authenticated for existing ones.

Both VFSes (Python and C) go through :func:`header_and_key` (and the C VFS's
pool of journal headers through :func:`new_headers_and_keys`): this module is
the one place of the SQLite store that touches keys.
"""

from __future__ import annotations

from ..errors import MalformedHeaderError
from ..format import HEADER_SIZE, Header, Kind, new_headers, open_header
from ..format import KeyLookup as _KeyLookup

__all__ = ["header_and_key", "new_headers_and_keys"]


def header_and_key(keyring: _KeyLookup, path: str, header: bytes | None,
                   segment_size: int, lead: int = 0, frame_extra: int = 0) -> tuple[bytes, bytes]:
    """A new file's header and data key, or an existing file's (authenticated) ones.

    A new file is a mutable file (kind 2) with segments of ``segment_size``
    bytes, or, when ``lead`` is given, a framed file (kind 3, for WALs): segment
    0 of ``lead`` bytes, later segments of ``segment_size + frame_extra``.
    """
    if header is None:
        return new_headers_and_keys(keyring, segment_size, lead, frame_extra, 1)[0]
    parsed = Header.parse(header, path)
    if parsed.kind not in Kind.WRITABLE:
        raise MalformedHeaderError(
            f"{path}: a {parsed.kind_name} cryptdisk file, not a database "
            "(SQLite files are stored as mutable files)"
        )
    return bytes(header[:HEADER_SIZE]), open_header(parsed, keyring, path)


def new_headers_and_keys(keyring: _KeyLookup, segment_size: int, lead: int, frame_extra: int,
                         count: int) -> list[tuple[bytes, bytes]]:
    """``count`` new files' headers and data keys, all of one geometry (see header_and_key).

    The C VFS makes its rollback journals' headers ahead with this, several per
    call (csrc/cryptdisk_vfs/headers.c): DELETE mode creates a journal per
    transaction.
    """
    kind = Kind.FRAMED if lead else Kind.MUTABLE
    return new_headers(kind, keyring.current_key(), count, segment_size=segment_size, lead=lead,
                       frame_extra=frame_extra)

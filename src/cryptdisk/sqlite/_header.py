"""Headers of the files SQLite writes: made for new files, authenticated for existing ones.

Both VFSes (Python and C) go through :func:`header_and_key` (the C VFS's existing
headers, read in C, through :func:`stored_header_and_key`, and its pool of journal
headers through :func:`new_headers_and_keys`): this module is the one place of the
SQLite store that touches keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import MalformedHeaderError, NotEncryptedError
from ..format import (
    TORN_HEADER_ERRORS,
    Header,
    Kind,
    new_headers,
    open_header,
    read_open_header,
    reread_delay,
)
from ..format import KeyLookup as _KeyLookup

__all__ = ["header_and_key", "new_headers_and_keys", "stored_header_and_key"]


def header_and_key(keyring: _KeyLookup, path: str, read: Callable[[], bytes] | None,
                   segment_size: int, lead: int = 0, frame_extra: int = 0) -> tuple[bytes, bytes]:
    """A new file's header and data key, or an existing file's (authenticated) ones.

    A new file (``read`` None) is a mutable file (kind 2) with segments of
    ``segment_size`` bytes, or, when ``lead`` is given, a framed file (kind 3, for
    WALs): segment 0 of ``lead`` bytes, later segments of ``segment_size +
    frame_extra``. An existing file's header is ``read()``, again if a rewrap
    (``cryptdisk sqlite rotate``) was writing it (``cryptdisk.format.read_open_header``).
    """
    if read is None:
        return new_headers_and_keys(keyring, segment_size, lead, frame_extra, 1)[0]
    seen: list[bytes] = []

    def read_and_keep() -> bytes:
        seen.append(read())
        return seen[-1]

    try:
        parsed, dek = read_open_header(read_and_keep, keyring, path,
                                       check=lambda h: _database_kind(h, path))
    except NotEncryptedError as exc:
        raise _plain_sqlite(exc, path, seen[-1] if seen else b"") from None
    return parsed.to_bytes(), dek


_SQLITE_MAGIC = b"SQLite format 3\0"


def _plain_sqlite(exc: NotEncryptedError, path: str, header: bytes) -> NotEncryptedError:
    """A plain SQLite database opened through the encrypted VFS: say so, and how to encrypt
    it, rather than the format's generic message (which guesses at ClickHouse files)."""
    if not header.startswith(_SQLITE_MAGIC):
        return exc
    return NotEncryptedError(
        f"{path}: a plain (unencrypted) SQLite database, not an encrypted one",
        hint=f"cryptdisk sqlite encrypt {path} NEW.db --keyring CONFIG writes an encrypted "
        "copy; open it with apsw or sqlite3 to read it as it is")


def stored_header_and_key(keyring: _KeyLookup, path: str, header: bytes,
                          attempt: int | None,
                          failed: dict[str, tuple[bytes, Exception]] | None = None,
                          ) -> tuple[bytes, bytes] | None:
    """An existing file's header (read by the C VFS) and data key, authenticated.

    ``attempt`` counts the reads before this one. A header that fails as one read
    while a rewrap writes it does returns None after the pause of
    ``cryptdisk.format.reread_delay``: the C VFS reads it again and calls again (the
    loop of ``read_open_header``, with the reads in C); once the pauses are used up
    the error is raised. ``attempt`` None: the caller cannot read again (one read).
    ``failed`` (the caller's, one per VFS) remembers a failed read's bytes by path
    between the calls of one loop: a read again with the same bytes fails the same
    way without a second unwrap (a provider call for a key in an HSM or a KMS).
    """
    try:
        parsed = Header.parse(header, path)
    except NotEncryptedError as exc:
        raise _plain_sqlite(exc, path, header) from None
    _database_kind(parsed, path)
    seen = failed.pop(path, None) if failed is not None else None
    try:
        if seen is not None and attempt and seen[0] == header:
            raise seen[1]
        return parsed.to_bytes(), open_header(parsed, keyring, path)
    except TORN_HEADER_ERRORS as exc:
        delay = reread_delay(attempt) if attempt is not None else None
        if delay is None:
            raise
        if failed is not None:
            failed[path] = (bytes(header), exc)
    if delay:
        time.sleep(delay)
    return None


def _database_kind(parsed: Header, path: str) -> None:
    if parsed.kind not in Kind.WRITABLE:
        raise MalformedHeaderError(
            f"{path}: a {parsed.kind_name} cryptdisk file, not a database "
            "(SQLite files are stored as mutable files)"
        )


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

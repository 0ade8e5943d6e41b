"""Reading a header that a key rotation may be rewriting at that very moment.

A rewrap (:func:`cryptdisk.keys.rewrap_file`) replaces the 128-byte header in one
``pwrite``. A process killed meanwhile leaves the old header or the new one, but a
reader's ``pread`` (or a read of a mapping) that runs *during* that write may copy some
bytes of each: Linux makes no promise of atomicity between the two (measured on this
project's machines: about 1 read in 1,200 torn by a writer looping on ``pwrite``). Only
bytes 32-112 differ between the two headers (key id, key check, key slot), so a torn
header always parses, never authenticates (the key slot's AES-GCM covers bytes 0-48),
and fails with :class:`KeyNotFoundError` (a key id of mixed bytes),
:class:`WrongKeyError` (one header's id, the other's check value) or
:class:`HeaderAuthenticationError` (one header's id, the other's key slot).

So a header that fails with one of those three is read again, after short pauses
(:data:`REREAD_DELAYS`, 0.06 s in all), and only an error that every read gives is
raised: the error of the last read, the same one a single read of that header gives.
Errors the parse raises (not cryptdisk, unsupported, malformed) are raised at once: a
rewrap never changes the bytes they come from. No plaintext is released before the
header authenticates, and the errors carry no secret, exactly as
:func:`~cryptdisk.format.open_header`'s.

Readers that only want the key id (listings, ``system.keys``, the checks of a rotation)
read again while the header's key id and check value name no key they know, and stop as
soon as two reads in a row are equal (a header no write is changing).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import HeaderAuthenticationError, KeyNotFoundError, WrongKeyError
from ._header import HEADER_SIZE, Header, open_header
from ._protocols import KeyLookup

__all__ = ["REREAD_DELAYS", "TORN_HEADER_ERRORS", "names_known_key", "read_named_header",
           "read_open_header", "reread_delay"]

#: Seconds to wait before each read again of a header that did not open (seven more reads
#: at most). A rewrap's write of 128 bytes takes microseconds; the longer pauses cover a
#: writer descheduled in the middle of it on a loaded machine.
REREAD_DELAYS: tuple[float, ...] = (0.0, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032)

#: What a header read while a rewrap writes it can fail with (see the module docs).
TORN_HEADER_ERRORS: tuple[type[Exception], ...] = (KeyNotFoundError, WrongKeyError,
                                                    HeaderAuthenticationError)

Read = Callable[[], bytes | bytearray | memoryview]


def reread_delay(attempt: int) -> float | None:
    """The pause before read ``attempt + 1`` of a header that failed (None: stop, report)."""
    return REREAD_DELAYS[attempt] if 0 <= attempt < len(REREAD_DELAYS) else None


def read_open_header(read: Read, keys: KeyLookup, path: str | None = None, *,
                     check: Callable[[Header], None] | None = None,
                     reread: bool = True) -> tuple[Header, bytes]:
    """Read, parse and authenticate a file's header; returns ``(header, dek)``.

    ``read()`` returns the file's first 128 bytes as stored now (a ``pread`` at offset
    0, a view of a mapping). A header that fails as a torn one does is read again (see
    the module docs); ``check`` (e.g. of the kind) runs on every parsed header before
    it is authenticated. ``reread=False`` reads once: for files no rewrap can change in
    place (an object store's).
    """
    attempt = 0
    last: bytes | None = None
    error: Exception | None = None
    while True:
        data = bytes(read()[:HEADER_SIZE])
        if data != last:  # the same bytes fail the same way: no second unwrap (a provider
            last = data   # call for a key in an HSM or a KMS)
            header = Header.parse(data, path)
            if check is not None:
                check(header)
            try:
                return header, open_header(header, keys, path)
            except TORN_HEADER_ERRORS as exc:
                error = exc
        delay = reread_delay(attempt) if reread else None
        if delay is None:
            assert error is not None
            raise error
        attempt += 1
        if delay:
            time.sleep(delay)


def names_known_key(keys: KeyLookup) -> Callable[[Header], bool]:
    """A test for :func:`read_named_header`: the header's key id and check value are
    those of a key in ``keys`` (no key is unwrapped, no provider called)."""
    def known(header: Header) -> bool:
        try:
            return keys.key_by_id(header.key_id).check_value == header.key_check
        except KeyNotFoundError:
            return False
    return known


def read_named_header(read: Read, path: str | None = None,
                      known: Callable[[Header], bool] | None = None) -> Header:
    """Read and parse (not authenticate) a header for what it says, its key id above all.

    A header whose key id and check value ``known`` does not accept (without ``known``:
    every header) is read again until it is accepted or two reads in a row are equal,
    with the pauses of :data:`REREAD_DELAYS`; the last read is returned.
    """
    data = bytes(read()[:HEADER_SIZE])
    header = Header.parse(data, path)
    for delay in REREAD_DELAYS:
        if known is not None and known(header):
            return header
        if delay:
            time.sleep(delay)
        again = bytes(read()[:HEADER_SIZE])
        if again == data:
            return header
        data, header = again, Header.parse(again, path)
    return header

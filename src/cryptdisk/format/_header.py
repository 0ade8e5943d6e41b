"""The 128-byte file header: parsing, sealing a new data key, unwrapping, rewrapping.

Layout (little-endian; ``docs/format.md`` is the normative spec)::

    0   8  magic        b"CRYPTDSK"
    8   1  version      1
    9   1  kind         1 sealed, 2 mutable, 3 framed (mutable, records follow frames)
    10  1  algorithm    1 AES-256-GCM, 2 AES-128-GCM (data cipher)
    11  1  segment log2 segment size = 1 << n, 9 <= n <= 24
    12  2  lead         kind 3: u16 plaintext bytes of segment 0; else zero
    14  2  frame extra  kind 3: u16, later segments hold segment size + extra; else zero
    16 16  file id      random
    32  8  key id       u64 id of the key-encryption key
    40  8  key check    8-byte check value of that key
    48 64  key slot     nonce(12) || AES-GCM(KEK, nonce, DEK, ad=header[0:48]), zero padded
    112 16 reserved     zero

The key slot's AES-GCM tag authenticates every byte before it; the zero fields
after it are checked literally. So no header byte can change unnoticed.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace

from cryptography.exceptions import InvalidTag

from ..errors import (
    HeaderAuthenticationError,
    KeyNotFoundError,
    MalformedHeaderError,
    NotEncryptedError,
    UnsupportedVersionError,
    WrongKeyError,
)
from ._cipher import TAG_SIZE, Algorithm
from ._protocols import KeyLookup, WrappingKey

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "MAX_SEGMENT_SIZE",
    "MIN_SEGMENT_SIZE",
    "VERSION",
    "Header",
    "Kind",
    "new_header",
    "new_headers",
    "open_header",
    "rewrap_header",
]

MAGIC = b"CRYPTDSK"
VERSION = 1
HEADER_SIZE = 128
AUTH_PREFIX = 48  # header[0:48] is the key slot's associated data
SLOT_OFFSET = 48
SLOT_SIZE = 64
WRAP_NONCE = 12
MIN_SEGMENT_SIZE = 1 << 9
MAX_SEGMENT_SIZE = 1 << 24

_FIXED = struct.Struct("<8sBBBBHH16sQ8s")  # the 48 authenticated bytes
assert _FIXED.size == AUTH_PREFIX


class Kind:
    """File kinds (the header's kind byte)."""

    SEALED = 1
    MUTABLE = 2
    FRAMED = 3  # mutable, with segments that follow the plaintext's frames (SQLite's WAL)
    NAMES = {1: "sealed", 2: "mutable", 3: "framed"}
    #: kinds stored as mutable records (random writes in place)
    WRITABLE = (2, 3)


def _segment_log2(segment_size: int) -> int:
    if not isinstance(segment_size, int) or isinstance(segment_size, bool):
        raise TypeError("segment_size must be an int")
    if (segment_size & (segment_size - 1)) or not (
        MIN_SEGMENT_SIZE <= segment_size <= MAX_SEGMENT_SIZE
    ):
        raise ValueError(
            f"segment_size must be a power of two from {MIN_SEGMENT_SIZE} to "
            f"{MAX_SEGMENT_SIZE}, not {segment_size}"
        )
    return segment_size.bit_length() - 1


@dataclass(frozen=True)
class Header:
    """A parsed header. Holds no secret: the data key stays wrapped in ``key_slot``."""

    kind: int
    algorithm: Algorithm
    segment_size: int
    file_id: bytes
    key_id: int
    key_check: bytes
    key_slot: bytes  # 64 bytes: wrap nonce, wrapped key, tag, zero padding
    lead: int = 0  # kind 3: plaintext bytes of segment 0 (0 for other kinds)
    frame_extra: int = 0  # kind 3: later segments hold segment_size + frame_extra bytes

    @property
    def kind_name(self) -> str:
        return Kind.NAMES[self.kind]

    @property
    def first_segment_size(self) -> int:
        """Plaintext bytes of segment 0 when full (``lead`` for kind 3)."""
        return self.lead if self.kind == Kind.FRAMED else self.segment_size

    @property
    def frame_size(self) -> int:
        """Plaintext bytes of every later segment when full."""
        return self.segment_size + self.frame_extra

    def auth_prefix(self) -> bytes:
        return _FIXED.pack(
            MAGIC, VERSION, self.kind, int(self.algorithm),
            _segment_log2(self.segment_size), self.lead, self.frame_extra, self.file_id,
            self.key_id, self.key_check,
        )

    def to_bytes(self) -> bytes:
        out = self.auth_prefix() + self.key_slot + b"\0" * (HEADER_SIZE - AUTH_PREFIX - SLOT_SIZE)
        assert len(out) == HEADER_SIZE
        return out

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, path: str | None = None) -> Header:
        """Parse and range-check a header. Does not authenticate it (see :func:`open_header`)."""
        where = f"{path}: " if path else ""
        data = bytes(data[:HEADER_SIZE])
        if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC:
            raise NotEncryptedError(
                f"{where}not a cryptdisk file (no CRYPTDSK header)",
                hint="is it plaintext, or a ClickHouse ENC file (use --config with its keys)?",
            )
        if len(data) < HEADER_SIZE:
            raise MalformedHeaderError(
                f"{where}header is truncated ({len(data)} of {HEADER_SIZE} bytes)"
            )
        (_m, version, kind, alg, seg_log2, lead, extra, file_id, key_id, key_check) = _FIXED.unpack(
            data[:AUTH_PREFIX]
        )
        if version != VERSION:
            raise UnsupportedVersionError(
                f"{where}format version {version} is not supported (this cryptdisk reads "
                f"version {VERSION})",
                hint="upgrade cryptdisk",
            )
        if kind not in Kind.NAMES:
            raise UnsupportedVersionError(f"{where}unknown file kind {kind}")
        try:
            algorithm = Algorithm(alg)
        except ValueError:
            raise UnsupportedVersionError(f"{where}unknown algorithm number {alg}") from None
        if not 9 <= seg_log2 <= 24:
            raise MalformedHeaderError(f"{where}segment size 2**{seg_log2} is out of range")
        if data[AUTH_PREFIX + SLOT_SIZE :] != b"\0" * 16 or (
                kind != Kind.FRAMED and (lead or extra)):
            raise MalformedHeaderError(f"{where}reserved header bytes are not zero")
        if kind == Kind.FRAMED and not 1 <= lead <= (1 << seg_log2) + extra:
            raise MalformedHeaderError(
                f"{where}framed file: segment 0 of {lead} bytes does not fit a segment of "
                f"{(1 << seg_log2) + extra} bytes"
            )
        slot_used = WRAP_NONCE + algorithm.key_size + TAG_SIZE
        slot = data[SLOT_OFFSET : SLOT_OFFSET + SLOT_SIZE]
        if slot[slot_used:] != b"\0" * (SLOT_SIZE - slot_used):
            raise MalformedHeaderError(f"{where}key slot padding is not zero")
        return cls(kind, algorithm, 1 << seg_log2, file_id, key_id, key_check, slot, lead, extra)

    def wrapped_key(self) -> bytes:
        return self.key_slot[: WRAP_NONCE + self.algorithm.key_size + TAG_SIZE]


def _slot(blob: bytes) -> bytes:
    if len(blob) > SLOT_SIZE:
        raise ValueError("wrapped key does not fit the key slot")
    return blob + b"\0" * (SLOT_SIZE - len(blob))


def _checked_geometry(kind: int, segment_size: int, lead: int, frame_extra: int) -> int:
    """``log2(segment_size)`` after checking a new header's kind and framing."""
    log2 = _segment_log2(segment_size)
    for name, value in (("lead", lead), ("frame_extra", frame_extra)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int")
    if kind == Kind.FRAMED:
        largest = min(0xFFFF, segment_size + frame_extra)
        if not (0 <= frame_extra <= 0xFFFF and 1 <= lead <= largest):
            raise ValueError(
                f"a framed file needs 0 <= frame_extra <= 65535 and 1 <= lead <= "
                f"min(65535, segment_size + frame_extra), not lead={lead}, "
                f"frame_extra={frame_extra}"
            )
    elif lead or frame_extra:
        raise ValueError("lead and frame_extra are for framed files (Kind.FRAMED) only")
    return log2


def new_header(
    kind: int, key: WrappingKey, *, algorithm: Algorithm | None = None, segment_size: int = 65536,
    lead: int = 0, frame_extra: int = 0,
) -> tuple[Header, bytes]:
    """A header for a new file with a fresh random data key; returns ``(header, dek)``.

    ``lead`` and ``frame_extra`` describe a framed file (kind 3): segment 0
    holds ``lead`` bytes, every later one ``segment_size + frame_extra``.
    """
    raw, dek = new_headers(kind, key, 1, algorithm=algorithm, segment_size=segment_size,
                           lead=lead, frame_extra=frame_extra)[0]
    return Header.parse(raw), dek


def new_headers(
    kind: int, key: WrappingKey, count: int, *, algorithm: Algorithm | None = None,
    segment_size: int = 65536, lead: int = 0, frame_extra: int = 0,
) -> list[tuple[bytes, bytes]]:
    """``count`` new files' headers (as bytes) and data keys, as :func:`new_header` makes them.

    For callers that create many short-lived files of one geometry (SQLite's
    rollback journals): the checks and the fixed fields are done once, and
    the file ids and data keys come from one ``os.urandom`` call, so a header
    costs about a third of a single one's. Each has its own random file id and
    data key, wrapped under ``key`` with its own random nonce.
    """
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"count must be a positive int, not {count!r}")
    alg = Algorithm.parse(algorithm) if algorithm is not None else key.algorithm
    log2 = _checked_geometry(kind, segment_size, lead, frame_extra)
    fixed = _FIXED.pack(MAGIC, VERSION, kind, int(alg), log2, lead, frame_extra, bytes(16),
                        key.key_id, key.check_value)
    before, after = fixed[:16], fixed[32:]  # the file id is bytes 16-32
    tail = bytes(HEADER_SIZE - AUTH_PREFIX - SLOT_SIZE)
    step = 16 + alg.key_size
    randoms = os.urandom(count * step)
    out = []
    for at in range(0, count * step, step):
        prefix = before + randoms[at : at + 16] + after
        dek = randoms[at + 16 : at + step]
        out.append((prefix + _slot(key.wrap(dek, prefix)) + tail, dek))
    return out


def open_header(header: Header, keys: KeyLookup, path: str | None = None) -> bytes:
    """Authenticate the header and return the file's data key.

    Raises :class:`KeyNotFoundError` when ``keys`` has no key with the header's
    id, :class:`WrongKeyError` when the key with that id is a different key, and
    :class:`HeaderAuthenticationError` when the header was tampered with.
    """
    where = f"{path}: " if path else ""
    try:
        key = keys.key_by_id(header.key_id)
    except KeyNotFoundError as exc:  # the keyring does not know the file: name it
        if not path or exc.path is not None or type(exc) is not KeyNotFoundError:
            raise
        raise KeyNotFoundError(f"{where}{exc}", key_id=exc.key_id, path=path,
                               hint=exc.hint) from None
    if key.check_value != header.key_check:
        raise WrongKeyError(
            f"{where}the key with id {header.key_id} is not the key this file was "
            "encrypted with",
            key_id=header.key_id, path=path,
            hint="check which key was configured under this id when the file was written",
        )
    try:
        dek = key.unwrap(header.wrapped_key(), header.auth_prefix())
    except InvalidTag:
        raise HeaderAuthenticationError(
            f"{where}header failed to authenticate: the file was tampered with or corrupted",
            offset=0, path=path,
        ) from None
    if len(dek) != header.algorithm.key_size:
        raise HeaderAuthenticationError(f"{where}header holds a data key of the wrong size",
                                        offset=0, path=path)
    return dek


def rewrap_header(header: Header, dek: bytes, key: WrappingKey) -> Header:
    """The same header with the data key wrapped by ``key`` (segments are untouched)."""
    new = replace(header, key_id=key.key_id, key_check=key.check_value, key_slot=b"\0" * SLOT_SIZE)
    return replace(new, key_slot=_slot(key.wrap(dek, new.auth_prefix())))

"""The 64-byte header of a file on a ClickHouse encrypted disk.

Version 2 (what ClickHouse writes), little-endian::

    0   3  signature        b"ENC"
    3   2  version          u16 = 2
    5   2  algorithm        u16: 0 AES_128_CTR, 1 AES_192_CTR, 2 AES_256_CTR
    7  16  key fingerprint  u128, ClickHouse's sipHash128Keyed of the key
    23 16  IV               u128, big-endian (the first CTR counter block)
    39 25  padding          zero

Version 1 (read only; written by ClickHouse 21.x, in either byte order; a
version read as 0x0100 means the whole header is big-endian)::

    3   2  version          u16 = 1
    5   2  algorithm        u16
    7   8  key id           u64
    15  1  key hash         low 4 bits of sipHash64(key)
    16 16  IV               big-endian
    32 32  padding          zero

The header is not authenticated (nor is the data): see ``docs/clickhouse.md``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ..errors import (
    InvalidKeyError,
    MalformedHeaderError,
    NotEncryptedError,
    UnsupportedVersionError,
)
from ._ch_siphash import siphash64, siphash128_keyed

__all__ = [
    "CH_HEADER_SIZE",
    "CH_SIGNATURE",
    "CHAlgorithm",
    "CHHeader",
    "clickhouse_fingerprint",
    "clickhouse_v1_key_hash",
    "is_clickhouse_header",
]

CH_SIGNATURE = b"ENC"
CH_HEADER_SIZE = 64
_FP_K0 = 0x4368456E63727970  # "ChEncryp"
_FP_K1 = 0x7465644469736B46  # "tedDiskF"
_V2 = struct.Struct("<3sHH16s16s")
_V1_LE = struct.Struct("<3sHHQB16s")
_V1_BE = struct.Struct(">3sHHQB16s")


class CHAlgorithm(enum.IntEnum):
    """ClickHouse's encryption algorithms; the value is the header's algorithm field."""

    AES_128_CTR = 0
    AES_192_CTR = 1
    AES_256_CTR = 2

    @property
    def key_size(self) -> int:
        """Key length in bytes: 16, 24 or 32."""
        return 16 + 8 * int(self)

    @classmethod
    def parse(cls, value: str | int | CHAlgorithm) -> CHAlgorithm:
        """Accept ``"AES_128_CTR"``, ``"aes_128_ctr"``, ``"aes-128-ctr"``, ``0`` or a member."""
        if isinstance(value, CHAlgorithm):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"unknown ClickHouse algorithm number {value}") from None
        if isinstance(value, str):
            try:
                return cls[value.strip().upper().replace("-", "_")]
            except KeyError:
                known = ", ".join(a.name.lower() for a in cls)
                raise ValueError(f"unknown ClickHouse algorithm {value!r} (known: {known})") \
                    from None
        raise TypeError(f"algorithm must be a string or CHAlgorithm, not {type(value).__name__}")

    @classmethod
    def for_key(cls, key: bytes | bytearray | memoryview) -> CHAlgorithm:
        """The algorithm whose key size is ``len(key)``."""
        sizes = {a.key_size: a for a in cls}
        if len(key) not in sizes:
            raise InvalidKeyError(f"ClickHouse keys are 16, 24 or 32 bytes, not {len(key)}")
        return sizes[len(key)]


def clickhouse_fingerprint(key: bytes | bytearray | memoryview) -> bytes:
    """The 16-byte key fingerprint as stored in a version-2 header.

    Equals ClickHouse's SQL ``sipHash128Keyed((0x4368456E63727970, 0x7465644469736B46), key)``.
    """
    return siphash128_keyed(_FP_K0, _FP_K1, key)


def clickhouse_v1_key_hash(key: bytes | bytearray | memoryview) -> int:
    """The 4-bit key check a version-1 header stores next to the key id."""
    return siphash64(key) & 0x0F


def is_clickhouse_header(first_bytes: bytes | bytearray | memoryview) -> bool:
    """True if ``first_bytes`` start with ClickHouse's ``ENC`` signature and a known version."""
    head = bytes(first_bytes[:5])
    return len(head) == 5 and head[:3] == CH_SIGNATURE and head[3:5] in (
        b"\x02\x00", b"\x01\x00", b"\x00\x01")


def _where(path: str | None) -> str:
    return f"{path}: " if path else ""


@dataclass(frozen=True)
class CHHeader:
    """A parsed ClickHouse header. ``key_fingerprint`` is set for v2, ``key_id`` for v1."""

    version: int
    algorithm: CHAlgorithm
    key_fingerprint: bytes | None
    key_id: int | None
    iv: bytes
    #: Version 1 only: the low 4 bits of ``sipHash64(key)``, a weak check of the key.
    v1_key_hash: int | None = None

    def __post_init__(self) -> None:
        if self.version not in (1, 2):
            raise ValueError(f"ClickHouse header version must be 1 or 2, not {self.version}")
        object.__setattr__(self, "algorithm", CHAlgorithm.parse(self.algorithm))
        if len(self.iv) != 16:
            raise ValueError("the IV must be 16 bytes")
        if self.version == 2 and (self.key_fingerprint is None or len(self.key_fingerprint) != 16):
            raise ValueError("a version-2 header needs a 16-byte key_fingerprint")
        if self.version == 1 and (self.key_id is None or not 0 <= self.key_id < 1 << 64):
            raise ValueError("a version-1 header needs a key_id (unsigned 64-bit)")
        if self.v1_key_hash is not None and not 0 <= self.v1_key_hash <= 0xFF:
            raise ValueError("v1_key_hash is one byte")

    @property
    def iv_int(self) -> int:
        """The IV as the integer counter of the first block."""
        return int.from_bytes(self.iv, "big")

    @property
    def fingerprint(self) -> bytes:
        """The 16 bytes ClickHouse looks the key up by (its ``all_keys`` map).

        Version 2: :attr:`key_fingerprint`. Version 1: ClickHouse's synthetic
        value ``u128le(key_id | key_hash << 64)``, which matches no v2 key
        fingerprint; find v1 keys by id (:func:`ch_key_finder` does both).
        """
        if self.key_fingerprint is not None:
            return self.key_fingerprint
        assert self.key_id is not None
        return (self.key_id | (self.v1_key_hash or 0) << 64).to_bytes(16, "little")

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, path: str | None = None) -> CHHeader:
        """Parse the first 64 bytes of a file; raises a :class:`FormatError` subclass."""
        head = bytes(data[:CH_HEADER_SIZE])
        if head[:3] != CH_SIGNATURE:
            raise NotEncryptedError(
                f"{_where(path)}not a ClickHouse encrypted file (no 'ENC' signature)")
        if len(head) < CH_HEADER_SIZE:
            raise MalformedHeaderError(
                f"{_where(path)}ClickHouse header is truncated: {len(head)} of "
                f"{CH_HEADER_SIZE} bytes")
        (raw_version,) = struct.unpack_from("<H", head, 3)
        if raw_version == 2:
            _, _, alg, fingerprint, iv = _V2.unpack_from(head)
            end, key_id, small = _V2.size, None, None
        elif raw_version in (1, 0x0100):
            layout = _V1_LE if raw_version == 1 else _V1_BE
            _, _, alg, key_id, small, iv = layout.unpack_from(head)
            end, fingerprint = layout.size, None
        else:
            raise UnsupportedVersionError(
                f"{_where(path)}ClickHouse header version {raw_version} is not supported "
                "(known: 1, 2)")
        if alg > max(CHAlgorithm):
            raise UnsupportedVersionError(
                f"{_where(path)}ClickHouse algorithm {alg} is not supported "
                "(known: 0 aes_128_ctr, 1 aes_192_ctr, 2 aes_256_ctr)")
        if any(head[end:]):
            raise MalformedHeaderError(
                f"{_where(path)}ClickHouse header padding (bytes {end}..63) is not zero")
        return cls(2 if raw_version == 2 else 1, CHAlgorithm(alg), fingerprint, key_id, iv, small)

    def to_bytes(self) -> bytes:
        """The 64 header bytes (version 1 is written little-endian)."""
        if self.version == 2:
            assert self.key_fingerprint is not None
            body = _V2.pack(CH_SIGNATURE, 2, self.algorithm, self.key_fingerprint, self.iv)
        else:
            assert self.key_id is not None
            body = _V1_LE.pack(CH_SIGNATURE, 1, self.algorithm, self.key_id,
                               self.v1_key_hash or 0, self.iv)
        return body + bytes(CH_HEADER_SIZE - len(body))

    def describe_key(self) -> str:
        """How the header names its key, for messages: ``fingerprint 7526...`` or ``key id 3``."""
        if self.key_fingerprint is not None:
            return f"key fingerprint {self.key_fingerprint.hex()}"
        return f"key id {self.key_id}"

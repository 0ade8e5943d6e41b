"""ClickHouse's SipHash-2-4 variants, used only to fingerprint keys.

This is a fingerprint, not a cipher: ClickHouse stores ``sipHash128Keyed`` of
the key in every encrypted file's header so that a reader can find the key.
No library implements ClickHouse's 128-bit variant, which differs from the
reference SipHash-128: the state starts as in SipHash-64 (no ``0xee``) and the
finalisation is SipHash-64's (``v2 ^= 0xff``, four rounds), after which the
low half is ``v0 ^ v1`` and the high half ``v2 ^ v3``. The 64-bit variant is
the reference SipHash-2-4 (ClickHouse's ``sipHash64``).
"""

from __future__ import annotations

import struct

__all__ = ["siphash64", "siphash128_keyed"]

_MASK = (1 << 64) - 1
_WORDS = struct.Struct("<Q")


def _rotl(x: int, b: int) -> int:
    return ((x << b) | (x >> (64 - b))) & _MASK


def _round(v0: int, v1: int, v2: int, v3: int) -> tuple[int, int, int, int]:
    v0 = (v0 + v1) & _MASK
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = (v2 + v3) & _MASK
    v3 = _rotl(v3, 16) ^ v2
    v0 = (v0 + v3) & _MASK
    v3 = _rotl(v3, 21) ^ v0
    v2 = (v2 + v1) & _MASK
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def _state(k0: int, k1: int, data: bytes | bytearray | memoryview) -> tuple[int, int, int, int]:
    """Absorb ``data`` and run the finalisation rounds; returns the final state."""
    if not (0 <= k0 <= _MASK and 0 <= k1 <= _MASK):
        raise ValueError("SipHash keys are unsigned 64-bit integers")
    msg = bytes(data)
    v0 = 0x736F6D6570736575 ^ k0
    v1 = 0x646F72616E646F6D ^ k1
    v2 = 0x6C7967656E657261 ^ k0
    v3 = 0x7465646279746573 ^ k1
    whole = len(msg) - len(msg) % 8
    for (m,) in _WORDS.iter_unpack(msg[:whole]):
        v3 ^= m
        v0, v1, v2, v3 = _round(*_round(v0, v1, v2, v3))
        v0 ^= m
    tail = msg[whole:] + bytes(7 - len(msg) % 8) + bytes([len(msg) & 0xFF])
    (m,) = _WORDS.unpack(tail)
    v3 ^= m
    v0, v1, v2, v3 = _round(*_round(v0, v1, v2, v3))
    v0 ^= m
    v2 ^= 0xFF
    for _ in range(4):
        v0, v1, v2, v3 = _round(v0, v1, v2, v3)
    return v0, v1, v2, v3


def siphash128_keyed(k0: int, k1: int, data: bytes | bytearray | memoryview) -> bytes:
    """ClickHouse's ``sipHash128Keyed((k0, k1), data)``: 16 bytes, low half first, little-endian."""
    v0, v1, v2, v3 = _state(k0, k1, data)
    return _WORDS.pack(v0 ^ v1) + _WORDS.pack(v2 ^ v3)


def siphash64(data: bytes | bytearray | memoryview, k0: int = 0, k1: int = 0) -> int:
    """Reference SipHash-2-4 (ClickHouse's ``sipHash64`` when both keys are 0)."""
    v0, v1, v2, v3 = _state(k0, k1, data)
    return v0 ^ v1 ^ v2 ^ v3

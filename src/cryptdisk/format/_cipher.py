"""Data ciphers the format supports, and the AEAD primitive they use.

This is the lower tier: it composes ``cryptography``'s AES-GCM and nothing else.
"""

from __future__ import annotations

import enum

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["TAG_SIZE", "Algorithm", "new_aead"]

#: Every AEAD this format uses appends a 16-byte authentication tag.
TAG_SIZE = 16


class Algorithm(enum.IntEnum):
    """The data cipher of a file; the value is the header's algorithm byte."""

    AES_256_GCM = 1
    AES_128_GCM = 2

    @property
    def key_size(self) -> int:
        """Length in bytes of the data key (and of a key-encryption key) for this cipher."""
        return 32 if self is Algorithm.AES_256_GCM else 16

    @property
    def label(self) -> str:
        return self.name.replace("_", "-")

    @classmethod
    def parse(cls, value: str | int | Algorithm) -> Algorithm:
        """Accept ``"aes-256-gcm"``, ``"AES_256_GCM"``, ``1`` or an :class:`Algorithm`."""
        if isinstance(value, Algorithm):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls(value)
            except ValueError:
                raise ValueError(f"unknown algorithm number {value}") from None
        if isinstance(value, str):
            norm = value.strip().upper().replace("-", "_")
            try:
                return cls[norm]
            except KeyError:
                known = ", ".join(a.label.lower() for a in cls)
                raise ValueError(f"unknown algorithm {value!r} (known: {known})") from None
        raise TypeError(f"algorithm must be a string or Algorithm, not {type(value).__name__}")

    @classmethod
    def for_key_size(cls, size: int) -> Algorithm:
        if size == 32:
            return cls.AES_256_GCM
        if size == 16:
            return cls.AES_128_GCM
        raise ValueError(f"AES-GCM keys are 16 or 32 bytes, not {size}")


def new_aead(key: bytes | bytearray | memoryview) -> AESGCM:
    """An AES-GCM instance for a 16- or 32-byte key."""
    return AESGCM(bytes(key))

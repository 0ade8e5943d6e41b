"""An independent decoder (and encoder) for the cryptdisk format, written from docs/format.md.

It uses `cryptography`'s AES-GCM, HMAC and the standard library only; it imports
nothing from cryptdisk, so it checks the implementation against the spec.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class Rejected(Exception):
    """The decoder rejected the file; ``reason`` is one of the vector outcomes."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def key_check(kek: bytes) -> bytes:
    return hmac.new(kek, b"cryptdisk key check v1", hashlib.sha256).digest()[:8]


def _parse_header(data: bytes, keys: dict[int, bytes]) -> tuple[int, int, int, bytes, bytes]:
    if data[:8] != b"CRYPTDSK":
        raise Rejected("not encrypted")
    if len(data) < 128:
        raise Rejected("header failure")
    version, kind, alg, seg_log2 = data[8], data[9], data[10], data[11]
    if version != 1 or kind not in (1, 2) or alg not in (1, 2):
        raise Rejected("unsupported")
    if not 9 <= seg_log2 <= 24 or data[12:16] != bytes(4) or data[112:128] != bytes(16):
        raise Rejected("header failure")
    dek_len = 32 if alg == 1 else 16
    slot = data[48:112]
    used = 12 + dek_len + 16
    if slot[used:] != bytes(64 - used):
        raise Rejected("header failure")
    file_id = data[16:32]
    (key_id,) = struct.unpack("<Q", data[32:40])
    if key_id not in keys:
        raise Rejected("unknown key")
    kek = keys[key_id]
    if key_check(kek) != data[40:48]:
        raise Rejected("wrong key")
    try:
        dek = AESGCM(kek).decrypt(slot[:12], slot[12:used], data[:48])
    except InvalidTag:
        raise Rejected("header failure") from None
    return kind, 1 << seg_log2, alg, file_id, dek


def decode(data: bytes, keys: dict[int, bytes]) -> bytes:
    """The plaintext of a whole file, or :class:`Rejected` with the reason."""
    kind, seg, _alg, file_id, dek = _parse_header(data, keys)
    aead = AESGCM(dek)
    body = data[128:]
    out = []
    if kind == 1:
        record = seg + 16
        full, rest = divmod(len(body), record)
        if rest < 16:
            raise Rejected("truncated")
        count = full + 1
        for i in range(count):
            chunk = body[i * record : (i + 1) * record]
            nonce = bytes(3) + i.to_bytes(8, "big") + (b"\x01" if i == count - 1 else b"\x00")
            try:
                out.append(aead.decrypt(nonce, chunk, b""))
            except InvalidTag:
                raise Rejected("auth failure") from None
        return b"".join(out)
    record = seg + 32
    full, rest = divmod(len(body), record)
    if 0 < rest <= 32:
        raise Rejected("truncated")
    for i in range(full + (1 if rest else 0)):
        chunk = body[i * record : (i + 1) * record]
        try:
            out.append(aead.decrypt(chunk[:16], chunk[16:], file_id + struct.pack("<Q", i)))
        except InvalidTag:
            raise Rejected("auth failure") from None
    return b"".join(out)


def encode_sealed(plaintext: bytes, *, kek: bytes, key_id: int, dek: bytes, file_id: bytes,
                  wrap_nonce: bytes, seg_log2: int) -> bytes:
    """A sealed file from its parts, as the spec lays it out (deterministic)."""
    seg = 1 << seg_log2
    alg = 1 if len(dek) == 32 else 2
    prefix = (b"CRYPTDSK" + bytes([1, 1, alg, seg_log2]) + bytes(4) + file_id
              + struct.pack("<Q", key_id) + key_check(kek))
    slot = wrap_nonce + AESGCM(kek).encrypt(wrap_nonce, dek, prefix)
    header = prefix + slot + bytes(64 - len(slot)) + bytes(16)
    # whole segments, then the final short (possibly empty) one
    pieces = [plaintext[i : i + seg] for i in range(0, len(plaintext) // seg * seg, seg)]
    pieces.append(plaintext[len(plaintext) // seg * seg :])
    aead = AESGCM(dek)
    body = b"".join(
        aead.encrypt(bytes(3) + i.to_bytes(8, "big") + bytes([i == len(pieces) - 1]), p, b"")
        for i, p in enumerate(pieces)
    )
    return header + body

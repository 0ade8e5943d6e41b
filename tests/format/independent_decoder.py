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


class _Parsed:
    """What a header says: kind, segment size, framing (lead, frame size), file id, DEK."""

    def __init__(self, kind: int, seg: int, lead: int, frame: int, file_id: bytes,
                 dek: bytes) -> None:
        self.kind, self.seg, self.lead, self.frame = kind, seg, lead, frame
        self.file_id, self.dek = file_id, dek


def _parse_header(data: bytes, keys: dict[int, bytes]) -> _Parsed:
    if data[:8] != b"CRYPTDSK":
        raise Rejected("not encrypted")
    if len(data) < 128:
        raise Rejected("header failure")
    version, kind, alg, seg_log2 = data[8], data[9], data[10], data[11]
    if version != 1 or kind not in (1, 2, 3) or alg not in (1, 2):
        raise Rejected("unsupported")
    if not 9 <= seg_log2 <= 24 or data[112:128] != bytes(16):
        raise Rejected("header failure")
    seg = 1 << seg_log2
    lead, extra = struct.unpack("<HH", data[12:16])
    if kind == 3:
        if lead == 0 or lead > seg + extra:
            raise Rejected("header failure")
    elif lead or extra:
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
    if kind == 3:
        return _Parsed(kind, seg, lead, seg + extra, file_id, dek)
    return _Parsed(kind, seg, seg, seg, file_id, dek)


def _record_lengths(body_len: int, lead: int, frame: int) -> list[int]:
    """Stored lengths of the records of a mutable/framed body (docs/format.md's rules)."""
    if body_len == 0:
        return []
    if body_len <= 32:
        raise Rejected("truncated")
    if body_len <= lead + 32:
        return [body_len]
    full, rest = divmod(body_len - (lead + 32), frame + 32)
    if 0 < rest <= 32:
        raise Rejected("truncated")
    return [lead + 32] + [frame + 32] * full + ([rest] if rest else [])


def decode(data: bytes, keys: dict[int, bytes]) -> bytes:
    """The plaintext of a whole file, or :class:`Rejected` with the reason."""
    h = _parse_header(data, keys)
    aead = AESGCM(h.dek)
    body = data[128:]
    out = []
    if h.kind == 1:
        record = h.seg + 16
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
    at = 0
    for i, length in enumerate(_record_lengths(len(body), h.lead, h.frame)):
        chunk = body[at : at + length]
        at += length
        try:
            out.append(aead.decrypt(chunk[:16], chunk[16:], h.file_id + struct.pack("<Q", i)))
        except InvalidTag:
            raise Rejected("auth failure") from None
    return b"".join(out)


def _header(kind: int, *, kek: bytes, key_id: int, dek: bytes, file_id: bytes,
            wrap_nonce: bytes, seg_log2: int, lead: int = 0, extra: int = 0) -> bytes:
    alg = 1 if len(dek) == 32 else 2
    prefix = (b"CRYPTDSK" + bytes([1, kind, alg, seg_log2]) + struct.pack("<HH", lead, extra)
              + file_id + struct.pack("<Q", key_id) + key_check(kek))
    slot = wrap_nonce + AESGCM(kek).encrypt(wrap_nonce, dek, prefix)
    return prefix + slot + bytes(64 - len(slot)) + bytes(16)


def encode_sealed(plaintext: bytes, *, kek: bytes, key_id: int, dek: bytes, file_id: bytes,
                  wrap_nonce: bytes, seg_log2: int) -> bytes:
    """A sealed file from its parts, as the spec lays it out (deterministic)."""
    seg = 1 << seg_log2
    header = _header(1, kek=kek, key_id=key_id, dek=dek, file_id=file_id,
                     wrap_nonce=wrap_nonce, seg_log2=seg_log2)
    # whole segments, then the final short (possibly empty) one
    pieces = [plaintext[i : i + seg] for i in range(0, len(plaintext) // seg * seg, seg)]
    pieces.append(plaintext[len(plaintext) // seg * seg :])
    aead = AESGCM(dek)
    body = b"".join(
        aead.encrypt(bytes(3) + i.to_bytes(8, "big") + bytes([i == len(pieces) - 1]), p, b"")
        for i, p in enumerate(pieces)
    )
    return header + body


def encode_framed(plaintext: bytes, *, kek: bytes, key_id: int, dek: bytes, file_id: bytes,
                  wrap_nonce: bytes, seg_log2: int, lead: int, extra: int,
                  nonces: list[bytes]) -> bytes:
    """A framed (kind 3) file from its parts; ``nonces`` are the records' 16-byte nonces."""
    frame = (1 << seg_log2) + extra
    header = _header(3, kek=kek, key_id=key_id, dek=dek, file_id=file_id,
                     wrap_nonce=wrap_nonce, seg_log2=seg_log2, lead=lead, extra=extra)
    pieces = [plaintext[:lead]] if plaintext else []
    pieces += [plaintext[i : i + frame] for i in range(lead, len(plaintext), frame)]
    if len(nonces) != len(pieces):
        raise ValueError(f"{len(pieces)} segments need {len(pieces)} nonces, not {len(nonces)}")
    aead = AESGCM(dek)
    return header + b"".join(
        n + aead.encrypt(n, p, file_id + struct.pack("<Q", i))
        for i, (n, p) in enumerate(zip(nonces, pieces, strict=True))
    )

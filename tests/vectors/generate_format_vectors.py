"""Write tests/vectors/format/*.json with the implementation (run from the repo root).

    PYTHONPATH=src python tests/vectors/generate_format_vectors.py

Randomness is made deterministic (os.urandom is replaced by a seeded stream) so the
vectors are reproducible. Each vector: the KEKs (id -> hex), the file (hex), and the
expected outcome: "success" (with the plaintext and, for sealed and framed files, the
DEK, file id and wrap nonce, and for framed files the records' nonces, so an independent
encoder can rebuild the bytes), or a failure reason ("auth failure", "header failure",
"truncated", "wrong key", "unknown key", "not encrypted", "unsupported").

New vectors are only ever appended, after every existing one is generated, so the
random stream (and so the bytes) of the older vectors never changes.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from unittest import mock

OUT = Path(__file__).parent / "format"


def main() -> None:
    rng = random.Random(20261129)

    def fake_urandom(n: int) -> bytes:
        return bytes(rng.getrandbits(8) for _ in range(n))

    with mock.patch("os.urandom", fake_urandom):
        import cryptdisk
        from cryptdisk import Key, Keyring

        kek1 = fake_urandom(32)
        kek2 = fake_urandom(16)
        ring = Keyring([Key(1, kek1), Key(7, kek2)], current_key_id=1)
        ring128 = Keyring([Key(1, kek1), Key(7, kek2)], current_key_id=7)
        keys_hex = {"1": kek1.hex(), "7": kek2.hex()}
        vectors = []
        tmp = OUT / "_tmp.bin"

        def sealed(name: str, plain: bytes, seg: int, keyring: Keyring) -> bytes:
            state = rng.getstate()
            with cryptdisk.open(tmp, "wb", keyring=keyring, segment_size=seg) as f:
                f.write(plain)
            data = tmp.read_bytes()
            # Replay the same random stream to recover DEK, file id and wrap nonce.
            rng.setstate(state)
            alg_len = 32 if keyring.current_key_id == 1 else 16
            dek, file_id, wrap_nonce = fake_urandom(alg_len), fake_urandom(16), fake_urandom(12)
            rng.setstate(state)
            with cryptdisk.open(tmp, "wb", keyring=keyring, segment_size=seg) as f:
                f.write(plain)
            assert tmp.read_bytes() == data
            vectors.append({
                "name": name, "kind": "sealed", "keys": keys_hex, "file": data.hex(),
                "expected": "success", "plaintext": plain.hex(), "dek": dek.hex(),
                "file_id": file_id.hex(), "wrap_nonce": wrap_nonce.hex(),
                "key_id": keyring.current_key_id, "segment_log2": seg.bit_length() - 1,
            })
            return data

        def bad(name: str, data: bytes, expected: str, keys: dict[str, str] | None = None):
            vectors.append({"name": name, "kind": "any", "keys": keys or keys_hex,
                            "file": data.hex(), "expected": expected})

        for size in (0, 1, 511, 512, 513, 1500):
            sealed(f"sealed-aes256-seg512-{size}", fake_urandom(size), 512, ring)
        base = sealed("sealed-aes128-seg512-1300", fake_urandom(1300), 512, ring128)
        base = sealed("sealed-aes256-seg512-1200", fake_urandom(1200), 512, ring)
        rec = 512 + 16
        flip = bytearray(base)
        flip[128 + rec + 5] ^= 1
        bad("sealed-bitflip-segment1", bytes(flip), "auth failure")
        swapped = base[:128] + base[128 + rec : 128 + 2 * rec] + base[128 : 128 + rec] + base[
            128 + 2 * rec :]
        bad("sealed-swap-segments-0-1", swapped, "auth failure")
        bad("sealed-truncated-at-boundary", base[: 128 + 2 * rec], "truncated")
        bad("sealed-final-segment-cut-to-a-full-record", base[: 128 + rec + 16], "auth failure")
        bad("sealed-truncated-mid-segment", base[:-7], "auth failure")
        bad("sealed-truncated-to-header", base[:128], "truncated")
        bad("sealed-appended-byte", base + b"\0", "auth failure")
        hdr = bytearray(base)
        hdr[11] = 10  # segment size 1024
        bad("sealed-header-segment-size-edited", bytes(hdr), "header failure")
        hdr = bytearray(base)
        hdr[20] ^= 0x80  # file id
        bad("sealed-header-file-id-edited", bytes(hdr), "header failure")
        hdr = bytearray(base)
        hdr[120] = 1  # reserved
        bad("sealed-header-reserved-nonzero", bytes(hdr), "header failure")
        hdr = bytearray(base)
        hdr[32] = 9  # key id 9: not in the keyring
        bad("sealed-unknown-key-id", bytes(hdr), "unknown key")
        bad("sealed-wrong-key", base, "wrong key", {"1": bytes(32).hex(), "7": kek2.hex()})
        hdr = bytearray(base)
        hdr[8] = 2
        bad("sealed-version-2", bytes(hdr), "unsupported")
        bad("not-encrypted", b"PAR1" + bytes(200), "not encrypted")

        with cryptdisk.open(tmp, "w+b", keyring=ring, segment_size=512) as f:
            f.write(fake_urandom(1400))
            f.seek(100)
            f.write(fake_urandom(700))
            f.seek(0)
            mplain = f.read()
        mdata = tmp.read_bytes()
        vectors.append({"name": "mutable-aes256-seg512-1400", "kind": "mutable",
                        "keys": keys_hex, "file": mdata.hex(), "expected": "success",
                        "plaintext": mplain.hex()})
        mrec = 512 + 32
        swapped = (mdata[:128] + mdata[128 + mrec : 128 + 2 * mrec] + mdata[128 : 128 + mrec]
                   + mdata[128 + 2 * mrec :])
        bad("mutable-swap-segments-0-1", swapped, "auth failure")
        flip = bytearray(mdata)
        flip[128 + 3] ^= 1  # a nonce byte
        bad("mutable-bitflip-nonce", bytes(flip), "auth failure")
        bad("mutable-truncated-mid-segment", mdata[:-20], "auth failure")
        bad("mutable-truncated-into-tag", mdata[: len(mdata) - 380], "truncated")
        vectors += framed_vectors(ring, ring128, keys_hex, mdata, tmp, fake_urandom)
        tmp.unlink()

    OUT.mkdir(exist_ok=True)
    path = OUT / "cryptdisk_v1.json"
    path.write_text(json.dumps({"format": "cryptdisk v1", "vectors": vectors}, indent=1) + "\n")
    print(f"wrote {len(vectors)} vectors to {path}", file=sys.stderr)


def _framed_file(keyring, tmp: Path, seg: int, lead: int, extra: int, writes, truncate=None):
    """A framed file written through MutableStore; returns (vector fields, file bytes)."""
    from cryptdisk.format import Kind, MutableStore, SegmentLayout, new_header

    header, dek = new_header(Kind.FRAMED, keyring.current_key(), segment_size=seg, lead=lead,
                             frame_extra=extra)
    tmp.write_bytes(header.to_bytes())
    fd = os.open(tmp, os.O_RDWR)
    try:
        store = MutableStore(fd, header, dek, writable=True)
        for offset, data in writes:
            store.pwrite(data, offset)
        if truncate is not None:
            store.truncate(truncate)
        plain, count = store.pread(0, store.size), store.segment_count
    finally:
        os.close(fd)
    data = tmp.read_bytes()
    layout = SegmentLayout.of(header)
    nonces = [data[layout.record_offset(i) : layout.record_offset(i) + 16] for i in range(count)]
    fields = {
        "kind": "framed", "file": data.hex(), "expected": "success", "plaintext": plain.hex(),
        "dek": dek.hex(), "file_id": header.file_id.hex(),
        "wrap_nonce": header.key_slot[:12].hex(), "key_id": keyring.current_key_id,
        "segment_log2": seg.bit_length() - 1, "lead": lead, "frame_extra": extra,
        "nonces": [n.hex() for n in nonces],
    }
    return fields, data


def framed_vectors(ring, ring128, keys_hex, mdata: bytes, tmp: Path, urandom) -> list[dict]:
    """Kind 3: a tiny SQLite-WAL-like file (lead 32, frames of 24 + 512), edge sizes, damage."""
    out: list[dict] = []

    def good(name: str, keyring, seg, lead, extra, writes, truncate=None) -> bytes:
        fields, data = _framed_file(keyring, tmp, seg, lead, extra, writes, truncate)
        out.append({"name": name, "keys": keys_hex, **fields})
        return data

    def bad(name: str, data: bytes, expected: str) -> None:
        out.append({"name": name, "kind": "any", "keys": keys_hex, "file": data.hex(),
                    "expected": expected})

    frame = 512 + 24
    wal = [(0, urandom(32))] + [(32 + k * frame, urandom(frame)) for k in range(3)]
    base = good("framed-wal-lead32-extra24-seg512-3-frames", ring, 512, 32, 24,
                [*wal, (0, urandom(32))])
    good("framed-empty", ring, 512, 32, 24, [])
    good("framed-segment0-only-20-bytes", ring, 512, 32, 24, [(0, urandom(20))])
    good("framed-segment0-only-full", ring, 512, 32, 24, [(0, urandom(32))])
    good("framed-partial-last-segment", ring, 512, 32, 24,
         [(0, urandom(32)), (32, urandom(frame)), (32 + frame, urandom(100))])
    good("framed-lead-just-over-1-frame", ring, 512, 32, 24, [(0, urandom(33))])
    good("framed-truncated-by-writer-to-mid-frame", ring, 512, 32, 24,
         [(0, urandom(32 + 3 * frame)), (700, urandom(300))], truncate=32 + frame + 7)
    good("framed-aes128-seg1024-lead-equals-frame", ring128, 1024, 1030, 6,
         [(0, urandom(2500)), (1000, urandom(100))])
    good("framed-aes256-seg512-lead600-extra100", ring, 512, 600, 100, [(0, urandom(1217))])
    r0, r1, r2, r3 = 128, 128 + 32 + 32, 128 + 64 + frame + 32, 128 + 64 + 2 * (frame + 32)
    flip = bytearray(base)
    flip[r2 + 100] ^= 1
    bad("framed-bitflip-segment2", bytes(flip), "auth failure")
    flip = bytearray(base)
    flip[r0 + 40] ^= 0x10  # segment 0's tag
    bad("framed-bitflip-segment0-tag", bytes(flip), "auth failure")
    bad("framed-swap-segments-1-2", base[:r1] + base[r2:r3] + base[r1:r2] + base[r3:],
        "auth failure")
    bad("framed-segment1-copied-over-segment2", base[:r2] + base[r1:r2] + base[r3:],
        "auth failure")
    bad("framed-truncated-into-tag", base[: r3 + 20], "truncated")
    bad("framed-truncated-mid-segment", base[: r3 + 100], "auth failure")
    bad("framed-truncated-inside-segment0", base[: r0 + 10], "truncated")
    bad("framed-truncated-to-segment0-overhead", base[: r0 + 32], "truncated")
    bad("framed-truncated-to-1-byte-of-segment0", base[: r0 + 33], "auth failure")
    bad("framed-appended-byte", base + b"\0", "truncated")
    for name, pos, value in [
        ("framed-header-lead-zero", 12, b"\0\0"),
        ("framed-header-lead-over-frame-size", 12, (frame + 1).to_bytes(2, "little")),
        ("framed-header-lead-edited", 12, (33).to_bytes(2, "little")),
        ("framed-header-frame-extra-edited", 14, (25).to_bytes(2, "little")),
        ("framed-header-kind-3-to-2", 9, b"\x02"),
        ("mutable-header-nonzero-lead", 12, b"\x20"),
        ("mutable-header-nonzero-frame-extra", 15, b"\x01"),
        ("mutable-header-kind-2-to-3", 9, b"\x03"),
    ]:
        hdr = bytearray(base if name.startswith("framed") else mdata)
        hdr[pos : pos + len(value)] = value
        bad(name, bytes(hdr), "header failure")
    hdr = bytearray(base)
    hdr[9] = 4
    bad("kind-4-unsupported", bytes(hdr), "unsupported")
    return out


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parents[2])
    main()

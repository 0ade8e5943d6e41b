"""Write tests/vectors/format/*.json with the implementation (run from the repo root).

    PYTHONPATH=src python tests/vectors/generate_format_vectors.py

Randomness is made deterministic (os.urandom is replaced by a seeded stream) so the
vectors are reproducible. Each vector: the KEKs (id -> hex), the file (hex), and the
expected outcome: "success" (with the plaintext and, for sealed files, the DEK, file id
and wrap nonce so an independent encoder can rebuild the bytes), or a failure reason
("auth failure", "header failure", "truncated", "wrong key", "unknown key",
"not encrypted", "unsupported").
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
        tmp.unlink()

    OUT.mkdir(exist_ok=True)
    path = OUT / "cryptdisk_v1.json"
    path.write_text(json.dumps({"format": "cryptdisk v1", "vectors": vectors}, indent=1) + "\n")
    print(f"wrote {len(vectors)} vectors to {path}", file=sys.stderr)


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parents[2])
    main()

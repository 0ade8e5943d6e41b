"""NIST CAVP AES-GCM vectors (from the cryptography-vectors package) through the
primitive wrapper the format uses (:func:`cryptdisk.format.new_aead`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.exceptions import InvalidTag

from cryptdisk.format import TAG_SIZE, Algorithm, new_aead

cryptography_vectors = pytest.importorskip(
    "cryptography_vectors", reason="install the test extra: pip install -e '.[test]'"
)
GCM_DIR = Path(cryptography_vectors.__file__).parent / "ciphers" / "AES" / "GCM"


def _load(name: str, limit: int = 120) -> list[dict[str, str]]:
    """Parse a CAVP .rsp file; keep 96-bit IVs and 128-bit tags (what the format uses)."""
    out, cur = [], {}
    for line in (GCM_DIR / name).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "[")):
            continue
        if line == "FAIL":
            cur["fail"] = "1"
            continue
        k, _, v = (part.strip() for part in line.partition("="))
        if k == "Count" and cur:
            out.append(cur)
            cur = {}
        cur[k] = v
    if cur:
        out.append(cur)
    return [v for v in out if len(v["IV"]) == 24 and len(v["Tag"]) == 2 * TAG_SIZE][:limit]


ENCRYPT = _load("gcmEncryptExtIV256.rsp") + _load("gcmEncryptExtIV128.rsp")
DECRYPT = _load("gcmDecrypt256.rsp") + _load("gcmDecrypt128.rsp")


def test_vectors_were_found():
    assert len(ENCRYPT) > 100 and len(DECRYPT) > 100
    assert any("fail" in v for v in DECRYPT)


@pytest.mark.parametrize("v", ENCRYPT)
def test_nist_encrypt(v):
    aead = new_aead(bytes.fromhex(v["Key"]))
    pt, aad = bytes.fromhex(v["PT"]), bytes.fromhex(v["AAD"])
    out = aead.encrypt(bytes.fromhex(v["IV"]), pt, aad)
    assert out == bytes.fromhex(v["CT"]) + bytes.fromhex(v["Tag"])
    buf = bytearray(len(pt) + TAG_SIZE)
    aead.encrypt_into(bytes.fromhex(v["IV"]), pt, aad, buf)
    assert bytes(buf) == out


@pytest.mark.parametrize("v", DECRYPT)
def test_nist_decrypt(v):
    aead = new_aead(bytes.fromhex(v["Key"]))
    ct = bytes.fromhex(v["CT"]) + bytes.fromhex(v["Tag"])
    buf = bytearray(len(ct) - TAG_SIZE)
    if "fail" in v:
        with pytest.raises(InvalidTag):
            aead.decrypt_into(bytes.fromhex(v["IV"]), ct, bytes.fromhex(v["AAD"]), buf)
    else:
        aead.decrypt_into(bytes.fromhex(v["IV"]), ct, bytes.fromhex(v["AAD"]), buf)
        assert bytes(buf) == bytes.fromhex(v["PT"])


def test_algorithm_parse_and_key_sizes():
    assert Algorithm.parse("aes-256-gcm") is Algorithm.AES_256_GCM
    assert Algorithm.parse("AES_128_GCM") is Algorithm.AES_128_GCM
    assert Algorithm.parse(2) is Algorithm.AES_128_GCM
    assert Algorithm.AES_256_GCM.key_size == 32 and Algorithm.AES_128_GCM.key_size == 16
    with pytest.raises(ValueError, match="unknown algorithm"):
        Algorithm.parse("aes-256-ctr")
    with pytest.raises(TypeError):
        Algorithm.parse(1.5)  # type: ignore[arg-type]

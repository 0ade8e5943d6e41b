"""The C extension's AES-GCM, whichever library the build took it from (setup.py:
intel-ipsec-mb when its header is found, else libgcrypt or OpenSSL): published vectors,
tampering, interoperation with cryptography, and the library it names.

test_aead.py runs the public functions through the same extension (and through
cryptography); these tests call the extension with raw keys, as the vectors give them.
"""

import os
import shlex
import subprocess
import sysconfig

import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from cryptdisk.fields import _aead


@pytest.fixture(autouse=True)
def native():
    assert _aead._cfields is not None, "cryptdisk.fields._cfields was not built (setup.py)"


# The GCM test vectors of McGrew and Viega's GCM specification (the ones NIST's CAVP
# files start from) that have no associated data, as a field value stores them: key,
# nonce, plaintext, ciphertext, tag (test cases 1, 2, 3, 13, 14 and 15).
_FEFF = "feffe9928665731c6d6a8f9467308308"
_P3 = ("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
       "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255")
GCM_VECTORS = [
    ("00" * 16, "00" * 12, "", "", "58e2fccefa7e3061367f1d57a4e7455a"),
    ("00" * 16, "00" * 12, "00" * 16, "0388dace60b6a392f328c2b971b2fe78",
     "ab6e47d42cec13bdf53a67b21257bddf"),
    (_FEFF, "cafebabefacedbaddecaf888", _P3,
     "42831ec2217774244b7221b784d0d49ce3aa212f2c02a4e035c17e2329aca12e"
     "21d514b25466931c7d8f6a5aac84aa051ba30b396a0aac973d58e091473f5985",
     "4d5c2af327cd64a62cf35abd2ba6fab4"),
    ("00" * 32, "00" * 12, "", "", "530f8afbc74536b9a963b4f1c4cb738b"),
    ("00" * 32, "00" * 12, "00" * 16, "cea7403d4d606b6e074ec5d3baf39d18",
     "d0d1c8a799996bf0265b98b5d48ab919"),
    (_FEFF * 2, "cafebabefacedbaddecaf888", _P3,
     "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
     "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad",
     "b094dac5d93471bdec1a502270e3cc6c"),
]


def _c_open_raw(key: bytes, values: list[bytes]) -> tuple:
    """The C loop's open_column over binary values under one raw GCM key."""
    arr = pa.array(values, pa.binary())
    validity, offsets, data, wide = _aead._buffers(arr)
    return _aead._cfields.open_column(False, lambda _id: key, validity, offsets, data, wide,
                                      len(arr), arr.offset, False, pa.allocate_buffer)


def test_gcm_vectors_through_the_built_gcm_library():
    """The vectors open through the C extension's GCM (intel-ipsec-mb or the base library,
    whichever the build took; see test_the_extension_names_its_gcm_library), a flipped bit
    anywhere fails the batch and releases nothing, and what the extension seals under a
    vector's key cryptography opens."""
    header = b"\x01\x00\x00\x00\x07"
    for k, iv, p, c, t in GCM_VECTORS:
        key, nonce, plain = bytes.fromhex(k), bytes.fromhex(iv), bytes.fromhex(p)
        assert AESGCM(key).encrypt(nonce, plain, None).hex() == c + t  # the vector itself
        value = header + nonce + bytes.fromhex(c + t)
        _, offs, out, failed, reason = _c_open_raw(key, [value, value])
        assert (failed, reason) == (-1, 0)
        assert bytes(out) == plain * 2
        for at in range(5, len(value)):
            bad = bytearray(value)
            bad[at] ^= 0x80
            assert _c_open_raw(key, [value, bytes(bad)])[3:] == (1, 4)
        arr = pa.array([plain, b"", plain[:5]], pa.binary())
        validity, offsets, data, wide = _aead._buffers(arr)
        _, offs, out = _aead._cfields.seal_column(False, key, header, validity, offsets, data,
                                                   wide, len(arr), arr.offset, False,
                                                   pa.allocate_buffer)
        sealed = _aead._from_c(arr, False, offs, out, False).to_pylist()
        assert [AESGCM(key).decrypt(v[5:17], v[17:], None) for v in sealed] == arr.to_pylist()


def test_the_extension_names_its_gcm_library():
    """A build that found intel-ipsec-mb's header takes AES-GCM from it (setup.py), and
    says so; one that did not names only its base library."""
    name = _aead._cfields.library()
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    found = subprocess.run([*cc, "-E", "-x", "c", "-"], input="#include <intel-ipsec-mb.h>\n",
                           capture_output=True, text=True, check=False).returncode == 0
    if found and os.environ.get("CRYPTDISK_IPSEC_MB", "auto") != "no":
        assert "AES-GCM from intel-ipsec-mb 1." in name
        assert name.split()[0] in ("libgcrypt", "OpenSSL")  # SIV and HMAC stay there
    else:
        assert "intel-ipsec-mb" not in name

"""A config with an encrypted disk over a local directory, and a plain disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.configs import encrypted_over_local

KEY_HEX = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"
#: A string the test data contains; it must never appear in the backing files.
MARKER = "PLAINTEXT-MARKER-7f3a"


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    path = tmp_path / "cryptdisk.toml"
    path.write_text(encrypted_over_local(KEY_HEX, "segment_size = 16384", """
[disks.plain]
type = "local"
path = "plain"
"""))
    return str(path)


def assert_ciphertext_only(root: Path) -> int:
    """Every file below ``root`` is cryptdisk ciphertext without the marker; returns the count."""
    files = [p for p in root.rglob("*") if p.is_file()]
    for p in files:
        data = p.read_bytes()
        assert data.startswith(b"CRYPTDSK"), p
        assert MARKER.encode() not in data, p
        assert b"PAR1" not in data, p  # no Parquet magic: the whole file is encrypted
    return len(files)

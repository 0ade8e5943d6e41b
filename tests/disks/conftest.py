"""Disk fixtures: every disk type the conformance suite runs against."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cryptdisk import Keyring
from cryptdisk.disks import Disk, EncryptedDisk, FsspecDisk, LocalDisk

from .s3server import make_bucket, s3_server

BUCKET = "cryptdisk-test"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with s3_server() as endpoint:
        make_bucket(endpoint, BUCKET)
        yield endpoint


def _local(tmp: Path, _s3: Callable[[], str]) -> Disk:
    return LocalDisk("local", tmp / "local")


def _memory(tmp: Path, _s3: Callable[[], str]) -> Disk:
    return FsspecDisk("mem", f"memory://cd-{uuid.uuid4().hex}")


def _file_url(tmp: Path, _s3: Callable[[], str]) -> Disk:
    return FsspecDisk("file", f"file://{tmp}/fsspec-file")


def _s3(tmp: Path, s3: Callable[[], str]) -> Disk:
    return FsspecDisk("s3", f"s3://{BUCKET}/{uuid.uuid4().hex}", {"endpoint_url": s3()})


def _enc_local(tmp: Path, s3: Callable[[], str]) -> Disk:
    return EncryptedDisk("enc", _local(tmp, s3), Keyring.generate(7), prefix="secure",
                         segment_size=4096)


def _enc_s3(tmp: Path, s3: Callable[[], str]) -> Disk:
    return EncryptedDisk("encs3", _s3(tmp, s3), Keyring.generate(3), prefix="secure",
                         segment_size=4096)


def _enc_names_local(tmp: Path, s3: Callable[[], str]) -> Disk:
    return EncryptedDisk("encn", _local(tmp, s3), Keyring.generate(5), prefix="secure",
                         segment_size=4096, names_key_id=5)


def _enc_names_memory(tmp: Path, s3: Callable[[], str]) -> Disk:
    return EncryptedDisk("encnm", _memory(tmp, s3), Keyring.generate(6), segment_size=4096,
                         names_key_id=6)


def _clickhouse_local(tmp: Path, s3: Callable[[], str]) -> Disk:
    from cryptdisk.disks import ClickHouseDisk, ClickHouseKey

    key = ClickHouseKey(0, bytes.fromhex("00112233445566778899aabbccddeeff"))
    return ClickHouseDisk("ch", _local(tmp, s3), [key], 0, prefix="ch")


DISK_KINDS = {
    "local": _local,
    "memory": _memory,
    "fsspec-file": _file_url,
    "s3": _s3,
    "encrypted-local": _enc_local,
    "encrypted-s3": _enc_s3,
    "encrypted-names-local": _enc_names_local,
    "encrypted-names-memory": _enc_names_memory,
    "clickhouse-local": _clickhouse_local,
}


@pytest.fixture(params=list(DISK_KINDS))
def disk(request: pytest.FixtureRequest, tmp_path: Path) -> Disk:
    """A fresh, empty disk of each type."""
    return DISK_KINDS[request.param](tmp_path, lambda: request.getfixturevalue("s3_endpoint"))

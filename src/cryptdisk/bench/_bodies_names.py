"""Worker body of the names experiment: list a disk, then open and read every file.

Each run is a fresh process with a fresh disk object and the decrypted-read
cache off, so no name is remembered from an earlier run: ``list()`` decrypts
every name once, opening a listed file then costs no AES for its name.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..disks import EncryptedDisk, LocalDisk
from ..keys import Key, Keyring
from ._measure import Sample, Stopwatch

__all__ = ["KEY_ID", "list_and_read", "paths", "write_files"]

KEY_ID = 1
_PER_DIR = 100


def _disk(root: str, material: bytes, names: bool) -> EncryptedDisk:
    key = Key(KEY_ID, material)
    return EncryptedDisk("bench", LocalDisk("raw", Path(root)), Keyring([key], KEY_ID),
                         cache_bytes=0, names_key_id=KEY_ID if names else None)


def paths(files: int) -> list[str]:
    """``files`` paths, 100 per directory, as a partitioned table's would be."""
    return [f"table/part={i // _PER_DIR:05d}/file-{i:06d}.bin" for i in range(files)]


def write_files(root: str, material: bytes, names: bool, files: int) -> None:
    """The experiment's files (100 random bytes each) on a disk over ``root`` (untimed)."""
    disk = _disk(root, material, names)
    for p in paths(files):
        disk.write_bytes(p, os.urandom(100))


def list_and_read(root: str, key_hex: str, names: bool, files: int) -> list[Sample]:
    """Seconds to list the whole disk, and to open and read every listed file."""
    disk = _disk(root, bytes.fromhex(key_hex), names)
    with Stopwatch() as listing:
        listed = disk.list()
    with Stopwatch() as reading:
        for p in listed:
            with disk.open_read(p) as f:
                f.read()
    if len(listed) != files:
        raise RuntimeError(f"{root}: listed {len(listed)} of {files} files")
    return [listing.seconds("list", files, work_unit="files"),
            reading.seconds("open+read", files, work_unit="files")]

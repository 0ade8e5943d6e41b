"""Disks (where files live) and storage policies (which disk gets a new file).

Disk types, by the name used in configs: ``local`` (:class:`LocalDisk`),
``fsspec`` (:class:`FsspecDisk`), ``encrypted`` (:class:`EncryptedDisk`,
cryptdisk's authenticated format over another disk) and ``clickhouse``
(:class:`ClickHouseDisk`, ClickHouse's AES-CTR encrypted-disk format).
Every type honours the contract in :class:`Disk`'s module docstring.
Configs are loaded by :func:`cryptdisk.config.load_config`.
"""

from ._base import Discardable, Disk, FileInfo, PositionalRead, discardable, positional
from ._clickhouse import ClickHouseDisk, ClickHouseKey
from ._clickhouse_xml import parse_clickhouse_storage_xml
from ._convert import convert_tree
from ._detect import describe, open_any
from ._encrypted import DEFAULT_READ_CACHE_BYTES, EncryptedDisk
from ._files import AtomicWriteFile, PreadFile
from ._fsspec import FsspecDisk, check_storage_options, check_url
from ._local import LocalDisk
from ._policy import StoragePolicy, Volume

#: Disk classes by config type name.
DISK_TYPES: dict[str, type[Disk]] = {
    "local": LocalDisk,
    "fsspec": FsspecDisk,
    "encrypted": EncryptedDisk,
    "clickhouse": ClickHouseDisk,
}

__all__ = [
    "DEFAULT_READ_CACHE_BYTES",
    "DISK_TYPES",
    "AtomicWriteFile",
    "ClickHouseDisk",
    "ClickHouseKey",
    "Discardable",
    "Disk",
    "EncryptedDisk",
    "FileInfo",
    "FsspecDisk",
    "LocalDisk",
    "PositionalRead",
    "PreadFile",
    "StoragePolicy",
    "Volume",
    "check_storage_options",
    "check_url",
    "convert_tree",
    "describe",
    "discardable",
    "open_any",
    "parse_clickhouse_storage_xml",
    "positional",
]

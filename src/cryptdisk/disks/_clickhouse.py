"""``clickhouse``: ClickHouse's own encrypted-disk format (AES-CTR, ``ENC`` header) over a disk.

Byte-compatible with ClickHouse's ``type=encrypted`` disks: a 64-byte ``ENC``
header naming the algorithm and the key's fingerprint, then AES-CTR
ciphertext. Files are *not* authenticated (ClickHouse's design); prefer the
``encrypted`` disk type for new data and use this one to read, write or
migrate data that ClickHouse shares. Reading picks the key by the header's
fingerprint among all configured keys; writing uses the current key.
The byte format itself lives in :mod:`cryptdisk.format.clickhouse`.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import IO, Any, cast

from ..errors import (
    DiskFileNotFoundError,
    DiskIsADirectoryError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyringError,
)
from ..keys import export_key_material
from ._base import Disk, DiskConfig, FileInfo, positional
from ._files import PreadFile, encrypting_write
from ._paths import norm_path
from ._wrapping import WrappingDisk

__all__ = ["CH_HEADER_SIZE", "ClickHouseDisk", "ClickHouseKey", "PreadSource", "ch_module",
           "find_clickhouse_key", "header_algorithm_name"]

CH_HEADER_SIZE = 64
_KEY_SIZES = {"AES_128_CTR": 16, "AES_192_CTR": 24, "AES_256_CTR": 32}


def ch_module() -> Any:
    """The ClickHouse format module, with a clear error if this build lacks it."""
    try:
        from ..format import clickhouse
    except ImportError as exc:  # pragma: no cover - only before the format module lands
        raise ImportError("cryptdisk.format.clickhouse is not available in this build") from exc
    return clickhouse


class ClickHouseKey:
    """One ClickHouse disk key: an id and 16/24/32 bytes that never leave the object."""

    __slots__ = ("_fingerprint", "_material", "key_id")

    def __init__(self, key_id: int, material: bytes) -> None:
        if len(material) not in (16, 24, 32):
            raise InvalidKeyError(f"ClickHouse key {key_id} is {len(material)} bytes; "
                                  "AES-CTR keys are 16, 24 or 32 bytes")
        self.key_id = key_id
        self._material = bytes(material)
        self._fingerprint: bytes | None = None

    @property
    def fingerprint(self) -> bytes:
        """ClickHouse's 16-byte key fingerprint (SipHash-128), as stored in headers."""
        if self._fingerprint is None:
            self._fingerprint = bytes(ch_module().clickhouse_fingerprint(self._material))
        return self._fingerprint

    def _raw_material(self) -> bytes:
        """Key bytes, for the format module only (nothing should print or store them)."""
        return self._material

    def __repr__(self) -> str:
        return f"<ClickHouseKey id={self.key_id} bytes={len(self._material)}>"

    def __reduce__(self) -> Any:
        raise TypeError("keys cannot be pickled; reload them from the config")


class PreadSource:
    """A format *source* (``size``, ``view(offset, n)``) over a file with ``pread``."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.size = int(f.size)

    def view(self, offset: int, n: int) -> memoryview:
        return memoryview(self._f.pread(offset, max(0, min(n, self.size - offset))))

    def close(self) -> None:
        self._f.close()


def find_clickhouse_key(header: Any, keys: list[ClickHouseKey], path: str, where: str) -> bytes:
    """The key for a ClickHouse header among ``keys``; raises :class:`KeyNotFoundError`.

    ``keys`` may come from several key sets (every ``clickhouse`` disk of a config,
    and the keyring those disks take keys from), whose ids are their own: key 1 of
    one disk and key 1 of another may be different keys. So keys are told apart by
    material, never merged by id: a version-2 header finds its key by fingerprint
    among all of them; a version-1 header (id and a 4-bit key hash) by id, hash and
    size. Two different keys that both fit a version-1 header raise
    :class:`KeyringError` (the file cannot tell which wrote it). Errors name the
    file, the header's fingerprint (or v1 key id) and where the keys came from;
    never key material.
    """
    ch = ch_module()
    found: dict[bytes, ClickHouseKey] = {}
    for k in keys:
        try:
            material = ch.ch_key_finder({k.key_id: k._raw_material()})(header)
        except KeyNotFoundError:
            continue
        if header.version == 2 or len(material) == header.algorithm.key_size:
            found.setdefault(material, k)
    if not found:
        raise KeyNotFoundError(
            f"{path}: no key of {where} has the file's {header.describe_key()} "
            f"({len(keys)} ClickHouse key(s): ids {', '.join(str(k.key_id) for k in keys) or '-'})",
            key_id=header.key_id, path=path, hint="add the key that wrote the file to the "
            "disk's keys")
    if len(found) > 1:
        raise KeyringError(
            f"{path}: {len(found)} different keys of {where} fit the file's "
            f"{header.describe_key()} (a version-1 header names its key by id and a 4-bit "
            "hash only), so which one wrote it is unknown",
            hint="read the file with a config that holds only the key set (disk) it belongs to")
    key = next(iter(found))
    ch.check_key(header, key, path)
    return key


def header_algorithm_name(header: Any) -> str:
    alg = getattr(header, "algorithm", None)
    return str(getattr(alg, "name", alg))


class ClickHouseDisk(WrappingDisk):
    """Files of ``inner`` under ``prefix`` in ClickHouse's encrypted-disk format."""

    type = "clickhouse"
    config_settings = frozenset({"type", "disk", "path", "algorithm", "current_key_id", "keys",
                                 "encrypt_names", "names_key_id"})  # the last two: refused

    @classmethod
    def from_config(cls, name: str, spec: Mapping[str, Any], where: str,
                    config: DiskConfig) -> Disk:
        if {"encrypt_names", "names_key_id"} & set(spec):
            raise config.error(f"disk {name!r}: encrypt_names is not available for clickhouse "
                               "disks: ClickHouse reads the names on its disks in clear", where,
                               'use type = "encrypted" (cryptdisk\'s format) to encrypt names')
        inner = config.disk(config.string(spec, "disk", where), where)
        keys = [ClickHouseKey(i, material if isinstance(material, bytes)
                              else export_key_material(material))
                for i, _source, material in config.key_entries(name, spec, where, (16, 24, 32))]
        current = config.current_key_id(name, spec, where, [k.key_id for k in keys])
        return cls(name, inner, keys, current, prefix=spec.get("path", ""),
                   algorithm=spec.get("algorithm", "AES_128_CTR"))

    def __init__(self, name: str, inner: Disk, keys: list[ClickHouseKey], current_key_id: int,
                 *, prefix: str = "", algorithm: str = "AES_128_CTR") -> None:
        self.name = name
        self.inner = inner
        self.prefix = norm_path(prefix, allow_empty=True)
        self.keys: dict[int, ClickHouseKey] = {}
        for k in keys:  # ids are this disk's own; within it an id names one key
            seen = self.keys.setdefault(k.key_id, k)
            if seen is not k and not hmac.compare_digest(seen._raw_material(), k._raw_material()):
                raise ValueError(f"disk {name!r}: two different keys have id {k.key_id}; "
                                 "each key of a disk needs its own id")
        if current_key_id not in self.keys:
            raise KeyNotFoundError(f"disk {name!r}: current_key_id {current_key_id} is not "
                                   "among its keys", key_id=current_key_id)
        alg = algorithm.strip().upper().replace("-", "_")
        if alg not in _KEY_SIZES:
            raise ValueError(f"unknown ClickHouse algorithm {algorithm!r} "
                             f"(known: {', '.join(_KEY_SIZES)})")
        size = len(self.keys[current_key_id]._raw_material())
        if size != _KEY_SIZES[alg]:
            raise InvalidKeyError(f"disk {name!r}: {alg} needs a {_KEY_SIZES[alg]}-byte key; "
                                  f"key {current_key_id} is {size} bytes")
        self.algorithm = alg
        self.current_key_id = current_key_id

    def key_for(self, header: Any, path: str) -> bytes:
        """The key a file's header names: by fingerprint (v2) or by id and key hash (v1)."""
        return find_clickhouse_key(header, list(self.keys.values()), path,
                                   f"disk {self.name!r}")

    def open_read(self, path: str) -> IO[bytes]:
        ch = ch_module()
        try:
            raw = self.inner.open_read(self._inner(path))
        except (DiskFileNotFoundError, DiskIsADirectoryError) as exc:
            raise self._own_error(path, exc) from None
        source = PreadSource(raw)
        if source.size == 0:  # ClickHouse writes empty files without a header
            raw.close()
            return cast("IO[bytes]", PreadFile(ch.EmptyCHReader(), path, {"format": "clickhouse"}))
        try:
            header = ch.CHHeader.parse(source.view(0, CH_HEADER_SIZE), path)
            reader = ch.CHReader(source, header, self.key_for(header, path), path)
        except BaseException:
            raw.close()
            raise
        return cast("IO[bytes]", PreadFile(reader, path, {
            "format": "clickhouse", "algorithm": header_algorithm_name(header),
            "fingerprint": bytes(header.fingerprint).hex()}))

    def open_write(self, path: str) -> IO[bytes]:
        ch = ch_module()
        key = self.keys[self.current_key_id]._raw_material()
        algorithm = ch.CHAlgorithm.parse(self.algorithm)
        return encrypting_write(self._inner_write(path), path,
                                lambda raw: ch.CHWriter(raw, key, algorithm))

    def info(self, path: str) -> FileInfo:
        inner = self.inner.info(self._inner(path))
        size = max(0, inner.stored_size - CH_HEADER_SIZE)
        alg = None
        if inner.stored_size:
            with self.inner.open_read(self._inner(path)) as raw:
                header = ch_module().CHHeader.parse(
                    positional(raw).pread(0, CH_HEADER_SIZE), path)
            alg = header_algorithm_name(header)
        return FileInfo(norm_path(path), size, inner.stored_size, True, "clickhouse",
                        algorithm=alg, mtime=inner.mtime)

"""``encrypted``: cryptdisk's authenticated format over another disk.

ClickHouse semantics (an encrypted disk wraps another disk, under a path
prefix, with a set of keys and a current key that encrypts new files), with
cryptdisk's sealed format: every file gets a random data key wrapped by the
current key; reading finds the key by the id in the file's header, so files
written under an older key stay readable while that key is configured.

With ``names_key_id`` (``encrypt_names = true`` in a config) the names of files
and directories are encrypted as well, each path component with AES-SIV
(:mod:`._names`); listings decrypt them, and a stored name that does not
authenticate raises :class:`~cryptdisk.errors.NameAuthenticationError`.

Reads go through a bounded cache of decrypted reads shared by the disk's
readers (:mod:`._cache`), so an engine that re-reads a file on every query
(DuckDB through fsspec) decrypts it once.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from typing import IO, Any, cast

from ..errors import DiskError, DiskFileNotFoundError, DiskIsADirectoryError, KeyNotFoundError
from ..format import (
    DEFAULT_SEGMENT_SIZE,
    HEADER_SIZE,
    Algorithm,
    FileObjectSource,
    Header,
    Kind,
    SealedReader,
    SealedWriter,
    Source,
    names_known_key,
    new_header,
    read_named_header,
    read_open_header,
    sealed_layout,
    source_for,
)
from ..keys import Key, Keyring, rewrap_file
from ._base import Disk, DiskConfig, FileInfo, positional
from ._cache import BufferedSealedReader, CachedSealedReader, ReadCache
from ._files import PreadFile, encrypting_write
from ._local import LocalDisk
from ._names import NameCipher
from ._paths import join_prefix, norm_path
from ._wrapping import WrappingDisk

__all__ = ["DEFAULT_READ_CACHE_BYTES", "EncryptedDisk"]

#: Cache of decrypted reads per encrypted disk (plaintext in process memory only).
DEFAULT_READ_CACHE_BYTES = 256 << 20


class EncryptedDisk(WrappingDisk):
    """Files of ``inner`` under ``prefix``, sealed with cryptdisk's format (see module docs)."""

    type = "encrypted"
    config_settings = frozenset({"type", "disk", "path", "algorithm", "current_key_id", "keys",
                                 "segment_size", "cache_mb", "encrypt_names", "names_key_id"})

    @classmethod
    def from_config(cls, name: str, spec: Mapping[str, Any], where: str,
                    config: DiskConfig) -> Disk:
        inner = config.disk(config.string(spec, "disk", where), where)
        entries = config.key_entries(name, spec, where, (16, 32))
        keys = [Key(i, material, source=kind) if isinstance(material, bytes) else material
                for i, kind, material in entries]
        current = config.current_key_id(name, spec, where, [k.key_id for k in keys])
        segment_size = spec.get("segment_size", 65536)
        if not isinstance(segment_size, int) or isinstance(segment_size, bool):
            raise config.error("segment_size must be an integer", where)
        cache_mb = spec.get("cache_mb", DEFAULT_READ_CACHE_BYTES >> 20)
        if not isinstance(cache_mb, int) or isinstance(cache_mb, bool) or cache_mb < 0:
            raise config.error("cache_mb must be a whole number of MiB (0 turns the cache off)",
                               where)
        names_key_id = _names_key(name, spec, where, [k.key_id for k in keys], config)
        return cls(name, inner, Keyring(keys, current, config_path=config.path),
                   prefix=spec.get("path", ""), algorithm=spec.get("algorithm"),
                   segment_size=segment_size, cache_bytes=cache_mb << 20,
                   names_key_id=names_key_id)

    def __init__(self, name: str, inner: Disk, keyring: Keyring, *, prefix: str = "",
                 algorithm: str | Algorithm | None = None,
                 segment_size: int = DEFAULT_SEGMENT_SIZE,
                 cache_bytes: int = DEFAULT_READ_CACHE_BYTES,
                 names_key_id: int | None = None) -> None:
        if not isinstance(keyring, Keyring):
            raise TypeError("keyring must be a cryptdisk.Keyring")
        #: Encrypts file names (AES-SIV, see :mod:`._names`) when a names key is given.
        self.names: NameCipher | None = None
        if names_key_id is not None:
            if names_key_id not in keyring:
                raise KeyNotFoundError(
                    f"disk {name!r}: names_key_id {names_key_id} is not one of its keys "
                    f"({', '.join(map(str, keyring.ids))})", key_id=names_key_id,
                    hint="keep the key that encrypts the names for as long as the disk "
                    "holds files")
            self.names = NameCipher(keyring.key_by_id(names_key_id))
        self.name = name
        self.inner = inner
        self.keyring = keyring
        self.prefix = norm_path(prefix, allow_empty=True)
        self.algorithm = Algorithm.parse(algorithm) if algorithm is not None else None
        new_header(Kind.SEALED, keyring.current_key(), segment_size=segment_size)  # validates
        self.segment_size = segment_size
        #: Decrypted reads shared by every reader of this disk (0 turns it off).
        self.cache = ReadCache(cache_bytes) if cache_bytes else None
        # info() of an unchanged backing file (same size and mtime) without rereading its header
        self._info_memo: dict[tuple[str, int, float | None], FileInfo] = {}

    # -- paths: encrypted names --------------------------------------------------------

    def _inner(self, path: str) -> str:
        clean = norm_path(path)
        if self.names is not None:
            clean = self.names.encrypt_path(clean)
        return join_prefix(self.prefix, clean)

    def list(self, prefix: str = "") -> list[str]:
        if self.names is None:
            return super().list(prefix)
        clean = norm_path(prefix, allow_empty=True)
        # Stored names are encrypted whole: list the deepest directory the prefix names,
        # then match the rest of the prefix against the decrypted paths.
        directory = clean if prefix.endswith("/") else posixpath.dirname(clean)
        if directory:
            below = self._inner(directory) + "/"
        else:
            below = self.prefix + "/" if self.prefix else ""
        cut = len(self.prefix) + 1 if self.prefix else 0
        out = []
        for stored in self.inner.list(below):
            plain = self.names.decrypt_path(stored[cut:])
            if not clean or (plain.startswith(clean + "/") if prefix.endswith("/")
                             else plain.startswith(clean)):
                out.append(plain)
        return sorted(out)

    # -- reading and writing --------------------------------------------------------------

    def _read_header(self, path: str) -> tuple[Header, int]:
        """The file's (unauthenticated) header and its stored size.

        Read again while its key id and check value name no key of the disk and the
        header changes between reads: a rewrap may be writing it (read_named_header).
        """
        with self.inner.open_read(self._inner(path)) as raw:
            file = positional(raw)
            if not self.can_rewrap:  # (no header changes in place there)
                return Header.parse(file.pread(0, HEADER_SIZE), path), file.size
            return read_named_header(lambda: file.pread(0, HEADER_SIZE), path,
                                     names_known_key(self.keyring)), file.size

    def _open_source(self, path: str) -> tuple[Source, Callable[[], None]]:
        """The encrypted bytes (read with ``preadv`` on local disks) and how to release them."""
        inner_path = self._inner(path)
        if isinstance(self.inner, LocalDisk):
            fd = self.inner.open_fd(inner_path, shown=path, disk=self.name)
            try:
                source = source_for(fd)
            except BaseException:
                os.close(fd)
                raise
            return source, lambda: os.close(fd)
        try:
            raw = self.inner.open_read(inner_path)
        except (DiskFileNotFoundError, DiskIsADirectoryError) as exc:
            raise self._own_error(path, exc) from None
        source = FileObjectSource(raw, positional(raw).size)
        return source, raw.close

    def open_read(self, path: str) -> IO[bytes]:
        source, release = self._open_source(path)
        try:
            try:
                # read again if a rewrap in place (rewrap()) was writing it: see _reread.py
                header, dek = read_open_header(lambda: source.view(0, HEADER_SIZE),
                                               self.keyring, path, reread=self.can_rewrap)
            except KeyNotFoundError as exc:
                raise KeyNotFoundError(
                    f"{path}: encrypted with key id {exc.key_id}, which disk {self.name!r} "
                    f"does not have (its keys: {', '.join(map(str, self.keyring.ids))})",
                    key_id=exc.key_id, path=path, hint=exc.hint) from None
            reader = SealedReader(source, header, dek, path)
        except BaseException:
            source.close()
            release()
            raise
        inner: Any = (BufferedSealedReader(reader) if self.cache is None
                      else CachedSealedReader(reader, self.cache))
        return cast("IO[bytes]", PreadFile(_Closer(inner, release), path, {
            "format": "cryptdisk", "key_id": header.key_id,
            "algorithm": header.algorithm.label.lower(), "segment_size": header.segment_size}))

    def open_write(self, path: str) -> IO[bytes]:
        header, dek = new_header(Kind.SEALED, self.keyring.current_key(),
                                 algorithm=self.algorithm, segment_size=self.segment_size)
        return encrypting_write(self._inner_write(path), path,
                                lambda raw: SealedWriter(raw, header, dek))

    def info(self, path: str) -> FileInfo:
        try:
            inner = self.inner.info(self._inner(path))
        except DiskFileNotFoundError as exc:
            raise self._own_error(path, exc) from None
        memo_key = (path, inner.stored_size, inner.mtime)
        cached = self._info_memo.get(memo_key)
        if cached is not None:
            return cached
        header, stored = self._read_header(path)
        _count, size = sealed_layout(stored, header.segment_size, path)
        info = FileInfo(norm_path(path), size, stored, True, "cryptdisk", key_id=header.key_id,
                        algorithm=header.algorithm.label.lower(), mtime=inner.mtime)
        if len(self._info_memo) > 4096:
            self._info_memo.clear()
        self._info_memo[memo_key] = info
        return info

    @property
    def can_rewrap(self) -> bool:
        """True if :meth:`rewrap` works here (the backing disk is a local directory)."""
        return isinstance(self.inner, LocalDisk)

    def rewrap(self, path: str) -> bool:
        """Rewrap one file's header under the current key in place (segments untouched).

        Returns False if it already was under the current key. Only disks over a
        local directory can rewrite 128 bytes in place; others raise DiskError.
        """
        if not isinstance(self.inner, LocalDisk):
            raise DiskError(
                f"disk {self.name!r} is over a {self.inner.type} disk, which cannot rewrite a "
                "header in place",
                hint="rewrite the data under the current key instead (cryptdisk reencrypt)")
        # The header changes; a timestamp may not (coarse clocks), so forget what info() saw.
        self._info_memo = {k: v for k, v in self._info_memo.items() if k[0] != path}
        try:
            return rewrap_file(self.inner.os_path(self._inner(path)), self.keyring)
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}") from None

    def stored_key_id(self, path: str) -> int:
        """The key id in the file's header as stored now (read again, never remembered)."""
        try:
            return self._read_header(path)[0].key_id
        except FileNotFoundError:
            raise DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}") from None

    def remove_stale_temps(self, max_age: float = 3600.0, prefix: str = "") -> int:
        """Temporary files of killed writers, as :meth:`LocalDisk.remove_stale_temps`."""
        fn = getattr(self.inner, "remove_stale_temps", None)
        if fn is None:
            return 0
        return int(fn(max_age=max_age, prefix=self._inner(prefix) if prefix else self.prefix))


class _Closer:
    """A sealed reader that also releases what it was opened from."""

    def __init__(self, reader: Any, release: Callable[[], None]) -> None:
        self._reader = reader
        self._release = release
        self.size = reader.size
        self.read_at = reader.read_at
        self.readinto_at = reader.readinto_at
        self.readinto_spans = reader.readinto_spans
        self.advise = reader.advise

    def close(self) -> None:
        try:
            self._reader.close()
        finally:
            self._release()


def _names_key(name: str, spec: Mapping[str, Any], where: str, ids: list[int],
               config: DiskConfig) -> int | None:
    """``names_key_id`` when ``encrypt_names = true``; it never follows the current key."""
    encrypt = spec.get("encrypt_names", False)
    if not isinstance(encrypt, bool):
        raise config.error("encrypt_names must be true or false", where)
    names_key = spec.get("names_key_id")
    if not encrypt:
        if names_key is not None:
            raise config.error("names_key_id is set but encrypt_names is not true", where)
        return None
    if names_key is None:
        raise config.error(
            f"disk {name!r}: encrypt_names needs names_key_id, the key whose derived key "
            "encrypts the names", where,
            f"add names_key_id = {ids[0] if len(ids) == 1 else 'ID'}; that key must stay "
            "in the disk's keys while it holds files (rotation does not change it)")
    if not isinstance(names_key, int) or isinstance(names_key, bool) or names_key not in ids:
        raise config.error(f"disk {name!r}: names_key_id = {names_key!r} is not one of its "
                           f"key ids ({', '.join(map(str, ids))})", where,
                           "the names on this disk can only be read with the key that "
                           "encrypted them: keep it in keys")
    return names_key

"""``fsspec``: any fsspec URL (``memory://``, ``s3://bucket/prefix``, ``file://``, ...).

Atomic publish, as well as the store allows: the file is spooled to a local
temporary file while it is written; on ``close()`` an object store receives it
in one upload (a single PUT, or a multipart upload that becomes visible only
when it completes), and any other filesystem receives it under a temporary
name that is then moved over the destination. The spool (see ``_spool``) holds
the bytes this disk stores, so ciphertext under an encrypted disk; the spools of
killed writers are deleted by the next process that opens an fsspec disk.

Credentials never go in the URL or in ``storage_options`` (see :func:`check_url`
and :func:`check_storage_options`, which refuse them): use the store's environment
variables (``AWS_ACCESS_KEY_ID`` ...) or its credential files.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from typing import IO, Any, cast

from ..errors import ConfigError, DiskError, DiskFileNotFoundError, DiskIsADirectoryError
from ._base import Disk, DiskConfig, FileInfo
from ._files import AtomicWriteFile, PreadFile
from ._local import _destination_is_a_directory, _make_dirs, _parent_is_a_file
from ._paths import is_temp, join_prefix, norm_path, temp_name
from ._spool import collect_stale_spools_once, open_spool

__all__ = [
    "OBJECT_STORES",
    "SECRET_OPTION_WORDS",
    "FsspecDisk",
    "check_storage_options",
    "check_url",
]

#: Protocols whose stores have no rename; one upload is their atomic publish.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "oss", "r2"})
#: Words that mark a storage option (or a URL's query parameter) as a secret: refused.
SECRET_OPTION_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "sas",
                       "auth", "connection_string")
#: Fields of an Azure Storage connection string that hold a secret (adlfs takes one as
#: ``connection_string``; under any name, a value holding one is refused).
_CONNECTION_STRING_SECRETS = ("accountkey=", "sharedaccesssignature=", "sharedaccesskey=")
#: ... and a query parameter only (``sig``: Azure's SAS, ``X-Amz-Signature``; an option
#: such as ``signature_version`` is no secret).
_SECRET_QUERY_WORDS = (*SECRET_OPTION_WORDS, "sig")
_ELSEWHERE = ("set them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ...) or "
              "the store's credential file")


def check_url(url: str, where: str = "url") -> None:
    """Refuse a URL that holds a credential: anything before the host (``user@``,
    ``user:password@``, ``token@``) or a query parameter named like a secret (a signature,
    a SAS or security token). A URL travels far: it is shown in reprs, errors, logs,
    catalogs and ``system.disks``, recorded beside a published database, pickled into task
    graphs and written on command lines, so it holds no secret and is shown as it is. The
    error never quotes the URL."""
    _scheme, sep, rest = url.partition("://")
    if not sep:
        return
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in netloc:
        raise ConfigError(
            f"{where}: a URL may not hold credentials (user:password@ before the host)",
            hint="give a user name in storage_options (username=...) if the store takes one; "
            + _ELSEWHERE)
    query = rest.partition("?")[2].partition("#")[0]
    for item in query.split("&") if query else ():
        name = item.partition("=")[0].lower()
        if any(word in name for word in _SECRET_QUERY_WORDS):
            raise ConfigError(
                f"{where}: a URL may not hold credentials (a query parameter looks like one)",
                hint=_ELSEWHERE)


def check_storage_options(options: Mapping[str, Any], where: str = "storage_options") -> None:
    """Refuse secrets in ``storage_options`` (they end up in caches, pickles, task graphs
    and the record of a published database): an option named like a credential, or a URL
    holding one (see :func:`check_url`), at any depth."""
    for name, value in options.items():
        low = str(name).lower()
        if any(word in low for word in SECRET_OPTION_WORDS):
            raise ConfigError(
                f"{where}: '{name}' looks like a credential; secrets are not allowed in "
                "storage_options", hint=_ELSEWHERE)
        _check_option_value(value, f"{where}.{name}")


def _check_option_value(value: Any, where: str) -> None:
    if isinstance(value, Mapping):
        check_storage_options(value, where)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_option_value(item, f"{where}[{i}]")
    elif isinstance(value, str):
        fields = value.replace(" ", "").lower()
        if any(f in fields for f in _CONNECTION_STRING_SECRETS):
            raise ConfigError(f"{where}: looks like a connection string holding a credential "
                              "(an account key or a shared access signature); secrets are "
                              "not allowed in storage_options", hint=_ELSEWHERE)
        check_url(value, where)


class _FsspecReader:
    """Positional reads on an fsspec file object; a lock makes each seek+read atomic."""

    def __init__(self, f: Any, size: int) -> None:
        self._f = f
        self._lock = threading.Lock()
        self.size = size

    def read_at(self, offset: int, n: int) -> bytes:
        n = max(0, min(n, self.size - offset))
        if n == 0:
            return b""
        with self._lock:
            self._f.seek(offset)
            return bytes(self._f.read(n))

    def readinto_at(self, buf: Any, offset: int) -> int:
        out = memoryview(buf).cast("B")
        data = self.read_at(offset, len(out))
        out[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()


class FsspecDisk(Disk):
    """Files under an fsspec URL (see the module docstring for atomicity)."""

    type = "fsspec"
    config_settings = frozenset({"type", "url", "storage_options"})

    @classmethod
    def from_config(cls, name: str, spec: Mapping[str, Any], where: str,
                    config: DiskConfig) -> Disk:
        url = config.string(spec, "url", where)
        options = spec.get("storage_options", {})
        if not isinstance(options, Mapping):
            raise config.error("storage_options must be a table", where)
        try:
            return cls(name, url, dict(options))
        except ConfigError as exc:
            raise config.error(str(exc), where, exc.hint) from None
        except (ImportError, OSError) as exc:
            raise config.error(f"disk {name!r}: cannot open {url}: {exc}", where,
                               "install the fsspec backend for this URL") from None

    def __init__(self, name: str, url: str, storage_options: dict[str, Any] | None = None,
                 ) -> None:
        options = dict(storage_options or {})
        check_url(url)
        check_storage_options(options)
        self.name = name
        self.url = url
        from fsspec.core import url_to_fs  # (fsspec costs 50-150 ms to import)

        self.fs, root = url_to_fs(url, **options)
        self.root = root.rstrip("/")
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (
            self.fs.protocol,)
        self.object_store = bool(OBJECT_STORES.intersection(protocols))
        #: a ``file://`` disk: its directories are made 0700 and its files 0600, as a
        #: local disk's are, whatever the umask (fsspec's own follow the umask)
        self._local = "file" in protocols
        collect_stale_spools_once()  # spools of this user's writers killed before an upload

    @property
    def is_encrypted(self) -> bool:
        return False

    @property
    def path(self) -> str:
        return self.url.rstrip("/") + "/"  # (no credential: refused by check_url)

    def _full(self, path: str) -> str:
        return join_prefix(self.root, norm_path(path)) if self.root else norm_path(path)

    def _missing(self, path: str) -> DiskFileNotFoundError:
        return DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}")

    def _stat(self, path: str) -> dict[str, Any]:
        # Other processes write too: never trust fsspec's listing cache for a file's state.
        self.fs.invalidate_cache(self._full(path))
        try:
            st = self.fs.info(self._full(path))
        except FileNotFoundError:
            raise self._missing(path) from None
        if st.get("type") != "file":
            raise self._missing(path)
        return dict(st)

    def open_read(self, path: str) -> IO[bytes]:
        size = int(self._stat(path)["size"])
        try:
            # Object stores' filesystems take the size, sparing another request for it.
            extra = {"size": size} if self.object_store else {}
            f = self.fs.open(self._full(path), "rb", **extra)
        except FileNotFoundError:
            raise self._missing(path) from None
        return cast("IO[bytes]", PreadFile(_FsspecReader(f, size), path, {"format": "plain"}))

    def open_write(self, path: str) -> IO[bytes]:
        full = self._full(path)
        if not self.object_store:
            self._not_a_directory(path, full)
        spool = open_spool()
        local, drop_spool = spool.path, spool.remove

        def publish() -> None:
            try:
                spool.flush()
                parent = full.rsplit("/", 1)[0] if "/" in full else ""
                if not self.object_store and parent:
                    self._makedirs(parent)
                if self.object_store:
                    self.fs.put_file(local, full)
                else:
                    # A move onto a directory would move the file into it, unseen.
                    self._not_a_directory(path, full)
                    tmp = temp_name(full)
                    if self._local:  # (the copy keeps the mode of the file it fills)
                        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                    self.fs.put_file(local, tmp)
                    try:
                        self.fs.mv(tmp, full)
                    except BaseException:
                        with contextlib.suppress(Exception):
                            self.fs.rm_file(tmp)
                        raise
                self.fs.invalidate_cache(full)
            except DiskError:
                raise
            except OSError as exc:
                raise DiskError(f"{path}: could not publish to disk {self.name!r}: "
                                f"{exc.strerror or type(exc).__name__}") from exc
            finally:
                drop_spool()

        return cast("IO[bytes]", AtomicWriteFile(spool.write, publish, drop_spool, path))

    def _not_a_directory(self, path: str, full: str) -> None:
        self.fs.invalidate_cache(full)
        if self.fs.isdir(full):
            raise DiskIsADirectoryError(f"{path}: is a directory on disk {self.name!r}")

    def exists(self, path: str) -> bool:
        try:
            self._stat(path)
        except DiskFileNotFoundError:
            return False
        return True

    def info(self, path: str) -> FileInfo:
        st = self._stat(path)
        mtime = _mtime(st)
        size = int(st["size"])
        return FileInfo(norm_path(path), size, size, False, "plain", mtime=mtime)

    def list(self, prefix: str = "") -> list[str]:
        clean = norm_path(prefix, allow_empty=True)
        base = clean if prefix.endswith("/") else clean.rsplit("/", 1)[0] if "/" in clean else ""
        start = self._full(base) if base else self.root
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(start) if start or not self.object_store else []
        except FileNotFoundError:
            return []
        out = []
        root = self.root.strip("/")
        for full in found:
            rel = full.strip("/")
            if root:
                if not rel.startswith(root + "/"):
                    continue
                rel = rel[len(root) + 1 :]
            match = rel.startswith(clean + "/") if prefix.endswith("/") else rel.startswith(clean)
            if not is_temp(rel) and match:
                out.append(rel)
        return sorted(out)

    def remove(self, path: str) -> None:
        self._stat(path)
        self.fs.rm_file(self._full(path))
        self.fs.invalidate_cache(self._full(path))

    def rename(self, src: str, dst: str) -> None:
        self._stat(src)
        target = self._full(dst)
        if not self.object_store:
            # A move onto a directory would move the file into it, unseen.
            self.fs.invalidate_cache(target)
            if self.fs.isdir(target):
                raise _destination_is_a_directory(dst, self.name)
            if "/" in target:
                try:
                    self._makedirs(target.rsplit("/", 1)[0])
                except (FileExistsError, NotADirectoryError):
                    raise _parent_is_a_file(dst, self.name) from None
        self.fs.mv(self._full(src), target)
        self.fs.invalidate_cache()

    def _makedirs(self, directory: str) -> None:
        """Make ``directory`` and its missing parents: on a ``file://`` disk mode 0700 and
        durable in their parents, as a local disk makes them; elsewhere as fsspec does."""
        if self._local:
            _make_dirs(directory)
        else:
            self.fs.makedirs(directory, exist_ok=True)


def _mtime(st: dict[str, Any]) -> float | None:
    for field in ("mtime", "LastModified", "last_modified", "created"):
        value = st.get(field)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        with contextlib.suppress(TypeError, ValueError):
            return float(value)
    return None

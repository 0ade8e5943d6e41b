"""Where the database finds its disks, policies and keys (the one seam to ``cryptdisk.disks``).

With no config, :func:`resolve_config` builds the default: every table is
encrypted on disk ``default`` (``PATH/data``) under the key kept in the key
file ``PATH.key`` *beside* the database directory, never inside it, so a copy
of the directory alone reveals nothing (older keys, after a rotation, are
kept beside it as ``PATH.key.ID``: see :mod:`._keyfiles`). A second policy,
``plain`` (``PATH/plain``), stores tables unencrypted, and only tables that
ask for it with ``SETTINGS storage_policy = 'plain'``. Losing the key file loses the data.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Protocol, cast

from ..config import Config, load_config
from ..disks import Disk, EncryptedDisk, LocalDisk, StoragePolicy, Volume
from ..errors import DatabaseError, DiskError
from ..keys import Keyring
from ._keyfiles import default_key_path, load_keyring, make_first_key

__all__ = ["Config", "DiskFile", "StoragePolicy", "default_key_path", "local_path",
           "on_local_disk", "open_read", "policy_disk", "policy_disks",
           "resolve_config", "rewrap_on_disk", "stale_cleanup"]


def _default_keyring(db_path: str, creating: bool) -> Keyring:
    if creating and not os.path.exists(default_key_path(db_path)):
        make_first_key(db_path)
    return load_keyring(db_path)


def resolve_config(db_path: str, config: Any, creating: bool) -> Config:
    """A config object from ``None`` (the default), a TOML path, or a config object."""
    if config is None:
        keyring = _default_keyring(db_path, creating)
        # The database keeps its own decrypted cache: the disk's read cache would double it.
        enc = EncryptedDisk("default", LocalDisk("default", os.path.join(db_path, "data")),
                            keyring, cache_bytes=0)
        plain = LocalDisk("plain", os.path.join(db_path, "plain"))
        return Config(f"{db_path} (default config)", keyring, {"default": enc, "plain": plain},
                      {"default": StoragePolicy("default", [Volume("main", [enc])]),
                       "plain": StoragePolicy("plain", [Volume("main", [plain])])})
    if isinstance(config, (str, os.PathLike)):
        config = load_config(config)
        for disk in config.disks.values():
            if isinstance(disk, EncryptedDisk):
                # The database keeps its own bounded cache of decoded columns; the disk's
                # cache of decrypted reads would hold the same data again, outside it.
                disk.cache = None
    for attr in ("keyring", "disks", "policies"):
        if not hasattr(config, attr):
            raise TypeError("config must be None, a config file path, or a cryptdisk config "
                            f"object (it has no {attr!r})")
    if "default" not in config.policies or getattr(config, "default_policy_implied", False):
        hint = "add [policies.default] to the config, with the disks the database's tables " \
            "were written to"
        if not creating and os.path.exists(default_key_path(db_path)):
            hint = (f"{db_path} was made without a config (its key is {default_key_path(db_path)})"
                    ": open it without one; to rotate its key: cryptdisk rotate "
                    f"{db_path} --new-key FILE")
        raise DatabaseError("the config has no storage policy named 'default'; new tables "
                            "use it", hint=hint)
    return config  # type: ignore[no-any-return]


def policy_disk(policy: Any) -> Disk:
    """The disk a policy writes new parts to (first disk of its first volume)."""
    return policy.volumes[0].disks[0]  # type: ignore[no-any-return]


def policy_disks(config: Any) -> list[Disk]:
    """The disks the database writes parts to: those of its storage policies.

    A disk that another disk wraps (the local disk under an encrypted one) is
    left out: its files are the wrapper's, seen without decryption, and must not
    be taken for orphans.
    """
    wrapped = {id(d.inner) for d in config.disks.values() if hasattr(d, "inner")}
    out: dict[int, Disk] = {}
    for policy in config.policies.values():
        for volume in policy.volumes:
            for disk in volume.disks:
                if id(disk) not in wrapped:
                    out[id(disk)] = disk
    return list(out.values())


class DiskFile(Protocol):
    """What :meth:`Disk.open_read <cryptdisk.disks.Disk.open_read>` returns, by the Disk
    contract: a seekable binary file with a ``size`` and a thread-safe ``pread``."""

    size: int

    def pread(self, offset: int, n: int) -> bytes: ...

    def readinto(self, buf: Any) -> int | None: ...

    def seek(self, offset: int, whence: int = 0) -> int: ...

    def tell(self) -> int: ...

    def close(self) -> None: ...

    def __enter__(self) -> DiskFile: ...

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


def open_read(disk: Disk, path: str) -> DiskFile:
    """``disk.open_read(path)``, typed with what the Disk contract promises of it."""
    return cast("DiskFile", disk.open_read(path))


def local_path(disk: Disk, path: str) -> str | None:
    """An OS path for a *plain* file on a local disk (pyarrow then reads it natively)."""
    if disk.is_encrypted:
        return None
    fn = getattr(disk, "local_path", None)
    return fn(path) if fn is not None else None


def on_local_disk(disk: Disk | None) -> bool:
    """Whether ``disk`` keeps its files on a local filesystem: it is a local disk, or
    wraps one (an encrypted disk over a local one)."""
    while disk is not None and not isinstance(disk, LocalDisk):
        disk = getattr(disk, "inner", None)
    return disk is not None


def rewrap_on_disk(disk: Disk, path: str) -> bool:
    """Rewrap a file's header under the current key; False if it already was."""
    fn = getattr(disk, "rewrap", None)
    if fn is None:
        raise DiskError(f"disk {disk.name!r} ({disk.type}) cannot rewrap files in place",
                        hint="use 'cryptdisk reencrypt' to rewrite its data under new keys")
    return bool(fn(path))


def stale_cleanup(disk: Disk, prefix: str) -> None:
    """Delete temporaries of writers killed mid-write, where the disk can."""
    fn = getattr(disk, "remove_stale_temps", None)
    if fn is not None:
        fn(max_age=0, prefix=prefix)  # the database's lock excludes other writers

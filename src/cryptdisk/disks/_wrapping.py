"""What every disk that wraps another disk shares: the path prefix and the plumbing."""

from __future__ import annotations

from typing import IO

from ..errors import DiskError, DiskFileNotFoundError, DiskIsADirectoryError
from ._base import Disk
from ._paths import join_prefix, norm_path

__all__ = ["WrappingDisk"]


class WrappingDisk(Disk):
    """A disk whose files live on ``inner`` below ``prefix`` (encrypted, ClickHouse).

    Subclasses set ``inner`` and ``prefix`` and implement reading, writing and
    ``info``; existence, listing, removal and renaming pass straight through.
    """

    inner: Disk
    prefix: str

    @property
    def is_encrypted(self) -> bool:
        return True

    @property
    def path(self) -> str:
        return self.inner.path + (self.prefix + "/" if self.prefix else "")

    def _inner(self, path: str) -> str:
        return join_prefix(self.prefix, norm_path(path))

    def os_path(self, path: str) -> str | None:
        """The OS path of a disk file's stored bytes, when the disks below this one end in a
        local directory (None otherwise)."""
        below = getattr(self.inner, "os_path", None)
        return below(self._inner(path)) if below is not None else None

    def exists(self, path: str) -> bool:
        return self.inner.exists(self._inner(path))

    def list(self, prefix: str = "") -> list[str]:
        if not self.prefix:
            return self.inner.list(prefix)
        cut = len(self.prefix) + 1
        return [p[cut:] for p in self.inner.list(self.prefix + "/" + prefix)]

    def _own_error(self, path: str, exc: Exception) -> Exception:
        """The inner disk's error about a stored path, as this disk's about ``path``."""
        if isinstance(exc, DiskIsADirectoryError):
            return DiskIsADirectoryError(f"{path}: is a directory on disk {self.name!r}")
        if getattr(exc, "parent_is_a_file", False):
            return DiskError(f"{path}: cannot be written on disk {self.name!r}: a parent "
                             "directory of it is a file")
        return DiskFileNotFoundError(f"{path}: no such file on disk {self.name!r}")

    def _inner_write(self, path: str) -> IO[bytes]:
        """The inner disk's atomic file for ``path``, its errors said about ``path``."""
        try:
            return self.inner.open_write(self._inner(path))
        except DiskIsADirectoryError as exc:
            raise self._own_error(path, exc) from None
        except DiskError as exc:
            if getattr(exc, "parent_is_a_file", False):
                raise self._own_error(path, exc) from None
            raise

    def remove(self, path: str) -> None:
        try:
            self.inner.remove(self._inner(path))
        except (DiskFileNotFoundError, DiskIsADirectoryError) as exc:
            raise self._own_error(path, exc) from None

    def rename(self, src: str, dst: str) -> None:
        try:
            self.inner.rename(self._inner(src), self._inner(dst))
        except DiskError as exc:
            if getattr(exc, "at_destination", False) or getattr(exc, "parent_is_a_file", False):
                raise self._own_error(dst, exc) from None
            if isinstance(exc, DiskFileNotFoundError | DiskIsADirectoryError):
                raise self._own_error(src, exc) from None
            raise

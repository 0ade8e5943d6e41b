"""Syncing a file or a directory by its path, for the publish steps (write a temporary,
sync it, rename or link it into place, sync the directory) of the packages above."""

from __future__ import annotations

import errno
import os

__all__ = ["fsync_path", "link_new"]

#: what link() fails with where a filesystem has no hard links (FAT, exFAT, some network
#: and FUSE filesystems)
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def fsync_path(path: str) -> None:
    """``fsync`` the file or directory ``path`` (a directory so that the names created,
    renamed or removed in it last); an ``OSError`` propagates."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_new(tmp: str, dst: str) -> None:
    """Give the file ``tmp`` the name ``dst`` only while ``dst`` is free, and drop the name
    ``tmp``: a hard link (which never replaces a file that took the name meanwhile), or
    where the filesystem has none a rename just after checking the name is free.
    ``FileExistsError`` when ``dst`` exists; ``tmp`` is then left as it was."""
    try:
        os.link(tmp, dst)
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        if os.path.lexists(dst):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst) from None
        os.rename(tmp, dst)
        return
    os.unlink(tmp)

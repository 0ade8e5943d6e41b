"""Syncing a file or a directory by its path, for the publish steps (write a temporary,
sync it, rename or link it into place, sync the directory) of the packages above."""

from __future__ import annotations

import os

__all__ = ["fsync_path"]


def fsync_path(path: str) -> None:
    """``fsync`` the file or directory ``path`` (a directory so that the names created,
    renamed or removed in it last); an ``OSError`` propagates."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

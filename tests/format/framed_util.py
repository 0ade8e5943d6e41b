"""Creating framed (kind 3) files for tests, through the format's lower tier.

``cryptdisk.open`` reads and updates framed files but does not create them (the
SQLite VFS does); these helpers do what the VFS does: write a kind-3 header,
then drive a :class:`MutableStore` over the descriptor.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from cryptdisk import Keyring
from cryptdisk.format import Kind, MutableStore, new_header, open_header, read_header

__all__ = ["framed_store", "new_framed", "open_store"]


def new_framed(path: Path, ring: Keyring, *, segment_size: int = 512, lead: int = 32,
               frame_extra: int = 24) -> None:
    """An empty framed file at ``path`` (a header and no segments)."""
    header, _dek = new_header(Kind.FRAMED, ring.current_key(), segment_size=segment_size,
                              lead=lead, frame_extra=frame_extra)
    path.write_bytes(header.to_bytes())


@contextlib.contextmanager
def open_store(path: Path, ring: Keyring, *, writable: bool = True) -> Iterator[MutableStore]:
    """A :class:`MutableStore` over an existing mutable or framed file."""
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        header = read_header(fd, str(path))
        yield MutableStore(fd, header, open_header(header, ring), str(path), writable=writable)
    finally:
        os.close(fd)


@contextlib.contextmanager
def framed_store(path: Path, ring: Keyring, *, segment_size: int = 512, lead: int = 32,
                 frame_extra: int = 24) -> Iterator[MutableStore]:
    """A new, empty framed file at ``path``, open for writing."""
    new_framed(path, ring, segment_size=segment_size, lead=lead, frame_extra=frame_extra)
    with open_store(path, ring) as store:
        yield store

"""Content-defined chunking (FastCDC 2020, through ``pyfastcdc``).

Cut points depend only on the bytes near them, so an insertion or a change
moves the boundaries of the chunks around it and no others: unchanged data
gives the same chunks in every backup, which is what deduplication needs. The
gear table is seeded from the repository key, so chunk sizes do not fingerprint
known content for someone who cannot read the repository.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, BinaryIO

from pyfastcdc import FastCDC

__all__ = ["AVG_SIZE", "MAX_SIZE", "MIN_SIZE", "chunks"]

AVG_SIZE = 128 * 1024
MIN_SIZE = 32 * 1024
MAX_SIZE = 1024 * 1024


class _Full:
    """Reads that return ``n`` bytes unless the stream ended: the chunker takes a short
    read as the end of its window, which would move cut points with the reader."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            return bytes(self.raw.read())
        buf = bytearray()
        while len(buf) < n:
            got = self.raw.read(n - len(buf))
            if not got:
                break
            buf += got
        return bytes(buf)


def chunks(stream: BinaryIO, seed: int, *, avg_size: int = AVG_SIZE, min_size: int = MIN_SIZE,
           max_size: int = MAX_SIZE) -> Iterator[bytes]:
    """The content-defined chunks of ``stream`` (as bytes), in order; nothing for no bytes."""
    cdc = FastCDC(avg_size, min_size=min_size, max_size=max_size, seed=seed)
    for chunk in cdc.cut_stream(_Full(stream)):
        yield bytes(chunk.data)  # the view is valid only until the next chunk

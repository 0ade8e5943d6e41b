"""Where the segments of a mutable or framed file lie, in plaintext and on disk.

Mutable files (kind 2) cut the plaintext into segments of ``S`` bytes. Framed
files (kind 3) cut it the way the plaintext is structured: segment 0 holds
``lead`` bytes and every later segment ``F`` (a preamble, then fixed-size
frames, as in SQLite's WAL: a 32-byte header, then frames of 24 + page bytes).
Kind 2 is the case ``lead == F == S``. Each segment is stored as one record of
its plaintext length plus :data:`OVERHEAD` (nonce and tag), the records one
after another after the 128-byte header; the last segment may be short.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._cipher import TAG_SIZE
from ._header import HEADER_SIZE, Header

__all__ = ["MUTABLE_NONCE", "OVERHEAD", "SegmentLayout"]

MUTABLE_NONCE = 16
OVERHEAD = MUTABLE_NONCE + TAG_SIZE


@dataclass(frozen=True)
class SegmentLayout:
    """Segment geometry: segment 0 holds ``lead`` plaintext bytes, later ones ``size``."""

    lead: int
    size: int

    @classmethod
    def of(cls, header: Header) -> SegmentLayout:
        return cls(header.first_segment_size, header.frame_size)

    @property
    def largest(self) -> int:
        """The plaintext bytes of the largest segment."""
        return max(self.lead, self.size)

    def locate(self, offset: int) -> tuple[int, int]:
        """``(index, offset within it)`` of the segment holding plaintext ``offset``."""
        if offset < self.lead:
            return 0, offset
        index, lo = divmod(offset - self.lead, self.size)
        return index + 1, lo

    def start(self, index: int) -> int:
        """Plaintext offset of segment ``index``."""
        return 0 if index == 0 else self.lead + (index - 1) * self.size

    def capacity(self, index: int) -> int:
        """Plaintext bytes segment ``index`` holds when full."""
        return self.lead if index == 0 else self.size

    def record_offset(self, index: int) -> int:
        """File offset of segment ``index``'s record."""
        if index == 0:
            return HEADER_SIZE
        return HEADER_SIZE + self.lead + OVERHEAD + (index - 1) * (self.size + OVERHEAD)

    def measure(self, file_size: int) -> tuple[int, int, int]:
        """``(segments, plaintext size, cut)`` of a file of ``file_size`` bytes.

        ``cut`` is the length of a last record too short to hold any plaintext
        (``0 < cut <= OVERHEAD``: a truncated file, or an append cut by a crash);
        the segment count and size leave it out. 0 when there is none.
        """
        body = file_size - HEADER_SIZE
        if body <= 0:
            return 0, 0, 0
        first = self.lead + OVERHEAD
        if body <= first:
            if body <= OVERHEAD:
                return 0, 0, body
            return 1, body - OVERHEAD, 0
        full, rest = divmod(body - first, self.size + OVERHEAD)
        size = self.lead + full * self.size
        if rest == 0:
            return 1 + full, size, 0
        if rest <= OVERHEAD:
            return 1 + full, size, rest
        return 2 + full, size + rest - OVERHEAD, 0

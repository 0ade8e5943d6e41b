"""A query's rows sent as they are computed: the analytical engine's streamed result.

The server reads a SELECT's rows from a :class:`cryptdisk.db.Stream` a batch of
:data:`BATCH_ROWS` rows at a time and sends each batch's DataRows before it reads the
next, so the memory one query holds is at most three batches (as the query starts, batches
are read until they hold 2 x BATCH_ROWS rows: a result they hold whole is sent as it is;
a batch may be smaller than BATCH_ROWS, as small as a part's row group) plus the socket's send
queue (64 KiB before the session waits for the client), whatever the size of the
result. Each batch is read in the
session's shared turn (:class:`._engines._Turns`), so a cancel or the statement timeout
interrupts it, and between batches the session holds no turn: a client that reads
slowly blocks no writer (the stream keeps the parts its snapshot reads, as a reader
does). The stream ends at its last batch, on an error, or when it is closed (its portal
closed, its session ended). A statement that decrypts has its audit line written before
its first row goes out (its rows null: not known yet), a result held whole with its count.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import _types

if TYPE_CHECKING:
    from ._engines import _AnalyticalSession

__all__ = ["BATCH_ROWS", "RowStream"]

#: the rows of one batch the server reads and sends at a time (4 DuckDB vectors)
BATCH_ROWS = 8192


class RowStream:
    """The rows of one query, read batch by batch (see the module).

    :meth:`next_rows` runs on the session's thread; :meth:`close` may run on any thread
    (it interrupts a batch being computed). ``on_end(count)`` runs once when the stream
    ends or is closed, with the rows read so far."""

    def __init__(self, session: _AnalyticalSession, stream: Any, tag: Callable[[int], str],
                 on_end: Callable[[int], None]) -> None:
        self._session = session
        self._stream = stream
        self._tag = tag
        self._on_end: Callable[[int], None] | None = on_end
        self.count = 0  # rows read so far
        self.sent = 0  # rows sent to the client so far (its access-log line's count)
        self.done = False  # its last batch was read
        #: the access-log line held until the stream ends (see Session._logged)
        self.log_entry: dict[str, Any] | None = None
        #: rows read but not sent yet (an Execute's row limit ended in a batch)
        self.pending: list[tuple[Any, ...]] = []

    @property
    def tag(self) -> str:
        """CommandComplete's tag: ``SELECT n``, n the rows read."""
        return self._tag(self.count)

    @property
    def closed(self) -> bool:
        return self._on_end is None

    def next_rows(self, in_turn: bool = False) -> list[tuple[Any, ...]] | None:
        """The next batch's rows as Python values (never none: empty batches are skipped),
        None at the end (the stream ends); a
        failure (a part that fails authentication, a cancel) ends it and raises.
        ``in_turn``: the caller holds the session's turn (else it is taken for the batch)."""
        from ._resultrows import result_rows

        session = self._session
        if self._on_end is None:
            return None
        try:
            with contextlib.nullcontext() if in_turn else \
                    session.engine.turn(session, shared=True):
                session._pulling = self._stream
                try:
                    batch = self._stream.read_next_batch()
                    while batch.num_rows == 0:  # (DuckDB may hand over empty batches)
                        batch = self._stream.read_next_batch()
                finally:
                    session._pulling = None
        except StopIteration:
            self.done = True
            self.close()
            return None
        except BaseException:
            self.close()
            raise
        import pyarrow as pa

        rows = result_rows(_types.exact_result(pa.Table.from_batches(
            [_types.lossy_result(batch)])))
        self.count += len(rows)
        return rows

    def close(self) -> None:
        """End the stream: its parts and cursor are let go (``on_end`` runs)."""
        on_end, self._on_end = self._on_end, None
        if on_end is None:
            return
        self.pending = []
        try:
            self._stream.close()
        finally:
            on_end(self.count)

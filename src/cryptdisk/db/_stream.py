"""A query's rows handed over batch by batch: :meth:`Database.stream`'s result.

A :class:`Stream` reads DuckDB's streaming result of one query: each batch is
computed when it is asked for (DuckDB pulls the tables' scans as far as that
batch needs, the scans decrypt and decode their row groups as DuckDB pulls
them), so the memory a stream holds is bounded by the settings, not by the
size of its result. It is read like a :class:`pyarrow.RecordBatchReader`
(:attr:`schema`, :meth:`read_next_batch`, iteration, :meth:`read_all`) and
hands itself to Arrow's other consumers as an Arrow C stream
(``pa.RecordBatchReader.from_stream(s)``, ``pa.table(s)``, Polars, DuckDB).

What the stream holds (the parts its query started from, its DuckDB cursor) is
released by :meth:`close`: at its end (the last batch read), on an error, when
its ``with`` block ends, or, for a stream dropped unclosed, when it is
collected. One thread at a time reads a stream; :meth:`close` and
:meth:`interrupt` may come from any thread.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from ..errors import DatabaseError

__all__ = ["STREAM_BATCH_ROWS", "Stream"]

#: The rows of a stream's batch unless ``batch_rows`` says otherwise (DuckDB's vectors are
#: 2048 rows: a batch is whole vectors of them).
STREAM_BATCH_ROWS = 65536


def check_batch_rows(batch_rows: Any) -> int:
    """``batch_rows`` if it is a whole number of at least 1 (else :class:`DatabaseError`)."""
    if not isinstance(batch_rows, int) or isinstance(batch_rows, bool) or batch_rows < 1:
        raise DatabaseError(f"batch_rows must be a whole number of at least 1, not "
                            f"{batch_rows!r}")
    return batch_rows


class Stream:
    """The rows of one query, computed batch by batch as they are read (see the module).

    ``schema`` is the result's; ``next_batch()`` gives the next batch or None at the
    end, raising the query's error (the cryptdisk error of a part that fails
    authentication, never a short result); ``release()`` ends the query and lets go of
    what it holds (called once); ``stop()`` interrupts the batch being computed.
    """

    def __init__(self, schema: pa.Schema, next_batch: Callable[[], pa.RecordBatch | None],
                 release: Callable[[], None], stop: Callable[[], None] | None = None,
                 ) -> None:
        self._schema = schema
        self._next_batch: Callable[[], pa.RecordBatch | None] | None = next_batch
        self._stop = stop
        self._lock = threading.Lock()  # a batch being read, or the release
        self._closing = False  # close() interrupted a batch being computed
        #: the release, run once: by close(), at the end, or when the stream is collected
        self._release = weakref.finalize(self, release)

    @classmethod
    def of_table(cls, table: pa.Table) -> Stream:
        """A stream of ``table``'s rows (a result held whole already: ``count(*)`` from
        the catalog, ``DESCRIBE``)."""
        batches = iter(table.to_batches())
        return cls(table.schema, lambda: next(batches, None), lambda: None)

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of the result's columns."""
        return self._schema

    @property
    def closed(self) -> bool:
        """Whether the stream ended or was closed (it holds nothing then)."""
        return not self._release.alive

    def read_next_batch(self) -> pa.RecordBatch:
        """The next batch of rows; :class:`StopIteration` after the last one (as a
        :class:`pyarrow.RecordBatchReader`'s), :class:`DatabaseError` once closed."""
        with self._lock:
            if self._next_batch is None:  # (its end, or an error, released it)
                raise StopIteration
            if not self._release.alive:
                raise DatabaseError("this stream is closed")
            try:
                batch = self._next_batch()
            except BaseException as exc:
                self._end()
                if self._closing and isinstance(exc, DatabaseError):  # (its interrupt)
                    raise DatabaseError("this stream was closed while its batch was "
                                        "computed") from None
                raise
            if batch is None:
                self._end()
                raise StopIteration
            return batch

    def _end(self) -> None:
        self._next_batch = None
        self._release()

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        while True:
            try:
                yield self.read_next_batch()
            except StopIteration:
                return

    def read_all(self) -> pa.Table:
        """The remaining rows as one Arrow table (as much memory as they take)."""
        return pa.Table.from_batches(list(self), schema=self._schema)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The remaining batches as an Arrow C stream (the PyCapsule protocol)."""
        reader = pa.RecordBatchReader.from_batches(self._schema, iter(self))
        return reader.__arrow_c_stream__(requested_schema)

    def interrupt(self) -> None:
        """Stop the batch being computed (it raises); the stream then ends."""
        if self._stop is not None and self._release.alive:
            self._stop()

    def close(self) -> None:
        """End the query and release what it holds (its parts, its cursor); no batch is
        read after it. Closing a closed stream does nothing."""
        if not self._release.alive:
            return
        if not self._lock.acquire(blocking=False):
            self._closing = True  # (what the reading thread is told)
            self.interrupt()  # a batch being computed on another thread: it ends first
            self._lock.acquire()
        try:
            self._release()
        finally:
            self._lock.release()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return f"<cryptdisk.db.Stream of {len(self._schema)} columns{state}>"

    def __reduce__(self) -> Any:
        raise TypeError("a Stream cannot be pickled; read it in this process")

"""The decrypted-data cache: decoded columns of parts, in memory, within a byte bound.

Like PostgreSQL's shared buffers hold decrypted pages, this holds decoded
Arrow columns keyed by (part id, column), least recently used first out. Sizes
are measured (the Arrow buffers' total size), never estimated, and an entry
larger than the whole bound is used for one query and not kept, so
:attr:`ColumnCache.size` never exceeds :attr:`ColumnCache.bound`. Plaintext
lives only here, in process memory.

An entry is admitted on its second offer (scan resistance, as PostgreSQL keeps
one-off sequential scans out of shared buffers): keeping a scan's decoded row
groups means fresh memory for every row group, whose page faults cost a cold
scan of a string column about as much again as decoding it (measured: 2.7 s
of CPU against 1.4 s without the cache, over 10M md5 strings), while a scan
that keeps nothing reuses the same buffers. So a query's first run reads
without filling the cache, its second run fills it and later runs answer from
it. A statement's offers (through its :class:`StatementCache`) are kept only
from another statement's on: a statement that reads a row group twice (a
self-join, two subqueries over one table) keeps nothing either, so a cold
statement costs the CPU and memory it costs with the cache off. Only the keys of
first offers are remembered (a bounded number), with the statement that made them.

A statement never evicts what it kept or used itself (:meth:`ColumnCache.new_statement`
starts one): a scan larger than the cache keeps its first row groups, up to the bound,
and leaves the rest out, instead of cycling every row group through an LRU that a
sequential scan defeats (each run evicting what the next run reads first). So repeats
of that scan answer the same leading row groups from the cache and read the rest.
Statements run at once (readers, ``db.reader()``): each uses the cache through its own
:class:`StatementCache`, and what a statement still running kept or used is evicted for
none (each keeps its leading row groups as if it ran alone); what ended statements kept
goes first, least recently used first. An entry is evicted only when that makes room for
the one offered. Evicting never frees what a running scan has taken from the cache: it
holds its own reference to the arrays.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

from ._derived import SEP

__all__ = ["DEFAULT_COLUMN_CACHE_BYTES", "ColumnCache", "StatementCache"]

#: 768 MiB: with pyarrow's allocator holding up to about 40% more than the cache's measured
#: bytes, a full cache plus a scan's ~200 MB stays under 1.5 GB (docs/database.md, Memory).
DEFAULT_COLUMN_CACHE_BYTES = 768 << 20
_OFFERED = 1 << 18  # first offers remembered (a row group's column each)


def measured_size(array: pa.ChunkedArray) -> int:
    """Bytes of the Arrow buffers behind ``array`` (what the cache really holds)."""
    return int(array.get_total_buffer_size())


class ColumnCache:
    """An LRU of decoded columns, thread-safe, bounded by measured bytes."""

    def __init__(self, bound: int = DEFAULT_COLUMN_CACHE_BYTES) -> None:
        if not isinstance(bound, int) or bound < 0:
            raise ValueError(f"cache bound must be a non-negative number of bytes, not {bound!r}")
        self.bound = bound
        self.size = 0
        self.peak = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        #: The last statement started; each entry records the last statement that kept or
        #: used it.
        self.statement = 0
        self._running: set[int] = set()  # statements started and not ended
        self._items: OrderedDict[tuple[str, str], tuple[pa.ChunkedArray, int, int]] = (
            OrderedDict())
        #: keys offered once and not kept -> the statement that offered them (None: an
        #: offer outside a statement, e.g. arrow_table's, which any later offer keeps)
        self._offered: OrderedDict[tuple[str, str], int | None] = OrderedDict()
        self._lock = threading.Lock()

    def new_statement(self) -> StatementCache:
        """A new statement starts: what ended ones kept may be evicted for it. Its gets and
        puts go through the returned view, until its :meth:`StatementCache.end`."""
        with self._lock:
            self.statement += 1
            self._running.add(self.statement)
            return StatementCache(self, self.statement)

    def _end(self, statement: int) -> None:
        with self._lock:
            self._running.discard(statement)

    def get(self, part_id: str, column: str,
            statement: int | None = None) -> pa.ChunkedArray | None:
        """The entry, used by ``statement`` (None: the last one started), or None."""
        with self._lock:
            item = self._items.get((part_id, column))
            if item is None:
                self.misses += 1
                return None
            user = self.statement if statement is None else statement
            self._items[(part_id, column)] = (item[0], item[1], user)
            self._items.move_to_end((part_id, column))
            self.hits += 1
            return item[0]

    def contains(self, part_id: str, column: str) -> bool:
        """Whether an entry is held (no hit or miss counted, no LRU update)."""
        return (part_id, column) in self._items

    def offered(self, part_id: str, column: str, statement: int | None = None) -> bool:
        """Whether an entry was offered once and not kept, so that an offer by
        ``statement`` keeps it (not by the statement that offered it first)."""
        key = (part_id, column)
        return key in self._offered and not _same(self._offered.get(key), statement)

    def offers(self) -> int:
        """How many entries were offered once and not kept (see :meth:`offered`)."""
        return len(self._offered)

    def offer(self, part_id: str, column: str, statement: int | None = None) -> None:
        """Count a read of part of an entry (a granule of a row group) by ``statement`` as
        a first offer, so that another statement's read of the whole entry keeps it."""
        if self.bound == 0:
            return
        key = (part_id, column)
        with self._lock:
            if key not in self._items and key not in self._offered:
                self._remember(key, statement)

    def _remember(self, key: tuple[str, str], statement: int | None) -> None:
        """Record a first offer (under the lock), forgetting the oldest beyond the limit."""
        self._offered[key] = statement
        while len(self._offered) > _OFFERED:
            self._offered.popitem(last=False)

    def put(self, part_id: str, column: str, array: pa.ChunkedArray,
            statement: int | None = None) -> None:
        """Offer ``array`` for ``statement`` (None: outside a statement; for eviction, the
        last one started): kept from its offer by a second statement on (a second offer
        when either is outside a statement), if what running statements kept or used
        leaves room for it (see the module's docstring)."""
        n = measured_size(array)
        if n > self.bound:
            return
        key = (part_id, column)
        with self._lock:
            if key in self._items:
                return  # (a scan reads only what it missed; another scan kept it meanwhile)
            if key not in self._offered:  # first offer: remembered, not kept
                self._remember(key, statement)
                return
            if _same(self._offered[key], statement):
                return  # the statement that offered it first reads it again: not kept
            mine = self.statement if statement is None else statement
            if self.size + n > self.bound and not self._make_room(n, mine):
                return  # full of running statements' row groups: this one is not kept
            del self._offered[key]
            self._items[key] = (array, n, mine)
            self.size += n
            self.peak = max(self.peak, self.size)

    def _make_room(self, n: int, mine: int) -> bool:
        """Evict the least recently used entries no running statement (nor ``mine``) kept
        or used until ``n`` more bytes fit; False (nothing evicted) if they cannot."""
        free = self.bound - self.size
        victims = []
        for key, (_arr, m, user) in self._items.items():
            if user == mine or user in self._running:
                if len(self._running) <= 1:
                    break  # one statement runs: the rest are newer, and its own too
                continue
            victims.append((key, m))
            free += m
            if free >= n:
                break
        if free < n:
            return False
        for key, m in victims:
            del self._items[key]
            self.size -= m
            self.evictions += 1
        return True

    def drop_part(self, part_id: str) -> None:
        with self._lock:
            for key in [k for k in self._items
                        if k[0] == part_id or k[0].startswith(part_id + "/")]:
                self.size -= self._items.pop(key)[1]

    def drop_derived(self) -> None:
        """Drop every derived column (field functions' values, see :mod:`._derived`): the
        field keys changed, or the at-rest keys were rotated."""
        with self._lock:
            for key in [k for k in self._items if SEP in k[1]]:
                self.size -= self._items.pop(key)[1]
            for key in [k for k in self._offered if SEP in k[1]]:
                del self._offered[key]

    def derived_size(self) -> int:
        """Bytes held by derived columns (clear values of protected columns among them)."""
        with self._lock:
            return sum(item[1] for k, item in self._items.items() if SEP in k[1])

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._offered.clear()
            self.size = 0

    def __len__(self) -> int:
        return len(self._items)


def _same(first: int | None, statement: int | None) -> bool:
    """Whether two offers are one statement's (never when either is outside one)."""
    return first is not None and first == statement


class StatementCache:
    """The cache as one statement uses it (:meth:`ColumnCache.new_statement`): its gets and
    puts are that statement's, so that the entries it kept or used stay until it ends."""

    def __init__(self, cache: ColumnCache, statement: int) -> None:
        self.cache, self.statement = cache, statement

    @property
    def bound(self) -> int:
        return self.cache.bound

    def get(self, part_id: str, column: str) -> pa.ChunkedArray | None:
        return self.cache.get(part_id, column, self.statement)

    def put(self, part_id: str, column: str, array: pa.ChunkedArray) -> None:
        self.cache.put(part_id, column, array, self.statement)

    def contains(self, part_id: str, column: str) -> bool:
        return self.cache.contains(part_id, column)

    def offered(self, part_id: str, column: str) -> bool:
        return self.cache.offered(part_id, column, self.statement)

    def offer(self, part_id: str, column: str) -> None:
        self.cache.offer(part_id, column, self.statement)

    def offers(self) -> int:
        return self.cache.offers()

    def __len__(self) -> int:
        return len(self.cache)

    def end(self) -> None:
        """The statement ended: what it kept or used may be evicted for others."""
        self.cache._end(self.statement)

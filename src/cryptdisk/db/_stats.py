"""A part's key range, from the Parquet statistics of its row groups (the sparse index)."""

from __future__ import annotations

from typing import Any

__all__ = ["key_range_of", "min_max"]


def min_max(statistics: Any) -> tuple[Any, Any] | None:
    """A row group's column statistics' (min, max) as Python values, or None when pyarrow
    cannot make them ('infinity'::DATE, a TIMESTAMP past year 9999 or before year 1, which
    Python's date and datetime cannot hold): a range not known, as a row group without
    statistics has."""
    try:
        return statistics.min, statistics.max
    except (OverflowError, ValueError):
        return None


def key_range_of(meta: Any, column: str) -> tuple[Any, Any] | None:
    """The (min, max) of ``column`` over a part's row groups, from its Parquet statistics.

    None when any row group with non-null values has no statistics (then no
    range can be promised) or the values are not plain JSON scalars.
    """
    idx = None
    for j in range(meta.num_columns):
        if meta.schema.column(j).path.split(".")[0] == column:
            idx = j
    if idx is None:
        return None
    lo = hi = None
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        st = rg.column(idx).statistics
        if st is None:
            return None
        if not st.has_min_max:
            if st.null_count == rg.num_rows:
                continue
            return None
        found = min_max(st)
        if found is None:
            return None
        a, b = found
        if not all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in (a, b)):
            return None
        lo = a if lo is None or a < lo else lo
        hi = b if hi is None or b > hi else hi
    if lo is None:
        return None
    return lo, hi

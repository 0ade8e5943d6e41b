"""Arrow columns as NumPy arrays, over Arrow's buffers, without pyarrow's ``to_numpy``.

pyarrow 26's ``Array.to_numpy`` (and ``np.asarray`` of an array, and ``pa.array``) import
pandas on first use where it is installed: 0.2-0.3 CPU s, holding the GIL and the import
lock, in the middle of a process's first insert (every thread of the insert waited). An
insert reads its key and numeric columns through these instead.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

__all__ = ["arrow_indices", "numpy_dtype", "numpy_valid", "numpy_values"]


def numpy_dtype(t: pa.DataType) -> Any:
    """The NumPy dtype of the values of Arrow integer or floating type ``t``, or None."""
    import numpy as np

    if pa.types.is_integer(t):
        return np.dtype(("i" if pa.types.is_signed_integer(t) else "u") + str(t.bit_width // 8))
    if pa.types.is_floating(t):
        return np.dtype("f" + str(t.bit_width // 8))
    return None


def numpy_values(col: pa.Array | pa.ChunkedArray) -> Any:
    """The values of integer or floating ``col`` as a NumPy array: a read-only view of
    Arrow's buffer for an array or a chunked array of one chunk, a concatenated copy for
    more chunks. The slot of a NULL holds whatever the buffer holds there (see
    :func:`numpy_valid`). ``TypeError`` for any other type."""
    import numpy as np

    dtype = numpy_dtype(col.type)
    if dtype is None:
        raise TypeError(f"numpy_values: not an integer or floating column: {col.type}")
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks != 1:
            return np.concatenate([numpy_values(c) for c in col.chunks]) if col.num_chunks \
                else np.empty(0, dtype)
        col = col.chunk(0)
    n = len(col)
    data = col.buffers()[1]
    if not n or data is None:
        return np.empty(0, dtype)
    return np.frombuffer(data, dtype, count=n, offset=col.offset * dtype.itemsize)


def numpy_valid(col: pa.Array | pa.ChunkedArray) -> Any:
    """Which values of ``col`` are not NULL, as a NumPy boolean array (a new one)."""
    import numpy as np

    if isinstance(col, pa.ChunkedArray):
        return np.concatenate([numpy_valid(c) for c in col.chunks]) if col.num_chunks \
            else np.empty(0, bool)
    n = len(col)
    bitmap = col.buffers()[0]
    if not col.null_count or bitmap is None:
        return np.ones(n, bool)
    bits = np.unpackbits(np.frombuffer(bitmap, np.uint8), bitorder="little")
    return bits[col.offset : col.offset + n].astype(bool)


def arrow_indices(idx: Any) -> Any:
    """Positions for ``take``: a NumPy integer array as an Arrow int64 array over the same
    memory (``pc.take`` given NumPy converts it through ``pa.array``, which imports pandas),
    an Arrow array as it is."""
    import numpy as np

    if not isinstance(idx, np.ndarray):
        return idx
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(idx), [None, pa.py_buffer(idx)],
                                 null_count=0)

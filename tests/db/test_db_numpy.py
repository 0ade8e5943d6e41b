"""Arrow columns as NumPy without pyarrow's to_numpy (cryptdisk.db._numpy), and an insert
that never imports pandas."""

import math
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cryptdisk.db._numpy import arrow_indices, numpy_valid, numpy_values

_TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64(), pa.float32(),
          pa.float64()]


@settings(deadline=None)
@given(st.sampled_from(_TYPES), st.lists(st.one_of(st.none(), st.integers(0, 100)),
                                         max_size=40),
       st.integers(0, 10), st.integers(0, 3))
def test_values_and_validity_match_pyarrow(t, values, start, cut):
    chunks = [pa.array(values[:cut], t), pa.array(values[cut:], t)]
    for col in (chunks[1], pa.chunked_array(chunks, t), pa.chunked_array(chunks[1:], t)):
        col = col.slice(min(start, len(col)))
        valid = numpy_valid(col)
        assert valid.tolist() == col.is_valid().to_pylist()
        got = numpy_values(col)
        want = col.to_pylist()
        assert [v for v, ok in zip(got.tolist(), valid, strict=True) if ok] == \
            [v for v in want if v is not None]
        assert got.dtype == np.dtype(col.type.to_pandas_dtype())


def test_values_refuses_other_types():
    with pytest.raises(TypeError, match="not an integer or floating"):
        numpy_values(pa.array(["a"]))
    with pytest.raises(TypeError, match="not an integer or floating"):
        numpy_values(pa.array([True]))


def test_empty_columns():
    assert numpy_values(pa.chunked_array([], pa.int64())).tolist() == []
    assert numpy_values(pa.array([], pa.float64())).dtype == np.float64
    assert numpy_valid(pa.chunked_array([], pa.int64())).tolist() == []


def test_indices_take_as_numpy_does():
    table = pa.table({"x": [10, 11, 12, 13], "s": ["a", "b", "c", "d"]})
    idx = np.array([3, 0, 2, 1, 3])
    got = pc.take(table, arrow_indices(idx))
    assert got.column("x").to_pylist() == [13, 10, 12, 11, 13]
    assert arrow_indices(idx[::2]).to_pylist() == [3, 2, 3]  # (a strided view: copied)
    arrow = pa.array([1, 0], pa.uint64())
    assert arrow_indices(arrow) is arrow


def test_an_insert_never_imports_pandas(tmp_path):
    """pyarrow's to_numpy and pa.array import pandas (0.2-0.3 s of a first insert, the GIL
    held): inserts from a Parquet file and from Arrow, with NULLs and NaN in their numeric
    columns, on a key whose sort breaks ties again and on a key with NULLs, in a process
    that has not imported it."""
    n = 70_000
    keys = [(i * 7919) % 5000 * (1 << 50) + i % 3 for i in range(n)]  # 63 bits: ties
    floats = [None if i % 11 == 0 else (math.nan if i % 13 == 0 else i / 7) for i in range(n)]
    pq.write_table(pa.table({"k": pa.array(keys, pa.int64()), "f": pa.array(floats),
                             "i": pa.array([None if i % 5 == 0 else i for i in range(n)],
                                           pa.int32())}), tmp_path / "in.parquet")
    script = textwrap.dedent(f"""
        import sys
        import pyarrow.parquet as pq
        from cryptdisk.db import connect
        path = {str(tmp_path / "in.parquet")!r}
        data = pq.ParquetFile(path).read()  # (pq.read_table imports pandas)
        assert "pandas" not in sys.modules, "reading the file imported pandas"
        with connect({str(tmp_path / "db")!r}) as db:
            db.sql("CREATE TABLE t (k BIGINT, f DOUBLE, i INTEGER) ORDER BY k")
            db.insert("t", path)
            db.insert("t", data)
            db.sql("CREATE TABLE u (f DOUBLE, k BIGINT, i INTEGER) ORDER BY f")
            db.insert("u", path)
            print("pandas" in sys.modules, db.query("SELECT count(*), count(f) FROM t")[0],
                  db.query("SELECT count(*) FROM u WHERE f IS NULL")[0])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    non_null = sum(f is not None for f in floats)
    assert out.stdout.split(" ", 1) == ["False", f"(140000, {2 * non_null}) ({n - non_null},)\n"]


def test_a_null_slot_holding_a_signaling_nan_inserts_without_a_warning(tmp_path):
    """A FLOAT column's NULL slots hold whatever its buffer holds: here a signaling NaN,
    whose cast to float64 for the column's granule bounds raised NumPy's "invalid value"
    warning (an error under pytest's settings: found by CI's hypothesis run of
    test_db_params). The insert keeps the values and the NULLs."""
    import warnings

    import numpy as np
    import pyarrow as pa

    import cryptdisk

    n = 10
    data = np.full(n, 0x7FA00000, np.uint32)  # a signaling NaN's bits in every slot
    data[::2] = np.float32(1.5).view(np.uint32)
    valid = np.packbits(np.array([i % 2 == 0 for i in range(n)]), bitorder="little")
    floats = pa.Array.from_buffers(pa.float32(), n, [pa.py_buffer(valid.tobytes()),
                                                     pa.py_buffer(data.tobytes())])
    with cryptdisk.connect(tmp_path / "db") as db:
        db.sql("CREATE TABLE t (k BIGINT, f FLOAT) ORDER BY k")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            db.insert("t", pa.table({"k": pa.array(range(n), pa.int64()), "f": floats}))
        assert db.query("SELECT count(f), sum(f), count(*) FROM t") == [(5, 7.5, 10)]
        assert db.query("SELECT count(*) FROM t WHERE f IS NULL OR isnan(f)") == [(5,)]

"""Inserts: a query's rows (or a DataFrame, Arrow table, CSV, Parquet or JSON file) become parts.

DuckDB runs the SELECT or VALUES and casts each column to the table's type;
its Arrow result streams, in the input's order, into :mod:`._blocks`, which
sorts it by the table's ``ORDER BY`` one block of ``insert_block_bytes`` at a
time and writes the parts on several threads, so an insert of any size holds a
few blocks in memory. The parts are published first and the catalog last, once
for all of them: a crash in between leaves orphan parts that the next writer
removes, never a half-visible insert.
"""

from __future__ import annotations

import contextlib
import decimal
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from ..errors import CatalogError, DatabaseError
from . import _sql
from ._blocks import load_compute, sortable, write_sorted_parts
from ._catalog import PartMeta
from ._columns import stored_type
from ._constraints import (
    check_not_null_batch,
    column_definitions,
    constraint_error,
    default_sql,
    not_null_sql,
)
from ._fdlimit import out_of_files, too_many_open_files
from ._memory import out_of_memory
from ._names import fold
from ._partread import open_part
from ._parts import verify_part, write_parts
from ._policies import quiet_error, role_query, role_rewrites
from ._rollback import part_file_name
from ._sigint import interruptible
from ._storage import policy_disk

if TYPE_CHECKING:
    from ._catalog import TableMeta
    from ._state import DatabaseState
else:
    DatabaseState = object  # the type checker's view only: see _state

__all__ = ["BATCH_ROWS", "INSERT_BLOCK_BYTES", "PART_ROWS", "InsertMixin", "ctrl_c"]

#: Rows per Arrow batch from DuckDB (gathered into blocks of ``insert_block_bytes``).
BATCH_ROWS = 1 << 17
#: Most rows per part.
PART_ROWS = 16 << 20
#: The default ``insert_block_bytes``: 32 MiB of Arrow data, about 670K rows of the
#: benchmark's (BIGINT, 32-character VARCHAR, DOUBLE) rows. A block is sorted and then
#: taken in key order, a random gather over all of it: 32 MiB blocks load 10M random keys
#: in about 12% less process CPU than 64 MiB ones (paired runs; 15 parts instead of 8).
INSERT_BLOCK_BYTES = 32 << 20
#: Inserts that leave a table with this many parts of under SMALL_PART_ROWS rows on
#: average log a warning (1000 one-row parts: a sum over them 1 s, over the merged part
#: 8 ms; see _warn_of_small_parts).
SMALL_PARTS = 100
SMALL_PART_ROWS = 10_000
#: the tables warned of (database id, name), once per process
_WARNED_PARTS: set[tuple[Any, str]] = set()
log = logging.getLogger("cryptdisk.db")
_SOURCE = "__cd_insert_source"
#: the temporary table an INSERT ... VALUES list is cast into (see _values_table)
_VALUES_TABLE = "__cd_insert_values"
#: the temporary table DuckDB's COPY ... FROM loads a file into (see _copy_from)
_COPY_TABLE = "__cd_copy_source"
#: the name an answer from the catalog is read by (see _query_text)
_ANSWER = "__cd_insert_answer"


def _from_python(table: str, data: Any) -> Any:
    """``data`` as an Arrow table if it is rows as a list of dicts or columns as a dict of
    lists (pyarrow infers each column's type; DuckDB casts it to the table's), else as it
    is. Values pyarrow cannot put in one column raise :class:`DatabaseError`."""
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        names = list(dict.fromkeys(k for row in data for k in row))  # (every row's keys:
        data = {k: [row.get(k) for row in data] for k in names}  # from_pylist takes the 1st)
    if not isinstance(data, dict):
        return data
    try:
        try:
            return pa.table(data)
        except OverflowError:  # an int beyond 64 bits: as DuckDB binds one (see _wide_ints)
            return pa.table({k: _wide_ints(table, k, v) for k, v in data.items()})
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise DatabaseError(f"insert into {table}: cannot read the data: {exc}") from None


def _wide_ints(table: str, column: str, values: Any) -> Any:
    """Column ``values`` as pyarrow infers them, or, for Python ints one of which does not
    fit 64 bits (pyarrow's inference raises ``OverflowError``), as a ``DECIMAL(38,0)``
    column, which DuckDB casts to the table's type (a ``HUGEINT`` column holds it, a
    ``BIGINT`` one fails with DuckDB's conversion error)."""
    try:
        return pa.array(values)
    except OverflowError:
        pass
    if not isinstance(values, (list, tuple)) or not all(
            v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values):
        raise DatabaseError(f"insert into {table}: column {column} holds an integer beyond "
                            "64 bits among values of other types")
    most = 10 ** 38 - 1
    wide = next((v for v in values if v is not None and not -most <= v <= most), None)
    if wide is not None:
        raise DatabaseError(f"insert into {table}: column {column}: {wide} has more than 38 "
                            "digits, which no column holds (a HUGEINT is a DECIMAL(38,0) in "
                            "its parts)")
    return pa.array([None if v is None else decimal.Decimal(v) for v in values],
                    pa.decimal128(38, 0))


def _warn_of_small_parts(db_id: Any, meta: TableMeta) -> None:
    """Log a warning, once per table (of database ``db_id``) and process, when inserts
    have left ``meta`` with :data:`SMALL_PARTS` or more parts of under
    :data:`SMALL_PART_ROWS` rows on average (a loop of small inserts: every query opens
    each part; nothing merges them)."""
    n = len(meta.parts)
    if n < SMALL_PARTS or sum(p.rows for p in meta.parts) >= n * SMALL_PART_ROWS:
        return
    if (db_id, meta.name) in _WARNED_PARTS:
        return
    _WARNED_PARTS.add((db_id, meta.name))
    log.warning("cryptdisk: table %s has %d parts averaging %d rows (each insert makes at "
                "least one, and every query opens each): insert more rows at once, or "
                "merge them with OPTIMIZE TABLE %s", meta.name, n,
                sum(p.rows for p in meta.parts) // n, _quote(meta.name))


def ctrl_c(exc: RuntimeError) -> BaseException:
    """What to raise for ``exc`` from DuckDB: its ``RuntimeError('Query interrupted')``
    (it takes the ``KeyboardInterrupt`` of a Ctrl-C that comes while it runs a query)
    as the ``KeyboardInterrupt`` that Python raises for a Ctrl-C, anything else as is."""
    if type(exc) is RuntimeError and str(exc) == "Query interrupted":
        return KeyboardInterrupt()
    return exc


class _Files(list):  # type: ignore[type-arg]
    """The CSV or JSON files a glob or a list of paths named (read by one DuckDB reader)."""


class _Urls(_Files):
    """CSV or JSON files at ``cryptdisk://`` URLs, read by DuckDB through the cryptdisk
    filesystem ``fs`` (registered on the connection while the insert reads them)."""

    def __init__(self, urls: list[str], fs: Any) -> None:
        super().__init__(urls)
        self.fs = fs


#: how a ``cryptdisk://DISK/path`` URL starts (any case, as fsspec takes it)
_URL_SCHEME = "cryptdisk://"


def _is_url(path: Any) -> bool:
    return isinstance(path, str) and path[:len(_URL_SCHEME)].lower() == _URL_SCHEME


def _family(t: pa.DataType) -> str:
    """What an Arrow type is for :func:`_check_schemas`: integers, floats, text, bytes and
    timestamps of any width or unit are each one family (the dataset reads a file's column
    cast to the first file's type), every other type its own."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    for family, test in (("integer", pa.types.is_integer), ("float", pa.types.is_floating),
                         ("text", lambda x: pa.types.is_string(x) or
                          pa.types.is_large_string(x) or pa.types.is_string_view(x)),
                         ("bytes", lambda x: pa.types.is_binary(x) or
                          pa.types.is_large_binary(x) or pa.types.is_binary_view(x)),
                         ("timestamp", pa.types.is_timestamp)):
        if test(t):
            return family
    return str(t)


def _check_schemas(table: str, dataset: Any) -> list[pa.Schema]:
    """Refuse Parquet files whose columns differ from the first file's: pyarrow's dataset
    takes the first file's schema, dropped a later file's other columns and failed with its
    own message on a column of another type (``Failed to parse string: 'x' as a scalar of
    type int64``), naming no file. A column of NULLs only (Parquet type null) goes with
    any type, and widths of one family (``int32`` and ``int64``) with each other."""
    first: pa.Schema | None = None
    first_path = ""
    schemas: list[pa.Schema] = []
    for fragment in dataset.get_fragments():
        try:
            schema = fragment.physical_schema
        except (pa.ArrowException, OSError) as exc:
            raise DatabaseError(f"insert into {table}: cannot read the Parquet file "
                                f"{fragment.path}: {str(exc).splitlines()[0]}") from None
        schemas.append(schema)
        if first is None:
            first, first_path = schema, fragment.path
            continue
        theirs = {f.name: f.type for f in first}
        mine = {f.name: f.type for f in schema}
        hint = ("insert the files whose columns differ separately, or pass a pyarrow dataset "
                "with the schema to read them by: ds.dataset(files, schema=...)")
        for name, t in mine.items():
            if name not in theirs:
                raise DatabaseError(f"insert into {table}: {fragment.path} has column {name}, "
                                    f"which {first_path} lacks", hint=hint)
            u = theirs[name]
            if not (pa.types.is_null(t) or pa.types.is_null(u) or _family(t) == _family(u)):
                raise DatabaseError(f"insert into {table}: column {name} is {t} in "
                                    f"{fragment.path} but {u} in {first_path}", hint=hint)
        for name in theirs:
            if name not in mine:
                raise DatabaseError(f"insert into {table}: {fragment.path} has no column "
                                    f"{name}, which {first_path} has", hint=hint)
    return schemas


def _widened(dataset: Any, schemas: list[pa.Schema]) -> Any:
    """``dataset`` reading each column at the widest type of its family among the files'
    ``schemas`` (int64 beside int32, float64 beside float32, microseconds beside
    milliseconds, a type beside NULLs only), as DuckDB's ``read_parquet`` unions them:
    the dataset reads every file at the first file's types, which rounded a later
    float64 to float32 silently, made a column of NULLs only in the first file NULL in
    all, and failed a wider value (naming no file). As it is when they do not unify."""
    try:
        wide = pa.unify_schemas([dataset.schema, *schemas], promote_options="permissive")
        fields = [wide.field(f.name) for f in dataset.schema]
    except (pa.ArrowException, KeyError):
        return dataset
    schema = pa.schema(fields, metadata=dataset.schema.metadata)
    if schema.equals(dataset.schema):
        return dataset
    import pyarrow.dataset as ds

    return ds.FileSystemDataset(list(dataset.get_fragments()), schema, dataset.format,
                                dataset.filesystem,
                                root_partition=dataset.partition_expression)


def _parquet_dataset(table: str, files: str | list[str], what: str,
                     base: str | None) -> Any:
    """The pyarrow dataset of Parquet ``files`` (a directory's path, or a list of files,
    ``what`` naming them in errors), hive partitions as columns under ``base`` (None:
    none), its files' columns checked to be alike."""
    import pyarrow.dataset as ds

    try:
        if base is None and isinstance(files, list):
            dataset = ds.dataset(files, format="parquet")
        else:
            dataset = ds.dataset(files, format="parquet", partitioning="hive",
                                 partition_base_dir=base)
    except (pa.ArrowException, OSError) as exc:  # a file that is not Parquet
        raise DatabaseError(f"insert into {table}: cannot read the Parquet files of "
                            f"{what}: {str(exc).splitlines()[0]}",
                            hint="a directory is read as Parquet files; pass a CSV or JSON "
                            "file's path, or a pyarrow dataset of the directory") from None
    return _widened(dataset, _check_schemas(table, dataset))


def _glob_base(pattern: str) -> str:
    """The directory of ``pattern`` before its first component with a wildcard."""
    import glob

    parts = pattern.split(os.sep)
    i = next(i for i, p in enumerate(parts) if glob.has_magic(p))
    return os.sep.join(parts[:i]) or (os.sep if pattern.startswith(os.sep) else ".")


def _from_paths(table: str, data: Any) -> Any:
    """A glob (``dir/*.parquet``, ``dir/**/*.csv``) or a list of paths (globs among them)
    as DuckDB's ``read_parquet``, ``read_csv`` and ``read_json`` take them: the files
    they name (a glob's ``**`` any number of directories), as the dataset of their
    Parquet files (a glob's hive partitions under its directory as columns) or as the
    CSV or JSON files read by one DuckDB reader; one file as its path; anything else as
    it is. A file the list names twice (itself, or a glob matching it) is read twice. No
    file, a pattern that matches none, or files of two formats is a
    :class:`DatabaseError`."""
    import glob

    if isinstance(data, _Files):  # (cryptdisk:// URLs, found already)
        return data
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        if not isinstance(path, str) or os.path.exists(path) or not glob.has_magic(path):
            return data
        given, base = [path], _glob_base(path)
    elif isinstance(data, (list, tuple)) and data and all(
            isinstance(p, (str, os.PathLike)) for p in data):
        given, base = [str(os.fspath(p)) for p in data], None
    else:
        return data
    files: list[str] = []
    for item in given:
        if os.path.isfile(item):
            files.append(item)
        elif glob.has_magic(item) and not os.path.exists(item):
            found = sorted(f for f in glob.glob(item, recursive=True) if os.path.isfile(f))
            if not found:
                raise DatabaseError(f"insert into {table}: no file matches {item}",
                                    hint="a glob's * matches within a directory, ** "
                                    "any number of directories (dir/**/*.parquet)")
            files.extend(found)
        elif os.path.isdir(item):
            raise DatabaseError(f"insert into {table}: {item} is a directory, in a list of "
                                "files", hint="insert the directory alone, or name its "
                                "files (dir/**/*.parquet)")
        else:
            raise DatabaseError(f"insert into {table}: no file {item}")
    # (a file listed twice, or named beside a glob that matches it, is read twice, as
    # DuckDB's readers read a list: the list says what to insert)
    if len(files) == 1:
        return files[0]
    reader = _one_reader(table, files)
    what = given[0] if base is not None else f"the {len(files)} files"
    if reader == "read_parquet":
        return _parquet_dataset(table, files, what, base)
    return _Files(files)


def _from_directory(table: str, data: Any) -> Any:
    """A directory's path as the pyarrow dataset of its Parquet files (those in its
    subdirectories too, hive partitions such as ``year=2024/`` as columns, as DuckDB's
    ``read_parquet('dir/**/*.parquet', hive_partitioning = true)`` reads them; files
    whose name starts with ``_`` or ``.`` are left out, as pyarrow does; their columns
    alike), anything else as it is."""
    if not isinstance(data, (str, os.PathLike)) or not os.path.isdir(data):
        return data
    path = os.fspath(data)
    dataset = _parquet_dataset(table, path, f"the directory {path}", None)
    if not dataset.files:
        raise DatabaseError(f"insert into {table}: the directory {path} holds no Parquet "
                            "file", hint="a directory is read as its Parquet files "
                            "(hive partitions such as year=2024/ too)")
    return dataset


def _from_dataset(data: Any) -> Any:
    """A pyarrow ``Dataset`` or ``Scanner`` as a ``RecordBatchReader`` (its batches read as
    the insert takes them, not all at once), a pandas ``Series`` as a DataFrame of it, an
    Arrow array refused, anything else as it is."""
    if isinstance(data, (pa.Array, pa.ChunkedArray)):  # (DuckDB named its column value)
        raise TypeError("insert() takes named columns, not an Arrow array: "
                        "pyarrow.table({'column': array})")
    if type(data).__name__ == "Series" and hasattr(data, "to_frame"):
        return data.to_frame()  # a pandas Series: its name is the column's (DuckDB: value)
    dataset = sys.modules.get("pyarrow.dataset")  # (only loaded if the caller made one)
    if dataset is not None:
        if isinstance(data, dataset.Dataset):  # (read ahead a batch, not pyarrow's 16
            # batches of 4 files: 20M rows of (BIGINT, VARCHAR) in 10 files peaked at
            # 1.06 GB RSS, 0.82 GB so; medians of 3)
            return data.scanner(batch_readahead=1, fragment_readahead=1).to_reader()
        if isinstance(data, dataset.Scanner):
            return data.to_reader()
    return data


def _check_names(table: str, data: Any) -> None:
    """Refuse data that names a column twice (ignoring case, as the columns match):
    DuckDB renames the second ``id`` to ``id_1``, which a table may have."""
    if isinstance(data, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)):
        names = [str(n) for n in data.schema.names]
    elif type(data).__name__ == "DataFrame" and hasattr(data, "columns"):
        names = [str(n) for n in data.columns]
    else:
        return
    seen: set[str] = set()
    for name in names:
        if fold(name) in seen:
            raise DatabaseError(f"insert into {table}: the data has column {name} twice",
                                hint="rename or drop the repeated column")
        seen.add(fold(name))


def _check_index(table: str, frame: Any, columns: list[str]) -> None:
    """Refuse a pandas DataFrame whose index names a column of the table that the frame's
    columns lack (``df.groupby("region").sum()``): the index is not inserted, so that
    column would be NULL in every row."""
    names = getattr(frame.index, "names", None) or []
    given = {fold(str(c)) for c in frame.columns}
    wanted = {fold(c) for c in columns}
    for name in names:
        if isinstance(name, str) and fold(name) in wanted and fold(name) not in given:
            raise DatabaseError(
                f"insert into {table}: column {name} is the DataFrame's index, which is "
                "not inserted", hint="df.reset_index() makes the index a column")


def _without_statement(message: str) -> str:
    """DuckDB's error ``message`` without the lines that quote the statement it ran
    (``LINE 1: SELECT CAST(#1 AS BIGINT) ...`` and the carets under it): for data given
    to :meth:`InsertMixin.insert`, a statement cryptdisk wrote, not the user."""
    out: list[str] = []
    for line in message.split("\n"):
        if line.startswith("LINE ") or (line.strip() and not line.strip("^ ")):
            continue
        out.append(line)
    return "\n".join(out).rstrip()


def _late_duckdb_error(exc: OSError) -> bool:
    """Whether ``exc`` is DuckDB's error raised as its Arrow stream is read (pyarrow's
    plain ``OSError``, no errno, DuckDB's ``Kind Error:`` words), not one of a disk's."""
    return type(exc) is OSError and exc.errno is None and \
        re.match(r"[A-Za-z ]+ Error: ", str(exc)) is not None


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _as_table(batch: pa.RecordBatch, schema: pa.Schema, where: list[int | None],
              check: list[int]) -> pa.RecordBatch:
    """``batch``'s columns in ``schema``: column ``where[i]`` of it, or NULLs if None;
    the string columns ``check`` validated in full (offsets and UTF-8)."""
    for j in check:
        batch.column(j).validate(full=True)
    n = batch.num_rows
    return pa.RecordBatch.from_arrays(
        [batch.column(j) if j is not None else pa.nulls(n, f.type)
         for f, j in zip(schema, where, strict=True)], schema=schema)


def _arrow_source(data: pa.Table | pa.RecordBatch | pa.RecordBatchReader,
                  schema: pa.Schema) -> Iterator[pa.RecordBatch] | None:
    """Arrow ``data`` as batches in ``schema``, or None unless each of its columns is a
    column of ``schema`` by name (matched as :meth:`InsertMixin.insert` does, ignoring
    case) of the same Arrow type: the values are then the table's as they are."""
    found = data.schema
    lower = {fold(f.name): i for i, f in enumerate(schema)}
    where: list[int | None] = [None] * len(schema)
    for j, f in enumerate(found):
        i = lower.get(fold(f.name))
        if i is None or where[i] is not None or f.type != schema.field(i).type:
            return None
        where[i] = j
    if all(w is None for w in where):  # no column of the table: DuckDB says so
        return None
    batches: Iterable[pa.RecordBatch]
    if isinstance(data, pa.RecordBatch):
        batches = [data]
    elif isinstance(data, pa.Table):
        batches = data.to_batches(max_chunksize=BATCH_ROWS)
    else:
        batches = data
    check = [j for j, f in enumerate(found)
             if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    return (_as_table(b, schema, where, check) for b in batches)


def _reading(batches: Iterator[pa.RecordBatch], table: str) -> Iterator[pa.RecordBatch]:
    """``batches``, an error reading them raised as :class:`DatabaseError`."""
    try:
        yield from batches
    except (pa.ArrowException, OSError) as exc:
        raise DatabaseError(f"insert into {table}: cannot read the data: {exc}") from None


def _checked(batches: Iterator[pa.RecordBatch], meta: TableMeta) -> Iterator[pa.RecordBatch]:
    """``batches``, each checked for a NULL in a NOT NULL column of ``meta``."""
    for batch in batches:
        check_not_null_batch(meta, batch, f"insert into {meta.name}")
        yield batch


def _check_csv_header(table: str, path: str, found: list[str], columns: list[str],
                      fs: Any = None) -> None:
    """Refuse a CSV file that holds nothing, or rows without a header line naming their
    columns: DuckDB names the columns it then reads ``column0``, ``column1``... (``fs``:
    the filesystem the file is on, None: local)."""
    if found != [f"column{i}" for i in range(len(found))] or \
            {fold(c) for c in columns} & set(found):
        return
    size = os.path.getsize(path) if fs is None else fs.size(path)
    if size < 1 << 20:
        with open(path, "rb") if fs is None else fs.open(path, "rb") as f:
            if not f.read().strip():
                raise DatabaseError(f"insert into {table}: {path} is empty (no header line, "
                                    "no rows)")
    literal = "'" + path.replace("'", "''") + "'"
    raise DatabaseError(
        f"insert into {table}: {path} has no header line naming its columns",
        hint=f"start it with the line {','.join(columns)}, or insert its columns by "
        f"position: INSERT INTO {table} SELECT * FROM read_csv({literal}, header = false)")


def _file_reader(path: str) -> str:
    """The DuckDB function that reads the file at ``path``, by its extension: Parquet
    (``.parquet``, ``.pq``), JSON (``.json``, ``.jsonl``, ``.ndjson``, compressed too) or
    else CSV."""
    name = path.lower()
    if name.endswith((".parquet", ".pq")):
        return "read_parquet"
    for suffix in (".gz", ".zst"):
        name = name.removesuffix(suffix)
    return "read_json" if name.endswith((".json", ".jsonl", ".ndjson")) else "read_csv"


@contextlib.contextmanager
def _local_parquet_reads(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """DuckDB's Parquet prefetching off while an insert reads local Parquet files.

    Prefetching reads each row group's column chunks into buffers of their own, fresh
    memory the kernel faults in and zeroes for every row group: a 10M-row load's DuckDB
    read took 0.80 instead of 0.98 CPU s without it, at half the page faults. A local
    file gains nothing from reads issued ahead; remote ones (URLs) keep them. The
    connection's setting is restored afterwards (and left alone if already off)."""
    try:
        rows = con.execute("SELECT current_setting('disable_parquet_prefetching')").fetchall()
        switch = bool(rows) and rows[0][0] not in (True, "true")
        if switch:
            con.execute("SET disable_parquet_prefetching = true")
    except duckdb.Error:  # (a DuckDB without the setting)
        switch = False
    if not switch:  # (the body's errors are never caught here)
        yield
        return
    try:
        yield
    finally:
        con.execute("SET disable_parquet_prefetching = false")


def _one_reader(table: str, files: list[str]) -> str:
    """The one DuckDB reader of ``files`` (by their names); files of two formats are
    refused."""
    readers = {_file_reader(f) for f in files}
    if len(readers) > 1:
        kinds = {"read_parquet": "Parquet", "read_csv": "CSV", "read_json": "JSON"}
        raise DatabaseError(f"insert into {table}: the files are of more than one format ("
                            f"{', '.join(sorted(kinds[r] for r in readers))})",
                            hint="insert the files of each format separately")
    return readers.pop()


def _file_types(found: list[str], columns: list[tuple[str, str]], option: str) -> str:
    """The ``option`` of ``read_csv`` (``types``) or ``read_json`` (``columns``) naming, for
    each of a file's columns ``found`` that is a column of the table (in any case), that
    column's type: the file's text is then read as the table's types, as DuckDB's own
    ``COPY`` and ``INSERT INTO t SELECT * FROM 'file.csv'`` read a CSV file ('1.50' into a
    VARCHAR stays '1.50', a DECIMAL keeps its digits, a JSON string that looks like a
    timestamp stays as written), rather than in the types DuckDB's sniffer guesses and
    then cast. '' when none is, or for ``columns`` (which reads only the columns it
    names) when a column found is not the table's (the insert then says so)."""
    types = {fold(c): t for c, t in columns}
    if option == "columns" and any(fold(c) not in types for c in found):
        return ""

    def text(value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    pairs = [f"{text(c)}: {text(types[fold(c)])}" for c in found if fold(c) in types]
    return f"{option} = {{{', '.join(pairs)}}}" if pairs else ""


def _renamed(cols: list[str]) -> bool:
    """Whether DuckDB may have renamed a column of ``cols`` that a file names twice: one is
    another's name (in any case) with ``_N`` after it, as DuckDB names the second ``x``."""
    lower = {fold(c) for c in cols}
    return any((m := re.fullmatch(r"(.+)_\d+", fold(c))) is not None and m.group(1) in lower
               for c in cols)


class InsertMixin(DatabaseState):
    """Insert methods of :class:`~cryptdisk.db.Database`."""

    def _insert_sql(self, st: _sql.Insert) -> None:
        self.insert_query(st.table, st.query, columns=st.columns, by_name=st.by_name)

    def _copy_from(self, st: _sql.CopyFrom) -> None:
        """``COPY t [(c1, ...)] FROM 'file' [options]``: DuckDB's own ``COPY`` loads the
        file into a temporary table of ``t``'s columns (its format, options, column
        mapping and casts as DuckDB's ``COPY`` into a table of ``t``'s has them), whose
        rows are then written as one insert (one set of parts, one catalog commit)."""
        meta: TableMeta = self.table(st.table)
        names = {fold(c): c for c, _t in meta.columns}
        named = ""
        if st.columns is not None:
            unknown = [c for c in st.columns if fold(c) not in names]
            if unknown:
                raise DatabaseError(f"COPY {meta.name} FROM: no column(s) {', '.join(unknown)} "
                                    f"(columns: {', '.join(names.values())})")
            if len({fold(c) for c in st.columns}) != len(st.columns):
                raise DatabaseError(f"COPY {meta.name} FROM: a column is named twice")
            named = f" ({', '.join(_quote(names[fold(c)]) for c in st.columns)})"
        name = _COPY_TABLE
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({column_definitions(meta)})")
        try:
            try:
                self.con.execute(f"COPY temp.{name}{named} FROM {st.source}")
            except duckdb.OutOfMemoryException as exc:
                raise out_of_memory(f"COPY {meta.name} FROM", exc,
                                    "raise memory_limit, or insert the file as it is read: "
                                    f"INSERT INTO {meta.name} SELECT * FROM read_parquet('file')"
                                    ) from None
            except duckdb.Error as exc:
                text = str(exc).replace(f"temp.{name}", _quote(meta.name)).replace(
                    name, meta.name)
                raise constraint_error(f"COPY {meta.name} FROM", text) or \
                    _sql.cryptdisk_read_error(f"COPY {meta.name} FROM", text) or \
                    DatabaseError(f"COPY {meta.name} FROM: {text}") from None
            schema = self.arrow_schema(meta)
            disk = policy_disk(self.policy(meta.policy))
            parts = self._insert_rows(meta, schema, disk, f"SELECT * FROM temp.{name}", None,
                                      f"COPY {meta.name} FROM",
                                      "raise memory_limit or load the file in smaller pieces")
            self._publish(meta, parts)
        finally:
            self.con.execute(f"DROP TABLE IF EXISTS temp.{name}")

    def insert_query(self, table: str, query: str, *, columns: list[str] | None = None,
                     on_rows: Callable[[int], None] | None = None,
                     by_name: bool = False) -> int:
        """Insert the rows of ``query`` (SELECT, VALUES, FROM ...); returns the row count.

        Columns match by position, or by the ``columns`` list, or with ``by_name`` by the
        query's column names (ignoring case, as DuckDB's ``INSERT ... BY NAME``); the
        table's other columns get NULL.
        ``on_rows(n)`` is called as batches are written (for progress bars). On a
        connection opened with ``role=``, ``query`` reads tables through that role's
        masking and row access policies, as its queries do.
        """
        with self._mutex:
            self._writable(f"insert into {table}", adds=True)
            meta: TableMeta = self.table(table)
            schema = self.arrow_schema(meta)
            disk = policy_disk(self.policy(meta.policy))
            if self.role is not None:  # the rows a role may read, as in its queries
                query = role_query(self, query)
            try:
                parts = self._insert_rows(meta, schema, disk, query, columns,
                                          f"INSERT INTO {meta.name}",
                                          "raise memory_limit or insert in smaller pieces",
                                          on_rows, by_name)
            except DatabaseError as exc:
                if role_rewrites(self):  # DuckDB quotes the role's rewritten query
                    exc.args = (quiet_error(str(exc)),)
                raise
            return self._publish(meta, parts)

    def _insert_rows(self, meta: TableMeta, schema: pa.Schema, disk: Any, query: str,
                     columns: list[str] | None, what: str, oom_hint: str,
                     on_rows: Callable[[int], None] | None = None,
                     by_name: bool = False) -> list[PartMeta]:
        """Write the rows of ``query`` as new parts of ``meta`` (named for the next
        catalog version, not yet published); DuckDB's errors become ``DatabaseError``
        naming ``what``, running out of memory one with ``oom_hint``."""
        try:
            # field functions stay DuckDB's here: a row the scan could not compute
            # would fail the stream half written (queries run again instead)
            prepared = self._query_text(self._prepare(query, False))
            with interruptible(self.con):
                return self._write(meta, schema, disk, prepared, columns,
                                   self.catalog.version + 1, on_rows, by_name)
        except duckdb.OutOfMemoryException as exc:
            raise out_of_memory(what, exc, oom_hint) from None
        except duckdb.Error as exc:  # (without the statement cryptdisk wrote, see _write)
            text = _without_statement(str(exc))
            raise constraint_error(what, text) or DatabaseError(f"{what}: {text}") from None
        except RuntimeError as exc:
            raise ctrl_c(exc) from None
        except OSError as exc:
            if out_of_files(exc):  # (a new part's file, or the interrupt's pipe)
                raise too_many_open_files(f"writing {what}", exc) from None
            if not _late_duckdb_error(exc):
                raise
            # DuckDB's error in a row past the first batches, through its Arrow stream
            text = _without_statement(str(exc))
            raise constraint_error(what, text) or DatabaseError(f"{what}: {text}") from None
        finally:
            self._release()

    def _query_text(self, prepared: Any) -> str:
        """The SQL that reads the rows of a query :meth:`_prepare` prepared: its text, or
        for an answer the catalog gave (``SELECT count(*) FROM t``), a read of that answer
        (exposed to the statement, released with its scans)."""
        if isinstance(prepared, pa.Table):
            self._expose(_ANSWER, prepared)
            return self._bind_exposed(f"SELECT * FROM {_ANSWER}")
        return str(prepared)

    def _publish(self, meta: TableMeta, parts: list[PartMeta], *, own: bool = True) -> int:
        """Add ``parts`` to table ``meta`` and commit the catalog; if the commit fails they
        leave ``meta`` again, and their files (``own``: this statement wrote them) are
        deleted when that commit certainly did not publish them (see
        :meth:`_discard_unpublished`). Returns their row count (0, and no commit, for no
        parts)."""
        if not parts:
            return 0
        meta.parts.extend(parts)

        def undo() -> None:
            del meta.parts[-len(parts):]

        with self._committing(undo, parts if own else ()):
            self._commit()
        _warn_of_small_parts(self.catalog.db_id, meta)
        return sum(p.rows for p in parts)

    def _write(self, meta: TableMeta, schema: pa.Schema, disk: Any, query: str,
               columns: list[str] | None, version: int,
               on_rows: Callable[[int], None] | None, by_name: bool = False
               ) -> list[PartMeta]:
        """Write the rows of ``query`` as new parts of ``meta`` (not yet in the catalog).

        DuckDB casts the rows to the table's types and streams them in the input's
        order; :func:`._blocks.write_sorted_parts` sorts them a block at a time on
        several threads. An ``ORDER BY`` on a type Arrow cannot sort is sorted by DuckDB,
        the whole insert at once.
        """
        query, columns, values = self._values_table(meta, query, columns)
        try:
            return self._write_query(meta, schema, disk, query, columns, version, on_rows,
                                     by_name)
        finally:
            if values:
                self.con.execute(f"DROP TABLE IF EXISTS temp.{values}")

    def _values_table(self, meta: TableMeta, query: str, columns: list[str] | None
                      ) -> tuple[str, list[str] | None, str | None]:
        """A ``VALUES`` list's rows put in a temporary DuckDB table of ``meta``'s columns
        by DuckDB's own ``INSERT``, which casts each value to its column's type: read as a
        query, ``VALUES`` gives each column one type for all rows first (``(1), (1.5)``
        into a VARCHAR column made '1.0', and ``(1), ('NaN')`` into a DOUBLE one failed).
        Returns the query reading them, its columns and the temporary table (None, and
        ``query`` as it is, for anything else)."""
        if _sql.first_word(query) not in ("VALUES", "DEFAULT"):  # (DEFAULT VALUES)
            return query, columns, None
        name = _VALUES_TABLE
        types = column_definitions(meta)  # (DuckDB fills each DEFAULT, checks NOT NULL)
        named = "" if columns is None else f" ({', '.join(_quote(c) for c in columns)})"
        self.con.execute(f"CREATE OR REPLACE TEMP TABLE {name} ({types})")
        try:
            self.con.execute(f"INSERT INTO temp.{name}{named} {query}")
        except BaseException as exc:
            self.con.execute(f"DROP TABLE IF EXISTS temp.{name}")
            if not isinstance(exc, duckdb.Error) or isinstance(exc, duckdb.OutOfMemoryException):
                raise  # (insert_query reports running out of memory)
            text = str(exc).replace(f"temp.{name}", _quote(meta.name)).replace(name, meta.name)
            raise constraint_error(f"INSERT INTO {meta.name}", text) or DatabaseError(
                f"INSERT INTO {meta.name}: {text}") from None
        return f"SELECT * FROM temp.{name}", None, name

    def _write_query(self, meta: TableMeta, schema: pa.Schema, disk: Any, query: str,
                     columns: list[str] | None, version: int,
                     on_rows: Callable[[int], None] | None, by_name: bool = False
                     ) -> list[PartMeta]:
        load_compute()  # (imported as DuckDB starts reading: the parts need it)
        order = meta.order
        prefix = meta.prefix(self.catalog.db_id)
        if not order or sortable(schema, order):
            workers = self._threads()  # asked before DuckDB's result is open
            reader = self.con.sql(self._cast_select(meta, query, columns, sort=False,
                                                    by_name=by_name)
                                  ).to_arrow_reader(BATCH_ROWS)
            try:
                return self._write_sorted(meta, schema, disk, reader, version, on_rows,
                                          workers)
            finally:
                reader.close()  # DuckDB's result ends here, also on an error
        reader = self.con.sql(self._cast_select(meta, query, columns, by_name=by_name)
                              ).to_arrow_reader(BATCH_ROWS)
        try:
            return write_parts(disk, prefix, reader, schema, version=version,
                               max_rows=PART_ROWS, on_rows=on_rows, key=order[0],
                               null_free=True)
        finally:
            reader.close()

    def _write_sorted(self, meta: TableMeta, schema: pa.Schema, disk: Any,
                      batches: Iterable[pa.RecordBatch], version: int,
                      on_rows: Callable[[int], None] | None, workers: int) -> list[PartMeta]:
        """Write ``batches`` (in ``schema``, the input's order) as new sorted parts of
        ``meta`` (see :func:`._blocks.write_sorted_parts`), not yet in the catalog."""
        return write_sorted_parts(disk, meta.prefix(self.catalog.db_id), batches, schema,
                                  version=version, max_rows=PART_ROWS,
                                  block_bytes=self.insert_block_bytes, order=meta.order,
                                  workers=workers, on_rows=on_rows)

    def _threads(self) -> int:
        """DuckDB's ``threads`` setting: how many parts an insert encodes at once."""
        return int(self.con.sql("SELECT current_setting('threads')").fetchall()[0][0])

    def _insert_arrow(self, table: str, data: Any,
                      on_rows: Callable[[int], None] | None) -> int | None:
        """Insert an Arrow table, batch or reader whose columns are the table's, of the
        same types, as its batches come: no DuckDB scan of it and Arrow export of the
        result between (a copy of every value). Returns the rows inserted, or None where
        this does not apply (other types or names, a role, a key Arrow cannot sort):
        DuckDB then reads and casts the input.
        """
        if self.role is not None or not isinstance(
                data, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)):
            return None
        self._writable(f"insert into {table}", adds=True)
        load_compute()
        meta: TableMeta = self.table(table)
        schema = self.arrow_schema(meta)
        if meta.order and not sortable(schema, meta.order):
            return None
        given = {fold(f.name) for f in data.schema}
        if any(fold(c) not in given for c in meta.defaults):
            return None  # a DEFAULT to fill: DuckDB's
        batches = _arrow_source(data, schema)
        if batches is None:
            return None
        disk = policy_disk(self.policy(meta.policy))
        if meta.not_null:
            batches = _checked(batches, meta)
        parts = self._write_sorted(meta, schema, disk, _reading(batches, meta.name),
                                   self.catalog.version + 1, on_rows, self._threads())
        return self._publish(meta, parts)

    def _cast_select(self, meta: TableMeta, query: str, columns: list[str] | None, *,
                     sort: bool = True, by_name: bool = False) -> str:
        try:
            width = len(self.con.sql(f"SELECT * FROM ({query}) LIMIT 0").columns)
            if by_name:  # (as the query names them: a subquery renames a repeated name)
                columns = list(self.con.sql(query).columns)
        except duckdb.Error as exc:
            from ._database import _missing_table  # (which imports this module)

            missing = _missing_table(exc, query, self.path, self.catalog.tables,
                                     self.catalog.views)
            if missing is not None:
                raise type(missing)(f"INSERT INTO {meta.name}: {missing}",
                                    hint=missing.hint) from None
            raise _sql.cryptdisk_read_error(f"INSERT INTO {meta.name}", str(exc)) or \
                DatabaseError(f"INSERT INTO {meta.name}: {exc}") from None
        names = [c for c, _ in meta.columns]
        lower = {fold(c): c for c in names}
        if columns is not None:
            seen: set[str] = set()
            for c in columns:
                if fold(c) in seen:
                    raise DatabaseError(f"INSERT INTO {meta.name}: column "
                                        f"{lower.get(fold(c), c)} is given twice")
                seen.add(fold(c))
        if columns is None:
            if width != len(names):
                raise DatabaseError(f"INSERT INTO {meta.name}: the table has {len(names)} "
                                    f"columns but the query gives {width}")
            positions = {c: i + 1 for i, c in enumerate(names)}
        else:
            unknown = [c for c in columns if fold(c) not in lower]
            if unknown:
                raise DatabaseError(f"INSERT INTO {meta.name}: no column(s) "
                                    f"{', '.join(unknown)} (columns: {', '.join(names)})")
            if len(columns) != width:
                raise DatabaseError(f"INSERT INTO {meta.name}: {len(columns)} columns named "
                                    f"but the query gives {width}")
            positions = {lower[fold(c)]: i + 1 for i, c in enumerate(columns)}
        select = ", ".join(
            not_null_sql(meta, c, f"CAST(#{positions[c]} AS {stored_type(t)})" if c in positions
                         else default_sql(meta, c, t)) + f" AS {_quote(c)}"
            for c, t in meta.columns)
        order = ""
        if meta.order_by and sort:
            order = " ORDER BY " + ", ".join(_quote(c) for c in meta.order_by.split(","))
        return f"SELECT {select} FROM ({query}){order}"

    def _from_urls(self, table: str, data: Any) -> Any:
        """``cryptdisk://DISK/path`` URLs (a file, a glob, a directory of Parquet files, or
        a list of URLs and globs) as what reads them through the cryptdisk filesystem: the
        pyarrow dataset of Parquet files, or :class:`_Urls` of CSV or JSON files; the
        same errors as local paths (no file, no file matches, a directory in a list, files
        of two formats). Anything else as it is."""
        if isinstance(data, str):
            given = [data]
        elif isinstance(data, (list, tuple)) and data and all(
                isinstance(p, (str, os.PathLike)) for p in data):
            given = [p if isinstance(p, str) else os.fspath(p) for p in data]
        else:
            return data
        if not any(_is_url(p) for p in given):
            return data
        if not all(_is_url(p) for p in given):
            raise DatabaseError(f"insert into {table}: the list holds cryptdisk:// URLs and "
                                "local paths", hint="insert the local files and the "
                                "cryptdisk:// ones separately")
        from glob import has_magic

        fs = self._url_filesystem(table)
        files: list[str] = []
        for url in given:
            path = url[len(_URL_SCHEME):]
            if fs.isfile(path):
                files.append(path)
            elif has_magic(path) and not fs.exists(path):
                found = sorted(f for f in fs.glob(path) if fs.isfile(f))
                if not found:
                    raise DatabaseError(f"insert into {table}: no file matches {url}",
                                        hint="a glob's * matches within a directory, ** "
                                        "any number of directories (dir/**/*.parquet)")
                files.extend(found)
            elif fs.isdir(path) and len(given) > 1:
                raise DatabaseError(f"insert into {table}: {url} is a directory, in a list "
                                    "of files", hint="insert the directory alone, or name "
                                    "its files (dir/**/*.parquet)")
            elif fs.isdir(path):
                dataset = self._url_dataset(table, fs, path.rstrip("/"), f"the directory {url}",
                                            "hive")
                if not dataset.files:
                    raise DatabaseError(f"insert into {table}: the directory {url} holds no "
                                        "Parquet file", hint="a directory is read as its "
                                        "Parquet files (hive partitions such as year=2024/ too)")
                return dataset
            else:
                raise DatabaseError(f"insert into {table}: no file {url}")
        if _one_reader(table, files) == "read_parquet":
            what = given[0] if len(given) == 1 else f"the {len(files)} files"
            return self._url_dataset(table, fs, files, what, None)
        return _Urls([_URL_SCHEME + f for f in files], fs)

    @staticmethod
    def _url_dataset(table: str, fs: Any, files: str | list[str], what: str,
                     partitioning: str | None) -> Any:
        """The pyarrow dataset of the Parquet ``files`` (or directory) on the cryptdisk
        filesystem ``fs``, checked as :func:`_parquet_dataset` checks local ones."""
        import pyarrow.dataset as ds

        try:
            dataset = ds.dataset(files, format="parquet", filesystem=fs,
                                 partitioning=partitioning)
        except (pa.ArrowException, OSError) as exc:  # a file that is not Parquet
            raise DatabaseError(f"insert into {table}: cannot read the Parquet files of "
                                f"{what}: {str(exc).splitlines()[0]}") from None
        return _widened(dataset, _check_schemas(table, dataset))

    def _url_filesystem(self, table: str) -> Any:
        """The cryptdisk filesystem a ``cryptdisk://`` URL given to :meth:`insert` is read
        through: over the database's config file when it was opened with one, else over
        ``CRYPTDISK_CONFIG``'s (as ``fsspec.filesystem('cryptdisk')`` finds it)."""
        import fsspec

        path = getattr(self.config, "path", None)
        config = path if isinstance(path, str) and os.path.isfile(path) else \
            os.environ.get("CRYPTDISK_CONFIG")
        if not config:
            raise DatabaseError(f"insert into {table}: no config to read cryptdisk:// URLs "
                                "with (the URL's disk is one of a config's)",
                                hint="open the database with config=PATH, or set "
                                "CRYPTDISK_CONFIG to the config that names the disk")
        return fsspec.filesystem("cryptdisk", config=config)

    def insert(self, table: str, data: Any, *,
               on_rows: Callable[[int], None] | None = None) -> int:
        """Insert an Arrow table/batches/reader, a pyarrow dataset or scanner, a pandas or
        polars DataFrame, rows as a list of dicts, columns as a dict of lists, or a
        CSV, Parquet or JSON file path (a directory of Parquet files, a glob or a list of
        paths too; ``cryptdisk://DISK/path`` URLs too, read through the cryptdisk
        filesystem over the database's config file, or ``CRYPTDISK_CONFIG``'s).

        Columns match by name; table columns the data lacks get NULL.
        """
        with self._mutex:
            self._check_open()
            if isinstance(data, list) and not data:  # no rows
                self._writable(f"insert into {table}", adds=True)
                self.table(table)
                return 0
            data = _from_python(table, _from_dataset(_from_directory(
                table, _from_paths(table, self._from_urls(table, data)))))
            _check_names(table, data)
            if type(data).__name__ == "DataFrame" and hasattr(data, "index"):
                _check_index(table, data, [c for c, _t in self.table(table).columns])
            direct = self._insert_arrow(table, data, on_rows)
            if direct is not None:
                return direct
            if isinstance(data, _Urls):  # DuckDB reads them through the filesystem
                self.con.register_filesystem(data.fs)
                try:
                    return self._insert_source(table, data, on_rows)
                finally:
                    self.con.unregister_filesystem(data.fs.protocol)
            return self._insert_source(table, data, on_rows)

    def _insert_source(self, table: str, data: Any,
                       on_rows: Callable[[int], None] | None) -> int:
        """:meth:`insert` of ``data`` that DuckDB reads: files, or data it registers."""
        registered = False
        if isinstance(data, (str, os.PathLike, _Files)):
            paths = data if isinstance(data, _Files) else [os.fspath(data)]
            path = paths[0]
            if not isinstance(data, _Urls) and not os.path.isfile(path) and len(paths) == 1:
                raise DatabaseError(f"insert into {table}: no file {path}")
            reader = _file_reader(path)
            literal = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
            if len(paths) > 1:
                literal = f"[{literal}]"
                path = f"{path} (and {len(paths) - 1} more)"
            try:
                self.con.execute(f"CREATE OR REPLACE TEMP VIEW {_SOURCE} AS "
                                 f"SELECT * FROM {reader}({literal})")
            except duckdb.Error as exc:  # not Parquet, not text DuckDB can read
                raise DatabaseError(f"insert into {table}: cannot read {path}: "
                                    f"{str(exc).splitlines()[0]}") from None
        elif isinstance(data, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)) or hasattr(
                data, "__arrow_c_stream__") or type(data).__name__ == "DataFrame":
            try:
                self.con.register(_SOURCE, data)
            except duckdb.Error as exc:  # (a table or DataFrame of no columns)
                raise DatabaseError(f"insert into {table}: cannot read the data: "
                                    f"{str(exc).splitlines()[0]}") from None
            registered = True
        else:
            raise TypeError("insert() takes an Arrow table or reader, a pyarrow dataset, "
                            "a pandas or polars DataFrame, "
                            "a list of dicts (rows), a dict of lists (columns), or the "
                            "path of a CSV, Parquet or JSON file (a directory, a glob or a "
                            f"list of paths too), not {type(data).__name__}")
        try:
            try:
                cols = list(self.con.sql(f"SELECT * FROM {_SOURCE} LIMIT 0").columns)
            except duckdb.Error as exc:
                raise DatabaseError(f"insert into {table}: cannot read the data: {exc}"
                                    ) from None
            if not registered and reader == "read_csv":
                columns = self.table(table).columns
                _check_csv_header(table, paths[0], cols, [c for c, _t in columns],
                                  getattr(data, "fs", None))
                self._check_csv_repeats(table, path, literal, cols)
                self._check_csv_columns(table, paths)
                typed = _file_types(cols, columns, "types")
            elif not registered and reader == "read_json":
                self._check_json_repeats(table, path, literal, cols)
                typed = _file_types(cols, self.table(table).columns, "columns")
            else:
                typed = ""
            if typed:  # read as the table's types, not the sniffer's, then cast
                try:
                    self.con.execute(f"CREATE OR REPLACE TEMP VIEW {_SOURCE} AS "
                                     f"SELECT * FROM {reader}({literal}, {typed})")
                except duckdb.Error as exc:
                    raise DatabaseError(f"insert into {table}: cannot read {path}: "
                                        f"{str(exc).splitlines()[0]}") from None
            local = not registered and reader == "read_parquet" and not isinstance(data, _Urls)
            try:
                with _local_parquet_reads(self.con) if local else contextlib.nullcontext():
                    return self.insert_query(table, f"SELECT * FROM {_SOURCE}", columns=cols,
                                             on_rows=on_rows)
            except DatabaseError as exc:
                if type(exc) is not DatabaseError:
                    raise
                raise DatabaseError(_without_statement(str(exc)), hint=exc.hint) from None
        finally:
            if registered:
                self.con.unregister(_SOURCE)
            else:
                self.con.execute(f"DROP VIEW IF EXISTS {_SOURCE}")

    def _check_csv_repeats(self, table: str, path: str, literal: str,
                           cols: list[str]) -> None:
        """Refuse a CSV file whose header names a column twice (in any case): DuckDB
        renames the second ``x`` to ``x_1``, which went into a column ``x_1`` of the table
        without a word (or failed as "no column(s) x_1"). The header line is read as
        DuckDB's sniffer reads the file's rows when ``cols`` holds such a name only."""
        if not _renamed(cols):
            return
        try:
            row = self.con.execute(f"SELECT * FROM read_csv({literal}, header = false, "
                                   "all_varchar = true) LIMIT 1").fetchone()
        except duckdb.Error:
            return  # (the insert reads the file and says what is wrong with it)
        names = [n for n in row or () if isinstance(n, str)]
        for i, name in enumerate(names):
            if fold(name) in (fold(n) for n in names[:i]):
                raise DatabaseError(f"insert into {table}: {path} has column {name} twice "
                                    "in its header line",
                                    hint="rename or drop the repeated column")

    def _check_csv_columns(self, table: str, paths: list[str]) -> None:
        """Refuse CSV files whose header lines name other columns than the first file's
        (in any order: DuckDB reads a list of files by name): DuckDB's own error said
        'Columns with names: "v" do not exist in the CSV File', naming no file."""
        first: list[str] | None = None
        for p in paths if len(paths) > 1 else ():
            try:
                found = list(self.con.sql("SELECT * FROM read_csv('" + p.replace("'", "''")
                                          + "') LIMIT 0").columns)
            except duckdb.Error as exc:
                raise DatabaseError(f"insert into {table}: cannot read {p}: "
                                    f"{str(exc).splitlines()[0]}") from None
            if first is None:
                first = found
                continue
            mine, theirs = {fold(c) for c in found}, {fold(c) for c in first}
            if mine != theirs:
                extra = [c for c in found if fold(c) not in theirs]
                lacking = [c for c in first if fold(c) not in mine]
                what = (f"has column(s) {', '.join(extra)}, which {paths[0]} lacks" if extra
                        else f"has no column(s) {', '.join(lacking)}, which {paths[0]} has")
                raise DatabaseError(f"insert into {table}: {p} {what}",
                                    hint="insert the files whose columns differ separately")

    def _check_json_repeats(self, table: str, path: str, literal: str,
                            cols: list[str]) -> None:
        """Refuse JSON whose objects have keys differing in case only (``"X"`` in one,
        ``"x"`` in another, or both in one): DuckDB names the second ``x_1``, and read as
        the table's columns by name the values of one of them became NULL without a word
        (``{"x": 2}`` after ``{"X": 1}`` inserted a NULL). Read when ``cols`` holds such a
        name only."""
        if not _renamed(cols):
            return
        try:
            keys = [k for (k,) in self.con.execute(
                "SELECT DISTINCT unnest(json_keys(json)) FROM "
                f"read_json_objects({literal})").fetchall() if isinstance(k, str)]
        except duckdb.Error:
            return  # (the insert reads the file and says what is wrong with it)
        by_case: dict[str, list[str]] = {}
        for key in sorted(keys):
            by_case.setdefault(fold(key), []).append(key)
        for same in by_case.values():
            if len(same) > 1:
                raise DatabaseError(f"insert into {table}: {path} has the keys "
                                    f"{', '.join(same)}, which name one column (names "
                                    "match in any case)",
                                    hint="give the keys one spelling, or rename one of them")


    def stage_parts(self, table: str, data: Any, version: int) -> list[dict[str, Any]]:
        """Write ``data`` (Arrow, pandas) as new parts of ``table``, unpublished.

        For a writer in another process that holds the write lock: ``version`` is its
        catalog's version plus one, and only its :meth:`commit_parts` makes the parts
        visible. Works on a read-only connection (it changes no catalog). Columns match by
        name, as :meth:`insert`. Returns the parts' catalog entries (no key material).
        Parts never committed are orphans that the next writer removes after its commit.
        """
        with self._mutex:
            if self.read_only or self._remote is not None:
                self.refresh()
            if version != self.catalog.version + 1:
                raise CatalogError(f"stage_parts for version {version}, but the catalog is at "
                                   f"version {self.catalog.version}: another writer "
                                   "committed meanwhile", hint="start the insert again")
            meta: TableMeta = self.table(table)
            schema = self.arrow_schema(meta)
            disk = policy_disk(self.policy(meta.policy))
            self.con.register(_SOURCE, data)
            try:
                cols = list(self.con.sql(f"SELECT * FROM {_SOURCE} LIMIT 0").columns)
                parts = self._write(meta, schema, disk, f"SELECT * FROM {_SOURCE}", cols,
                                    version, None)
            except duckdb.Error as exc:
                raise DatabaseError(f"stage_parts into {meta.name}: "
                                    f"{_without_statement(str(exc))}") from None
            finally:
                self.con.unregister(_SOURCE)
            return [asdict(p) for p in parts]

    def commit_parts(self, table: str, parts: list[dict[str, Any]]) -> int:
        """Publish parts written by :meth:`stage_parts` in one commit; returns their rows.

        Each part must be named for this writer's next catalog version under the table's
        directory on its policy's disk, is read whole (its SHA-256 must match on a plain
        disk; on an encrypted disk every segment must authenticate) and its footer checked
        (id, rows, size) before the catalog names any of them.
        """
        with self._mutex:
            self._writable(f"commit parts into {table}", staged=True)
            meta: TableMeta = self.table(table)
            disk = policy_disk(self.policy(meta.policy))
            version = self.catalog.version + 1
            prefix = meta.prefix(self.catalog.db_id)
            known = {p.id for t in self.catalog.tables.values() for p in t.parts}
            new: list[PartMeta] = []
            for entry in parts:
                try:
                    part = PartMeta(**entry)
                except TypeError as exc:
                    raise DatabaseError(f"commit_parts: not a part entry: {exc}") from None
                if (part.disk != disk.name or part.id in known
                        or part.path != f"{prefix}/{part_file_name(version, part.id)}"):
                    raise CatalogError(f"commit_parts: part {part.path} on disk {part.disk!r} "
                                       f"is not a new part of {meta.name} for version "
                                       f"{version}", hint="start the insert again")
                known.add(part.id)
                verify_part(disk, part)
                open_part(disk, part)
                new.append(part)
            # (staged by another connection, which may commit them again: kept)
            return self._publish(meta, new, own=False)

"""Protected ingestion: encrypt, tokenize or mask named columns of a table while loading it.

A rule is ``COLUMN=FUNCTION:KEY[,option=value...]``::

    pan=tokenize:cards,keep_first=6,keep_last=4,luhn=true
    email=encrypt_deterministic:emails
    notes=encrypt:notes
    ssn=fpe_encrypt:ids,alphabet=digits,version=2
    user=mask_hash:ids,version=1
    phone=mask_last4

The column name is FF1's tweak (``fpe_encrypt``, ``tokenize``). A CSV's columns are
read as their text (``0042`` stays ``0042``), a Parquet file's protected columns as text
(bytes as they are for ``encrypt``); the other columns pass through.
:func:`protect_file` streams CSV or Parquet input to a Parquet or CSV file, batch
by batch, into a temporary file synced and renamed over the output only when every row
is done (the directory synced after), so the output never holds clear values of
protected columns, a failed or killed run leaves no partial file, and an output it
reported survives a power loss. :func:`protect_insert` streams the same way into a
table of the embedded database: one insert (one commit), so clear values of the
protected columns never reach a file, and a failure inserts no row.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from .._durable import fsync_path, link_new
from ..errors import FieldError
from ._aead import encrypt, encrypt_deterministic
from ._fpe import fpe_encrypt
from ._keys import FieldKey, FieldKeys
from ._mask import mask_email, mask_full, mask_hash, mask_last4, mask_null
from ._tokens import tokenize

__all__ = ["ProtectRule", "ProtectSummary", "parse_rule", "protect_file", "protect_insert",
           "protect_table"]

_KEYED = {"encrypt", "encrypt_deterministic", "fpe_encrypt", "tokenize", "mask_hash"}
_UNKEYED = {"mask_full", "mask_last4", "mask_email", "mask_null"}
_BINARY = {"encrypt", "encrypt_deterministic"}  # the functions ``ciphertexts`` applies to
_OPTIONS = {"fpe_encrypt": {"alphabet", "version"},
            "tokenize": {"alphabet", "keep_first", "keep_last", "luhn", "version"},
            "mask_hash": {"version"}}


@dataclass(frozen=True)
class ProtectRule:
    """What to do to one column: a function, its field key's name, its options."""

    column: str
    function: str
    key: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def apply(self, values: Any, keys: FieldKeys, *, ciphertexts: str = "base64") -> pa.Array:
        """The protected values; ``encrypt`` and ``encrypt_deterministic`` give base64 text
        or, with ``ciphertexts="binary"``, the ciphertexts' bytes."""
        key: FieldKey | None = keys[self.key] if self.key is not None else None
        fn, opts = self.function, dict(self.options)
        if fn == "encrypt":
            return encrypt(values, key, output=ciphertexts)  # type: ignore[arg-type]
        if fn == "encrypt_deterministic":
            return encrypt_deterministic(values, key,  # type: ignore[arg-type]
                                         output=ciphertexts)
        if fn == "fpe_encrypt":
            return fpe_encrypt(values, key, self.column, **opts)  # type: ignore[arg-type]
        if fn == "tokenize":
            return tokenize(values, key, self.column, **opts)  # type: ignore[arg-type]
        if fn == "mask_hash":
            return mask_hash(values, key, **opts)  # type: ignore[arg-type]
        masks = {"mask_full": mask_full, "mask_last4": mask_last4, "mask_email": mask_email,
                 "mask_null": mask_null}
        return masks[fn](values)


def _option(name: str, text: str) -> Any:
    if name in ("keep_first", "keep_last", "version"):
        try:
            return int(text)
        except ValueError:
            raise FieldError(f"{name} takes a number, not {text!r}") from None
    if name == "luhn":
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise FieldError(f"luhn takes true or false, not {text!r}")
        return text.lower() in ("true", "1", "yes")
    return text


def parse_rule(text: str) -> ProtectRule:
    """``COLUMN=FUNCTION:KEY[,option=value...]`` (see the module docstring)."""
    column, sep, rest = text.partition("=")
    if not sep or not column or not rest:
        raise FieldError(f"a rule is COLUMN=FUNCTION:KEY[,option=value...], not {text!r}")
    head, *pairs = rest.split(",")
    function, _, key = head.partition(":")
    if function not in _KEYED | _UNKEYED:
        raise FieldError(f"unknown function {function!r} in {text!r} (functions: "
                         f"{', '.join(sorted(_KEYED | _UNKEYED))})")
    if function in _KEYED and not key:
        raise FieldError(f"{function} needs a field key: {column}={function}:KEY")
    if function in _UNKEYED and key:
        raise FieldError(f"{function} takes no key")
    options: dict[str, Any] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or name not in _OPTIONS.get(function, set()):
            allowed = ", ".join(sorted(_OPTIONS.get(function, set()))) or "none"
            raise FieldError(f"unknown option {pair!r} for {function} (options: {allowed})")
        options[name] = _option(name, value)
    return ProtectRule(column, function, key or None, options)


_ROW = re.compile(r"\brow (\d+)")


def _located(exc: FieldError, column: str, first_row: int) -> FieldError:
    """``exc`` of the same class, its message naming the column and the row counted from
    the input's first row (``first_row`` is the batch's)."""
    text = _ROW.sub(lambda m: f"row {int(m.group(1)) + first_row}", str(exc), count=1)
    located = type(exc).__new__(type(exc))
    located.__dict__.update(getattr(exc, "__dict__", {}))
    located.args = (f"column {column!r}: {text}",)
    return located


CIPHERTEXTS = ("base64", "binary")


def _ciphertexts(ciphertexts: str | Mapping[str, str], column: str) -> str:
    form = ciphertexts if isinstance(ciphertexts, str) else \
        ciphertexts.get(column, "base64")
    if form not in CIPHERTEXTS:
        raise ValueError(f"ciphertexts must be 'base64' or 'binary', not {form!r}")
    return form


def _as_text(values: pa.ChunkedArray, rule: ProtectRule, first_row: int) -> pa.ChunkedArray:
    """A column as the rules take it: text, or bytes as they are for ``encrypt`` and
    ``encrypt_deterministic``. Other types are cast to text; bytes that are not UTF-8 and
    types without a text form (lists, structs) are a FieldError naming no value."""
    typ = values.type
    if pa.types.is_string(typ):
        return values
    if rule.function in _BINARY and (pa.types.is_binary(typ) or pa.types.is_large_binary(typ)):
        return values
    try:
        return values.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
            row = next(i for i, v in enumerate(values.to_pylist())
                       if v is not None and not _utf8(v))
            raise FieldError(f"column {rule.column!r}: row {first_row + row} is not UTF-8 "
                             f"text ({rule.function} takes text; encrypt takes bytes)"
                             ) from None
        raise FieldError(f"column {rule.column!r} is {typ}: protect takes columns of text, "
                         "numbers, dates or bytes") from None


def _utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def protect_table(table: pa.Table | pa.RecordBatch, rules: Sequence[ProtectRule],
                  keys: FieldKeys, *, first_row: int = 0,
                  ciphertexts: str | Mapping[str, str] = "base64") -> pa.Table:
    """The table with each rule's column replaced by its protected values.

    ``ciphertexts`` is the form of ``encrypt`` and ``encrypt_deterministic`` output:
    ``"base64"`` text or ``"binary"`` bytes, or a mapping of column names to either
    (base64 for a column it lacks). An error names the column and the row, counted from
    ``first_row`` (the first row of ``table`` in a longer input)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    names = table.column_names
    seen: dict[str, str] = {}
    for rule in rules:
        if rule.column.lower() in seen:
            raise FieldError(f"two rules for column {rule.column!r} (and "
                             f"{seen[rule.column.lower()]!r}; column names match in any "
                             "case): give one")
        seen[rule.column.lower()] = rule.column
        index = _column_index(names, rule.column)
        values = _as_text(table.column(index), rule, first_row)
        try:
            protected = rule.apply(values, keys,
                                   ciphertexts=_ciphertexts(ciphertexts, rule.column))
        except FieldError as exc:
            raise _located(exc, rule.column, first_row) from None
        table = table.set_column(index, names[index], protected)
    return table


def _column_index(names: Sequence[str], column: str) -> int:
    """The position of ``column`` among ``names``, matched in any case as the database
    matches column names; none, or two names differing only in case, is a FieldError."""
    found = [i for i, name in enumerate(names) if name.lower() == column.lower()]
    if not found:
        raise FieldError(f"no column {column!r} to protect (columns: {', '.join(names)})")
    if len(found) > 1:
        raise FieldError(f"column {column!r} is ambiguous: the input has "
                         f"{' and '.join(repr(names[i]) for i in found)}, which differ only "
                         "in case (column names match in any case)",
                         hint="rename one of them in the input")
    return found[0]


@dataclass
class ProtectSummary:
    rows: int
    columns: list[str]


def _reader(src: str, kind: str) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The input's schema and batches. A CSV's columns are its text, every one (inferred
    types would turn ``01234`` into 1234 and ``2.00`` into 2), and an empty field is NULL
    (as DuckDB and ``db.insert`` read a CSV; ``NA`` or ``null`` stay text). Messages never
    quote the input's values."""
    try:
        if kind == "csv":
            header = pacsv.open_csv(src).schema.names
            reader = pacsv.open_csv(src, convert_options=pacsv.ConvertOptions(
                column_types={c: pa.string() for c in header}, strings_can_be_null=True,
                null_values=[""]))
            return reader.schema, iter(reader)
        parquet = pq.ParquetFile(src)
        return parquet.schema_arrow, parquet.iter_batches()
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise FieldError(f"{src}: no such file") from None
        if exc.errno is not None:
            raise FieldError(f"cannot read {src}: {exc.strerror}") from None
        raise FieldError(f"{src} is not a readable {kind.upper()} file") from None
    except pa.ArrowException:
        raise FieldError(f"{src} is not a readable {kind.upper()} file") from None


def _next(batches: Iterator[pa.RecordBatch], src: str, kind: str) -> pa.RecordBatch | None:
    try:
        return next(batches, None)
    except (pa.ArrowException, OSError):
        raise FieldError(f"{src}: a {kind.upper()} batch cannot be read (malformed input; "
                         "the message leaves out the values)") from None


def _kind(path: str, given: str | None) -> str:
    if given:
        return given
    return "csv" if path.lower().endswith((".csv", ".csv.gz")) else "parquet"


def protect_file(src: str | os.PathLike[str], dst: str | os.PathLike[str],
                 rules: Sequence[ProtectRule], keys: FieldKeys, *,
                 input_format: str | None = None, output_format: str | None = None,
                 ciphertexts: str = "base64", replace: bool = False) -> ProtectSummary:
    """Stream ``src`` (CSV or Parquet) to ``dst`` with the rules' columns protected.

    An existing ``dst`` (a file, or a symbolic link, even to nothing) is refused unless
    ``replace=True``; it is then replaced only once the output is whole.

    ``ciphertexts="binary"`` writes ``encrypt`` and ``encrypt_deterministic`` output as
    bytes (Parquet ``BYTE_ARRAY``, read as ``BLOB``) instead of base64 text: a Parquet
    output only."""
    src, dst = os.fspath(src), os.fspath(dst)
    _ciphertexts(ciphertexts, "")
    for rule in rules:
        if rule.key is not None:
            keys[rule.key]  # an unknown key name fails before anything is written
    in_kind, out_kind = _kind(src, input_format), _kind(dst, output_format)
    if ciphertexts == "binary" and out_kind == "csv" and any(
            r.function in _BINARY for r in rules):
        raise FieldError(f"{dst}: a CSV file holds text: binary ciphertexts need a Parquet "
                         "output (or --into a BLOB column)")
    folder = os.path.dirname(os.path.abspath(dst))
    if os.path.isdir(dst):
        raise FieldError(f"cannot write {dst}: it is a directory")
    if os.path.exists(dst) and not os.path.isfile(dst):  # the rename would replace a device
        raise FieldError(f"cannot write {dst}: not a regular file (a device or a FIFO); the "
                         "output is written whole, then renamed into place")
    if not replace and os.path.lexists(dst):  # (an encrypted database, the input itself...)
        raise FieldError(f"{dst} already exists; refusing to replace it",
                         hint="choose another output, or pass --force (replace=True) to "
                         "replace it")
    if not os.path.isdir(folder):
        raise FieldError(f"cannot write {dst}: no directory {folder}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".protect-", dir=folder)
    except OSError as exc:
        raise FieldError(f"cannot write {dst}: {exc.strerror}") from None
    os.close(fd)
    rows, writer = 0, None
    try:
        try:
            schema, batches = _reader(src, in_kind)
            while True:
                batch = _next(batches, src, in_kind)
                if batch is None and writer is not None:
                    break
                table = protect_table(batch if batch is not None else schema.empty_table(),
                                      rules, keys, first_row=rows, ciphertexts=ciphertexts)
                if writer is None:
                    writer = (pq.ParquetWriter(tmp, table.schema) if out_kind == "parquet"
                              else pacsv.CSVWriter(tmp, table.schema))
                writer.write_table(table)
                rows += table.num_rows
                if batch is None:  # no rows: the protected schema, empty
                    break
        finally:
            if writer is not None:
                writer.close()
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, dst)
        else:
            try:
                link_new(tmp, dst)  # (never over a file that took the name meanwhile)
            except FileExistsError:
                raise FieldError(f"{dst} already exists (made while protect ran); refusing "
                                 "to replace it", hint="choose another output, or pass "
                                 "--force (replace=True) to replace it") from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    try:
        fsync_path(folder)  # the new name lasts through a power loss, as the file does
    except OSError as exc:
        raise FieldError(f"{dst} was written but its directory could not be synced: "
                         f"{exc.strerror}") from None
    return ProtectSummary(rows, [r.column for r in rules])


def _column_forms(db: Any, table: str, rules: Sequence[ProtectRule],
                  ciphertexts: str | None) -> dict[str, str]:
    """The ciphertexts' form for each ``encrypt`` column of ``table``: ``binary`` for a
    ``BLOB`` column, ``base64`` for a text one; a ``ciphertexts`` that disagrees with the
    column's type is refused (DuckDB would store bytes as escaped text, or base64 text as
    its ASCII bytes, which ``decrypt`` then refuses)."""
    if ciphertexts is not None:
        _ciphertexts(ciphertexts, "")
    meta = db.table(table)
    declared = {name.lower(): typ for name, typ in meta.columns}
    types = {f.name.lower(): f.type for f in db.arrow_schema(meta)}
    forms: dict[str, str] = {}
    for rule in rules:
        typ = types.get(rule.column.lower())
        if rule.function not in _BINARY or typ is None:
            continue  # not a ciphertext, or a column the table lacks (the insert says so)
        blob = pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or \
            pa.types.is_fixed_size_binary(typ)
        fits = "binary" if blob else "base64"
        if ciphertexts is not None and ciphertexts != fits:
            raise FieldError(
                f"column {rule.column!r} of table {meta.name!r} is "
                f"{declared[rule.column.lower()]}: {ciphertexts} ciphertexts go into a "
                f"{'BLOB' if ciphertexts == 'binary' else 'VARCHAR'} column",
                hint="leave the ciphertexts' form out: it follows the column's type")
        forms[rule.column] = fits
    return forms


def protect_insert(db: Any, table: str, data: Any, rules: Sequence[ProtectRule],
                   keys: FieldKeys | None = None, *, input_format: str | None = None,
                   ciphertexts: str | None = None) -> int:
    """Insert ``data`` into ``table`` of ``db`` (:func:`cryptdisk.connect`) with the rules'
    columns protected on the way; returns the row count.

    ``data`` is a CSV or Parquet path (streamed batch by batch), or an Arrow table, record
    batch or record batch reader. ``keys`` default to the ``[fields.keys]`` of the
    database's config. The batches are protected in memory and inserted as one stream: one
    commit, all rows or none. ``encrypt`` and ``encrypt_deterministic`` write the
    ciphertexts' bytes into a ``BLOB`` column and base64 text into a text column;
    ``ciphertexts`` (``"base64"`` or ``"binary"``), if given, must agree with the column.
    """
    if keys is None:
        path = getattr(getattr(db, "config", None), "path", None)
        keys = FieldKeys.from_config(path) if isinstance(path, str) and \
            not path.endswith(".xml") and os.path.isfile(path) else FieldKeys()
    for rule in rules:
        if rule.key is not None:
            keys[rule.key]  # an unknown key name fails before anything is read
    forms = _column_forms(db, table, rules, ciphertexts)
    if isinstance(data, (str, os.PathLike)):
        src = os.fspath(data)
        kind = _kind(src, input_format)
        schema, source = _reader(src, kind)

        def batches() -> Iterator[pa.RecordBatch]:
            while (batch := _next(source, src, kind)) is not None:
                yield batch
    else:
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        if isinstance(data, pa.Table):
            data = pa.RecordBatchReader.from_batches(data.schema, data.to_batches())
        if not isinstance(data, pa.RecordBatchReader):
            raise TypeError("protect_insert takes a CSV or Parquet path or Arrow data, not "
                            f"{type(data).__name__}")
        schema, reader = data.schema, data

        def batches() -> Iterator[pa.RecordBatch]:
            yield from reader
    out_schema = protect_table(schema.empty_table(), rules, keys, ciphertexts=forms).schema
    assert keys is not None

    failed: list[BaseException] = []

    def protected() -> Iterator[pa.RecordBatch]:
        try:
            first_row = 0
            for batch in batches():
                done = protect_table(batch, rules, keys, first_row=first_row,
                                     ciphertexts=forms)
                first_row += batch.num_rows
                yield from done.cast(out_schema).to_batches()
        except BaseException as exc:  # the database wraps it: raise ours instead, below
            failed.append(exc)
            raise

    try:
        return int(db.insert(table, pa.RecordBatchReader.from_batches(out_schema, protected())))
    except Exception:
        if failed:
            raise failed[0] from None
        raise

"""``DELETE`` and ``UPDATE``: the parts that hold matching rows rewritten, as ClickHouse's
mutations do.

For each part of the table, in the catalog's order:

1. Its key range (catalog) and its row groups' statistics (authenticated footer) rule
   out what the ``WHERE``'s conditions on single columns cannot match; a part with no
   row group left is kept as it is, unread.
2. DuckDB runs ``SELECT __cd_row[, CAST(expr AS type), ...] FROM __cd_part AS t WHERE
   cond`` over the part's remaining row groups (only the columns the statement names,
   each row numbered within the part), so the ``WHERE`` is DuckDB's own, subqueries
   over other tables (or this one, as it was before the statement) included. On a
   connection with a role (or a server session of one), ``__cd_part`` is read through
   the table's masking and row access policies as a query of that role reads the table
   (:func:`._policies.mutation_view`). A part with no matching row is kept.
3. The part is read again a row group at a time, all columns, and written as new parts
   (new data keys and nonces, statistics, sparse index and lookup blocks as for any
   part) without the matching rows (``DELETE``) or with the new values in them
   (``UPDATE``): memory holds one row group and the part's matching row numbers (and new
   values).

The new parts replace the old ones in one catalog commit; the old files are deleted
after it (:meth:`MaintenanceMixin._remove_parts`, which also drops their decoded
columns from the cache). The new files are named for the next catalog version, so a
process killed before the commit leaves orphans the next writer deletes, and one killed
after it leaves old files the next writer deletes (see :mod:`._maintenance`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ..errors import DatabaseError, FieldPolicyError, NotSupportedError
from . import _sql
from ._catalog import PartMeta
from ._columns import ALL, needed_columns, stored_type
from ._constraints import constraint_error, not_null_sql
from ._names import fold
from ._policies import PART_SOURCE, ROW_NUMBER, current_mutation_policy, embedded_mutation
from ._pushdown import table_filters
from ._scan import TableScan
from ._storage import policy_disk

if TYPE_CHECKING:
    from ._catalog import TableMeta
    from ._partread import OpenPart
    from ._state import DatabaseState
else:
    DatabaseState = object  # the type checker's view only: see _state

__all__ = ["MutationMixin"]

_SET = "__cd_set_"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _PartRows:
    """The rows of row groups ``groups`` of part ``op`` as DuckDB reads them: ``scan``'s
    columns and :data:`ROW_NUMBER`, each row's number in the part (a fresh stream for
    each scan). An error while reading is kept in :attr:`error` (DuckDB reports it only
    as text)."""

    def __init__(self, scan: TableScan, op: OpenPart, groups: list[int]) -> None:
        self.scan, self.op, self.groups = scan, op, groups
        self.columns = list(scan.columns)
        fields = [scan.schema.field(c) for c in self.columns]
        self.schema = pa.schema([*fields, pa.field(ROW_NUMBER, pa.int64(), nullable=False)])
        self.starts = np.cumsum([0] + [op.rows(rg) for rg in range(op.num_row_groups)])
        self.error: BaseException | None = None

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        reader = pa.RecordBatchReader.from_batches(self.schema, self._batches())
        return reader.__arrow_c_stream__(requested_schema)

    def _batches(self) -> Iterator[pa.RecordBatch]:
        try:
            for rg in self.groups:
                start = int(self.starts[rg])
                n = self.op.rows(rg)
                numbers = pa.array(np.arange(start, start + n, dtype=np.int64))
                if self.columns:
                    batch = self.scan._read_group(self.op, rg, {})
                    arrays = [*batch.columns, numbers]
                else:
                    arrays = [numbers]
                yield pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        except Exception as exc:  # (not GeneratorExit: DuckDB stopped reading)
            self.error = exc
            raise


def _reads_something(node: Any) -> bool:
    """Whether a parse tree names a column or holds a subquery (is no constant)."""
    if isinstance(node, dict):
        if node.get("class") in ("COLUMN_REF", "SUBQUERY") or node.get("type") in (
                "COLUMN_REF", "SUBQUERY", "PARAMETER"):
            return True
        return any(_reads_something(v) for v in node.values())
    if isinstance(node, list):
        return any(_reads_something(v) for v in node)
    return False


class MutationMixin(DatabaseState):
    """``DELETE`` and ``UPDATE`` of :class:`~cryptdisk.db.Database`."""

    def _delete_stmt(self, st: _sql.Delete) -> pa.Table:
        return _count(self._mutate(st.table, st.where, st.alias, []))

    def _update_stmt(self, st: _sql.Update) -> pa.Table:
        return _count(self._mutate(st.table, st.where, st.alias, st.assignments))

    def _no_row_number(self, what: str, where: str | None, sets: list[tuple[str, str]],
                       names: list[str]) -> None:
        """Refuse a ``WHERE`` or ``SET`` expression naming :data:`ROW_NUMBER`, the row
        numbers the statement reads its table with, not a column of the table: through a
        role's policies it would tell where the rows the role may not see are."""
        if ROW_NUMBER in (n.lower() for n in names):
            return
        exprs = ", ".join(e for _c, e in sets) or "1"
        tree = self._parse_tree(f"SELECT {exprs} FROM t" + (f" WHERE {where}" if where else ""))

        def named(node: Any) -> bool:
            if isinstance(node, dict):
                cols = node.get("column_names") if node.get("class") == "COLUMN_REF" else None
                if isinstance(cols, list) and cols and str(cols[-1]).lower() == ROW_NUMBER:
                    return True
                return any(named(v) for v in node.values())
            if isinstance(node, list):
                return any(named(v) for v in node)
            return False

        if tree is not None and named(tree):
            raise DatabaseError(f'{what}: column "{ROW_NUMBER}" does not exist',
                                hint=f"the table's columns: {', '.join(names)}")

    def _mutate(self, table: str, where: str | None, alias: str | None,
                assignments: list[tuple[str, str]]) -> int:
        """Delete the rows of ``table`` that ``where`` matches (no ``assignments``), or set
        their columns (``assignments``); returns the rows changed."""
        from ._insert import PART_ROWS
        from ._parts import write_parts

        meta: TableMeta = self.table(table)
        what = f"{'UPDATE' if assignments else 'DELETE FROM'} {meta.name}"
        policy = current_mutation_policy()
        if policy is None and self.role is not None:
            policy = embedded_mutation(self)
        masked = policy.masked(meta.name) if policy is not None else set()
        protected = policy is not None and policy.protects(meta.name)
        sets = self._assignments(meta, what, assignments, masked)
        if where is None and not sets and not protected:  # every row: as TRUNCATE
            rows = meta.rows
            if meta.parts:
                self._replace_parts(meta, [])
            return rows
        schema = self.arrow_schema(meta)
        names = [c for c, _t in meta.columns]
        self._no_row_number(what, where, sets, names)
        types = dict(meta.columns)
        self._fold_constants(what, sets, types)
        select = [_quote(ROW_NUMBER)] + [
            not_null_sql(meta, col, f"CAST(({expr}) AS {stored_type(types[col])})")
            + f" AS {_quote(f'{_SET}{i}')}"
            for i, (col, expr) in enumerate(sets)]
        text = (f"SELECT {', '.join(select)} FROM {_quote(PART_SOURCE)} AS "
                f"{_quote(alias or meta.name)}" + (f" WHERE {where}" if where else ""))
        if policy is not None:
            text = policy.rewrite(text, meta.name)
        tree = self._parse_tree(text)
        if tree is None:
            raise DatabaseError(f"{what}: cannot read the statement",
                                hint="DELETE FROM t WHERE cond; UPDATE t SET c = expr WHERE "
                                "cond")
        source_schema = pa.schema([*schema, pa.field(ROW_NUMBER, pa.int64())])
        filters = [f for f in table_filters(tree, PART_SOURCE, source_schema)
                   if f.column != ROW_NUMBER]
        wanted = needed_columns(tree, {PART_SOURCE: [*names, ROW_NUMBER]})[PART_SOURCE]
        columns = names if wanted is ALL else [c for c in names if c in wanted]
        match_scan = TableScan(self._open_parts, meta, schema, columns, filters, None)
        read_scan = TableScan(self._open_parts, meta, schema, names, [], None)
        disk = policy_disk(self.policy(meta.policy))
        version = self.catalog.version + 1
        changed = 0
        parts: list[PartMeta] = []
        written: list[PartMeta] = []
        try:
            for part in list(meta.parts):
                found = self._matching(part, match_scan, text, what)
                if found is None:
                    parts.append(part)
                    continue
                numbers, values = found
                changed += len(numbers)
                if not sets and len(numbers) == part.rows:
                    continue  # every row deleted: no part left
                op = self._open_parts.get(part)
                new = write_parts(disk, meta.prefix(self.catalog.db_id),
                                  _rewritten(read_scan, op, numbers, values, sets, schema),
                                  schema, version=version, max_rows=PART_ROWS,
                                  key=meta.key, null_free=True)
                written.extend(new)
                parts.extend(new)
            if changed:
                self._replace_parts(meta, parts)
        except BaseException:
            # the files written for a commit that does not happen (best effort: the next
            # writer's open deletes what is left); published, or maybe published (its
            # outcome unknown), the catalog names them
            if not self._published_since(version - 1):
                self._discard_unpublished(written)
            raise
        return changed

    def _fold_constants(self, what: str, sets: list[tuple[str, str]],
                        types: dict[str, str]) -> None:
        """Compute each ``SET`` value that reads no column once, before any row is read,
        as PostgreSQL folds a constant: one its column's type cannot hold (``SET n =
        'abc'`` of an INTEGER column) fails the UPDATE whether or not a row matches."""
        for col, expr in sets:
            tree = self._parse_tree(f"SELECT {expr}")
            if tree is None or _reads_something(tree):
                continue
            try:
                self._run_duckdb_once(f"SELECT CAST(({expr}) AS {stored_type(types[col])})",
                                      False)
            except DatabaseError as exc:
                message = str(exc).split("\n", 1)[0]
                raise type(exc)(f"{what}: {message}", hint=getattr(exc, "hint", None)) \
                    from None

    def _assignments(self, meta: TableMeta, what: str, assignments: list[tuple[str, str]],
                     masked: set[str]) -> list[tuple[str, str]]:
        """``assignments`` with each column named as the table has it (``DEFAULT``: its
        DEFAULT's expression, NULL where it has none); a column the table lacks, set
        twice, in the ORDER BY key, or under a masking policy (for a role) is refused."""
        out: list[tuple[str, str]] = []
        key = {fold(c) for c in meta.order}
        for col, expr in assignments:
            name = meta.column_name(col)
            if name not in dict(meta.columns):
                raise DatabaseError(f"{what}: table {meta.name} has no column {col}")
            if any(name == c for c, _e in out):
                raise DatabaseError(f"{what}: column {name} is set twice")
            if fold(name) in key:
                raise NotSupportedError(
                    f"{what}: column {name} is in the table's ORDER BY key, which an UPDATE "
                    "does not change (each part stays sorted by it)",
                    hint=f"DELETE the rows, then INSERT INTO {meta.name} SELECT them with the "
                    "new key")
            if name.lower() in masked:
                raise FieldPolicyError(
                    f"permission denied: {what}: column {name} has a masking policy, and a "
                    "role may not set it (it reads masked values, and would store a clear "
                    "value where the column holds protected ones)")
            if expr.strip().upper() == "DEFAULT":  # (SET c = DEFAULT: its DEFAULT, or NULL)
                expr = meta.defaults.get(name) or "NULL"
            out.append((name, expr))
        return out

    def _matching(self, part: PartMeta, scan: TableScan, text: str, what: str
                  ) -> tuple[np.ndarray, pa.Table | None] | None:
        """The numbers (ascending) of ``part``'s rows that the statement ``text`` matches,
        and their new values (an UPDATE's); None when no row matches."""
        if not part.rows or not scan._part_may_match(part):
            return None
        op = self._open_parts.get(part)
        groups = scan._row_groups(op)
        if not groups:
            return None
        source = _PartRows(scan, op, groups)
        self.con.register(PART_SOURCE, source)
        try:
            result = self._run_duckdb_once(text, False)
        except DatabaseError as exc:
            if source.error is not None:
                raise source.error from None
            message = "\n".join(  # (without the lines quoting the statement cryptdisk ran)
                line for line in str(exc).replace(PART_SOURCE, what.split()[-1]).split("\n")
                if not line.startswith("LINE ") and (not line.strip() or line.strip("^ ")))
            message = message.rstrip()
            raise constraint_error(what, message) or type(exc)(
                f"{what}: {message}", hint=getattr(exc, "hint", None)) from None
        finally:
            with contextlib.suppress(Exception):
                self.con.unregister(PART_SOURCE)
        if source.error is not None:
            raise source.error
        if result is None or not result.num_rows:
            return None
        rows = result.column(0).to_numpy()
        order = np.argsort(rows, kind="stable")
        rows = rows[order]
        if len(rows) > 1 and not np.all(rows[1:] > rows[:-1]):
            raise DatabaseError(f"{what}: a row was matched twice")  # pragma: no cover
        values = result.drop_columns([result.column_names[0]]).take(pa.array(order)) \
            if result.num_columns > 1 else None
        return rows, values

    # (declared for the type checker: MaintenanceMixin and Database provide them)
    if TYPE_CHECKING:
        def _replace_parts(self, meta: TableMeta, new: list[PartMeta], **changes: Any
                           ) -> None: ...

        def _remove_files(self, files: list[tuple[Any, str]]) -> int: ...

        def _parse_tree(self, sql: str) -> dict[str, Any] | None: ...

        def _run_duckdb_once(self, sql: str, push: bool,
                             prepared_query: tuple[str, str] | None = None
                             ) -> pa.Table | None: ...

        _parser: Any


def _count(rows: int) -> pa.Table:
    """What ``db.execute`` returns for a DELETE or UPDATE: the rows it changed, in a
    column ``count`` (as DuckDB's own DML and the server's command tag read it)."""
    return pa.table({"count": pa.array([rows], pa.int64())})


def _rewritten(scan: TableScan, op: OpenPart, rows: np.ndarray, values: pa.Table | None,
               sets: list[tuple[str, str]], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Part ``op``'s rows, a row group at a time, without ``rows`` (no ``values``: a
    DELETE) or with ``values`` in ``sets``' columns of ``rows`` (an UPDATE)."""
    start = 0
    positions = [schema.get_field_index(c) for c, _e in sets]
    for rg in range(op.num_row_groups):
        batch = scan._read_group(op, rg, {})
        n = batch.num_rows
        lo, hi = np.searchsorted(rows, [start, start + n])
        if lo == hi:
            yield batch
        elif values is None:
            keep = np.ones(n, dtype=bool)
            keep[rows[lo:hi] - start] = False
            yield batch.filter(pa.array(keep))
        else:
            take = np.arange(n, dtype=np.int64)
            take[rows[lo:hi] - start] = n + np.arange(hi - lo, dtype=np.int64)
            index = pa.array(take)
            arrays = list(batch.columns)
            for i, at in enumerate(positions):
                new = values.column(i).slice(lo, hi - lo)
                field = schema.field(at)
                new = new.cast(field.type) if new.type != field.type else new
                arrays[at] = pa.concat_arrays([arrays[at], *new.chunks]).take(index)
            yield pa.RecordBatch.from_arrays(arrays, schema=batch.schema)
        start += n

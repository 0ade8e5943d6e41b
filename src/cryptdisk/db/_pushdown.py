"""Which row groups a query can skip: simple filters read from DuckDB's parse tree.

Only what is certainly implied is used. For a table read exactly once in the
query, by a SELECT whose FROM is that table alone, the top-level ``AND``-ed
parts of its WHERE of the forms ``col OP constant`` (``=``, ``<``, ``<=``,
``>``, ``>=``, either side), ``col BETWEEN c1 AND c2`` and ``col IN (c, ...)``
become :class:`Filter` s; everything else is ignored (read, not skipped). A
row group (or a part) is skipped only when its min/max statistics prove that
no row can pass; DuckDB still applies the whole WHERE to every row it gets, so
a skipped filter can make a query read more, never answer differently. When
the FROM is a tree of inner joins of cryptdisk tables, the WHERE's and ONs'
conjuncts apply too, carried between tables by column equalities
(:func:`_through_joins`).

Types follow DuckDB's comparison rules: integer columns take integer literals
within BIGINT's range (compared exactly); floating columns take numeric
literals, compared with a little slack (DuckDB's decimal-to-double cast may
round differently from Python's; a REAL column's slack is a REAL's precision, as DuckDB
rounds the constant to REAL), and a lower bound alone never skips a row
group because DuckDB orders NaN above every number and Parquet statistics leave
NaN out; VARCHAR columns take string literals (byte order, as both use).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from ._columns import _walk
from ._names import fold

__all__ = ["Filter", "all_pass", "count_star_only", "filters_from_tuples", "head_rows",
           "key_extremes_items",
           "key_extremes_names", "key_extremes_only",
           "may_match", "table_filters", "widened"]

_FLIP = {"COMPARE_EQUAL": "=", "COMPARE_LESSTHAN": ">", "COMPARE_LESSTHANOREQUALTO": ">=",
         "COMPARE_GREATERTHAN": "<", "COMPARE_GREATERTHANOREQUALTO": "<="}
_OPS = {"COMPARE_EQUAL": "=", "COMPARE_LESSTHAN": "<", "COMPARE_LESSTHANOREQUALTO": "<=",
        "COMPARE_GREATERTHAN": ">", "COMPARE_GREATERTHANOREQUALTO": ">="}
_INT64 = 1 << 63


@dataclass(frozen=True)
class Filter:
    """Rows pass only if ``lo <= column <= hi`` (None: unbounded), or ``column in values``."""

    column: str
    lo: Any = None
    hi: Any = None
    values: tuple[Any, ...] | None = None


def _conjuncts(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if node.get("type") == "CONJUNCTION_AND":
        for child in node.get("children") or []:
            yield from _conjuncts(child)
    else:
        yield node


class _Columns:
    """A table's columns as a WHERE clause may name them, with the Arrow type of each."""

    def __init__(self, table: str, alias: str, schema: pa.Schema) -> None:
        self.quals = {fold(table), fold(alias or table)}
        self.types = {fold(f.name): (f.name, f.type) for f in schema}

    def ref(self, node: dict[str, Any]) -> tuple[str, pa.DataType] | None:
        if node.get("class") != "COLUMN_REF":
            return None
        names = [str(n) for n in node.get("column_names") or []]
        if (len(names) == 2 and fold(names[0]) not in self.quals) or not 1 <= len(names) <= 2:
            return None
        return self.types.get(fold(names[-1]))


def _literal(node: dict[str, Any], typ: pa.DataType) -> Any:
    """The constant as the column's comparison sees it, or None if not used for skipping."""
    if node.get("class") != "CONSTANT":
        return None
    lit = node.get("literal") or {}
    kind, text = lit.get("kind"), lit.get("text")
    if not isinstance(text, str):
        return None
    try:
        if pa.types.is_integer(typ):
            v = int(text) if kind == "INTEGER" else None
            return v if v is not None and -_INT64 <= v < _INT64 else None
        if pa.types.is_floating(typ) and kind in ("INTEGER", "NUMERIC"):
            f = float(text)
            return f if math.isfinite(f) else None
        if (pa.types.is_string(typ) or pa.types.is_large_string(typ)) and kind == "STRING":
            return text
    except ValueError:
        return None
    return None


def _from_comparison(node: dict[str, Any], cols: _Columns) -> Filter | None:
    typ = node.get("type")
    if typ in _OPS:
        left, right = node.get("left") or {}, node.get("right") or {}
        op, ref = _OPS[typ], cols.ref(left)
        other = right
        if ref is None:
            op, ref, other = _FLIP[typ], cols.ref(right), left
        if ref is None:
            return None
        v = _literal(other, ref[1])
        if v is None:
            return None
        name = ref[0]
        return {"=": Filter(name, v, v), "<": Filter(name, None, v),
                "<=": Filter(name, None, v), ">": Filter(name, v, None),
                ">=": Filter(name, v, None)}[op]
    if typ == "COMPARE_BETWEEN":
        ref = cols.ref(node.get("input") or {})
        if ref is None:
            return None
        lo, hi = (_literal(node.get(k) or {}, ref[1]) for k in ("lower", "upper"))
        if lo is None or hi is None:
            return None
        return Filter(ref[0], lo, hi)
    if typ == "COMPARE_IN":
        children = node.get("children") or []
        ref = cols.ref(children[0]) if children else None
        if ref is None or len(children) < 2:
            return None
        values = [_literal(c, ref[1]) for c in children[1:]]
        if any(v is None for v in values):
            return None
        return Filter(ref[0], min(values), max(values), tuple(values))
    return None


def _inner_join_leaves(node: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The base tables of a tree of INNER (or comma) joins, or None if it holds anything else."""
    if node.get("type") == "BASE_TABLE":
        if node.get("schema_name") or node.get("catalog_name"):
            return None
        return [node]
    if (node.get("type") != "JOIN" or node.get("join_type") != "INNER"
            or node.get("ref_type") not in ("REGULAR", "CROSS")):
        return None
    left, right = node.get("left"), node.get("right")
    if not isinstance(left, dict) or not isinstance(right, dict):
        return None
    a, b = _inner_join_leaves(left), _inner_join_leaves(right)
    return None if a is None or b is None else a + b


def _join_conditions(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if node.get("type") == "JOIN":
        cond = node.get("condition")
        if isinstance(cond, dict):
            yield from _conjuncts(cond)
        for side in ("left", "right"):
            yield from _join_conditions(node.get(side) or {})


def _through_joins(select: dict[str, Any], scan: dict[str, Any], table: str,
                   schemas: dict[str, pa.Schema]) -> list[Filter]:
    """Filters on ``table`` implied through a tree of inner joins of cryptdisk tables.

    Its own ``col OP constant`` conjuncts (WHERE and ON), and those on another table's
    column ``u.c`` where a conjunct says ``t.k = u.c`` (same type): every row an inner
    join keeps has ``t.k = u.c``, so ``u.c``'s bounds bind ``t.k`` too. A column named
    without its table counts only if one table of the join has it.
    """
    leaves = _inner_join_leaves(select["from_table"])
    lower = {fold(n): sc for n, sc in schemas.items()}
    if leaves is None or any(fold(str(n.get("table_name", ""))) not in lower
                             for n in leaves):
        return []
    cols = [_Columns(str(n["table_name"]), str(n.get("alias") or ""),
                     lower[fold(str(n["table_name"]))]) for n in leaves]
    mine = next(i for i, n in enumerate(leaves) if n is scan)

    def resolve(node: dict[str, Any]) -> tuple[int, str, pa.DataType] | None:
        found = [(i, *got) for i, c in enumerate(cols) if (got := c.ref(node)) is not None]
        return found[0] if len(found) == 1 else None

    where = select.get("where_clause")
    conjuncts = [*(_conjuncts(where) if isinstance(where, dict) else ()),
                 *_join_conditions(select["from_table"])]
    bounds: dict[tuple[int, str], list[Filter]] = {}
    same: dict[tuple[int, str], tuple[int, str]] = {}  # columns equal in every row kept

    def root(x: tuple[int, str]) -> tuple[int, str]:
        while same.get(x, x) != x:
            x = same[x]
        return x

    for c in conjuncts:
        if c.get("type") == "COMPARE_EQUAL":
            a, b = resolve(c.get("left") or {}), resolve(c.get("right") or {})
            if a is not None and b is not None and a[2] == b[2]:
                same[root((a[0], a[1]))] = root((b[0], b[1]))
                continue
        ref = resolve(_ref_of(c))
        f = _from_comparison(c, cols[ref[0]]) if ref is not None else None
        if ref is not None and f is not None:
            bounds.setdefault((ref[0], f.column), []).append(f)
    out = []
    for name in cols[mine].types.values():
        here = root((mine, name[0]))
        for (i, col), fs in bounds.items():
            if root((i, col)) == here:
                out += [Filter(name[0], f.lo, f.hi, f.values) for f in fs]
    return out


def _ref_of(node: dict[str, Any]) -> dict[str, Any]:
    """The column reference a comparison :func:`_from_comparison` understood is about."""
    if node.get("type") == "COMPARE_BETWEEN":
        return node.get("input") or {}
    if node.get("type") == "COMPARE_IN":
        children = node.get("children") or [{}]
        return children[0] if isinstance(children[0], dict) else {}
    left = node.get("left") or {}
    return left if left.get("class") == "COLUMN_REF" else node.get("right") or {}


def table_filters(tree: dict[str, Any] | None, table: str, schema: pa.Schema,
                  schemas: dict[str, pa.Schema] | None = None) -> list[Filter]:
    """The filters every row the query reads from ``table`` must pass (may be empty).

    ``schemas`` (every cryptdisk table's Arrow schema, by name) lets filters reach
    ``table`` through inner joins (see :func:`_through_joins`).
    """
    if tree is None:
        return []
    scans = [n for n in _walk(tree.get("statements", []))
             if n.get("type") == "BASE_TABLE" and not n.get("schema_name")
             and not n.get("catalog_name")
             and fold(str(n.get("table_name", ""))) == fold(table)]
    if len(scans) != 1:
        return []  # read twice (or not found): the scans share the filters of neither
    scan = scans[0]
    nodes = _walk(tree.get("statements", []))
    for node in nodes:
        if node.get("type") == "SELECT_NODE" and node.get("from_table") is scan:
            where = node.get("where_clause")
            cols = _Columns(table, str(scan.get("alias") or ""), schema)
            found = [f for f in (_from_comparison(c, cols) for c in _conjuncts(where))
                     if f is not None] if isinstance(where, dict) else []
            return found + _outer_filters(nodes, node, table, str(scan.get("alias") or ""),
                                          schema)
        if (schemas is not None and node.get("type") == "SELECT_NODE"
                and isinstance(node.get("from_table"), dict)
                and node["from_table"].get("type") == "JOIN"
                and any(n is scan for n in _inner_join_leaves(node["from_table"]) or ())):
            return _through_joins(node, scan, table, schemas)
    return []


def _passed_columns(node: dict[str, Any], source: dict[str, str], quals: set[str],
                    order: list[str]) -> list[tuple[str, str | None]] | None:
    """The columns (output name, the table's column it is or None) of SELECT ``node`` each
    of whose rows is one row of its FROM, unchanged but for the columns it picks and
    renames (no GROUP BY, aggregate handling, HAVING, QUALIFY, window, DISTINCT, LIMIT or
    sample): so a condition on an output column that is a table column holds of the
    table's row. ``source``: the FROM's columns (lower-case name -> table column);
    ``quals``: the names a column may be qualified with; ``order``: the FROM's columns in
    order (for ``*``). None for any other SELECT."""
    if node.get("group_expressions") or node.get("group_sets") or node.get("having") \
            or node.get("qualify") or node.get("sample") \
            or node.get("aggregate_handling") not in (None, "STANDARD_HANDLING") \
            or any(m.get("type") != "ORDER_MODIFIER" for m in node.get("modifiers") or []):
        return None
    out: list[tuple[str, str | None]] = []
    for item in node.get("select_list") or []:
        if any(n.get("class") == "WINDOW" for n in _walk(item)):
            return None
        if item.get("class") == "STAR":
            if item.get("relation_name") or item.get("exclude_list") or \
                    item.get("replace_list") or item.get("expr") or item.get("columns"):
                return None
            out.extend((name, source.get(fold(name))) for name in order)
            continue
        names = [str(n) for n in item.get("column_names") or []] \
            if item.get("class") == "COLUMN_REF" else []
        column = None
        if len(names) == 1 or (len(names) == 2 and fold(names[0]) in quals):
            column = source.get(fold(names[-1]))
        out.append((str(item.get("alias") or (names[-1] if names else "")), column))
    return out


def _outer_filters(nodes: list[dict[str, Any]], inner: dict[str, Any], table: str,
                   alias: str, schema: pa.Schema) -> list[Filter]:
    """The filters of the SELECTs around ``inner`` (the SELECT whose FROM is ``table``)
    through the subqueries between (a view read as its query, ``FROM (SELECT ...) AS v
    WHERE ...``), each of which passes its FROM's rows on one by one
    (:func:`_passed_columns`): a condition on a column that is the table's column under
    another name holds of the table's row. A column whose name is not certain (two of the
    name, an expression) takes no filter."""
    order = [f.name for f in schema]
    source = {fold(name): name for name in order}
    quals = {fold(table), fold(alias or table)}
    passed = _passed_columns(inner, source, quals, order)
    found: list[Filter] = []
    current = inner
    while passed is not None:
        parent = ref = None
        for node in nodes:
            frm = node.get("from_table")
            if node.get("type") == "SELECT_NODE" and isinstance(frm, dict) \
                    and frm.get("type") == "SUBQUERY" \
                    and (frm.get("subquery") or {}).get("node") is current:
                parent, ref = node, frm
                break
        if parent is None or ref is None:
            break
        renamed = list(ref.get("column_name_alias") or [])
        passed = [(renamed[i] if i < len(renamed) else name, column)
                  for i, (name, column) in enumerate(passed)]
        counts: dict[str, int] = {}
        for name, _c in passed:
            counts[fold(name)] = counts.get(fold(name), 0) + 1
        source = {fold(name): column for name, column in passed
                  if column is not None and counts[fold(name)] == 1}
        order = [name for name, _c in passed]
        quals = {fold(str(ref.get("alias") or ""))} - {""}
        where = parent.get("where_clause")
        if isinstance(where, dict):
            for c in _conjuncts(where):
                mapped = _renamed_refs(c, source, quals)
                f = _from_comparison(mapped, _Columns(table, "", schema)) \
                    if mapped is not None else None
                if f is not None:
                    found.append(f)
        current = parent
        passed = _passed_columns(parent, source, quals, order)
    return found


def _renamed_refs(node: dict[str, Any], source: dict[str, str], quals: set[str]
                  ) -> dict[str, Any] | None:
    """A copy of condition ``node`` whose column references name the table's columns
    (``source``: the names it may use -> the table's); None if one names another."""
    if node.get("class") == "COLUMN_REF":
        names = [str(n) for n in node.get("column_names") or []]
        if not (len(names) == 1 or (len(names) == 2 and fold(names[0]) in quals)):
            return None
        column = source.get(fold(names[-1]))
        return None if column is None else dict(node, column_names=[column])
    out: dict[str, Any] = {}
    for key, value in node.items():
        if isinstance(value, dict):
            done = _renamed_refs(value, source, quals)
            if done is None:
                return None
            out[key] = done
        elif isinstance(value, list):
            items = []
            for v in value:
                done = _renamed_refs(v, source, quals) if isinstance(v, dict) else v
                if done is None:
                    return None
                items.append(done)
            out[key] = items
        else:
            out[key] = value
    return out


def widened(v: Any, typ: pa.DataType, up: bool) -> Any:
    """Filter bound ``v`` moved a hair outwards (up for an upper bound) on a floating
    column, so statistics rounded by a cast never skip a row that matches. On a REAL
    column the hair is a REAL's precision: DuckDB compares it with a constant rounded to
    REAL (``r = 0.1`` holds for the REAL nearest 0.1, 0.10000000149...)."""
    if not pa.types.is_floating(typ):
        return v
    if typ.bit_width == 32:
        eps = abs(v) * 2.0**-23 + 2.0**-149  # a REAL's ulp (and its smallest subnormal)
    else:
        eps = abs(v) * 1e-9 + 1e-300
    return v + eps if up else v - eps


def may_match(f: Filter, typ: pa.DataType, lo: Any, hi: Any) -> bool:
    """Can a row with ``lo <= value <= hi`` (statistics without NaN) pass ``f``?"""
    try:
        floating = pa.types.is_floating(typ)
        if floating and f.hi is None:
            return True  # NaN passes any lower bound and statistics never show it
        if f.lo is not None and hi < widened(f.lo, typ, False):
            return False
        if f.hi is not None and lo > widened(f.hi, typ, True):
            return False
        if f.values is not None and not floating:
            return any(lo <= v <= hi for v in f.values)
        return True
    except TypeError:  # statistics of an unexpected type: read it
        return True


_TUPLE_OPS = {"=", "==", "!=", "<", "<=", ">", ">=", "in", "not in"}


def _pruning_value(v: Any, typ: pa.DataType) -> Any:
    """``v`` as :func:`may_match` compares it with ``typ``'s statistics, or None (no skipping)."""
    if isinstance(v, bool):
        return None
    if pa.types.is_integer(typ):
        return v if isinstance(v, int) and -_INT64 <= v < _INT64 else None
    if pa.types.is_floating(typ):
        return float(v) if isinstance(v, int | float) and math.isfinite(v) else None
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return v if isinstance(v, str) else None
    return None


def filters_from_tuples(filters: Any, schema: pa.Schema,
                        error: type[Exception] = ValueError) -> list[Filter]:
    """The row-group filters implied by ``[(column, op, value), ...]`` (AND-ed).

    ``op`` is one of ``= == != < <= > >= in, not in``; ``!=``, ``not in`` and values of
    other types than the column's (integer, floating, VARCHAR) skip nothing. Anything
    malformed raises ``error``.
    """
    names = set(schema.names)
    out = []
    for item in filters:
        if not (isinstance(item, tuple | list) and len(item) == 3):
            raise error(f"filter {item!r}: expected (column, op, value)")
        col, op, value = item
        if col not in names:
            raise error(f"filter {item!r}: no column {col!r} (columns: "
                        f"{', '.join(schema.names)})")
        if op not in _TUPLE_OPS:
            raise error(f"filter {item!r}: op must be one of {', '.join(sorted(_TUPLE_OPS))}")
        if op in ("in", "not in"):
            if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
                raise error(f"filter {item!r}: {op} takes a list of values")
            value = list(value)
            if not value:
                raise error(f"filter {item!r}: {op} takes at least one value")
        typ = schema.field(col).type
        if op in ("!=", "not in"):
            continue
        if op == "in":
            vals = [_pruning_value(v, typ) for v in value]
            if all(v is not None for v in vals):
                out.append(Filter(col, min(vals), max(vals), tuple(vals)))
            continue
        v = _pruning_value(value, typ)
        if v is None:
            continue
        out.append({"=": Filter(col, v, v), "==": Filter(col, v, v), "<": Filter(col, None, v),
                    "<=": Filter(col, None, v), ">": Filter(col, v, None),
                    ">=": Filter(col, v, None)}[op])
    return out


def all_pass(item: tuple[str, str, Any], typ: pa.DataType, stats: tuple[Any, Any] | None,
             nulls: int | None) -> bool:
    """Does every row of a row group pass the filter ``item`` (``(column, op, value)``, see
    :func:`filters_from_tuples`), given the column's ``(min, max)`` there and its NULL count?

    Only what is certain: an integer column without NULLs (a NULL passes no filter) and
    integer values within BIGINT's range, compared exactly as DuckDB compares them;
    anything else (other types, values or ops, statistics missing) is False (the rows are
    filtered one by one).
    """
    if stats is None or nulls != 0 or not pa.types.is_integer(typ):
        return False
    lo, hi = stats
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)):
        return False
    _col, op, value = item
    if op in ("in", "not in"):
        if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
            return False
        values = [_pruning_value(v, typ) for v in value]
        if not values or any(v is None for v in values):
            return False
        if op == "in":
            return lo == hi and lo in values
        return all(v < lo or v > hi for v in values)
    v = _pruning_value(value, typ)
    if v is None:
        return False
    checks: dict[str, bool] = {"=": lo == hi == v, "==": lo == hi == v, "!=": v < lo or v > hi,
                               "<": hi < v, "<=": hi <= v, ">": lo > v, ">=": lo >= v}
    return checks.get(op, False)


@dataclass(frozen=True)
class TopN:
    """The query wants only the ``limit`` first rows ordered by ``column`` (then others),
    its NULLs first (``nulls_first``: a row holding one may be among them) or last (then
    only when fewer than ``limit`` rows hold a value)."""

    column: str
    descending: bool
    limit: int
    nulls_first: bool = True


def _int_constant(node: Any) -> int | None:
    if not isinstance(node, dict) or node.get("class") != "CONSTANT":
        return None
    lit = node.get("literal") or {}
    if lit.get("kind") != "INTEGER":
        return None
    try:
        v = int(str(lit.get("text")))
    except (TypeError, ValueError):
        return None
    return v if v >= 0 else None


def _plain_select(tree: dict[str, Any] | None, table: str, aliases: bool
                  ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(SELECT node, table scan)`` when ``table`` is read exactly once in the statement,
    by a SELECT whose FROM is that table alone, without WHERE, GROUP BY, HAVING, QUALIFY
    or SAMPLE, selecting column references (``aliases``: renamed or not) or ``*``."""
    if tree is None:
        return None
    scans = [n for n in _walk(tree.get("statements", []))
             if n.get("type") == "BASE_TABLE" and not n.get("schema_name")
             and not n.get("catalog_name")
             and fold(str(n.get("table_name", ""))) == fold(table)]
    if len(scans) != 1:
        return None
    node = next((n for n in _walk(tree.get("statements", []))
                 if n.get("type") == "SELECT_NODE" and n.get("from_table") is scans[0]), None)
    if node is None or node.get("where_clause") or node.get("group_expressions") \
            or node.get("having") or node.get("qualify") or node.get("sample") \
            or (node.get("group_sets") or []):
        return None
    for item in node.get("select_list") or []:
        if item.get("alias") and not aliases:
            return None
        if item.get("class") == "STAR":
            if item.get("replace_list") or item.get("columns") or item.get("expr") \
                    or item.get("rename_list"):
                return None
        elif item.get("class") != "COLUMN_REF":
            return None
    return node, scans[0]


def head_rows(tree: dict[str, Any] | None, table: str) -> tuple[int, int] | None:
    """``(n, m)`` for ``SELECT cols FROM table LIMIT n [OFFSET m]``, or None.

    The table read once, by a SELECT with no WHERE, GROUP BY, HAVING, DISTINCT or
    ORDER BY, selecting only column references (aliases allowed) or ``*``, constant
    LIMIT and OFFSET. That SELECT's rows are the first ``n + m`` rows of the scan, in
    the order the scan hands them over (DuckDB keeps a scan's order for a LIMIT), of
    which DuckDB drops the first ``m``: the scan needs to read no more, and what it
    hands over for the first ``m`` is never looked at.
    """
    found = _plain_select(tree, table, aliases=True)
    if found is None:
        return None
    mods = found[0].get("modifiers") or []
    return _limit_offset(mods[0]) if len(mods) == 1 else None


def _limit_offset(mod: dict[str, Any]) -> tuple[int, int] | None:
    """``(n, m)`` of a ``LIMIT n [OFFSET m]`` modifier with constant counts, else None."""
    if mod.get("type") != "LIMIT_MODIFIER" or mod.get("limit_type", "ROW_COUNT") != "ROW_COUNT":
        return None
    limit = _int_constant(mod.get("limit"))
    offset = 0 if mod.get("offset") is None else _int_constant(mod.get("offset"))
    if limit is None or offset is None:
        return None
    return limit, offset


def top_n(tree: dict[str, Any] | None, table: str, schema: pa.Schema,
          default_order: Callable[[], str] | None = None,
          default_null_order: Callable[[], str] | None = None) -> TopN | None:
    """``SELECT cols FROM table ORDER BY col ASC|DESC[, ...] LIMIT n [OFFSET m]``, or None.

    Only the plainest form: the table read once, no WHERE, GROUP BY, HAVING,
    DISTINCT or aliases, only column references (or ``*``) selected, an
    explicit direction (or DuckDB's ``default_order``, asked of ``default_order()``) on an
    integer, floating or VARCHAR column, constant
    LIMIT and OFFSET. Then every row past the first ``n + m`` in that order
    cannot reach the result, which lets a scan skip row groups whose
    statistics prove all their rows come later. Where the NULLs go is the ORDER BY's
    ``NULLS FIRST|LAST``, else DuckDB's ``default_null_order`` (``default_null_order()``;
    without it NULLs count as first, which reads every row group holding one).
    """
    found = _plain_select(tree, table, aliases=False)
    if found is None:
        return None
    node, scan = found
    mods = node.get("modifiers") or []
    counts = _limit_offset(mods[1]) if len(mods) == 2 \
        and mods[0].get("type") == "ORDER_MODIFIER" else None
    if counts is None:
        return None
    limit, offset = counts
    orders = mods[0].get("orders") or []
    if not orders or orders[0].get("type") not in ("ASCENDING", "DESCENDING", "ORDER_DEFAULT"):
        return None
    descending = orders[0]["type"] == "DESCENDING"
    if orders[0]["type"] == "ORDER_DEFAULT":  # DuckDB's default_order setting decides
        if default_order is None:
            return None
        descending = default_order().strip().upper().startswith("DESC")
    cols = _Columns(table, str(scan.get("alias") or ""), schema)
    ref = cols.ref(orders[0].get("expression") or {})
    if ref is None:
        return None
    typ = ref[1]
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_string(typ)
            or pa.types.is_large_string(typ)):
        return None
    return TopN(ref[0], descending, limit + offset,
                _nulls_first(str(orders[0].get("null_order", "")), descending,
                             default_null_order))


def _nulls_first(null_order: str, descending: bool,
                 default_null_order: Callable[[], str] | None) -> bool:
    """Whether an ORDER BY item's NULLs sort first: its own ``NULLS FIRST|LAST``, else
    DuckDB's ``default_null_order`` setting (``NULLS_FIRST``, ``NULLS_LAST``,
    ``NULLS_FIRST_ON_ASC_LAST_ON_DESC``, ``NULLS_LAST_ON_ASC_FIRST_ON_DESC``); first
    when neither is known."""
    words = null_order.replace("_", " ").strip().upper()
    if words in ("NULLS FIRST", "NULLS LAST"):
        return words == "NULLS FIRST"
    if default_null_order is None:
        return True
    setting = default_null_order().replace("_", " ").strip().upper()
    if setting.startswith("NULLS FIRST ON ASC"):
        return not descending
    if setting.startswith("NULLS LAST ON ASC"):
        return descending
    return setting != "NULLS LAST"


def key_extremes_only(tree: dict[str, Any] | None, table: str, schema: pa.Schema,
                      key: str | None) -> bool:
    """Whether the query reads ``table`` only as ``min(key)`` / ``max(key)`` of all its rows.

    The table read once by a SELECT with no WHERE, GROUP BY, HAVING, QUALIFY or
    SAMPLE, and every column reference of the statement the single argument of a
    plain ``min`` or ``max`` aggregate (no FILTER, ORDER BY or window) naming the
    integer key. Then each part's key range (its minimum and maximum non-NULL
    key) gives the same answer as its rows: integers have no NaN and their
    statistics are exact.
    """
    if tree is None or key is None or key not in schema.names \
            or not pa.types.is_integer(schema.field(key).type):
        return False
    stmts = tree.get("statements", [])
    scans = [n for n in _walk(stmts) if n.get("type") == "BASE_TABLE"
             and not n.get("schema_name") and not n.get("catalog_name")
             and fold(str(n.get("table_name", ""))) == fold(table)]
    if len(scans) != 1:
        return False
    node = next((n for n in _walk(stmts)
                 if n.get("type") == "SELECT_NODE" and n.get("from_table") is scans[0]), None)
    if node is None or node.get("where_clause") or node.get("group_expressions") \
            or node.get("having") or node.get("qualify") or node.get("sample") \
            or (node.get("group_sets") or []):
        return False
    cols = _Columns(table, str(scans[0].get("alias") or ""), schema)
    allowed: set[int] = set()
    for n in _walk(node.get("select_list") or []):
        if n.get("class") == "WINDOW":
            return False  # count(*) OVER () and the like see every row
        if n.get("class") != "FUNCTION" or n.get("is_operator"):
            continue
        args = n.get("arguments") or n.get("children") or []
        if str(n.get("function_name", "")).lower() not in ("min", "max") or n.get("schema") \
                or n.get("catalog") or n.get("filter") or n.get("export_state") \
                or (n.get("order_bys") or {}).get("orders") or len(args) != 1:
            return False  # another function may be an aggregate over every row (count(*))
        arg = args[0].get("expression", args[0]) if isinstance(args[0], dict) else {}
        ref = cols.ref(arg)
        if ref is None or ref[0] != key:
            return False
        allowed.add(id(arg))
    refs = [n for n in _walk(stmts) if n.get("class") in ("COLUMN_REF", "STAR")
            or n.get("type") in ("STAR", "COLUMNS")]
    return bool(allowed) and all(id(n) in allowed for n in refs)


def bare_select_of(tree: dict[str, Any] | None, table: str, aliases: int
                   ) -> dict[str, Any] | None:
    """The SELECT node if the statement is one SELECT of ``table`` alone, its items aside,
    and nothing else; or None.

    Nothing else: FROM the table alone (no schema, sample or time travel, no more than
    ``aliases`` column aliases), no WHERE, GROUP BY, HAVING, QUALIFY, modifier (ORDER BY,
    LIMIT, DISTINCT), CTE or set operation. The caller checks the items.
    """
    if tree is None:
        return None
    stmts = tree.get("statements") or []
    if len(stmts) != 1 or not isinstance(stmts[0], dict):
        return None
    node = stmts[0].get("node") or {}
    src = node.get("from_table") or {}
    if node.get("type") != "SELECT_NODE" or src.get("type") != "BASE_TABLE" \
            or src.get("schema_name") or src.get("catalog_name") or src.get("sample") \
            or src.get("at_clause") or len(src.get("column_name_alias") or ()) > aliases \
            or fold(str(src.get("table_name", ""))) != fold(table):
        return None
    if node.get("where_clause") or node.get("group_expressions") or node.get("group_sets") \
            or node.get("having") or node.get("qualify") or node.get("sample") \
            or node.get("modifiers") or (node.get("cte_map") or {}).get("map") \
            or node.get("aggregate_handling", "STANDARD_HANDLING") != "STANDARD_HANDLING":
        return None
    return node


def column_argument(item: dict[str, Any], qualifier: str) -> list[str] | None:
    """The column's name parts (``["c"]`` or ``["t", "c"]``) if select item ``item`` is a
    plain function of one column of the table (``f(c)``, ``f(t.c)`` with ``t`` the table's
    ``qualifier``, its alias or name, lower case): no schema, FILTER, ORDER BY, operator or
    exported state, and an unnamed argument. DISTINCT is the caller's to check."""
    args = item.get("arguments") or item.get("children") or []
    if item.get("class") != "FUNCTION" or item.get("type") != "FUNCTION" \
            or item.get("schema") or item.get("catalog") or item.get("filter") \
            or item.get("is_operator") or item.get("export_state") \
            or (item.get("order_bys") or {}).get("orders") or len(args) != 1 \
            or not isinstance(args[0], dict):
        return None
    arg = args[0]
    if "expression" in arg:  # an argument entry: unnamed, its expression
        if arg.get("name"):
            return None
        arg = arg["expression"]
    parts = arg.get("column_names") if isinstance(arg, dict) else None
    if not isinstance(arg, dict) or arg.get("class") != "COLUMN_REF" \
            or not isinstance(parts, list) or not 1 <= len(parts) <= 2 \
            or not all(isinstance(n, str) and n for n in parts) \
            or (len(parts) == 2 and fold(parts[0]) != qualifier):
        return None
    return parts


def count_star_only(tree: dict[str, Any] | None, table: str, width: int) -> list[str] | None:
    """The result's column names if the statement is ``SELECT count(*) [AS a], ... FROM
    table`` and nothing else, or None.

    Nothing else: one statement, a SELECT of ``count(*)`` items only (no FILTER, DISTINCT
    or window), FROM the table alone (no sample; no more column aliases than its ``width``
    columns, which DuckDB refuses), no WHERE, GROUP BY, HAVING, QUALIFY,
    ORDER BY, LIMIT, DISTINCT or CTE. Its answer is then the table's row count, one
    BIGINT per item, named as DuckDB names it (the alias, or ``count_star()``).
    """
    node = bare_select_of(tree, table, width)
    if node is None:
        return None
    names = []
    for item in node.get("select_list") or []:
        if item.get("class") != "FUNCTION" or item.get("type") != "FUNCTION" \
                or str(item.get("function_name", "")).lower() != "count_star" \
                or item.get("schema") or item.get("catalog") or item.get("filter") \
                or item.get("distinct") or item.get("export_state") or item.get("is_operator") \
                or item.get("arguments") or item.get("children") \
                or (item.get("order_bys") or {}).get("orders"):
            return None
        names.append(str(item.get("alias") or "count_star()"))
    return names or None


def key_extremes_items(tree: dict[str, Any] | None, table: str, schema: pa.Schema,
                       key: str | None) -> list[str] | None:
    """``["min" | "max", ...]``, one per select item, if the statement is ``SELECT
    min(key) [AS a], max(key), ... FROM table`` and nothing else, or None.

    Nothing else: :func:`key_extremes_only` holds, the statement is one SELECT of the
    table alone (no CTE, set operation or sample), and has no modifier (ORDER BY, LIMIT,
    DISTINCT) and no item but a plain ``min`` or ``max`` of the key. Its answer is then one
    row of the parts' key ranges' extremes.
    """
    if tree is None or key is None:
        return None
    stmts = tree.get("statements") or []
    if len(stmts) != 1 or not isinstance(stmts[0], dict):
        return None
    node = stmts[0].get("node") or {}
    src = node.get("from_table") or {}
    if node.get("type") != "SELECT_NODE" or src.get("type") != "BASE_TABLE" \
            or src.get("sample") or src.get("at_clause") or node.get("modifiers") \
            or node.get("where_clause") \
            or (node.get("cte_map") or {}).get("map") \
            or node.get("aggregate_handling", "STANDARD_HANDLING") != "STANDARD_HANDLING":
        return None
    out = []
    for item in node.get("select_list") or []:
        name = str(item.get("function_name", "")).lower()
        if item.get("class") != "FUNCTION" or item.get("type") != "FUNCTION" \
                or name not in ("min", "max") or item.get("distinct"):
            return None
        out.append(name)
    # (checked last: it walks the whole tree, which a point query's first checks spare)
    if not out or not key_extremes_only(tree, table, schema, key):
        return None
    return out


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_WORD_CHARS = re.compile(r"[A-Za-z0-9_]*")


def _identifier(name: str) -> str | None:
    """``name`` as DuckDB writes an identifier in an expression's text (and so in a result
    column's name), or None where that is not certain here.

    A word (a letter, then letters, digits and ``_``) is written as is, unless it is a
    keyword of DuckDB's (reserved or not), which is quoted; a name holding any other
    character is quoted (in double quotes, a quote doubled). DuckDB quotes some names of
    letters, digits and ``_`` that start with ``_`` or a digit (``_4``) and not others
    (``_a``): those give None."""
    if _WORD.fullmatch(name):
        tokens = duckdb.tokenize(name)
        if tokens == [(0, duckdb.token_type.identifier)]:
            return name
        if tokens != [(0, duckdb.token_type.keyword)]:
            return None
    elif _WORD_CHARS.fullmatch(name):
        return None
    return '"' + name.replace('"', '""') + '"'


def key_extremes_names(tree: dict[str, Any]) -> list[str] | None:
    """The result's column names DuckDB gives a statement :func:`key_extremes_items`
    accepted, from its parse tree, or None where they, or that DuckDB binds the
    statement, are not certain.

    An item's alias, else its expression's text as DuckDB writes it (``min(c_int)``,
    ``max(t."Key")``): the function's name as parsed (lower case), then the column
    reference's parts, each quoted as DuckDB quotes it (:func:`_identifier`; None for a
    part whose quoting is not certain). A reference qualified by anything but the table's
    alias (the table's name when it has none), or a table given column aliases
    (``FROM t AS x(a)``), gives None: DuckDB would not find the column. These are the
    names of a connection whose identifiers keep their case (DuckDB's default
    ``preserve_identifier_case``, which the parsing connection pins), which the caller
    checks.
    """
    stmts = tree.get("statements") or []
    node = stmts[0].get("node") or {} if stmts and isinstance(stmts[0], dict) else {}
    src = node.get("from_table") or {}
    if src.get("type") != "BASE_TABLE" or src.get("column_name_alias"):
        return None
    qualifier = fold(str(src.get("alias") or src.get("table_name") or ""))
    names = []
    for item in node.get("select_list") or []:
        function = item.get("function_name")
        if function not in ("min", "max") or item.get("distinct"):
            return None
        parts = column_argument(item, qualifier)
        if parts is None:
            return None
        alias = item.get("alias")
        if isinstance(alias, str) and alias:
            names.append(alias)
            continue
        written = [_identifier(n) for n in parts]
        if None in written:
            return None
        names.append(f"{function}({'.'.join(written)})")  # type: ignore[arg-type]
    return names or None

"""Field functions computed by the table scan: derived columns.

A query that applies a field function (``decrypt``, ``mask_last4``...; the layers
above db name them, see :func:`~cryptdisk.db.add_connection_hook`) to a text column
of a table, in the select list of a ``SELECT`` that reads that table alone, with no
``WHERE`` or a plain one (:func:`_plain_where`: the scan keeps its rows first and
computes the functions for those only), gets the function's values from the scan: the
expression becomes a column of a separate Arrow view of the table, which the scan
computes over each row group's whole Arrow array on its thread pool (the C loops run
without the GIL, on every core) and keeps in the :class:`~cryptdisk.db._cache.ColumnCache` like a
decoded column, keyed by part, row group, column and the functions' tags (name,
constant arguments, key name, key versions and the keys' generation). DuckDB then
reads the values as it reads a stored column: no Python UDF per batch of 2,048.

The query's text decides what is computed (a role's query has already been rewritten
through its policies, so the scan computes only what the rewrite put there); the scan
computes nothing a query did not ask for. Chains (``mask_last4(fpe_decrypt(c, 'k'))``)
are computed as one derived column. A function inside a subquery, a lambda, or a
``SELECT`` with another ``WHERE``, a join or ``*`` stays with DuckDB. A value the scan cannot
compute (a tampered ciphertext, a value FF1 cannot take) makes the statement run
again without derived columns, so it fails, or succeeds, exactly as it would have.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa

from ..errors import DatabaseError
from ._columns import _walk, forget_walks
from ._names import fold

__all__ = ["DerivedColumn", "DerivedFailed", "PushedScan", "ScanFunction", "push_functions"]

#: separates a derived column's base column and function tags in its cache name (a
#: character no column name of a table holds, so derived and stored entries never meet)
SEP = "\x00"


class ScanFunction(Protocol):
    """One function applied to whole Arrow arrays of a text column (see ``bind``); of a
    ``BLOB`` column too when it has a true ``takes_bytes`` attribute (as its SQL
    function does: the decrypting ones take a ciphertext's bytes)."""

    #: what the cache keys the function's output by: name, constant arguments, key
    #: name, key versions and generation; never key material
    tag: str

    def __call__(self, values: pa.Array) -> pa.Array: ...


#: name -> bind(positional constants, named constants) -> ScanFunction, or None when
#: the call cannot be computed by the scan (DuckDB runs it as usual)
Binder = Callable[[list[Any], dict[str, Any]], "ScanFunction | None"]


class DerivedFailed(DatabaseError):
    """A scan could not compute a derived column: the statement runs again without them."""


@dataclass
class DerivedColumn:
    """``steps`` applied in order to ``column``, as column ``name`` of a derived view."""

    name: str
    column: str
    steps: tuple[ScanFunction, ...]
    #: the WHERE of its SELECT (SQL text) when the scan applies it first: the values
    #: are computed for the rows it keeps only, and cached as such
    where: str | None = None

    @property
    def cache_name(self) -> str:
        tags = [self.column, *(s.tag for s in self.steps)]
        return SEP.join(tags + ([where_name(self.where)] if self.where is not None else []))

    def compute(self, values: pa.Array) -> pa.Array:
        out = values
        for step in self.steps:
            out = step(out)
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        if out.type != pa.string():
            out = out.cast(pa.string())
        return out


@dataclass
class PushedScan:
    """A derived view: ``view`` reads ``table``'s ``columns`` and computes ``derived``;
    with ``where`` (SQL text over the columns, qualified by ``alias``), only for the rows
    it keeps, which are all the view returns (DuckDB applies the same WHERE again)."""

    view: str
    table: str
    columns: list[str]
    derived: list[DerivedColumn] = field(default_factory=list)
    where: str | None = None
    alias: str = ""
    #: the parsed WHERE, until push_functions has its text
    where_expr: Any = None


def where_name(where: str) -> str:
    """The cache name of the rows a WHERE keeps (a row group's boolean mask), and the
    tag that keys the derived values computed for them."""
    return f"{SEP}where:{where}"


def _literal(node: Any) -> tuple[bool, Any]:
    """(True, value) for a string, integer or boolean constant; (False, None) else."""
    if not isinstance(node, dict) or node.get("type") != "VALUE_CONSTANT":
        return False, None
    lit = node.get("literal") or {}
    kind, text = lit.get("kind"), lit.get("text")
    if not isinstance(text, str):
        return False, None
    if kind == "STRING":
        return True, text
    if kind == "INTEGER":
        try:
            return True, int(text)
        except ValueError:
            return False, None
    if kind == "BOOLEAN" and text.lower() in ("true", "false"):
        return True, text.lower() == "true"
    return False, None


#: expressions that evaluate a child for some rows only (a branch a role does not get,
#: a value a condition rules out): the scan would compute it for every row
_CONDITIONAL = {"CASE_EXPR", "OPERATOR_COALESCE", "CONJUNCTION_AND", "CONJUNCTION_OR",
                "OPERATOR_TRY"}
_CONDITIONAL_FUNCTIONS = {"if", "iff", "ifnull", "nullif", "coalesce", "try"}
#: what a condition folded before the scan may hold: constants and operators on them
_CONSTANT_CLASSES = {"CONSTANT", "OPERATOR", "COMPARISON", "CONJUNCTION", "CAST", "TYPE"}


#: what a WHERE that the scan applies itself may hold: it keeps the rows first, computes
#: the functions for those only (rows first, then columns, as a row access policy
#: requires), and DuckDB applies the same WHERE again, so it must give the same answer
#: twice in any DuckDB connection: the table's columns, constants, comparisons, AND, OR,
#: NOT, IN, BETWEEN, IS NULL, CASE and a few string functions no setting changes (no
#: casts, arithmetic, time, randomness, subqueries, parameters or user functions)
_WHERE_CLASSES = {"CONSTANT", "COLUMN_REF", "COMPARISON", "CONJUNCTION", "BETWEEN", "CASE"}
_WHERE_OPERATORS = {"OPERATOR_NOT", "OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL", "COMPARE_IN",
                    "COMPARE_NOT_IN"}
_WHERE_FUNCTIONS = {"~~", "!~~", "lower", "upper", "length", "starts_with", "prefix",
                    "suffix", "ends_with", "contains"}


def _plain_where(where: Any, columns: set[str], qualifiers: set[str]) -> bool:
    """Whether ``where`` holds only what :data:`_WHERE_CLASSES` (and the operators and
    functions beside it) allow, its column references naming ``columns`` (lower case),
    qualified by one of ``qualifiers`` or not at all."""
    for n in _walk(where):
        cls = n.get("class")
        if cls is None:
            continue
        if cls == "OPERATOR":
            if n.get("type") not in _WHERE_OPERATORS:
                return False
        elif cls == "FUNCTION":
            if str(n.get("function_name") or "").lower() not in _WHERE_FUNCTIONS or \
                    n.get("schema") or n.get("catalog") or n.get("filter") is not None or \
                    n.get("distinct") or n.get("export_state") or \
                    (n.get("order_bys") or {}).get("orders"):
                return False
        elif cls == "COLUMN_REF":
            names = [fold(str(x)) for x in n.get("column_names") or []]
            if not (len(names) == 1 or (len(names) == 2 and names[0] in qualifiers)) or \
                    names[-1] not in columns:
                return False
        elif cls == "CONSTANT":
            if n.get("type") != "VALUE_CONSTANT":
                return False
        elif cls not in _WHERE_CLASSES:
            return False
    return True


class _Pusher:
    def __init__(self, tables: dict[str, dict[str, pa.DataType]],
                 binders: dict[str, Binder],
                 evaluate: Callable[[list[dict[str, Any]]], list[Any] | None],
                 filters: Callable[[], bool]) -> None:
        self.tables = {fold(t): (t, cols) for t, cols in tables.items()}
        self._filters = filters
        self._filters_ok: bool | None = None
        self.binders = binders
        self.evaluate = evaluate
        self.pushed: list[PushedScan] = []
        #: (rewritten, original) select-list expressions without an alias
        self.unnamed: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def filters_ok(self) -> bool:
        """Whether the scan may apply a plain WHERE itself (asked once)."""
        if self._filters_ok is None:
            self._filters_ok = bool(self._filters())
        return self._filters_ok

    def fold(self, case: dict[str, Any]) -> Any:
        """The branch of a ``CASE`` whose conditions are all constants (as a policy's are
        once the role functions are the role's names) that DuckDB would take; None when
        a condition is not constant. Under a ``CAST`` only (the policy rewrite's), so
        the expression's type stays what it was."""
        checks = case.get("case_checks") or []
        whens: list[dict[str, Any]] = [c["when_expr"] for c in checks if isinstance(c, dict)
                                       and isinstance(c.get("when_expr"), dict)]
        if not whens or len(whens) != len(checks) or not all(
                n.get("class", "CONSTANT") in _CONSTANT_CLASSES
                for w in whens for n in _walk(w)):
            return None
        values = self.evaluate(whens)
        if values is None or len(values) != len(whens):
            return None
        for check, value in zip(checks, values, strict=True):
            if value is True:
                return check.get("then_expr")
        return case.get("else_expr")

    # -- the tree ------------------------------------------------------------------

    def walk(self, node: Any, ctes: frozenset[str]) -> None:
        """Visit every SELECT node with the CTE names in scope (as the policy rewrite)."""
        if isinstance(node, list):
            for v in node:
                self.walk(v, ctes)
            return
        if not isinstance(node, dict):
            return
        if node.get("type") == "RECURSIVE_CTE_NODE" and isinstance(node.get("cte_name"), str):
            ctes = ctes | {fold(node["cte_name"])}
        cte_map = node.get("cte_map")
        if isinstance(cte_map, dict) and cte_map.get("map"):
            seen = ctes
            for entry in cte_map["map"]:
                self.walk(entry, seen)
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    seen = seen | {fold(entry["key"])}
            ctes = seen
        for key, value in node.items():
            if key != "cte_map":
                self.walk(value, ctes)
        if node.get("type") == "SELECT_NODE":
            self.select(node, ctes)

    def select(self, node: dict[str, Any], ctes: frozenset[str]) -> None:
        src = node.get("from_table")
        if not isinstance(src, dict) or src.get("type") != "BASE_TABLE":
            return
        if src.get("schema_name") or src.get("catalog_name") or src.get("sample") or \
                src.get("at_clause") or src.get("column_name_alias"):
            return
        name = fold(str(src.get("table_name") or ""))
        if name in ctes or name not in self.tables:
            return
        if node.get("sample") is not None:
            return
        table, types = self.tables[name]
        alias = fold(str(src.get("alias") or ""))
        qualifiers = {alias} if alias else {name}
        lower = {fold(c): c for c in types}
        where = node.get("where_clause")
        if where is not None and not (_plain_where(where, set(lower), qualifiers)
                                      and self.filters_ok()):
            return  # the scan would compute the rows the WHERE drops: DuckDB keeps it
        for n in _walk([node.get(k) for k in node if k not in ("from_table", "cte_map")]):
            cls, kind = n.get("class"), n.get("type")
            if cls in ("STAR", "POSITIONAL_REFERENCE") or kind in ("STAR", "COLUMNS") or \
                    "PIVOT" in str(kind) or kind == "LAMBDA":
                return  # whole rows, positions or lambda parameters: leave the node be
            if cls == "COLUMN_REF":
                names = [fold(str(x)) for x in n.get("column_names") or []]
                if len(names) == 1 and names[0] in qualifiers | {name}:
                    return  # the row as a value
        derived: list[DerivedColumn] = []
        view = f"__cd_derived_{len(self.pushed)}"

        def column_of(expr: Any) -> str | None:
            if not isinstance(expr, dict) or expr.get("type") != "COLUMN_REF":
                return None
            names = [fold(str(x)) for x in expr.get("column_names") or []]
            if len(names) == 2 and names[0] not in qualifiers:
                return None
            if len(names) not in (1, 2) or names[-1] not in lower:
                return None
            col = lower[names[-1]]
            return col if types[col] in (pa.string(), pa.binary()) else None

        def chain(expr: Any) -> tuple[str, list[ScanFunction]] | None:
            if not isinstance(expr, dict) or expr.get("type") != "FUNCTION":
                return None
            fn = str(expr.get("function_name") or "").lower()
            binder = self.binders.get(fn)
            if binder is None or expr.get("schema") or expr.get("catalog") or \
                    expr.get("filter") is not None or expr.get("distinct") or \
                    expr.get("export_state") or \
                    (expr.get("order_bys") or {}).get("orders"):
                return None
            args = expr.get("arguments") or []
            if not args or not isinstance(args[0], dict) or args[0].get("name"):
                return None
            first = args[0].get("expression")
            positional: list[Any] = []
            named: dict[str, Any] = {}
            for a in args[1:]:
                if not isinstance(a, dict):
                    return None
                ok, value = _literal(a.get("expression"))
                if not ok:
                    return None
                if a.get("name"):
                    if a["name"].lower() in named:
                        return None
                    named[str(a["name"]).lower()] = value
                elif named:
                    return None
                else:
                    positional.append(value)
            step = binder(positional, named)
            if step is None:
                return None
            col = column_of(first)
            if col is not None:
                if types[col] == pa.binary() and not getattr(step, "takes_bytes", False):
                    return None  # (a mask of a BLOB: DuckDB reports its error)
                return col, [step]
            inner = chain(first)
            if inner is None:
                return None
            return inner[0], [*inner[1], step]

        def visit(expr: Any) -> Any:
            if isinstance(expr, list):
                return [visit(v) for v in expr]
            if not isinstance(expr, dict):
                return expr
            kind = expr.get("type")
            if kind == "OPERATOR_CAST" and isinstance(expr.get("child"), dict) and \
                    expr["child"].get("type") == "CASE_EXPR":
                branch = self.fold(expr["child"])
                if branch is not None:  # a policy's CASE on the role's constants
                    expr = dict(expr, child=branch)
            elif kind in _CONDITIONAL or (kind == "FUNCTION" and str(
                    expr.get("function_name") or "").lower() in _CONDITIONAL_FUNCTIONS):
                return expr  # evaluated for some rows only: computing all would do more
            if kind in ("SUBQUERY", "LAMBDA"):
                return expr
            found = chain(expr)
            if found is not None:
                col, steps = found
                d = DerivedColumn(f"__cd_d{len(derived)}", col, tuple(steps))
                same = next((x for x in derived if x.cache_name == d.cache_name), None)
                if same is None:
                    derived.append(d)
                    same = d
                return {"class": "COLUMN_REF", "type": "COLUMN_REF",
                        "alias": expr.get("alias", ""), "query_location": 0,
                        "query_location_length": 0, "column_names": [same.name]}
            return {k: visit(v) for k, v in expr.items()}

        parts = {k: visit(v) for k, v in node.items()
                 if k not in ("from_table", "cte_map", "where_clause")}
        if not derived:
            return
        for old, new in zip(node.get("select_list") or [], parts.get("select_list") or [],
                            strict=True):
            if new != old and isinstance(new, dict) and not new.get("alias"):
                self.unnamed.append((new, old))  # keeps the name DuckDB gives the original
        node.update(parts)  # select list, GROUP BY, HAVING, QUALIFY, ORDER BY alike
        # the columns the rest of the node (and its correlated subqueries) may read
        refs = {fold(str((n.get("column_names") or [""])[-1]))
                for n in _walk([node.get(k) for k in node if k not in ("from_table", "cte_map")])
                if n.get("class") == "COLUMN_REF"}
        columns = [c for c in types if fold(c) in refs]
        new_src = copy.deepcopy(src)
        new_src["table_name"] = view
        new_src["alias"] = alias or name
        new_src["qualified_name"] = {"path": [view]}
        node["from_table"] = new_src
        self.pushed.append(PushedScan(view, table, columns, derived, alias=alias or name,
                                      where_expr=where))


def push_functions(tree: dict[str, Any], tables: dict[str, dict[str, pa.DataType]],
                   binders: dict[str, Binder],
                   names: Callable[[list[dict[str, Any]]], list[str] | None],
                   evaluate: Callable[[list[dict[str, Any]]], list[Any] | None],
                   filters: Callable[[], bool] = lambda: True) -> list[PushedScan]:
    """Replace field function calls the scan can compute by derived columns, in place.

    ``tables`` maps the database's tables to ``{column: Arrow type}``; ``names(exprs)``
    gives the column names DuckDB gives expressions (a rewritten expression without an
    alias gets its original's name as alias). Returns the derived views to register
    (none: ``tree`` is unchanged). ``filters()`` says whether a ``SELECT`` with a plain
    ``WHERE`` (see :func:`_plain_where`) may be pushed: the scan applies it first.
    """
    if not binders:
        return []
    original = copy.deepcopy(tree)
    pusher = _Pusher(tables, binders, evaluate, filters)
    pusher.walk(tree.get("statements", []), frozenset())
    if pusher.pushed:  # the tree changed in place (and may be restored below)
        forget_walks()
    if pusher.unnamed:
        got = names([old for _new, old in pusher.unnamed])
        if got is None or len(got) != len(pusher.unnamed):
            tree.clear()
            tree.update(original)
            return []
        for (new, _old), name in zip(pusher.unnamed, got, strict=True):
            new["alias"] = name
    filtered = [p for p in pusher.pushed if p.where_expr is not None]
    if filtered:  # the WHERE's text: the scan runs it over each row group
        got = names([copy.deepcopy(p.where_expr) for p in filtered])
        if got is None or len(got) != len(filtered):
            tree.clear()
            tree.update(original)
            return []
        for p, text in zip(filtered, got, strict=True):
            p.where = text
            p.derived = [DerivedColumn(d.name, d.column, d.steps, text) for d in p.derived]
    for p in pusher.pushed:
        p.where_expr = None
    return pusher.pushed


def constant_values(con: Any, exprs: list[dict[str, Any]]) -> list[Any] | None:
    """The values of constant expressions (``CASE`` conditions), as BOOLEAN, from DuckDB."""
    texts = expression_names(con, exprs)
    if texts is None:
        return None
    try:
        row = con.execute("SELECT " + ", ".join(f"CAST(({t}) AS BOOLEAN)" for t in texts)
                          ).fetchall()[0]
    except Exception:
        return None
    return list(row)


def expression_names(con: Any, exprs: list[dict[str, Any]]) -> list[str] | None:
    """The names DuckDB gives unaliased select-list expressions (their text)."""
    import json

    from ._columns import serialize_sql

    template = serialize_sql("SELECT 1", con)
    trees = []
    for expr in exprs:
        t = copy.deepcopy(template)
        t["statements"][0]["node"]["select_list"] = [expr]
        trees.append(json.dumps(t))
    sql = "SELECT " + ", ".join(["json_deserialize_sql(?)"] * len(trees))
    row = con.execute(sql, trees).fetchall()[0]
    out = []
    for text in row:
        if not isinstance(text, str) or not text.startswith("SELECT "):
            return None
        out.append(text[len("SELECT "):])
    return out

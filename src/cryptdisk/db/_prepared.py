"""SQL ``PREPARE``, ``EXECUTE`` and ``DEALLOCATE`` of queries over cryptdisk tables.

DuckDB reads a cryptdisk table through a source registered for the one statement that
names it, so a statement DuckDB prepared would outlive what it reads (its next run would
find no table, or the sources of a statement that ended). A connection (the database's,
each reader's) remembers instead the query each name was prepared as:

- ``PREPARE name AS query`` checks the query as a statement of its own does (DuckDB
  prepares it over the tables' sources, then forgets it) and remembers it;
- ``EXECUTE name[(args)]`` registers the query's tables as they are now, has DuckDB
  prepare the query again (on a ``role=`` connection, read through the role's policies
  as they are now) and execute it with the arguments, then forget it: one statement;
- ``DEALLOCATE [PREPARE] name`` forgets it.

So DuckDB holds no prepared statement over cryptdisk's sources between two statements,
each ``EXECUTE`` sees the inserts committed before it, and a role's policies apply to
every ``EXECUTE`` as to a query written out. A statement other than a query that names a
cryptdisk table cannot be prepared (its ``INSERT`` is cryptdisk's own); other
statements (on DuckDB's temporary tables) go to DuckDB as they are.

What an ``EXECUTE`` reads is found from the prepared query's parse tree, each parameter
that its argument gives as a literal (``EXECUTE p(42, 'x')``, ``EXECUTE p(k := 42)``)
standing for that literal (:func:`bind_literals`): the columns it names, and the filters,
top-N and ``LIMIT`` a query with those literals written out would skip row groups by.
The text DuckDB runs keeps the parameters, so the rows and types are DuckDB's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._sql import _IDENT, _split_top, first_word, unquote

__all__ = ["QUERY_WORDS", "Deallocate", "Execute", "Prepare", "argument_literals",
           "bind_literals", "is_query", "parse_prepared"]

#: The first words of a query (what a reader runs, and what a PREPARE remembers).
QUERY_WORDS = frozenset({"SELECT", "WITH", "FROM"})


@dataclass
class Prepare:
    name: str  # lower case, unquoted (DuckDB's names of prepared statements ignore case)
    written: str  # as the statement wrote it
    query: str


@dataclass
class Execute:
    name: str
    written: str
    args: str  # "(...)" or ""


@dataclass
class Deallocate:
    name: str
    written: str


_PREPARE = re.compile(rf"(?is)PREPARE\s+({_IDENT})\s+AS\s+(.+)")
_EXECUTE = re.compile(rf"(?is)EXECUTE\s+({_IDENT})\s*(\(.*\))?\s*")
_DEALLOCATE = re.compile(rf"(?is)DEALLOCATE\s+(?:PREPARE\s+)?({_IDENT})\s*")


def is_query(sql: str) -> bool:
    """Whether ``sql`` is a query (``SELECT``, ``WITH``, ``FROM``, maybe in parentheses)."""
    return first_word(sql.lstrip("( \t\r\n")) in QUERY_WORDS


def _key(name: str) -> str:
    return unquote(name).lower()  # DuckDB's names of prepared statements ignore case


def parse_prepared(sql: str) -> Prepare | Execute | Deallocate | None:
    """The ``PREPARE``, ``EXECUTE`` or ``DEALLOCATE`` statement ``sql`` is, or None (another
    statement, or one these patterns do not read: DuckDB reads it, and says what is wrong).
    """
    word = first_word(sql)
    if word == "PREPARE" and (m := _PREPARE.fullmatch(sql)):
        return Prepare(_key(m.group(1)), m.group(1), m.group(2).strip())
    if word == "EXECUTE" and (m := _EXECUTE.fullmatch(sql)):
        return Execute(_key(m.group(1)), m.group(1), m.group(2) or "")
    if word == "DEALLOCATE" and (m := _DEALLOCATE.fullmatch(sql)):
        return Deallocate(_key(m.group(1)), m.group(1))
    return None


_NAMED = re.compile(rf"(?s)\s*({_IDENT})\s*:=\s*(.+)")


def argument_literals(args: str, parse: Callable[[str], dict[str, Any] | None]
                      ) -> dict[str, dict[str, Any]]:
    """The arguments of ``EXECUTE p(args)`` (``args``: ``"(...)"`` or ``""``) that are
    literals, as DuckDB's parse tree writes a constant, by the parameter each binds
    (``"1"``, ``"2"`` ... for positional ones, the lower-case name for ``name := value``);
    ``parse`` gives the tree of a ``SELECT``. Other arguments (expressions, casts) are left
    out, and so is everything when the arguments mix the two forms (DuckDB refuses it)."""
    inner = args.strip()[1:-1] if args.strip() else ""
    items = _split_top(inner) if inner.strip() else []
    if not items:
        return {}
    named = [_NAMED.fullmatch(item) for item in items]
    if any(named) and not all(named):
        return {}
    keys = [unquote(m.group(1)).lower() if m else str(i + 1) for i, m in enumerate(named)]
    values = [m.group(2) if m else item for m, item in zip(named, items, strict=True)]
    tree = parse("SELECT " + ", ".join(values))
    try:
        select = tree["statements"][0]["node"]["select_list"] if tree else None
    except (KeyError, IndexError, TypeError):
        return {}
    if not isinstance(select, list) or len(select) != len(keys):
        return {}
    return {k: node for k, node in zip(keys, select, strict=True)
            if isinstance(node, dict) and node.get("class") == "CONSTANT"}


def bind_literals(tree: Any, literals: dict[str, dict[str, Any]]) -> Any:
    """``tree`` (a parse tree, changed in place) with each parameter that ``literals`` binds
    (see :func:`argument_literals`) replaced by a copy of its constant."""
    if not literals:
        return tree

    def bound(node: Any) -> Any:
        if isinstance(node, dict) and node.get("class") == "PARAMETER":
            found = literals.get(str(node.get("identifier", "")).lower())
            return dict(found) if found is not None else node
        return node

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, dict | list):
                    node[k] = bound(v)
                    visit(node[k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                if isinstance(v, dict | list):
                    node[i] = bound(v)
                    visit(node[i])

    visit(tree)
    return tree

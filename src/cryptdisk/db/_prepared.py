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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._sql import _IDENT, first_word, unquote

__all__ = ["QUERY_WORDS", "Deallocate", "Execute", "Prepare", "is_query", "parse_prepared"]

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

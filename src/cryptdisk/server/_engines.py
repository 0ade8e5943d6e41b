"""The two engines a server can front: the embedded analytical database and encrypted SQLite.

An :class:`Engine` hands each client connection its own :class:`EngineSession`,
which runs one statement at a time and returns a :class:`Result` (column names
and PostgreSQL type OIDs, all rows, the command tag). Results are buffered:
a portal's rows are computed once and then sent in ``Execute``'s batches.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import decimal
import functools
import logging
import math
import os
import re
import string
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import apsw

from ..errors import (
    AuthenticationError,
    CryptdiskError,
    DatabaseError,
    FieldPolicyError,
    NotSupportedError,
    ServerError,
    TableNotFoundError,
    UsersFileError,
)
from . import _intervalin, _openfiles, _sqlitearith, _sqltext, _types
from ._groupsync import GroupSync
from ._writequeue import WriteQueue

__all__ = ["AnalyticalEngine", "Engine", "EngineSession", "Result", "SQLiteEngine",
           "StatementError", "TableKeys"]

log = logging.getLogger("cryptdisk.server")

_SHOW_TABLES = re.compile(r"(?is)\s*SHOW\s+TABLES\s*;?\s*")
_ROWS = {"SELECT", "WITH", "VALUES", "TABLE", "FROM", "SHOW", "DESCRIBE", "SUMMARIZE",
         "PRAGMA", "EXPLAIN"}
#: the queries the server streams (:meth:`_AnalyticalSession.run_stream`)
_STREAMED = frozenset({"SELECT", "WITH", "FROM", "TABLE", "VALUES"})
TRANSACTION_WORDS = {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT",
                     "RELEASE"}


class StatementError(ServerError):
    """A statement failed; ``sqlstate`` is the SQLSTATE code sent in the ErrorResponse."""

    def __init__(self, message: str, sqlstate: str = "XX000", *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.sqlstate = sqlstate


@dataclass
class Result:
    columns: list[tuple[str, int]] | None  # None: the statement returns no rows
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    tag: str = ""
    #: a query's rows still to be read (:class:`._rowstream.RowStream`): ``rows`` is empty
    #: and ``tag`` is known once it ends
    stream: Any = None


def command_tag(sql: str, rows: int | None, returns_rows: bool) -> str:
    words = _sqltext.first_words(sql, 2) or [""]
    head = words[0] if words[0] != "WITH" else with_head(sql)
    if returns_rows and head not in ("INSERT", "UPDATE", "DELETE"):
        return f"SELECT {rows or 0}"
    if head == "INSERT":
        return "INSERT" if rows is None else f"INSERT 0 {rows}"
    if head in ("UPDATE", "DELETE", "MERGE"):
        return head if rows is None else f"{head} {rows}"
    if head == "TRUNCATE":
        return "TRUNCATE TABLE"
    if head in ("CREATE", "DROP", "ALTER") and len(words) > 1:
        if head == "CREATE" and words[1] in _CREATE_MODIFIERS:  # CREATE UNIQUE INDEX: the
            kind = next((w for w in _sqltext.first_words(sql, 5)[1:]  # tag CREATE INDEX
                         if w not in _CREATE_MODIFIERS), words[1])
            return f"CREATE {kind}"
        return " ".join(words[:2])
    return head


#: the statements a WITH's common table expressions may precede
_WITH_HEADS = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "VALUES", "TABLE"})


@functools.lru_cache(maxsize=256)
def with_head(sql: str) -> str:
    """The statement that ``WITH ...`` ``sql`` runs after its common table expressions
    (``WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x``: INSERT, whose command tag
    PostgreSQL sends); WITH where it is not found."""
    from ._paramtypes import _tokens

    depth, before = 0, ""
    for tok in _tokens(sql)[1:]:
        if tok.text in ("(", "["):
            depth += 1
        elif tok.text in (")", "]"):
            depth -= 1
        elif depth == 0:
            if tok.kind == "ref" and tok.text in _WITH_HEADS and \
                    before not in ("", "RECURSIVE", ","):  # (not a CTE's name)
                return tok.text
            before = tok.text
    return "WITH"


#: the words between CREATE and what it creates, which its command tag leaves out
_CREATE_MODIFIERS = frozenset({"UNIQUE", "OR", "REPLACE", "TEMP", "TEMPORARY", "UNLOGGED"})


@dataclass
class TableKeys:
    """What :meth:`EngineSession.keys` gives for a table (SQLite's declarations)."""

    #: the primary key's columns, in the key's order (empty: none)
    primary: list[str] = field(default_factory=list)
    #: (name, unique, a UNIQUE constraint (not CREATE INDEX), columns, partial index's WHERE)
    indexes: list[tuple[str, bool, bool, list[str], str | None]] = field(default_factory=list)
    #: (columns, parent table, its columns (None: its primary key), ON UPDATE, ON DELETE)
    foreign: list[tuple[list[str], str, list[str] | None, str, str]] = field(
        default_factory=list)


def write_command(sql: str) -> str:
    """The name PostgreSQL gives the write ``sql`` in its errors: ``INSERT``,
    ``CREATE TABLE``, ``DROP VIEW``, ``COPY FROM``, ``GRANT``, ..."""
    words = [w for w in _sqltext.first_words(sql, 6) if w not in ("OR", "REPLACE", "UNIQUE",
                                                                  "TEMP", "TEMPORARY")]
    if not words:
        return "statement"
    if words[0] in ("CREATE", "DROP", "ALTER") and len(words) > 1:
        if words[:2] == ["CREATE", "TABLE"] and re.search(r"\bAS\b", sql, re.I):
            return "CREATE TABLE AS"
        return f"{words[0]} {words[1]}"
    if words[0] == "TRUNCATE":
        return "TRUNCATE TABLE"
    if words[0] == "COPY":
        return "COPY FROM"
    if words[0] in ("SELECT", "WITH", "EXPLAIN"):  # (a SELECT INTO, a CTE that writes)
        return "SELECT INTO" if words[0] == "SELECT" else words[0]
    return words[0]


def read_only_error(sql: str) -> StatementError:
    """A write refused in a read-only transaction: 25006, as PostgreSQL says it."""
    return StatementError(f"cannot execute {write_command(sql)} in a read-only transaction",
                          "25006")


class EngineSession:
    """One client's view of the engine (its own transaction, where the engine has them).

    ``last_tables`` holds the tables the last statement read or wrote, once
    :meth:`record_tables` was called (for the access log).
    """

    last_tables: set[str]
    #: the session's :class:`._grants.Privileges` (None: a server without users)
    privileges: Any = None
    #: whether the engine's views have the rights of the user who reads them (so a grant
    #: on a view means nothing: whoever reads one needs SELECT on the tables it reads)
    invoker_views = False
    #: the session's transaction is READ ONLY: a statement that writes fails (25006)
    read_only = False
    #: :meth:`run_stream` may give a query's rows as a stream
    streams = False

    def record_tables(self) -> None:
        """Fill ``last_tables`` on every later statement."""

    def run(self, sql: str, params: list[Any]) -> Result:
        raise NotImplementedError

    def run_stream(self, sql: str, params: list[Any]) -> Result:
        """:meth:`run`, a query's rows in a :attr:`Result.stream` where the engine streams
        them (the analytical engine), else whole."""
        return self.run(sql, params)

    def run_quick(self, sql: str, params: list[Any]) -> Result | None:
        """Run read-only ``sql`` on the calling thread if it cannot block or run long, else
        return None having done nothing (then :meth:`run` it on the session's thread)."""
        return None

    def run_write_quick(self, sql: str, params: list[Any],
                        deadline: float | None = None) -> Result | None:
        """Run the write ``sql`` on the calling thread if this session holds the write lock
        and the statement is known to finish at once, else return None having done nothing
        (then :meth:`run` it on the session's thread). ``deadline`` (``time.monotonic()``):
        the statement timeout's, at which a write that runs long after all is stopped
        (57014), since nothing else can stop it while it holds the calling thread."""
        return None

    async def begin_write(self) -> bool:
        """Start a write transaction (``BEGIN IMMEDIATE``) on the event loop if the engine can
        wait for the write lock there (then the first write may run with
        :meth:`run_write_quick`); False, having done nothing, when not (then ``BEGIN
        IMMEDIATE`` runs with :meth:`run` on the session's thread)."""
        return False

    def commit_quick(self) -> bool:
        """COMMIT on the calling thread if that cannot wait for a lock or the disk; then
        :meth:`finish_commit` must run (on the session's thread) before the client is told.
        False, having done nothing, when not."""
        return False

    def finish_commit(self) -> None:
        """The rest of a :meth:`commit_quick`: what waits for the disk."""

    def describe(self, sql: str) -> list[tuple[str, int]] | None:
        """The result columns ``sql`` would have, without running it (best effort)."""
        raise NotImplementedError

    @property
    def in_transaction(self) -> bool:
        return False

    def set_privileges(self, privileges: Any) -> None:
        """Check every later statement against ``privileges`` (a :class:`._grants.Privileges`)."""
        raise NotImplementedError

    #: stops what the session runs outside the engine (an information_schema query), if set
    interrupt_also: Callable[[], None] | None = None

    def interrupt(self) -> None:
        """Ask a running statement to stop (a CancelRequest); it fails with 57014."""

    def copy_in(self, table: str, columns: list[str] | None,
                batches: Iterable[list[list[Any]]], *, oids: list[int] | None = None) -> int:
        """Insert the rows of ``batches`` (lists of rows, read as they come: COPY FROM
        STDIN's data as the client sends it) into ``table``, all or none: text values (None
        for NULL), or with ``oids`` (binary COPY) Python values of those column types. An
        error raised by ``batches`` (the client's CopyFail, a malformed line) ends the
        insert: nothing of it is left in the table."""
        raise NotImplementedError

    def column_types(self, table: str) -> list[tuple[str, int]]:
        """(column, PostgreSQL type OID) of ``table``, in order (binary COPY FROM)."""
        raise NotImplementedError

    def _context(self, visible: Callable[[str], bool] | None
                 ) -> tuple[dict[str, str], Callable[[str], list[tuple[str, int]] | None]]:
        """What :mod:`._paramtypes` reads a statement's context from: lower-cased name ->
        name of each table and view ``visible`` lets through (None: all), and the
        (column, type OID) of one (None: not readable)."""
        tables = {n.lower(): n for n, _kind in self.relations()
                  if visible is None or visible(n)}

        def columns(name: str) -> list[tuple[str, int]] | None:
            try:
                return self.column_types(name)
            except StatementError:
                return None

        return tables, columns

    def parameter_types(self, sql: str, count: int,
                        visible: Callable[[str], bool] | None = None) -> list[int]:
        """The type OID that its context gives each of ``sql``'s ``count`` parameters (0:
        none), for a Describe (:mod:`._paramtypes`); only the tables and views ``visible``
        lets through are looked at."""
        from . import _paramtypes

        tables, columns = self._context(visible)
        return _paramtypes.infer(sql, count, tables, columns)

    #: a template that makes ``x || y`` a blob where the engine's ``||`` of two blobs is
    #: text (SQLite's), None where it is a blob
    blob_concat: str | None = None
    #: a template that makes the bytea ``{}`` of a text chain ``s || {}`` the text of its
    #: output (``\x``, then hex digits), and NULL when it is NULL
    bytea_text = "('\\x' || lower(hex({})))"

    def bytea_context(self, sql: str, visible: Callable[[str], bool] | None = None) -> str:
        """``sql`` with ``::bytea`` after each string literal with a backslash that its
        context makes a bytea (:func:`._paramtypes.bytea_strings`: ``INSERT INTO t VALUES
        ('\\x0102')`` into a bytea column), so that it is read by bytea's input, two
        bytes, as PostgreSQL reads it (the engines' casts read ``\\x01`` and the text
        ``02``, or store the text); ``visible`` as for :meth:`parameter_types`."""
        from . import _paramtypes

        tables, columns = self._context(visible)
        edits = [(end, 1, "::bytea") for end in _paramtypes.bytea_strings(sql, tables, columns)]
        if "||" in sql:  # b || b a bytea, s || b the text of b's output, as PostgreSQL's
            blobs, texts = _paramtypes.bytea_concats(sql, tables, columns)
            if self.blob_concat is not None:
                opened, closed = self.blob_concat.split("{}")
                edits += [e for a, b in blobs for e in ((a, 0, opened), (b, 2, closed))]
            opened, closed = self.bytea_text.split("{}")
            edits += [e for a, b in texts for e in ((a, 0, opened), (b, 2, closed))]
        for at, _order, text in sorted(edits, reverse=True):
            sql = sql[:at] + text + sql[at:]
        return sql

    def check_numeric_strings(self, sql: str,
                              visible: Callable[[str], bool] | None = None) -> None:
        """Raise StatementError (22003) for a string literal of ``sql`` that its context
        makes a numeric (``INSERT INTO t VALUES ('123456789012345.12345')`` into a NUMERIC
        column) and the engine would store as another number; ``visible`` as for
        :meth:`parameter_types`. The analytical engine's DECIMAL holds them: nothing."""

    def interval_strings(self, sql: str, visible: Callable[[str], bool] | None = None) -> str:
        """``sql`` with each string literal that its context makes an interval (``INSERT
        INTO t VALUES ('90 minutes')`` of an INTERVAL column) written as PostgreSQL writes
        that interval (``'01:30:00'``), for an engine that keeps intervals as text; 22007
        for text PostgreSQL does not read as one. The analytical engine has no INTERVAL
        columns: ``sql`` unchanged."""
        return sql

    def float_literals(self, sql: str, visible: Callable[[str], bool] | None = None) -> str:
        """``sql`` with each number literal that PostgreSQL reads as a float (cast to one,
        or where a float column gives it its type) and the engine would refuse as inexact
        written as the double it is; ``visible`` as for :meth:`parameter_types`. The
        analytical engine refuses none: ``sql`` unchanged."""
        return sql

    def authorize(self, sql: str, privileges: Any) -> None:
        """Raise StatementError (42501) if ``privileges`` (a :class:`._grants.Privileges`,
        possibly not this session's own) may not run ``sql``; run nothing. Errors other than
        a refusal are left for when the statement runs."""
        raise NotImplementedError

    def authorize_copy_in(self, table: str, privileges: Any) -> None:
        """As :meth:`authorize`, for ``COPY table FROM STDIN``."""
        if not privileges.allowed(table, "INSERT"):
            raise StatementError(f"permission denied: INSERT on table {table}", "42501",
                                 hint="an admin can GRANT it")

    def relations(self) -> list[tuple[str, str]]:
        """(name, kind) of every table ("r") and view ("v"), for psql's \\dt."""
        raise NotImplementedError

    def columns(self, name: str) -> list[tuple[str, str, bool, str | None]]:
        """(column, PostgreSQL type name, not null, default) of a table or view, for \\d."""
        raise NotImplementedError

    def view_definition(self, name: str) -> str | None:
        """The SQL that defines view ``name`` (None: none known)."""
        return None

    def owner_views(self) -> set[str]:
        """The (lower-case) names of the views that have their owner's rights: a grant on
        one is what reading it needs."""
        return set()

    def keys(self, name: str) -> TableKeys:
        """Table ``name``'s primary key, unique constraints, indexes and foreign keys, for
        ``pg_catalog`` (the analytical engine has none)."""
        return TableKeys()

    def close(self) -> None:
        pass


class Engine:
    name = "engine"
    transactions = False

    def open_session(self) -> EngineSession:
        raise NotImplementedError

    def close(self) -> None:
        pass


# --- the embedded analytical database --------------------------------------------------


def sql_literal(value: Any) -> str:
    """``value`` as a SQL literal DuckDB parses back to the same value: the embedded
    database's (:func:`cryptdisk.db.sql_literal`, which binds its Python API's parameters),
    but a finite ``numeric`` is a ``DECIMAL(38, scale)`` (PostgreSQL's numeric has no width
    of its own) and a string holding a NUL is refused (PostgreSQL's text holds none)."""
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return f"'{value:f}'::DECIMAL(38,{max(-int(value.as_tuple().exponent), 0)})"
    if isinstance(value, str) and "\0" in value:
        raise StatementError("a string parameter contains a NUL character", "22021")
    from ..db import sql_literal as literal

    try:
        return literal(value)
    except DatabaseError as exc:
        raise StatementError(str(exc), "22023") from None


#: PostgreSQL's quote_literal(text), which DuckDB lacks (the engine reads standard strings:
#: a backslash needs no escape)
_DUCKDB_QUOTE_LITERAL = "('''' || replace(CAST(({}) AS VARCHAR), '''', '''''') || '''')"


def _pg_length(arg: str) -> str:
    """PostgreSQL's ``length(x)`` in DuckDB (whose length() has no BLOB form): a bytea's
    bytes, a list's elements (as DuckDB's length() of a list), anything else's characters
    (DuckDB settles ``typeof`` as it binds, and a CASE evaluates only the branch a row
    takes; each branch binds whatever the type)."""
    return (f"(CASE WHEN typeof(({arg})) = 'BLOB' THEN octet_length(CAST(({arg}) AS BLOB)) "
            f"WHEN typeof(({arg})) LIKE '%]' THEN json_array_length(to_json(({arg}))) "
            f"ELSE length(CAST(({arg}) AS VARCHAR)) END)")


def _duckdb_blob(value: bytes) -> str:
    """DuckDB's literal of the BLOB ``value``."""
    return "'" + "".join(f"\\x{b:02X}" for b in value) + "'::BLOB"


def _sqlite_blob(value: bytes) -> str:
    """SQLite's literal of the BLOB ``value``."""
    return f"X'{value.hex()}'"


def postgres_spelling(sql: str, quote_literal: str,
                      blob: Callable[[bytes], str] | None = None) -> str:
    """``sql`` with what PostgreSQL clients write and the engine spells otherwise:
    ``pg_catalog.`` before functions and types dropped, ``quote_literal(x)`` as
    ``quote_literal`` (a template of ``x``), a subquery's unnamed expression named as
    PostgreSQL names it (:func:`._paramtypes.subquery_names`), a ``LIKE`` pattern
    with PostgreSQL's escape character (:func:`._paramtypes.like_escapes`), a string
    literal cast to ``bytea`` (``'\\x0102'::bytea``) as the engine's literal of its bytes
    (``blob`` of them), an escape string (``E'a\\tb'``) as the standard string of its value."""
    lower = sql.lower()  # (on every statement: a fifth of the time of a regex search)
    if lower.find("select", 1) >= 0:  # a subquery's expressions by PostgreSQL's names
        from ._paramtypes import subquery_names

        sql = subquery_names(sql)
    if "pg_catalog" in lower or "quote_literal" in lower:
        sql = _sqltext.replace_calls(_sqltext.drop_pg_catalog(sql), "quote_literal",
                                     quote_literal)
    if blob is not None and "bytea" in lower:
        sql = bytea_spelling(sql, blob)
    if blob is not None and ("decode" in lower or "encode" in lower):
        duckdb = blob is _duckdb_blob
        stored = not duckdb and _STORED.match(sql) is not None
        sql = _sqltext.replace_calls(sql, "decode",
                                     lambda a: _codec(a, "decode", duckdb, stored))
        sql = _sqltext.replace_calls(sql, "encode", lambda a: _codec(a, "encode", duckdb))
    if "e'" in lower:  # E'a\tb' as PostgreSQL reads it (SQLite has no escape strings,
        try:  # DuckDB's no \u)
            sql = _sqltext.standard_strings(sql)
        except ServerError as exc:
            raise StatementError(str(exc), "22021" if "UTF8" in str(exc) else "22025") \
                from None
    if "like" in lower and ("\\" in sql or "$" in sql):  # PostgreSQL's LIKE escapes
        # with a backslash where none is written
        from ._paramtypes import like_escapes

        sql = like_escapes(sql)
    return sql


#: the SQLite function of PostgreSQL's decode(text, 'hex') (:func:`_sqlite_decode_hex`)
_DECODE_HEX = "cryptdisk_decode_hex"
#: a statement whose text SQLite may keep (a view, trigger, index, CHECK, DEFAULT or
#: generated column; not CREATE TABLE ... AS): its decode(text, 'hex') is SQLite's own
#: unhex(), which gives NULL for what is not hex, and its casts to an integer type
#: SQLite's CAST (which truncates), so that the definition reads wherever the database is
#: opened (cryptdisk.sqlite.connect, a decrypted copy), where the server's functions do
#: not exist
_NAME_PART = r'(?:"(?:[^"]|"")*"|[\w$]+)'  # (a quoted or bare name)
_STORED = re.compile(r"\s*(?:CREATE|ALTER)\b(?!\s+(?:TEMP(?:ORARY)?\s+)?TABLE\s+"
                     rf"(?:IF\s+NOT\s+EXISTS\s+)?(?:{_NAME_PART}\s*\.\s*)*{_NAME_PART}"
                     r"\s+AS\b)", re.IGNORECASE)  # (CREATE TABLE ... AS keeps no expression)
_SQLITE_UNHEX = "unhex({}, ' ' || char(9, 10, 13))"


def _sqlite_decode_hex(*args: Any) -> Any:
    """:func:`_decode_hex` as SQLite's function of one argument (NULL gives NULL)."""
    (text,) = args
    if text is None:
        return None
    return _decode_hex(text.decode("utf-8", "replace") if isinstance(text, bytes)
                       else str(text))


@functools.lru_cache(maxsize=256)
def _ilike_stretches(pattern: str, escape: str = "\\"
                     ) -> tuple[tuple[re.Pattern[str], int], ...]:
    """PostgreSQL's ``ILIKE`` pattern (``%``, ``_``, ``escape`` its escape character, ""
    for none) as its stretches between ``%``: each a regular expression without
    repetition that ignores case, and how many characters it matches (a ``%`` is no
    ``.*``: Python's backtracking over several took exponential time)."""
    stretches: list[tuple[re.Pattern[str], int]] = []
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == escape:
            if i + 1 == len(pattern):
                raise StatementError("LIKE pattern must not end with escape character", "22025")
            out.append(re.escape(pattern[i + 1]))
            i += 1
        elif c == "%":
            stretches.append((re.compile("".join(out), re.IGNORECASE | re.DOTALL), len(out)))
            out = []
        else:
            out.append("." if c == "_" else re.escape(c))
        i += 1
    stretches.append((re.compile("".join(out), re.IGNORECASE | re.DOTALL), len(out)))
    return tuple(stretches)


def _ilike_matches(pattern: str, value: str, escape: str = "\\") -> bool:
    """Whether ``value`` matches ILIKE's ``pattern``: the first stretch at its start, the
    last at its end, each one between at its first place after the one before (the
    earliest place leaves the most room to what follows): at most the value's length
    times the pattern's."""
    (first, size), *rest = _ilike_stretches(pattern, escape)
    if not rest:
        return first.fullmatch(value) is not None
    *middle, (last, last_size) = rest
    if first.match(value) is None:
        return False
    pos = size
    for stretch, _ in middle:
        found = stretch.search(value, pos)
        if found is None:
            return False
        pos = found.end()
    end = len(value) - last_size
    return end >= pos and last.fullmatch(value, end) is not None


def _sqlite_ilike(*args: Any) -> Any:
    """PostgreSQL's ``value ILIKE pattern [ESCAPE e]`` as SQLite's ``match(pattern, value
    [, e])``, which SQLite runs for ``value MATCH pattern [ESCAPE e]``
    (:func:`_ilike_spelling`): 1, 0 or NULL."""
    pattern, value, *escape = args
    if pattern is None or value is None or (escape and escape[0] is None):
        return None
    if any(isinstance(a, bytes) for a in args):
        raise StatementError("operator does not exist: bytea ~~* bytea", "42883",
                             hint="ILIKE compares text: encode(b, 'hex') ILIKE ...")
    esc = str(escape[0]) if escape else "\\"
    if len(esc) > 1:
        raise StatementError("invalid escape string", "22025",
                             hint="Escape string must be empty or one character.")
    return int(_ilike_matches(str(pattern), str(value), esc))


def _ilike_spelling(sql: str) -> str:
    """``sql`` with ``x [NOT] ILIKE p [ESCAPE e]`` as ``x [NOT] MATCH p [ESCAPE e]``
    (SQLite has no ILIKE; its MATCH, outside a full-text table, calls the function
    :func:`_sqlite_ilike` the server registers). Refused in a definition SQLite keeps
    (:data:`_STORED`), which must read where the server's function does not exist."""
    new = _sqltext.replace_words(sql, lambda w: "MATCH" if w.upper() == "ILIKE" else None)
    if new != sql and _STORED.match(sql) is not None:
        raise StatementError(
            "the SQLite engine cannot keep ILIKE in a definition (a view, trigger, CHECK, "
            "index): SQLite has no ILIKE", "0A000",
            hint="write lower(x) LIKE lower(pattern)")
    return new


#: PostgreSQL's names of the integer types of :func:`_sqlite_int_cast`'s widths (bytes)
_INT_TYPE_NAMES = {2: "smallint", 4: "integer", 8: "bigint"}
_INT_LIMITS = {size: 1 << (8 * size - 1) for size in _INT_TYPE_NAMES}
#: PostgreSQL's integer input: spaces (C's isspace), a sign, decimal digits, spaces
_PG_INT_TEXT = re.compile(r"[ \t\n\r\v\f]*[+-]?[0-9]+[ \t\n\r\v\f]*")


def _sqlite_interval_cast(*args: Any) -> Any:
    """PostgreSQL's cast of a parameter to an interval as SQLite's function
    (:data:`._sqltext.INTERVAL_CAST_FUNCTION`): the text of the interval PostgreSQL reads
    in ``value``, as the server stores intervals (:func:`._sqltext.interval_literal`);
    NULL is NULL; text it does not read fails as there (22007)."""
    (value,) = args
    if value is None:
        return None
    if isinstance(value, bytes):
        raise StatementError("cannot cast type bytea to interval", "42846")
    try:
        return _types.interval_text(*_intervalin.parse_interval(
            value if isinstance(value, str) else repr(value)), plus=False)
    except _intervalin.IntervalError as exc:
        raise StatementError(*exc.args) from None


def _sqlite_date_input(*args: Any) -> Any:
    """PostgreSQL's date input of a parameter written into a DATE column as SQLite's
    function (:data:`._sqltext.DATE_INPUT_FUNCTION`): the ISO text of the date
    (``2024-1-2`` is ``2024-01-02``, a timestamp its date); NULL is NULL; a month or day
    out of range fails with 22008 and text of no ISO date with 22007, as there (the other
    forms PostgreSQL reads, ``January 8, 1999``, are refused too)."""
    (value,) = args
    if not isinstance(value, str):
        if isinstance(value, bytes):
            raise StatementError("cannot cast type bytea to date", "42846")
        return value
    m = _types.PG_DATE_TEXT.fullmatch(value)  # (ISO's year-month-day, a time dropped)
    if m is None:
        raise StatementError(f'invalid input syntax for type date: "{value}"', "22007",
                             hint="the SQLite engine reads dates as ISO 8601's "
                             "YYYY-MM-DD")
    try:
        return dt.date(int(m[1]), int(m[2]), int(m[3])).isoformat()
    except ValueError:
        raise StatementError(f'date/time field value out of range: "{value}"',
                             "22008") from None


def _sqlite_substr(*args: Any) -> Any:
    """PostgreSQL's ``substr(s, start [, count])`` (and ``substring``) as SQLite's function
    (:data:`._sqltext.SUBSTR_FUNCTION`): the characters (a blob's bytes) at positions
    ``start`` to ``start + count - 1`` that exist, so a start below 1 takes fewer
    (``substr('hello', -1, 3)`` is ``h``; SQLite's counts from the end: ``o``); NULL for a
    NULL argument; a negative count fails with 22011."""
    if len(args) not in (2, 3):
        raise StatementError("function substr takes 2 or 3 arguments", "42883")
    if any(a is None for a in args):
        return None
    value, numbers = args[0], args[1:]
    if any(type(n) is not int for n in numbers):
        try:
            numbers = tuple(_sqlite_int_cast(n, 4, 0) for n in numbers)
        except StatementError:
            raise StatementError("substr's start and count are integers", "42883") from None
    if not isinstance(value, str | bytes):
        value = str(value)
    start = numbers[0]
    begin = max(start, 1) - 1
    if len(numbers) == 1:
        return value[begin:]
    if numbers[1] < 0:
        raise StatementError("negative substring length not allowed", "22011")
    return value[begin:max(start + numbers[1] - 1, begin)]


def _sqlite_int_cast(*args: Any) -> Any:
    """PostgreSQL's cast to ``smallint``, ``integer`` or ``bigint`` (``size`` bytes) as
    SQLite's function (:data:`._sqltext.INT_CAST_FUNCTION`) of ``(value, size, numeric)``:
    NULL is NULL; an integer (a bool is 0 or 1) stays exact; a float rounds half to even
    (float8's rint), or away from zero where ``numeric`` (a numeric literal); text is
    read as PostgreSQL's integer input (spaces around a signed decimal integer, anything
    else 22P02); a value out of the type's range fails with 22003, a blob with 42846."""
    value, size, numeric = args
    limit = _INT_LIMITS[size]
    if type(value) is int and -limit <= value < limit:
        return value
    if value is None:
        return None
    name = _INT_TYPE_NAMES[size]
    if type(value) is int:
        n = value
    elif type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            raise StatementError(f"{name} out of range", "22003")
        n = int(decimal.Decimal(repr(value)).to_integral_value(decimal.ROUND_HALF_UP)) \
            if numeric else round(value)
    elif type(value) is str:
        if _PG_INT_TEXT.fullmatch(value) is None:
            raise StatementError(f'invalid input syntax for type {name}: "{value}"', "22P02")
        n = int(value.strip(" \t\n\r\v\f"))
        if not -limit <= n < limit:
            raise StatementError(f'value "{value}" is out of range for type {name}', "22003")
        return n
    else:  # a blob
        raise StatementError(f"cannot cast type bytea to {name}", "42846")
    if not -limit <= n < limit:
        raise StatementError(f"{name} out of range", "22003")
    return n


#: a number at the start of text, as SQLite's arithmetic reads text (else 0)
_NUMBER_PREFIX = re.compile(r"\s*[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _copy_float(text: str) -> Any:
    """A COPY field of a float column as PostgreSQL's float8 input reads it (``inf``,
    `` 1.5 ``; NaN is NULL, as SQLite keeps it); 22P02 / 22003 as there."""
    if text.isascii() and "_" not in text:  # (Python's float reads ASCII as strtod does,
        try:  # and 1_000; a word, 0 or beyond the range: PostgreSQL's rules below)
            number = float(text)
        except ValueError:
            pass
        else:
            if number != 0 and math.isfinite(number):
                return number
    value = _sqltext.float_input(text, "float8")
    return None if value == "NULL" else float(value)


def _copy_bool(text: str) -> int:
    """A COPY field of a boolean column as PostgreSQL's boolean input reads it (``yes``,
    ``off``), as SQLite's 1 or 0; 22P02 for other text."""
    return int(_sqltext.bool_input(text))


#: the column types whose COPY text fields are read by PostgreSQL's input of the type
_COPY_INPUTS: dict[int, Callable[[str], Any]] = {
    _types.INT8: lambda text: _sqlite_int_cast(text, 8, 0), _types.FLOAT8: _copy_float,
    _types.BOOL: _copy_bool}


def _copy_typed(rows: list[list[Any]], j: int, name: str, read: Callable[[str], Any],
                before: int) -> None:
    """Field ``j`` (column ``name``) of each text row read by ``read``; a field it refuses
    fails the COPY with the input's SQLSTATE, naming the row (``before`` rows earlier)."""
    for i, row in enumerate(rows):
        text = row[j]
        if type(text) is str:
            try:
                row[j] = read(text)
            except (StatementError, _sqltext.InputError) as exc:
                message = exc.args[0]
                code = exc.sqlstate if isinstance(exc, StatementError) else exc.args[1]
                raise StatementError(f"{message} (COPY row {before + i + 1}, column "
                                     f"{name})", code) from None


def _sqlite_divisor(*args: Any) -> Any:
    """A divisor of ``/`` or ``%`` as SQLite's function (:data:`._sqlitearith.
    DIVISOR_FUNCTION`): the value itself, or 22012 where it is zero (SQLite's ``/`` and
    ``%`` would give NULL; text is read as SQLite's arithmetic reads it, 0 when it is no
    number). With a second argument, the dividend: where it is NULL the value is given as
    it is (NULL over zero is NULL in PostgreSQL, whose operators are strict)."""
    value = args[0]
    if len(args) == 2 and args[1] is None:
        return value
    if type(value) is str:
        number = _NUMBER_PREFIX.match(value)
        if number is None or float(number[0]) == 0:
            raise StatementError("division by zero", "22012")
    elif value == 0 and type(value) in (int, float):
        raise StatementError("division by zero", "22012")
    return value


def _decode_hex(s: str) -> bytes:
    """PostgreSQL's decode(text, 'hex'), for SQLite (whose unhex() gives NULL for what
    PostgreSQL refuses) and literals: pairs of hex digits, whitespace between pairs; an
    invalid digit or an odd number of digits fails with 22023, as in PostgreSQL."""
    out, i, n = bytearray(), 0, len(s)
    while i < n:
        c = s[i]
        if c in " \t\n\r":
            i += 1
            continue
        if i + 1 >= n and c in string.hexdigits:
            raise StatementError("invalid hexadecimal data: odd number of digits", "22023")
        pair = s[i:i + 2]
        bad = next((d for d in pair if d not in string.hexdigits), None)
        if bad is not None:
            raise StatementError(f'invalid hexadecimal digit: "{bad}"', "22023")
        out.append(int(pair, 16))
        i += 2
    return bytes(out)


#: PostgreSQL's decode(text, format) and encode(bytea, format) in the engines' functions
#: ({} the first argument); a format missing here is refused
#: (DuckDB's unhex() reads an odd number of digits as if a 0 led them)
_CODECS = {("decode", "hex"): ("unhex(CASE WHEN length({0}) % 2 = 1 THEN error('invalid "
                               "hexadecimal data: odd number of digits') ELSE {0} END)",
                               f"{_DECODE_HEX}({{}})"),
           ("decode", "base64"): ("from_base64({})", None),
           ("encode", "hex"): ("lower(hex({}))", "lower(hex({}))"),
           ("encode", "base64"): ("to_base64({})", None)}


def _codec(args: str, name: str, duckdb: bool, stored: bool = False) -> str:
    """PostgreSQL's ``name(args)`` (decode or encode with a format) as the engine's call;
    a one-argument call (DuckDB's own decode/encode) is left as it is. ``stored``: in a
    definition SQLite keeps (:data:`_STORED`), SQLite's own functions only."""
    parts = _sqltext.split_arguments(args)
    if len(parts) != 2:
        return f"{name}({args})"
    m = re.fullmatch(r"'([A-Za-z0-9]*)'", parts[1])
    if m is None:
        raise StatementError(f"{name}(data, format) needs its format written as a string "
                             "literal ('hex', 'base64')", "0A000")
    fmt = m[1].lower()
    template = _CODECS.get((name, fmt), (None, None))[0 if duckdb else 1]
    if stored and (name, fmt) == ("decode", "hex"):
        template = _SQLITE_UNHEX
    if template is None:
        raise StatementError(f"{name}(data, '{fmt}') is not supported on this engine: "
                             "use the format 'hex'", "0A000")
    if "{0}" not in template:
        return template.format(parts[0])
    literal = re.fullmatch(r"'([^'\\]*)'", parts[0].strip())
    if literal is not None:  # read here, as PostgreSQL reads it: unhex('0102') remains
        return f"unhex('{_decode_hex(literal[1]).hex()}')"  # (the column's name)
    return template.replace("{0}", parts[0])


def bytea_spelling(sql: str, blob: Callable[[bytes], str] = _duckdb_blob) -> str:
    """``sql`` with each string literal cast to ``bytea`` as the engine's literal of the
    bytes PostgreSQL reads from it (``blob`` of them; DuckDB's by default)."""
    try:
        return _sqltext.bytea_literals(sql, lambda text: blob(bytea_input(text)))
    except StatementError:
        raise
    except ServerError as exc:  # an E'' string's escape it does not read
        raise StatementError(str(exc), "0A000") from None


_HEX_PAIRS = re.compile(r"(?:\s*[0-9A-Fa-f]{2})*\s*")


def bytea_input(text: str) -> bytes:
    """The bytes PostgreSQL's ``bytea`` input reads from ``text``: the hex format
    (``\\x0102``, white space between the pairs) or the escape format (``\\\\`` a
    backslash, ``\\ooo`` an octal byte, other characters their UTF-8 bytes)."""
    if text.startswith("\\x"):
        if _HEX_PAIRS.fullmatch(text, 2) is None:
            raise StatementError(f"invalid hexadecimal data in the bytea literal {text!r}",
                                 "22023")
        return bytes.fromhex(text[2:])
    if "\\" not in text:
        return text.encode("utf-8")
    out, i = bytearray(), 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
        elif text[i + 1:i + 2] == "\\":
            out.append(0x5C)
            i += 2
        elif re.fullmatch(r"[0-3][0-7][0-7]", text[i + 1:i + 4]):
            out.append(int(text[i + 1:i + 4], 8))
            i += 4
        else:
            raise StatementError(f"invalid input syntax for type bytea: {text!r}", "22P02")
    return bytes(out)


#: a table or view has the name a CREATE or RENAME TO gives (cryptdisk's checks, DuckDB's
#: catalog, SQLite's): PostgreSQL's duplicate_table
_DUPLICATE = re.compile(r"already exists|is already another table|: an? (?:temporary )?"
                        r"(?:table|view|table or view) \S+ (?:of this connection )?has the "
                        r"name|RENAME TO \S+: a table \S+ exists$")


def _duckdb_sqlstate(message: str) -> str:
    for prefix, code in (("NOT NULL constraint failed", "23502"),
                         # (a Conversion Error: a value outside the type, as PostgreSQL's
                         # "integer out of range")
                         ("out of range for the destination type", "22003"),
                         ("Parser Error", "42601"),
                         # (PostgreSQL's ambiguous_column, undefined_object: before the
                         # Binder and Catalog Errors they are)
                         ("Ambiguous reference to column", "42702"),
                         ("unrecognized configuration parameter", "42704"),
                         ("must appear in the GROUP BY clause", "42803"),
                         ("values were supplied", "42601"),  # (more or fewer than columns)
                         ("field format", "22007"),  # (a date's, time's or timestamp's text)
                         ("Not implemented Error", "0A000"),
                         ("Catalog Error", "42P01"),
                         ("Binder Error", "42703"), ("Conversion Error", "22P02"),
                         ("Constraint Error", "23000"), ("Out of Range Error", "22003"),
                         ("Invalid Input Error", "22023"), ("INTERRUPT Error", "57014"),
                         ("Permission Error", "42501"),
                         # cryptdisk's views (cryptdisk.db._views)
                         ("which does not exist (dropped or renamed", "42P01"),
                         ("which a CTE named", "42712"),
                         ("is a view, which holds no rows", "42809")):
        if prefix in message:
            return code
    return "XX000"


def _type_error(text: str) -> StatementError | None:
    """DuckDB's binder errors about types as PostgreSQL's: a function or operator that
    cannot tell the type of an untyped parameter (written into the statement as a string
    literal) or string literal, 42P18; values of two types it will not compare or assign
    without a cast, 42804; no function or operator for these argument types, 42883."""
    first = text.split("\n", 1)[0]
    if "Could not choose a best candidate" in first and "STRING_LITERAL" in first:
        return StatementError(
            "could not determine the data type of a parameter or string literal: "
            + first.removeprefix("Binder Error: "), "42P18",
            hint="cast the parameter to the type meant, e.g. $1::BIGINT or CAST($1 AS DATE)")
    if "an explicit cast is required" in first or "Cannot compare values of type" in first \
            or "Unimplemented type for cast" in first:
        return StatementError(first.split(": ", 1)[-1], "42804",
                              hint="cast one side to the other's type")
    if "No function matches the given name and argument types" in first:
        return StatementError(first.split(": ", 1)[-1], "42883",
                              hint="cast the arguments to the types the function takes")
    return None


#: a function's error, as DuckDB reports a Python UDF's (the function names itself first)
_UDF_ERROR = re.compile(r"Python exception occurred while executing the UDF: \w+: (\w+): ")


def _policy_failure(err: StatementError, sql: str) -> StatementError:
    """``err`` of a statement the policies rewrote, when a function the statement as
    written does not call failed (one a policy's body calls, on a stored value it reads):
    said without the function's name, which would tell the session what the policy does
    (that it decrypts, and how)."""
    m = _UDF_ERROR.search(str(err))
    if m is None or re.search(rf"(?i)\b{re.escape(m[1])}\b", _sqltext.strip_strings(sql)):
        return err
    return StatementError("a masking or row access policy of a table the statement reads "
                          "failed on a stored value", err.sqlstate,
                          hint="an admin can read the table's stored values")


def _without_context(err: StatementError) -> StatementError:
    """``err`` without DuckDB's quote of the statement (``LINE 1: ...`` and its caret)
    and a Binder error's candidate bindings, for a statement the policies rewrote: the
    quote would show the rewritten text, the policies' expressions in it, to a session
    they apply to; the candidates would be the rewrite's columns (:func:`quiet_error`)."""
    from ..db import quiet_error

    text = str(err)
    bare = quiet_error(text)
    if bare == text:
        return err
    return StatementError(bare, err.sqlstate, hint=err.hint)


#: DuckDB's error for ``//`` and ``%`` by zero (and ``/``, read as ``//``: see
#: :class:`AnalyticalEngine`)
_DIVISION_BY_ZERO = "Invalid Input Error: Division by zero in expression"
#: DuckDB's binder finding no ``//`` for a ``/`` of types it divides exactly only
#: (``interval '1 day' / 2``): see :meth:`_AnalyticalSession._execute_lengths`
_NO_INTEGER_DIVISION = "No function matches the given name and argument types '//("

def _slashes(sql: str) -> list[tuple[int, int]]:
    """Where ``sql``'s ``/`` operators are (not ``//``, nor a ``/`` in a string, a quoted
    name or a comment): (start, stop) each."""
    from ._paramtypes import _tokens

    toks = _tokens(sql)
    return [(t.start, t.stop) for i, t in enumerate(toks) if t.kind == "op" and t.text == "/"
            and not (i > 0 and toks[i - 1].text == "/" and toks[i - 1].stop == t.start)
            and not (i + 1 < len(toks) and toks[i + 1].text == "/"
                     and t.stop == toks[i + 1].start)]


def _slash_divisions(sql: str) -> int:
    """How many ``/`` operators ``sql`` has (:func:`_slashes`)."""
    return len(_slashes(sql))


#: a statement whose text cryptdisk's catalog keeps as written (a view)
_CREATE_VIEW = re.compile(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?VIEW\b",
                          re.IGNORECASE)


def _integer_slashes(sql: str) -> str:
    """``sql`` with each ``/`` operator as ``//``: what the server's ``/`` is
    (integer_division), spelt so that it reads so without that setting too."""
    out, pos = [], 0
    for start, stop in _slashes(sql):
        out.append(sql[pos:start])
        out.append("//")
        pos = stop
    out.append(sql[pos:])
    return "".join(out)


_NO_TABLE = re.compile(r"no table (['\"])(.*)\1 in .* \(tables: ", re.S)


def statement_error(exc: Exception) -> StatementError:
    """The engine's error as a StatementError with the closest SQLSTATE."""
    if isinstance(exc, StatementError):
        return exc
    if _openfiles.out_of_files(exc):  # (a file other than a part's: a log, DuckDB's own)
        return StatementError(_openfiles.message("for the statement", exc),
                              _openfiles.SQLSTATE, hint=_openfiles.HINT)
    if isinstance(exc, AuthenticationError):
        return StatementError(str(exc), "XX001")  # data_corrupted
    if isinstance(exc, TableNotFoundError):
        # the embedded message names the database's path and lists every table: over the
        # wire, a user granted a name no table has would learn the others' names
        missing = _NO_TABLE.match(str(exc))
        if missing is not None:
            name = missing[2].replace('"', '""')
            return StatementError(f'relation "{name}" does not exist', "42P01")
        return StatementError(str(exc), "42P01")
    if isinstance(exc, FieldPolicyError):  # (a role's DELETE or UPDATE: 42501)
        return StatementError(str(exc), exc.sqlstate, hint=exc.hint)
    if isinstance(exc, DatabaseError):
        text = str(exc)
        if "too many open files" in text.lower():  # (a part's open, or DuckDB's IO Error)
            return StatementError(text, _openfiles.SQLSTATE, hint=exc.hint or _openfiles.HINT)
        if isinstance(exc, NotSupportedError) or "append-only" in text \
                or "not supported" in text:
            return StatementError(text, "0A000", hint=exc.hint)
        if "can only create an index on a base table" in text:
            return StatementError(
                "CREATE INDEX is not supported: the analytical engine's tables have no "
                "indexes", "0A000",
                hint="a table's ORDER BY (CREATE TABLE ... ORDER BY) sorts its parts, and a "
                "query skips the parts its WHERE rules out; pandas: to_sql(..., index=False)")
        if text.startswith(("cannot read '", 'cannot read "')):  # cryptdisk's own parser
            return StatementError(text, "42601", hint=exc.hint)
        if _DIVISION_BY_ZERO in text:  # (DuckDB's names the expression, and a setting)
            return StatementError("division by zero", "22012")
        if _DUPLICATE.search(text.split("\n", 1)[0]):
            return StatementError(text, "42P07", hint=exc.hint)
        code = _duckdb_sqlstate(text)
        if code == "57014":  # DuckDB's "INTERRUPT Error: Interrupted!", said as PostgreSQL does
            return _cancelled()
        typing = _type_error(text)
        if typing is not None:
            return typing
        return StatementError(text, code, hint=exc.hint)
    if isinstance(exc, apsw.Error):
        text = str(exc)
        prefix = type(exc).__name__ + ": "
        text = text[len(prefix):] if text.startswith(prefix) else text
        code = "XX000"
        if isinstance(exc, apsw.ConstraintError):
            code = next((c for word, c in (("UNIQUE", "23505"), ("FOREIGN KEY", "23503"),
                                            ("NOT NULL", "23502"), ("CHECK", "23514"))
                         if word in text), "23000")
        elif isinstance(exc, apsw.BusyError | apsw.LockedError):
            code = "55P03"
        elif isinstance(exc, apsw.ReadOnlyError):  # (a file or directory not writable)
            code = "25006"
        elif isinstance(exc, apsw.AuthError):
            code, text = "42501", "permission denied (" + text + ")"
        elif isinstance(exc, apsw.InterruptError):
            code, text = "57014", "canceling statement due to user request"
        elif isinstance(exc, apsw.SQLError):
            code = ("42P01" if "no such table" in text
                    else "42703" if "no such column" in text or "has no column named" in text
                    else "42P07" if _DUPLICATE.search(text)
                    else "42601" if "values were supplied" in text
                    else "42883" if "no such function" in text
                    or "wrong number of arguments to function" in text
                    else "42601" if "syntax error" in text or "incomplete input" in text
                    else "3B001" if "no such savepoint" in text
                    else "42702" if "ambiguous column name" in text else "42000")
            if text == "integer overflow":  # (abs(), sum() of int8s past its range)
                code, text = "22003", "bigint out of range"
        elif isinstance(exc, apsw.MismatchError | apsw.RangeError | apsw.TooBigError):
            code = "22000"
        elif isinstance(exc, apsw.BindingsError):
            counts = re.search(r"uses (\d+) and there are (\d+) supplied", text)
            if counts is not None:  # as PostgreSQL words both cases
                uses, given = int(counts[1]), int(counts[2])
                if given < uses:
                    return StatementError(f"there is no parameter ${given + 1}", "42P02")
                return StatementError(f"bind message supplies {given} parameters, but the "
                                      f"statement requires {uses}", "08P01")
        return StatementError(text, code)
    if isinstance(exc, CryptdiskError):
        return StatementError(str(exc), "XX000", hint=exc.hint)
    if isinstance(exc, UnicodeDecodeError):  # SQLite's text of bytes that are no UTF-8
        byte = exc.object[exc.start:exc.start + 1].hex()
        return StatementError(
            f'invalid byte sequence for encoding "UTF8": 0x{byte}', "22021",
            hint="SQLite's || makes text of a bytea's bytes where the server cannot tell "
            "the operands' types: cast the bytea operands (x::bytea), or join "
            "encode(b, 'hex')")
    log.error("internal error", exc_info=exc)  # a bug: its traceback for the operator
    return StatementError(f"internal error: {type(exc).__name__}", "XX000")


def _is_uuid(declared: str) -> bool:
    """Whether a column's declared type (the analytical catalog's) is UUID."""
    return declared.strip().upper() == "UUID"


def _arrow_type(oid: int) -> Any:
    """The Arrow type binary COPY's values of type ``oid`` are handed to the database in
    (it casts them to the column's type); text for the types without one here."""
    import pyarrow as pa

    return {_types.BOOL: pa.bool_(), _types.INT2: pa.int64(), _types.INT4: pa.int64(),
            _types.INT8: pa.int64(), _types.OID: pa.int64(), _types.FLOAT4: pa.float64(),
            _types.FLOAT8: pa.float64(), _types.BYTEA: pa.binary(), _types.DATE: pa.date32(),
            _types.TIMESTAMP: pa.timestamp("us"),
            _types.TIMESTAMPTZ: pa.timestamp("us", tz="UTC"),
            _types.TIME: pa.time64("us")}.get(oid, pa.string())


def _arrow_column(values: list[Any], kind: Any, before: int) -> Any:
    """A column for :meth:`_AnalyticalSession.copy_in` of Arrow type ``kind``: text, or
    binary COPY's values (:func:`_arrow_type`); ``before``: the rows of earlier batches."""
    import pyarrow as pa

    if kind == pa.string():
        return pa.array([v if v is None or isinstance(v, str) else _types._text(v)
                         for v in values], pa.string())
    try:
        return pa.array(values, kind)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise StatementError(f"COPY binary data: rows {before + 1}-{before + len(values)}: "
                             f"{exc}", "22P03") from None


class _Turns:
    """Who uses the analytical database: queries (``shared``: each on its session's own
    :class:`cryptdisk.db.Reader`) run side by side; any other statement (a write, DDL,
    ``SET``, the server's own work) runs alone, on the database's connection. Sessions
    take turns in the order they asked (queries that come one after the other enter
    together; a query behind a waiting writer waits for it), and a session's
    :meth:`_AnalyticalSession.interrupt` (a CancelRequest, its statement timeout) ends
    its wait at once (57014), without the turn.

    An interrupt reaches the connection (or reader) of the session that asked for it, and
    only while that session holds the turn: it is sent under the same lock that hands the
    turns out."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._waiting: collections.deque[tuple[object, bool]] = collections.deque()
        self._holders: dict[object, bool] = {}  # holder -> shared

    def _may_enter(self, entry: tuple[object, bool]) -> bool:
        return self._waiting[0] is entry and (
            not self._holders or (entry[1] and all(self._holders.values())))

    @contextlib.contextmanager
    def turn(self, session: _AnalyticalSession | None = None,
             shared: bool = False) -> Iterator[None]:
        """Hold a turn (``shared``: a query's); ``session``'s cancel ends the wait (None: the
        server's own work, which waits until its turn comes)."""
        me = session if session is not None else object()
        entry = (me, shared)
        with self._cond:
            self._waiting.append(entry)
            try:
                while not self._may_enter(entry):
                    if session is not None and session._cancel.is_set():
                        raise _cancelled()
                    self._cond.wait()
                if session is not None and session._cancel.is_set():
                    raise _cancelled()  # cancelled as the turn came: never starts
            except BaseException:
                self._waiting.remove(entry)
                self._cond.notify_all()  # the next in line may be first now
                raise
            self._waiting.popleft()
            self._holders[me] = shared
            self._cond.notify_all()  # a query next in line enters beside this one
        try:
            yield
        finally:
            with self._cond:
                del self._holders[me]
                self._cond.notify_all()

    @property
    def held(self) -> bool:
        """Whether a statement (or the server's own work) holds a turn."""
        with self._cond:
            return bool(self._holders)

    @property
    def running(self) -> int:
        """How many hold a turn."""
        with self._cond:
            return len(self._holders)

    @property
    def waiting(self) -> int:
        """How many wait for their turn."""
        with self._cond:
            return len(self._waiting)

    def interrupt(self, session: _AnalyticalSession, stop: Callable[[bool], None]) -> None:
        """``session``'s cancel is set: wake it if it waits; ``stop(shared)`` if it holds a
        turn."""
        with self._cond:
            shared = self._holders.get(session)
            if shared is not None:
                stop(shared)
            self._cond.notify_all()


@contextlib.contextmanager
def _exact_division(con: Any) -> Iterator[None]:
    """``integer_division`` off on DuckDB connection ``con`` meanwhile, then as it was
    (on DuckDB's connection itself: see :class:`AnalyticalEngine`)."""
    from ..db import scalar

    before = str(scalar(con, "SELECT current_setting('integer_division')")).lower()
    con.execute("SET SESSION integer_division = false")
    try:
        yield
    finally:
        con.execute(f"SET SESSION integer_division = {'true' if before == 'true' else 'false'}")


#: ``SET [SESSION|LOCAL|GLOBAL] name`` / ``RESET [...] name``: the setting's name
_SET_NAME = re.compile(r"\s*(?:SET|RESET)\s+(?:(?:SESSION|LOCAL|GLOBAL)\s+)?"
                       r"(\"[^\"]+\"|[A-Za-z_][A-Za-z0-9_]*)", re.I)


def _set_names(statements: list[str]) -> set[str]:
    """The names (lower case) of the settings ``statements`` (SET and RESET) set."""
    names = set()
    for text in statements:
        m = _SET_NAME.match(text)
        if m:
            names.add(m[1].strip('"').lower())
    return names


def _setting_values(con: Any, names: set[str]) -> dict[str, str | None]:
    """DuckDB's settings ``names`` (lower case) on connection ``con``: name -> value."""
    rows = con.execute("SELECT name, value FROM duckdb_settings() "
                       "WHERE list_contains(?, lower(name))", [sorted(names)]).fetchall()
    return {str(n): (None if v is None else str(v)) for n, v in rows}


def _variables(con: Any) -> list[tuple[str, str | None, str]]:
    """DuckDB's variables (``SET VARIABLE``) on connection ``con``: (name, value as text,
    type), which ``CAST(value AS type)`` makes again."""
    rows = con.execute("SELECT name, value, type FROM duckdb_variables()").fetchall()
    return [(str(n), None if v is None else str(v), str(t)) for n, v, t in rows]


def _literal(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


class _AnalyticalSession(EngineSession):
    invoker_views = True  # (a statement is checked with its views written out: _views)
    streams = True

    def __init__(self, engine: AnalyticalEngine) -> None:
        self.engine = engine
        #: set by :meth:`interrupt`: ends this session's wait for its turn, or its statement
        self._cancel = threading.Event()
        self._reader: Any = None  # its queries' cryptdisk.db.Reader, made at the first
        self._settings: list[str] = []  # its SET and RESET statements, in order
        self._variables = False  # it has run a SET (or RESET) VARIABLE, on its reader
        self._configuring = False  # a SET runs on its reader's cursor, alone
        self.privileges: Any = None
        self._parser: Any = None
        self.recording = False
        self.last_tables = set()
        self.revealed: list[str] = []  # columns the last statement read through a policy
        self._rewrote = False  # the last statement runs as the policies rewrote it
        #: the text that revealed them when it is not the statement's own (a DELETE's or
        #: UPDATE's query of its table, see _execute)
        self.audited: str | None = None
        #: in a transaction block (BEGIN ... COMMIT), which holds queries only: see
        #: :meth:`_block_statement`
        self.block = False
        #: the streams of its queries still open (closed with the session), and the one
        #: whose batch is being computed (what a cancel interrupts)
        self._streams: set[Any] = set()
        self._pulling: Any = None

    @property
    def in_transaction(self) -> bool:
        return self.block

    def _block_statement(self, words: list[str]) -> Result:
        """BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE. The analytical engine commits every
        statement as it runs and cannot undo one, so a transaction block holds queries only
        (each sees what was committed when it starts, as PostgreSQL's READ COMMITTED): with
        no write in it, COMMIT and ROLLBACK (to a savepoint too) are both true. Drivers that
        open a transaction before the first statement (psycopg and pg8000 without
        autocommit, SQLAlchemy, pandas) can read; a write in the block is refused (0A000)."""
        head = words[0]
        if head in ("BEGIN", "START"):
            self.block = True
            return Result(None, [], "BEGIN")
        to_savepoint = head in ("ROLLBACK", "ABORT") and "TO" in words[1:3]
        if head in ("SAVEPOINT", "RELEASE") or to_savepoint:
            if not self.block:
                raise StatementError(f"{head} can only be used in transaction blocks", "25P01")
            return Result(None, [], head if head != "ABORT" else "ROLLBACK")
        self.block = False
        return Result(None, [], "COMMIT" if head in ("COMMIT", "END") else "ROLLBACK")

    def _refuse_in_block(self) -> None:
        raise StatementError(
            "the analytical engine commits each write as it runs and cannot roll it back: "
            "a transaction block holds queries only", "0A000",
            hint="COMMIT or ROLLBACK first, and write in autocommit mode (psycopg: "
            "autocommit=True; SQLAlchemy: isolation_level=\"AUTOCOMMIT\"), or serve an "
            "encrypted SQLite database (cryptdisk serve --sqlite) for transactions")

    def _check_syntax(self, text: str) -> None:
        """A syntax error (42601, as outside a block) for ``text`` that DuckDB cannot
        parse, 0A000 for what its parser does not implement (``SET LOCAL``): in a
        transaction block or a read-only transaction it is no refused write."""
        import duckdb

        try:
            self._parse_connection().extract_statements(text)
        except duckdb.ParserException as exc:
            raise StatementError(str(exc), "42601") from None
        except duckdb.NotImplementedException as exc:  # (its parser's: SET LOCAL)
            raise StatementError(str(exc), "0A000") from None

    def new_statement(self) -> None:
        """A statement of this session that the server runs itself (a policy statement)
        starts: a cancel sent before it is not for it."""
        self._cancel.clear()

    @property
    def cancelled(self) -> bool:
        """Whether a CancelRequest or the statement timeout interrupted the statement."""
        return self._cancel.is_set()

    def _parse_connection(self) -> Any:
        if self._parser is None:
            from ..db import parser_cursor

            # its own connection: only parses, with DuckDB's default parser settings
            self._parser = parser_cursor(self.engine.db.con)
        return self._parser

    def set_privileges(self, privileges: Any) -> None:
        self.privileges = privileges
        self._parse_connection()

    def record_tables(self) -> None:
        self.recording = True
        self._parse_connection()

    def _table_names(self) -> list[str]:
        """The database's tables and views: ``public.t`` and ``main.t`` of these name ``t``
        (:func:`._sqltext.unqualify`), in the statement checked and the statement run."""
        catalog = self.engine.db.catalog
        return [*catalog.tables, *catalog.views]

    def _checked_views(self, text: str) -> tuple[str, dict[str, str | None]]:
        """What the grant check looks at: ``text`` with the views of invoker rights written
        out and those of their owner's rights left as named, and those (lower-case name
        -> owner): reading one needs SELECT on it, and its owner still an admin."""
        db = self.engine.db
        owners = {name.lower(): meta.owner for name, meta in db.catalog.views.items()
                  if not meta.security_invoker}
        if not owners:
            return self._without_views(text), owners
        try:
            return str(db.expand_views(text, self._parse_connection(), keep=True)), owners
        except Exception as exc:
            raise statement_error(exc) from None

    def _without_views(self, text: str) -> str:
        """``text`` with the views it reads written out as their queries (see
        ``cryptdisk.db._views``): the grant check and the policies see the tables a view
        reads, as the database reads them (views have the rights of their reader)."""
        db = self.engine.db
        if not db.catalog.views:
            return text
        try:
            return str(db.expand_views(text, self._parse_connection()))
        except Exception as exc:
            raise statement_error(exc) from None

    def _sql(self, sql: str, params: list[Any]) -> str:
        def lit(n: int) -> str:
            if n < 1 or n > len(params):
                raise StatementError(f"there is no parameter ${n}", "42P02")
            return sql_literal(params[n - 1])

        sql = postgres_spelling(sql, _DUCKDB_QUOTE_LITERAL, _duckdb_blob)
        text = _sqltext.unqualify(_sqltext.substitute(sql, lit), self._table_names)
        checked, owners = self._checked_views(text) if self.privileges is not None \
            and not self.privileges.admin else (text, {})
        text = self._without_views(text)
        if self.privileges is not None and not self.privileges.admin \
                and _SHOW_TABLES.fullmatch(text):
            text = checked = self._show_tables(self.privileges)
        if self.block or self.read_only:
            from ..db import Reader
            from ._grants import sets_own_setting

            # (a session's own setting writes nothing: any session may change it, as in
            # PostgreSQL; in a block, a ROLLBACK would not undo DuckDB's)
            if not Reader.runs(text) and (self.block or not sets_own_setting(text)):
                self._check_syntax(text)  # a statement that does not parse: 42601
                if self.read_only:
                    raise read_only_error(sql)
                self._refuse_in_block()
        self._rewrote = False
        if self.privileges is not None:
            self.privileges.check_analytical(checked if owners else text, self._parser,
                                             owners)
            if owners and checked != text:  # the functions of the views' queries too
                self.privileges.check_analytical(text, self._parser, reads=False)
            if self.engine.policies is not None:  # masking and row access (._policies)
                asked = text
                text, self.revealed = self.engine.policies.rewrite(
                    text, self.privileges, self._parser, waiter=self)
                self._rewrote = text != asked
        if self.recording:
            from ._grants import query_references

            found = query_references(text, self._parser)
            if found is not None:
                self.last_tables = {t.lower() for t in found[0]}
            else:
                m = re.match(r"\s*(?:INSERT\s+INTO|DELETE\s+FROM|UPDATE|"
                             r"CREATE\s+TABLE(?:\s+IF\s+NOT\s+EXISTS)?|"
                             r"DROP\s+TABLE(?:\s+IF\s+EXISTS)?|TRUNCATE(?:\s+TABLE)?|"
                             r"OPTIMIZE\s+TABLE)\s+([A-Za-z_][\w.]*)", text, re.I)
                self.last_tables = {m[1].lower()} if m else set()
        return text

    def _show_tables(self, privileges: Any) -> str:
        """``SHOW TABLES`` of a user that is not an admin: the tables and views it may
        read, as its ``information_schema.tables`` lists them (not every name)."""
        catalog = self.engine.db.catalog

        def readable_view(name: str) -> bool:  # (a view takes no grant: its tables do)
            try:
                self.authorize(f"SELECT * FROM {_quote(name)}", privileges)  # noqa: S608 (quoted)
            except StatementError:
                return False
            return True

        names = sorted([*(n for n in catalog.tables if privileges.allowed(n, "SELECT")),
                        *(n for n in catalog.views if readable_view(n))])
        if not names:
            return "SELECT NULL::VARCHAR AS name WHERE false"
        rows = ", ".join(f"({sql_literal(n)})" for n in names)
        return f"SELECT name FROM (VALUES {rows}) AS t(name) ORDER BY name"  # noqa: S608 (literals)

    def authorize(self, sql: str, privileges: Any) -> None:
        if privileges.admin:
            return
        words = _sqltext.first_words(sql, 1)
        if words and words[0] in TRANSACTION_WORDS:
            return  # refused when it runs, whoever runs it
        text = _sqltext.unqualify(_sqltext.substitute(
            postgres_spelling(sql, _DUCKDB_QUOTE_LITERAL, _duckdb_blob), lambda n: "NULL"),
            self._table_names)
        checked, owners = self._checked_views(text)
        text = self._without_views(text)
        con = self._parse_connection()
        self._cancel.clear()  # a cancel sent before this check is not for it
        privileges.check_analytical(checked, con, owners)
        if owners and checked != text:
            privileges.check_analytical(text, con, reads=False)
        if self.engine.policies is not None:
            self.engine.policies.rewrite(text, privileges, con, waiter=self)

    def run(self, sql: str, params: list[Any]) -> Result:
        self._cancel.clear()  # a cancel sent before this statement is not for it
        self.revealed, self.audited = [], None
        words = _sqltext.first_words(sql, 3)
        if words and words[0] in TRANSACTION_WORDS:
            return self._block_statement(words)
        text = self._sql(sql, params)
        try:  # in its turn (see _Turns): an interrupt reaches this session's statement only
            if words[1:2] == ["TABLE"] and words[0] in ("ALTER", "CREATE", "DROP"):
                table = self._alter(text)
            elif "VIEW" in words[1:3] and words[0] in ("ALTER", "CREATE", "DROP"):
                table, text = self._view_change(text)
            else:
                table, text = self._execute_lengths(text)
        except StatementError:
            raise
        except Exception as exc:
            err = statement_error(exc)
            if self._rewrote:  # DuckDB quotes the text it ran: the policies' rewrite
                err = _policy_failure(_without_context(err), sql)
            raise err from None
        policies = self.engine.policies
        if policies is not None and policies.audit is not None:
            count = table.num_rows if table is not None else None
            if table is not None and table.num_columns == 1 and table.num_rows == 1 and \
                    table.schema[0].name.lower() == "count" and \
                    (_sqltext.first_words(sql, 1) or [""])[0] not in _ROWS:
                count = table.column(0)[0].as_py()  # rows an INSERT wrote
            policies.record(self.audited or text, self.privileges, self.revealed, count,
                            self._parse_connection())
        if table is None or (words and words[0] in ("SET", "RESET") and table.num_rows == 0):
            return Result(None, [], command_tag(sql, None, False))  # (DuckDB's "Success")
        columns = self._columns(text, table.schema)
        from ._resultrows import result_rows  # (db imported when a DuckDB engine is used)

        rows = result_rows(_types.exact_result(table, self._wide_kinds(text, table)))
        returns_rows = (_sqltext.first_words(sql, 1) or [""])[0] in _ROWS
        if not returns_rows and len(columns) == 1 and columns[0][0].lower() == "count":
            count = rows[0][0] if rows else 0
            return Result(None, [], command_tag(sql, count, False))
        return Result(columns, rows, command_tag(sql, len(rows), True))

    def run_stream(self, sql: str, params: list[Any]) -> Result:
        """:meth:`run` of a query as a stream of its rows (:mod:`._rowstream`): started on
        this session's reader (which the stream keeps until it ends: another statement
        meanwhile gets a new one), read batch by batch in the session's turns. A statement
        that is not a plain query, or a session with ``SET VARIABLE`` values (a new
        reader would not have them), runs as :meth:`run` does."""
        words = _sqltext.first_words(sql, 1)
        if not words or words[0] not in _STREAMED or self._variables:
            return self.run(sql, params)
        from ..db import Reader
        from ._rowstream import BATCH_ROWS, RowStream

        self._cancel.clear()
        self.revealed, self.audited = [], None
        policies, privileges = self.engine.policies, self.privileges
        parser = self._parse_connection() if policies is not None and \
            policies.audit is not None else None
        try:
            text = self._sql(sql, params)
            if not Reader.runs(text) or \
                    (_sqltext.first_words(text, 1) or [""])[0] not in _STREAMED:
                return self.run(sql, params)
            revealed, audited = self.revealed, self.audited
            # its start and first 2 x BATCH_ROWS rows in one turn (a query beside the others,
            # as run's) and this one hop to the session's thread: a result they hold whole
            # (most queries') goes out as run's does
            audit_at_end = [parser is not None]
            with self.engine.turn(self, shared=True):
                stream, reader = self._start_stream(text)

                def on_end(count: int) -> None:
                    self._streams.discard(rows)
                    self._give_back(reader)
                    if audit_at_end[0]:
                        policies.record(audited or text, privileges, revealed, count, parser)

                rows = RowStream(self, stream, lambda n: command_tag(sql, n, True), on_end)
                self._streams.add(rows)
                # (at least 2 x BATCH_ROWS rows: batches may be as small as a row group)
                held: list[tuple[Any, ...]] = []
                while len(held) < 2 * BATCH_ROWS:
                    got = rows.next_rows(in_turn=True)
                    if got is None:
                        break
                    held += got
        except StatementError:
            raise
        except Exception as exc:
            if _NO_INTEGER_DIVISION in str(exc) or "'length(BLOB)'" in str(exc):
                return self.run(sql, params)  # (refused as it bound: nothing ran)
            err = statement_error(exc)
            if self._rewrote:
                err = _policy_failure(_without_context(err), sql)
            raise err from None
        try:
            columns = self._columns(text, _types.lossy_schema(stream.schema))
        except BaseException:
            rows.close()
            raise
        if rows.closed:
            return Result(columns, held, rows.tag)
        if audit_at_end[0]:
            # its rows go out before it ends (a portal may stay suspended, the server may
            # be killed meanwhile): the audit line is written now, before any, its count
            # unknown (null); failing, the statement fails with no row sent, as run's
            audit_at_end[0] = False
            try:
                policies.record(audited or text, privileges, revealed, None, parser)
            except BaseException:
                rows.close()
                raise
        rows.pending = held
        return Result(columns, [], "", rows)

    def _start_stream(self, text: str) -> tuple[Any, Any]:
        """DuckDB's streaming result of query ``text`` on this session's reader (the caller
        holds its turn), and the reader: the stream's until it ends (:meth:`_give_back`)."""
        from ._rowstream import BATCH_ROWS

        reader = self._reader
        if reader is None:
            reader = self._new_reader()
            for setting in self._settings:
                reader.configure(setting)
        self._reader = None  # (a statement meanwhile gets a reader of its own)
        try:
            self._pulling = reader
            try:
                stream = reader.stream(text, batch_rows=BATCH_ROWS)
            finally:
                self._pulling = None
        except BaseException:
            self._give_back(reader)
            raise
        return stream, reader

    def _give_back(self, reader: Any) -> None:
        """A stream's reader, free again: this session's reader, unless it has another."""
        if self._reader is None and not getattr(self, "_closed", False):
            self._reader = reader
        else:
            reader.close()

    def _wide_kinds(self, text: str, table: Any) -> list[str] | None:
        """The DuckDB types of query ``text``'s columns when its result ``table`` has a
        ``DECIMAL(38,0)`` column (which may be a ``UHUGEINT`` that DuckDB's Arrow export
        wraps: see :func:`._types.exact_result`), else None."""
        if not any(_types.has_wide(f.type) for f in table.schema):
            return None
        try:
            described = self._execute(f"DESCRIBE {text}")
        except Exception:  # (a statement DESCRIBE does not take: none is a UHUGEINT)
            return None
        if described is None or "column_type" not in described.column_names:
            return None
        return [str(k) for k in described.column("column_type").to_pylist()]

    def describe(self, sql: str) -> list[tuple[str, int]] | None:
        words = _sqltext.first_words(sql, 1)
        if not words or words[0] not in _ROWS:
            return None
        self._cancel.clear()
        nulls = [None] * _sqltext.placeholders(sql)
        try:
            text = self._sql(sql, nulls)
            query = f"SELECT * FROM ({text}) AS __cd_describe LIMIT 0"  # noqa: S608
            table, query = self._execute_lengths(query)
            if table is None:
                return None
            return self._columns(text, table.schema)
        except Exception:
            if self._cancel.is_set():  # cancelled or timed out, waiting or running: 57014
                raise _cancelled() from None
            return None  # a statement that fails says so when it runs

    def _new_reader(self) -> Any:
        """A reader of the database for this session's queries, whose results come as
        DuckDB's lossless Arrow export gives them (``arrow_lossless``): a ``TIME WITH TIME
        ZONE`` with its offset, which the default export drops. :meth:`_execute`, the
        streams (:mod:`._rowstream`) and :meth:`describe` read them through
        :func:`._types.lossy_result`."""
        reader = self.engine.db.reader()
        reader.arrow_lossless = True
        return reader

    def _columns(self, text: str, schema: Any) -> list[tuple[str, int]]:
        """The (name, type OID) of each column of query ``text``'s result (Arrow
        ``schema``, of :func:`._types.lossy_result`): timetz (1266) for a ``TIME WITH TIME
        ZONE``'s text, timetz[] (1270) for a list of them, uuid for a UUID's (:meth:`_uuids`)."""
        columns = self._uuids(text, [(f.name, _types.arrow_oid(f.type)) for f in schema])
        return [(n, _types.TIMETZ if _types.zoned_field(f) else
                 _types.TIMETZ_ARRAY if _types.zoned_list(f.type) else o)
                for (n, o), f in zip(columns, schema, strict=True)]

    def _uuids(self, text: str, columns: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """``columns`` (the query ``text``'s result, whose UUIDs Arrow holds as text) with
        uuid (2950) for each that is one: a UUID value of DuckDB's (a cast,
        ``gen_random_uuid()``), which DuckDB's ``DESCRIBE`` names, or a select item naming a
        table's UUID column (held as text, so DuckDB reads it as VARCHAR)."""
        if not any(oid == _types.TEXT for _, oid in columns):
            return columns
        lower = text.lower()
        declared = {name: names for name, names in self._uuid_tables().items()
                    if re.search(rf"\b{re.escape(name)}\b", lower)}  # those it names
        if "uuid" not in lower and not declared:
            return columns
        oids = [oid for _, oid in columns]
        if "uuid" in lower:
            described = self._execute(f"DESCRIBE {text}")
            kinds = described.column("column_type").to_pylist() if described is not None else []
            if len(kinds) == len(oids):
                oids = [_types.UUID if o == _types.TEXT and k == "UUID" else o
                        for o, k in zip(oids, kinds, strict=True)]
        if declared:
            oids = self._uuid_items(text, columns, oids, set().union(*declared.values()))
        return [(name, oid) for (name, _), oid in zip(columns, oids, strict=True)]

    def _uuid_tables(self) -> dict[str, set[str]]:
        """The tables with UUID columns (lower-case name -> those columns, lower-cased),
        worked out once per catalog version and kept on the engine."""
        catalog = self.engine.db.catalog
        cached = self.engine.uuid_tables
        if cached is not None and cached[0] is catalog and cached[1] == catalog.version:
            return cached[2]  # (the catalog itself is kept: an id may be reused)
        found = {}
        for name, meta in list(catalog.tables.items()):
            names = {c.lower() for c, t in meta.columns if _is_uuid(t)}
            if names:
                found[name.lower()] = names
        self.engine.uuid_tables = (catalog, catalog.version, found)
        return found

    def _uuid_items(self, text: str, columns: list[tuple[str, int]], oids: list[int],
                    uuid_columns: set[str]) -> list[int]:
        """``oids`` with uuid where the query's select item is a column reference to one of
        ``uuid_columns``, or a lone ``*`` gives a column of that name (DuckDB's parser)."""
        import json

        try:
            con = self._parse_connection()
            parsed = json.loads(con.execute("SELECT json_serialize_sql(?)",
                                            [text]).fetchall()[0][0])
            items = parsed["statements"][0]["node"]["select_list"]
        except Exception:
            return oids  # (a statement whose select list DuckDB's parser does not show)
        if len(items) == 1 and items[0].get("class") == "STAR":
            return [_types.UUID if o == _types.TEXT and name.lower() in uuid_columns else o
                    for (name, _), o in zip(columns, oids, strict=True)]
        if len(items) != len(oids):
            return oids
        return [_types.UUID if o == _types.TEXT and item.get("class") == "COLUMN_REF"
                and str(item["column_names"][-1]).lower() in uuid_columns else o
                for item, o in zip(items, oids, strict=True)]

    def _alter(self, text: str) -> Any:
        """Run ``CREATE``, ``DROP`` or ``ALTER TABLE``: it holds the policy store's lock
        (the database changes the policy file: a rename carries a table's policies, a drop
        removes them, a new table's name loses what a crash left on it; the store reads the
        file again after). A renamed table's grants follow it (given to the new name
        before the catalog's commit, removed from the old after, as a view's:
        :meth:`_view_change`); a dropped table's are removed before the catalog's commit
        (a crash between leaves the table without them, never a later table of its name
        with them) and given back if it fails; a new name loses the grants a crash left
        on it (:meth:`_forget_stale_grants`). One such statement runs at a time
        (:meth:`_naming`)."""
        from ..db import table_statement

        st = table_statement(text)
        policies = self.engine.policies
        if st is None:
            return self._execute(text)
        store = getattr(self.privileges, "store", None)
        action = getattr(st, "action", None)
        dropping = type(st).__name__ == "DropTable"
        with self._naming(), \
                policies.changing() if policies is not None else contextlib.nullcontext():
            before = self.engine.db.catalog.tables.name(st.name)
            removed: dict[str, list[str]] = {}
            copied = None
            if dropping and store is not None and before is not None:
                removed = store.drop_table_grants(before)
            elif store is not None:
                made = st.new_name if action == "rename" else \
                    None if action is not None else st.name
                self._forget_stale_grants(store, made)
                if action == "rename" and before is not None and made \
                        and not self._takes_grants(made):
                    store.copy_table_grants(before, made)
                    copied = made
            try:
                result = self._execute(text)
            except BaseException:
                if removed and store is not None and before is not None and \
                        self.engine.db.catalog.tables.name(before) is not None:
                    for name, actions in removed.items():
                        store.change_grants([name], [before.lower()], actions, grant=True)
                if copied is not None and store is not None \
                        and not self._takes_grants(copied):
                    store.drop_table_grants(copied)
                raise
            if copied is not None and store is not None and before is not None \
                    and not self._takes_grants(before):
                store.drop_table_grants(before)
        return result

    def _view_change(self, text: str) -> tuple[Any, str]:
        """Run ``CREATE``, ``DROP`` or ``ALTER VIEW``. The grants on a view with its
        owner's rights follow it, so that a crash at any point leaves the old grants or
        the new ones and never a grant on an object it was not given on: a rename gives
        the new name the old one's grants before the catalog's commit and removes the old
        name's after it; a view that stops having its owner's rights (dropped, replaced by
        a view of invoker rights, ``SET (security_invoker = true)``) loses them after it.
        What a crash leaves on a name no table or such view has is inert (no check reads
        it), removed when the server starts, and before any statement gives the name to a
        view with its owner's rights (:meth:`_forget_stale_grants`). One such statement
        runs at a time (:meth:`_naming`)."""
        store = getattr(self.privileges, "store", None)
        if store is None:
            return self._execute_lengths(text)
        with self._naming():
            return self._view_change_named(text, store)

    def _view_change_named(self, text: str, store: Any) -> tuple[Any, str]:
        from ..db import parse_view_statement

        try:
            st = parse_view_statement(text)
        except Exception:
            st = None  # (its run says what is wrong with it)
        before = self.owner_views()
        kind = type(st).__name__
        copied = None
        if kind in ("CreateView", "SetView") and not getattr(st, "security_invoker", True):
            self._forget_stale_grants(store, st.name)  # type: ignore[union-attr]
        elif kind == "AlterView" and st.name.lower() in before:  # type: ignore[union-attr]
            new = st.new_name  # type: ignore[union-attr]
            self._forget_stale_grants(store, new)
            if not self._takes_grants(new):
                store.copy_table_grants(st.name, new)  # type: ignore[union-attr]
                copied = new
        try:
            result = self._execute_lengths(text)
        except BaseException:
            if copied is not None and not self._takes_grants(copied):
                store.drop_table_grants(copied)
            raise
        for name in sorted(before - self.owner_views()):
            if not self._takes_grants(name):
                store.drop_table_grants(name)
        return result

    @contextlib.contextmanager
    def _naming(self) -> Iterator[None]:
        """Hold the engine's :attr:`AnalyticalEngine.naming` lock: one statement at a time
        moves grants to a name, removes them from one, and commits. Else a rename that
        gave its new name the grants before queueing for its turn, queued behind a CREATE
        of that name, failed after the CREATE's commit and left the grants on the new
        table or view. This session's cancel ends the wait (57014)."""
        lock = self.engine.naming
        while not lock.acquire(timeout=0.05):
            if self._cancel.is_set():
                raise _cancelled()
        try:
            yield
        finally:
            lock.release()

    def _takes_grants(self, name: str) -> bool:
        """A table or a view with its owner's rights has ``name``: grants on it are its."""
        return self.engine.db.catalog.tables.name(name) is not None or \
            name.lower() in self.owner_views()

    def _forget_stale_grants(self, store: Any, name: str | None) -> None:
        """Remove the grants on ``name`` when no table or owner-rights view has it, before
        a statement gives it to one: grants a crash left there (a drop or rename killed
        after the catalog's commit) never reach a new table or view of that name."""
        if name and not self._takes_grants(name) and store.granted_on(name):
            store.drop_table_grants(name)

    def _execute_lengths(self, text: str) -> tuple[Any, str]:
        """:meth:`_execute` of ``text``, and the text it ran: where DuckDB finds no
        ``length()`` of a bytea (its length has no BLOB form), once more with each
        ``length(x)`` as PostgreSQL's: the bytes of a bytea, else the characters
        (:func:`_pg_length`); where it finds no ``//`` for a ``/`` (``interval / 2``:
        see :class:`AnalyticalEngine`), once more with ``/`` read as DuckDB's exact
        division. DuckDB refuses the statement as it binds it, before it runs, so
        nothing ran twice."""
        if _CREATE_VIEW.match(text) and _slashes(text) and self._divides_integers():
            # cryptdisk's catalog keeps a view's text, which the Python API reads without
            # the server's integer_division: its / as the // the server reads (an
            # interval's /, which has no //, as written)
            stored = _integer_slashes(text)
            try:
                return self._execute(stored), stored
            except Exception as exc:
                if _NO_INTEGER_DIVISION not in str(exc):
                    raise
        try:
            return self._execute(text), text
        except Exception as exc:  # (the engine's DatabaseError, of DuckDB's binder's)
            if _NO_INTEGER_DIVISION in str(exc):
                if _slash_divisions(text) > 1:  # (exact division would reach them all)
                    raise StatementError(
                        "the analytical engine divides an interval only in a statement "
                        "with no other /", "0A000",
                        hint="multiply it: interval '1 day' * 0.5") from None
                return self._execute(text, exact_division=True), text
            if "'length(BLOB)'" not in str(exc):
                raise
            rewritten = _sqltext.replace_calls(text, "length", _pg_length)
            if rewritten == text:
                raise
        return self._execute(rewritten), rewritten

    def _execute(self, text: str, exact_division: bool = False) -> Any:
        """Run ``text`` in its turn: a query on this session's reader, beside other
        sessions' queries; any other statement on the database's connection, alone.
        ``exact_division``: with ``integer_division`` off for it (``/`` as DuckDB's)."""
        from ..db import Reader

        if Reader.runs(text):
            with self.engine.turn(self, shared=True):
                if self._reader is None:  # (a cursor of the connection, made under its lock)
                    self._reader = self._new_reader()
                    for setting in self._settings:  # this session's SETs, on its cursor
                        self._reader.configure(setting)
                if exact_division:
                    with _exact_division(self._reader.con):
                        return _types.lossy_result(self._reader.execute(text))
                return _types.lossy_result(self._reader.execute(text))
        with self.engine.turn(self), contextlib.ExitStack() as stack:
            words = _sqltext.first_words(text, 2) or [""]
            if words[0] in ("SET", "RESET"):
                # On this session's reader's cursor (its queries run there), not on the
                # database's connection, where every session's writes run: a write of
                # this session has them for its run alone (_own_settings). A variable
                # (SET VARIABLE) likewise: DuckDB keeps one for each connection.
                if self._reader is None:
                    self._reader = self._new_reader()
                self._configuring = True  # (a cancel interrupts the reader: _stop)
                try:
                    self._reader.configure(text)
                finally:
                    self._configuring = False
                if words[1:] == ["VARIABLE"]:
                    self._variables = True
                else:
                    self._settings.append(text)
                return None
            stack.enter_context(self._own_settings())
            if exact_division:  # (alone on the connection: no other statement sees it)
                stack.enter_context(_exact_division(self.engine.db.con))
            target = self._insert_target(text)
            before = self._row_count(target) if target else None
            policies, privileges = self.engine.policies, self.privileges
            policy = policies.mutation_policy(privileges, self.engine.db) \
                if policies is not None and privileges is not None else None
            from ..db import mutation_policies

            self._rewrote = self._rewrote or policy is not None
            from ..db import view_owner

            # (a view made WITH (security_invoker = false) keeps its maker, the admin)
            with mutation_policies(policy), \
                    view_owner(None if privileges is None else privileges.current_user):
                result = self.engine.db.execute(text)
            if policy is not None and policy.text is not None:  # what it read, for the audit
                self.revealed, self.audited = policy.revealed, policy.text
            if target is not None and before is not None and result is None:
                import pyarrow as pa

                # the rows it wrote, for its tag (INSERT 0 n): writes run alone in their turn
                written = max(0, (self._row_count(target) or 0) - before)
                result = pa.table({"count": pa.array([written], pa.int64())})
            return result

    @contextlib.contextmanager
    def _own_settings(self) -> Iterator[None]:
        """This session's connection-local DuckDB settings (its ``SET``s, read from its
        reader's cursor) on the database's connection meanwhile, then the server's again:
        a statement that runs there alone (a write) computes as this session's queries
        do, and no other session's does. Nothing to do for a session with no ``SET``."""
        names = _set_names(self._settings)
        if (not names and not self._variables) or self._reader is None:
            yield
            return
        con = self.engine.db.con
        ours, theirs = _setting_values(self._reader.con, names), _setting_values(con, names)
        changed = {n: v for n, v in ours.items() if theirs.get(n) != v}
        variables = _variables(self._reader.con) if self._variables else []
        try:
            for name, value in changed.items():
                con.execute(f"SET SESSION {_quote(name)} = {_literal(value)}")
            for name, value, kind in variables:  # (the database's connection has none)
                con.execute(f"SET VARIABLE {_quote(name)} = CAST(? AS {kind})", [value])
            yield
        finally:
            for name, _value, _kind in variables:
                con.execute(f"RESET VARIABLE {_quote(name)}")
            for name in changed:
                con.execute(f"RESET SESSION {_quote(name)}")  # (to the server's global)
                if _setting_values(con, {name.lower()}).get(name) != theirs[name]:
                    con.execute(f"SET SESSION {_quote(name)} = {_literal(theirs[name])}")

    def _divides_integers(self) -> bool:
        """Whether this session's ``/`` is ``//`` (the server's integer_division, unless
        it SET that off)."""
        if "integer_division" not in _set_names(self._settings) or self._reader is None:
            return True
        value = _setting_values(self._reader.con, {"integer_division"}).get(
            "integer_division")
        return str(value).lower() == "true"

    @staticmethod
    def _insert_target(text: str) -> str | None:
        """The table an ``INSERT INTO t ...`` writes (None: another statement)."""
        if (_sqltext.first_words(text, 1) or [""])[0] != "INSERT":
            return None
        from ._grants import _INSERT, _table_name

        m = _INSERT.match(text)
        return _table_name(m[1]) if m else None

    def _row_count(self, table: str) -> int | None:
        tables = self.engine.db.catalog.tables
        meta = tables.get(table) or next((m for n, m in tables.items() if n.lower() == table),
                                          None)
        return None if meta is None else int(meta.rows)

    def _stop(self, shared: bool) -> None:
        if shared:
            pulling = self._pulling
            if pulling is not None:  # a stream's batch (or its start) being computed
                pulling.interrupt()
            if self._reader is not None:  # (None: the catalog's turn, or the reader's making)
                self._reader.interrupt()
        else:
            self.engine.db.interrupt()
            if self._configuring and self._reader is not None:
                self._reader.interrupt()

    def interrupt(self) -> None:
        if self.interrupt_also is not None:
            self.interrupt_also()
        self._cancel.set()
        self.engine.turns.interrupt(self, self._stop)

    def column_types(self, table: str) -> list[tuple[str, int]]:
        self._cancel.clear()
        db = self.engine.db
        # the catalog, beside queries; DuckDB names a column type that is not a plain one
        # on the database's connection, under its lock
        with self.engine.turn(self, shared=True), db._mutex:
            try:
                meta = db.table(table)
                schema = db.arrow_schema(meta)
            except Exception as exc:
                raise statement_error(exc) from None
        # a UUID column is held as text (DuckDB reads it as VARCHAR): uuid by its declaration
        return [(f.name, _types.UUID if _is_uuid(declared) else _types.arrow_oid(f.type))
                for f, (_c, declared) in zip(schema, meta.columns, strict=True)]

    def copy_in(self, table: str, columns: list[str] | None,
                batches: Iterable[list[list[Any]]], *, oids: list[int] | None = None) -> int:
        """One insert of every batch: the database reads them as an Arrow stream and
        writes parts as they come, then publishes them in one catalog commit; an error from
        ``batches`` or the insert publishes none (the parts written stay orphans, encrypted,
        that the next open removes)."""
        import pyarrow as pa

        if self.read_only:
            raise read_only_error("COPY")
        if self.block:
            self._refuse_in_block()
        if self.privileges is not None and not self.privileges.allowed(table, "INSERT"):
            raise StatementError(f"permission denied: INSERT on table {table}", "42501",
                                 hint="an admin can GRANT it")
        if self.recording:
            self.last_tables = {table.lower()}
        self._cancel.clear()
        failure: list[BaseException] = []  # what ``batches`` raised, raised again as it is
        count = 0
        with self.engine.turn(self):
            try:
                names = columns or [c for c, _ in self.engine.db.table(table).columns]
                types = [_arrow_type(o) for o in oids] if oids is not None else \
                    [pa.string()] * len(names)
                schema = pa.schema([pa.field(n, t) for n, t in zip(names, types, strict=True)])

                def arrow() -> Iterator[pa.RecordBatch]:
                    nonlocal count
                    try:
                        for rows in batches:
                            for i, row in enumerate(rows):
                                if len(row) != len(names):
                                    raise StatementError(
                                        f"COPY row {count + i + 1} has {len(row)} fields for "
                                        f"{len(names)} columns", "22P04")
                            if rows:
                                yield pa.RecordBatch.from_arrays(
                                    [_arrow_column([r[j] for r in rows], t, count)
                                     for j, t in enumerate(types)], schema=schema)
                            count += len(rows)
                            if self._cancel.is_set():  # (sent while the rows were coming)
                                raise _cancelled()
                    except BaseException as exc:
                        failure.append(exc)
                        raise

                self.engine.db.insert(table, pa.RecordBatchReader.from_batches(schema,
                                                                               arrow()))
            except Exception as exc:
                if failure and isinstance(failure[0], StatementError):
                    raise failure[0] from None
                raise statement_error(exc) from None
        return count

    def relations(self) -> list[tuple[str, str]]:
        self._cancel.clear()
        with self.engine.turn(self, shared=True):  # the catalog only: beside queries
            catalog = self.engine.db.catalog
            return sorted([(name, "r") for name in catalog.tables]
                          + [(name, "v") for name in catalog.views])

    def owner_views(self) -> set[str]:
        return {name.lower() for name, meta in self.engine.db.catalog.views.items()
                if not meta.security_invoker}

    def columns(self, name: str) -> list[tuple[str, str, bool, str | None]]:
        self._cancel.clear()
        db = self.engine.db
        view = db.catalog.views.get(name)
        if view is not None:  # its query's columns, as DuckDB binds it now
            with self.engine.turn(self):
                try:
                    described = db.execute(f"DESCRIBE {_quote(view.name)}")
                except Exception as exc:
                    raise statement_error(exc) from None
            rows = described.to_pylist() if described is not None else []
            return [(str(r["column_name"]), _types.pg_type_name(str(r["column_type"])), False,
                     None) for r in rows]
        with self.engine.turn(self, shared=True):
            try:
                meta = db.table(name)
            except Exception as exc:
                raise statement_error(exc) from None
        return [(c, _types.pg_type_name(t), c in meta.not_null, meta.defaults.get(c))
                for c, t in meta.columns]

    def view_definition(self, name: str) -> str | None:
        view = self.engine.db.catalog.views.get(name)
        return None if view is None else str(view.query)

    def close(self) -> None:
        self._closed = True
        for stream in list(self._streams):  # (the client went away mid-stream)
            with contextlib.suppress(Exception):
                stream.close()
        if self._parser is not None:
            self._parser.close()
        if self._reader is not None:
            self._reader.close()


class AnalyticalEngine(Engine):
    """The embedded analytical database (:func:`cryptdisk.connect`), shared by every client."""

    name = "analytical"

    def __init__(self, path: str | os.PathLike[str], config: Any = None, **options: Any) -> None:
        from .. import connect

        self.db = connect(path, config, **options)
        # ``/`` as PostgreSQL's: of two integers, an integer (``7 / 2`` is 3, truncated);
        # by zero, an error (22012) for every type. DuckDB's parser reads ``/`` as ``//``
        # then, which divides integers as integers and the other types exactly, and
        # refuses a zero divisor. Every cursor of the connection (the sessions' readers)
        # starts with it; a session's ``SET integer_division = false`` is its own. Set on
        # DuckDB's connection, not through db.execute, which would take it for a change
        # of the names and collations its fast paths rely on (count(DISTINCT) outside
        # DuckDB, min/max from the catalog) and turn those off; cryptdisk parses with
        # DuckDB's default (cryptdisk.db.parser_cursor).
        self.db.con.execute("SET GLOBAL integer_division = true")
        self.keyring = self.db.keyring
        #: whose statement runs on the database's one connection, and who waits (in order)
        self.turns = _Turns()
        #: held by a statement that creates, renames or drops a table or a view, from its
        #: grant bookkeeping to its commit (:meth:`_AnalyticalSession._naming`)
        self.naming = threading.Lock()
        #: a :class:`._policies.PolicyStore` (masking and row access policies), or None
        self.policies: Any = None
        #: (catalog, its version, the tables with UUID columns): see _uuid_tables
        self.uuid_tables: tuple[Any, int, dict[str, set[str]]] | None = None

    def turn(self, session: _AnalyticalSession | None = None, shared: bool = False) -> Any:
        """Hold a turn on the database (see :class:`_Turns`): ``with engine.turn(): ...``
        alone on its connection; ``shared``: beside other queries; ``session``'s cancel
        ends the wait."""
        return self.turns.turn(session, shared)

    def open_session(self) -> EngineSession:
        return _AnalyticalSession(self)

    def close(self) -> None:
        if self.policies is not None and self.policies.audit is not None:
            self.policies.audit.close()
        self.db.close()


# --- encrypted SQLite -----------------------------------------------------------------------


def _sqlite_value(value: Any) -> Any:
    if value is None or isinstance(value, int | float | str | bytes):
        return value
    if isinstance(value, decimal.Decimal):
        return _sqlite_numeric(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat(sep=" ") if isinstance(value, dt.datetime) else value.isoformat()
    return str(value)


def _sqlite_numeric(value: decimal.Decimal, whole: bool = True) -> int | float:
    """A numeric parameter as SQLite stores it (a NUMERIC column holds whole numbers as
    INTEGER, 64 bits, others as REAL, a 64-bit float): a whole number in INTEGER's range
    as that integer, else the float of the same value; a value neither holds exactly
    (more than about 15 significant digits) or NaN (SQLite stores it as NULL) is refused
    (22003) rather than stored as another number. ``whole``: False for text SQLite reads
    as a float first (``1234567890123456789.0``), which only a float's value passes."""
    if whole and value.is_finite() and value == value.to_integral_value() and \
            -2**63 <= int(value) < 2**63:
        return int(value)
    number = float(value)
    if value.is_nan() or (value.is_finite() and decimal.Decimal(repr(number)) != value):
        raise StatementError(
            f"the numeric value {value} cannot be stored exactly by the SQLite engine, "
            "whose numbers are 64-bit floats (about 15 significant digits): send it as "
            "text to a TEXT column, or serve the analytical engine (DECIMAL(38,s))", "22003")
    return number


def _exact_numeric_text(text: Any) -> None:
    """Refuse (22003, as :func:`_sqlite_numeric`) the text of a number SQLite's NUMERIC
    affinity would store as a float of another value (``123456789012345.12345``); other
    text (not a number, or one a float holds) is left to SQLite."""
    if not isinstance(text, str) or not text:
        return
    try:
        value = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        return
    if value.is_finite():  # (text of digits alone is read as an INTEGER when it fits)
        _sqlite_numeric(value, whole=re.fullmatch(r"\s*[+-]?\d+\s*", text) is not None)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_TABLE_OPS = {apsw.SQLITE_READ, apsw.SQLITE_INSERT, apsw.SQLITE_UPDATE, apsw.SQLITE_DELETE}
_SCHEMA_TABLES = {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"}
#: the server's own table in a served SQLite database: the record of the user changes the
#: last transaction that had any committed with its data (:meth:`._users.UserStore.commit`);
#: no client statement may name it, and the catalogs leave it out
USERS_JOURNAL = "cryptdisk_users_journal"
_JOURNAL_CREATE = ("CREATE TABLE IF NOT EXISTS cryptdisk_users_journal (id INTEGER PRIMARY KEY "
                   "CHECK (id = 1), serial INTEGER NOT NULL, users BLOB NOT NULL)")
_JOURNAL_WRITE = ("INSERT OR REPLACE INTO cryptdisk_users_journal (id, serial, users) "
                  "VALUES (1, ?, ?)")
_JOURNAL_READ = "SELECT serial, users FROM cryptdisk_users_journal"
#: the number of the one record in :data:`USERS_JOURNAL` (its ``id``)
USERS_RECORD = 1


def users_record_error(path: str | None, what: str) -> UsersFileError:
    """The error for a record of committed user changes (in the database ``path``) that
    authenticates but is malformed: ``what`` is wrong with it."""
    where = f"{path}: " if path else ""
    return UsersFileError(
        f"{where}the database's record of committed user changes (table {USERS_JOURNAL}, "
        f"record {USERS_RECORD}) is malformed: {what}", path=path, record=USERS_RECORD,
        hint="`cryptdisk serve PATH --sqlite --resolve-users file` writes the user file's "
        "users over it, or restore the database from a backup")


def _users_record(path: str, rows: list[Any]) -> tuple[int, bytes] | None:
    """``(serial, text)`` of the :data:`USERS_JOURNAL` rows read, None for none; a column
    of the wrong type raises :class:`UsersFileError` (SQLite stores any type in any
    column)."""
    if not rows:
        return None
    serial, text = rows[0]
    if type(serial) is not int or serial < 0:
        raise users_record_error(path, f"its serial is {_sqlite_kind(serial)}, not a "
                                 "generation number (a whole number from 0)")
    if not isinstance(text, bytes):
        raise users_record_error(path, f"its users are {_sqlite_kind(text)}, not a blob "
                                 "of JSON")
    return serial, text


def _sqlite_kind(value: Any) -> str:
    """What an SQLite value is, in words (not the value)."""
    if isinstance(value, int):
        return "a negative integer" if value < 0 else "an integer"
    return ("null" if value is None else "a real" if isinstance(value, float)
            else "text" if isinstance(value, str) else "a blob")


_PUBLIC = re.compile("public", re.I)
_PUBLIC_SCHEMA = frozenset({"public"})


_COUNTS = re.compile(r"\s*(?:count|length|instr|unicode|changes|total_changes)\s*\(", re.I)
_AVERAGES = re.compile(r"\s*(?:avg|total)\s*\(", re.I)


def _expression_oid(name: str) -> int:
    """The type of a result column SQLite knows no declared type of, before it runs (a
    Describe): an integer for ``count(...)``, ``length(...)`` and integer literals, a
    float for ``avg(...)`` and ``total(...)`` (named as written, without an alias), else
    text (when it runs, the server takes the type of its first value)."""
    if _COUNTS.match(name) or re.fullmatch(r"-?\d{1,18}", name):
        return _types.INT8
    if _AVERAGES.match(name):
        return _types.FLOAT8
    return _types.TEXT


#: the types of a cast SQLite leaves as text (``'2024-01-02'::date``, ``$1::uuid``): a
#: column its text types so is sent as that type, as PostgreSQL describes it
_TEXT_CASTS = frozenset({_types.INTERVAL, _types.DATE, _types.TIME, _types.TIMESTAMP,
                         _types.TIMESTAMPTZ, _types.UUID, _types.NUMERIC})


@functools.lru_cache(maxsize=512)
def _settled_types(sql: str, count: int) -> list[int]:
    """The type of each of ``sql``'s ``count`` result columns its text alone settles
    (:func:`._exprtypes.select_types`, no table's column looked up; 0: not settled), for a
    statement run without a Describe."""
    from ._exprtypes import select_types

    types = select_types(sql, lambda _name: 0)
    return types if types is not None and len(types) == count else [0] * count


def _typed(row: tuple[Any, ...], read: list[tuple[int, Any]]) -> tuple[Any, ...]:
    """``row`` with the values in the columns ``read`` (index, declared type: an OID, or
    a :func:`._types.numeric_type`) as that type."""
    values = list(row)
    for i, oid in read:
        try:
            values[i] = _types.sqlite_value(oid, values[i])
        except ValueError as exc:
            raise StatementError(*exc.args) from None
    return tuple(values)


def _placeholder(n: int) -> str:
    return f"?{n}"


#: SQLite VM steps a :meth:`_SQLiteSession.run_quick` statement may take on the server's event
#: loop (well under a millisecond of work; a point query takes a few dozen)
QUICK_STEPS = 20000
#: pauses (seconds) between a busy statement's tries for another connection's lock, as
#: SQLite's own busy handler makes them; a cancel ends the pause at once
_BUSY_PAUSES = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.025, 0.025, 0.05, 0.05, 0.1)
#: statements :meth:`_SQLiteSession.run_write_quick` may run (their first six characters)
_WRITE_HEADS = ("UPDATE", "INSERT", "DELETE")
_VALUE = r"(?:\$\d+|[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|'(?:[^']|'')*'|NULL|DEFAULT)"
#: an INSERT of VALUES or an UPDATE whose SET writes only parameters and literals, which
#: :meth:`_SQLiteSession._checked_intervals` leaves as they are (typed already)
_PLAIN_WRITE = re.compile(
    rf"""\s*(?:INSERT\s+INTO\s+[^()'";]+(?:\([^()'";]*\)\s*)?VALUES\s*
         \(\s*{_VALUE}(?:\s*,\s*{_VALUE})*\s*\)(?:\s*,\s*\(\s*{_VALUE}(?:\s*,\s*{_VALUE})*\s*\))*
       | UPDATE\s+[\w."]+(?:\s+(?:AS\s+)?\w+)?\s+SET\s+[\w"]+\s*=\s*{_VALUE}
         (?:\s*,\s*[\w"]+\s*=\s*{_VALUE})*)\s*(?:;\s*$|$|(?:WHERE|RETURNING)\b)""",
    re.I | re.X)


def _cancelled() -> StatementError:
    return StatementError("canceling statement due to user request", "57014")


#: the dot-separated parts of a relation's name (``public.t``, ``"My T"``)
_REGCLASS_PART = re.compile(r'"(?:[^"]|"")*"|[^."]+')


def _sqlite_quote(text: str) -> str:
    """``text`` as a SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


#: where ``CAST(`` may be
_CAST_CALL = re.compile(r"cast\s*\(", re.I)
#: where a dollar-quoted string may open (a $ then no digit: $1 is a parameter)
_DOLLAR_OPEN = re.compile(r"\$[^0-9]")


def _sqlite_casts(sql: str) -> str:
    """``sql`` with PostgreSQL's ``::`` casts as SQLite reads them: a parameter's dropped,
    a string literal's to a number SQLite's CAST (:func:`._sqltext.drop_casts`), any other
    SQLite's CAST (:func:`._paramtypes.sqlite_casts`), or 0A000 for a type SQLite has no
    CAST to; ``CAST(x AS type)`` likewise (:func:`._paramtypes.sqlite_cast_calls`); an
    arithmetic operand of ``||`` in brackets (PostgreSQL's precedence,
    :func:`._paramtypes.sqlite_concat_precedence`); its dollar-quoted strings as standard
    ones."""
    from . import _paramtypes

    if "$" in sql:  # (SQLite has no dollar-quoted strings: $x is a named parameter)
        sql = _sqltext.dollar_strings(sql)
    # (a definition SQLite keeps reads without the server: SQLite's own casts)
    stored = _STORED.match(sql) is not None
    try:
        if "::" in sql or "cast" in sql.lower():
            _paramtypes.check_cast_types(sql)
        if "::" in sql:
            sql = _sqltext.drop_casts(sql, stored)
        sql = _paramtypes.sqlite_casts(sql, stored) if "::" in sql else sql
        if "cast" in sql.lower() and not stored:
            sql = _paramtypes.sqlite_cast_calls(sql)
        return _paramtypes.sqlite_concat_precedence(sql) if "||" in sql else sql
    except (_intervalin.IntervalError, _sqltext.InputError) as exc:
        raise StatementError(*exc.args) from None
    except _paramtypes.UnknownType as exc:
        raise StatementError(f'type "{exc.args[0]}" does not exist', "42704") from None
    except _paramtypes.CastRefused as exc:
        raise StatementError(
            f"the SQLite engine cannot cast an expression to {exc.args[0]}: SQLite holds "
            "such values as text or numbers without their type", "0A000",
            hint="compare or return the value as it is stored, cast a parameter or a string "
            "literal instead, or serve the analytical engine") from None


def _sqlite_position(args: str) -> str:
    """PostgreSQL's ``position(a IN b)`` (its arguments ``args``) as SQLite's ``instr(b,
    a)``: the same 1-based place, 0 where ``a`` is not in ``b``, NULL for a NULL."""
    from ._paramtypes import _tokens

    depth = 0
    for tok in _tokens(args):
        depth += (tok.text == "(") - (tok.text == ")")
        if depth == 0 and tok.kind == "ref" and tok.text == "IN" and len(tok.parts) == 1:
            return f"instr({args[tok.stop:]}, {args[:tok.start]})"
    return f"position({args})"


class _SQLiteSession(EngineSession):
    blob_concat = "CAST({} AS BLOB)"  # (SQLite's || of two blobs is text)
    # SQLite's hex(NULL) is '', not NULL: quote() tells NULL ('NULL') from a blob (X'61FF')
    # without evaluating the operand twice
    bytea_text = ("('\\x' || lower(rtrim(substr(nullif(quote(CAST({} AS BLOB)), 'NULL'), 3), "
                  "'''')))")

    def __init__(self, engine: SQLiteEngine) -> None:
        from ..sqlite import connect

        if engine.plaintext:
            self.conn = apsw.Connection(engine.path)
            self.conn.set_busy_timeout(engine.busy_timeout_ms)
            self.conn.execute("PRAGMA temp_store=MEMORY")  # as cryptdisk.sqlite.connect does
        else:
            self.conn = connect(engine.path, keyring=engine.keyring,
                                busy_timeout_ms=engine.busy_timeout_ms)
        # PostgreSQL's LIKE tells 'A' from 'a' (SQLite's does not, for ASCII letters)
        self.conn.execute("PRAGMA case_sensitive_like = ON")
        self.lock = threading.Lock()
        self.can_cache = True
        self.last_tables = set()
        self.check: Any = None
        self.recording = False
        self.engine = engine
        self.writing = False  # holds the engine's write queue (a BEGIN IMMEDIATE transaction)
        self._desc: Any = ()      # the columns of the statement :meth:`_step` ran
        self._quick = False       # running in :meth:`run_quick`
        self._stopped = False     # ... and the progress handler stopped it
        self._ticks = 0           # progress handler calls (every QUICK_STEPS VM steps)
        self._deadline: float | None = None  # a run_write_quick statement's timeout
        #: write statements (their text) by whether every run so far took under
        #: QUICK_STEPS VM steps (:meth:`run_write_quick`)
        self._short_writes: dict[str, bool] = {}
        self._wal = False  # WAL mode: a writer holding the write lock never waits for a lock
        self._deferring = False  # in commit_quick: _finish leaves the disk's work for later
        self.privileges: Any = None
        self._version: Any = None  # the privileges' version the statement cache is under
        self._epoch = 0
        self._tag = ""
        self._internal = False  # running the server's own statement on USERS_JOURNAL
        #: the declared types of columns (:meth:`_date_column_operator`), at SQLite's
        #: schema_version: table or view (lower case) -> column (lower case) -> OID
        self._schema_version = -1
        # (interval_strings: the schema version, its tables with interval or boolean
        # columns, and statements typed under it)
        self._interval_version, self._typed_tables = -1, list[str]()
        self._typed_done: dict[tuple[str, Any], str] = {}
        self._relations: set[str] = set()
        self._declared: dict[str, dict[str, int]] = {}
        #: what :meth:`_date_column_operator` answered for each statement, at that version
        self._date_operators: dict[_sqlitearith.DateOperands, str | None] = {}
        #: (:meth:`_checked_intervals`, at that version) the tables with an INTERVAL
        #: column, and each write's text with its expressions for one checked
        self._interval_tables: set[str] = set()
        self._interval_writes: dict[str, str] = {}
        #: (:meth:`_checked_parameters`, at that version) the tables whose definition
        #: names DATE or INTERVAL, and each write's text with its parameters read
        self._dated_tables: set[str] = set()
        self._parameter_writes: dict[str, str] = {}
        #: set by :meth:`interrupt`: ends a wait for the write lock (the queue or SQLite's)
        self._cancel = threading.Event()
        self._busy_since = 0.0
        self._busy_cancelled = False
        self._writing = False  # the statement being run writes (see _trace)
        self.conn.set_busy_handler(self._busy)
        self.conn.set_progress_handler(self._progress, QUICK_STEPS)
        self.conn.authorizer = self._authorize
        self.conn.create_scalar_function(_DECODE_HEX, _sqlite_decode_hex, 1,
                                         deterministic=True)
        self.conn.create_scalar_function(_sqltext.INT_CAST_FUNCTION, _sqlite_int_cast, 3,
                                         deterministic=True)
        self.conn.create_scalar_function(_sqltext.INTERVAL_CAST_FUNCTION,
                                         _sqlite_interval_cast, 1, deterministic=True)
        self.conn.create_scalar_function(_sqltext.DATE_INPUT_FUNCTION, _sqlite_date_input,
                                         1, deterministic=True)
        self.conn.create_scalar_function(_sqltext.SUBSTR_FUNCTION, _sqlite_substr, -1,
                                         deterministic=True)
        for count in (1, 2):  # (the divisor, and the dividend where it is one atom)
            self.conn.create_scalar_function(_sqlitearith.DIVISOR_FUNCTION, _sqlite_divisor,
                                             count, deterministic=True)
        for count in (2, 3):  # (x MATCH p [ESCAPE e]: match(p, x [, e]))
            self.conn.create_scalar_function("match", _sqlite_ilike, count, deterministic=True)
        #: WAL mode: the databases (``main``, attached ones) whose WAL this connection has
        #: committed to since the last sync, and those due for a checkpoint
        self._committed: set[str] = set()
        self._checkpoint_due: set[str] = set()
        self._autocheckpoint = 0
        if str(self.conn.execute("PRAGMA journal_mode").fetchall()[0][0]).lower() == "wal":
            self._group_commit()

    def _group_commit(self) -> None:
        """WAL mode: commits are made durable by :meth:`_durable` (group commit,
        :mod:`._groupsync`) once the write lock is released, not by SQLite inside it. The
        WAL hook that tells of each commit replaces SQLite's autocheckpoint, which
        :meth:`_finish` runs instead (PASSIVE, at the same number of WAL pages)."""
        ((pages,),) = self.conn.execute("PRAGMA wal_autocheckpoint").fetchall()
        self._autocheckpoint = int(str(pages))
        self._wal = True
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.set_wal_hook(self._wal_hook)

    def _wal_hook(self, _conn: Any, name: str, pages: int) -> int:
        self._committed.add(name)
        if 0 < self._autocheckpoint <= pages:
            self._checkpoint_due.add(name)
        return int(apsw.SQLITE_OK)

    def commit_quick(self) -> bool:
        """WAL mode, a write transaction (this session holds the write lock): COMMIT here
        (SQLite writes the WAL frames, without a sync) and release the write lock, unless a
        checkpoint is then due; the sync, and a checkpoint, wait for :meth:`finish_commit`
        on the session's thread. False, having done nothing, otherwise."""
        if not (self._wal and self.writing and self.conn.in_transaction):
            return False
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if self._cancel.is_set():  # (Event.clear takes a lock: a Python call)
                self._cancel.clear()
            self._deferring = True
            try:
                self._step("COMMIT", [])
            except Exception as exc:
                raise statement_error(exc) from None
            finally:
                self._deferring = False
        finally:
            self.lock.release()
        return True

    def finish_commit(self) -> None:
        with self.lock:
            self._finish()

    def _finish(self, release: bool = True) -> None:
        """After a statement: checkpoint the databases due (still holding the write queue:
        a checkpoint that overlaps the next writer's start keeps that writer from restarting
        the WAL, which then grows and is checkpointed at every commit), release the queue
        (``release``) once the transaction has ended, then make its commit durable."""
        if self._deferring:  # commit_quick on the event loop: nothing that waits for the disk
            if not self._checkpoint_due and self.writing and not self.conn.in_transaction:
                self.writing = False
                self.engine.write_queue.release()
            return
        if self._checkpoint_due and not self.conn.in_transaction:
            due, self._checkpoint_due = self._checkpoint_due, set()
            for name in due:  # in NORMAL mode SQLite syncs the WAL first, the database after
                try:
                    self.conn.wal_checkpoint(name, apsw.SQLITE_CHECKPOINT_PASSIVE)
                except apsw.Error as exc:  # busy (another checkpoint): tried again later
                    log.debug("checkpoint of %s: %s", name, exc)
        if release and self.writing and not self.conn.in_transaction:
            self.writing = False
            self.engine.write_queue.release()
        if self._committed:
            self._durable()

    def _durable(self) -> None:
        """Sync the WAL of each database the statement committed to (in WAL mode). Raises
        58030 when a sync fails: the transaction is committed but may not survive a crash
        of the machine."""
        committed, self._committed = self._committed, set()
        for name in committed:
            wal = self.conn.db_filename(name) + "-wal"
            try:
                if name == "main":
                    self.engine.group_sync.sync(wal)
                else:  # an attached database: synced on its own
                    fd = os.open(wal, os.O_RDONLY | os.O_CLOEXEC)
                    try:
                        os.fdatasync(fd)
                    finally:
                        os.close(fd)
            except OSError as exc:
                log.critical("syncing %s after a commit failed: %s", wal, exc)
                raise StatementError(f"the transaction was committed but could not be made "
                                     f"durable: syncing the WAL failed: {exc}", "58030",
                                     hint="check the disk; the commit may be lost if the "
                                     "machine crashes") from None

    def _authorize(self, op: int, one: str | None, two: str | None, database: str | None,
                   view: str | None) -> int:
        if self._internal:
            return apsw.SQLITE_OK  # the server's own statement (the user file may be held)
        if (one is not None and one.lower() == USERS_JOURNAL) \
                or (two is not None and two.lower() == USERS_JOURNAL):
            return apsw.SQLITE_DENY
        if self.recording and one is not None and op in _TABLE_OPS \
                and one.lower() not in _SCHEMA_TABLES:
            self.last_tables.add(one.lower())
        return apsw.SQLITE_OK if self.check is None else \
            int(self.check(op, one, two, database, view))

    def commit_users(self, store: Any, ops: list[Any]) -> None:
        """COMMIT the transaction with its changes to the users (``ops``), in two phases
        (:meth:`._users.UserStore.commit`): the new user file's content is written into
        :data:`USERS_JOURNAL` in this transaction, which commits; then the user file is
        saved. The write lock is taken first (the queue, then SQLite's), the user file's
        after: the order every writer takes them in."""
        if self.conn.in_transaction and \
                self.conn.txn_state("main") != apsw.SQLITE_TXN_WRITE:
            self.run("COMMIT", [])  # it only read: nothing of it to keep or lose
        if not self.conn.in_transaction:
            self.run("BEGIN IMMEDIATE", [])
        self._internal = True  # checked already; the privileges read the users held here
        try:
            store.commit(ops, self._write_users_record, self._commit_internal,
                         journal=self._read_users_record)
        finally:
            self._internal = False

    def resolve_users(self, store: Any, keep: str) -> str:
        """``cryptdisk serve --resolve-users``: make the user file and the record of user
        changes agree (:meth:`._users.UserStore.resolve`), holding the write lock first."""
        self.run("BEGIN IMMEDIATE", [])
        self._internal = True
        try:
            return str(store.resolve(keep, self._read_users_record, self._write_users_record,
                                     self._commit_internal))
        finally:
            self._internal = False
            if self.conn.in_transaction:
                self._internal_statement("ROLLBACK", ())
                if self.writing:
                    self.writing = False
                    self.engine.write_queue.release()

    def _commit_internal(self) -> None:
        with self.lock:  # not _step: its privileges' prefix would read the users held here
            try:
                self.conn.execute("COMMIT", can_cache=False)
            finally:
                self._finish()

    def _internal_statement(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        with self.lock:  # never cached: a client's statement of the same text is checked anew
            try:
                return list(self.conn.execute(sql, params, can_cache=False))
            finally:
                self._finish(release=False)

    def _write_users_record(self, serial: int, text: bytes) -> None:
        if self.engine.plaintext:  # verifiers never go into an unencrypted file (benchmarks
            return  # only): such a server keeps the window between the two writes
        self._internal_statement(_JOURNAL_CREATE, ())
        # the record it replaces may hold verifiers of users dropped since: SQLite zeroes
        # the space and pages it frees instead of leaving the old bytes in the database
        ((before,),) = self._internal_statement("PRAGMA secure_delete", ())
        self._internal_statement("PRAGMA secure_delete = 1", ())
        try:
            self._internal_statement(_JOURNAL_WRITE, (serial, text))
        finally:
            self._internal_statement(f"PRAGMA secure_delete = {int(before)}", ())

    def _read_users_record(self, _wait: bool = True) -> tuple[int, bytes] | None:
        try:
            rows = self._internal_statement(_JOURNAL_READ, ())
        except apsw.SQLError:
            return None  # no such table: no transaction has changed users
        return _users_record(self.engine.path, rows)

    def record_tables(self) -> None:
        self.recording = True
        self.can_cache = False  # the authorizer only sees statements as they are prepared
        self.conn.authorizer = self._authorize

    @property
    def in_transaction(self) -> bool:
        return bool(self.conn.in_transaction)

    def set_privileges(self, privileges: Any) -> None:
        self.privileges = privileges
        self.check = privileges.sqlite_authorizer()
        self.conn.authorizer = self._authorize

    def _sql(self, sql: str) -> str:
        """The text SQLite prepares: ``?n`` for ``$n``; with privileges, prefixed by a comment
        naming their version. SQLite authorizes a statement when it prepares it, and the
        statement cache is keyed by the text: a cached statement is reused only while the
        privileges it was checked under hold (a GRANT, REVOKE or SET ROLE changes the
        prefix, so the next statement is prepared, and checked, again)."""
        dates = _sqlitearith.date_operands(sql)
        if dates.typed_literal or dates.operator or dates.columns:
            self._refuse_dates(dates)
        if sql[:6].upper() in _WRITE_HEADS[:2] and _PLAIN_WRITE.match(sql) is None:
            sql = self._checked_intervals(sql)  # (INSERT INTO t (i) SELECT s FROM u)
        if "$" in sql and sql[:6].upper() in _WRITE_HEADS[:2]:
            sql = self._checked_parameters(sql)  # (VALUES ($1) of a DATE column)
        lowered = sql.lower()
        if "ilike" in lowered:  # (before postgres_spelling's LIKE escapes: MATCH has
            sql = _ilike_spelling(sql)  # none, the function reads PostgreSQL's)
        sql = _sqltext.quote_index_names(postgres_spelling(sql, "quote({})", _sqlite_blob))
        inexact = _sqltext.inexact_number(sql)
        if inexact is not None:
            raise StatementError(
                f"the number {inexact} cannot be held exactly by the SQLite engine, whose "
                "numbers are 64-bit integers and floats (about 15 significant digits): "
                "write it as a string for a TEXT column, or serve the analytical engine "
                "(DECIMAL(38,s))", "22003")
        if "order" in lowered:  # NULL sorts after every value, as in PostgreSQL
            from . import _paramtypes

            sql = _paramtypes.null_order(sql)
        if "substr" in lowered and _STORED.match(sql) is None:  # substr('abc', -1, 3)
            for name in ("substr", "substring"):  # (a definition SQLite keeps: its own)
                sql = _sqltext.replace_calls(sql, name, _sqltext.SUBSTR_FUNCTION + "({})")
        if "position" in lowered:  # position(a IN b): SQLite's instr(b, a)
            sql = _sqltext.replace_calls(sql, "position", _sqlite_position)
        if "regclass" in lowered:  # 'x'::regclass: 42P01 for no such relation
            sql = self._regclass_names(sql)
        if "::" in sql or "||" in sql or _DOLLAR_OPEN.search(sql) is not None or \
                _CAST_CALL.search(sql) is not None:  # $1::BIGINT, a::text, $$, 1 + 2 || 'x'
            sql = _sqlite_casts(sql)
        if ("/" in sql or "%" in sql or "mod" in lowered) and _STORED.match(sql) is None:
            sql = _sqlitearith.checked_divisors(sql)  # 1 / 0: 22012, not SQLite's NULL
        text = _sqltext.substitute(sql, _placeholder) if "$" in sql else sql
        if _PUBLIC.search(text) is not None:  # public.t: SQLite's main.t
            text = _sqltext.unqualify(text, schemas=_PUBLIC_SCHEMA)
        return self._tagged(text)

    def _refuse_dates(self, found: _sqlitearith.DateOperands) -> None:
        """0A000 for a typed literal, or arithmetic on a date, time, timestamp or interval
        (SQLite's would compute with the number their text starts with)."""
        if found.typed_literal is not None:
            raise StatementError(
                f"typed literals such as {found.typed_literal} are not supported by the "
                "SQLite engine, which holds dates and times as text", "0A000",
                hint="write the string alone ('2024-01-31'), which compares with a DATE "
                "column's text; for arithmetic, SQLite's date functions: date(d, '+1 day')")
        operator = found.operator
        if operator is None:
            operator = self._date_column_operator(found)
        if operator is not None:
            raise StatementError(
                f"operator {operator} on a date, time, timestamp or interval is not "
                "supported by the SQLite engine, which holds them as text (SQLite would "
                "compute with the number the text starts with, the year)", "0A000",
                hint="use SQLite's date functions: date(d, '+1 day'), datetime(ts, "
                "'-2 hours'), julianday(a) - julianday(b) for the days between; or "
                "serve the analytical engine")

    def _regclass_names(self, sql: str) -> str:
        """``sql`` with each string literal cast to ``regclass`` (``'T'::regclass``) as the
        name of the relation it names, as PostgreSQL's regclass input reads it (unquoted
        parts folded to lower case, a schema ``public`` dropped: ``t``); 42P01 where no
        table or view has that name, as there (``pg_`` names, pg_catalog's, as written).
        The caller holds :attr:`lock`."""
        found = _sqltext.regclass_literals(sql)
        if not found:
            return sql
        internal, self._internal = self._internal, True  # (the catalog: no privilege
        try:  # check, nothing recorded)
            self._schema_now()
        finally:
            self._internal = internal
        out = sql
        for start, stop in reversed(found):
            written = sql[start + 1:stop - 1].replace("''", "'")
            parts = [p[1:-1].replace('""', '"') if p.startswith('"') else p.strip().lower()
                     for p in _REGCLASS_PART.findall(written)]
            if len(parts) == 2 and parts[0] == "public":
                parts = parts[1:]
            if len(parts) == 1 and parts[0].startswith("pg_"):
                continue
            if len(parts) != 1 or parts[0].lower() not in self._relations:
                raise StatementError(f'relation "{written}" does not exist', "42P01")
            out = f"{out[:start]}{_sqlite_quote(parts[0])}{out[stop:]}"
        return out

    def _date_column_operator(self, found: _sqlitearith.DateOperands) -> str | None:
        """The first operator of ``found.columns`` whose column is declared a date, time,
        timestamp or interval by the tables and views among ``found.names`` (None: none
        is); the answer is kept for the statement while SQLite's schema_version stays
        (a change to the schema by any connection bumps it)."""
        internal, self._internal = self._internal, True  # (the catalog: no privilege
        try:  # check, nothing recorded)
            self._schema_now()
            if found in self._date_operators:
                return self._date_operators[found]
            in_scope = [n for n in found.names if n in self._relations]
            for name in in_scope:
                self._declared_types(name)
        finally:
            self._internal = internal
        declared, aliases = self._declared, dict(found.aliases)

        def ref_type(parts: tuple[str, ...]) -> int:
            column = parts[-1].lower()
            if len(parts) >= 2:  # t.d, a.d (FROM t a); not known through a subquery's alias
                qualifier = parts[-2].lower()
                table = qualifier if qualifier in declared else aliases.get(qualifier, "")
                return declared[table].get(column, 0) if table in declared else 0
            types = {declared[t].get(column, 0) for t in in_scope} - {0}
            return types.pop() if len(types) == 1 else 0

        operator = next((op for op, parts in found.columns
                         if ref_type(parts) in _sqlitearith.DATE_TYPES), None)
        if len(self._date_operators) >= 1024:
            self._date_operators.clear()
        self._date_operators[found] = operator
        return operator

    def _schema_now(self) -> None:
        """The caches of the declared types brought to SQLite's schema_version (the caller
        holds :attr:`lock` and has set :attr:`_internal`; not from apsw's statement cache,
        whose counts are the statements')."""
        ((version,),) = self.conn.execute("PRAGMA schema_version",
                                          can_cache=False).fetchall()
        if version != self._schema_version:
            assert isinstance(version, int)
            self._schema_version = version
            self._relations = {str(n).lower() for (n,) in self.conn.execute(
                "SELECT name FROM sqlite_schema WHERE type IN ('table', 'view')")}
            self._interval_tables = {str(n).lower() for (n,) in self.conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND "
                "upper(sql) LIKE '%INTERVAL%'")}
            self._dated_tables = self._interval_tables | {
                str(n).lower() for (n,) in self.conn.execute(
                    "SELECT name FROM sqlite_schema WHERE type = 'table' AND "
                    "upper(sql) LIKE '%DATE%'")}
            self._declared, self._date_operators, self._interval_writes = {}, {}, {}
            self._parameter_writes = {}

    def _declared_types(self, name: str) -> dict[str, int]:
        """column (lower case) -> OID of table or view ``name`` (lower case), as
        :meth:`_schema_now` keeps them."""
        if name not in self._declared:
            self._declared[name] = {
                str(c).lower(): _types.sqlite_declared_oid(str(t or ""))
                for c, t in self.conn.execute(
                    "SELECT name, type FROM pragma_table_info(?)", (name,))}
        return self._declared[name]

    def _checked_intervals(self, sql: str) -> str:
        """The write ``sql`` with each expression it writes into an INTERVAL column, other
        than a literal or parameter (typed already: :meth:`interval_strings`), read as
        PostgreSQL reads an interval by the server's function
        (:data:`._sqltext.INTERVAL_CAST_FUNCTION`: 22007 for text that is none, else its
        text as the server stores intervals), where SQLite would store any text
        (``UPDATE t SET i = s``); the caller holds :attr:`lock`."""
        return self._wrapped_writes(sql, "_interval_tables", "_interval_writes",
                                    ((_types.INTERVAL, _sqltext.INTERVAL_CAST_FUNCTION),),
                                    parameters=False)

    def _checked_parameters(self, sql: str) -> str:
        """The write ``sql`` with each lone parameter it writes into a DATE or INTERVAL
        column (``VALUES ($1)``, ``SET d = $1``) read by PostgreSQL's input of the type
        (:data:`._sqltext.DATE_INPUT_FUNCTION`, :data:`._sqltext.INTERVAL_CAST_FUNCTION`):
        a client may send it untyped and run it with no Describe to type it (psycopg),
        where SQLite would store any text; a typed one reads as it is. The caller holds
        :attr:`lock`."""
        return self._wrapped_writes(sql, "_dated_tables", "_parameter_writes",
                                    ((_types.DATE, _sqltext.DATE_INPUT_FUNCTION),
                                     (_types.INTERVAL, _sqltext.INTERVAL_CAST_FUNCTION)),
                                    parameters=True)

    def _wrapped_writes(self, sql: str, tables_name: str, done_name: str,
                        wraps: tuple[tuple[int, str], ...], *, parameters: bool) -> str:
        """``sql`` with each expression it writes into a column of one of ``wraps``' types
        (:func:`._paramtypes.written_expressions`; only lone parameters if ``parameters``)
        passed through that type's function, or ``sql`` itself when it names none of the
        tables in attribute ``tables_name``; kept in the dictionary in attribute
        ``done_name`` (both made anew by :meth:`_schema_now` at a schema change; the
        dictionary cleared at 256 statements)."""
        from . import _paramtypes

        internal, self._internal = self._internal, True  # (the catalog: no privilege
        try:  # check, nothing recorded)
            self._schema_now()
            tables: set[str] = getattr(self, tables_name)
            done: dict[str, str] = getattr(self, done_name)
            lowered = sql.lower()
            if not any(name in lowered for name in tables):
                return sql
            out = done.get(sql)
            if out is not None:
                return out

            def columns(name: str) -> list[tuple[str, int]] | None:
                return list(self._declared_types(name.lower()).items())

            relations = {n: n for n in self._relations}
            spans = [(start, stop, function) for oid, function in wraps
                     for start, stop in _paramtypes.written_expressions(
                         sql, relations, columns, oid, parameters=parameters)]
        finally:
            self._internal = internal
        out = sql
        for start, stop, function in sorted(spans, reverse=True):
            out = f"{out[:start]}{function}({out[start:stop]}){out[stop:]}"
        if len(done) >= 256:
            done.clear()
        done[sql] = out
        return out

    def check_numeric_strings(self, sql: str,
                              visible: Callable[[str], bool] | None = None) -> None:
        # SQLite's NUMERIC affinity stores such text as a REAL: refused as a parameter is
        from . import _paramtypes

        tables, columns = self._context(visible)
        for tok in _paramtypes.typed_strings(
                sql, tables, columns, _types.NUMERIC,
                lambda text: text[:1] == "'" and _sqltext.inexact_number(text[1:-1]) is not None):
            _exact_numeric_text(tok.text[1:-1].replace("''", "'"))

    def interval_strings(self, sql: str, visible: Callable[[str], bool] | None = None) -> str:
        # kept as the text PostgreSQL writes, so that the same interval is the same text
        # whichever way it was written (a parameter's is written so too)
        from . import _paramtypes

        # (and a boolean's as SQLite's 1 or 0: 'yes' is true, as in PostgreSQL)
        ((version,),) = self._schema("PRAGMA schema_version", ())
        if version != self._interval_version:  # the tables that may have such columns
            self._interval_version, self._typed_done = version, {}
            self._typed_tables = [str(n).lower() for (n,) in self._schema(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND (upper(sql) "
                "LIKE '%INTERVAL%' OR upper(sql) LIKE '%BOOL%')", ())]
        if not self._typed_tables:
            return sql
        lowered = sql.lower()
        if not any(name in lowered for name in self._typed_tables):
            return sql
        key = (sql, getattr(self.privileges, "version", None))
        done = self._typed_done.get(key)
        if done is not None:  # (the same statement again: typed as before)
            return done
        tables, columns = self._context(visible)
        edits = [(tok, _sqltext.interval_literal) for tok in _paramtypes.typed_strings(
            sql, tables, columns, _types.INTERVAL, lambda text: text[:1] == "'")]
        edits += [(tok, _sqltext.bool_literal) for tok in _paramtypes.typed_strings(
            sql, tables, columns, _types.BOOL, lambda text: text[:1] == "'")]
        try:
            for tok, literal in sorted(edits, key=lambda e: e[0].start, reverse=True):
                sql = sql[:tok.start] + literal(tok.text) + sql[tok.stop:]
        except (_intervalin.IntervalError, _sqltext.InputError) as exc:
            raise StatementError(*exc.args) from None
        if len(self._typed_done) >= 256:
            self._typed_done.clear()
        self._typed_done[key] = sql
        return sql

    def float_literals(self, sql: str, visible: Callable[[str], bool] | None = None) -> str:
        # PostgreSQL rounds such a literal to the nearest double (5.2990648348713776e+16,
        # its own text of one); :meth:`_sql` refuses a literal SQLite would not hold as
        # written, which a numeric must be: give it the double's shortest digits instead
        from . import _paramtypes

        tables, columns = self._context(visible)
        found = _paramtypes.float_numbers(
            sql, tables, columns, lambda text: _sqltext.inexact_number(text) is not None)
        for tok in sorted(found, key=lambda t: t.start, reverse=True):
            value = float(tok.text)
            if math.isfinite(value):  # (else refused as inexact: out of float8's range)
                sql = sql[:tok.start] + repr(value) + sql[tok.stop:]
        return sql

    def _tagged(self, text: str) -> str:
        """``text`` with the privileges' version prefixed (see :meth:`_sql`)."""
        if self.privileges is not None and self.can_cache:
            version = self.privileges.version
            if version != self._version:
                self._version = version
                self._epoch += 1
                self._tag = f"/* cryptdisk {self._epoch} */ "
            text = self._tag + text
        return text

    def _trace(self, cursor: apsw.Cursor, sql: str, _bindings: Any) -> bool:
        self._writing = not cursor.is_readonly  # (SQLite's own word: the statement writes)
        if self.read_only and self._writing and not sql.startswith("BEGIN "):
            raise read_only_error(sql)
        self._desc = cursor.get_description()
        return True

    def _step(self, sql: str, params: list[Any]) -> tuple[list[tuple[Any, ...]], int]:
        """Run ``sql`` (the caller holds :attr:`lock`): its rows and the changes it made;
        :attr:`_desc` gets its columns. Raises the engine's own exceptions."""
        self._desc = ()
        cur = self.conn.cursor()
        cur.exec_trace = self._trace
        try:
            cur.execute(self._sql(sql), [p if type(p) is int else _sqlite_value(p)
                                         for p in params] if params else (),
                        can_cache=self.can_cache)
            if self._desc:
                self._described_as_run(cur)
            rows = list(cur)  # tuples (no row tracer)
            return rows, self.conn.changes()
        finally:
            cur.close()
            self._finish()

    def _described_as_run(self, cur: apsw.Cursor) -> None:
        """:attr:`_desc` from ``cur`` at its first row: a statement of apsw's cache that
        another connection's schema change made stale is prepared again by SQLite as it
        runs, after :meth:`_trace` described it as first prepared (a table dropped and
        made again with other column types). Its DB-API description is read: apsw keeps
        the trace's ``get_description()`` for the cursor."""
        try:
            now = cur.description
        except apsw.ExecutionCompleteError:  # no row: no value is read under the types
            return
        self._desc = tuple((d[0], d[1]) for d in now)

    def _result(self, sql: str, rows: list[tuple[Any, ...]], changes: int) -> Result:
        desc = self._desc
        if not desc:
            head = (_sqltext.first_words(sql, 1) or [""])[0]
            if head == "WITH":
                head = with_head(sql)
            count = changes if head in ("INSERT", "UPDATE", "DELETE") else None
            return Result(None, [], command_tag(sql, count, False))
        columns = []
        settled: list[int] | None = None
        looked_up = False
        for i, (name, decl) in enumerate(desc):
            if decl:  # its declared type, as a Describe says before it runs
                oid = _types.sqlite_declared_oid(decl)
            else:  # an expression: its first value's
                oid = _types.value_oid(next((r[i] for r in rows if r[i] is not None), None))
                if oid in (_types.INT8, _types.FLOAT8, _types.TEXT):
                    if settled is None:
                        settled = _settled_types(sql, len(desc))
                    if oid == _types.FLOAT8 and not settled[i] and not looked_up:
                        looked_up = True  # big + 1 of a BIGINT column: its columns' types
                        settled = [a or b for a, b in zip(
                            settled, self._expression_types(sql, len(desc)), strict=True)]
                    if settled[i] == _types.BOOL or (
                            settled[i] == _types.INT8 and oid == _types.FLOAT8) or (
                            settled[i] in _TEXT_CASTS and oid == _types.TEXT):
                        oid = settled[i]  # true, a = b: bool; '1 day'::interval (its
                        # text as stored) an interval, '2024-01-02'::date a date, ...;
                        # an integer that overflowed:
                        try:  # 22003 (SQLite's integer arithmetic went on in floats)
                            rows = [(*r[:i], _types.conform(oid, r[i]), *r[i + 1:])
                                    for r in rows]
                        except ValueError as exc:
                            raise StatementError(*exc.args) from None
            columns.append((name, oid))
        read = [(i, oid if oid != _types.NUMERIC else _types.numeric_type(desc[i][1]))
                for i, (_, oid) in enumerate(columns)
                if desc[i][1] and _types.sqlite_reads(oid)]
        if read and rows:  # the stored values as their declared type
            rows = [_typed(r, read) for r in rows]
        return Result(columns, rows, command_tag(sql, len(rows), True))

    def _fresh(self) -> None:
        """A statement starts (the caller holds :attr:`lock`): a cancel sent before it is
        not for it."""
        if self._cancel.is_set():  # (Event.clear takes a lock: a Python call)
            self._cancel.clear()
        self._busy_cancelled = False
        self._writing = False

    def _failure(self, exc: Exception) -> StatementError:
        """``exc`` as a StatementError: 57014 when a cancel ended a wait for a lock; 25006
        when a write cannot open what it writes (the database's directory is read-only:
        SQLite cannot make its journal there), as for a read-only file."""
        if self._busy_cancelled and isinstance(exc, apsw.BusyError | apsw.LockedError):
            return _cancelled()
        if isinstance(exc, apsw.CantOpenError) and self._writing:
            return StatementError(
                "cannot write the database: its directory is read-only, and SQLite cannot "
                "make its journal there (unable to open database file)", "25006",
                hint="make the database's directory writable by the server")
        return statement_error(exc)

    def run(self, sql: str, params: list[Any]) -> Result:
        with self.lock:
            self._fresh()
            if sql == "BEGIN IMMEDIATE" and not self.writing:
                self._queue_for_writing()
            self._ticks = 0
            try:
                rows, changes = self._step(sql, params)
            except Exception as exc:
                raise self._failure(exc) from None
            if self._wal and sql[:6].upper() in _WRITE_HEADS:
                self._learn(sql)
        return self._result(sql, rows, changes)

    def _learn(self, sql: str) -> None:
        """Note whether the write ``sql`` just ran within QUICK_STEPS VM steps."""
        if len(self._short_writes) >= 4096:
            self._short_writes.clear()
        self._short_writes[sql] = self._ticks == 0 and self._short_writes.get(sql, True)

    def run_write_quick(self, sql: str, params: list[Any],
                        deadline: float | None = None) -> Result | None:
        """In WAL mode, in a write transaction (this session holds the write lock, so no
        lock is waited for), run a write on the calling thread (the event loop) if every
        earlier run of its text took fewer than QUICK_STEPS VM steps. A write that runs
        long this time is not handed to the thread midway (that would mean failing it):
        it runs to its end here, unless it passes ``deadline`` (the statement timeout,
        checked every QUICK_STEPS VM steps), which stops it with 57014 as the timeout
        would on the thread (SQLite then rolls the whole transaction back, and the write
        lock is released); its text goes back to the thread from then on. None, having
        done nothing, otherwise."""
        if not (self.writing and self._short_writes.get(sql) and self.conn.in_transaction):
            return None
        if not self.lock.acquire(blocking=False):
            return None
        try:
            if self._cancel.is_set():  # (Event.clear takes a lock: a Python call)
                self._cancel.clear()
            self._ticks = 0
            self._deadline = deadline
            try:
                rows, changes = self._step(sql, params)
            except apsw.InterruptError:
                raise _cancelled() from None
            except Exception as exc:
                raise statement_error(exc) from None
            finally:
                self._deadline = None
                self._learn(sql)
                if not self.conn.in_transaction:  # SQLite rolled it back (the interrupt)
                    self._finish()  # the write lock goes
        finally:
            self.lock.release()
        return self._result(sql, rows, changes)

    def _busy(self, count: int) -> bool:
        """SQLite's busy handler: wait for another connection's lock up to the lock timeout,
        in SQLite's own steps, unless a cancel (:meth:`interrupt`) ends the wait."""
        now = time.monotonic()
        if count == 0:
            self._busy_since = now
        left = self.engine.busy_timeout_ms / 1000 - (now - self._busy_since)
        if left <= 0:
            return False
        if self._cancel.wait(min(_BUSY_PAUSES[min(count, len(_BUSY_PAUSES) - 1)], left)):
            self._busy_cancelled = True
            return False
        return True

    def run_quick(self, sql: str, params: list[Any]) -> Result | None:
        """Run a read-only statement on the calling thread (the server's event loop) if it
        finishes at once; None, having done nothing, when it would wait for a lock or run
        more than :data:`QUICK_STEPS` SQLite VM steps (the caller then runs it with
        :meth:`run` on the session's thread, where a cancel or timeout can stop it)."""
        if not self.lock.acquire(blocking=False):
            return None
        try:
            self._quick, self._stopped = True, False
            self.conn.set_busy_handler(None)  # a lock held elsewhere: SQLITE_BUSY at once
            try:
                rows, changes = self._step(sql, params)
            except (apsw.BusyError, apsw.LockedError):
                return None
            except apsw.InterruptError as exc:
                if self._stopped:
                    return None
                raise statement_error(exc) from None
            except Exception as exc:
                raise statement_error(exc) from None
            finally:
                self._quick = False
                self.conn.set_busy_handler(self._busy)
        finally:
            self.lock.release()
        return self._result(sql, rows, changes)

    def _progress(self) -> bool:
        """SQLite's progress handler: stop a :meth:`run_quick` statement that runs long."""
        if self._quick:
            self._stopped = True
            return True
        self._ticks += 1
        return self._deadline is not None and time.monotonic() >= self._deadline

    def describe(self, sql: str) -> list[tuple[str, int]] | None:
        desc: list[tuple[str, str | None]] = []

        def trace(cursor: apsw.Cursor, _sql: str, _bindings: Any) -> bool:
            desc[:] = [(d[0], d[1]) for d in cursor.get_description()]
            return False  # prepared, never stepped

        with self.lock:
            self._fresh()
            cur = self.conn.cursor()
            cur.exec_trace = trace
            try:
                cur.execute(self._sql(sql), [None] * _sqltext.placeholders(sql),
                            can_cache=self.can_cache)
            except apsw.ExecTraceAbort:
                pass
            except Exception as exc:
                raise self._failure(exc) from None
            finally:
                cur.close()
        if not desc:
            return None
        inferred = self._expression_types(sql, len(desc)) \
            if any(not decl for _, decl in desc) else []
        return [(name, _types.sqlite_declared_oid(decl) if decl else
                 inferred[i] or _expression_oid(name)) for i, (name, decl) in enumerate(desc)]

    def _expression_types(self, sql: str, count: int) -> list[int]:
        """The type of each of ``sql``'s ``count`` result columns its text settles
        (:mod:`._exprtypes`; 0: not settled), its tables' columns looked up by name."""
        from ._exprtypes import select_types

        named = {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z0-9_$]*", sql)}
        found: dict[str, set[int]] = {}
        for name, _kind in self.relations():
            if name.lower() in named:
                try:
                    columns = self.column_types(name)
                except StatementError:
                    continue
                for column, oid in columns:
                    found.setdefault(column.lower(), set()).add(oid)

        def column_type(name: str) -> int:
            oids = found.get(name.lower(), set())
            return next(iter(oids)) if len(oids) == 1 else 0

        types = select_types(sql, column_type)
        return types if types is not None and len(types) == count else [0] * count

    def authorize(self, sql: str, privileges: Any) -> None:
        """SQLite prepares ``sql`` (never steps it) with ``privileges``' authorizer."""
        if privileges.admin:
            return

        def trace(_cursor: apsw.Cursor, _sql: str, _bindings: Any) -> bool:
            return False  # prepared, never stepped

        with self.lock:
            check, recording = self.check, self.recording
            self.check, self.recording = privileges.sqlite_authorizer(), False
            self.conn.authorizer = self._authorize
            cur = self.conn.cursor()
            cur.exec_trace = trace
            try:
                text = _sqlite_casts(_sqltext.quote_index_names(
                    postgres_spelling(sql, "quote({})", _sqlite_blob)))
                text = _sqltext.substitute(text, _placeholder) if "$" in text else text
                cur.execute(_sqltext.unqualify(text, schemas=_PUBLIC_SCHEMA),
                            [None] * _sqltext.placeholders(sql), can_cache=False)
            except apsw.ExecTraceAbort:
                pass
            except apsw.AuthError as exc:
                raise statement_error(exc) from None
            except apsw.Error:
                pass  # not a refusal: it shows when the statement runs
            finally:
                cur.close()
                self.check, self.recording = check, recording

    def authorize_copy_in(self, table: str, privileges: Any) -> None:
        # COPY runs INSERTs: prepared with the table's triggers, as they are
        self.authorize(f"INSERT INTO {'.'.join(_quote(p) for p in table.split('.'))} "
                       "DEFAULT VALUES", privileges)

    def _queue_for_writing(self) -> None:
        """Wait for this server's other write transactions, in a queue: woken as soon as
        one ends, where SQLite's busy handler would poll with sleeps of up to 100 ms. A
        cancel ends the wait (57014) without the lock."""
        if not self.engine.write_queue.acquire(timeout=self.engine.busy_timeout_ms / 1000,
                                               cancel=self._cancel):
            raise self._not_queued()
        self.writing = True

    def _not_queued(self) -> StatementError:
        if self._cancel.is_set():
            return _cancelled()
        return StatementError("could not obtain the write lock: another transaction held "
                              f"it for {self.engine.busy_timeout_ms / 1000:g} s", "55P03")

    async def begin_write(self) -> bool:
        """In WAL mode, outside a transaction: wait for the write lock on the event loop, in
        the same line as the sessions waiting on their threads (:meth:`WriteQueue.
        acquire_async`: no thread wakes for it, and the turn passes from one transaction to
        the next on the loop), then ``BEGIN IMMEDIATE`` here, which does not wait since the
        lock is held. When SQLite still finds its write lock taken (a connection from
        outside the server) the queue is let go and False returned: the session's thread
        then waits for both as :meth:`run` does. A cancel or the lock timeout ends the
        wait as there (57014, 55P03)."""
        if not self._wal or self.writing or self.conn.in_transaction:
            return False
        self._fresh()
        if not await self.engine.write_queue.acquire_async(self.engine.busy_timeout_ms / 1000,
                                                           self._cancel):
            raise self._not_queued()
        self.writing = True
        if not self.lock.acquire(blocking=False):  # the thread runs nothing: not expected
            return False  # run() then finds the queue held (self.writing)
        try:
            self.conn.set_busy_handler(None)  # SQLite's lock taken: SQLITE_BUSY at once
            try:
                self._step("BEGIN IMMEDIATE", [])  # _finish releases the queue if it fails
            except (apsw.BusyError, apsw.LockedError):
                return False
            except Exception as exc:
                raise statement_error(exc) from None
            finally:
                self.conn.set_busy_handler(self._busy)
        finally:
            self.lock.release()
        return True

    def interrupt(self) -> None:
        if self.interrupt_also is not None:
            self.interrupt_also()
        self._cancel.set()  # a statement waiting for the write lock stops waiting
        self.conn.interrupt()

    def _schema(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Rows of the server's own query of ``sqlite_schema`` (which the session's user may
        not read: the catalogs filter what it gets by its grants)."""
        with self.lock:
            self._fresh()
            check, self.check = self.check, None
            try:
                return list(self.conn.execute(sql, params))
            except Exception as exc:
                raise self._failure(exc) from None
            finally:
                self.check = check

    def relations(self) -> list[tuple[str, str]]:
        rows = self._schema("SELECT name, type FROM sqlite_schema WHERE type IN ('table', "
                            "'view') AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' AND name <> ?",
                            (USERS_JOURNAL,))
        return [(str(n), "r" if t == "table" else "v") for n, t in rows]

    def view_definition(self, name: str) -> str | None:
        rows = self._schema("SELECT sql FROM sqlite_schema WHERE type = 'view' AND name = ?",
                            (name,))
        return str(rows[0][0]) if rows else None

    def columns(self, name: str) -> list[tuple[str, str, bool, str | None]]:
        # the catalog is open to every user, as PostgreSQL's is: no privilege check here
        with self.lock:
            self._fresh()
            check, self.check = self.check, None
            try:
                rows = list(self.conn.execute(
                    "SELECT name, type, \"notnull\", dflt_value FROM pragma_table_info(?)",
                    (name,)))
            except Exception as exc:
                raise self._failure(exc) from None
            finally:
                self.check = check
        return [(str(c), (str(t) or "").lower(), bool(nn), None if d is None else str(d))
                for c, t, nn, d in rows]

    def keys(self, name: str) -> TableKeys:
        # the catalog is open to every user, as PostgreSQL's is: no privilege check here
        keys = TableKeys()
        with self.lock:
            self._fresh()
            check, self.check = self.check, None
            try:
                info = list(self.conn.execute(
                    "SELECT name, pk FROM pragma_table_info(?) WHERE pk > 0 ORDER BY pk",
                    (name,)))
                keys.primary = [str(c) for c, _ in info]
                for index, unique, origin, partial in list(self.conn.execute(
                        "SELECT name, \"unique\", origin, partial FROM pragma_index_list(?) "
                        "ORDER BY name", (name,))):
                    if origin == "pk":
                        continue
                    columns = list(self.conn.execute(
                        "SELECT cid, name FROM pragma_index_info(?) ORDER BY seqno", (index,)))
                    if any(cid < 0 for cid, _ in columns):  # an expression or the rowid
                        continue
                    where = None
                    if partial:
                        ((sql,),) = self.conn.execute(
                            "SELECT sql FROM sqlite_schema WHERE type = 'index' AND name = ?",
                            (index,)).fetchall()
                        m = re.search(r"(?is)\bWHERE\b(.*)$", str(sql))
                        where = m[1].strip() if m else None
                    keys.indexes.append((str(index), bool(unique), origin == "u",
                                         [str(c) for _, c in columns], where))
                foreign: dict[int, tuple[list[str], str, list[str], str, str]] = {}
                for fk, _seq, parent, src, dst, on_update, on_delete in list(self.conn.execute(
                        "SELECT id, seq, \"table\", \"from\", \"to\", on_update, on_delete "
                        "FROM pragma_foreign_key_list(?) ORDER BY id, seq", (name,))):
                    entry = foreign.setdefault(fk, ([], str(parent), [], str(on_update),
                                                    str(on_delete)))
                    entry[0].append(str(src))
                    if dst is not None:
                        entry[2].append(str(dst))
            except Exception as exc:
                raise self._failure(exc) from None
            finally:
                self.check = check
        keys.foreign = [(cols, parent, dst or None, upd, dele)
                        for cols, parent, dst, upd, dele in foreign.values()]
        return keys

    def column_types(self, table: str) -> list[tuple[str, int]]:
        return [(c, _types.sqlite_declared_oid(t)) for c, t, _nn, _d in self.columns(table)]

    def table_names(self) -> set[str]:
        """The names (lower case) of the tables and views of the ``main`` database, as this
        connection sees them (in its transaction); no privilege check (the catalog)."""
        with self.lock:
            self._fresh()
            check, self.check = self.check, None
            try:
                rows = list(self.conn.execute(
                    "SELECT name FROM sqlite_schema WHERE type IN ('table', 'view')",
                    can_cache=False))
            except Exception as exc:
                raise self._failure(exc) from None
            finally:
                self.check = check
        return {str(n).lower() for (n,) in rows}

    def forget_table_grants(self, store: Any) -> list[str]:
        """Remove the grants on unqualified names no table or view has (tables dropped or
        renamed where the server did not see it: an embedded connection while it was
        stopped), committed with the database's record of user changes as every change
        to the users is (:meth:`commit_users`). Returns the names.

        The names are read first without the write lock, which is taken only when a
        grant is to go, without waiting on another process that holds it: then, and on
        a database (or directory) that cannot be written, the grants stay, with a
        warning, and the server serves on (a read-only database, read only)."""
        first = _gone_grants(store, self.table_names())
        if not first:
            return []
        try:
            with self._lock_now():
                self.run("BEGIN IMMEDIATE", [])  # no table is made or dropped meanwhile
            tables = self.table_names()
            gone = _gone_grants(store, tables)
            if gone:
                self.commit_users(store, [("forget_table_grants", (tables,), {})])
            return gone
        except (StatementError, CryptdiskError, OSError, apsw.Error) as exc:
            log.warning("the grants on %s stay, though no table has the name: %s (they are "
                        "removed at a start that can write the database)",
                        ", ".join(first), exc)
            return []
        finally:
            if self.conn.in_transaction:
                self.run("ROLLBACK", [])

    @contextlib.contextmanager
    def _lock_now(self) -> Iterator[None]:
        """Meanwhile a lock SQLite finds held by another connection fails at once
        (SQLITE_BUSY, 55P03) instead of waiting up to the lock timeout."""
        self.conn.set_busy_handler(None)
        try:
            yield
        finally:
            self.conn.set_busy_handler(self._busy)

    def copy_in(self, table: str, columns: list[str] | None,
                batches: Iterable[list[list[Any]]], *, oids: list[int] | None = None) -> int:
        """The rows inserted a batch at a time inside a savepoint of the statement's
        transaction, which an error (from ``batches`` too) rolls back to."""
        declared = self.columns(table)
        kinds = {c.lower(): _types.sqlite_declared_oid(t) for c, t, _n, _d in declared}
        names = columns or [c for c, _t, _n, _d in declared]
        numeric = [j for j, name in enumerate(names) if kinds.get(name.lower()) == _types.NUMERIC]
        intervals = [j for j, name in enumerate(names)
                     if kinds.get(name.lower()) == _types.INTERVAL]
        # text read by the column type's PostgreSQL input (SQLite would keep 'abc' of a
        # DOUBLE PRECISION column, or 1e30 of an INTEGER one, as it is)
        typed = [(j, name, _COPY_INPUTS[kind]) for j, name in enumerate(names)
                 if (kind := kinds.get(name.lower())) in _COPY_INPUTS]
        width: int | None = None
        count = 0
        sql = ""
        if self.recording:
            self.last_tables = set()
        with self.lock:
            self._fresh()
            cur = self.conn.cursor()
            try:
                cur.execute("SAVEPOINT cryptdisk_copy")
                try:
                    for rows in batches:
                        if not rows:
                            continue
                        if oids is not None:
                            rows = [[_sqlite_value(v) for v in row] for row in rows]
                        if width is None:
                            width = len(rows[0])
                            have = len(declared)
                            if columns is None and have and width != have:
                                raise StatementError(f"COPY row 1 has {width} fields for "
                                                     f"{have} columns", "22P04")
                            cols = f" ({', '.join(_quote(c) for c in columns)})" \
                                if columns else ""
                            target = ".".join(_quote(p) for p in table.split("."))
                            sql = self._tagged(f"INSERT INTO {target}{cols} "  # noqa: S608
                                               f"VALUES ({', '.join('?' * width)})")
                        for i, row in enumerate(rows):
                            if len(row) != width:
                                raise StatementError(f"COPY row {count + i + 1} has {len(row)} "
                                                     f"fields, the first has {width}", "22P04")
                        if oids is None:  # text into a NUMERIC column: SQLite makes it a
                            for j in numeric:  # REAL, maybe another number
                                if j < width:
                                    for row in rows:
                                        _exact_numeric_text(row[j])
                            for j in intervals:  # stored as a parameter's (interval_strings)
                                if j < width:
                                    for row in rows:
                                        row[j] = _sqlite_interval_cast(row[j])
                            for j, name, read in typed:
                                if j < width:
                                    _copy_typed(rows, j, name, read, count)
                        cur.executemany(sql, rows, can_cache=self.can_cache)
                        count += len(rows)
                        if self._cancel.is_set():  # (sent while the rows were coming)
                            raise _cancelled()
                except BaseException:
                    cur.execute("ROLLBACK TO cryptdisk_copy")
                    raise
                finally:
                    cur.execute("RELEASE cryptdisk_copy")
            except Exception as exc:
                raise self._failure(exc) from None
            finally:
                cur.close()
                self._finish(release=False)
        return count

    def close(self) -> None:
        try:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
        finally:
            self.conn.close()
            if self.writing:
                self.writing = False
                self.engine.write_queue.release()


def _gone_grants(store: Any, tables: set[str]) -> list[str]:
    """The unqualified names the users and roles of ``store`` have grants on that are not
    in ``tables`` (lower case), sorted."""
    return sorted({t for entry in [*store.users.values(), *store.roles.values()]
                   for t in entry.get("grants", {}) if "." not in t and t not in tables})


class SQLiteEngine(Engine):
    """An encrypted SQLite database (:func:`cryptdisk.sqlite.connect`), a connection per client.

    ``plaintext=True`` serves an unencrypted SQLite file instead (``keyring`` is then
    unused): the baseline ``cryptdisk bench server`` compares the encrypted one with;
    ``cryptdisk serve`` never does this.
    """

    name = "sqlite"
    transactions = True
    #: a statement's integer literals may run as parameters (:func:`._sqltext.lift_literals`)
    lifts_literals = True

    def __init__(self, path: str | os.PathLike[str], keyring: Any, *,
                 busy_timeout_ms: int = 30000, plaintext: bool = False) -> None:
        self.path = os.fspath(path)
        self.keyring = keyring
        self.busy_timeout_ms = busy_timeout_ms
        self.plaintext = plaintext
        #: held by the session in a write transaction (BEGIN IMMEDIATE); the others queue
        self.write_queue = WriteQueue(self.path)
        #: WAL mode: the syncs that make commits durable, shared (group commit)
        self.group_sync = GroupSync(self.path)
        self._reader: Any = None  # (pid, connection) of read_users_record
        self._reader_lock = threading.Lock()
        if plaintext:
            apsw.Connection(self.path).close()
            return
        # open once now, so a wrong key or a tampered header fails at start-up
        from ..sqlite import connect

        connect(self.path, keyring=keyring).close()

    def open_session(self) -> EngineSession:
        return _SQLiteSession(self)

    def read_users_record(self, wait: bool = True) -> tuple[int, bytes] | None:
        """The last record of committed user changes in :data:`USERS_JOURNAL`: ``(serial,
        user-file JSON)``, or None (none yet; or ``wait=False`` and a writer holds the
        database locked). A :class:`._users.UserStore` ``journal``."""
        with self._reader_lock:
            if self._reader is None or self._reader[0] != os.getpid():
                if self.plaintext:
                    conn = apsw.Connection(self.path)
                else:
                    from ..sqlite import connect

                    conn = connect(self.path, keyring=self.keyring)
                self._reader = (os.getpid(), conn)
            conn = self._reader[1]
            # short: the caller holds the user file, which a writer may be waiting for
            conn.set_busy_timeout(min(self.busy_timeout_ms, 2000) if wait else 0)
            try:
                rows = list(conn.execute(_JOURNAL_READ))
            except apsw.SQLError:
                return None  # no such table: no transaction has changed users
            except (apsw.BusyError, apsw.LockedError):
                if wait:
                    log.warning("the record of committed user changes could not be read "
                                "(the database is locked); it is read at the next change")
                return None
        return _users_record(self.path, rows)

    def close(self) -> None:
        with self._reader_lock:
            reader, self._reader = self._reader, None
        if reader is not None and reader[0] == os.getpid():
            reader[1].close()
        self.group_sync.close()
        self.write_queue.close()
        super().close()

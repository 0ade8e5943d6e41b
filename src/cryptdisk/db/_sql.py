"""The statements cryptdisk handles itself; everything else goes to DuckDB as it is.

Recognised (case-insensitive, ClickHouse's storage vocabulary)::

    CREATE TABLE [IF NOT EXISTS] t (c1 TYPE [NOT NULL] [DEFAULT expr], ...) [ENGINE = MergeTree[()]]
        [ORDER BY col | ORDER BY (c1, c2)] [SETTINGS storage_policy = 'name']
    CREATE TABLE [IF NOT EXISTS] t [ENGINE = MergeTree[()]] [ORDER BY ...] [SETTINGS ...]
        AS {SELECT ... | WITH ... | FROM ... | VALUES ...}
    INSERT INTO t [(c1, ...) | BY NAME | BY POSITION]
        {SELECT ... | VALUES ... | WITH ... | FROM ...}
    INSERT INTO t DEFAULT VALUES
    COPY t [(c1, ...)] FROM 'file' [(options) | WITH (options)]
    DROP TABLE [IF EXISTS] t
    TRUNCATE [TABLE] t
    ALTER TABLE t MODIFY SETTING storage_policy = 'name'
    ALTER TABLE t RENAME TO u | ADD [COLUMN] [IF NOT EXISTS] c TYPE [NOT NULL] [DEFAULT e]
        | DROP [COLUMN] [IF EXISTS] c | RENAME [COLUMN] a TO b
        | ALTER [COLUMN] c [SET DATA] TYPE t
        | ALTER [COLUMN] c {SET DEFAULT expr | DROP DEFAULT | SET NOT NULL | DROP NOT NULL}
    OPTIMIZE TABLE t [FINAL]
    SYSTEM ROTATE KEYS | SYSTEM REENCRYPT
    DELETE FROM t [[AS] a] [WHERE cond]
    UPDATE t [[AS] a] SET c = expr [, ...] [WHERE cond]

Statements that would change tables behind cryptdisk's back (``MERGE``) or let DuckDB
spill plaintext to disk (``SET temp_directory``) are refused with a clear error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import duckdb

from ..errors import DatabaseError, NotSupportedError
from ._columns import UNQUOTED_IDENT, matching_paren, referenced_tables

__all__ = [
    "AlterSetting",
    "AlterTable",
    "CopyFrom",
    "CreateTable",
    "Delete",
    "DropTable",
    "Insert",
    "Optimize",
    "Passthrough",
    "SystemCommand",
    "Truncate",
    "Update",
    "change_statement",
    "check_passthrough",
    "copy_to_target",
    "first_word",
    "parse",
    "qualified_target",
    "split_statements",
]

_IDENT = rf'(?:"(?:[^"]|"")+"|`[^`]+`|{UNQUOTED_IDENT})'
_FORBIDDEN_SETTINGS = ("temp_directory", "max_temp_directory_size", "temp_file_encryption")


@dataclass
class CreateTable:
    name: str
    columns: list[tuple[str, str]]
    order_by: list[str] | None = None
    settings: dict[str, str] = field(default_factory=dict)
    if_not_exists: bool = False
    #: ``CREATE TABLE t ... AS query``: the query whose columns and rows the table gets
    query: str | None = None
    #: the columns declared ``NOT NULL``, and each ``DEFAULT`` expression (SQL, as written)
    not_null: list[str] = field(default_factory=list)
    defaults: dict[str, str] = field(default_factory=dict)


@dataclass
class Insert:
    table: str
    query: str
    columns: list[str] | None = None
    by_name: bool = False  # INSERT INTO t BY NAME: the query's columns matched by name


@dataclass
class CopyFrom:
    """``COPY table [(c1, ...)] FROM source``: DuckDB's ``COPY`` of a file, as one insert."""

    table: str
    source: str  # the text after FROM: 'file' and DuckDB's options, as written
    columns: list[str] | None = None


@dataclass
class DropTable:
    name: str
    if_exists: bool = False


@dataclass
class Truncate:
    name: str


@dataclass
class AlterSetting:
    name: str
    settings: dict[str, str]


@dataclass
class AlterTable:
    """``ALTER TABLE name`` changing the table's name or columns (see :mod:`._schema`)."""

    name: str
    #: "rename" (RENAME TO), "add", "drop", "rename_column", "type", "set_default",
    #: "drop_default", "set_not_null", "drop_not_null"
    action: str
    column: str | None = None  # the column added, dropped or renamed
    new_name: str | None = None  # RENAME TO's table name, RENAME COLUMN's column name
    type: str | None = None  # ADD COLUMN's type, ALTER COLUMN ... TYPE's new one
    if_exists: bool = False  # ADD COLUMN IF NOT EXISTS, DROP COLUMN IF EXISTS
    not_null: bool = False  # ADD COLUMN c t NOT NULL
    default: str | None = None  # ADD COLUMN c t DEFAULT expr


@dataclass
class Optimize:
    name: str
    final: bool = False


@dataclass
class SystemCommand:
    command: str  # "rotate" or "reencrypt"


@dataclass
class Delete:
    table: str
    where: str | None = None  # SQL over the table's columns (None: every row)
    alias: str | None = None  # the name the WHERE qualifies columns with (None: the table's)


@dataclass
class Update:
    table: str
    assignments: list[tuple[str, str]]  # (column, SQL expression), in the order written
    where: str | None = None
    alias: str | None = None


@dataclass
class Passthrough:
    sql: str


Statement = (CreateTable | Insert | CopyFrom | DropTable | Truncate | AlterSetting | AlterTable
             | Optimize | SystemCommand | Delete | Update | Passthrough)


def unquote(ident: str, fold: bool = False) -> str:
    """The name identifier ``ident`` writes: unquoted, and without quotes folded to lower
    case if ``fold`` (setting names). Table and column names keep their case, as in
    DuckDB, and are looked up in any case."""
    if ident.startswith('"') and ident.endswith('"'):
        return ident[1:-1].replace('""', '"')
    if ident.startswith("`") and ident.endswith("`"):
        return ident[1:-1]
    return ident.lower() if fold else ident


#: What :func:`split_statements` looks at: text without any is one statement as it is.
#: (``$`` alone is a parameter's or a name's; ``$$`` or ``$tag$`` may open a string.)
_SPLIT_TOKEN = re.compile(r"[;'\"`]|--|/\*|\$[\w\x80-\U0010ffff]*\$")
#: Where :func:`_split` stops: the next character that may start a string or comment.
_SPLIT_NEXT = re.compile(r"[;'\"`$]|--|/\*")
#: A dollar quote's delimiter, as DuckDB reads it: ``$$`` or ``$tag$`` (a tag is a name
#: without ``$``, not starting with a digit).
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_COMMENT_MARK = re.compile(r"/\*|\*/")
_COMMENT_MARK_B = re.compile(rb"/\*|\*/")


def split_statements(sql: str) -> list[str]:
    """Split on ``;`` outside strings (``'...'``, ``E'...'``, ``$$...$$``,
    ``$tag$...$tag$``), quoted names and comments; drop comments and empty statements.
    What is a string, a name or a comment is what DuckDB's own tokenizer reads (so
    ``1$$;$$`` is a number and a string, ``1E'\\';'`` a number and an E-string, as DuckDB
    reads them), as placeholders are found (``._params``)."""
    if _SPLIT_TOKEN.search(sql) is None:  # one statement, as it is
        one = sql.strip()
        return [one] if one else []
    return _split_tokens(sql)


def _split_tokens(sql: str) -> list[str]:
    """:func:`split_statements` by DuckDB's tokenizer: its ``;`` operators end statements,
    its comments are dropped (a space in their place keeps words apart)."""
    import duckdb

    try:
        raw = sql.encode("utf-8")
        tokens = duckdb.tokenize(sql)
    except (UnicodeEncodeError, duckdb.Error):
        return _split(sql)  # (a lone surrogate; DuckDB cannot read it: fails as it runs)
    out: list[str] = []
    buf: list[bytes] = []
    pos = 0
    for at, kind in tokens:
        if at < pos:
            continue  # (inside a comment dropped already)
        if kind == duckdb.token_type.operator and raw[at:at + 1] == b";":
            buf.append(raw[pos:at])
            out.append(b"".join(buf).decode().strip())
            buf, pos = [], at + 1
        elif kind == duckdb.token_type.comment:
            buf.append(raw[pos:at])
            if raw.startswith(b"--", at):
                end = raw.find(b"\n", at)
                pos = len(raw) if end < 0 else end
            else:  # /* ... */, nested
                buf.append(b" ")
                pos = _comment_end(raw, at)
    buf.append(raw[pos:])
    out.append(b"".join(buf).decode().strip())
    return [st for st in out if st]


def _comment_end(raw: bytes, at: int) -> int:
    """The end of the (nested) ``/* ... */`` comment at byte ``at`` of ``raw``."""
    depth, j = 1, at + 2
    while depth:
        m = _COMMENT_MARK_B.search(raw, j)
        if m is None:
            return len(raw)
        depth += 1 if m.group() == b"/*" else -1
        j = m.end()
    return j


def _ident_char(c: str) -> bool:
    return c.isalnum() or c in "_$" or c >= "\x80"


def _split(sql: str) -> list[str]:
    out: list[str] = []
    buf: list[str] = []
    i, n = 0, len(sql)
    while True:
        m = _SPLIT_NEXT.search(sql, i)
        if m is None:
            buf.append(sql[i:])
            break
        s = m.start()
        buf.append(sql[i:s])
        c = sql[s]
        if c == ";":
            out.append("".join(buf).strip())
            buf = []
            i = s + 1
        elif c in "'\"`":
            # E'...' takes backslash escapes (E not the end of a longer name)
            escaped = (c == "'" and s > 0 and sql[s - 1] in "eE"
                       and (s < 2 or not _ident_char(sql[s - 2])))
            if escaped:
                j = s + 1
                while j < n and sql[j] != "'":
                    j += 2 if sql[j] == "\\" else 1
                while j + 1 < n and sql[j + 1] == "'":  # '' inside
                    j += 2
                    while j < n and sql[j] != "'":
                        j += 2 if sql[j] == "\\" else 1
            else:
                j = sql.find(c, s + 1)
                while j >= 0 and j + 1 < n and sql[j + 1] == c:  # '' or "" inside
                    j = sql.find(c, j + 2)
                if j < 0:
                    j = n
            i = min(j + 1, n)
            buf.append(sql[s:i])
        elif c == "$":
            tag = None if s > 0 and _ident_char(sql[s - 1]) else _DOLLAR_TAG.match(sql, s)
            if tag is None:  # a parameter ($1, $name) or part of a name
                i = s + 1
                buf.append("$")
            else:
                j = sql.find(tag.group(), tag.end())
                i = n if j < 0 else j + len(tag.group())
                buf.append(sql[s:i])
        elif sql.startswith("--", s):
            j = sql.find("\n", s)
            i = n if j < 0 else j
        else:  # /* ... */, nested as in DuckDB; a space in its place keeps words apart
            depth, j = 1, s + 2
            while depth:
                mark = _COMMENT_MARK.search(sql, j)
                if mark is None:
                    j = n
                    break
                depth += 1 if mark.group() == "/*" else -1
                j = mark.end()
            i = j
            buf.append(" ")
    out.append("".join(buf).strip())
    return [s for s in out if s]


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses and quotes."""
    parts, depth, buf, quote = [], 0, [], ""
    for c in text:
        if quote:
            buf.append(c)
            if c == quote:
                quote = ""
            continue
        if c in "'\"`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append("".join(buf).strip())
            buf = []
            continue
        buf.append(c)
    if "".join(buf).strip():
        parts.append("".join(buf).strip())
    return parts


def _matching_paren(text: str, start: int) -> int:
    return matching_paren(text, start, "CREATE TABLE")


def _settings(text: str, what: str) -> dict[str, str]:
    out = {}
    for item in _split_top(text):
        m = re.fullmatch(rf"({_IDENT})\s*=\s*(?:'((?:[^']|'')*)'|([A-Za-z0-9_.]+))", item.strip())
        if not m:
            raise DatabaseError(f"cannot read setting {item!r} in {what}; write "
                                "name = 'value'")
        value = m.group(2).replace("''", "'") if m.group(2) is not None else m.group(3)
        out[unquote(m.group(1), fold=True)] = value
    if not out:
        raise DatabaseError(f"{what} names no setting")
    return out


#: What to do instead of each column constraint (``{col}``: the column's name).
_CONSTRAINT_HINTS = {
    "PRIMARY KEY": "tables keep no index that would enforce it; ORDER BY {col} is the "
                   "table's sort key, as in ClickHouse: it sorts each part, and a query on "
                   "it skips parts and row groups",
    "CHECK": "it would not be enforced on insert: declare the column without it, and insert "
             "the rows that pass (INSERT INTO t SELECT ... WHERE ...)",
    "REFERENCES": "find the rows without a match with a LEFT JOIN ... WHERE ... IS NULL",
    "COLLATE": "write the collation in the query that compares or sorts: ORDER BY {col} "
               "COLLATE nocase",
    "GENERATED": "compute the value in the INSERT's SELECT, or in the queries",
    "CONSTRAINT": "declare the columns without constraints",
}
for _same, _as in (("UNIQUE", "PRIMARY KEY"), ("FOREIGN KEY", "REFERENCES"), ("AS", "GENERATED")):
    _CONSTRAINT_HINTS[_same] = _CONSTRAINT_HINTS[_as]
_COLUMN_CONSTRAINT = re.compile(r"(?i)\b(PRIMARY\s+KEY|NOT\s+NULL|NULL|UNIQUE|CHECK|DEFAULT|"
                                r"REFERENCES|COLLATE|GENERATED|AS|CONSTRAINT)\b")
_TABLE_CONSTRAINT = re.compile(r"(?i)(PRIMARY\s+KEY|UNIQUE|CHECK|FOREIGN\s+KEY|CONSTRAINT)\b")
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")


@dataclass
class ColumnSpec:
    """A column's declaration after its name: its type, ``NOT NULL``, ``DEFAULT expr``."""

    type: str
    not_null: bool = False
    default: str | None = None  # SQL, as written


def _blank_nested(text: str) -> str:
    """``text`` with strings, quoted names and what parentheses hold blanked (same length):
    the words left are the declaration's own."""
    blank = list(_QUOTED.sub(lambda m: " " * len(m.group(0)), text))
    depth = 0
    for i, c in enumerate(blank):
        if c == ")":
            depth -= 1
        if depth > 0:
            blank[i] = " "
        if c == "(":
            depth += 1
    return "".join(blank)


def _column_type(table: str, column: str, text: str) -> ColumnSpec:
    """The type of ``column`` declared as ``text``, and its ``NOT NULL`` and ``DEFAULT
    expr`` (a plain ``NULL``, the default, dropped); another constraint refused, naming it
    (DuckDB would read it as part of the type)."""
    found = list(_COLUMN_CONSTRAINT.finditer(_blank_nested(text)))
    spec = ColumnSpec(text[:found[0].start()].strip() if found else text.strip())
    for i, m in enumerate(found):
        kind = " ".join(m.group(1).upper().split())
        if kind == "NULL" and i and found[i - 1].group(1).upper() == "DEFAULT" \
                and not text[found[i - 1].end():m.start()].strip():
            continue  # DEFAULT NULL: the default's expression
        if kind == "NOT NULL":
            spec.not_null = True
        elif kind == "DEFAULT":
            end = found[i + 1].start() if i + 1 < len(found) else len(text)
            if found[i + 1:] and " ".join(found[i + 1].group(1).upper().split()) == "NULL" \
                    and not text[m.end():found[i + 1].start()].strip():
                end = found[i + 2].start() if i + 2 < len(found) else len(text)
            expr = text[m.end():end].strip()
            if not expr or spec.default is not None:
                raise DatabaseError(f"CREATE TABLE {table}: column {column}: DEFAULT needs one "
                                    "expression", hint=f"{column} BIGINT DEFAULT 0")
            spec.default = None if expr.upper() == "NULL" else expr
        elif kind != "NULL":
            why = ("cryptdisk tables keep no index that enforces it; ORDER BY is the table's "
                   "sort key, as in ClickHouse" if kind in ("PRIMARY KEY", "UNIQUE")
                   else "cryptdisk tables take NOT NULL and DEFAULT, no other constraint")
            raise DatabaseError(
                f"CREATE TABLE {table}: column {column}: {kind} is not supported ({why})",
                hint=_CONSTRAINT_HINTS[kind].format(col=column))
    if not spec.type:
        raise DatabaseError(f"CREATE TABLE {table}: column {column} needs a type",
                            hint=f"{column} BIGINT {text.strip()}")
    return spec


def _parse_create(sql: str, m: re.Match[str]) -> CreateTable:
    name = unquote(m.group(2))
    rest = sql[m.end():].lstrip()
    if (q := re.match(rf"(?s)\.\s*({_IDENT})", rest)) is not None:
        table = unquote(q.group(1))
        raise DatabaseError(
            f"CREATE TABLE {name}.{table}: a table is named without a schema (cryptdisk's "
            "tables are in no DuckDB schema)", hint=f"CREATE TABLE {table} (...)")
    if not rest.startswith("("):
        return _parse_create_as(name, rest, bool(m.group(1)))
    close = _matching_paren(rest, 0)
    columns = []
    not_null: list[str] = []
    defaults: dict[str, str] = {}
    for col in _split_top(rest[1:close]):
        tm = _TABLE_CONSTRAINT.match(col.strip())
        if tm:
            kind = " ".join(tm.group(1).upper().split())
            named = re.search(r"\(([^()]*)\)", col)
            cols = named.group(1).strip() if named else "col"
            why = ("cryptdisk tables keep no index that enforces it; ORDER BY is the "
                   "table's sort key, as in ClickHouse" if kind in ("PRIMARY KEY", "UNIQUE")
                   else "cryptdisk tables take NOT NULL and DEFAULT, no other constraint")
            raise DatabaseError(
                f"CREATE TABLE {name}: {' '.join(col.split())} is not supported ({why})",
                hint=_CONSTRAINT_HINTS[kind].format(col=cols if "," not in cols
                                                    else f"({cols})"))
        cm = re.fullmatch(rf"(?s)({_IDENT})\s+(.+)", col.strip())
        if not cm:
            raise DatabaseError(f"CREATE TABLE {name}: column {col!r} needs a name and a type")
        column = unquote(cm.group(1))
        spec = _column_type(name, column, cm.group(2).strip())
        columns.append((column, spec.type))
        if spec.not_null:
            not_null.append(column)
        if spec.default is not None:
            defaults[column] = spec.default
    if not columns:
        raise DatabaseError(f"CREATE TABLE {name}: a table needs at least one column")
    tail = rest[close + 1:].strip()
    tm = re.fullmatch(
        r"(?is)(?:ENGINE\s*=\s*MergeTree(?:\s*\(\s*\))?\s*)?"
        r"(?:ORDER\s+BY\s+(\(.*?\)|" + _IDENT + r"))?\s*"
        r"(?:SETTINGS\s+(.+))?", tail)
    if not tm:
        raise DatabaseError(f"CREATE TABLE {name}: cannot read {tail!r} after the columns; "
                            "expected [ORDER BY col] [SETTINGS storage_policy = 'name']")
    order = _order_by(tm.group(1))
    settings = _settings(tm.group(2), "SETTINGS") if tm.group(2) else {}
    return CreateTable(name, columns, order, settings, bool(m.group(1)), None, not_null,
                       defaults)


def _order_by(text: str | None) -> list[str] | None:
    """The column names of an ``ORDER BY col`` or ``ORDER BY (c1, c2)`` clause's text."""
    if not text:
        return None
    raw = text.strip()
    raw = raw[1:-1] if raw.startswith("(") else raw
    return [unquote(c.strip()) for c in _split_top(raw)] or None


_CREATE_AS = re.compile(
    r"(?is)(?:ENGINE\s*=\s*MergeTree(?:\s*\(\s*\))?\s*)?"
    r"(?:ORDER\s+BY\s+(\([^()]*\)|" + _IDENT + r")\s*)?"
    r"(?:SETTINGS\s+((?:" + _IDENT + r"\s*=\s*(?:'(?:[^']|'')*'|[A-Za-z0-9_.]+)\s*,?\s*)+))?"
    r"AS\b\s*(.*)")


def _parse_create_as(name: str, rest: str, if_not_exists: bool) -> CreateTable:
    """``CREATE TABLE name [ENGINE = MergeTree] [ORDER BY ...] [SETTINGS ...] AS query``
    (``rest``: the text after the name): the columns come from the query."""
    m = _CREATE_AS.fullmatch(rest)
    query = m.group(3).strip() if m else ""
    if not m or not re.match(r"(?is)\(?\s*(SELECT|WITH|VALUES|FROM)\b", query):
        raise DatabaseError(
            f"CREATE TABLE {name}: give the columns, e.g. CREATE TABLE {name} (a BIGINT, "
            f"b VARCHAR), or a query: CREATE TABLE {name} [ORDER BY col] AS SELECT ...",
            hint="the clauses go before AS: ENGINE = MergeTree, ORDER BY, SETTINGS")
    order = _order_by(m.group(1))
    settings = _settings(m.group(2), "SETTINGS") if m.group(2) else {}
    return CreateTable(name, [], order, settings, if_not_exists, query)


#: The first words of the statements :func:`parse` handles or refuses; any other goes to
#: DuckDB untouched, without trying (and, in a new process, compiling) the patterns below.
_OWN_WORDS = frozenset({"CREATE", "INSERT", "COPY", "DROP", "TRUNCATE", "ALTER", "OPTIMIZE",
                        "SYSTEM", "ATTACH", "UPDATE", "DELETE", "SET", "RESET", "PRAGMA",
                        "EXPORT", "IMPORT"})


def first_word(s: str) -> str:
    """The statement's first word (its letters), upper case; empty if it starts otherwise."""
    end = 0
    while end < len(s) and s[end].isalpha():
        end += 1
    return s[:end].upper()


def parse(sql: str) -> Statement:
    """Recognise one statement (no trailing ``;`` needed)."""
    s = sql.strip().rstrip(";").strip()
    if first_word(s) not in _OWN_WORDS:  # SELECT, WITH, FROM, ...: DuckDB's
        return Passthrough(s)
    if m := re.match(rf"(?is)CREATE\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?({_IDENT})\s*", s):
        return _parse_create(s, m)
    if m := re.match(rf"(?is)INSERT\s+INTO\s+({_IDENT})\s*", s):
        rest, cols = s[m.end():], None
        if (q := re.match(rf"(?s)\.\s*({_IDENT})", rest)) is not None:
            name, bare = unquote(m.group(1)), unquote(q.group(1))
            raise DatabaseError(
                f"INSERT INTO {name}.{bare}: a table is named without a schema (cryptdisk's "
                f"tables are in no DuckDB schema, and no attached database is named {name})",
                hint=f"INSERT INTO {bare} ...")
        by = re.match(r"(?is)BY\s+(NAME|POSITION)\b\s*", rest)
        by_name = by is not None and by.group(1).upper() == "NAME"
        if by is not None:  # (BY POSITION: as without it)
            rest = rest[by.end():]
            if by_name and re.match(r"(?is)VALUES\b", rest):
                raise DatabaseError(
                    "INSERT INTO ... BY NAME takes the column names of a query, and VALUES "
                    "has none", hint="INSERT INTO t BY NAME SELECT 1 AS a, 'x' AS b, or "
                    "INSERT INTO t (a, b) VALUES (1, 'x')")
        elif rest.startswith("("):
            close = _matching_paren(rest, 0)
            inner = rest[1:close].strip()
            if not re.match(r"(?is)(SELECT|WITH|VALUES|FROM)\b", inner):
                cols = [unquote(c.strip()) for c in _split_top(inner)]
                rest = rest[close + 1:].strip()
        if cols is None and not by_name and re.fullmatch(r"(?is)DEFAULT\s+VALUES", rest):
            return Insert(unquote(m.group(1)), "DEFAULT VALUES")  # one row of defaults
        if not re.match(r"(?is)\(?\s*(SELECT|WITH|VALUES|FROM)\b", rest):
            raise DatabaseError("INSERT needs SELECT ..., VALUES (...), FROM ... or DEFAULT "
                                "VALUES after the table name")
        if any(word == "RETURNING" for _, word in _top_level_words(rest)):
            raise NotSupportedError("INSERT ... RETURNING is not supported",
                                    hint="the rows inserted are the ones given: keep them, or "
                                    "SELECT them after the INSERT")
        return Insert(unquote(m.group(1)), rest, cols, by_name)
    if m := re.match(rf"(?is)COPY\s+({_IDENT})\s*(\([^()]*\)\s*)?FROM\b\s*", s):
        source = s[m.end():]
        if re.match(r"(?is)STDIN\b", source):
            raise NotSupportedError(
                "COPY ... FROM STDIN is a client's: the embedded database reads files",
                hint=f"COPY {m.group(1)} FROM 'file.csv', or db.insert('{unquote(m.group(1))}', "
                "data) for rows in Python; cryptdisk serve takes COPY FROM STDIN")
        cols = None
        if m.group(2):
            cols = [unquote(c.strip()) for c in _split_top(m.group(2).strip()[1:-1])]
        return CopyFrom(unquote(m.group(1)), source, cols)
    if m := re.fullmatch(rf"(?is)DROP\s+TABLE\s+(IF\s+EXISTS\s+)?({_IDENT})"
                         r"(?:\s+(?:CASCADE|RESTRICT))?", s):  # (a table has no dependents)
        return DropTable(unquote(m.group(2)), bool(m.group(1)))
    if m := re.fullmatch(rf"(?is)TRUNCATE\s+(?:TABLE\s+)?({_IDENT})", s):
        return Truncate(unquote(m.group(1)))
    if (m := re.fullmatch(rf"(?is)ALTER\s+TABLE\s+({_IDENT})\s+((?:RENAME|ADD|DROP|ALTER)\b.*)",
                          s)) and (alter := _parse_alter(unquote(m.group(1)), m.group(2))):
        return alter
    if m := re.fullmatch(rf"(?is)ALTER\s+TABLE\s+({_IDENT})\s+MODIFY\s+SETTINGS?\s+(.+)", s):
        return AlterSetting(unquote(m.group(1)), _settings(m.group(2), "MODIFY SETTING"))
    if m := re.fullmatch(rf"(?is)OPTIMIZE\s+TABLE\s+({_IDENT})(\s+FINAL)?", s):
        return Optimize(unquote(m.group(1)), bool(m.group(2)))
    if m := re.fullmatch(r"(?is)SYSTEM\s+(ROTATE\s+KEYS|REENCRYPT)", s):
        return SystemCommand("rotate" if m.group(1).upper().startswith("ROTATE") else "reencrypt")
    if first_word(s) == "OPTIMIZE":  # cryptdisk's words, which DuckDB does not know
        raise DatabaseError(f"cannot read {s[:60]!r}: OPTIMIZE is OPTIMIZE TABLE t [FINAL]")
    if first_word(s) == "SYSTEM":
        raise DatabaseError(f"cannot read {s[:60]!r}: the SYSTEM statements are SYSTEM ROTATE "
                            "KEYS and SYSTEM REENCRYPT")
    if first_word(s) == "ATTACH":
        _check_attach(s)
        return Passthrough(s)
    if re.match(r"(?is)EXPORT\s+DATABASE\b", s):
        raise DatabaseError(
            "EXPORT DATABASE writes DuckDB's own catalog, which holds none of the database's "
            "tables: it would export none of them",
            hint="back the database up with cryptdisk backup, or export a table in plaintext "
            "with COPY (SELECT * FROM t) TO 'file.parquet'")
    if re.match(r"(?is)IMPORT\s+DATABASE\b", s):
        raise DatabaseError(
            "IMPORT DATABASE would make DuckDB tables in memory, gone at close, not tables of "
            "the database", hint="CREATE TABLE t (...), then INSERT INTO t SELECT * FROM "
            "read_parquet('file.parquet')")
    if re.match(r"(?is)(UPDATE|DELETE)\b", s):
        return _parse_change(s)
    if re.match(r"(?is)(SET|RESET|PRAGMA)\b", s) and any(
            k in s.lower() for k in _FORBIDDEN_SETTINGS):
        raise DatabaseError("DuckDB's temporary files would hold plaintext on disk, so "
                            "cryptdisk keeps spilling off", hint="raise memory_limit instead")
    return Passthrough(s)


_ATTACH_WORDS = frozenset({"ATTACH", "OR", "REPLACE", "DATABASE", "IF", "NOT", "EXISTS"})
_TRUE = frozenset({"", "true", "1", "t", "'true'", "'t'", "'1'"})


def _attach_tokens(s: str) -> list[str]:
    """The tokens of ``s`` as DuckDB's tokenizer reads them (comments left out)."""
    found = duckdb.tokenize(s)
    out = []
    for i, (offset, kind) in enumerate(found):
        stop = found[i + 1][0] if i + 1 < len(found) else len(s)
        if kind != duckdb.token_type.comment:
            out.append(s[offset:stop].strip())
    return out


def _attach_is_safe(s: str) -> tuple[bool, str | None]:
    """(whether ``ATTACH`` statement ``s`` attaches an in-memory database or opens its
    file read-only, the path it names if a plain string), read with DuckDB's tokenizer:
    the path one string (``':memory:' || 'x'`` is a file), the options DuckDB's (a quoted
    ``"READ_ONLY" false`` or a comment are read as DuckDB reads them)."""
    try:
        tokens = _attach_tokens(s)
    except (duckdb.Error, RuntimeError):  # (DuckDB says what is wrong with it when it runs)
        return False, None
    i = 0
    while i < len(tokens) and tokens[i].upper() in _ATTACH_WORDS:
        i += 1
    path = None
    if i < len(tokens) and tokens[i].startswith("'") and (
            i + 1 == len(tokens) or tokens[i + 1].upper() == "AS" or tokens[i + 1] in "(;"):
        path = tokens[i][1:-1].replace("''", "'")
        if path == ":memory:":
            return True, path
    if "(" not in tokens[i:]:
        return False, path
    at = tokens.index("(", i) + 1
    options: list[list[str]] = [[]]
    depth = 0
    for tok in tokens[at:]:
        if tok == ")" and depth == 0:
            break
        depth += tok.count("(") - tok.count(")")
        if tok == "," and depth == 0:
            options.append([])
        else:
            options[-1].append(tok)
    named = [(o[0][1:-1].replace('""', '"') if o[0].startswith('"') else o[0]).lower()
             for o in options if o]
    values = [" ".join(o[1:]).lower() for o in options if o]
    read_only = [v for n, v in zip(named, values, strict=True) if n == "read_only"]
    access = [v for n, v in zip(named, values, strict=True) if n == "access_mode"]
    if any(v not in _TRUE for v in read_only) or \
            any(v not in ("read_only", "'read_only'") for v in access):
        return False, path
    return bool(read_only or access), path


def _check_attach(s: str) -> None:
    """Refuse an ``ATTACH`` of a database file that DuckDB may write: its file is DuckDB's
    plaintext, out of cryptdisk's reach (``ATTACH ':memory:'`` and ``READ_ONLY`` pass)."""
    safe, path = _attach_is_safe(s)
    if safe:
        return
    raise DatabaseError(
        f"ATTACH {'of ' + repr(path) + ' ' if path else ''}without READ_ONLY is not supported: "
        "DuckDB's database file is plaintext, which cryptdisk does not encrypt, and a "
        "statement that writes into it (CREATE TABLE o.x AS SELECT * FROM t) would leave "
        "a decrypted copy of a table's rows on disk",
        hint="ATTACH 'file.duckdb' AS o (READ_ONLY) reads it (SELECT * FROM o.x); write "
        "into an in-memory one, ATTACH ':memory:' AS m; export on purpose with COPY "
        "(SELECT ...) TO 'file.parquet'")


def qualified_target(sql: str) -> str | None:
    """The first part of the qualified name of the table a ``CREATE TABLE``, ``INSERT``,
    ``COPY``, ``DROP TABLE``, ``TRUNCATE``, ``ALTER TABLE``, ``DELETE`` or ``UPDATE``
    acts on (``o`` of ``o.x`` or ``o.main.x``), unquoted; None if it names it alone."""
    if first_word(sql.lstrip()) not in _TARGET_WORDS:
        return None
    m = re.match(_TARGET, sql)
    return unquote(m.group(1)) if m is not None else None


_TARGET_WORDS = frozenset({"CREATE", "INSERT", "COPY", "DROP", "TRUNCATE", "ALTER", "DELETE",
                           "UPDATE"})
_TARGET = (
    rf"(?is)\s*(?:CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+|TEMPORARY\s+)?TABLE\s+"
    rf"(?:IF\s+NOT\s+EXISTS\s+)?|INSERT\s+(?:OR\s+\w+\s+)?INTO\s+|COPY\s+|"
    rf"DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?|TRUNCATE\s+(?:TABLE\s+)?|"
    rf"ALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?|DELETE\s+FROM\s+|UPDATE\s+)({_IDENT})\s*\.")


def _parse_alter(table: str, rest: str) -> AlterTable | None:
    """The ``ALTER TABLE table`` change of name or columns ``rest`` writes, or None for
    another form (a constraint, a policy statement: refused or the server's)."""
    if re.search(r"(?is)\b(MASKING|ROW\s+ACCESS)\s+POLICY\b", rest):
        return None
    if m := re.fullmatch(rf"(?is)ALTER\s+(?:COLUMN\s+)?({_IDENT})\s+(?:SET\s+DATA\s+)?TYPE\s+"
                         r"(.+)", rest):
        column = unquote(m.group(1))
        if re.search(r"(?is)\bUSING\b", m.group(2)):
            return None  # (refused, with the way round it)
        spec = _alter_type(table, column, m.group(2), "ALTER COLUMN")
        if spec.not_null or spec.default is not None:
            raise DatabaseError(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE takes a type "
                                "alone: the column keeps its NOT NULL and DEFAULT",
                                hint=f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {spec.type}")
        return AlterTable(table, "type", column, type=spec.type)
    if m := re.fullmatch(rf"(?is)ALTER\s+(?:COLUMN\s+)?({_IDENT})\s+(SET|DROP)\s+"
                         r"(DEFAULT|NOT\s+NULL)\b\s*(.*)", rest):
        column, verb, what = unquote(m.group(1)), m.group(2).upper(), m.group(3).upper()
        expr = m.group(4).strip()
        action = f"{verb.lower()}_{'default' if what == 'DEFAULT' else 'not_null'}"
        if (action == "set_default") != bool(expr):
            raise DatabaseError(f"ALTER TABLE {table} ALTER COLUMN {column}: cannot read "
                                f"{rest[m.start(2):]!r}",
                                hint=f"ALTER TABLE {table} ALTER COLUMN {column} SET DEFAULT 0, "
                                "DROP DEFAULT, SET NOT NULL or DROP NOT NULL")
        return AlterTable(table, action, column,
                          default=(None if expr.upper() == "NULL" else expr) if expr else None)
    if m := re.fullmatch(rf"(?is)RENAME\s+TO\s+({_IDENT})", rest):
        return AlterTable(table, "rename", new_name=unquote(m.group(1)))
    if m := re.fullmatch(rf"(?is)RENAME\s+(?:COLUMN\s+)?({_IDENT})\s+TO\s+({_IDENT})", rest):
        return AlterTable(table, "rename_column", unquote(m.group(1)),
                          new_name=unquote(m.group(2)))
    if m := re.fullmatch(rf"(?is)DROP\s+(?:COLUMN\s+)?(IF\s+EXISTS\s+)?({_IDENT})"
                         r"(?:\s+(?:CASCADE|RESTRICT))?", rest):
        if m.group(2).upper() == "CONSTRAINT":
            return None
        return AlterTable(table, "drop", unquote(m.group(2)), if_exists=bool(m.group(1)))
    m = re.fullmatch(rf"(?is)ADD\s+(?:COLUMN\s+)?(IF\s+NOT\s+EXISTS\s+)?({_IDENT})\s+(.+)",
                     rest)
    if m is None or _TABLE_CONSTRAINT.match(rest[3:].strip()) or \
            re.match(r"(?is)ADD\s+(?:COLUMN\s+)?\(", rest):
        return None
    column = unquote(m.group(2))
    spec = _alter_type(table, column, m.group(3), "ADD COLUMN")
    return AlterTable(table, "add", column, type=spec.type, if_exists=bool(m.group(1)),
                      not_null=spec.not_null, default=spec.default)


def _alter_type(table: str, column: str, text: str, form: str) -> ColumnSpec:
    """``text``'s column type checked as ``CREATE TABLE`` checks it, its errors naming the
    ``ALTER TABLE table <form>`` they come from."""
    try:
        return _column_type(table, column, text.strip())
    except DatabaseError as exc:
        raise DatabaseError(str(exc).replace(f"CREATE TABLE {table}: column",
                                             f"ALTER TABLE {table} {form}", 1),
                            hint=exc.hint) from None


#: Words after which a ``DELETE`` / ``UPDATE`` clause starts (found outside parentheses,
#: strings and quoted names).
_CLAUSES = ("WHERE", "SET", "FROM", "USING", "RETURNING")
_CHANGE_HINT = "DELETE FROM t [WHERE cond]; UPDATE t SET c = expr [, ...] [WHERE cond]"


def _top_level_words(text: str) -> list[tuple[int, str]]:
    """``(offset, word)`` of each of :data:`_CLAUSES` in ``text`` outside parentheses,
    strings and quoted names; a ``FROM`` after ``DISTINCT`` is the operator ``IS [NOT]
    DISTINCT FROM``, no clause."""
    out, depth, i, n = [], 0, 0, len(text)
    prev = ""
    while i < n:
        c = text[i]
        if c in "'\"`":
            j = text.find(c, i + 1)
            while j >= 0 and j + 1 < n and text[j + 1] == c:  # '' or "" inside
                j = text.find(c, j + 2)
            i = n if j < 0 else j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and (c.isalpha() or c == "_") and (i == 0 or not _ident_char(text[i - 1])):
            j = i
            while j < n and _ident_char(text[j]):
                j += 1
            word = text[i:j].upper()
            if word in _CLAUSES and not (word == "FROM" and prev == "DISTINCT"):
                out.append((i, word))
            prev = word
            i = j
            continue
        i += 1
    return out


def change_statement(sql: str) -> Delete | Update | None:
    """``sql`` read as a ``DELETE`` or ``UPDATE`` (None for another statement); one that
    does not read raises :class:`~cryptdisk.errors.DatabaseError`."""
    st = parse(sql) if first_word(sql.strip()) in ("DELETE", "UPDATE") else None
    return st if isinstance(st, (Delete, Update)) else None


def _parse_change(s: str) -> Delete | Update:
    """``DELETE FROM t [[AS] a] [WHERE cond]`` or ``UPDATE t [[AS] a] SET c = e, ...
    [WHERE cond]``."""
    delete = first_word(s) == "DELETE"
    head = re.match(rf"(?is)DELETE\s+FROM\s+({_IDENT})" if delete
                    else rf"(?is)UPDATE\s+({_IDENT})", s)
    what = "DELETE FROM" if delete else "UPDATE"
    if head is None:
        raise DatabaseError(f"cannot read {s[:60]!r}", hint=_CHANGE_HINT)
    table = unquote(head.group(1))
    rest = s[head.end():]
    if (q := re.match(rf"(?s)\s*\.\s*({_IDENT})", rest)) is not None:
        bare = unquote(q.group(1))
        raise DatabaseError(f"{what} {table}.{bare}: a table is named without a schema "
                            "(cryptdisk's tables are in no DuckDB schema)",
                            hint=f"{what} {bare} ...")
    words = _top_level_words(rest)
    clauses: dict[str, str] = {}
    bounds = [*(w[0] for w in words), len(rest)]
    for (at, word), end in zip(words, bounds[1:], strict=True):
        if word in clauses:
            raise DatabaseError(f"{what} {table}: {word} given twice", hint=_CHANGE_HINT)
        clauses[word] = rest[at + len(word):end].strip()
    before = rest[:words[0][0]] if words else rest
    alias = None
    if before.strip():
        m = re.fullmatch(rf"(?is)\s*(?:AS\s+)?({_IDENT})\s*", before)
        if m is None:
            raise DatabaseError(f"cannot read {s[:60]!r}", hint=_CHANGE_HINT)
        alias = unquote(m.group(1))
    for word, hint in (("USING", "name the other table in a subquery of the WHERE: WHERE id "
                        "IN (SELECT id FROM other)"),
                       ("FROM", "name the other table in a subquery: SET c = (SELECT ... FROM "
                        "other WHERE ...) WHERE id IN (SELECT id FROM other)"),
                       ("RETURNING", "SELECT the rows first, then change them")):
        if word in clauses:
            raise NotSupportedError(f"{what.split()[0]} ... {word} is not supported",
                                    hint=hint)
    where = clauses.get("WHERE")
    if where is not None and not where:
        raise DatabaseError(f"{what} {table}: WHERE needs a condition", hint=_CHANGE_HINT)
    if delete:
        if "SET" in clauses:
            raise DatabaseError(f"cannot read {s[:60]!r}", hint=_CHANGE_HINT)
        return Delete(table, where, alias)
    if "SET" not in clauses or not clauses["SET"]:
        raise DatabaseError(f"UPDATE {table}: SET c = expr is missing", hint=_CHANGE_HINT)
    assignments = []
    for item in _split_top(clauses["SET"]):
        m = re.fullmatch(rf"(?s)(?:{_IDENT}\s*\.\s*)?({_IDENT})\s*=\s*(.+)", item.strip())
        if m is None:
            raise DatabaseError(f"UPDATE {table}: cannot read {item[:60]!r} in SET; write "
                                "column = expression", hint=_CHANGE_HINT)
        assignments.append((unquote(m.group(1)), m.group(2).strip()))
    return Update(table, assignments, where, alias)


_NAME = rf"(?:{_IDENT}\s*\.\s*)?({_IDENT})"  # (a schema before it: the name it qualifies)
_STRINGS = re.compile(r"'(?:[^']|'')*'")


def _alter_form(rest: str, table: str) -> tuple[str, str]:
    """(the ALTER TABLE form ``rest`` is, said as PostgreSQL writes it; how to get its
    effect): the text after ``ALTER TABLE name``."""
    raw = re.findall(r'"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*', rest)
    words = [w.upper() for w in raw]
    way = (f"CREATE TABLE a new table with the columns wanted, INSERT INTO it SELECT ... FROM "
           f"{table} ({{}}), then DROP TABLE {table}")
    alone = (f"ALTER TABLE {table} {' '.join(rest.split())} (the table named alone: no "
             "schema, no IF EXISTS)")
    if words[:2] == ["RENAME", "TO"]:
        return "RENAME TO", alone
    if words[:1] == ["RENAME"]:
        return "RENAME COLUMN", alone
    if words[:1] == ["DROP"]:
        return "DROP COLUMN", alone
    if words[:1] == ["ADD"]:
        if words[1:2] in (["CONSTRAINT"], ["PRIMARY"], ["UNIQUE"], ["FOREIGN"], ["CHECK"]):
            return "ADD CONSTRAINT", f"cryptdisk tables take NOT NULL and DEFAULT only " \
                "(ALTER TABLE t ALTER COLUMN c SET NOT NULL); ORDER BY at " \
                f"CREATE TABLE sorts a table ({way.format('*')})"
        return "ADD COLUMN", alone
    if words[:1] == ["ALTER"]:
        cols = raw[2:] if words[1:2] == ["COLUMN"] else raw[1:]
        column, action = (cols[0], [w.upper() for w in cols[1:]]) if cols else ("c", [])
        if "TYPE" in action[:3]:
            return f"ALTER COLUMN {column} TYPE", (
                f"ALTER TABLE {table} ALTER COLUMN {column} TYPE new_type casts each value as "
                f"CAST({column} AS new_type) does (no USING); for another expression: "
                + way.format(f"the expression AS {column}"))
        said = " ".join(action[:3] if action[1:3] == ["NOT", "NULL"] else action[:2])
        return f"ALTER COLUMN {column} {said}".rstrip(), way.format("*")
    return (" ".join(raw[:2]) or "with no action"), way.format("*")


def copy_to_target(sql: str) -> tuple[str, str | None] | None:
    """For a ``COPY source TO target ...`` statement: how its errors name the source (the
    table's name as written, or ``(query)``) and the target file as DuckDB reads it
    (found by DuckDB's own tokenizer, so quotes doubled, ``$$...$$``, a quoted name,
    comments and a ``TO`` inside the query are read as DuckDB reads them; an ``E'...'``
    string as a ``SELECT`` reads it, its escapes decoded, where DuckDB's ``COPY`` keeps
    the backslashes; None when it is not a string or name). None for any other
    statement."""
    try:
        tokens = [(start, kind) for start, kind in duckdb.tokenize(sql)
                  if kind != duckdb.token_type.comment]
    except Exception:  # (DuckDB's tokenizer fails on no statement it runs)
        return None
    ends = [start for start, _kind in tokens[1:]] + [len(sql)]

    def text(i: int) -> str:
        return sql[tokens[i][0]:ends[i]].strip()

    if len(tokens) < 3 or not re.fullmatch(r"(?i)COPY\b.*", text(0)) or \
            re.fullmatch(r"(?i)FROM\b.*", text(1)):  # (COPY FROM DATABASE a TO b)
        return None
    depth = 0
    for i in range(1, len(tokens)):
        word = text(i)
        if word == "(":
            depth += 1
        elif word == ")":
            depth -= 1
        elif depth == 0 and tokens[i][1] == duckdb.token_type.keyword and \
                re.fullmatch(r"(?i)TO\b.*", word) and i + 1 < len(tokens):
            break
    else:
        return None
    first = sql[tokens[1][0]:]
    source = "(query)" if first.startswith("(") else first.split("(")[0].split()[0]
    j = i + 1
    try:
        with duckdb.connect() as con:
            if tokens[j][1] == duckdb.token_type.string_const:
                k = j  # (strings one after the other are one, as in SELECT 'a' 'b')
                while k + 1 < len(tokens) and tokens[k + 1][1] == duckdb.token_type.string_const:
                    k += 1
                value = con.execute(f"SELECT {sql[tokens[j][0]:ends[k]]}\n").fetchone()
                return source, str(value[0]) if value else None
            if tokens[j][1] in (duckdb.token_type.identifier, duckdb.token_type.keyword):
                return source, con.sql(f"SELECT 1 AS {text(j)}\n").columns[0]
    except duckdb.Error:
        pass
    return source, None


#: DuckDB's error for a file it was asked to read at a ``cryptdisk://`` URL (group 1)
_CRYPTDISK_READ = re.compile(r'No files found that match the pattern "((?i:cryptdisk:)[^"]*)"')


def cryptdisk_read_error(what: str | None, message: str) -> DatabaseError | None:
    """The error of a statement (``what``: how errors name it, or None) that DuckDB failed
    with ``message`` because it reads a ``cryptdisk://`` URL (``read_parquet('cryptdisk://
    ...')``, ``FROM 'cryptdisk://...'``, ``COPY t FROM``): the database's DuckDB has no
    cryptdisk filesystem, so it looked for a local file and found none. None for any other
    message."""
    m = _CRYPTDISK_READ.search(message)
    if m is None:
        return None
    return DatabaseError(
        f"{what + ': ' if what else ''}{m.group(1)}: the database's SQL does not read "
        "cryptdisk:// URLs (its DuckDB has no cryptdisk filesystem: it looked for a local "
        "file of that name)",
        hint="insert its rows into a table, which reads the file through the cryptdisk "
        "filesystem: db.insert('t', 'cryptdisk://DISK/path.parquet') (over the database's "
        "config, or CRYPTDISK_CONFIG's), or fs = fsspec.filesystem('cryptdisk', "
        "config=PATH); db.insert('t', pyarrow.dataset.dataset('DISK/path.parquet', "
        "format='parquet', filesystem=fs)); then query t")


def _check_copy_to(sql: str) -> None:
    """Refuse a ``COPY ... TO`` a ``cryptdisk://`` URL: the database's DuckDB has no
    cryptdisk filesystem, so it wrote the file in plaintext to a local directory named
    ``cryptdisk:`` (under the working directory). A target that cannot be read as a
    name is refused when the statement's text after ``TO`` says ``cryptdisk:``."""
    found = copy_to_target(sql)
    if found is None:
        return
    source, target = found
    if target is None:
        m = re.search(r"(?is)\bTO\b(.*)", sql)
        if m is None or "cryptdisk:" not in m.group(1).lower():
            return
        target = m.group(1).strip()
    elif not target.lstrip().lower().startswith("cryptdisk:"):
        return
    raise DatabaseError(
        f"COPY {source} TO '{target}': the database writes a COPY's file itself, in "
        "plaintext, and not to a cryptdisk:// URL (it would have written a local "
        "directory named cryptdisk:)",
        hint="write the rows through the cryptdisk filesystem: fs = fsspec.filesystem("
        "'cryptdisk', config=PATH); pyarrow.parquet.write_table(db.sql('SELECT ...'), "
        "'DISK/path.parquet', filesystem=fs)")


def check_passthrough(sql: str, tables: set[str]) -> None:
    """Refuse a statement for DuckDB (:class:`Passthrough`) that would act on a cryptdisk
    table or keep a DuckDB table in memory only, with what to write instead.

    DuckDB reads each cryptdisk table a statement names through a view made for that
    statement alone, so ``ALTER TABLE t RENAME`` renamed that view (the table stayed,
    and the new name held the rows of that moment), ``COPY main.t FROM``, ``INSERT OR
    REPLACE INTO t`` and ``WITH ... INSERT INTO t`` failed with "t is not an table", a
    view over ``t`` failed when queried, and ``CREATE OR REPLACE TABLE`` made a table in
    DuckDB's memory, gone at close. ``tables`` are the catalog's table names.
    """
    _check_copy_to(sql)
    s = _STRINGS.sub("''", sql)
    word = first_word(s)

    lower = {t.lower(): t for t in tables}  # (a table is named in any case)

    def named(m: re.Match[str] | None) -> str | None:
        return lower.get(unquote(m.group(1)).lower()) if m is not None else None

    if word == "CREATE":
        m = re.match(rf"(?is)CREATE\s+(OR\s+REPLACE\s+)?(TEMP\s+|TEMPORARY\s+)?TABLE\s+"
                     rf"(?:IF\s+NOT\s+EXISTS\s+)?{_NAME}", s)
        made = unquote(m.group(3)) if m else ""
        if m and m.group(2) and made.lower() in lower:
            raise DatabaseError(f"a temporary table {made} would hide the table {made}",
                                hint="give the temporary table another name")
        if m and m.group(1) and not m.group(2):
            raise DatabaseError(
                f"CREATE OR REPLACE TABLE {made} is not supported (DuckDB would keep the "
                "table in memory, gone when the database closes)",
                hint=f"DROP TABLE IF EXISTS {made}, then CREATE TABLE {made} (...)")
        m = re.match(r"(?is)CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP\s+|TEMPORARY\s+)?VIEW\b", s)
        if m:
            used = referenced_tables(sql, tables)
            if used:
                raise DatabaseError(
                    f"CREATE VIEW over cryptdisk table(s) {', '.join(sorted(used))} is not "
                    "supported: DuckDB reads a table only within the statement that names it",
                    hint="name the query in a WITH clause of the statement that reads it: "
                    "WITH v AS (SELECT ...) SELECT ... FROM v")
        return
    if word in ("ALTER",):
        m = re.match(rf"(?is)ALTER\s+(?:TABLE|VIEW)\s+(?:IF\s+EXISTS\s+)?{_NAME}", s)
        name = named(m)
        if name is not None and m is not None:
            form, hint = _alter_form(s[m.end():], name)
            raise NotSupportedError(
                f"ALTER TABLE {name} {form} is not supported: a cryptdisk table changes by "
                f"ALTER TABLE {name} RENAME TO, ADD, DROP and RENAME COLUMN, ALTER COLUMN c "
                "TYPE t, ALTER COLUMN c SET|DROP DEFAULT|NOT NULL (of the table named alone) "
                f"and ALTER TABLE {name} MODIFY SETTING storage_policy = 'name'",
                hint=hint)
        return
    if word == "DROP":
        name = named(re.match(rf"(?is)DROP\s+VIEW\s+(?:IF\s+EXISTS\s+)?{_NAME}", s))
        if name is not None:
            raise DatabaseError(f"{name} is a table, not a view",
                                hint=f"DROP TABLE {name}")
        return
    if word == "EXPLAIN":
        m = re.match(r"(?is)EXPLAIN\s+(?:ANALYZE\s+)?(\w+)", s)
        if m is not None and m.group(1).upper() in _OWN_WORDS - {"SET", "RESET", "PRAGMA"} \
                and referenced_tables(sql, tables):
            raise DatabaseError(f"EXPLAIN {m.group(1).upper()}: cryptdisk runs that statement "
                                "itself, and DuckDB has no plan of it",
                                hint="EXPLAIN the query it reads: EXPLAIN SELECT ...")
        return
    if word == "COMMENT":
        m = re.match(rf"(?is)COMMENT\s+ON\s+(?:TABLE|VIEW)\s+{_NAME}", s) or re.match(
            rf"(?is)COMMENT\s+ON\s+COLUMN\s+({_IDENT})\s*\.", s)
        name = named(m)
        if name is not None:
            raise DatabaseError(f"COMMENT ON {name}: cryptdisk tables keep no comments (DuckDB "
                                "would comment the view it reads the table through, for the "
                                "statement alone)", hint="keep notes on a table in a table of "
                                "your own, e.g. CREATE TABLE notes (name VARCHAR, note VARCHAR)")
        return
    if word == "MERGE":
        name = named(re.match(rf"(?is)MERGE\s+INTO\s+{_NAME}", s))
        if name is not None:
            raise NotSupportedError(f"MERGE INTO {name} is not supported",
                                    hint=f"UPDATE {name} SET ... WHERE ... for the rows that "
                                    f"match, then INSERT INTO {name} SELECT ... the new rows")
        return
    if word == "COPY":
        # (COPY t FROM of a table named alone is cryptdisk's: see parse)
        name = named(re.match(rf"(?is)COPY\s+{_NAME}\s*(?:\([^)]*\)\s*)?FROM\b", s))
        if name is not None:
            raise DatabaseError(
                f"COPY ... FROM: the table {name} is named without a schema (cryptdisk's "
                "tables are in no DuckDB schema)", hint=f"COPY {name} FROM 'file'")
        return
    if word == "INSERT":
        name = named(re.match(rf"(?is)INSERT\s+OR\s+\w+\s+INTO\s+{_NAME}", s))
        if name is not None:
            raise DatabaseError(f"INSERT OR ... INTO {name} is not supported: tables have "
                                "no key that a row could conflict on",
                                hint=f"INSERT INTO {name} ..., after DELETE FROM {name} WHERE "
                                "... of the rows it replaces")
        return
    if word == "WITH":
        for m in re.finditer(rf"(?is)\b(INSERT\s+INTO|DELETE\s+FROM|UPDATE|MERGE\s+INTO)\s+"
                             rf"{_NAME}", s):
            name = named(re.match(rf"(?s){_NAME}", m.group(0)[len(m.group(1)):].strip()))
            if name is None:
                continue
            if m.group(1).upper().startswith("INSERT"):
                raise DatabaseError(f"WITH ... INSERT INTO {name}: put the WITH after INSERT",
                                    hint=f"INSERT INTO {name} WITH x AS (...) SELECT ... FROM x")
            raise NotSupportedError(
                f"WITH ... {m.group(1).upper().split()[0]} {name} is not supported",
                hint="put the WITH's query in a subquery of the WHERE: DELETE FROM t WHERE id "
                "IN (WITH x AS (...) SELECT id FROM x)")

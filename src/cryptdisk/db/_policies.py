"""Masking and row access policies applied to a query, for one role.

The rewrite shared by ``cryptdisk serve`` (whose ``PolicyStore`` keeps the policies in
a sealed file and runs the statements that manage them) and by embedded connections
that name a role (``cryptdisk.connect(path, config, role="analyst")``, which read the
same file, ``PATH.policies``). It lives in db, below both; the functions policy bodies
call (``mask_last4``, ``decrypt``...) come from ``cryptdisk.fields``::

    rewriter = PolicyRewriter(lambda: data, columns_of)
    text, revealed = rewriter.rewrite_query(sql, session, con)

DuckDB's parser (``json_serialize_sql``) gives the query's tree; every reference to a
table with policies (in subqueries, CTEs, joins, ``UNION`` branches) becomes the
subquery ``(SELECT mask(c1) AS c1, ..., cn FROM t WHERE row_policy(...)) AS t``, and
``json_deserialize_sql`` gives the text that runs. In each policy body the session's
role functions are replaced by constants (``current_role()``, ``current_user``,
``session_user``: the names; ``is_role_in_session('r')``: TRUE or FALSE), so DuckDB folds
``CASE WHEN current_role() IN ('auditor') THEN decrypt(v, 'k') ELSE mask_last4(v) END``
to the one branch the role gets and never runs the other one.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import json
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from .._json import kind as _kind
from .._json import load_object
from ..errors import CryptdiskError, FieldPolicyError, PolicyFileError
from ..format import open_file
from ._columns import _walk, scalar, serialize_sql

__all__ = ["PART_SOURCE", "ROW_NUMBER", "MutationPolicy", "PolicyRewriter", "PolicySession",
           "current_mutation_policy", "embedded_mutation", "mutation_policies",
           "quiet_error", "read_policies", "role_prepare", "role_query", "role_rewrites"]

#: functions of a policy body that the rewrite replaces by the session's values
_ROLE_WORDS = {"current_role", "current_user", "session_user"}
_QUOTED_SYSTEM = re.compile(r'"system"\s*\.\s*(disks|storage_policies|tables|parts|keys)\b')
#: rewritten queries a :class:`PolicyRewriter` keeps (least recently used dropped first)
REWRITE_CACHE_SIZE = 256


class PolicySession:
    """Who a query runs as: the names the role functions of a policy body evaluate to.

    ``roles`` is ``current_user`` and every role it belongs to (what
    ``is_role_in_session`` tests); the server's ``Privileges`` has the same attributes.
    """

    def __init__(self, current_user: str, session_user: str | None = None,
                 roles: frozenset[str] | None = None) -> None:
        self.current_user = current_user
        self.session_user = session_user if session_user is not None else current_user
        self.roles = frozenset(roles or ()) | {current_user}
        self.admin = False

    def __repr__(self) -> str:
        return f"<PolicySession current_user={self.current_user!r}>"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _walk_nodes(node: Any, visit: Callable[[dict[str, Any]], Any]) -> Any:
    """Rebuild ``node`` bottom-up with ``visit`` (which returns a replacement or None)."""
    if isinstance(node, dict):
        done = visit(node)
        if done is not None:
            return done
        return {k: _walk_nodes(v, visit) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk_nodes(v, visit) for v in node]
    return node


def _referenced_columns(tree: Any) -> set[str] | None:
    """The column names (lower case) a query references anywhere, or None when it may
    read whole rows (``*``, ``COLUMNS``, positional or natural references, ``PIVOT``, a
    name that is also a table, alias or CTE name): then a table read through its policies
    gives every column. A name missed here could only make a query fail, never read a
    column around its policy (every column given is the policy's)."""
    refs: set[str] = set()
    singles: set[str] = set()
    relations: set[str] = set()
    for node in _walk(tree):
        kind, cls = node.get("type"), node.get("class")
        if cls in ("STAR", "POSITIONAL_REFERENCE") or kind in ("STAR", "COLUMNS") or \
                "PIVOT" in str(kind) or node.get("ref_type") in ("NATURAL", "POSITIONAL"):
            return None
        if cls == "COLUMN_REF":
            names = [str(n).lower() for n in node.get("column_names") or [""]]
            refs.add(names[-1])
            if len(names) == 1:
                singles.add(names[0])
        for col in node.get("using_columns") or []:
            refs.add(str(col).lower())
        for key in ("table_name", "alias", "cte_name"):  # of tables (expressions have a
            if cls is None and isinstance(node.get(key), str) and node[key]:  # class)
                relations.add(node[key].lower())
        for entry in (node.get("cte_map") or {}).get("map") or []:
            if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                relations.add(entry["key"].lower())
    return None if singles & relations else refs


def _empty() -> dict[str, Any]:
    return {"masking": {}, "row_access": {}, "columns": {}, "rows": {}, "apply": [],
            "audit": []}


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(n, str) for n in value)


def _check_policy(policy: Any, field: str, bad: Callable[[str], PolicyFileError]) -> None:
    if not isinstance(policy, dict):
        raise bad(f"{field} is {_kind(policy)}, not an object")
    args = policy.get("args")
    if not isinstance(args, list) or not args or not all(
            isinstance(a, list) and len(a) == 2 and _is_names(a) for a in args):
        raise bad(f"{field}.args is missing" if args is None else
                  f"{field}.args is not a list of [name, type] pairs")
    for key in ("returns", "body"):
        if not isinstance(policy.get(key), str):
            raise bad(f"{field}.{key} is missing" if policy.get(key) is None else
                      f"{field}.{key} is {_kind(policy[key])}, not a string")


def parse_policies(text: bytes, path: str) -> dict[str, Any]:
    """The policies of a policy file's JSON ``text`` (read from ``path``): every field
    :class:`~cryptdisk.server.PolicyStore` writes, checked; anything else raises
    :class:`~cryptdisk.errors.PolicyFileError` naming ``path`` and the field."""
    def bad(what: str) -> PolicyFileError:
        return PolicyFileError(f"the policy file {path} is malformed: {what}", path=path,
                               hint="restore it from a backup")

    stored = load_object(text, bad)
    version = stored.get("version")
    if type(version) is not int or version != 1:
        raise bad("not a cryptdisk policy file (version 1)")
    data = _empty()
    for key in data:
        value = stored.get(key, data[key])
        if type(value) is not type(data[key]):
            raise bad(f"{key} is {_kind(value)}, not "
                      f"{'an object' if isinstance(data[key], dict) else 'a list'}")
        data[key] = value
    for kind in ("masking", "row_access"):
        for name, policy in data[kind].items():
            _check_policy(policy, f"{kind}[{name!r}]", bad)
    for key in ("apply", "audit"):
        if not _is_names(data[key]):
            raise bad(f"{key} is not a list of role names")
    for table, columns in data["columns"].items():
        field = f"columns[{table!r}]"
        if not isinstance(columns, dict):
            raise bad(f"{field} is {_kind(columns)}, not an object")
        for column, name in columns.items():
            if not isinstance(name, str):
                raise bad(f"{field}[{column!r}] is {_kind(name)}, not a policy name")
            if name not in data["masking"]:
                raise bad(f"{field}[{column!r}] names masking policy {name!r}, which the "
                          "file does not hold")
    for table, entry in data["rows"].items():
        field = f"rows[{table!r}]"
        if not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str) \
                or not _is_names(entry[1]):
            raise bad(f"{field} is not a [policy name, [column, ...]] pair")
        policy = data["row_access"].get(entry[0])
        if policy is None:
            raise bad(f"{field} names row access policy {entry[0]!r}, which the file does "
                      "not hold")
        if len(entry[1]) != len(policy["args"]):
            raise bad(f"{field} gives {len(entry[1])} column(s) to row access policy "
                      f"{entry[0]!r}, which takes {len(policy['args'])}")
    # tables are named in any case (as DuckDB finds them): their policies are kept, and
    # looked up, under the lower-case name (a file may hold a quoted name as written)
    data["columns"] = {t.lower(): cols for t, cols in data["columns"].items()}
    data["rows"] = {t.lower(): entry for t, entry in data["rows"].items()}
    return data


def read_policies(path: str | os.PathLike[str], keyring: Any) -> dict[str, Any]:
    """The policies in a sealed policy file (``cryptdisk serve`` writes it), or none; a
    file that authenticates but is malformed raises
    :class:`~cryptdisk.errors.PolicyFileError`."""
    if not os.path.exists(path):
        return _empty()
    with open_file(os.fspath(path), "rb", keys=keyring) as f:
        return parse_policies(f.read(), os.fspath(path))


class PolicyRewriter:
    """Rewrites queries to read tables through their policies.

    ``data()`` gives the policies (the policy file's dictionary), ``columns(table)`` a
    table's ``{column: type}`` in order (named as the table has them), and
    ``reveals(body)`` whether a body calls a function that reveals protected values (for
    the audit's column list; default: no).
    Parsed policy bodies and rewritten queries are cached until :meth:`clear`; a
    rewritten query is keyed on its text and the session's ``current_user``,
    ``session_user`` and ``roles``, and reused only while the tables it rewrote still
    have the columns they had.
    """

    def __init__(self, data: Callable[[], dict[str, Any]],
                 columns: Callable[[str], dict[str, str]],
                 reveals: Callable[[str], bool] | None = None) -> None:
        self.data, self.columns = data, columns
        self.reveals = reveals or (lambda body: False)
        self._parsed: dict[tuple[str, str], Any] = {}
        #: constants' expression trees by text (role names, ``CAST(NULL AS type)``)
        self._constants: dict[str, Any] = {}
        #: (sql, current_user, session_user, roles) -> (text, revealed, the columns of
        #: each table the rewrite read through its policies)
        self._rewritten: OrderedDict[tuple[Any, ...], tuple[str, list[str], tuple[
            tuple[str, tuple[tuple[str, str], ...]], ...]]] = OrderedDict()
        #: changes with every :meth:`clear`: a rewrite begun before one is not kept
        self._generation = 0
        self._lock = threading.Lock()
        #: rewrites computed (not answered from the cache)
        self.rewrites = 0

    def clear(self) -> None:
        """Forget parsed policy bodies and rewritten queries (call after the policies
        change)."""
        with self._lock:
            self._parsed.clear()
            self._constants.clear()
            self._rewritten.clear()
            self._generation += 1

    @property
    def active(self) -> bool:
        """Whether any table has a policy (else queries run as they are)."""
        data = self.data()
        return bool(data["columns"] or data["rows"])

    def parsed_body(self, kind: str, name: str, con: Any) -> Any:
        """The expression tree of a policy body (cached until :meth:`clear`)."""
        key = (kind, name)
        with self._lock:
            tree = self._parsed.get(key)
        if tree is None:
            body = self.data()[kind][name]["body"]
            parsed = serialize_sql(f"SELECT {body}", con)
            if parsed.get("error"):
                raise FieldPolicyError(f"policy {name} no longer parses", "XX000")
            tree = parsed["statements"][0]["node"]["select_list"][0]
            with self._lock:
                self._parsed[key] = tree
        return copy.deepcopy(tree)

    def constant(self, literal: str, con: Any) -> Any:
        """The expression tree of a constant's text (cached until :meth:`clear`)."""
        with self._lock:
            tree = self._constants.get(literal)
        if tree is None:
            tree = serialize_sql(f"SELECT {literal}", con)["statements"][0]["node"][
                "select_list"][0]
            with self._lock:
                self._constants[literal] = tree
        return copy.deepcopy(tree)

    def prepare(self, session: Any, con: Any) -> None:
        """Parse every policy body, and the constants a rewrite as ``session`` puts in
        them, ahead of a first query (an embedded role connection does it as it opens)."""
        data = self.data()
        for kind in ("masking", "row_access"):
            for name, policy in data[kind].items():
                self.parsed_body(kind, name, con)
                if kind == "masking":
                    self.constant(f"CAST(NULL AS {policy['returns']})", con)
        for name in {session.current_user, session.session_user}:
            self.constant(_literal(name), con)

    def rewrite_query(self, sql: str, session: Any, con: Any) -> tuple[str, list[str]]:
        """``sql`` (a query) reading every table with policies through them, as
        ``session`` (a :class:`PolicySession` or the server's ``Privileges``), and the
        columns (``t.c``) read through a policy that reveals protected values."""
        if not self.active or getattr(session, "admin", False):
            return sql, []
        key = (sql, session.current_user, session.session_user, frozenset(session.roles))
        with self._lock:
            generation = self._generation
            hit = self._rewritten.get(key)
            if hit is not None:
                self._rewritten.move_to_end(key)
        if hit is not None:
            text, revealed, tables = hit
            try:
                same = all(tuple(self.columns(t).items()) == cols for t, cols in tables)
            except CryptdiskError:  # a table gone: rewrite (and report) anew
                same = False
            if same:
                return text, list(revealed)
        text, revealed, tables = self._rewrite(sql, session, con)
        with self._lock:
            if generation == self._generation:  # no policy changed meanwhile
                self._rewritten[key] = (text, revealed, tables)
                self._rewritten.move_to_end(key)
                while len(self._rewritten) > REWRITE_CACHE_SIZE:
                    self._rewritten.popitem(last=False)
        return text, list(revealed)

    def _rewrite(self, sql: str, session: Any, con: Any) -> tuple[
            str, list[str], tuple[tuple[str, tuple[tuple[str, str], ...]], ...]]:
        self.rewrites += 1
        tree = serialize_sql(sql, con)
        if tree.get("error"):
            raise FieldPolicyError("permission denied: tables with policies are read through "
                                   "queries only")
        context = _Context(self, session, con)
        context.used = _referenced_columns(tree)
        original = tree
        tree = context.walk(tree, frozenset())
        tables = tuple(sorted(context.tables.items()))
        if not context.changed:
            return sql, [], tables
        self._keep_names(original, tree, con)
        rewritten = scalar(con, "SELECT json_deserialize_sql(?)", [json.dumps(tree)])
        if rewritten is None:
            raise FieldPolicyError("internal error: a policy rewrite failed", "XX000")
        # DuckDB writes system.parts as "system".parts; the database maps the unquoted form
        text = _QUOTED_SYSTEM.sub(lambda m: f"system.{m[1]}", str(rewritten))
        return text, sorted(context.revealed), tables


    @staticmethod
    def _keep_names(original: dict[str, Any], tree: dict[str, Any], con: Any) -> None:
        """Give each result column the rewrite changed (``(SELECT max(pan) FROM t)``) the
        name DuckDB gives it unwritten (its text), as the session's column name: not the
        rewritten text, which would show the policies' expressions."""
        def top(t: dict[str, Any]) -> Any:
            statements = t.get("statements") or [{}]
            node = statements[0].get("node") if isinstance(statements[0], dict) else None
            while isinstance(node, dict) and node.get("type") == "SET_OPERATION_NODE":
                node = node.get("left")  # (a UNION's columns are named by its first query)
            return node if isinstance(node, dict) and node.get("type") == "SELECT_NODE" \
                else None

        before, after = top(original), top(tree)
        if before is None or after is None:
            return
        items = before.get("select_list") or []
        rewritten = after.get("select_list") or []
        if len(items) != len(rewritten):
            return
        template: dict[str, Any] | None = None
        for old, new in zip(items, rewritten, strict=True):
            if old == new or not isinstance(old, dict) or old.get("alias") \
                    or not isinstance(new, dict):
                continue
            if template is None:
                template = serialize_sql("SELECT 1", con)
            template["statements"][0]["node"]["select_list"] = [old]
            text = scalar(con, "SELECT json_deserialize_sql(?)", [json.dumps(template)])
            if isinstance(text, str) and text.startswith("SELECT "):
                new["alias"] = text[len("SELECT "):]


class _Context:
    """One query's rewrite: the session's role values and a parser connection."""

    def __init__(self, rewriter: PolicyRewriter, session: Any, con: Any) -> None:
        self.rewriter, self.session, self.con = rewriter, session, con
        self.data = rewriter.data()
        self.roles = session.roles
        self.changed = False
        self.revealed: set[str] = set()
        #: the columns the query names (None: it may read whole rows); a table read
        #: through its policies gives only these, so the database decodes only these
        self.used: set[str] | None = None
        #: the columns of each table read through its policies, as the rewrite used them
        self.tables: dict[str, tuple[tuple[str, str], ...]] = {}

    def constant(self, literal: str) -> Any:
        return self.rewriter.constant(literal, self.con)

    def walk(self, node: Any, ctes: frozenset[str]) -> Any:
        """Replace table references outside the CTE names in scope (a CTE's own body does
        not see it, nor later ones; a recursive CTE sees itself)."""
        if isinstance(node, list):
            return [self.walk(v, ctes) for v in node]
        if not isinstance(node, dict):
            return node
        if node.get("type") == "BASE_TABLE":
            return self.table(node, ctes)
        if node.get("type") == "RECURSIVE_CTE_NODE" and isinstance(node.get("cte_name"), str):
            ctes = ctes | {node["cte_name"].lower()}
        cte_map = node.get("cte_map")
        out = dict(node)
        if isinstance(cte_map, dict) and cte_map.get("map"):
            seen = ctes
            entries = []
            for entry in cte_map["map"]:
                entries.append(self.walk(entry, seen))
                if isinstance(entry, dict) and isinstance(entry.get("key"), str):
                    seen = seen | {entry["key"].lower()}
            out["cte_map"] = dict(cte_map, map=entries)
            ctes = seen
        for key, value in node.items():
            if key != "cte_map":
                out[key] = self.walk(value, ctes)
        return out

    def table(self, node: dict[str, Any], ctes: frozenset[str]) -> Any:
        schema = (node.get("schema_name") or "").lower()
        name = (node.get("table_name") or "").lower()
        if not schema and name in ctes:
            return node
        data = self.data
        if schema == "system" and name == "parts":
            self.changed = True
            return self.system_parts(node)
        key = name if schema in ("", "main") else f"{schema}.{name}"
        masks = data["columns"].get(key, {})
        rows = data["rows"].get(key)
        if not masks and rows is None:
            return node
        if schema not in ("", "main"):
            raise FieldPolicyError(f"permission denied: {key} has policies")
        self.changed = True
        columns = self.rewriter.columns(key)  # (each named as the table has it)
        self.tables[key] = tuple(columns.items())
        cols = list(columns)
        # ``t AS a(x, y)`` names the table's first columns by their place: all kept, in order
        renamed = node.get("column_name_alias") or []
        if self.used is not None and not renamed:
            named = [c for c in cols if c.lower() in self.used]
            cols = named or cols[:1]  # count(*): one column, for the rows
        read = {c.lower() for c in cols}
        for column, pname in masks.items():  # the columns the query reads, of them
            if column.lower() in read and self.rewriter.reveals(data["masking"][pname]["body"]):
                self.revealed.add(f"{key}.{column}")
        if rows is not None and self.rewriter.reveals(data["row_access"][rows[0]]["body"]):
            self.revealed.update(f"{key}.{c}" for c in rows[1])
        select = ", ".join(f"__cd_mask_{i}({_quote(c)}) AS {_quote(c)}" if c.lower() in masks
                           else _quote(c) for i, c in enumerate(cols))
        where = ""
        if rows is not None:
            named = self.row_columns(key, columns, rows[1])
            where = f" WHERE __cd_rows({', '.join(_quote(c) for c in named)})"
        alias = node.get("alias") or name
        text = (f"SELECT * FROM (SELECT {select} FROM {_quote(name)}{where}) "
                f"AS {_quote(alias)}")  # quoted names, and markers replaced below
        sub = serialize_sql(text, self.con)["statements"][0]["node"]["from_table"]
        sub["column_name_alias"] = list(renamed)
        if node.get("sample") is not None:  # TABLESAMPLE of the table: of its readable rows
            sub["sample"] = node["sample"]

        def fill(n: dict[str, Any]) -> Any:
            fn = n.get("function_name")
            if n.get("type") != "FUNCTION" or not isinstance(fn, str) or \
                    not fn.startswith("__cd_"):
                return None
            args = [a["expression"] if isinstance(a, dict) and "expression" in a else a
                    for a in n.get("arguments", [])]
            if fn == "__cd_rows":
                policy = data["row_access"][rows[0]]
                expr = self.body("row_access", rows[0], policy, args)
            else:
                column = cols[int(fn.rsplit("_", 1)[1])]
                pname = masks[column.lower()]
                policy = data["masking"][pname]
                expr = self.body("masking", pname, policy, args)
                cast = self.constant(f"CAST(NULL AS {policy['returns']})")
                cast["child"] = expr
                expr = cast
            expr["alias"] = n.get("alias", "")
            return expr

        return _walk_nodes(sub, fill)

    @staticmethod
    def row_columns(table: str, columns: dict[str, str], names: list[str]) -> list[str]:
        """The columns of ``table`` (``columns``: as the table has them) that its row
        access policy's ``names`` (kept in lower case) name: the one column each names in
        any case (``Ä`` for ``ä``, which DuckDB does not find by ``ä``). A name two columns
        share in lower case (``Ä`` and ``ä``) is refused: which of them the policy was
        attached to is not known, and reading the other would filter rows by the wrong
        values."""
        out = []
        for name in names:
            found = [c for c in columns if c.lower() == name.lower()]
            if len(found) != 1:
                raise FieldPolicyError(
                    f"permission denied: the row access policy of {table} names column "
                    f"{name}, which " + ("no column of the table is" if not found else
                                        f"names {len(found)} columns ({', '.join(found)})"))
            out.append(found[0])
        return out

    def body(self, kind: str, name: str, policy: dict[str, Any], args: list[Any]) -> Any:
        """A policy's expression with its arguments bound and role functions evaluated."""
        bound = {a.lower(): arg for (a, _t), arg in zip(policy["args"], args, strict=True)}
        current = self.session.current_user
        values = {"current_role": current, "current_user": current,
                  "session_user": self.session.session_user}

        def visit(n: dict[str, Any]) -> Any:
            kind_ = n.get("type")
            if kind_ == "COLUMN_REF":
                names = [str(x).lower() for x in n.get("column_names", [])]
                if len(names) == 1 and names[0] in bound:
                    return copy.deepcopy(bound[names[0]])
                if len(names) == 1 and names[0] in values:
                    return self.constant(_literal(values[names[0]]))
                return None
            if kind_ == "FUNCTION":
                fn = str(n.get("function_name", "")).lower()
                arguments = n.get("arguments", [])
                if fn in _ROLE_WORDS and not arguments:
                    return self.constant(_literal(values[fn]))
                if fn == "is_role_in_session":
                    arg = arguments[0].get("expression") if len(arguments) == 1 and \
                        isinstance(arguments[0], dict) else None
                    literal = (arg or {}).get("literal") or {}
                    if literal.get("kind") != "STRING":
                        raise FieldPolicyError(f"policy {name}: is_role_in_session takes a "
                                               "role name in quotes", "42601")
                    held = literal.get("text", "").lower() in self.roles
                    return self.constant("TRUE" if held else "FALSE")
            return None

        return _walk_nodes(self.rewriter.parsed_body(kind, name, self.con), visit)

    def system_parts(self, node: dict[str, Any]) -> Any:
        protected = sorted(set(self.data["columns"]) | set(self.data["rows"]))
        hidden = ", ".join(_literal(t) for t in protected)
        cols = [c for c in ("table", "part", "rows", "bytes", "bytes_on_disk", "disk", "path",
                            "key_id", "algorithm", "sha256")]
        select = ", ".join(_quote(c) for c in cols)
        alias = node.get("alias") or "parts"
        text = (f"SELECT * FROM (SELECT {select}, CASE WHEN lower(\"table\") IN ({hidden}) "
                "THEN NULL ELSE key_min END AS key_min, CASE WHEN lower(\"table\") IN "
                f"({hidden}) THEN NULL ELSE key_max END AS key_max FROM system.parts) AS "
                f"{_quote(alias)}")
        return serialize_sql(text, self.con)["statements"][0]["node"]["from_table"]


# -- embedded connections that name a role -------------------------------------------------


class _Embedded:
    """A role connection's policies: the file read again whenever it changes."""

    def __init__(self, db: Any) -> None:
        self.db = db
        self.path = db.policies_path
        self.stamp: tuple[int, int, int] | None = None
        self.data: dict[str, Any] = read_policies(self.path, db.keyring)
        self.rewriter = PolicyRewriter(lambda: self.data, self.columns)
        self.session = PolicySession(db.role)
        self.refresh()

    def refresh(self) -> None:
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self.stamp:
            self.data = read_policies(self.path, self.db.keyring)
            self.rewriter.clear()
            self.stamp = stamp

    def columns(self, table: str) -> dict[str, str]:
        return {c: str(t) for c, t in self.db.table(table).columns}


_EMBEDDED: weakref.WeakKeyDictionary[Any, _Embedded] = weakref.WeakKeyDictionary()
_EMBEDDED_LOCK = threading.Lock()


def _embedded(db: Any) -> _Embedded:
    with _EMBEDDED_LOCK:
        state = _EMBEDDED.get(db)
        if state is None:
            state = _EMBEDDED[db] = _Embedded(db)
        else:
            state.refresh()
    return state


def role_check_statement(db: Any, statement: str, table: str | None) -> None:
    """Refuse cryptdisk's own ``statement`` (``DROP TABLE``, ``TRUNCATE``, ``OPTIMIZE``,
    ``ALTER TABLE ... MODIFY SETTING`` on ``table``; ``SYSTEM ...`` with ``table`` None)
    on a database opened with ``role=`` while ``table`` has a masking or row access
    policy (for ``SYSTEM ...``: while any table has one). Raises
    :class:`~cryptdisk.errors.FieldPolicyError`; does nothing without a role."""
    if getattr(db, "role", None) is None:
        return
    data = _embedded(db).data
    if table is None:
        if data["columns"] or data["rows"]:
            raise FieldPolicyError(f"permission denied: {statement} on a connection with "
                                   f"role {db.role!r} while tables have policies")
        return
    key = table.lower()
    if data["columns"].get(key) or data["rows"].get(key) is not None:
        raise FieldPolicyError(f"permission denied: {statement} on {table}: the table has "
                               f"policies and the connection has role {db.role!r}")


def role_has_policies(db: Any, table: str) -> bool:
    """Whether ``table`` has a masking or row access policy and ``db`` was opened with
    ``role=`` (so what reads it must go through the policies)."""
    if getattr(db, "role", None) is None:
        return False
    data = _embedded(db).data
    key = table.lower()
    return bool(data["columns"].get(key)) or data["rows"].get(key) is not None


def role_prepare(db: Any) -> None:
    """For a database opened with ``role=``: read its policy file and parse the policies
    ahead of the first query (as it opens). A file that does not read or parse is left to
    the first query, which reports it as before."""
    if getattr(db, "role", None) is None:
        return
    try:
        state = _embedded(db)
        state.rewriter.prepare(state.session, db._parser)
    except Exception:  # the first query reads the file again and reports it
        with _EMBEDDED_LOCK:
            _EMBEDDED.pop(db, None)


#: DuckDB's quote of the statement it ran (``LINE 1: ...`` and the caret under it)
_QUOTE = re.compile(r"\n+LINE \d+:.*", re.S)
#: DuckDB's list of the columns a query could have meant (a Binder error)
_CANDIDATES = re.compile(r"\n+\s*Candidate bindings:[^\n]*")


#: DuckDB's name for the subquery the rewrite reads a table through (``t.nosuch``)
_SUBQUERY = re.compile(r'\bValues list ("(?:[^"]|"")*") does not have a column')


def quiet_error(message: str) -> str:
    """DuckDB's ``message`` about a statement the policies rewrote, without what would
    show the rewrite to the role it is for: the quote of the text that ran (the policies'
    expressions, their internal names), a Binder error's candidate bindings (the columns
    the rewrite kept, under the rewrite's names, not the table's), and its calling the
    table a subquery ("Values list")."""
    message = _SUBQUERY.sub(r"Table \1 does not have a column", message)
    return _CANDIDATES.sub("", _QUOTE.sub("", message)).rstrip()


def role_rewrites(db: Any) -> bool:
    """Whether a database opened with ``role=`` reads any table through policies (so
    DuckDB's errors quote rewritten text: :func:`quiet_error`)."""
    db = getattr(db, "_db", db)  # (a reader's errors: its database's role)
    if getattr(db, "role", None) is None:
        return False
    try:
        data = _embedded(db).data
    except Exception:  # (a policy file that does not read: its first query reports it)
        return True
    return bool(data["columns"] or data["rows"])


def role_query(db: Any, sql: str) -> str:
    """The text a database opened with ``role=`` runs for query ``sql``: every table with
    policies read through them as that role (unchanged without a role or policies)."""
    if getattr(db, "role", None) is None:
        return sql
    if db.read_only:  # the tables' columns another process changed (as _prepare reads them)
        db.refresh()
    state = _embedded(db)
    # parsed where the parser's settings are DuckDB's defaults (Database._parser): a kept
    # rewrite depends on the text alone; DuckDB parses the rewrite again on db.con
    text, _revealed = state.rewriter.rewrite_query(sql, state.session, db._parser)
    return text


# -- DELETE and UPDATE as a role ---------------------------------------------------------

#: The name a DELETE's or UPDATE's statement reads one part of its table by (see ._mutate)
PART_SOURCE = "__cd_part"
#: The column of :data:`PART_SOURCE` that numbers the part's rows
ROW_NUMBER = "__cd_row"


class MutationPolicy:
    """How a ``DELETE`` or ``UPDATE`` as a role reads its table: its ``WHERE`` (and its
    ``SET`` expressions) see the rows and values a query of the role sees, through the
    same rewrite (:class:`PolicyRewriter`); :data:`PART_SOURCE` stands for the table,
    with its policies, and the row numbers pass through them."""

    def __init__(self, rewriter: PolicyRewriter, session: Any, con: Any,
                 columns: Callable[[str], dict[str, str]] | None = None) -> None:
        self.rewriter, self.session, self.con = rewriter, session, con
        #: a table's columns (default: the rewriter's own lookup)
        self.columns = columns or rewriter.columns
        #: after :meth:`rewrite`: the text it gave, and the columns (``table.column``) it
        #: reads through a policy that reveals protected values (for the server's audit)
        self.text: str | None = None
        self.revealed: list[str] = []

    def _subject(self) -> bool:
        return self.rewriter.active and not getattr(self.session, "admin", False)

    def protects(self, table: str) -> bool:
        """Whether ``table`` has a masking or row access policy that applies here."""
        data = self.rewriter.data()
        key = table.lower()
        return self._subject() and (bool(data["columns"].get(key))
                                    or data["rows"].get(key) is not None)

    def masked(self, table: str) -> set[str]:
        """The columns of ``table`` (lower case) under a masking policy that applies here."""
        if not self._subject():
            return set()
        return {c.lower() for c in self.rewriter.data()["columns"].get(table.lower(), {})}

    def rewrite(self, text: str, table: str) -> str:
        """``text`` (a query over :data:`PART_SOURCE`) reading it through ``table``'s
        policies, and every other table with policies through theirs."""
        if not self._subject():
            return text
        base = self.rewriter
        data = base.data()
        key = table.lower()
        view = dict(data, columns=dict(data["columns"]), rows=dict(data["rows"]))
        if data["columns"].get(key):
            view["columns"][PART_SOURCE] = data["columns"][key]
        if data["rows"].get(key) is not None:
            view["rows"][PART_SOURCE] = data["rows"][key]

        def columns(name: str) -> dict[str, str]:
            if name.lower() == PART_SOURCE:
                return {**self.columns(table), ROW_NUMBER: "BIGINT"}
            return self.columns(name)

        rewriter = PolicyRewriter(lambda: view, columns, base.reveals)
        rewritten, revealed = rewriter.rewrite_query(text, self.session, self.con)
        self.text = rewritten
        self.revealed = sorted({f"{table}.{c.split('.', 1)[1]}" if c.startswith(
            f"{PART_SOURCE}.") else c for c in revealed})
        return rewritten


_MUTATION_POLICY: contextvars.ContextVar[MutationPolicy | None] = contextvars.ContextVar(
    "cryptdisk_mutation_policy", default=None)


@contextlib.contextmanager
def mutation_policies(policy: MutationPolicy | None) -> Iterator[None]:
    """Run the ``DELETE`` and ``UPDATE`` statements of the block through ``policy`` (a
    server session of a role runs its statement on a database without a role)."""
    token = _MUTATION_POLICY.set(policy)
    try:
        yield
    finally:
        _MUTATION_POLICY.reset(token)


def current_mutation_policy() -> MutationPolicy | None:
    return _MUTATION_POLICY.get()


def embedded_mutation(db: Any) -> MutationPolicy:
    """The policies of a database opened with ``role=``, for its DELETE and UPDATE."""
    if db.read_only:
        db.refresh()
    state = _embedded(db)
    return MutationPolicy(state.rewriter, state.session, db._parser)

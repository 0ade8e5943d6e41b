"""Masking and row access policies by role, on the analytical engine.

A masking policy is a function of a column's value (and of the session's role)
that a table's column is read through; a row access policy is a condition on a
table's rows. Both are kept in a sealed file beside the database (``PATH.policies``
unless configured), under its keyring, and apply to every session that is not an
admin (an admin that ran ``SET ROLE r`` acts as ``r`` and is subject to them)::

    CREATE [OR REPLACE] MASKING POLICY p AS (v VARCHAR) RETURNS VARCHAR ->
        CASE WHEN current_role() IN ('auditor') THEN fpe_decrypt(v, 'cards')
             ELSE mask_last4(v) END
    ALTER TABLE t ALTER [COLUMN] c SET MASKING POLICY p
    ALTER TABLE t ALTER [COLUMN] c UNSET MASKING POLICY
    DROP MASKING POLICY [IF EXISTS] p
    CREATE [OR REPLACE] ROW ACCESS POLICY r AS (region VARCHAR) RETURNS BOOLEAN ->
        is_role_in_session('eu_staff') OR region <> 'EU'
    ALTER TABLE t ADD ROW ACCESS POLICY r ON (region)
    ALTER TABLE t DROP ROW ACCESS POLICY r
    DROP ROW ACCESS POLICY [IF EXISTS] r
    GRANT APPLY POLICY TO name [, ...]      REVOKE APPLY POLICY FROM name [, ...]  (admins)
    GRANT AUDIT TO name [, ...]             REVOKE AUDIT FROM name [, ...]         (admins)
    SELECT * FROM system.policies           (name, kind, signature, body)
    SELECT * FROM system.policy_references  (table, column, policy, kind)
    SELECT * FROM system.audit              (holders of AUDIT only; see ._audit)

Only sessions holding ``APPLY POLICY`` (granted to their current user or to one of its
roles) create, set, unset or drop policies; admins grant it but do not hold it by
being admins (separation of duties). In a policy body ``current_role()`` (also
``current_role`` and ``current_user``) is the session's current user or role,
``session_user`` its login user, and ``is_role_in_session('r')`` whether ``r`` is
the current role or one it belongs to (transitively).

Enforcement rewrites every query of a subject session before it runs: DuckDB's
parser (``json_serialize_sql``) gives the query's tree; every reference to a table
with policies (in subqueries, CTEs, joins, ``UNION`` branches, an ``INSERT``'s source)
becomes the subquery ``(SELECT mask(c1) AS c1, ..., cn FROM t WHERE row_policy(...)) AS
t``, and ``json_deserialize_sql`` gives the text that runs. Rows are filtered on the
clear values first, then columns are masked; everything the query does above
(``WHERE``, joins, ``GROUP BY``, ``ORDER BY``, windows, ``UNION``) sees only the masked
values. Subject sessions can run nothing but queries and ``INSERT ... SELECT`` on this
engine (:mod:`._grants`), and ``system.parts`` shows no ``key_min``/``key_max`` of a
table with policies to them.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import open as cd_open
from ..db import MutationPolicy, PolicyRewriter, read_policies, scalar, serialize_sql
from ..errors import CryptdiskError, FieldPolicyError
from . import _sqltext
from ._audit import AuditLog, revealing_calls
from ._engines import Result, StatementError

if TYPE_CHECKING:
    from ._grants import Privileges

__all__ = ["PolicyStore"]

_TEXT = 25
#: the engine session (``_AnalyticalSession``) whose statement the store works for in this
#: thread: its CancelRequest or statement timeout ends the store's waits (57014); None: the
#: server's own work, or a caller without a server (which waits until its turn comes)
_WAITER: contextvars.ContextVar[Any] = contextvars.ContextVar("policy_waiter", default=None)
#: how often a statement waiting for another's policy change looks for its cancel (seconds)
_LOCK_POLL = 0.05
_NAME = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
_SYSTEM = re.compile(r"\s*SELECT\s+\*\s+FROM\s+system\s*\.\s*(policies|policy_references|audit)"
                     r"\s*;?\s*", re.I)
#: a mention of those tables in any statement (outside string literals)
_NAMES_SYSTEM = re.compile(r"\bsystem\s*\.\s*(policies|policy_references|audit)\b", re.I)
_CREATE = re.compile(rf"\s*CREATE\s+(OR\s+REPLACE\s+)?(MASKING|ROW\s+ACCESS)\s+POLICY\s+"
                     rf"({_NAME})\s+AS\s*\((.*?)\)\s*RETURNS\s+([A-Za-z][\w ()]*?)\s*->\s*(.+?)"
                     r"\s*;?\s*", re.I | re.S)
_DROP = re.compile(rf"\s*DROP\s+(MASKING|ROW\s+ACCESS)\s+POLICY\s+(IF\s+EXISTS\s+)?({_NAME})"
                   r"\s*;?\s*", re.I | re.S)
_SET_MASK = re.compile(rf"\s*ALTER\s+TABLE\s+({_NAME})\s+ALTER\s+(?:COLUMN\s+)?({_NAME})\s+"
                       rf"(SET\s+MASKING\s+POLICY\s+({_NAME})|UNSET\s+MASKING\s+POLICY)\s*;?\s*",
                       re.I | re.S)
_ROW = re.compile(rf"\s*ALTER\s+TABLE\s+({_NAME})\s+(ADD|DROP)\s+ROW\s+ACCESS\s+POLICY\s+"
                  rf"({_NAME})(?:\s+ON\s*\(\s*({_NAME}(?:\s*,\s*{_NAME})*)\s*\))?\s*;?\s*",
                  re.I | re.S)
_APPLY = re.compile(rf"\s*(GRANT|REVOKE)\s+(APPLY\s+POLICY|AUDIT)\s+(?:TO|FROM)\s+"
                    rf"({_NAME}(?:\s*,\s*{_NAME})*)\s*;?\s*", re.I | re.S)


def _ident(token: str) -> str:
    if token.startswith('"'):
        return token[1:-1].replace('""', '"')
    return token.lower()


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _file_stamp(path: str) -> Any:
    """A token that changes whenever the file at ``path`` is replaced (None: no file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


class PolicyStore:
    """The policies of one analytical database, and the statements that manage them."""

    def __init__(self, path: str | os.PathLike[str], keyring: Any, engine: Any, *,
                 audit: AuditLog | None = None) -> None:
        self.path = os.fspath(path)
        #: where decryptions are logged (None: not logged); see :mod:`._audit`
        self.audit = audit
        self.keyring = keyring
        self.engine = engine
        self._lock = threading.Lock()
        #: {"masking": {name: policy}, "row_access": {name: policy},
        #:  "columns": {table: {column: name}}, "rows": {table: [name, [columns]]},
        #:  "apply": [grantees]}; a policy is {"args": [[name, type]], "returns": type,
        #:  "body": text}
        self.data: dict[str, Any] = {"masking": {}, "row_access": {}, "columns": {},
                                     "rows": {}, "apply": [], "audit": []}
        #: a file that authenticates but is malformed raises PolicyFileError
        self._stamp = _file_stamp(self.path)
        self.data = read_policies(self.path, keyring)
        #: the query rewrite, shared with embedded connections that name a role
        self._rewriter = PolicyRewriter(self._fresh, self._table_columns,
                                        lambda body: bool(revealing_calls(body)))
        db = getattr(engine, "db", None)
        if db is not None:  # the file the database's renames carry policies in
            db.policies_path = os.path.abspath(self.path)

    def _fresh(self) -> dict[str, Any]:
        """The policies, read again if the file changed (the database's ``ALTER TABLE``
        renames carry them in the file: see :meth:`changing`)."""
        stamp = _file_stamp(self.path)
        if stamp != self._stamp:
            data = read_policies(self.path, self.keyring)
            self.data, self._stamp = data, stamp
            self._rewriter.clear()
        return self.data

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Hold the store's lock while the database changes the file (an ``ALTER TABLE``
        renaming a table or column carries its policies), then read it again."""
        with self._locked():
            try:
                yield
            finally:
                self._stamp = None
                self._fresh()

    def __repr__(self) -> str:
        return (f"<PolicyStore {self.path!r} masking={len(self.data['masking'])} "
                f"row_access={len(self.data['row_access'])}>")

    # -- persistence -------------------------------------------------------------------------

    def _turn(self) -> Any:
        """A turn on the engine for the store's reads of the catalog and DuckDB's parser,
        beside other sessions' queries (as the catalog's own reads take one); the waiting
        session's cancel (:data:`_WAITER`) ends the wait."""
        return self.engine.turn(_WAITER.get(), shared=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the store's lock (one change at a time); the waiting session's cancel ends
        the wait (57014), as it ends a wait for the engine's turn."""
        waiter = _WAITER.get()
        while not self._lock.acquire(timeout=_LOCK_POLL):
            if waiter is not None and waiter.cancelled:
                raise StatementError("canceling statement due to user request", "57014")
        try:
            yield
        finally:
            self._lock.release()

    def _cursor(self) -> Any:
        """A cursor of the database's connection (made under its lock, as a reader's)."""
        db = self.engine.db
        with db._mutex:
            return db.con.cursor()

    def _change(self, change: Callable[[], None]) -> None:
        with self._locked():
            before = json.dumps(self._fresh())
            try:
                change()
                blob = json.dumps({"version": 1, **self.data}, sort_keys=True).encode()
                with cd_open(self.path, "wb", keyring=self.keyring) as f:
                    f.write(blob)
                self._stamp = _file_stamp(self.path)
            except BaseException:
                self.data = json.loads(before)
                raise
            finally:
                self._rewriter.clear()

    @property
    def active(self) -> bool:
        """Whether any table has a policy (else queries run as they are)."""
        data = self._fresh()
        return bool(data["columns"] or data["rows"])

    # -- statements --------------------------------------------------------------------------

    def handles(self, sql: str) -> bool:
        words = _sqltext.first_words(sql, 3)
        head = _sqltext.first_words(sql, 6)
        if words[:1] == ["CREATE"] and re.match(r"CREATE (OR REPLACE )?(MASKING|ROW ACCESS) "
                                                r"POLICY\b", " ".join(head)):
            return True
        if words[:2] in (["DROP", "MASKING"], ["DROP", "ROW"]):
            return True
        if words[:2] in (["GRANT", "APPLY"], ["REVOKE", "APPLY"], ["GRANT", "AUDIT"],
                         ["REVOKE", "AUDIT"]):
            return True
        if words[:2] == ["ALTER", "TABLE"] and re.search(
                r"\b(MASKING|ROW\s+ACCESS)\s+POLICY\b", _sqltext.strip_strings(sql), re.I):
            return True
        return _NAMES_SYSTEM.search(_sqltext.strip_strings(sql)) is not None

    def handle(self, session: Any, sql: str) -> Result:
        """Run a policy statement (see :meth:`handles`) for ``session`` (a server's
        session; None: a caller without users, trusted). A CancelRequest or the statement
        timeout of the session (its engine session's :meth:`interrupt`) ends the
        statement's waits for the engine's turn or another's change (57014); nothing of it
        is kept then."""
        privileges: Privileges | None = getattr(session, "privileges", None)
        waiter = getattr(session, "engine", None)
        if waiter is not None:
            waiter.new_statement()  # a cancel sent before this statement is not for it
        token = _WAITER.set(waiter)
        try:
            return self._handle(sql, privileges)
        except StatementError:
            raise
        except FieldPolicyError as exc:  # a malformed audit log: XX001
            raise StatementError(str(exc), exc.sqlstate) from None
        except CryptdiskError as exc:
            raise StatementError(str(exc), "58030") from None
        finally:
            _WAITER.reset(token)

    def _handle(self, sql: str, privileges: Privileges | None) -> Result:
        system = _SYSTEM.fullmatch(sql)
        if system is not None:
            return self._system(system[1].lower(), privileges)
        self._system_shape(sql, privileges, None)
        apply = _APPLY.fullmatch(sql)
        if apply is not None:
            what = "audit" if apply[2].upper() == "AUDIT" else "apply"
            self._need_admin(privileges, what)
            names = [_ident(n) for n in re.findall(_NAME, apply[3])]
            store = privileges.store if privileges is not None else None
            for name in names:
                if store is not None and not store.exists(name):
                    raise StatementError(f'role "{name}" does not exist', "42704")
            grant = apply[1].upper() == "GRANT"

            def change_apply() -> None:
                held = set(self.data[what])
                self.data[what] = sorted(held | set(names) if grant else held - set(names))

            self._change(change_apply)
            return Result(None, [], apply[1].upper())
        self._need_apply(privileges)
        create = _CREATE.fullmatch(sql)
        if create is not None:
            return self._create(create)
        drop = _DROP.fullmatch(sql)
        if drop is not None:
            return self._drop(drop)
        mask = _SET_MASK.fullmatch(sql)
        if mask is not None:
            return self._set_mask(mask)
        row = _ROW.fullmatch(sql)
        if row is not None:
            return self._set_row(row)
        raise StatementError("syntax: CREATE [OR REPLACE] MASKING|ROW ACCESS POLICY p AS "
                             "(arg type, ...) RETURNS type -> expression; ALTER TABLE t ALTER "
                             "[COLUMN] c SET MASKING POLICY p | UNSET MASKING POLICY; ALTER "
                             "TABLE t ADD ROW ACCESS POLICY r ON (c, ...) | DROP ROW ACCESS "
                             "POLICY r; DROP MASKING|ROW ACCESS POLICY [IF EXISTS] p", "42601")

    def holders(self) -> dict[str, set[str]]:
        """Who holds APPLY POLICY (``"apply"``) and AUDIT (``"audit"``), for :meth:`check`."""
        return {"apply": set(self.data["apply"]), "audit": set(self.data["audit"])}

    def check(self, sql: str, privileges: Privileges, held: dict[str, set[str]]) -> None:
        """Raise what :meth:`handle` would for want of a privilege, changing nothing (the
        check of every statement of a query before any runs). ``held`` (from
        :meth:`holders`) takes the changes of a ``GRANT``/``REVOKE APPLY POLICY|AUDIT``, so
        a later statement of the same query is checked as it will run."""
        system = _SYSTEM.fullmatch(sql)
        if system is not None:
            if system[1].lower() == "audit":
                self._need_audit(privileges, held["audit"])
            return
        self._system_shape(sql, privileges, held["audit"])
        apply = _APPLY.fullmatch(sql)
        if apply is not None:
            what = "audit" if apply[2].upper() == "AUDIT" else "apply"
            self._need_admin(privileges, what)
            names = {_ident(n) for n in re.findall(_NAME, apply[3])}
            if apply[1].upper() == "GRANT":
                held[what] |= names
            else:
                held[what] -= names
            return
        self._need_apply(privileges, held["apply"])

    def _system_shape(self, sql: str, privileges: Privileges | None,
                      held: set[str] | None) -> None:
        """Refuse a statement other than ``SELECT * FROM system.X`` that names one of the
        policy store's tables (the store answers that one statement; DuckDB has no such
        table): AUDIT is checked first, so a role without it learns nothing more."""
        mention = _NAMES_SYSTEM.search(_sqltext.strip_strings(sql))
        if mention is None:
            return
        name = mention[1].lower()
        if name == "audit":
            self._need_audit(privileges, held)
        raise StatementError(f"system.{name} answers SELECT * FROM system.{name} only",  # noqa: S608
                             "0A000", hint="select every row and column, and filter them in "
                             "the client")

    @staticmethod
    def _need_admin(privileges: Privileges | None, what: str) -> None:
        if privileges is not None and not privileges.admin:
            raise StatementError("permission denied: only admin users may grant or revoke "
                                 f"{what.upper().replace('APPLY', 'APPLY POLICY')}", "42501")

    def _need_audit(self, privileges: Privileges | None, held: set[str] | None = None) -> None:
        holders = set(self.data["audit"]) if held is None else held
        if privileges is not None and not holders & privileges.roles:
            raise StatementError("permission denied: system.audit is for holders of AUDIT",
                                 "42501", hint="an admin can GRANT AUDIT TO a role")

    def _need_apply(self, privileges: Privileges | None,
                    held: set[str] | None = None) -> None:
        if privileges is None:
            return  # a server without users: whoever connects is trusted
        if not (set(self.data["apply"]) if held is None else held) & privileges.roles:
            raise StatementError("permission denied: setting or dropping policies needs "
                                 "APPLY POLICY", "42501",
                                 hint="an admin can GRANT APPLY POLICY TO a role")

    def _parse(self, sql: str) -> Any:
        with self._turn():
            con = self._cursor()
            try:
                tree = serialize_sql(sql, con)
            finally:
                con.close()
        if tree.get("error"):
            raise StatementError(f"not a valid policy body: {tree.get('error_message', '?')}",
                                 "42601")
        return tree

    def _canonical_type(self, text: str) -> str:
        if not re.fullmatch(r"[A-Za-z][\w ()]*", text.strip()):
            raise StatementError(f"unknown type {text!r}", "42704")
        with self._turn():
            con = self._cursor()
            try:
                name = scalar(con, f"SELECT typeof(CAST(NULL AS {text}))")
            except Exception:
                raise StatementError(f"unknown type {text!r}", "42704") from None
            finally:
                con.close()
        return str(name) if name is not None else text.upper()

    def _create(self, m: re.Match[str]) -> Result:
        replace, kind = bool(m[1]), "masking" if m[2].upper() == "MASKING" else "row_access"
        name = _ident(m[3])
        args = []
        for part in (p.strip() for p in m[4].split(",")):
            am = re.fullmatch(rf"({_NAME})\s+(.+)", part, re.S)
            if am is None:
                raise StatementError(f"policy argument {part!r}: expected 'name TYPE'", "42601")
            args.append([_ident(am[1]), self._canonical_type(am[2])])
        if not args or len({a for a, _ in args}) != len(args):
            raise StatementError("a policy takes one or more distinct arguments", "42601")
        returns = self._canonical_type(m[5])
        if kind == "masking":
            if len(args) != 1:
                raise StatementError("a masking policy takes one argument: the column's value",
                                     "42601")
            if returns != args[0][1]:
                raise StatementError(f"a masking policy returns its argument's type "
                                     f"({args[0][1]}), not {returns}", "42804")
        elif returns != "BOOLEAN":
            raise StatementError("a row access policy RETURNS BOOLEAN", "42804")
        body = m[6].strip()
        self._parse(f"SELECT {body}")  # a syntax error is reported now
        policy = {"args": args, "returns": returns, "body": body}

        def change() -> None:
            if name in self.data[kind] and not replace:
                raise StatementError(f'policy "{name}" already exists', "42710")
            used = self._uses(kind, name)
            old = self.data[kind].get(name)
            if old is not None and used and [t for _, t in old["args"]] != \
                    [t for _, t in args]:
                raise StatementError(f'policy "{name}" is set on {used[0]}: its arguments '
                                     "cannot change type", "42804")
            self.data[kind][name] = policy

        self._change(change)
        return Result(None, [], "CREATE POLICY")

    def _uses(self, kind: str, name: str) -> list[str]:
        if kind == "masking":
            return [f"{t}.{c}" for t, cols in self.data["columns"].items()
                    for c, p in cols.items() if p == name]
        return [t for t, (p, _cols) in self.data["rows"].items() if p == name]

    def _drop(self, m: re.Match[str]) -> Result:
        kind = "masking" if m[1].upper() == "MASKING" else "row_access"
        name = _ident(m[3])

        def change() -> None:
            if name not in self.data[kind]:
                if m[2]:
                    return
                raise StatementError(f'policy "{name}" does not exist', "42704")
            used = self._uses(kind, name)
            if used:
                raise StatementError(f'policy "{name}" is set on {", ".join(used)}; unset it '
                                     "first", "2BP01")
            del self.data[kind][name]

        self._change(change)
        return Result(None, [], "DROP POLICY")

    def _table_columns(self, table: str) -> dict[str, str]:
        """The columns of ``table`` (found in any case), named as the table has them."""
        with self._turn():
            try:
                cols = self.engine.db.table(table).columns
            except CryptdiskError as exc:
                raise StatementError(str(exc), "42P01") from None
        return {c: str(t) for c, t in cols}

    def _table_names(self) -> set[str]:
        """The database's tables, lower case (as policies keep them)."""
        with self._turn():
            return {t.lower() for t in self.engine.db.catalog.tables}

    def forget_dropped(self) -> list[str]:
        """Remove the policy attachments of names no table has (a table dropped where the
        attachments could not be removed: a crash between the catalog's commit and the
        file's, or a policy file elsewhere than an embedded connection looked); the
        policies stay. Returns the names; the file is written only when there are some."""
        tables = self._table_names()
        gone: list[str] = []

        def change() -> None:
            gone[:] = sorted((set(self.data["columns"]) | set(self.data["rows"])) - tables)
            for t in gone:
                self.data["columns"].pop(t, None)
                self.data["rows"].pop(t, None)

        data = self._fresh()
        if (set(data["columns"]) | set(data["rows"])) - tables:
            self._change(change)
        return gone

    def _columns(self, table: str) -> dict[str, str]:
        """:meth:`_table_columns` under their lower-case names (as policies keep them)."""
        return {c.lower(): t for c, t in self._table_columns(table).items()}

    def _set_mask(self, m: re.Match[str]) -> Result:
        # a table or column is named in any case, quoted or not, as DuckDB finds it (its
        # policies are kept, and looked up by the rewrite, under the lower-case name)
        table, column = _ident(m[1]).lower(), _ident(m[2]).lower()
        cols = self._columns(table)
        if column not in cols:
            raise StatementError(f'column "{column}" of table "{table}" does not exist', "42703")
        name = _ident(m[4]) if m[4] else None
        twins = [c for c in self._table_columns(table) if c.lower() == column]
        kept = self.data["columns"].get(table, {}).get(column)
        if name is not None and len(twins) > 1 and kept is not None and kept != name:
            # (DuckDB tells "Ü" and "ü" apart, but a mask is kept under the lower-case
            # name and masks both: another policy would replace the one set on the other)
            raise StatementError(
                f'column "{column}" of table "{table}" names {len(twins)} columns in lower '
                f"case ({', '.join(twins)}), masked by {kept} under that name: setting "
                f"{name} would change the mask of each; UNSET MASKING POLICY first, or "
                "rename one", "42702")

        def change() -> None:
            if name is None:
                self.data["columns"].get(table, {}).pop(column, None)
                if not self.data["columns"].get(table, True):
                    del self.data["columns"][table]
                return
            policy = self.data["masking"].get(name)
            if policy is None:
                raise StatementError(f'masking policy "{name}" does not exist', "42704")
            if self._canonical_type(cols[column]) != policy["args"][0][1]:
                raise StatementError(f"masking policy {name} takes {policy['args'][0][1]}; "
                                     f"{table}.{column} is {cols[column]}", "42804")
            self.data["columns"].setdefault(table, {})[column] = name

        self._change(change)
        return Result(None, [], "ALTER TABLE")

    def _set_row(self, m: re.Match[str]) -> Result:
        table, name = _ident(m[1]).lower(), _ident(m[3])  # (a table in any case)
        add = m[2].upper() == "ADD"
        columns = [_ident(c).lower() for c in re.findall(_NAME, m[4] or "")]  # (any case)

        def change() -> None:
            if not add:
                if self.data["rows"].get(table, [None])[0] != name:
                    raise StatementError(f'table "{table}" has no row access policy {name}',
                                         "42704")
                del self.data["rows"][table]
                return
            policy = self.data["row_access"].get(name)
            if policy is None:
                raise StatementError(f'row access policy "{name}" does not exist', "42704")
            if table in self.data["rows"]:
                raise StatementError(f'table "{table}" already has a row access policy; drop '
                                     "it first", "42710")
            cols = self._columns(table)
            if len(columns) != len(policy["args"]):
                raise StatementError(f"row access policy {name} takes {len(policy['args'])} "
                                     "column(s): ADD ROW ACCESS POLICY r ON (c, ...)", "42601")
            for c, (_arg, typ) in zip(columns, policy["args"], strict=True):
                if c not in cols:
                    raise StatementError(f'column "{c}" of table "{table}" does not exist',
                                         "42703")
                if self._canonical_type(cols[c]) != typ:
                    raise StatementError(f"row access policy {name} takes {typ} for {c}; "
                                         f"{table}.{c} is {cols[c]}", "42804")
            self.data["rows"][table] = [name, columns]

        self._change(change)
        return Result(None, [], "ALTER TABLE")

    def _system(self, which: str, privileges: Privileges | None) -> Result:
        if which == "audit":
            self._need_audit(privileges)
            entries = self.audit.entries() if self.audit is not None else []
            cols = ["time", "session_user", "current_user", "kind", "functions", "tables",
                    "columns", "rows", "prev"]
            rows = [tuple(", ".join(e[c]) if isinstance(e.get(c), list) else e.get(c)
                          for c in cols) for e in entries]
            return Result([(c, 20 if c == "rows" else _TEXT) for c in cols], rows,
                          f"SELECT {len(rows)}")
        data = self._fresh()
        tables = self._table_names()  # (what a dropped table left is no reference)
        full = self._sees_bodies(privileges)
        if not full:  # only the tables the session may read (SELECT granted)
            assert privileges is not None
            tables = {t for t in tables if privileges.allowed(t, "SELECT")}
        refs = [(t, c, p, "masking") for t, cols in sorted(data["columns"].items())
                if t in tables for c, p in sorted(cols.items())]
        refs += [(t, ", ".join(cols), p, "row access")
                 for t, (p, cols) in sorted(data["rows"].items()) if t in tables]
        if which == "policies":
            # a body (its expression, the roles it reveals values to, its keys' names) and
            # its arguments' names are the policy officers': others see only the names of
            # the policies set on tables they may read (as Snowflake shows a policy's body
            # to its owner and holders of APPLY only)
            named = {(p, k.replace(" ", "_")) for _t, _c, p, k in refs}
            rows = [(name, kind.replace("_", " "),
                     f"({', '.join(f'{a} {t}' for a, t in p['args'])}) RETURNS {p['returns']}"
                     if full else None, p["body"] if full else None)
                    for kind in ("masking", "row_access")
                    for name, p in sorted(data[kind].items())
                    if full or (name, kind) in named]
            return Result([("name", _TEXT), ("kind", _TEXT), ("signature", _TEXT),
                           ("body", _TEXT)], rows, f"SELECT {len(rows)}")
        return Result([("table", _TEXT), ("column", _TEXT), ("policy", _TEXT), ("kind", _TEXT)],
                      refs, f"SELECT {len(refs)}")

    def _sees_bodies(self, privileges: Privileges | None) -> bool:
        """Whether the session sees every policy and its body: a holder of APPLY POLICY, an
        admin (who holds the keys and reads the file), a server without users."""
        if privileges is None or privileges.admin:
            return True
        return bool(set(self._fresh()["apply"]) & privileges.roles)

    # -- enforcement -------------------------------------------------------------------------

    def rewrite(self, sql: str, privileges: Privileges, con: Any,
                waiter: Any = None) -> tuple[str, list[str]]:
        """``sql`` (a query, or ``INSERT INTO t ... <query>``) reading every table with
        policies through them, for ``privileges``' session (see the module docstring),
        and the columns (``t.c``) read through a policy that decrypts. ``waiter``: the
        session's engine session, whose cancel ends the rewrite's wait for the catalog."""
        from ._grants import _CHANGE, _INSERT, _close_paren, sets_own_setting

        if not self.active or privileges.admin or sets_own_setting(sql):
            return sql, []  # (a session's own setting reads no table)

        if _CHANGE.match(sql):  # the database reads its table through them as it runs
            return sql, []      # (see mutation_policy)

        prefix = ""
        insert = _INSERT.match(sql)
        if insert is not None:
            rest = sql[insert.end():]
            stripped = rest.lstrip()
            cut = len(rest) - len(stripped)
            if stripped.startswith("(") and not re.match(r"\(\s*(SELECT|WITH|VALUES|FROM)\b",
                                                         stripped, re.I):
                cut += _close_paren(stripped) + 1
            prefix, sql = sql[:insert.end() + cut] + " ", sql[insert.end() + cut:]
        token = _WAITER.set(waiter)
        try:
            text, revealed = self._rewriter.rewrite_query(sql, privileges, con)
        except FieldPolicyError as exc:
            raise StatementError(str(exc), exc.sqlstate) from None
        finally:
            _WAITER.reset(token)
        return prefix + text, revealed

    def mutation_policy(self, privileges: Privileges, db: Any) -> MutationPolicy | None:
        """How a DELETE or UPDATE of ``privileges``' session reads its table on ``db``
        (run with :func:`cryptdisk.db.mutation_policies` around it): through the policies,
        as the session's queries do; None for an admin or while no table has a policy."""
        if not self.active or privileges.admin:
            return None

        def columns(table: str) -> dict[str, str]:  # (the statement holds the engine's turn)
            return {c: str(t) for c, t in db.table(table).columns}

        return MutationPolicy(self._rewriter, privileges, db._parser, columns)

    def record(self, sql: str, privileges: Privileges | None, revealed: list[str],
               rows: int | None, con: Any, user: str | None = None) -> None:
        """Write an audit line if ``sql`` (as run) revealed protected values (see
        :mod:`._audit`): an admin's call of a revealing function, or columns read through a
        policy that decrypts."""
        if self.audit is None:
            return
        functions = revealing_calls(sql)
        if not functions:
            return
        tables = sorted({c.split(".")[0] for c in revealed})
        if not revealed:
            from ._grants import query_references

            try:
                found = query_references(sql, con)
            except Exception:
                found = None
            tables = sorted({t.lower() for t in found[0]}) if found else []
        session_user = privileges.session_user if privileges is not None else user
        current = privileges.current_user if privileges is not None else user
        self.audit.write(session_user=session_user, current_user=current,
                         kind="policy" if revealed else "function",
                         functions=sorted(functions), tables=tables, columns=revealed,
                         rows=rows)

"""Authorise every statement of a simple Query before any of them runs.

PostgreSQL runs the statements of one simple Query as one implicit transaction:
a statement refused halfway leaves nothing of the earlier ones. The analytical
engine cannot roll back, and a refusal should leave no trace on either engine,
so before a query with several statements runs, each is checked in order as it
will run:

- user, role and grant statements run on a scratch copy of the user store
  (:meth:`._users.ScramAuthenticator.dry_run`), so ``SET ROLE``, ``GRANT`` and
  ``REVOKE`` earlier in the query count for the statements after them;
- policy statements are checked for ``APPLY POLICY`` / ``AUDIT`` / admin;
- everything else is checked by the engine (:meth:`.EngineSession.authorize`)
  with the privileges so far: the analytical engine's grant check and policy
  rewrite, SQLite's authorizer as it prepares the statement (never steps it);
- ``COPY ... FROM STDIN`` needs ``INSERT`` on its table, ``COPY ... TO
  STDOUT`` and ``DECLARE`` are checked as their query, ``EXECUTE`` as its prepared
  statement (one ``PREPARE``d earlier in the query, or the session's).

A refusal fails the whole query before anything ran. Errors other than a
refusal (a missing table, a constraint) show when the statement runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _sqltext
from ._engines import TRANSACTION_WORDS, EngineSession, StatementError, statement_error
from ._grants import Privileges

__all__ = ["authorize_statements"]


@dataclass
class _Trial:
    """What a user-statement handler sees of a session during the check."""

    user: str
    privileges: Privileges


def _quote(name: str) -> str:
    return ".".join('"' + p.replace('"', '""') + '"' for p in name.split("."))


def authorize_statements(statements: list[str], *, privileges: Privileges, user: str,
                         engine: EngineSession, authenticator: Any, policies: Any,
                         identity: Callable[[str, Privileges], str],
                         prepared: Callable[[str], str | None] = lambda name: None,
                         ) -> tuple[int, StatementError] | None:
    """The index of the first refused statement and the error it would get (None: all may
    run), having run nothing.

    ``identity(sql, privileges)`` writes ``current_user`` and friends into ``sql`` as the
    session does. ``authenticator`` and ``policies`` are the server's (either may be None).
    ``prepared(name)``: the text of the session's prepared statement ``name`` (None: none).
    """
    dry = authenticator.dry_run() if authenticator is not None else None
    trial = Privileges(dry.store if dry is not None else privileges.store,
                       privileges.session_user)
    trial.set_role(None if privileges.current_user == privileges.session_user
                   else privileges.current_user)
    check = _Check(engine, trial, _Trial(user, trial), dry, policies,
                   policies.holders() if policies is not None else None, identity, prepared)
    for index, sql in enumerate(statements):
        try:
            check.statement(sql)
        except Exception as exc:
            return index, statement_error(exc)
    return None


@dataclass
class _Check:
    engine: EngineSession
    trial: Privileges          # the privileges as the statements so far leave them
    session: _Trial
    dry: Any                   # the authenticator on a scratch user store, or None
    policies: Any
    held: dict[str, set[str]] | None   # APPLY POLICY / AUDIT holders so far
    identity: Callable[[str, Privileges], str]
    prepared: Callable[[str], str | None]
    declared: dict[str, str] = field(default_factory=dict)  # PREPAREd earlier in the query

    def statement(self, sql: str) -> None:
        """Raise what running ``sql`` would for want of a privilege; apply what it changes
        in users, roles and grants to the scratch store."""
        from ._infoschema import handles as handles_information_schema
        from ._pgcatalog import answers
        from ._systables import handles as handles_system_tables

        words = _sqltext.first_words(sql, 1)
        head = words[0] if words else ""
        if head in TRANSACTION_WORDS or head in ("FETCH", "MOVE", "CLOSE"):
            return
        if head == "DISCARD":  # (DISCARD ALL: the login user's role again)
            if re.match(r"\s*DISCARD\s+ALL\b", sql, re.I):
                self.trial.set_role(None)
            return
        if head == "PREPARE" and _sqltext.first_words(sql, 2)[1:] != ["TRANSACTION"]:
            from ._prepared import parse_prepare

            name, _types, body = parse_prepare(sql)
            self.declared[name] = body
            return  # checked when it is executed
        if head == "EXECUTE":
            from ._prepared import parse_execute

            name = parse_execute(sql)[0]
            target = self.declared.get(name) or self.prepared(name)
            if target is not None:  # (none: the EXECUTE fails when it runs, 26000)
                self.statement(target)
            return
        if head == "DECLARE":
            from ._cursors import parse_declare

            sql = parse_declare(sql).query
        elif head == "COPY" and re.search(r"\b(STDIN|STDOUT)\b", sql, re.I):
            from ._copy import parse_copy

            st = parse_copy(sql)
            if st.direction == "in":
                self.engine.authorize_copy_in(st.table or "", self.trial)
                return
            cols = ", ".join(f'"{c}"' for c in st.columns) if st.columns else "*"
            sql = st.query or f"SELECT {cols} FROM {_quote(st.table or '')}"  # noqa: S608
        if self.policies is not None and self.held is not None and self.policies.handles(sql):
            self.policies.check(sql, self.trial, self.held)
            return
        if self.dry is not None and self.dry.handles(sql):
            self.dry.handle(self.session, sql)
            return
        if answers(sql) or handles_information_schema(sql) or (
                self.dry is not None and handles_system_tables(sql)):
            return  # the catalogs: open to every user, information_schema filtered itself
        self.engine.authorize(self.identity(sql, self.trial), self.trial)

"""Users: a sealed user file, SCRAM logins, and the user statements the server runs itself.

The user file (``PATH.users`` beside the database unless configured) is a
sealed cryptdisk file under the database's keyring: JSON of each user's SCRAM
verifier, admin flag, grants and role memberships, and of each role's grants
and memberships. It never holds a password. On the analytical engine each table
grant also records the catalog id of the table it was given on (``grant_ids``,
written with the grant; a reader of an earlier version skips it): a grant whose
id is not the table's under that name now is never applied, and is removed at a
start that can write (:meth:`UserStore.forget_table_grants`).

Statements handled before the engine sees them::

    CREATE USER name [WITH] PASSWORD '...' [ADMIN]
    ALTER USER|ROLE name [WITH] PASSWORD '...' | ADMIN | NOADMIN | CLIENTCERT | NOCLIENTCERT
    DROP USER|ROLE [IF EXISTS] name
    CREATE ROLE name [[WITH] NOLOGIN]
    GRANT role [, ...] TO name [, ...] [WITH ADMIN OPTION]
    REVOKE [ADMIN OPTION FOR] role [, ...] FROM name [, ...]
    GRANT SELECT|INSERT|UPDATE|DELETE|ALL [, ...] ON [TABLE] t [, ...] TO name [, ...]
    REVOKE ... ON [TABLE] t [, ...] FROM name [, ...]
    SET ROLE name | NONE          RESET ROLE
    SELECT * FROM system.users      (also SHOW USERS; name, is_admin, auth, iterations)
    SELECT * FROM system.roles      (role, members)
    SELECT * FROM system.grants     (user, table, privilege, role, admin_option; the grantee
                                     may be a role; a membership is privilege MEMBER)

Users and roles share one namespace, as in PostgreSQL. A role cannot log in;
its privileges reach every user (or role) granted it, transitively. Only
admins create, drop or change other users and roles and grant table
privileges; a role is also granted and revoked by whoever holds the admin
option on it (``WITH ADMIN OPTION``, held by the current user or one of its
roles); anyone may change their own password. :mod:`._grants` checks the privileges.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fcntl
import hashlib
import itertools
import json
import logging
import mmap
import os
import re
import secrets
import struct
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import open as cd_open
from .._flocks import hold, let_go
from .._json import kind as _kind
from .._json import load_object
from ..errors import (
    CryptdiskError,
    LoginError,
    ProtocolError,
    ServerError,
    UsersFileError,
    UsersJournalMismatch,
)
from . import _protocol as P
from . import _sqltext
from ._engines import Result, StatementError, users_record_error
from ._grants import ACTIONS, Privileges
from ._scram import (
    DEFAULT_ITERATIONS,
    MIN_ITERATIONS,
    ScramServer,
    Verifier,
    _hmac,
    make_verifier,
)

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["ScramAuthenticator", "UserStore", "UsersJournalMismatch"]

log = logging.getLogger("cryptdisk.server")

_NAME = r'(?:[A-Za-z_][A-Za-z0-9_$]*|"(?:[^"]|"")+")'
_STRING = r"'(?:[^']|'')*'"
_QUOTED = r'"(?:[^"]|"")*"'  # a quoted identifier ("login" is a name, not the LOGIN option)
_SYSTEM_TABLE = re.compile(r"\s*SELECT\s+\*\s+FROM\s+system\s*\.\s*(users|grants|roles)\s*;?\s*",
                           re.I)


#: generations of every user store, copies included: a number never names two states
_GENERATIONS = itertools.count(1)
#: a change to a user store, kept to apply again: (method name, args, keyword args)
Op = tuple[str, tuple[Any, ...], dict[str, Any]]


def _declared_names(session: Any) -> dict[str, str]:
    """The session's tables and views by lower-case name -> the name they were declared
    with (none for a session without an engine: the pre-check's trial)."""
    engine = getattr(session, "engine", None)
    if engine is None:
        return {}
    try:
        return {name.lower(): name for name, _kind in engine.relations()}
    except StatementError:
        return {}


def _invoker_views(session: Any) -> dict[str, str]:
    """The views of the session's engine (lower-case name -> declared) when its views have
    the rights of their reader, so a grant on one would mean nothing (empty otherwise)."""
    engine = getattr(session, "engine", None)
    if engine is None or not getattr(engine, "invoker_views", False):
        return {}
    try:
        owners = engine.owner_views()
        return {name.lower(): name for name, kind in engine.relations()
                if kind == "v" and name.lower() not in owners}
    except StatementError:
        return {}


def _ident(token: str) -> str:
    if token.startswith('"'):
        return token[1:-1].replace('""', '"')
    return token.lower()


#: reads the last record of committed user changes (:meth:`UserStore.commit`) from where
#: the data is: ``(serial, user-file JSON)`` or None; ``wait=False``: None rather than
#: wait for a lock
JournalReader = Callable[[bool], "tuple[int, bytes] | None"]


def _users_file_error(path: str, what: str) -> UsersFileError:
    return UsersFileError(f"the user file {path} is malformed: {what}", path=path,
                          hint="restore it from a backup")


_ENTRY_LISTS = ("roles", "admin_roles")
#: an entry's ``{table: catalog id}``: the analytical table each of its table grants was
#: given on (a grant without one is by name: a view's, SQLite's, an older file's)
GRANT_IDS = "grant_ids"


def _check_entry(entry: Any, field: str, bad: Callable[[str], UsersFileError], *,
                 user: bool) -> None:
    """Raise ``bad(what)`` unless ``entry`` is a user's (``user``) or a role's entry as
    :class:`UserStore` writes it. Names fields, never values (a verifier is a secret)."""
    if not isinstance(entry, dict):
        raise bad(f"{field} is {_kind(entry)}, not an object")
    if user:
        verifier = entry.get("verifier")
        if not isinstance(verifier, str):
            raise bad(f"{field}.verifier is missing" if verifier is None else
                      f"{field}.verifier is {_kind(verifier)}, not a string")
        try:
            Verifier.parse(verifier)
        except (ValueError, CryptdiskError):
            raise bad(f"{field}.verifier is not a SCRAM-SHA-256 verifier") from None
        for flag in ("admin", "clientcert"):
            if flag in entry and not isinstance(entry[flag], bool):
                raise bad(f"{field}.{flag} is {_kind(entry[flag])}, not true or false")
    for key in _ENTRY_LISTS:
        names = entry.get(key, [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise bad(f"{field}.{key} is not a list of role names")
    grants = entry.get("grants", {})
    if not isinstance(grants, dict):
        raise bad(f"{field}.grants is {_kind(grants)}, not an object")
    for table, actions in grants.items():
        if not isinstance(actions, list) or not all(a in ACTIONS for a in actions):
            raise bad(f"{field}.grants[{table!r}] is not a list of privileges "
                      f"({', '.join(ACTIONS)})")
    ids = entry.get(GRANT_IDS, {})
    if not isinstance(ids, dict) or not all(isinstance(i, str) for i in ids.values()):
        raise bad(f"{field}.{GRANT_IDS} is not an object of table ids")


def _parse_users(text: bytes, bad: Callable[[str], UsersFileError], *,
                 serial: int | None = None) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """``(serial, users, roles)`` of a user file's JSON (also the record of committed user
    changes: ``serial`` is the one the record is filed under, which the JSON must hold);
    ``bad(what)`` is raised for anything else than what :class:`UserStore` writes."""
    data = load_object(text, bad)
    version = data.get("version")
    if type(version) is not int or version != 1:
        raise bad("not a cryptdisk user file (version 1)")
    found = data.get("serial", 0 if serial is None else None)
    if type(found) is not int or found < 0:
        raise bad("serial is missing" if "serial" not in data else
                  "serial is not a generation number (a whole number from 0)")
    if serial is not None and found != serial:
        raise bad(f"it holds generation {found} but is filed as generation {serial}")
    users, roles = data.get("users"), data.get("roles", {})
    for key, value in (("users", users), ("roles", roles)):
        if not isinstance(value, dict):
            raise bad(f"{key} is missing" if value is None else
                      f"{key} is {_kind(value)}, not an object")
    assert isinstance(users, dict) and isinstance(roles, dict)
    for name, entry in users.items():
        _check_entry(entry, f"users[{name!r}]", bad, user=True)
        if name in roles:
            raise bad(f"{name!r} is both a user and a role")
    for name, entry in roles.items():
        _check_entry(entry, f"roles[{name!r}]", bad, user=False)
    return found, users, roles


class UserStore:
    """Users and their SCRAM verifiers in a sealed file encrypted under ``keyring``.

    ``journal`` (SQLite: :meth:`._engines.SQLiteEngine.read_users_record`) reads the record
    of user changes a transaction committed with its data; a record newer than the user
    file (the process died between the two writes) is saved to the file first, at start
    (:meth:`recover`), before every change and when another process's change is read in.
    ``journal_path`` is the database that holds the record, for error messages.

    A user file or record that authenticates but is malformed (not JSON, a field
    missing or of the wrong type) raises :class:`~cryptdisk.errors.UsersFileError`
    naming the file, the record and the field.
    """

    #: the user file's own count of saves: a record of committed changes with a higher
    #: serial than the file's is not in the file yet
    serial = 0
    journal: JournalReader | None = None
    #: the catalog id of the analytical table a name has now (None: no table has it); set
    #: by the server of an analytical engine. A table grant records the id of the table
    #: it was given on (:data:`GRANT_IDS`), and one whose id is not the table's under its
    #: name now (dropped and made again where the server did not see it) is never applied.
    #: None (SQLite, no server): grants are by name.
    table_id: Callable[[str], str | None] | None = None

    def __init__(self, path: str | os.PathLike[str], keyring: Any, *,
                 iterations: int = DEFAULT_ITERATIONS,
                 journal: JournalReader | None = None,
                 journal_path: str | os.PathLike[str] | None = None,
                 read_only: bool = False) -> None:
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise UsersFileError(f"the user file {self.path} is a directory",
                                 path=self.path, hint="give a file's path (--users FILE)")
        self.keyring = keyring
        self.iterations = iterations
        self.journal = journal
        self.journal_path = os.fspath(journal_path) if journal_path is not None else None
        self._lock = threading.Lock()
        #: changes with every change to users, roles and grants (cached permission checks
        #: use it); unique across stores and their copies
        self.generation = next(_GENERATIONS)
        self.users: dict[str, dict[str, Any]] = {}
        #: ``{role: {"grants": {table: [actions]}, "roles": [roles it is a member of]}}``
        self.roles: dict[str, dict[str, Any]] = {}
        self._shared: _ChangeCounter | None = None
        try:
            # read_only (cryptdisk serve --check): creates nothing, not even the lock file
            self._shared = None if read_only else _ChangeCounter(self.path + ".lock")
        except OSError as exc:  # a read-only directory: other processes' changes go unseen
            log.warning("users: cannot use %s.lock (%s); changes other processes make to "
                        "the users are not picked up", self.path, exc.strerror or exc)
        self._seen = self._shared.value() if self._shared is not None else 0
        self._load()

    def close(self) -> None:
        """Release the files the store holds open (its change counter's lock file: two
        descriptors, until the store is collected otherwise); the store is not used after.
        Whoever made the store closes it (a :class:`Server` leaves it open: it did not make
        it); ``with UserStore(...) as store:`` does. Closing again does nothing."""
        with self._lock:
            if self._shared is not None:
                self._shared.close()

    def __enter__(self) -> UserStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load(self) -> None:
        if os.path.exists(self.path):
            with cd_open(self.path, "rb", keyring=self.keyring) as f:
                text = f.read()
            self.serial, self.users, self.roles = _parse_users(
                text, lambda what: _users_file_error(self.path, what))

    def _parse_record(self, serial: int, text: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(users, roles)`` of a record of committed user changes filed as ``serial``;
        :class:`UsersFileError` if it is malformed."""
        _, users, roles = _parse_users(
            text, lambda what: users_record_error(self.journal_path, what), serial=serial)
        return users, roles

    def refresh(self) -> None:
        """Read the user file again if another process (a worker of the same server,
        ``cryptdisk serve --add-user``) changed it since this one last did. Never waits:
        while another thread or process is changing the users, the next call reads."""
        shared = self._shared
        if shared is None or shared.value() == self._seen:
            return
        if not self._lock.acquire(blocking=False):
            return  # a change in this process: it reads the others' in first
        try:
            try:
                if not shared.try_lock():
                    return  # another process is changing them: read when it is done
            except OSError as exc:  # (the counter could not be rewritten)
                log.error("users: cannot read the changes other processes made (%s: %s)",
                          shared.path, exc.strerror or exc)
                return
            try:
                self._reload()
                if self._recover(wait=False):
                    self._seen = shared.bump()
            except (UsersJournalMismatch, UsersFileError) as exc:  # every change fails
                log.error("%s", exc)  # with it, until resolved
            except OSError as exc:  # (the statements go on with the users as last read)
                log.error("users: cannot read the changes other processes made (%s: %s)",
                          self.path, exc.strerror or exc)
            finally:
                shared.unlock()
        finally:
            self._lock.release()

    def recover(self) -> None:
        """Save to the user file the user changes a transaction committed with its data
        when the process died before saving them (see :meth:`commit`)."""
        with self._exclusive():
            pass

    def _recover(self, *, wait: bool = True,
                 journal: JournalReader | None = None) -> bool:
        """With the user file locked: save to it the record of committed user changes when
        the record is the file's next generation (the process that committed it died before
        saving the file). A record of any other generation than the file's or the next, or
        of the file's with other users, means one of the two was replaced by an older (or
        another) copy: :class:`UsersJournalMismatch`, nothing applied."""
        read = journal or self.journal
        if read is None:
            return False
        record = read(wait)
        if record is None:
            return False
        serial, text = record
        users, roles = self._parse_record(serial, text)
        if serial != self.serial:
            self._load()  # the file itself, in case this process's copy is behind
        if serial not in (self.serial, self.serial + 1):
            raise UsersJournalMismatch(self.path, self.serial, serial)
        if serial == self.serial:
            if users != self.users or roles != self.roles:
                raise UsersJournalMismatch(self.path, self.serial, serial)
            return False
        with cd_open(self.path, "wb", keyring=self.keyring) as f:
            f.write(text)
        self.users, self.roles, self.serial = users, roles, serial
        self._bump()
        log.warning("saved to %s the user changes committed with the data before the "
                    "process that committed them stopped (generation %d)", self.path, serial)
        return True

    def check_journal(self) -> None:
        """Raise :class:`UsersJournalMismatch` if the record of committed user changes does
        not belong with the user file, :class:`UsersFileError` if it is malformed
        (``cryptdisk serve --check``); change nothing."""
        if self.journal is None:
            return
        record = self.journal(True)
        if record is None:
            return
        serial, text = record
        users, roles = self._parse_record(serial, text)
        if serial == self.serial + 1:
            return  # committed with the data, saved to the file at start
        if serial != self.serial or users != self.users or roles != self.roles:
            raise UsersJournalMismatch(self.path, self.serial, serial)

    def resolve(self, keep: str, read: JournalReader, write: Callable[[int, bytes], None],
                commit_data: Callable[[], None]) -> str:
        """Make the user file and the database's record of user changes agree again, after
        one of them was restored from an older copy: ``keep="file"`` writes the user file's
        users into the record (``write``, then ``commit_data``); ``keep="database"`` saves
        the record's users to the user file. The caller holds the data's write lock. What
        was done, in words."""
        if keep not in ("file", "database"):
            raise ServerError(f"--resolve-users takes file or database, not {keep!r}")
        with self._lock, (self._shared.locked() if self._shared is not None
                          else contextlib.nullcontext()):
            try:
                self._load()
                if keep == "file":  # the record is not read: a malformed one is replaced
                    write(self.serial, self._encode(self.serial))
                    commit_data()
                    return (f"the database's record of user changes now holds the users of "
                            f"{self.path} (generation {self.serial}, "
                            f"{len(self.users)} users)")
                record = read(True)
                if record is None:
                    raise ServerError("the database holds no record of user changes to take "
                                      "the users from", hint="--resolve-users file keeps "
                                      "the user file's")
                serial, text = record
                users, roles = self._parse_record(serial, text)
                with cd_open(self.path, "wb", keyring=self.keyring) as f:
                    f.write(text)
                self.users, self.roles = users, roles
                self.serial = serial
                commit_data()
                return (f"{self.path} now holds the users of the database's record "
                        f"(generation {serial}, {len(self.users)} users)")
            finally:
                self._bump()
                if self._shared is not None:
                    self._seen = self._shared.bump()

    def _reload(self) -> None:
        assert self._shared is not None
        seen = self._shared.value()  # before reading: a later change is read again
        if seen != self._seen:
            self._load()
            self._seen = seen
            self._bump()

    @contextlib.contextmanager
    def _exclusive(self, journal: JournalReader | None = None) -> Iterator[None]:
        """Hold the user file against every other thread and process, with what they saved
        read in (and a committed record not saved yet, :meth:`_recover`), for a change; the
        change counter moves when it ends."""
        with self._lock:
            shared = self._shared
            if shared is None:
                yield
                return
            with shared.locked():
                try:
                    self._reload()
                    self._recover(journal=journal)
                    yield
                finally:
                    self._seen = shared.bump()

    def __repr__(self) -> str:
        return f"<UserStore {self.path!r} users={len(self.users)} roles={len(self.roles)}>"

    @property
    def shared(self) -> bool:
        """Changes other processes make are picked up (:meth:`refresh`)."""
        return self._shared is not None

    def scratch(self) -> UserStore:
        """An in-memory copy that never saves, to try statements on: the statements of a
        query are tried, in order, before any of them runs. New verifiers in it use the
        fewest iterations (they are thrown away)."""
        with self._lock:
            users, roles = copy.deepcopy(self.users), copy.deepcopy(self.roles)
            generation = self.generation
        return _ScratchStore(self.path, users, roles, generation, self.table_id)

    def _encode(self, serial: int) -> bytes:
        return json.dumps({"version": 1, "serial": serial, "users": self.users,
                           "roles": self.roles}, sort_keys=True).encode()

    def _save(self) -> None:
        data = self._encode(self.serial + 1)
        with cd_open(self.path, "wb", keyring=self.keyring) as f:
            f.write(data)
        self.serial += 1

    def _change(self, change: Callable[[], None]) -> None:
        """Apply ``change`` to users/roles and save; on any failure restore both."""
        with self._exclusive():
            before = json.dumps([self.users, self.roles])
            try:
                change()
                self._save()
            except BaseException:
                self.users, self.roles = json.loads(before)
                raise
            finally:
                self._bump()

    def _bump(self) -> None:
        self.generation = next(_GENERATIONS)

    def transaction(self) -> UserStore:
        """A view of the users to apply one transaction's statements to, saving nothing:
        the store as it is now (other sessions' changes show as they are made) with the
        transaction's changes on top. :meth:`apply` its ``ops`` to commit them."""
        return _TxStore(self)

    def replay(self, ops: list[Op]) -> None:
        """Raise what the first of ``ops`` (a transaction's changes) that cannot apply to the
        users as they are now (other processes' changes read in) raises; change nothing."""
        self.refresh()
        trial = self.scratch()
        for name, args, kwargs in ops:
            getattr(trial, name)(*args, **kwargs)

    def apply(self, ops: list[Op]) -> None:
        """Apply a transaction's changes together, in one save: all of them or none."""
        with self._exclusive():
            trial = _ScratchStore(self.path, copy.deepcopy(self.users),
                                  copy.deepcopy(self.roles), self.generation, self.table_id)
            for name, args, kwargs in ops:
                getattr(trial, name)(*args, **kwargs)
            before = self.users, self.roles
            self.users, self.roles = trial.users, trial.roles
            try:
                self._save()
            except BaseException:
                self.users, self.roles = before
                raise
            finally:
                self._bump()

    def commit(self, ops: list[Op], record: Callable[[int, bytes], None],
               commit_data: Callable[[], None],
               journal: JournalReader | None = None) -> None:
        """Commit a transaction's changes (``ops``) with its data, in two phases, holding the
        user file against every other process throughout (so nothing can change the users
        between the check and the save): the changes are applied to the users as they are
        now (the first that cannot apply raises, having changed nothing); ``record(serial,
        text)`` writes the new user file's content into the data's transaction;
        ``commit_data()`` commits that transaction; then the user file is saved. If the
        process dies after ``commit_data``, the record (newer than the file) is saved at
        the next start or change (:meth:`_recover`). The caller holds the data's write lock
        already (lock order: data first, then the user file, never the other way).
        ``journal`` reads the record through the committing connection."""
        with self._exclusive(journal):
            trial = _ScratchStore(self.path, copy.deepcopy(self.users),
                                  copy.deepcopy(self.roles), self.generation, self.table_id)
            for name, args, kwargs in ops:
                getattr(trial, name)(*args, **kwargs)
            serial = self.serial + 1
            text = json.dumps({"version": 1, "serial": serial, "users": trial.users,
                               "roles": trial.roles}, sort_keys=True).encode()
            record(serial, text)
            if self._shared is not None:  # other processes look, and find the file locked
                self._seen = self._shared.bump()
            commit_data()
            self.users, self.roles, self.serial = trial.users, trial.roles, serial
            self._bump()
            try:
                with cd_open(self.path, "wb", keyring=self.keyring) as f:
                    f.write(text)
            except Exception as exc:  # committed in the record: saved at the next change
                log.warning("the user changes were committed with the data but the user "
                            "file %s could not be saved now (%s); they are saved from the "
                            "record at the next change or start", self.path, exc)

    def _entry(self, name: str) -> dict[str, Any]:
        entry = self.users.get(name)
        if entry is None:
            entry = self.roles.get(name)
        if entry is None:
            raise StatementError(f'role "{name}" does not exist', "42704")
        return entry

    def exists(self, name: str) -> bool:
        """A user or a role of that name exists."""
        return name in self.users or name in self.roles

    def is_role(self, name: str) -> bool:
        return name in self.roles

    def member_of(self, name: str) -> frozenset[str]:
        """Every role ``name`` (a user or a role) belongs to, directly or through other
        roles; not ``name`` itself."""
        seen: set[str] = set()
        stack = list(self.users.get(name, self.roles.get(name, {})).get("roles", ()))
        while stack:
            role = stack.pop()
            if role in seen or role not in self.roles:
                continue
            seen.add(role)
            stack.extend(self.roles[role].get("roles", ()))
        return frozenset(seen)

    def create_role(self, name: str) -> None:
        """A role: a name that holds grants and is granted to users; it cannot log in."""
        if not name or "\0" in name:
            raise ServerError("a role name must be non-empty")

        def change() -> None:
            if self.exists(name):
                raise StatementError(f'role "{name}" already exists', "42710")
            self.roles[name] = {"grants": {}, "roles": []}

        self._change(change)

    def grant_roles(self, roles: list[str], members: list[str], *, grant: bool,
                    admin_option: bool = False) -> None:
        """Make ``members`` (users or roles) members of ``roles`` (``grant=False``: no longer).

        ``admin_option``: with ``grant``, the members may also grant and revoke those roles
        (``WITH ADMIN OPTION``); without, they lose only that (``REVOKE ADMIN OPTION FOR``)
        and stay members. A revoked membership takes its admin option with it."""
        def change() -> None:
            for role in roles:
                if role in self.users:
                    raise StatementError(f'"{role}" is a user, not a role: only roles are '
                                         "granted", "0LP01")
                if role not in self.roles:
                    raise StatementError(f'role "{role}" does not exist', "42704")
            for member in members:
                entry = self._entry(member)
                have = set(entry.get("roles", ()))
                options = set(entry.get("admin_roles", ()))
                for role in roles:
                    if grant and (role == member or member in self.member_of(role)):
                        raise StatementError(f'role "{role}" is a member of role "{member}"'
                                             if role != member else
                                             f'role "{role}" cannot be a member of itself',
                                             "0LP01")
                    if grant:
                        have.add(role)
                        if admin_option:
                            options.add(role)
                    elif admin_option:
                        options.discard(role)
                    else:
                        have.discard(role)
                        options.discard(role)
                entry["roles"] = sorted(have)
                if options:
                    entry["admin_roles"] = sorted(options)
                else:
                    entry.pop("admin_roles", None)

        self._change(change)

    def admin_of(self, names: frozenset[str] | set[str]) -> frozenset[str]:
        """The roles any of ``names`` (users or roles) holds the admin option on: may grant
        and revoke (pass a session's :attr:`._grants.Privileges.roles`)."""
        held: set[str] = set()
        for name in names:
            held.update(self.users.get(name, self.roles.get(name, {})).get("admin_roles", ()))
        return frozenset(r for r in held if r in self.roles)

    def verifier(self, name: str) -> Verifier | None:
        user = self.users.get(name)
        return Verifier.parse(user["verifier"]) if user else None

    def is_admin(self, name: str) -> bool:
        return bool(self.users.get(name, {}).get("admin"))

    def needs_clientcert(self, name: str) -> bool:
        return bool(self.users.get(name, {}).get("clientcert"))

    def set_user(self, name: str, password: str | None = None, *, admin: bool | None = None,
                 create: bool = False, verifier: str | None = None,
                 clientcert: bool | None = None) -> None:
        """Create (``create=True``) or change a user; the verifier is made here, salted."""
        if not name or "\0" in name:
            raise ServerError("a user name must be non-empty")
        made = verifier
        if made is not None:
            Verifier.parse(made)
        elif password is not None:
            if not password:
                raise ServerError("an empty password is not allowed")
            made = str(make_verifier(password, self.iterations))
        with self._exclusive():
            if create and (name in self.users or name in self.roles):
                raise StatementError(f'role "{name}" already exists', "42710")
            if name in self.roles:
                raise StatementError(f'"{name}" is a role, not a user: roles have no '
                                     "password and cannot log in", "42809")
            if not create and name not in self.users:
                raise StatementError(f'role "{name}" does not exist', "42704")
            if create and made is None:
                raise StatementError("CREATE USER needs a PASSWORD (no other login "
                                     "method is accepted)", "42601")
            user = dict(self.users.get(name, {"admin": False}))
            if made is not None:
                user["verifier"] = made
            if admin is not None:
                user["admin"] = admin
            if clientcert is not None:
                user["clientcert"] = clientcert
            before = self.users.get(name)
            self.users[name] = user
            try:
                self._save()
            except BaseException:
                if before is None:
                    del self.users[name]
                else:
                    self.users[name] = before
                raise
            finally:
                self._bump()

    def drop_user(self, name: str, *, missing_ok: bool = False) -> None:
        """Drop a user or a role (and every membership in that role)."""
        def change() -> None:
            if not self.exists(name):
                if missing_ok:
                    return
                raise StatementError(f'role "{name}" does not exist', "42704")
            if name in self.roles:
                del self.roles[name]
                for entry in [*self.users.values(), *self.roles.values()]:
                    if name in entry.get("roles", ()):
                        entry["roles"] = [r for r in entry["roles"] if r != name]
                    if name in entry.get("admin_roles", ()):
                        entry["admin_roles"] = [r for r in entry["admin_roles"] if r != name]
                return
            admins = [u for u, v in self.users.items() if v.get("admin")]
            if admins == [name]:
                raise StatementError("cannot drop the last admin user", "55006")
            del self.users[name]

        self._change(change)

    def grants(self, name: str) -> dict[str, list[str]]:
        """``{table: [actions]}`` granted to ``name`` itself, a user or a role (tables
        lower-cased); what it has through roles is not included (see :meth:`member_of`)."""
        entry = self.users.get(name, self.roles.get(name, {}))
        grants: dict[str, list[str]] = entry.get("grants", {})
        ids = entry.get(GRANT_IDS)
        if not ids or self.table_id is None:
            return grants
        return {t: a for t, a in grants.items() if self._is_current(ids, t)}

    def actions(self, name: str, table: str) -> list[str]:
        """The actions granted to ``name`` itself on ``table`` (lower case); none when
        the grant's table id is not the table's under that name now (:attr:`table_id`)."""
        entry = self.users.get(name, self.roles.get(name, {}))
        actions: list[str] = entry.get("grants", {}).get(table, [])
        ids = entry.get(GRANT_IDS)
        if actions and ids and not self._is_current(ids, table):
            return []
        return actions

    def _is_current(self, ids: dict[str, str], table: str) -> bool:
        """A grant on ``table`` whose entry records ``ids`` is on the table that has the
        name now (or records no id: by name)."""
        find = self.table_id
        return find is None or table not in ids or find(table) == ids[table]

    def _grant_id(self, table: str) -> str | None:
        find = self.table_id
        return None if find is None or "." in table else find(table)

    @staticmethod
    def _set_id(entry: dict[str, Any], table: str, table_id: str | None) -> None:
        ids = entry.setdefault(GRANT_IDS, {})
        if table_id is None:
            ids.pop(table, None)
        else:
            ids[table] = table_id
        if not ids:
            del entry[GRANT_IDS]

    def change_grants(self, names: list[str], tables: list[str], actions: list[str], *,
                      grant: bool) -> None:
        def change() -> None:
            for name in names:
                self._entry(name)
            for name in names:
                entry = self._entry(name)
                grants = entry.setdefault("grants", {})
                for table in tables:
                    have = set(grants.get(table, ()))
                    current = self._grant_id(table)
                    if self.table_id is not None and \
                            not self._is_current(entry.get(GRANT_IDS, {}), table):
                        have = set()  # another table's, of the name: not this one's
                    have = have | set(actions) if grant else have - set(actions)
                    if have:
                        grants[table] = sorted(have)
                    else:
                        grants.pop(table, None)
                    self._set_id(entry, table, current if have else None)

        self._change(change)

    def rename_table_grants(self, old: str, new: str) -> None:
        """Move every grant on table ``old`` to ``new`` (``ALTER TABLE old RENAME TO
        new``: grants follow the table, as in PostgreSQL)."""
        old, new = old.lower(), new.lower()
        if old == new:
            return

        def change() -> None:
            for entry in [*self.users.values(), *self.roles.values()]:
                grants = entry.get("grants", {})
                if old in grants:
                    grants[new] = sorted(set(grants.pop(old)) | set(grants.get(new, ())))
                    self._set_id(entry, new, entry.get(GRANT_IDS, {}).get(old))
                    self._set_id(entry, old, None)

        self._change(change)

    def copy_table_grants(self, old: str, new: str) -> None:
        """Give ``new`` every grant on ``old`` too (a view's rename, before the catalog's
        commit: a crash before it leaves the grants on ``old`` and a name no view has,
        one after it the grants on ``new``; the other name's are removed after)."""
        old, new = old.lower(), new.lower()
        if old == new:
            return

        def change() -> None:
            for entry in [*self.users.values(), *self.roles.values()]:
                grants = entry.get("grants", {})
                if old in grants:
                    grants[new] = sorted(set(grants[old]) | set(grants.get(new, ())))
                    self._set_id(entry, new, entry.get(GRANT_IDS, {}).get(old))

        self._change(change)

    def granted_on(self, table: str) -> bool:
        """Someone holds a grant on ``table``."""
        table = table.lower()
        return any(table in entry.get("grants", {})
                   for entry in [*self.users.values(), *self.roles.values()])

    def drop_table_grants(self, table: str) -> dict[str, list[str]]:
        """Remove every grant on table ``table`` (``DROP TABLE``: grants go with the
        table, as in PostgreSQL); returns them, ``{grantee: [actions]}``, so a drop that
        fails can give them back (:meth:`change_grants`)."""
        table = table.lower()
        removed: dict[str, list[str]] = {}

        def change() -> None:
            removed.clear()
            for name, entry in [*self.users.items(), *self.roles.items()]:
                grants = entry.get("grants", {})
                if table in grants:
                    removed[name] = grants.pop(table)
                    self._set_id(entry, table, None)

        self._change(change)
        return removed

    def forget_table_grants(self, tables: set[str],
                            ids: dict[str, str] | None = None) -> list[str]:
        """Remove the grants on unqualified names that no table of ``tables`` (lower
        case) has: those of tables dropped where the server did not see it (an embedded
        connection while the server was stopped). With ``ids`` (an analytical catalog's
        ``{name: table id}``, lower-case names) also those whose recorded table id is not
        the table's under the name now (dropped and made again), and a grant with none
        recorded (a file of an earlier version) records the id of the table it is on
        now. Returns the names whose grants were removed; the file is written only when
        something changes. Qualified names (``system.parts``) are kept."""
        def stale(entry: dict[str, Any]) -> set[str]:
            recorded = entry.get(GRANT_IDS, {})
            return {t for t in entry.get("grants", {}) if "." not in t and (
                t not in tables or (ids is not None and t in recorded
                and recorded[t] != ids.get(t)))}

        def unrecorded(entry: dict[str, Any]) -> set[str]:
            recorded = entry.get(GRANT_IDS, {})
            return {t for t in entry.get("grants", {})
                    if ids is not None and t in ids and t not in recorded}

        def entries() -> list[dict[str, Any]]:
            return [*self.users.values(), *self.roles.values()]

        if not any(stale(e) or unrecorded(e) for e in entries()):
            return []
        found: set[str] = set()

        def change() -> None:
            found.clear()
            for entry in entries():
                grants = entry.get("grants", {})
                for t in stale(entry):
                    found.add(t)
                    del grants[t]
                    self._set_id(entry, t, None)
                for t in unrecorded(entry):
                    assert ids is not None
                    self._set_id(entry, t, ids[t])

        self._change(change)
        return sorted(found)

    def grant_rows(self) -> list[tuple[str, str | None, str, str | None, bool | None]]:
        """(user, table, privilege, role, admin_option): a table privilege (role and
        admin_option NULL), or a role membership (table NULL, privilege ``MEMBER``)."""
        entries = sorted([*self.users.items(), *self.roles.items()])
        rows: list[tuple[str, str | None, str, str | None, bool | None]] = [
            (n, t, a, None, None) for n, _u in entries
            for t, actions in sorted(self.grants(n).items()) for a in actions]
        rows += [(n, None, "MEMBER", r, r in u.get("admin_roles", ())) for n, u in entries
                 for r in sorted(u.get("roles", ()))]
        return rows

    def role_rows(self) -> list[tuple[str, str]]:
        """(role, members): each role with its direct members (users and roles), sorted."""
        return [(role, ", ".join(sorted(n for n, e in [*self.users.items(),
                                                         *self.roles.items()]
                                        if role in e.get("roles", ()))))
                for role in sorted(self.roles)]

    def rows(self) -> list[tuple[str, bool, str, int]]:
        return [(n, bool(u.get("admin")),
                 "SCRAM-SHA-256" + (" + client certificate" if u.get("clientcert") else ""),
                 Verifier.parse(u["verifier"]).iterations) for n, u in sorted(self.users.items())]


class _ChangeCounter:
    """How many times the user file was changed, shared by every process that serves it:
    8 bytes at the start of ``path`` (the user file's name plus ``.lock``, mode 0600, no
    secret in it), read with one ``pread`` before each statement; a change holds an
    exclusive ``flock`` on it while it reads, saves and counts. (Not a memory map: a
    process that touches a mapped file someone truncated dies of SIGBUS.)

    Only whether the count moved matters, never its value: a file found shorter than 8
    bytes (truncated, a restore, a full disk when it was made) is rewritten under the
    flock with a random count no process has seen, so every process reads the user file
    again, and the repair is logged."""

    _COUNT = struct.Struct("=Q")

    def __init__(self, path: str) -> None:
        self.path = path
        #: read and written with pread/pwrite (never locked: a forked child may keep it)
        self._file = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._fd = -1
        self._pid = 0
        self._quiet = True  # at start, an empty file is a new one: nothing to log
        try:
            if os.fstat(self._file).st_size < self._COUNT.size:
                with self.locked():
                    pass
        except BaseException:
            self.close()
            raise
        self._quiet = False

    def value(self) -> int:
        """The count, or -1 when the file cannot be read whole (the next change, or the
        next :meth:`locked`, writes it again)."""
        try:
            data = os.pread(self._file, 8, 0)
        except OSError:
            return -1
        return self._COUNT.unpack(data)[0] if len(data) == 8 else -1

    def _whole(self) -> int:
        """The count (the caller holds the flock), the file rewritten first if it is
        shorter than the count (see the class's text)."""
        data = os.pread(self._file, 8, 0)
        if len(data) == 8:
            return int(self._COUNT.unpack(data)[0])
        value = secrets.randbits(64)
        os.pwrite(self._file, self._COUNT.pack(value), 0)
        if data or not self._quiet:
            log.warning("users: %s held %d bytes, not 8 (truncated or damaged); rewritten, "
                        "and every process reads the user file again", self.path, len(data))
        return value

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        self._open()
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._whole()
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def try_lock(self) -> bool:
        """Take the exclusive lock if no other process holds it (:meth:`unlock` it)."""
        self._open()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            self._whole()
        except BaseException:
            self.unlock()
            raise
        return True

    def _open(self) -> None:
        """This process's lock descriptor: an flock is per open file, so one open per
        process; a process forked from this one closes its copy as it starts (_flocks), so
        it never keeps this one's lock after it died."""
        if self._pid != os.getpid():
            self._fd = hold(os.open(self.path, os.O_RDWR | os.O_CLOEXEC))
            self._pid = os.getpid()

    def unlock(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the counter's descriptor and this process's lock descriptor."""
        if self._fd >= 0 and self._pid == os.getpid():
            let_go(self._fd)
            os.close(self._fd)
        self._fd, self._pid = -1, 0
        if self._file >= 0:
            os.close(self._file)
            self._file = -1

    def bump(self) -> int:
        """Count a change (the caller holds :meth:`locked`); the new count."""
        value = (self._whole() + 1) & 0xFFFFFFFFFFFFFFFF
        os.pwrite(self._file, self._COUNT.pack(value), 0)
        return value


class _ScratchStore(UserStore):
    """:meth:`UserStore.scratch`: a copy in memory; changes are never saved."""

    def __init__(self, path: str, users: dict[str, dict[str, Any]],
                 roles: dict[str, dict[str, Any]], generation: int,
                 table_id: Callable[[str], str | None] | None = None) -> None:
        self.path = path
        self.table_id = table_id
        self.keyring = None
        self.iterations = MIN_ITERATIONS
        self._lock = threading.Lock()
        self.generation = generation
        self.users = users
        self.roles = roles
        self._shared = None
        self._seen = 0

    def _save(self) -> None:
        pass


class _TxStore(UserStore):
    """:meth:`UserStore.transaction`: the store's users with one transaction's changes
    (:attr:`ops`) replayed on them, rebuilt whenever the store changes; never saved."""

    def __init__(self, parent: UserStore) -> None:
        self.parent = parent
        self.path = parent.path
        self.table_id = parent.table_id
        self.keyring = None
        self.iterations = parent.iterations  # verifiers made here are the ones committed
        self._lock = threading.Lock()
        self.ops: list[Op] = []
        self._view: UserStore | None = None
        self._generation = 0
        self._shared = None
        self._seen = 0

    def refresh(self) -> None:
        self.parent.refresh()

    def _current(self) -> UserStore:
        view = self._view
        if view is None or view.generation != self.parent.generation:
            view = self.parent.scratch()
            base = view.generation  # the parent's, when copied
            for name, args, kwargs in self.ops:
                try:  # one that no longer applies fails the COMMIT (UserStore.replay)
                    getattr(view, name)(*args, **kwargs)
                except (StatementError, ServerError):
                    pass
            view.generation = base
            self._view = view
            self._generation = next(_GENERATIONS)
        return view

    @property
    def users(self) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return self._current().users

    @property
    def roles(self) -> dict[str, dict[str, Any]]:  # type: ignore[override]
        return self._current().roles

    @property
    def generation(self) -> int:  # type: ignore[override]
        self._current()
        return self._generation

    def rollback_to(self, count: int) -> None:
        """Forget the changes after the first ``count`` (ROLLBACK TO SAVEPOINT)."""
        if count < len(self.ops):
            del self.ops[count:]
            self._view = None

    def _do(self, name: str, *args: Any, **kwargs: Any) -> None:
        view = self._current()
        generation = view.generation
        try:
            getattr(view, name)(*args, **kwargs)
        finally:
            view.generation = generation  # still the parent's it was built on
            self._generation = next(_GENERATIONS)
        self.ops.append((name, args, kwargs))

    def create_role(self, name: str) -> None:
        self._do("create_role", name)

    def grant_roles(self, roles: list[str], members: list[str], *, grant: bool,
                    admin_option: bool = False) -> None:
        self._do("grant_roles", roles, members, grant=grant, admin_option=admin_option)

    def set_user(self, name: str, password: str | None = None, *, admin: bool | None = None,
                 create: bool = False, verifier: str | None = None,
                 clientcert: bool | None = None) -> None:
        if verifier is None and password:  # made once: the COMMIT keeps this verifier
            verifier, password = str(make_verifier(password, self.iterations)), None
        self._do("set_user", name, password, admin=admin, create=create, verifier=verifier,
                 clientcert=clientcert)

    def drop_user(self, name: str, *, missing_ok: bool = False) -> None:
        self._do("drop_user", name, missing_ok=missing_ok)

    def change_grants(self, names: list[str], tables: list[str], actions: list[str], *,
                      grant: bool) -> None:
        self._do("change_grants", names, tables, actions, grant=grant)

    def rename_table_grants(self, old: str, new: str) -> None:
        self._do("rename_table_grants", old, new)

    def drop_table_grants(self, table: str) -> dict[str, list[str]]:
        removed = {name: list(entry.get("grants", {})[table.lower()])
                   for name, entry in [*self.users.items(), *self.roles.items()]
                   if table.lower() in entry.get("grants", {})}
        self._do("drop_table_grants", table)
        return removed


class _Failures:
    """Failed logins per key (user, address), bounded in memory."""

    def __init__(self, limit: int = 10000) -> None:
        self.counts: OrderedDict[str, int] = OrderedDict()
        self.limit = limit

    def add(self, key: str) -> int:
        n = self.counts.pop(key, 0) + 1
        self.counts[key] = n
        while len(self.counts) > self.limit:
            self.counts.popitem(last=False)
        return n

    def clear(self, key: str) -> None:
        self.counts.pop(key, None)


class _SharedFailures:
    """Failed logins per key, in memory shared by every process forked after it is made
    (``cryptdisk serve --workers N``): one table the workers count in together.

    A key is stored as its keyed 64-bit hash (BLAKE2b under ``secret``, so a client cannot
    choose names that collide), in a set-associative table of ``buckets`` x ``ways``
    entries (hash, count, last use); a new key takes a free entry of its bucket, else the
    one used longest ago (bounded like :class:`_Failures`). The table is anonymous shared
    memory (no file can be truncated under it: a process touching a truncated mapped file
    dies of SIGBUS); updates hold a POSIX record lock on an empty unlinked file: it
    excludes the other processes, never this one, and dies with a process killed while
    holding it."""

    _ENTRY = struct.Struct("QQQ")  # key hash (0: free), count, last use
    _HEAD = struct.Struct("Q")     # the use counter

    def __init__(self, secret: bytes, buckets: int = 2048, ways: int = 8) -> None:
        self.secret = secret
        self.buckets = buckets
        self.ways = ways
        size = self._HEAD.size + buckets * ways * self._ENTRY.size
        try:
            self._file = tempfile.TemporaryFile(prefix="cryptdisk-logins-")
        except OSError as exc:
            raise ServerError(f"the workers' shared failed-login table cannot be made in "
                              f"{tempfile.gettempdir()}: {exc.strerror or exc}",
                              hint="set TMPDIR to a writable directory, or serve with "
                              "--workers 1") from None
        try:
            self._memory = mmap.mmap(-1, size, flags=mmap.MAP_SHARED)
        except OSError as exc:
            self._file.close()
            raise ServerError("the workers' shared failed-login table cannot be made: "
                              f"{exc.strerror or exc}", hint="serve with --workers 1") from None

    def close(self) -> None:
        self._memory.close()
        self._file.close()

    def _hash(self, key: str) -> int:
        digest = hashlib.blake2b(key.encode(), key=self.secret[:64], digest_size=8).digest()
        return int.from_bytes(digest, "big") or 1

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.lockf(self._file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self._file.fileno(), fcntl.LOCK_UN)

    def _entries(self, h: int) -> range:
        first = self._HEAD.size + (h % self.buckets) * self.ways * self._ENTRY.size
        return range(first, first + self.ways * self._ENTRY.size, self._ENTRY.size)

    def add(self, key: str) -> int:
        h = self._hash(key)
        m = self._memory
        with self._locked():
            (use,) = self._HEAD.unpack_from(m, 0)
            use += 1
            self._HEAD.pack_into(m, 0, use)
            free, stale, stale_use = -1, -1, 0
            for at in self._entries(h):
                kh, count, last = self._ENTRY.unpack_from(m, at)
                if kh == h:
                    self._ENTRY.pack_into(m, at, h, count + 1, use)
                    return int(count + 1)
                if kh == 0:
                    if free < 0:
                        free = at
                elif stale < 0 or last < stale_use:
                    stale, stale_use = at, last
            self._ENTRY.pack_into(m, free if free >= 0 else stale, h, 1, use)
            return 1

    def clear(self, key: str) -> None:
        h = self._hash(key)
        m = self._memory
        with self._locked():
            for at in self._entries(h):
                if self._ENTRY.unpack_from(m, at)[0] == h:
                    self._ENTRY.pack_into(m, at, 0, 0, 0)


class ScramAuthenticator:
    """Logins by SCRAM-SHA-256 against a :class:`UserStore` (MD5 and cleartext never offered).

    A failed login waits ``delay * 2**(n-1)`` seconds (at most ``max_delay``),
    ``n`` the failures so far of that user name or that address, whichever is
    more, before the client hears one message, the same for an unknown user.
    """

    def __init__(self, store: UserStore, *, channel_binding: bytes | None = None,
                 delay: float = 0.5, max_delay: float = 10.0) -> None:
        self.store = store
        self.channel_binding = channel_binding
        self.delay = delay
        self.max_delay = max_delay
        self._secret = secrets.token_bytes(32)
        self._failures: _Failures | _SharedFailures = _Failures()

    def share_failures(self) -> None:
        """Count failed logins in memory shared with the processes forked after this call
        (the workers of ``cryptdisk serve --workers N``), so an attacker's attempts add up
        whichever worker they reach."""
        self._failures = _SharedFailures(self._secret)

    def _fake(self, user: str) -> Verifier:
        # The same salt for the same unknown name within a run, as a real user's would be.
        salt = _hmac(self._secret, user.encode())[:16]
        return Verifier(salt, self.store.iterations, secrets.token_bytes(32),
                        secrets.token_bytes(32))

    def refresh(self) -> None:
        """Pick up changes other processes made to the users (:meth:`UserStore.refresh`)."""
        self.store.refresh()

    async def login(self, session: Session, user: str) -> None:
        self.store.refresh()
        verifier = self.store.verifier(user)
        if verifier is not None and self.store.needs_clientcert(user) \
                and session.client_cert_name != user:
            verifier = None  # fails like a wrong password, after the same exchange
        binding = getattr(session, "channel_binding", None) or self.channel_binding
        scram = ScramServer(verifier, self._fake(user), binding if session.tls else None)
        session.send(P.auth_sasl(scram.mechanisms()))
        try:
            body = await session.read_password_message()
            end = body.find(b"\0")
            if end < 0 or len(body) < end + 5:
                raise ProtocolError("SASLInitialResponse is malformed")
            mechanism = body[:end].decode("utf-8", "replace")
            (n,) = struct.unpack("!i", body[end + 1:end + 5])
            data = body[end + 5:]
            if n != len(data):
                raise ProtocolError("SASLInitialResponse length does not match its data")
            session.send(P.auth_sasl_continue(scram.first(mechanism, data)))
            final = scram.final(await session.read_password_message())
        except LoginError:
            await self._failed(session, user)
            raise LoginError(f'password authentication failed for user "{user}"') from None
        self._failures.clear("u:" + user)
        self._failures.clear("a:" + (session.peer_host or ""))
        session.send(P.auth_sasl_final(final))

    async def _failed(self, session: Session, user: str) -> None:
        n = max(self._failures.add("u:" + user),
                self._failures.add("a:" + (session.peer_host or "")))
        log.warning("login failed for user %r from %s (failure %d)", user, session.peer_host, n)
        await asyncio.sleep(min(self.delay * 2 ** min(n - 1, 30), self.max_delay))

    def is_admin(self, user: str) -> bool:
        return self.store.is_admin(user)

    def privileges(self, user: str) -> Privileges:
        return Privileges(self.store, user)

    def dry_run(self) -> ScramAuthenticator:
        """An authenticator over :meth:`UserStore.scratch`: its :meth:`handle` checks and
        applies user statements to that copy only."""
        return ScramAuthenticator(self.store.scratch(), delay=0)

    def transaction(self) -> ScramAuthenticator:
        """An authenticator over :meth:`UserStore.transaction`: its :meth:`handle` applies
        user statements to that view; its ``store.ops`` are what a COMMIT applies."""
        return ScramAuthenticator(self.store.transaction(), delay=0)

    # -- statements ------------------------------------------------------------------------

    def handles(self, sql: str) -> bool:
        words = _sqltext.first_words(sql, 2)
        if words[:1] in (["GRANT"], ["REVOKE"]) or words == ["SHOW", "USERS"]:
            return True
        if words in (["SET", "ROLE"], ["RESET", "ROLE"]):
            return True
        if len(words) == 2 and words[0] in ("CREATE", "ALTER", "DROP") \
                and words[1] in ("USER", "ROLE"):
            return True
        return _SYSTEM_TABLE.fullmatch(sql) is not None

    def handle(self, session: Session, sql: str) -> Result | None:
        words = _sqltext.first_words(sql, 2)
        me = session.user
        privileges: Privileges | None = getattr(session, "privileges", None)
        admin = privileges.admin if privileges is not None else self.store.is_admin(me)
        if words[0] in ("SET", "RESET"):
            return self._set_role(sql, words[0], privileges)
        if words[0] in ("GRANT", "REVOKE"):
            sql = self._granted_by(sql, privileges.current_user if privileges is not None
                                   else me, me)
            if re.search(r"\bON\b", _sqltext.strip_strings(sql), re.I) is None:
                return self._grant_role(sql, words[0], admin, privileges)
            return self._grant(sql, words[0], admin, _invoker_views(session))
        system = _SYSTEM_TABLE.fullmatch(sql)
        if system is not None and system[1].lower() == "grants":
            declared = _declared_names(session)  # grants are kept by the lower-case name
            rows = [(user, declared.get(table, table) if table else table, *rest)
                    for user, table, *rest in self.store.grant_rows()]
            return Result([("user", 25), ("table", 25), ("privilege", 25), ("role", 25),
                           ("admin_option", 16)], list(rows), f"SELECT {len(rows)}")
        if system is not None and system[1].lower() == "roles":
            role_rows = self.store.role_rows()
            return Result([("role", 25), ("members", 25)], list(role_rows),
                          f"SELECT {len(role_rows)}")
        if words[0] in ("SHOW", "SELECT"):
            return Result([("name", 25), ("is_admin", 16), ("auth", 25), ("iterations", 20)],
                          list(self.store.rows()), f"SELECT {len(self.store.users)}")
        try:
            if words[0] == "DROP":
                m = re.fullmatch(rf"\s*DROP\s+(?:USER|ROLE)\s+(IF\s+EXISTS\s+)?({_NAME})"
                                 r"\s*;?\s*", sql, re.I | re.S)
                if not m:
                    raise StatementError(f"syntax: DROP {words[1]} [IF EXISTS] name", "42601")
                name = _ident(m[2])
                self._need_admin(admin, "drop users and roles")
                if name == me:
                    raise StatementError("current user cannot be dropped", "55006")
                self.store.drop_user(name, missing_ok=bool(m[1]))
                return Result(None, [], "DROP ROLE")
            # CREATE ROLE name [WITH] LOGIN PASSWORD '...' (pgAdmin's, DBeaver's) makes a user
            login_role = words == ["CREATE", "ROLE"] and re.search(
                rf"\bPASSWORD\s+{_STRING}", sql, re.I | re.S) is not None \
                and re.search(r"\bLOGIN\b", re.sub(rf"{_STRING}|{_QUOTED}", "", sql),
                              re.I) is not None
            if words == ["CREATE", "ROLE"] and not login_role:
                m = re.fullmatch(rf"\s*CREATE\s+ROLE\s+({_NAME})((?:\s+(?:WITH|NOLOGIN))*)"
                                 r"\s*;?\s*", sql, re.I | re.S)
                if not m:
                    raise StatementError("syntax: CREATE ROLE name [[WITH] NOLOGIN] (a role "
                                         "cannot log in: CREATE USER name PASSWORD '...' "
                                         "makes a user)", "42601")
                self._need_admin(admin, "create roles")
                self.store.create_role(_ident(m[1]))
                return Result(None, [], "CREATE ROLE")
            m = re.fullmatch(rf"\s*(CREATE|ALTER)\s+(?:USER|ROLE)\s+({_NAME})((?:\s+(?:WITH|"
                             rf"(?:ENCRYPTED\s+)?PASSWORD\s+{_STRING}|ADMIN|NOADMIN|SUPERUSER|"
                             r"NOSUPERUSER|LOGIN|"
                             r"CLIENTCERT|NOCLIENTCERT))*)\s*;?\s*",
                             sql, re.I | re.S)
            if not m:
                raise StatementError(f"syntax: {words[0]} USER name [WITH] PASSWORD '...' "
                                     "[ADMIN | NOADMIN]", "42601")
            name, options = _ident(m[2]), m[3]
            pw = re.search(rf"PASSWORD\s+({_STRING})", options, re.I | re.S)
            password = pw[1][1:-1].replace("''", "'") if pw else None
            flags = {w.upper() for w in re.findall(r"\b[A-Za-z]+\b", re.sub(
                _STRING, "", options))} - {"WITH", "PASSWORD", "ENCRYPTED", "LOGIN"}
            make_admin = (True if flags & {"ADMIN", "SUPERUSER"} else
                          False if flags & {"NOADMIN", "NOSUPERUSER"} else None)
            clientcert = (True if "CLIENTCERT" in flags else
                          False if "NOCLIENTCERT" in flags else None)
            if words[0] == "CREATE" or name != me or make_admin is not None \
                    or clientcert is not None:
                self._need_admin(admin, "create or change other users")
            verifier = password if password and password.startswith("SCRAM-SHA-256$") else None
            if password and password.startswith(("md5", "SCRAM-")) and verifier is None:
                raise StatementError("only SCRAM-SHA-256 verifiers are accepted", "22023")
            try:
                self.store.set_user(name, None if verifier else password, admin=make_admin,
                                    create=words[0] == "CREATE", verifier=verifier,
                                    clientcert=clientcert)
            except ValueError as exc:
                raise StatementError(str(exc), "22023") from None
            return Result(None, [], f"{words[0]} ROLE")
        except StatementError:
            raise
        except CryptdiskError as exc:
            raise StatementError(str(exc), "58030") from None

    def _set_role(self, sql: str, verb: str, privileges: Privileges | None) -> Result:
        if verb == "RESET":
            if not re.fullmatch(r"\s*RESET\s+ROLE\s*;?\s*", sql, re.I):
                raise StatementError("syntax: RESET ROLE", "42601")
            role = None
        else:
            m = re.fullmatch(rf"\s*SET\s+ROLE\s+(?:TO\s+|=\s*)?({_NAME}|{_STRING})\s*;?\s*",
                             sql, re.I | re.S)
            if not m:
                raise StatementError("syntax: SET ROLE name | NONE", "42601")
            token = m[1]
            role = token[1:-1].replace("''", "'") if token.startswith("'") else _ident(token)
            if not token.startswith(('"', "'")) and role == "none":
                role = None
        if privileges is None:
            raise StatementError("SET ROLE needs a server with users", "0A000")
        if role is not None:
            session_user = privileges.session_user
            if not self.store.exists(role):
                raise StatementError(f'role "{role}" does not exist', "22023")
            if role != session_user and not self.store.is_admin(session_user) \
                    and role not in self.store.member_of(session_user):
                raise StatementError(f'permission denied to set role "{role}"', "42501")
        privileges.set_role(role)
        return Result(None, [], "SET")

    def _grant_role(self, sql: str, verb: str, admin: bool,
                    privileges: Privileges | None) -> Result:
        names = rf"{_NAME}(?:\s*,\s*{_NAME})*"
        if verb == "GRANT":
            m = re.fullmatch(rf"\s*GRANT\s+()({names})\s+TO\s+({names})"
                             r"(\s+WITH\s+ADMIN\s+OPTION)?\s*;?\s*", sql, re.I | re.S)
        else:
            m = re.fullmatch(rf"\s*REVOKE\s+(ADMIN\s+OPTION\s+FOR\s+)?({names})\s+FROM\s+"
                             rf"({names})()\s*;?\s*", sql, re.I | re.S)
        if not m:
            raise StatementError("syntax: GRANT role [, ...] TO name [, ...] [WITH ADMIN "
                                 "OPTION]" if verb == "GRANT" else "syntax: REVOKE [ADMIN "
                                 "OPTION FOR] role [, ...] FROM name [, ...]", "42601")
        roles = [_ident(r) for r in re.findall(_NAME, m[2])]
        members = [_ident(u) for u in re.findall(_NAME, m[3])]
        if not admin:
            held = self.store.admin_of(privileges.roles) if privileges is not None \
                else frozenset()
            for role in roles:
                if role not in held:
                    raise StatementError(
                        f'permission denied to {verb.lower()} role "{role}"', "42501",
                        hint=f'only admins and roles with the ADMIN OPTION on "{role}" may '
                        f"{verb.lower()} it")
        self.store.grant_roles(roles, members, grant=verb == "GRANT",
                               admin_option=bool(m[1] or m[4]))
        return Result(None, [], f"{verb} ROLE")

    def _grant(self, sql: str, verb: str, admin: bool, views: dict[str, str] | None = None
               ) -> Result:
        self._need_admin(admin, "grant or revoke privileges")
        names = rf"{_NAME}(?:\s*\.\s*{_NAME})?"
        m = re.fullmatch(rf"\s*{verb}\s+(.+?)\s+ON\s+(?:TABLE\s+)?({names}(?:\s*,\s*{names})*)"
                         rf"\s+{'TO' if verb == 'GRANT' else 'FROM'}\s+({_NAME}(?:\s*,\s*{_NAME})*)"
                         r"\s*;?\s*", sql, re.I | re.S)
        if not m:
            raise StatementError(f"syntax: {verb} SELECT|INSERT|UPDATE|DELETE|ALL [, ...] ON "
                                 f"[TABLE] t [, ...] {'TO' if verb == 'GRANT' else 'FROM'} "
                                 "name [, ...]", "42601")
        actions = [a.strip().upper() for a in m[1].split(",")]
        if actions in (["ALL"], ["ALL PRIVILEGES"]):
            actions = list(ACTIONS)
        bad = [a for a in actions if a not in ACTIONS]
        if bad:
            raise StatementError(f"{verb}: unknown privilege {bad[0]} (SELECT, INSERT, UPDATE, "
                                 "DELETE or ALL)", "42601")
        tables = [".".join(_sqltext.unqualified_parts([_ident(p) for p in re.findall(_NAME, t)]))
                  for t in re.findall(names, m[2])]
        users = [_ident(u.strip()) for u in re.findall(_NAME, m[3])]
        known = views or {}
        view = next((known[t.lower()] for t in tables if t.lower() in known), None)
        if view is not None and verb == "GRANT":
            raise StatementError(
                f"GRANT ... ON {view}: {view} is a view, and a view has the rights of the user "
                "who reads it (invoker rights): reading it needs SELECT on the tables it reads",
                "0A000", hint=f"GRANT SELECT ON the tables it reads (SELECT reads FROM "  # noqa: S608
                f"system.views WHERE name = '{view}'), or ALTER VIEW {view} SET "
                "(security_invoker = false) to give it its owner's rights")
        self.store.change_grants(users, [t.lower() for t in tables], actions,
                                 grant=verb == "GRANT")
        return Result(None, [], verb)

    @staticmethod
    def _granted_by(sql: str, current: str, session_user: str) -> str:
        """``sql`` without its ``GRANTED BY role``, which must name the current user (as
        PostgreSQL requires of non-superusers): cryptdisk records no grantor."""
        m = re.search(rf"\s+GRANTED\s+BY\s+({_NAME})\s*;?\s*$", sql, re.I | re.S)
        if m is None:
            return sql
        word = m[1].upper()
        name = current if word in ("CURRENT_USER", "CURRENT_ROLE") else \
            session_user if word == "SESSION_USER" else _ident(m[1])
        if name != current:
            raise StatementError(f'GRANTED BY "{name}": the grantor must be the current '
                                 "user (cryptdisk records no grantor)", "0A000",
                                 hint="leave out GRANTED BY, or name the current user")
        return sql[:m.start()]

    @staticmethod
    def _need_admin(admin: bool, what: str) -> None:
        if not admin:
            raise StatementError(f"permission denied: only admin users may {what}", "42501")

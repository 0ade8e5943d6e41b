"""``cryptdisk serve``: a database over the PostgreSQL protocol, with TLS and SCRAM logins."""

from __future__ import annotations

import argparse
import contextlib
import getpass
import os
import sys
import tomllib
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError, ServerError
from ._keys import add_key_options, keyring_from_args

__all__ = ["register"]

PASSWORD_ENV = "CRYPTDISK_PASSWORD"  # noqa: S105 - a variable name
_SETTINGS = {"listen", "cert", "key", "users", "plaintext", "scram_iterations",
             "max_message_size", "max_connections", "login_timeout", "idle_timeout",
             "statement_timeout", "access_log", "access_log_encrypted", "max_copy_size",
             "client_ca", "policies", "audit_log", "workers", "lock_timeout"}


def _server_section(config: str | None) -> dict[str, Any]:
    if not config or config.endswith(".xml"):
        return {}
    try:
        with open(config, "rb") as f:
            section = tomllib.load(f).get("server", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read [server]: {exc}", path=config) from None
    if not isinstance(section, dict):
        raise ConfigError("[server] must be a table", path=config)
    unknown = set(section) - _SETTINGS
    if unknown:
        raise ConfigError(f"unknown [server] setting(s) {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(sorted(_SETTINGS))})", path=config,
                          where="[server]")
    if section.get("plaintext", "never") not in ("never", "loopback"):
        raise ConfigError("[server] plaintext must be \"never\" or \"loopback\"", path=config,
                          where="[server]")
    for name, (integer, least, what) in _NUMBERS.items():
        value = section.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) \
                or value < least:
            raise ConfigError(f"[server] {name} must be {what}, not {value!r}", path=config,
                              where="[server]")
    if not isinstance(section.get("access_log_encrypted", False), bool):
        raise ConfigError("[server] access_log_encrypted must be true or false", path=config,
                          where="[server]")
    return section


#: the numeric [server] settings: (an integer?, the least value, what it must be)
_NUMBERS: dict[str, tuple[bool, float, str]] = {
    "max_connections": (True, 1, "a whole number of connections, 1 or more"),
    "max_message_size": (True, 1024, "a whole number of bytes, 1024 or more"),
    "max_copy_size": (True, 1, "a whole number of bytes, 1 or more"),
    "scram_iterations": (True, 4096, "a whole number of iterations, 4096 or more"),
    "login_timeout": (False, 1e-9, "a number of seconds above 0"),
    "idle_timeout": (False, 0, "a number of seconds, 0 or more (0: no limit)"),
    "statement_timeout": (False, 0, "a number of seconds, 0 or more (0: no limit)"),
}


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ServerError(f"--listen {text!r}: expected HOST:PORT (e.g. 127.0.0.1:5432)")
    return host.strip("[]") or "127.0.0.1", int(port)


def _workers(args: argparse.Namespace, settings: dict[str, Any]) -> tuple[int, str | None]:
    """(worker processes, why ``auto`` gave one): ``--workers``, else ``[server] workers``,
    else ``auto``: one per CPU (at most 8) for --sqlite; one for the analytical engine,
    which one process at a time can write."""
    from ..server import MAX_WORKERS, default_workers

    text = str(args.workers if args.workers is not None else settings.get("workers", "auto"))
    single = None
    if not args.sqlite:
        single = ("the analytical database is written by one process at a time (its LOCK), "
                  "and another process would not see its new parts")
    if text == "auto":
        return (1, single) if single else (default_workers(), None)
    if not text.isdigit() or not 1 <= int(text) <= MAX_WORKERS:
        raise ServerError(f"--workers {text!r}: expected a number from 1 to {MAX_WORKERS}, "
                          "or auto")
    if int(text) > 1 and single:
        raise ServerError(f"--workers {text}: {single}; serve it with --workers 1",
                          hint="several workers serve an encrypted SQLite database "
                          "(--sqlite)")
    return int(text), None


def _plural(workers: int) -> str:
    return "1 worker process" if workers == 1 else f"{workers} worker processes"


def _password(name: str) -> str:
    password = os.environ.get(PASSWORD_ENV)
    if password:
        return password
    if not sys.stdin.isatty():
        raise ServerError(f"no password for {name}",
                          hint=f"set {PASSWORD_ENV}, or run on a terminal to be prompted")
    first = getpass.getpass(f"password for {name}: ")
    if first != getpass.getpass("again: "):
        raise ServerError("the passwords differ")
    return first


def _serve(args: argparse.Namespace) -> int:
    from .. import fields  # noqa: F401  (its SQL functions on the analytical engine)
    from ..server import AnalyticalEngine, SQLiteEngine

    config = args.keyring
    settings = _server_section(config)
    workers, _single = _workers(args, settings)
    path = os.path.abspath(args.path)
    #: --check opens everything to read only: it creates and changes nothing
    check = args.check and not args.add_user and not args.resolve_users
    if args.sqlite:
        lock_timeout = settings.get("lock_timeout", 30)
        if not isinstance(lock_timeout, int | float) or not 0 < lock_timeout <= 86400:
            raise ConfigError("[server] lock_timeout must be more than 0 and at most 86400 "
                              "seconds", path=config, where="[server]")
        if os.path.isdir(path):
            raise ServerError(f"{args.path} is a directory, not an encrypted SQLite file",
                              hint="without --sqlite, serve serves the analytical database "
                              "in a directory")
        keyring = keyring_from_args(args)
        users = args.users or settings.get("users") or path + ".users"
        if not os.path.exists(path) and (check or not (args.add_user or args.resolve_users
                                                       or os.path.exists(users))):
            # --check creates nothing; nor does a server that would stop at "no users"
            keyring.close()
            raise ServerError(f"no SQLite database at {args.path}",
                              hint="check the path; the first --add-user creates it")
        if keyring.config_path and not keyring.config_path.endswith(".xml"):
            from ..keys import FollowingKeyring

            # a key another process adds or promotes (cryptdisk keys) is taken at once
            keyring = FollowingKeyring(keyring.config_path, keyring)
        engine: Any = SQLiteEngine(path, keyring,
                                   busy_timeout_ms=round(lock_timeout * 1000))
    else:
        if not os.path.isfile(os.path.join(path, "catalog")):
            raise ServerError(f"no cryptdisk database at {args.path}",
                              hint=f"check the path; `cryptdisk sql {args.path} --create` "
                              "makes a new database")
        engine = AnalyticalEngine(path, config, read_only=check)
    # every way out closes what this command opened (main() may run again in this process:
    # an engine left open kept its database locked, a store its lock file, until collected)
    with contextlib.ExitStack() as opened:
        opened.callback(engine.close)  # (again after a server stopped: closing twice is fine)
        return _serve_opened(args, engine, opened, settings, workers, path, check)


def _no_directory(what: str, setting: str, path: str) -> ServerError | None:
    """The error for log ``path`` whose directory does not exist, if it does not."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(folder):
        return None
    why = "is not a directory" if os.path.lexists(folder) else "does not exist"
    return ServerError(f"the {what} {path}: its directory {folder} {why}",
                       hint=f"make the directory, or set [server] {setting} elsewhere")


@contextlib.contextmanager
def _opening_log(what: str, setting: str, path: str) -> Iterator[None]:
    """An ``OSError`` opening the access or audit log ``path`` (before the server listens):
    one error naming the log, its path and why (its directory missing, a directory...)."""
    try:
        yield
    except OSError as exc:
        missing = _no_directory(what, setting, path)
        if missing is not None:
            raise missing from None
        raise ServerError(f"the {what} {path}: cannot open it: {exc.strerror or exc}",
                          hint=f"check [server] {setting}") from None


def _check_access_log(path: str, keyring: Any) -> None:
    """What ``--check`` checks of the access log, creating and changing nothing (opening it
    for appending would create it, or put back a torn last line): its directory exists and
    an encrypted log there opens under the keys."""
    missing = _no_directory("access log", "access_log", path)
    if missing is not None:
        raise missing
    if keyring is not None and os.path.isfile(path) and os.path.getsize(path):
        from .. import open as cd_open

        with cd_open(path, "rb", keyring=keyring):
            pass  # the header's key check


def _serve_opened(args: argparse.Namespace, engine: Any, opened: contextlib.ExitStack,
                  settings: dict[str, Any], workers: int, path: str, check: bool) -> int:
    """The rest of ``cryptdisk serve`` once ``engine`` is open (``opened`` closes it and
    what is entered into it when the command ends)."""
    from ..server import (
        DEFAULT_ITERATIONS,
        DEFAULT_MAX_MESSAGE_SIZE,
        ScramAuthenticator,
        Server,
        UserStore,
        certificate_fingerprint,
        ensure_self_signed,
        load_tls,
    )

    users_path = args.users or settings.get("users") or path + ".users"
    iterations = int(settings.get("scram_iterations", DEFAULT_ITERATIONS))
    store = opened.enter_context(UserStore(
        users_path, engine.keyring, iterations=iterations,
        journal=engine.read_users_record if args.sqlite else None,
        journal_path=path if args.sqlite else None, read_only=check))
    if not args.sqlite:
        from ..server import AuditLog, PolicyStore

        audit_path = settings.get("audit_log") or path + ".audit"
        with _opening_log("audit log", "audit_log", audit_path):
            audit = AuditLog(audit_path, engine.keyring, read_only=check)
        engine.policies = PolicyStore(
            settings.get("policies") or path + ".policies", engine.keyring, engine,
            audit=audit)
    if args.resolve_users and not args.sqlite:
        raise ServerError("--resolve-users is for --sqlite databases (the analytical "
                          "database keeps no record of user changes)")
    if args.resolve_users:
        session = engine.open_session()
        try:
            print(session.resolve_users(store, args.resolve_users))
        finally:
            session.close()
        return 0
    if args.sqlite and args.check:
        store.check_journal()
    elif args.sqlite:
        store.recover()  # before any worker starts: a restored user file stops it here
    if args.add_user and args.sqlite:
        # as every change on --sqlite: with the database's record of user changes
        tx: Any = store.transaction()
        tx.set_user(args.add_user, _password(args.add_user), admin=args.admin,
                    create=args.add_user not in store.users)
        session = engine.open_session()
        try:
            session.commit_users(store, tx.ops)
        finally:
            session.close()
    elif args.add_user:
        store.set_user(args.add_user, _password(args.add_user), admin=args.admin,
                       create=args.add_user not in store.users)
    if args.add_user:
        print(f"user {args.add_user} {'(admin) ' if args.admin else ''}saved in "
              f"{users_path} (SCRAM-SHA-256, {iterations} iterations)")
        return 0
    if not store.users:
        raise ServerError(f"no users in {users_path}",
                          hint=f"add one: cryptdisk serve {args.path} --add-user NAME "
                          f"--admin (password from ${PASSWORD_ENV} or a prompt)")
    host, port = _listen(args.listen or settings.get("listen", "127.0.0.1:5432"))  # (before
    cert = args.tls_cert or settings.get("cert")  # a self-signed pair is made)
    key = args.tls_key or settings.get("key")
    if args.self_signed:
        cert, key = path + ".server.pem", path + ".server.key"
        if check and not (os.path.exists(cert) and os.path.exists(key)):
            print(f"ok: {args.path} opens; {len(store.users)} user(s) in {users_path}; "
                  f"a self-signed TLS certificate {cert} would be created; would listen "
                  f"on {host}:{port} with {_plural(workers)}")
            return 0
        ensure_self_signed(cert, key)
        print(f"TLS certificate {cert} (self-signed), SHA-256 fingerprint "
              f"{certificate_fingerprint(cert)}")
    if bool(cert) != bool(key):
        raise ServerError("give both a certificate and its key (--tls-cert and --tls-key)")
    ctx, binding = load_tls(cert, key, settings.get("client_ca")) if cert and key \
        else (None, None)
    access_log = None
    log_keys = engine.keyring if settings.get("access_log_encrypted") else None
    if settings.get("access_log") and check:
        _check_access_log(settings["access_log"], log_keys)
    elif settings.get("access_log"):
        from ..server import AccessLog

        with _opening_log("access log", "access_log", settings["access_log"]):
            access_log = AccessLog(settings["access_log"], log_keys)
        opened.callback(access_log.close)  # (a server that ran closed it: again is fine)
    server = Server(
        engine, host=host, port=port, ssl_context=ctx,
        plaintext_loopback=args.plaintext_loopback
        or settings.get("plaintext") == "loopback",
        authenticator=ScramAuthenticator(store, channel_binding=binding),
        max_message_size=int(settings.get("max_message_size", DEFAULT_MAX_MESSAGE_SIZE)),
        max_connections=int(settings.get("max_connections", 100)),
        login_timeout=float(settings.get("login_timeout", 60)),
        idle_timeout=float(settings.get("idle_timeout", 0)),
        statement_timeout=float(settings.get("statement_timeout", 0)),
        access_log=access_log,
        max_copy_size=int(settings.get("max_copy_size", 1 << 30)))
    if cert and key:  # SIGHUP: the certificate again (renewed), from the same files
        tls_files = (cert, key, settings.get("client_ca"))
        server.reload_tls = lambda: load_tls(*tls_files)

    if args.check:
        kind = "encrypted SQLite" if args.sqlite else "analytical database"
        tls = f"TLS certificate {cert}" if cert else "no TLS (plaintext on loopback only)"
        print(f"ok: {args.path} opens ({kind}); {len(store.users)} user(s) in {users_path}; "
              f"{tls}; would listen on {host}:{port} with {_plural(workers)}")
        return 0

    def ready(address: tuple[str, int]) -> None:
        kind = "encrypted SQLite" if args.sqlite else "analytical database"
        tls = "TLS" if ctx else "plaintext, loopback only"
        print(f"serving {args.path} ({kind}) on {address[0]}:{address[1]} ({tls}, "
              f"{_plural(workers)}); SIGTERM stops", flush=True)

    if workers > 1:
        from ..server import run_workers

        code = run_workers(server, workers, ready=ready)
        print("stopped: every worker drained" if code == 0 else
              "stopped: a worker did not exit cleanly", flush=True)
        return code
    server.run(ready=ready)
    print("stopped: every session closed", flush=True)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "serve", help="serve a database over the PostgreSQL protocol (TLS, SCRAM users)",
        description="Serve an embedded cryptdisk database (or, with --sqlite, an encrypted "
        "SQLite database) to PostgreSQL clients (psql, psycopg, pg8000) over TLS, with users "
        "logging in by SCRAM-SHA-256. See docs/server.md.")
    p.add_argument("path", help="the database directory (or SQLite file with --sqlite)")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="address to listen on (default 127.0.0.1:5432, or [server] listen)")
    p.add_argument("--sqlite", action="store_true", help="PATH is an encrypted SQLite database")
    p.add_argument("--tls-cert", metavar="PEM", help="TLS certificate (default [server] cert)")
    p.add_argument("--tls-key", metavar="PEM", help="TLS private key (default [server] key)")
    p.add_argument("--self-signed", action="store_true",
                   help="use (creating it once) a self-signed certificate PATH.server.pem and "
                   "print its SHA-256 fingerprint")
    p.add_argument("--plaintext-loopback", action="store_true",
                   help="also accept unencrypted connections from loopback addresses")
    p.add_argument("--users", metavar="FILE",
                   help="the sealed user file (default PATH.users, or [server] users)")
    p.add_argument("--add-user", metavar="NAME",
                   help=f"add a user (or set its password: ${PASSWORD_ENV} or a prompt) "
                   "and exit")
    p.add_argument("--admin", action="store_true", help="with --add-user: an admin user")
    p.add_argument("--resolve-users", choices=("file", "database"),
                   help="with --sqlite, after the user file or the database was restored "
                   "from an older copy: keep the user file's users (file) or the ones the "
                   "database recorded (database), make the other agree, and exit")
    p.add_argument("--workers", metavar="N|auto",
                   help="worker processes, each serving connections on its own core (default "
                   "auto: one per CPU, at most 8, with --sqlite; 1 for the analytical "
                   "database; or [server] workers)")
    p.add_argument("--check", action="store_true",
                   help="check the config, keys, users and certificate, then exit (0: ok)")
    add_key_options(p, required=False)
    p.set_defaults(func=_serve)

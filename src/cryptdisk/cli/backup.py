"""``cryptdisk backup``: encrypted, deduplicated, verifiable backups of databases."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import BackupError, CryptdiskError, MissingEnvironmentVariableError
from ..format import MAGIC
from ..keys import Key, Keyring, key_from_file
from ._app import warn
from ._args import env_name, key_id
from ._keys import add_key_options, config_from_args, keyring_from_args, keys_given

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "backup", help="encrypted, deduplicated, verifiable backups of databases",
        description="Back up cryptdisk databases (a database directory, or an encrypted "
        "SQLite file) into a repository on any fsspec target (a directory, s3://...). The "
        "repository has its own key, wrapped by a passphrase and/or keyring keys. See "
        "docs/backup.md.")
    sub = parser.add_subparsers(dest="backup_command", metavar="ACTION", required=True)

    def repo_parser(name: str, help_: str, description: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=description)
        p.add_argument("repo", metavar="REPO", help="repository: a directory or an fsspec URL")
        g = p.add_argument_group("repository key (one or more)")
        g.add_argument("--passphrase-env", type=env_name, metavar="VAR",
                       help="environment variable holding the repository passphrase")
        g.add_argument("--repo-keyring", metavar="CONFIG",
                       help="TOML config whose [keyring] has a key wrapping the repository key")
        g.add_argument("--repo-key-file", metavar="PATH",
                       help="key file (as 'cryptdisk keygen' writes) wrapping the repository key")
        g.add_argument("--repo-key-id", type=key_id, default=1, metavar="N",
                       help="id of the --repo-key-file key (default 1)")
        p.add_argument("--repo-option", action="append", default=[], metavar="KEY=VALUE",
                       help="fsspec storage option for REPO (e.g. endpoint_url=http://...)")
        return p

    p = repo_parser("init", "create a repository", "Create a new repository with a new random "
                    "key, wrapped by the passphrase and/or keyring key given.")
    p.add_argument("--create-bucket", action="store_true",
                   help="create REPO's bucket (s3://BUCKET/...) if it does not exist; "
                   "without it a missing bucket is an error")
    p.set_defaults(func=_store_errors(_init))

    p = repo_parser("create", "back up a database", "Back up SOURCE: a database directory "
                    "(read-only, one catalog version; its keys from --config or PATH.key) or an "
                    "encrypted SQLite file (its keys from --config/--key-file...).")
    p.add_argument("source", metavar="SOURCE")
    add_key_options(p, required=False)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=_store_errors(_create))

    p = repo_parser("list", "list backups", "List the backups in the repository, oldest first.")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_store_errors(_list))

    p = repo_parser("verify", "authenticate every chunk without restoring",
                    "Authenticate every manifest, their chain and every chunk they name; name "
                    "each missing or damaged chunk and the backups it affects. Exit status 1 "
                    "if anything is wrong.")
    p.add_argument("--sample", type=_percent, metavar="PCT",
                   help="check only PCT percent of the chunks (5 or 5%%), chosen at random")
    p.set_defaults(func=_store_errors(_verify))

    p = repo_parser("restore", "restore a backup into a new path (or over a database)",
                    "Restore backup ID into TARGET (which must not exist, unless --force). A "
                    "database is created under --config (or a new key in TARGET.key) and "
                    "checked; a SQLite database is encrypted under the key(s) given.")
    p.add_argument("backup_id", metavar="ID", help="backup id, 'latest', or @TIME (ISO 8601, UTC "
                   "by default): the newest backup taken at or before TIME")
    p.add_argument("target", metavar="TARGET")
    p.add_argument("--source", metavar="PATH",
                   help="the source (a path as 'backup list' shows it) whose latest or @TIME "
                   "backup to restore; needed for 'latest' and @TIME when the repository holds "
                   "backups of several sources")
    p.add_argument("--table", action="append", default=[], metavar="NAME",
                   help="restore only this table (repeatable)")
    p.add_argument("--force", action="store_true",
                   help="replace TARGET if it exists: a database (or encrypted SQLite file) "
                   "of the backup's kind that no process has open; the restored one takes "
                   "its place atomically (killed at any point, TARGET is the old database "
                   "or the new one), then the old one is deleted. Without --config, a "
                   "database keeps TARGET.key")
    add_key_options(p, required=False)
    p.set_defaults(func=_store_errors(_restore))

    p = repo_parser("prune", "delete old backups (keep last/daily/weekly/monthly) and "
                    "chunks no backup needs",
                    "Delete the backups no retention rule keeps, then every chunk that no "
                    "remaining backup names. The rules apply to each source (database path) "
                    "apart. Refused while a backup is being written.")
    p.add_argument("--keep-last", type=int, default=0, metavar="N",
                   help="keep the newest N backups of each source")
    for unit in ("daily", "weekly", "monthly"):
        p.add_argument(f"--keep-{unit}", type=int, default=0, metavar="N",
                       help=f"keep the newest backup of each of the newest N "
                       f"{ {'daily': 'days', 'weekly': 'ISO weeks', 'monthly': 'months'}[unit]} "
                       "that have backups (UTC)")
    p.add_argument("--break-lock", action="store_true",
                   help="first delete the lock markers of killed processes (object stores; "
                   "only when no backup or prune is running)")
    p.set_defaults(func=_store_errors(_prune))

    p = repo_parser("keys", "list or add the repository key's wrappings",
                    "List how the repository key is wrapped; with --add-*, wrap it under "
                    "another passphrase or keyring key too (the repository must open with "
                    "the key options given).")
    p.add_argument("--add-passphrase-env", type=env_name, metavar="VAR")
    p.add_argument("--add-keyring", metavar="CONFIG")
    p.add_argument("--add-key-file", metavar="PATH")
    p.add_argument("--add-key-id", type=key_id, default=1, metavar="N")
    p.set_defaults(func=_store_errors(_keys))


#: Libraries behind fsspec's object stores: their errors are the store's (down, refused).
_STORE_PACKAGES = frozenset({"adlfs", "aiobotocore", "aiohttp", "botocore", "fsspec", "gcsfs",
                             "s3fs"})


def _raised_by_store(exc: BaseException) -> bool:
    if isinstance(exc, CryptdiskError) or not isinstance(exc, Exception):
        return False
    if type(exc).__module__.partition(".")[0] in _STORE_PACKAGES:
        return True  # botocore's NoCredentialsError, EndpointConnectionError, ...
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
    # a storage option the store's client does not take: TypeError from its constructor
    # (an AttributeError: one of the wrong type, such as a string for a dict)
    return isinstance(exc, (TypeError, ValueError, AttributeError)) and (
        where.partition(".")[0] in _STORE_PACKAGES)


def _store_errors(func: Callable[[argparse.Namespace], int]
                  ) -> Callable[[argparse.Namespace], int]:
    """An error of the repository's store (unreachable, no credentials, an option it does
    not take) as ``cryptdisk: error: REPO: ...``, not a traceback."""
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except Exception as exc:
            if not _raised_by_store(exc) or getattr(args, "traceback", False):
                raise
            raise BackupError(f"{args.repo}: the store failed: {type(exc).__name__}: {exc}",
                              hint="check that the store is reachable, the --repo-option "
                              "values, and the credentials in the environment") from None
    return run


def _percent(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a percentage") from None
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: give a percentage in (0, 100]")
    return value


def _env(var: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise MissingEnvironmentVariableError(
            f"environment variable {var} is not set or empty; it should hold the passphrase",
            variable=var)
    return value


def _keyring(config: str | None, key_file: str | None, key_id: int) -> Keyring | None:
    if config and key_file:
        raise BackupError("give a keyring config or a key file, not both")
    if config:
        return Keyring.from_config(config)
    if key_file:
        return Keyring.single(Key(key_id, key_from_file(key_file), source="file"))
    return None


def _options(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in args.repo_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BackupError(f"--repo-option {item!r}: expected KEY=VALUE")
        out[key] = _option_value(key, value)
    return out


def _dates_as_text(value: Any) -> Any:
    """``value`` with every TOML date or time inside a table or array as its ISO text."""
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _dates_as_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dates_as_text(v) for v in value]
    return value


def _option_value(key: str, raw: str) -> Any:
    """A TOML value (``true``, ``4``, ``{ region_name = "eu-west-1" }``) or a JSON object or
    array as its value, anything else as the string: fsspec's stores take booleans,
    numbers and dicts, and the string ``"false"`` is true (``anon=false`` was anonymous)."""
    import json
    import tomllib

    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        pass
    else:
        # a TOML date or time (2026-01-01, 07:30:00) is the string it was written as: no
        # store takes a date object, and a prefix or tag that looks like a date is text
        if isinstance(value, datetime.date | datetime.time):
            return raw
        return _dates_as_text(value)
    if raw.lstrip().startswith(("{", "[")):
        try:
            return json.loads(raw)
        except ValueError:
            raise BackupError(f"--repo-option {key}: the value is neither a TOML nor a "
                              "JSON table or array (not quoted here: it may hold a secret)"
                              ) from None
    return raw


def _unlock_args(args: argparse.Namespace) -> dict[str, Any]:
    return {"passphrase": _env(args.passphrase_env) if args.passphrase_env else None,
            "keyring": _keyring(args.repo_keyring, args.repo_key_file, args.repo_key_id),
            "storage_options": _options(args)}


def _open(args: argparse.Namespace) -> Any:
    from ..backup import Repository

    unlock = _unlock_args(args)
    repo = Repository.open(args.repo, **unlock)
    _warn_if_rotated(args, repo, unlock["keyring"])
    return repo


def _warn_if_rotated(args: argparse.Namespace, repo: Any, keyring: Keyring | None) -> None:
    """Warn when a --repo-keyring config's current key does not wrap the repository key: the
    key that does will be retired and destroyed some day, and the repository with it."""
    if keyring is None or not args.repo_keyring:
        return
    wrapped = {w.get("check") for w in repo.config["wrappings"] if w.get("kind") == "key"}
    current = keyring.current_key()
    if current.check_value.hex() in wrapped:
        return
    old = sorted(k.key_id for k in keyring if k.check_value.hex() in wrapped)
    warn(f"keyring key {current.key_id}, the current key of {args.repo_keyring}, does not "
         f"wrap this repository's key (key {', '.join(map(str, old))} does): before retiring "
         f"that key, wrap the repository under the current one too: cryptdisk backup keys "
         f"{args.repo} --repo-keyring {args.repo_keyring} --add-keyring {args.repo_keyring}")


def _init(args: argparse.Namespace) -> int:
    from ..backup import Repository

    repo = Repository.init(args.repo, create_bucket=args.create_bucket, **_unlock_args(args))
    print(f"created backup repository {args.repo} (id {repo.id})")
    return 0


def _has_cryptdisk_header(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def _no_single_key(args: argparse.Namespace, what: str, otherwise: str) -> None:
    """A database's keys come from --config (``otherwise``: its PATH.key, a new key in
    TARGET.key): refuse, rather than pass over, the options that give a SQLite file's
    single key."""
    for name in ("key_file", "key_env", "key_hex"):
        if getattr(args, name, None):
            flag = "--" + name.replace("_", "-")
            raise BackupError(f"{what}, whose keys come from --config "
                              f"(or {otherwise}), not {flag}",
                              hint=f"give --config CONFIG, or leave {flag} out")


def _source_keys(args: argparse.Namespace, path: str) -> dict[str, Any]:
    given = any(getattr(args, n, None) for n in ("keyring", "key_env", "key_file", "key_hex"))
    if os.path.isdir(path) or (not os.path.exists(path) and not given):
        _no_single_key(args, f"{path} is a database", "its PATH.key")
        return {"config": config_from_args(args)}
    if os.path.isfile(path) and not _has_cryptdisk_header(path):
        return {}  # no key opens it: create() says what it is
    return {"keyring": keyring_from_args(args)}


def _create(args: argparse.Namespace) -> int:
    from ..backup import create

    repo = _open(args)
    s = create(repo, args.source, **_source_keys(args, os.path.abspath(args.source)))
    if args.json:
        print(json.dumps(vars(s)))
    else:
        reused = f" ({s.files_reused} unchanged, not read again)" if s.files_reused else ""
        print(f"backup {s.id}: {s.kind} {s.source}, {s.files} file(s){reused}, {s.bytes} "
              f"bytes in {s.chunks} chunks; {s.new_chunks} new, {s.stored_bytes} bytes stored")
    return 0


def _list(args: argparse.Namespace) -> int:
    from ..backup import list_backups

    rows = list_backups(_open(args))
    if args.json:
        print(json.dumps(rows))
        return 0
    for r in rows:
        if "error" in r:
            print(f"{r['id']}  DAMAGED: {r['error']}")
            continue
        print(f"{r['id']}  {r['kind']:6}  {r['bytes']:>14} bytes  "
              f"{r['stored_bytes']:>12} stored  {r['source']}")
    if not rows:
        print("no backups")
    return 1 if any("error" in r for r in rows) else 0


def _verify(args: argparse.Namespace) -> int:
    from ..backup import verify

    report = verify(_open(args), sample=args.sample)
    for bid, why in report.bad_manifests.items():
        print(f"backup {bid}: {why}")
    for line in report.chain_breaks:
        print(line)
    for name, (problem, backups) in sorted(report.problems.items()):
        print(f"chunk {name}: {problem}; affects backups {', '.join(backups)}")
    what = (f"{report.chunks_checked} of {report.chunks_referenced} chunks"
            if args.sample else f"{report.chunks_checked} chunks")
    if report.ok:
        print(f"ok: {report.backups} backup(s), {what} authenticated")
        return 0
    print(f"FAILED: {len(report.problems)} damaged or missing chunk(s), "
          f"{len(report.bad_manifests)} bad manifest(s), {len(report.chain_breaks)} chain "
          f"break(s) ({what} checked)", file=sys.stderr)
    return 1


def _restore(args: argparse.Namespace) -> int:
    from ..backup import find_backup, restore

    repo = _open(args)
    backup_id = find_backup(repo, args.backup_id, source=args.source)
    kind = repo.read_manifest(backup_id).get("kind")
    keys: dict[str, Any]
    if kind == "sqlite":
        if not keys_given(args):
            raise BackupError(f"backup {backup_id} is of a SQLite database: give the keys to "
                              "encrypt the restored database under",
                              hint="--config CONFIG or --key-file FILE")
        keys = {"keyring": keyring_from_args(args)}
    else:
        _no_single_key(args, f"backup {backup_id} is of a database", "a new key in TARGET.key")
        keys = {"config": config_from_args(args)}
    out = restore(repo, backup_id, args.target, tables=args.table or None,
                  replace=args.force, **keys)
    rows_note = f", {out['rows']} rows" if "rows" in out else ""
    replaced = ", replacing the database there" if out.get("replaced") else ""
    print(f"restored backup {backup_id} into {out['path']}{rows_note} (checked){replaced}")
    if "key" in out:
        print(f"cryptdisk: the new key of {out['path']} is in {out['key']} (mode 0600). Back "
              "it up and keep it apart from the data: losing it loses the data.",
              file=sys.stderr)
    return 0


def _prune(args: argparse.Namespace) -> int:
    from ..backup import prune

    dropped, deleted = prune(_open(args), keep_last=args.keep_last,
                             keep_daily=args.keep_daily, keep_weekly=args.keep_weekly,
                             keep_monthly=args.keep_monthly, break_lock=args.break_lock)
    print(f"deleted {len(dropped)} backup(s) and {deleted} chunk(s)")
    return 0


def _keys(args: argparse.Namespace) -> int:
    from ..backup import Repository

    unlock = _unlock_args(args)
    repo = Repository.open(args.repo, **unlock)
    add_pass = _env(args.add_passphrase_env) if args.add_passphrase_env else None
    add_ring = _keyring(args.add_keyring, args.add_key_file, args.add_key_id)
    if add_pass is not None or add_ring is not None:
        repo.add_wrapping(passphrase=add_pass, keyring=add_ring)
    _warn_if_rotated(args, repo, unlock["keyring"])
    for line in Repository.describe_wrappings(repo.config):
        print(line)
    return 0

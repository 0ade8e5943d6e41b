"""Key commands: keygen, rewrap (key rotation without rewriting data), and the key lifecycle
(``cryptdisk keys list|add|promote|retire|destroy``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import textwrap
from typing import Any

from ..errors import CryptdiskError, KeyProviderError, KeyringError
from ..format import Algorithm
from ..keys import (
    Key,
    KeyConfig,
    Keyring,
    export_key_material,
    iter_files,
    key_usage,
    read_key_file,
    rewrap_file,
    rewrap_tree,
    write_key_file,
)
from ._args import env_name, key_id
from ._keys import KEYRING_ENV, add_key_options, keyring_from_args

__all__ = ["register"]

# what 'no [keyring] section' points at (keys/_keyring.py): the smallest config, as README's
_EXAMPLE_CONFIG = """\
a config naming the key (cryptdisk.toml; key files relative to it):

  cryptdisk keygen -o cryptdisk.key
  cat > cryptdisk.toml <<'EOF'
  [keyring]
  current_key_id = 1
  [[keyring.keys]]
  id = 1
  file = "cryptdisk.key"
  EOF

Keys from variables, commands, an HSM or a KMS: docs/keys.md."""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keygen", help="generate a key-encryption key",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Generate a random 256-bit (or 128-bit) key-encryption key. With -o, write "
            "it to a new key file (mode 0600; never overwrites) and print a config snippet "
            "naming it; without -o, print the key in hex on stdout (for a secret store or an "
            "environment variable). Keep the key apart from the data it protects: losing it "
            "loses the data.", 79),
        epilog=_EXAMPLE_CONFIG)
    p.add_argument("-o", "--output", metavar="PATH",
                   help="write a key file (mode 0600; refuses to overwrite)")
    p.add_argument("--bits", type=int, choices=[128, 256], default=256,
                   help="key size (default 256: AES-256-GCM)")
    p.add_argument("--id", type=key_id, default=1,
                   help="key id to note in the file and snippet (default 1)")
    p.add_argument("--print", action="store_true",
                   help="print the hex key even on a terminal, without the warning")
    p.set_defaults(func=cmd_keygen)

    p = sub.add_parser(
        "rewrap",
        help="rotate keys: rewrap file headers under the current key (segments untouched)",
        description="Rewrap every cryptdisk file under the given paths so that its data key is "
        "wrapped by the keyring's current key. Only the 128-byte header of each file is "
        "rewritten (one write, then fsync), so an interruption leaves each file readable with "
        "the old key or the new one; run it again to finish. Other files are listed and left "
        "alone.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files or directories")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_key_options(p)
    p.set_defaults(func=cmd_rewrap)
    _register_lifecycle(sub)


def cmd_keygen(args: argparse.Namespace) -> int:
    if args.output == "":  # an unset shell variable (-o "$KEYFILE"): never print the key
        raise KeyringError("-o names no file (an empty path); the key was not generated",
                           hint="give the key file's path, or leave -o out to print the key")
    key = Key.generate(args.id, Algorithm.AES_256_GCM if args.bits == 256 else
                       Algorithm.AES_128_GCM)
    if args.output:
        write_key_file(args.output, key)
        print(f"cryptdisk: wrote a {args.bits}-bit key (id {args.id}) to {args.output} "
              "(mode 0600). Keep it safe: losing it loses the data encrypted under it.",
              file=sys.stderr)
        print("cryptdisk: use it with --key-file, or in a config:\n"
              f"  [[keyring.keys]]\n  id = {args.id}\n  file = \"{os.path.abspath(args.output)}\"",
              file=sys.stderr)
        return 0
    if sys.stdout.isatty() and not args.print:
        print("cryptdisk: warning: printing a key to the terminal; use -o PATH to write a key "
              "file instead", file=sys.stderr)
    print(export_key_material(key).hex())
    return 0


def _sqlite_rewrap(path: str, keys: Any) -> list[tuple[str, bool]]:
    """Rewrap an encrypted SQLite database with its journal and WAL holding SQLite's lock
    (``cryptdisk.sqlite.rotate``); a cryptdisk file that SQLite does not open (not a
    database after all) with them, file by file."""
    import apsw

    from ..sqlite import rotate

    try:
        return rotate(path, keys)
    except apsw.Error:
        files = [path] + [path + s for s in ("-journal", "-wal")
                          if os.path.isfile(path + s) and os.path.getsize(path + s) > 0]
        return [(f, rewrap_file(f, keys)) for f in files]


def cmd_rewrap(args: argparse.Namespace) -> int:
    keyring = keyring_from_args(args)
    files = list(iter_files(args.paths))
    if not files:
        raise CryptdiskError("no files found under the given paths")
    show = not args.quiet and sys.stderr.isatty()
    if show:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("rewrapping", total=len(files))
            summary = rewrap_tree(files, keyring, on_file=lambda _: bar.advance(task),
                                      sqlite=_sqlite_rewrap)
    else:
        summary = rewrap_tree(files, keyring, sqlite=_sqlite_rewrap)
    current = keyring.current_key_id
    print(f"rewrapped {summary.rewrapped} file(s) under key {current}; "
          f"{summary.already_current} already under it; "
          f"{_skipped(summary.skipped_not_encrypted)}; {len(summary.failed)} failed")
    for path, reason in summary.failed:
        msg = reason if path in reason else f"{path}: {reason}"
        print(f"cryptdisk: error: {msg}", file=sys.stderr)
    _report_not_done(summary.not_done)
    return 0 if summary.ok else 1


def _report_not_done(files: list[str]) -> None:
    if files:
        print(f"cryptdisk: error: stopped at a provider fault; {len(files)} file(s) not done, "
              f"still under their old keys: {_listing(files)}. Run the same command again "
              "when the provider answers: it resumes", file=sys.stderr)


# -- cryptdisk keys list|add|promote|retire|destroy: the key lifecycle -------------------------

LIFECYCLE = """\
The key lifecycle of a config's [keyring] (see docs/keys-lifecycle.md): add a key, promote it
(current: it wraps new files; --db and PATHs are rewrapped to it, resumable), retire an
older key (refused while a file under --db or the PATHs uses it), destroy a retired key
(its key file, token object or KMIP key, then its entry). Each step rewrites the config
crash-safe (temporary file, fsync, rename). 'cryptdisk keys DB [--remove ID]' lists the keys
of a database made without a config and deletes an older key file."""

VERBS = ("list", "add", "promote", "retire", "destroy")


class _AnyVerb(dict):  # type: ignore[type-arg]
    """The verbs, as argparse's choices, accepting any word (_Verbs sorts them out)."""

    def __contains__(self, key: object) -> bool:
        return True


class _Verbs(argparse._SubParsersAction):  # type: ignore[type-arg]
    """``cryptdisk keys DB`` (no verb) keeps meaning ``cryptdisk keys list --db DB``'s older
    spelling: a database's keys, ``--remove ID`` deleting an older key file."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if values and values[0] not in self._name_parser_map:
            values = ["database", *values]
        name, rest = values[0], list(values[1:])
        sub = self._name_parser_map.get(name)
        if sub is None:  # pragma: no cover - every name maps
            super().__call__(parser, namespace, values, option_string)
            return
        setattr(namespace, self.dest, name)
        # a verb's PATHs may follow its options (promote 2 -c C DIR): parse them intermixed
        subnamespace, extras = sub.parse_known_intermixed_args(rest, None)
        for key, value in vars(subnamespace).items():
            setattr(namespace, key, value)
        if extras:
            vars(namespace).setdefault(argparse._UNRECOGNIZED_ARGS_ATTR, [])
            getattr(namespace, argparse._UNRECOGNIZED_ARGS_ATTR).extend(extras)


def _register_lifecycle(sub: Any) -> None:
    group = sub.add_parser("keys", help="key lifecycle: list, add, promote, retire, destroy",
                           description=LIFECYCLE)
    verbs = group.add_subparsers(dest="verb", metavar="{" + ",".join(VERBS) + "}",
                                 action=_Verbs)

    def scope(p: argparse.ArgumentParser) -> None:
        p.add_argument("-c", "--config", help="the cryptdisk TOML config whose [keyring] "
                       "changes (default: $CRYPTDISK_KEYRING)")
        p.add_argument("--db", metavar="PATH", help="a database written with the config: "
                       "its files are counted, checked or rewrapped")
        p.add_argument("paths", nargs="*", metavar="PATH",
                       help="files and directories written with the config (headers are read)")

    p = verbs.add_parser("list", help="the keys, their state and how many files use each",
                         description="List the config's keys: id, state (current, active, "
                         "retired), source; with --db or PATHs, how many files use each.")
    scope(p)
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=cmd_keys_list)

    p = verbs.add_parser("add", help="add a key to the config (active, not current)",
                         description="Add a [[keyring.keys]] entry. The key is loaded first "
                         "(its file read, its provider connected), so a key that cannot be "
                         "used is never written into the config.")
    p.add_argument("id", type=key_id, help="the new key's id (unused in the config)")
    p.add_argument("-c", "--config", help="the config (default: $CRYPTDISK_KEYRING)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--generate", metavar="FILE",
                     help="generate a 256-bit key into a new key file (mode 0600)")
    how.add_argument("--file", metavar="FILE", help="an existing key file")
    how.add_argument("--env", type=env_name, metavar="VAR",
                     help="an environment variable holding hex")
    how.add_argument("--source", metavar="NAME",
                     help="a provider that keeps its key (pkcs11, kmip, aws-kms); its fields "
                     "with --set")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="a field of a --source entry (repeat; TOML numbers stay numbers)")
    p.set_defaults(func=cmd_keys_add)

    p = verbs.add_parser("promote", help="make a key current and rewrap files to it",
                         description="Make the key current (current_key_id), after checking "
                         "it loads; then rewrap --db and the PATHs to it (headers only, one "
                         "write per file; run again to resume).")
    p.add_argument("id", type=int)
    scope(p)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="name each file rewrapped, and each already under the key")
    p.set_defaults(func=cmd_keys_promote)

    for verb, text in (("retire", "mark an older key retired (refused while a file uses it)"),
                       ("destroy", "destroy a retired key's material and remove its entry")):
        p = verbs.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ". "
                             "The files that could use the key are --db and the PATHs; "
                             "one of them is needed.")
        p.add_argument("id", type=int)
        scope(p)
        p.set_defaults(func=cmd_keys_retire if verb == "retire" else cmd_keys_destroy)

    p = verbs.add_parser("database", help=argparse.SUPPRESS,
                         description="A database's keys (system.keys); --remove deletes an "
                         "older key file (PATH.key.ID) of a database without a config.")
    p.add_argument("path", help="the database directory")
    p.add_argument("-c", "--config", help="cryptdisk TOML config")
    p.add_argument("--pin", nargs="?", const=True, metavar="FILE")
    p.add_argument("--remove", type=int, metavar="ID", help="delete key ID once no file uses it")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p.set_defaults(func=_cmd_database_keys)
    verbs._choices_actions = [a for a in verbs._choices_actions if a.dest != "database"]
    verbs.choices = _AnyVerb(verbs._name_parser_map)  # a database path is taken too


def _cmd_database_keys(args: argparse.Namespace) -> int:
    from .db import cmd_keys

    return cmd_keys(args)


def _config_path(args: argparse.Namespace, *, required: bool = True) -> str | None:
    path = args.config or os.environ.get(KEYRING_ENV)
    if not path and required:
        raise KeyringError("no config given", hint=f"use --config CONFIG (or set {KEYRING_ENV})")
    return path


def _open_db(args: argparse.Namespace, config: str | None) -> Any:
    from ..db import connect
    from ..errors import DatabaseError

    if not os.path.exists(os.path.join(args.db, "catalog")):
        raise DatabaseError(f"no cryptdisk database at {args.db}")
    return connect(args.db, config)


def _check_targets(args: argparse.Namespace) -> None:
    """Refuse a --db that is no database and PATHs that do not exist."""
    from ..errors import DatabaseError

    if args.db and not os.path.exists(os.path.join(args.db, "catalog")):
        raise DatabaseError(f"no cryptdisk database at {args.db}")
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        raise KeyringError(f"{', '.join(missing)}: no such file or directory")


def _usage(args: argparse.Namespace, config: str | None, key_id: int) -> list[str]:
    """The files of --db and the PATHs under ``key_id``; refuses when neither is given."""
    if not args.db and not args.paths:
        raise KeyringError(f"which files could use key {key_id}? give the database (--db "
                           "PATH) or the files and directories written with this config",
                           hint="the check reads only file headers")
    _check_targets(args)
    used: list[str] = []
    db_files: set[str] = set()
    if args.db:
        with _open_db(args, config) as db:
            used += [_db_file(args.db, f) for f in db.files_under_key(key_id)]
            db_files = _real_paths(db.local_files())
    if args.paths:
        usage = _path_usage(args.paths, db_files, config)
        used += usage.get(key_id, []) + [f"{p} ({_why_unknown(p)})" for p in usage.get(None, [])]
    return used


def _real_paths(files: list[str]) -> set[str]:
    return {os.path.realpath(f) for f in files}


def _path_usage(paths: list[str], db_files: set[str],
                config: str | None) -> dict[int | None, list[str]]:
    """:func:`key_usage` of ``paths`` without the database's files (counted from --db) that
    also lie under them: each file is counted once. ClickHouse-format files count under
    the config's keys by their key fingerprint."""
    usage = key_usage(paths, clickhouse=None if config is None else
                      KeyConfig(config).local_materials)
    if db_files:
        usage = {k: kept for k, v in usage.items()
                 if (kept := [f for f in v if os.path.realpath(f) not in db_files])}
    return usage


def _db_file(db: str, label: str) -> str:
    """A database's file for messages: its catalog by path, a part as the database names it
    (its path on its disk, table and disk)."""
    return os.path.join(db, label) if label == "catalog" else label


def _is_clickhouse_file(path: str) -> bool:
    from ..format.clickhouse import is_clickhouse_header

    try:
        with open(path, "rb") as f:
            return is_clickhouse_header(f.read(8))
    except OSError:
        return False


def _clickhouse_hint(used: list[str], config: str) -> str:
    if not any(_is_clickhouse_file(f) for f in used):
        return ""
    return ("; files in ClickHouse's format are encrypted with the key itself and cannot be "
            f"rewrapped: re-encrypt them (cryptdisk convert SRC DST --config {config} --to "
            "clickhouse --disk DISK) or keep the key")


def _why_unknown(path: str) -> str:
    if _is_clickhouse_file(path):
        return ("ClickHouse format; its key is unknown: a key of the config did not load, "
                "so it could not be compared")
    return "header unreadable"


def _skipped(files: list[str]) -> str:
    """How rewrap's summary names the files it left alone."""
    ch = sum(1 for f in files if _is_clickhouse_file(f))
    text = f"{len(files) - ch} not encrypted (left alone)"
    if ch:
        text += (f"; {ch} in ClickHouse's format (encrypted with the key itself, not "
                 "rewrappable: left under their keys; 'cryptdisk convert' re-encrypts them)")
    return text


def _listing(files: list[str], shown: int = 10) -> str:
    more = len(files) - shown
    return "; ".join(files[:shown]) + (f"; and {more} more" if more > 0 else "")


def cmd_keys_list(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from .db import format_table

    config = _config_path(args, required=not args.db)
    counts: dict[int, int] = {}
    db_files: set[str] = set()
    left = None  # what a stopped rotation of the database's key files left
    if args.db:
        with _open_db(args, config) as db:
            for row in db.sql("SELECT id, files FROM system.keys").to_pylist():
                counts[row["id"]] = counts.get(row["id"], 0) + row["files"]
            db_files = _real_paths(db.local_files())
            if config is None:  # a database's own key files
                ids, current = db.keyring.ids, db.keyring.current_key_id
                rows = [(i, "current" if i == current else "active", "file",
                         db.key_file(i) or "") for i in ids]
                left = db.unfinished_rotation()
    if args.paths:  # the database's files under them are counted above, once
        usage = _path_usage(args.paths, db_files, config)
        for path in usage.pop(None, []):
            print(f"cryptdisk: warning: {path}: {_why_unknown(path)}; not counted",
                  file=sys.stderr)
        for key_id, files in usage.items():
            if key_id is not None:
                counts[key_id] = counts.get(key_id, 0) + len(files)
    unknown_sources: list[str] = []
    if config is not None:
        listed = KeyConfig(config)
        rows = [(s.key_id, s.state, s.source, s.where) for s in listed.states()]
        unknown_sources = listed.unknown_sources()
    table = {"id": [r[0] for r in rows], "state": [r[1] for r in rows],
             "source": [r[2] for r in rows], "where": [r[3] for r in rows]}
    if args.db or args.paths:
        table["files"] = [counts.get(r[0], 0) for r in rows]
    print(format_table(pa.table(table), args.format))
    if left is not None:
        print(f"cryptdisk: warning: {left[0]}", file=sys.stderr)
        if left[1]:
            print(f"cryptdisk: hint: {left[1]}", file=sys.stderr)
    for problem in unknown_sources:  # as loading the config would refuse it
        print(f"cryptdisk: error: {config}: {problem}", file=sys.stderr)
    unknown = sorted(set(counts) - {r[0] for r in rows})
    if unknown:
        print(f"cryptdisk: error: files are under key(s) {', '.join(map(str, unknown))}, which "
              "the config does not have", file=sys.stderr)
        return 1
    return 1 if unknown_sources else 0


def _field(text: str) -> tuple[str, Any]:
    import tomllib

    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise KeyringError(f"--set {text!r}: write FIELD=VALUE")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return name.strip(), value


def cmd_keys_add(args: argparse.Namespace) -> int:
    config = _config_path(args)
    assert config is not None
    keys = KeyConfig(config)
    if args.set and not args.source:
        raise KeyringError("--set gives the fields of a --source entry")
    entry: dict[str, Any] = {"id": args.id}
    made = None
    if args.generate:
        made = os.path.abspath(args.generate)
        entry["file"] = _relative(made, keys.base)
    elif args.file:
        entry["file"] = _relative(os.path.abspath(args.file), keys.base)
    elif args.env:
        entry["from_env"] = args.env
    else:
        entry["source"] = args.source
        for item in args.set:
            name, value = _field(item)
            if name in ("id", "source"):
                raise KeyringError(f"--set {name}: give it as the command's argument")
            entry[name] = value
    if keys.has_entry(entry):  # a rerun after the config was written
        print(f"key {args.id} is already in {config} as given")
        return 0
    if made is not None:
        if keys.has(args.id):
            raise KeyringError(f"{config}: [keyring] already has a key with id {args.id}")
        if not os.path.isdir(os.path.dirname(made)):
            raise KeyringError(f"cannot write the key file {args.generate}: the directory "
                               f"{os.path.dirname(made)} does not exist",
                               hint="create it first (mkdir -m 700 DIR): key files are "
                               "private")
        if _generate_key_file(made, args.id):
            print(f"cryptdisk: {made} holds key {args.id} from an add that was interrupted; "
                  "adding it", file=sys.stderr)
    keys.add(entry)
    print(f"added key {args.id} to {config} (active; 'cryptdisk keys promote {args.id}' makes "
          "it current)")
    return 0


def _generate_key_file(path: str, key_id: int) -> bool:
    """A new key file at ``path``, crash-safe; True when an interrupted add had made it.

    The key is written to ``.NAME.cryptdisk-new`` beside it, synced, then linked to
    ``path`` (never replacing a file) and the directory synced, so ``path`` is a whole
    key file or absent. An existing ``path`` is taken only if it is a key file noting
    this id (what a killed add leaves); anything else is refused.
    """
    if os.path.exists(path):
        try:
            _, noted = read_key_file(path)
        except CryptdiskError:
            noted = None
        if noted != key_id:
            raise KeyringError(f"{path} already exists; refusing to overwrite it",
                               hint="choose another path, or add an existing key file "
                               "with --file")
        return True
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.cryptdisk-new")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by a killed add
    write_key_file(tmp, Key.generate(key_id))
    os.link(tmp, path)
    os.unlink(tmp)
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return False


def _relative(path: str, base: str) -> str:
    rel = os.path.relpath(path, base)
    return path if rel.startswith("..") else rel


def cmd_keys_promote(args: argparse.Namespace) -> int:
    config = _config_path(args)
    assert config is not None
    keys = KeyConfig(config)
    _check_targets(args)  # a typo in --db or a PATH: refused before the config changes
    changed = keys.promote(args.id)
    print(f"key {args.id} is the current key of {config}" + ("" if changed else " (already)"))
    code = 0
    done = 0

    def on_file(path: str) -> None:
        nonlocal done
        done += 1

    def on_result(path: str, rewrapped: bool) -> None:
        if args.verbose:
            what = "rewrapped" if rewrapped else f"already under key {args.id}"
            print(f"{what}: {path}", flush=True)

    def not_started(what: str, exc: KeyProviderError) -> None:
        print(f"cryptdisk: error: {exc}", file=sys.stderr)
        print(f"cryptdisk: error: no file {what} was rewrapped; key {args.id} is current in "
              f"{config}: run the same command again once its keys load",
              file=sys.stderr)

    if args.db:
        try:
            opened = _open_db(args, config)
        except KeyProviderError as exc:  # the keyring did not load: nothing done yet
            not_started(f"of {args.db}", exc)
            opened, code = None, 1
    if args.db and opened is not None:
        with opened as db:
            try:
                n = db.rotate_keys(on_file, on_result=on_result)
            except KeyProviderError as exc:
                left = [_db_file(args.db, f) for k in db.keyring.ids if k != args.id
                        for f in db.files_under_key(k)]
                print(f"cryptdisk: error: the rewrap of {args.db} stopped after {done} file(s): "
                      f"{exc}", file=sys.stderr)
                _report_not_done(left)
                code = 1
            else:
                print(f"rewrapped {n} file(s) of {args.db} under key {args.id}; all its files "
                      f"are under key {args.id}")
    if args.paths:
        try:
            keyring = Keyring.from_config(config)
        except KeyProviderError as exc:  # the keyring did not load: nothing done yet
            not_started(f"under {', '.join(args.paths)}", exc)
            return 1
        try:
            summary = rewrap_tree(args.paths, keyring, on_file=on_file, on_result=on_result,
                                  sqlite=_sqlite_rewrap)
        finally:
            keyring.close()
        print(f"rewrapped {summary.rewrapped} file(s) under key {args.id}; "
              f"{summary.already_current} already under it; "
              f"{_skipped(summary.skipped_not_encrypted)}; {len(summary.failed)} failed; "
              f"{len(summary.not_done)} not done")
        for path, reason in summary.failed:
            msg = reason if path in reason else f"{path}: {reason}"
            print(f"cryptdisk: error: {msg}", file=sys.stderr)
        _report_not_done(summary.not_done)
        code = code or (0 if summary.ok else 1)
    if not args.db and not args.paths:
        print("files written before stay under their keys until rewrapped: give --db or "
              f"PATHs to 'cryptdisk keys promote {args.id}'")
    return code


def cmd_keys_retire(args: argparse.Namespace) -> int:
    config = _config_path(args)
    assert config is not None
    keys = KeyConfig(config)
    if keys.state(args.id) == "current":
        keys.retire(args.id)  # raises: the current key
    used = _usage(args, config, args.id)
    if used:
        hint = (f"rewrap them first: cryptdisk keys promote {keys.current_key_id} --config "
                f"{config} with --db or PATHs") + _clickhouse_hint(used, config)
        raise KeyringError(f"key {args.id} is still used by {len(used)} file(s): "
                           f"{_listing(used)}", hint=hint)
    changed = keys.retire(args.id)
    print(f"key {args.id} is retired in {config}" + ("" if changed else " (already)") +
          "; no file of the given database or paths uses it")
    return 0


def cmd_keys_destroy(args: argparse.Namespace) -> int:
    config = _config_path(args, required=not args.db)
    if config is None:  # a database without a config: its older key files
        with _open_db(args, None) as db:
            path = db.remove_key(args.id)
        print(f"destroyed key {args.id} of {args.db}: deleted {path}; no file used it")
        return 0
    keys = KeyConfig(config)
    if not keys.has(args.id):
        # a destroy removes the entry last, after the material: nothing is left to do
        print(f"key {args.id} has no entry in {config}: nothing to destroy (already destroyed, "
              "or never there)")
        return 0
    if keys.state(args.id) != "retired":
        keys.destroy(args.id)  # raises: retire first
    used = _usage(args, config, args.id)
    if used:
        raise KeyringError(f"key {args.id} is still used by {len(used)} file(s); destroying "
                           f"it would lose them: {_listing(used)}",
                           hint="those files were written or restored after the key was "
                           "retired; rewrap them to the current key first"
                           + _clickhouse_hint(used, config))
    for line in keys.destroy(args.id):
        print(line)
    print(f"destroyed key {args.id}")
    return 0

"""``cryptdisk sql``, ``rotate``, ``reencrypt``: the embedded database (``cryptdisk keys DB``,
a database's keys, is registered by :mod:`cryptdisk.cli.keys`)."""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import decimal
import json
import os
import sys
import uuid
from typing import Any

__all__ = ["format_table", "register"]

PROMPT, MORE = "cryptdisk> ", "        -> "


def _open(args: argparse.Namespace, read_only: bool = False) -> Any:
    """Open the database at ``args.path``; a new one only with ``--create`` (a mistyped
    path is an error, not a new empty database with a new key beside it)."""
    from .. import fields  # noqa: F401  (encrypt, fpe_encrypt, mask_*... in cryptdisk sql)
    from ..db import connect, is_url
    from ..errors import DatabaseError

    create = getattr(args, "create", False)
    if create and read_only:
        raise DatabaseError("--create makes a database, which --read-only does not",
                            hint="drop one of them")
    creating = not is_url(args.path) and not os.path.exists(
        os.path.join(args.path, "catalog"))
    if creating and not create:
        if os.path.isfile(args.path):
            raise DatabaseError(f"no cryptdisk database at {args.path}: it is a file, not a "
                                "database directory", hint="check the path")
        hint = "check the path"
        if not read_only:
            hint += (f"; --create makes a new database there (its key in {args.path}.key, "
                     "or the config's keys with -c)")
        raise DatabaseError(f"no cryptdisk database at {args.path}", hint=hint)
    db = connect(args.path, args.config, read_only=read_only, pin=args.pin)
    if creating:
        print(f"cryptdisk: created a new database in {db.path}", file=sys.stderr)
    return db


def _plain(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (decimal.Decimal, _dt.date, _dt.datetime, _dt.time, _dt.timedelta,
                          uuid.UUID)):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return value


def _json_value(value: Any, typ: Any) -> Any:
    """A value of Arrow type ``typ`` as JSON has it: a LIST an array, a STRUCT an object,
    a MAP an object (its keys as text, as DuckDB's ``to_json`` writes them)."""
    import pyarrow as pa

    if value is None or isinstance(value, bool):
        return value
    if typ is None:  # DuckDB's Python value (a MAP or STRUCT a dict, a LIST or ARRAY a list)
        if isinstance(value, dict):
            return {_json_key(k, None): _json_value(v, None) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_json_value(v, None) for v in value]
        return _plain(value)
    if pa.types.is_map(typ):
        return {_json_key(k, typ.key_type): _json_value(v, typ.item_type) for k, v in value}
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or \
            pa.types.is_fixed_size_list(typ):
        return [_json_value(v, typ.value_type) for v in value]
    if pa.types.is_struct(typ):
        return {f.name: _json_value(value.get(f.name), f.type) for f in typ}
    return _plain(value)


def _json_key(key: Any, typ: Any) -> str:
    value = _json_value(key, typ)
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _nested(typ: Any, value: Any = None) -> bool:
    """Whether a value of Arrow type ``typ`` is nested (with no type, whether ``value``,
    DuckDB's Python value, is a list, tuple or dict)."""
    if typ is None:
        return isinstance(value, (list, tuple, dict))
    import pyarrow as pa

    return bool(pa.types.is_nested(typ))


def format_table(table: Any, fmt: str = "table") -> str:
    """Render an Arrow table, or a statement's rows as ``Database._fetch`` gives them
    (DuckDB's Python values), as aligned text, CSV or JSON (one object per row, in a
    list). A nested value (LIST, STRUCT, MAP) is JSON: in CSV and text, its JSON text."""
    from ..db import Rows, python_rows

    if isinstance(table, Rows):
        names, records = list(table.names), table.rows
        types: list[Any] = [None] * len(names)  # (from the values: see _json_value)
    else:
        names = list(table.column_names)
        records = python_rows(table)
        types = [f.type for f in table.schema]
    if fmt == "json":  # JSON has its own true/false
        return json.dumps([{n: _json_value(v, t)
                            for n, v, t in zip(names, r, types, strict=True)}
                           for r in records], default=str)
    rows = [[_plain(v) if v is None or not _nested(t, v)
             else json.dumps(_json_value(v, t), default=str, ensure_ascii=False)
             for v, t in zip(r, types, strict=True)] for r in records]
    if fmt == "csv":
        import io

        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(names)
        writer.writerows(["" if v is None else v for v in r] for r in rows)
        return buf.getvalue().rstrip("\n")
    cells = [names] + [["NULL" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(names))]
    line = "-+-".join("-" * w for w in widths)
    out = [" | ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)), line]
    for r in cells[1:]:
        out.append(" | ".join(c.rjust(w) if _numeric(c) else c.ljust(w)
                              for c, w in zip(r, widths, strict=True)))
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _run_and_print(db: Any, sql: str, fmt: str) -> None:
    from ..db import split_statements

    for statement in split_statements(sql):
        result = db._fetch(statement)  # (DuckDB's values: BIT '0101', not its bytes)
        if result is not None:
            print(format_table(result, fmt))


SHELL_HELP = """\
Statements end with ';' and may span lines. Shell commands (no ';'):
  .help            this text
  .tables          the tables: storage policy, encrypted or not, rows
  .quit, .exit     leave the shell (so does Ctrl-D)
System tables: system.disks, system.storage_policies, system.tables, system.columns,
system.parts, system.keys. Ctrl-C drops the statement being typed."""


def _dot_command(db: Any, command: str, fmt: str) -> bool:
    """Run a shell command (``.help``, ``.tables``, ``.quit``); False means quit."""
    name = command.split()[0].lower()
    if name in (".quit", ".exit", ".q"):
        return False
    if name == ".help":
        print(SHELL_HELP)
    elif name == ".tables":
        print(format_table(db.sql("SELECT name, storage_policy, is_encrypted, rows "
                                  "FROM system.tables ORDER BY name"), fmt))
    else:
        print(f"error: unknown command {name} (try .help)", file=sys.stderr)
    return True


def _shell(db: Any, fmt: str, history: str | None) -> int:
    """A prompt with readline editing and in-session history; saved only to ``history``.

    Statements can hold data (``INSERT ... VALUES``), so nothing is written to
    disk unless the user names a history file.
    """
    import readline

    if history:
        try:
            readline.read_history_file(history)
        except OSError:
            pass
    print(f"cryptdisk sql on {db.path}: end statements with ';', .help for help, "
          ".quit or Ctrl-D to leave")
    from ..errors import CryptdiskError

    buf: list[str] = []
    try:
        while True:
            try:
                line = input(MORE if buf else PROMPT)
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                print()
                buf = []
                continue
            if not buf and line.strip().startswith("."):
                try:
                    if not _dot_command(db, line.strip(), fmt):
                        return 0
                except CryptdiskError as exc:
                    print(f"error: {exc}", file=sys.stderr)
                continue
            buf.append(line)
            text = "\n".join(buf).strip()
            if not text:
                buf = []
            elif text.endswith(";") or text.lower() in ("quit", "exit", r"\q"):
                buf = []
                if text.lower() in ("quit", "exit", r"\q"):
                    return 0
                try:
                    _run_and_print(db, text, fmt)
                except CryptdiskError as exc:
                    print(f"error: {exc}", file=sys.stderr)
    finally:
        if history:
            try:
                readline.write_history_file(history)
                os.chmod(history, 0o600)
            except OSError:
                pass


def cmd_sql(args: argparse.Namespace) -> int:
    with _open(args, read_only=args.read_only) as db:
        if args.query is not None:
            _run_and_print(db, args.query, args.format)
            return 0
        if not sys.stdin.isatty():
            _run_and_print(db, sys.stdin.read(), args.format)
            return 0
        return _shell(db, args.format, args.history)


def _existing(args: argparse.Namespace) -> Any:
    """Open a database that must already exist (rotation and re-encryption never create
    one)."""
    if not os.path.exists(os.path.join(args.path, "catalog")):
        from ..errors import DatabaseError

        hint = None
        if os.path.isfile(args.path):  # an encrypted SQLite database, or one encrypted file
            hint = (f"{args.path} is a file, not a database directory: 'cryptdisk sqlite "
                    "rotate' rewraps an encrypted SQLite database, and VACUUM INTO a new file "
                    "gives it new data keys (docs/sqlite.md); 'cryptdisk rewrap' rewraps a file")
        raise DatabaseError(f"no cryptdisk database at {args.path}", hint=hint)
    return _open(args)


def _new_key(args: argparse.Namespace, db: Any) -> Any:
    from ..errors import DatabaseError
    from ..keys import Key, read_key_file

    if args.config:
        raise DatabaseError("--new-key is for a database without a config (its keys are "
                            "its key files)", hint="with --config, add the new key to the "
                            "config's [keyring] and make it current_key_id")
    material, noted = read_key_file(args.new_key)
    key_id = noted if noted is not None else max(db.keyring.ids) + 1
    return Key(key_id, material, source="file")


def _older_keys(db: Any) -> None:
    for key_id in db.keyring.ids:
        path = db.key_file(key_id)
        if key_id == db.keyring.current_key_id or path is None:
            continue
        print(f"key {key_id} is kept in {path} for backups made before; 0 files of the "
              f"database use it. Remove it when none needs it: "
              f"cryptdisk keys {db.path} --remove {key_id}")


def cmd_rotate(args: argparse.Namespace) -> int:
    with _existing(args) as db:
        new_key = _new_key(args, db) if args.new_key else None
        def on_result(path: str, rewrapped: bool) -> None:
            if args.verbose:
                what = "rewrapped" if rewrapped else \
                    f"already under key {db.keyring.current_key_id}"
                print(f"{what}: {path}", flush=True)

        before = db.keyring.current_key_id
        n = db.rotate_keys(new_key=new_key, on_result=on_result)
        files = 1 + sum(len(t.parts) for t in db.catalog.tables.values())
        beside = len(db.sidecar_files())
        key = db.keyring.current_key_id
        if new_key is None and key != before:
            print(f"finished an interrupted rotation: key {key}, which it had recorded in "
                  f"{db.path}.key.pending, is the current key of {db.path}")
        print(f"rewrapped {n} file(s) of {db.path} under key {key}; checked from their "
              f"headers: all {files} file(s) the catalog names"
              + (f" and the {beside} beside it (pins, server files)" if beside else "")
              + f" are under key {key}")
        _older_keys(db)
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    with _existing(args) as db:
        if args.remove is not None:
            path = db.remove_key(args.remove)
            print(f"removed key {args.remove} of {db.path} ({path}); no file used it")
        table = db.sql("SELECT id, algorithm, source, is_current, files FROM system.keys "
                       "ORDER BY id")
        print(format_table(table, args.format))
        unfinished_rotation(db)
    return 0


def unfinished_rotation(db: Any) -> None:
    """Say on stderr (stdout keeps the listing alone) what a stopped rotation to a new key
    left beside the database's key files, and the command that finishes it."""
    left = db.unfinished_rotation()
    if left is not None:
        print(f"cryptdisk: warning: {left[0]}", file=sys.stderr)
        if left[1]:
            print(f"cryptdisk: hint: {left[1]}", file=sys.stderr)


def cmd_reencrypt(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import Progress

    # The bar goes to stderr, and only on a terminal: stdout holds the summary alone.
    console = Console(stderr=True)
    with _existing(args) as db, Progress(transient=True, console=console,
                                         disable=not console.is_terminal) as bar:
        task = bar.add_task("re-encrypting tables", total=len(db.catalog.tables))
        db.reencrypt(on_table=lambda _name: bar.advance(task))
        tables = len(db.catalog.tables)
    print(f"re-encrypted {tables} table(s) of {args.path} under new data keys "
          f"(key {db.keyring.current_key_id})")
    return 0


def register(sub: Any) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("path", help="the database directory")
        p.add_argument("-c", "--config", help="cryptdisk TOML config (keys, disks, policies); "
                       "default: encrypt everything with the key in PATH.key")
        p.add_argument("--pin", nargs="?", const=True, metavar="FILE",
                       help="record the catalog's version after every commit in FILE "
                       "(default PATH.pin), outside the directory, and refuse a database "
                       "rolled back behind it; pass it on every use")

    p = sub.add_parser("sql", help="query an embedded database (shell, or -q QUERY)",
                       description="Run SQL on an embedded cryptdisk database: DuckDB's SQL "
                       "plus CREATE TABLE ... SETTINGS storage_policy, OPTIMIZE TABLE, "
                       "system.* tables.")
    common(p)
    p.add_argument("-q", "--query", help="statements to run (';'-separated); "
                   "without it: a shell on a terminal, else statements from stdin")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="json: a list of one object per row; a LIST, STRUCT or MAP value "
                   "is JSON there, and its JSON text in a csv or table cell")
    p.add_argument("--history", metavar="FILE",
                   help="keep the shell's history in FILE (mode 0600); statements may hold "
                   "data in plaintext, so by default history lasts for the session only")
    p.add_argument("--read-only", action="store_true",
                   help="open without the write lock (alongside a writer)")
    p.add_argument("--create", action="store_true",
                   help="make a new database at PATH if it has none (PATH must not exist, or "
                   "be an empty directory); without it a path with no database is an error")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("rotate", help="rewrap every file of a database under the current key",
                       description="Rewrap parts and catalog under the current key (headers "
                       "only; crash-safe, rerun to resume), then check every header. Without "
                       "a config, --new-key makes a key file the database's current key "
                       "first (PATH.key), keeping the old one as PATH.key.ID; a rerun "
                       "without it finishes a rotation whose new key was recorded "
                       "(PATH.key.pending), and one stopped before that is rerun with the "
                       "same --new-key.")
    common(p)
    p.add_argument("--new-key", metavar="FILE",
                   help="key file (cryptdisk keygen -o FILE --id N) to rotate to; for a "
                   "database without a config")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="name each file rewrapped, and each already under the current key")
    p.set_defaults(func=cmd_rotate)

    p = sub.add_parser("reencrypt", help="rewrite a database's data under new data keys",
                       description="Merge and re-encrypt every table under new data keys and "
                       "the current key, then rewrap what remains.")
    common(p)
    p.set_defaults(func=cmd_reencrypt)

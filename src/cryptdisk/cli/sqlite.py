"""``cryptdisk sqlite``: encrypt, decrypt and rotate the keys of SQLite databases."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..errors import DatabaseError, MissingEnvironmentVariableError
from ._args import env_name
from ._keys import add_key_options, keyring_from_args

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "sqlite", help="encrypted SQLite databases: encrypt, decrypt, rotate",
        description="Convert SQLite databases to cryptdisk's encrypted SQLite and back, and "
        "rotate their keys. Open them from Python with cryptdisk.sqlite.connect().",
    )
    sub = parser.add_subparsers(dest="sqlite_command", metavar="ACTION", required=True)

    enc = sub.add_parser("encrypt", help="copy a plain (or SQLCipher) database to an "
                         "encrypted one", description="Copy SRC, a plain SQLite database "
                         "(or a SQLCipher one), to a new encrypted database DST. Uses SQLite's "
                         "backup API, so SRC may be in use.")
    enc.add_argument("src", metavar="SRC")
    enc.add_argument("dst", metavar="DST")
    enc.add_argument("--sqlcipher-passphrase-env", type=env_name, metavar="VAR",
                     help="SRC is a SQLCipher database; its passphrase is in this variable")
    add_key_options(enc)
    enc.set_defaults(func=_encrypt)

    dec = sub.add_parser("decrypt", help="copy an encrypted database to a plain one",
                         description="Copy the encrypted database SRC to a new plain SQLite "
                         "database DST (plaintext on disk: mind where DST lives).")
    dec.add_argument("src", metavar="SRC")
    dec.add_argument("dst", metavar="DST")
    add_key_options(dec)
    dec.set_defaults(func=_decrypt)

    rot = sub.add_parser("rotate", help="rewrap a database's headers under the current key",
                         description="Rewrap the data keys of PATH and of its journal and WAL "
                         "under the keyring's current key. Pages are not rewritten. Safe while "
                         "the database is in use (the data keys do not change), as long as "
                         "every process using it has the new key in its keyring.")
    rot.add_argument("path", metavar="PATH")
    add_key_options(rot)
    rot.set_defaults(func=_rotate)


@contextmanager
def _progress(label: str) -> Iterator[Callable[[int, int], None]]:
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _encrypt(args: argparse.Namespace) -> int:
    from ..sqlite import encrypt_database, encrypt_sqlcipher_database

    keyring = keyring_from_args(args)
    with _progress("encrypting") as progress:
        if args.sqlcipher_passphrase_env:
            passphrase = os.environ.get(args.sqlcipher_passphrase_env)
            if not passphrase:
                raise MissingEnvironmentVariableError(
                    f"environment variable {args.sqlcipher_passphrase_env} is not set or empty; "
                    "it should hold the SQLCipher passphrase",
                    variable=args.sqlcipher_passphrase_env,
                )
            encrypt_sqlcipher_database(args.src, args.dst, keyring, passphrase, progress)
        else:
            encrypt_database(args.src, args.dst, keyring, progress)
    return 0


def _decrypt(args: argparse.Namespace) -> int:
    from ..sqlite import decrypt_database

    keyring = keyring_from_args(args)
    with _progress("decrypting") as progress:
        decrypt_database(args.src, args.dst, keyring, progress)
    return 0


def _rotate(args: argparse.Namespace) -> int:
    from ..sqlite import rotate

    keyring = keyring_from_args(args)
    if not os.path.isfile(args.path):
        raise DatabaseError(f"{args.path}: no such database file")
    for name, rewrapped in rotate(args.path, keyring):
        state = "rewrapped" if rewrapped else "already under the current key"
        print(f"{name}: {state} (key {keyring.current_key_id})")
    return 0

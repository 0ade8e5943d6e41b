"""Key commands: keygen and rewrap (key rotation without rewriting data)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..errors import CryptdiskError
from ..format import Algorithm
from ..keys import Key, export_key_material, iter_files, rewrap_tree, write_key_file
from ._keys import add_key_options, keyring_from_args

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "keygen", help="generate a key-encryption key",
        description="Generate a random 256-bit (or 128-bit) key-encryption key. With -o, write "
        "it to a new key file (mode 0600; never overwrites) and print a config snippet naming "
        "it; without -o, print the key in hex on stdout (for a secret store or an environment "
        "variable). Keep the key apart from the data it protects: losing it loses the data.")
    p.add_argument("-o", "--output", metavar="PATH",
                   help="write a key file (mode 0600; refuses to overwrite)")
    p.add_argument("--bits", type=int, choices=[128, 256], default=256,
                   help="key size (default 256: AES-256-GCM)")
    p.add_argument("--id", type=int, default=1,
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


def cmd_keygen(args: argparse.Namespace) -> int:
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
            summary = rewrap_tree(files, keyring, on_file=lambda _: bar.advance(task))
    else:
        summary = rewrap_tree(files, keyring)
    current = keyring.current_key_id
    print(f"rewrapped {summary.rewrapped} file(s) under key {current}; "
          f"{summary.already_current} already under it; "
          f"{len(summary.skipped_not_encrypted)} not encrypted (left alone); "
          f"{len(summary.failed)} failed")
    for path, reason in summary.failed:
        msg = reason if path in reason else f"{path}: {reason}"
        print(f"cryptdisk: error: {msg}", file=sys.stderr)
    return 0 if summary.ok else 1

"""Argument parsing, dispatch and error reporting for the ``cryptdisk`` command."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import CryptdiskError

# One module per command group, each with ``register(subparsers)``.
COMMAND_MODULES: list[str] = [
    "cryptdisk.cli.demo",
    "cryptdisk.cli.keys",
    "cryptdisk.cli.files",
    "cryptdisk.cli.disks",
    "cryptdisk.cli.db",
    "cryptdisk.cli.bench",
    "cryptdisk.cli.sqlite",
    "cryptdisk.cli.serve",
]

PROG = "cryptdisk"


def error(message: str, hint: str | None = None) -> None:
    """Print ``cryptdisk: error: ...`` (and a hint) on stderr, as age does."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    if hint:
        print(f"{PROG}: hint: {hint}", file=sys.stderr)


def warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Transparent, authenticated encryption at rest for analytical and "
        "transactional data.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    parser.add_argument("--traceback", action="store_true",
                        help="show a Python traceback on errors (for bug reports)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # an optional dependency is missing
            sub.add_parser(name.rsplit(".", 1)[-1],
                           help=f"(unavailable: {exc.name or exc} is not installed)")
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code = func(args)
    except CryptdiskError as exc:
        if args.traceback or os.environ.get("CRYPTDISK_TRACEBACK"):
            raise
        error(str(exc), exc.hint)
        return 1
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except BrokenPipeError:
        # The reader of our stdout went away (e.g. `cryptdisk cat f | head`).
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 1
    except OSError as exc:
        if args.traceback or os.environ.get("CRYPTDISK_TRACEBACK"):
            raise
        error(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
        return 1
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

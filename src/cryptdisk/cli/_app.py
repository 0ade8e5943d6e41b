"""Argument parsing, dispatch and error reporting for the ``cryptdisk`` command."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

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
    "cryptdisk.cli.backup",
    "cryptdisk.cli.serve",
    "cryptdisk.cli.protect",
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


def _parser_of(parser: argparse.ArgumentParser,
               argv: Sequence[str]) -> argparse.ArgumentParser:
    """The deepest (sub)command parser that ``argv`` names (``keys list`` in ``keys list
    -c C x``)."""
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and word in subs[0].choices:
            parser = subs[0].choices[word]
    return parser


def _broken_pipe() -> int:
    """The reader of our stdout went away (``cryptdisk cat f | head``): end as ``cat`` does.

    Quietly, by SIGPIPE, so the shell sees what it sees for ``cat`` (status 141)
    and nothing is printed; the output left unwritten is nobody's anymore.
    """
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # A signal mask is inherited across exec: a parent that blocked SIGPIPE in the thread
    # that started us would leave the signal pending and the process running.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGPIPE})
    # To this thread, so it arrives before the next line (a signal to the process may be
    # taken by another thread while this one goes on to exit with a status).
    signal.pthread_kill(threading.get_ident(), signal.SIGPIPE)
    return 128 + signal.SIGPIPE  # where a signal cannot end the process


def _warn_exposed_configs(args: argparse.Namespace) -> None:
    """Warn when the command's config holds keys inline and group or others may read it
    (said as the command ends, after its own output and errors)."""
    names = [n for n in ("keyring", "config") if hasattr(args, n)]
    paths = {v for n in names if isinstance(v := getattr(args, n), str) and v}
    if names and not paths and os.environ.get("CRYPTDISK_KEYRING"):
        paths = {os.environ["CRYPTDISK_KEYRING"]}
    if not paths:
        return
    from ..keys import config_exposure

    for path in sorted(paths):
        said = config_exposure(path)
        if said:
            print(f"cryptdisk: warning: {said}", file=sys.stderr)
            print(f"cryptdisk: hint: chmod 600 {path}, or keep the keys in key files "
                  "(file = ...) or variables (from_env = ...)", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``cryptdisk`` command (``argv`` defaults to the program's arguments).

    Run as the program (no ``argv``: the ``cryptdisk`` script, ``python -m cryptdisk``),
    it first makes the process non-dumpable (:func:`cryptdisk.keys.protect_process`):
    its commands hold keys. A caller passing ``argv`` keeps its own process as it is."""
    if argv is None:
        from ..keys import protect_process

        protect_process()
        _terminate_cleanly()
        _raise_open_files_limit()
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # the usage of the (sub)command they were given to, not the top level's
        _parser_of(parser, sys.argv[1:] if argv is None else list(argv)).error(
            f"unrecognized arguments: {' '.join(extras)}")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return _run(func, args)
    finally:
        # after the command's own output and errors: the warning is about the setup
        _warn_exposed_configs(args)


#: The soft limit of open files the command raises its own to, at most (see below).
OPEN_FILES = 65536


def _raise_open_files_limit() -> None:
    """Raise the process's soft limit of open files (``ulimit -n``, often 1024) towards its
    hard limit, up to :data:`OPEN_FILES`, as ClickHouse's server does at start: a server's
    clients and a table of many parts each hold descriptors, and only the process itself
    knows it uses none with ``select()`` (which the low soft limit protects). Capped: a
    child process inherits it, and some loop over every possible descriptor. The library
    (``cryptdisk.connect``) leaves its host process's limit alone."""
    import resource

    with contextlib.suppress(ValueError, OSError):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Terminated(BaseException):
    """Raised in the main thread by a SIGTERM (:func:`_terminate_cleanly`); a
    ``BaseException`` so that no ``except Exception`` (nor a shell's Ctrl-C handling)
    takes it for an error to go on from."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def _terminate_cleanly() -> None:
    """Make a SIGTERM (``kill``, ``systemctl stop``, ``docker stop``) end the command as
    an error does: the statement running stops at its next step, its temporaries are
    deleted, the database's lock and connections are closed (Python's default action
    ends the process at once, leaving its temporaries to the next writer). A process
    that ignores SIGTERM, or handles it itself (``cryptdisk serve`` drains), keeps that."""
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL):
        signal.signal(signal.SIGTERM, _on_sigterm)


def _run(func: Any, args: argparse.Namespace) -> int:
    try:
        code = func(args)
    except Terminated:
        error("terminated (SIGTERM)")
        return 128 + signal.SIGTERM
    except CryptdiskError as exc:
        if args.traceback or os.environ.get("CRYPTDISK_TRACEBACK"):
            raise
        error(str(exc), exc.hint)
        return 1
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except BrokenPipeError:
        return _broken_pipe()
    except OSError as exc:
        if args.traceback or os.environ.get("CRYPTDISK_TRACEBACK"):
            raise
        error(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
        return 1
    except Exception as exc:  # a bug: still one line (no key material is in any message)
        if args.traceback or os.environ.get("CRYPTDISK_TRACEBACK"):
            raise
        error(f"internal error: {type(exc).__name__}: {exc}",
              "this is a bug in cryptdisk: rerun with --traceback and report what it prints")
        return 1
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

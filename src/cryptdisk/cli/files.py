"""File commands: encrypt, decrypt, cat, inspect, verify."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from typing import IO, Any, Protocol

from .._sqlitefiles import JOURNAL_MAGIC, journal_holds_rollback
from ..errors import CryptdiskError, ImmutableFileError, NotEncryptedError
from ..format import (
    DEFAULT_SEGMENT_SIZE,
    HEADER_SIZE,
    LOG_TAIL_SUFFIX,
    Header,
    Kind,
    SealedWriter,
    iter_sealed_stream,
    new_header,
    open_file,
    open_header,
    read_header,
    remove_tail,
)
from ._args import segment_size
from ._keys import add_key_options, config_from_args, keyring_from_args

__all__ = ["register"]

CHUNK = 1 << 20


def register(sub: Any) -> None:
    p = sub.add_parser("encrypt", help="encrypt a file (or stdin) into cryptdisk's sealed format")
    p.add_argument("input", help="plaintext file, or - for stdin")
    p.add_argument("output", help="encrypted file, or - for stdout")
    p.add_argument("--segment-size", type=segment_size, default=DEFAULT_SEGMENT_SIZE,
                   help="plaintext bytes per segment, a power of two (default 65536)")
    p.add_argument("--algorithm", choices=["aes-256-gcm", "aes-128-gcm"],
                   help="data cipher (default: the current key's)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing OUTPUT (OUTPUT = INPUT encrypts in place), or "
                   "write ciphertext to a terminal")
    add_key_options(p)
    p.set_defaults(func=cmd_encrypt)

    p = sub.add_parser("decrypt", help="decrypt a file after authenticating it")
    p.add_argument("input", help="encrypted file, or - for stdin")
    p.add_argument("output", help="plaintext file, or - for stdout")
    p.add_argument("--force", action="store_true",
                   help="replace an existing OUTPUT (OUTPUT = INPUT decrypts in place), or "
                   "write binary output to a terminal")
    add_key_options(p)
    p.set_defaults(func=cmd_decrypt)

    p = sub.add_parser("cat", help="decrypt a file to stdout")
    p.add_argument("file", help="encrypted file, or - for stdin")
    p.add_argument("--force", action="store_true", help="write binary output even to a terminal")
    add_key_options(p)
    p.set_defaults(func=cmd_cat)

    p = sub.add_parser(
        "inspect", help="show a file's header (never key material; needs no key)",
        description="Show what an encrypted file's header says: format (cryptdisk or "
        "ClickHouse ENC), version, kind, algorithm, key id or fingerprint, segment size, and "
        "the plaintext size the file's length implies. Needs no key. Given a key (or a config "
        "whose ClickHouse keys name a ClickHouse file's key id), it also authenticates the "
        "last segment of a cryptdisk file, which tells a file cut short from a whole one; "
        "'cryptdisk verify' authenticates every segment. Exit status 1 for a file that is "
        "not encrypted, is truncated, or fails that check.")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print JSON")
    add_key_options(p, required=False)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("verify", help="authenticate every segment of files")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("-q", "--quiet", action="store_true", help="print failures only")
    add_key_options(p)
    p.set_defaults(func=cmd_verify)


# -- helpers ---------------------------------------------------------------------


def _refuse_tty(stream: IO[bytes], force: bool, what: str) -> None:
    if not force and stream.isatty():
        raise CryptdiskError(f"refusing to write {what} to a terminal",
                             hint="redirect to a file or pipe, or pass --force")


def _check_output(args: argparse.Namespace) -> bool:
    """Refuse an OUTPUT path that is a directory, or that exists (unless ``--force``);
    True for an OUTPUT that is written as a stream, as ``-`` is.

    An existing character device or FIFO (``/dev/null``, a named pipe) is such a
    stream: written to in place, as ``cp`` does, never replaced by a file (a rename over
    ``/dev/null`` would put a file there); any other file that is not a regular file (a
    block device, a socket) is refused.

    The output is written to a temporary file beside it and renamed over it once whole,
    so with ``--force`` an OUTPUT that is the INPUT is converted in place, crash-safe: an
    interruption leaves the input as it was (and a ``.NAME.*.cdtmp`` to delete).

    An OUTPUT that is a symbolic link is written through to the file it names (as ``cp``
    does), so converting a link's file in place converts the file, not the link; a link
    to nothing is refused.
    """
    path = args.output
    if os.path.islink(path):
        target = os.path.realpath(path)
        if not os.path.exists(target):
            raise CryptdiskError(f"{path} is a symbolic link to {target}, which does not "
                                 "exist; refusing to write through it",
                                 hint="give the link's target, or remove the link")
        args.output = path = target
    if os.path.isdir(path):  # refused before writing: the rename would fail
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    if path.endswith(os.sep):  # a directory's name (none there): no file is written to it
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    with contextlib.suppress(FileNotFoundError):
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            return True
        if not stat.S_ISREG(mode):
            raise CryptdiskError(f"{path} is not a regular file (a block device or a "
                                 "socket); refusing to write to it",
                                 hint="give a file's path, or - for stdout")
    if args.force or not os.path.lexists(path):
        return False
    if args.input != "-" and os.path.exists(args.input) and os.path.exists(path) and \
            os.path.samefile(args.input, path):
        raise CryptdiskError(f"{path} is the input file; refusing to replace it",
                             hint=f"pass --force to {args.command} it in place")
    raise CryptdiskError(f"{path} already exists; refusing to overwrite it",
                         hint="choose another output, or pass --force to replace it")


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_output(path: str, overwrite: bool) -> Iterator[IO[bytes]]:
    """A temp file beside ``path``, moved to ``path`` only if the block succeeds.

    Without ``overwrite``, the move never replaces a file that appeared meanwhile."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".cdtmp",
                                   dir=directory)
    except OSError as exc:  # name the output, not the temporary file
        raise type(exc)(exc.errno, exc.strerror, path) from None
    f = os.fdopen(fd, "wb")
    try:
        yield f
        f.flush()
        os.fsync(f.fileno())
        f.close()
        try:
            if overwrite:
                os.replace(tmp, path)
            else:
                os.link(tmp, path)  # fails if the destination appeared meanwhile
        except OSError as exc:  # name the output, not the temporary file
            raise type(exc)(exc.errno, exc.strerror, path) from None
        if not overwrite:
            os.unlink(tmp)
        _fsync_dir(path)
    except BaseException:
        f.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class _Sink(Protocol):
    """Where :func:`_copy` writes: a binary file or a :class:`SealedWriter`."""

    def write(self, data: bytes, /) -> object: ...


def _copy(src: IO[bytes], dst: _Sink) -> None:
    while chunk := src.read(CHUNK):
        dst.write(chunk)


def _stdin() -> IO[bytes]:
    return sys.stdin.buffer


def _stdout() -> IO[bytes]:
    return sys.stdout.buffer


# -- commands ----------------------------------------------------------------------


@contextlib.contextmanager
def _naming(path: str) -> Iterator[None]:
    """A write error that names no file (a full disk's, on a flush) names ``path``."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None and exc.errno is not None and \
                not isinstance(exc, BrokenPipeError):
            raise type(exc)(exc.errno, exc.strerror, path) from None
        raise


@contextlib.contextmanager
def _stream_output(path: str) -> Iterator[IO[bytes]]:
    """stdout for ``-``, else the device or FIFO at ``path`` opened for writing."""
    if path == "-":
        yield _stdout()
        return
    with _naming(path), open(path, "wb") as out:
        yield out


def cmd_encrypt(args: argparse.Namespace) -> int:
    keyring = keyring_from_args(args)
    stream = args.output == "-" or _check_output(args)
    src: IO[bytes] = _stdin() if args.input == "-" else open(args.input, "rb")
    try:
        if stream:
            header, dek = new_header(Kind.SEALED, keyring.current_key(),
                                     algorithm=args.algorithm, segment_size=args.segment_size)
            with _stream_output(args.output) as out:
                _refuse_tty(out, args.force, "ciphertext")
                writer = SealedWriter(out, header, dek)
                _copy(src, writer)
                writer.close()
                out.flush()
        else:
            # xb: never replaces a file that appeared since the check
            with _naming(args.output), open_file(
                    args.output, "wb" if args.force else "xb", keys=keyring,
                    algorithm=args.algorithm, segment_size=args.segment_size) as dst:
                _copy(src, dst)
    finally:
        if src is not sys.stdin.buffer:
            src.close()
    return 0


def _open_input(args: argparse.Namespace, path: str) -> IO[bytes]:
    """Open an encrypted file by path, recognising cryptdisk's or ClickHouse's header."""
    from ..disks import open_any

    config = config_from_args(args)
    if config is not None:
        return open_any(path, config=config)
    return open_any(path, keyring=keyring_from_args(args))


def _decrypt_to(args: argparse.Namespace, path: str, out: IO[bytes]) -> None:
    if path == "-":
        keyring = keyring_from_args(args)
        stream = _stdin()
        header = Header.parse(stream.read(HEADER_SIZE), "<stdin>")
        if header.kind != Kind.SEALED:
            raise ImmutableFileError("mutable files cannot be decrypted from stdin",
                                     hint="give the file's path instead")
        dek = open_header(header, keyring, "<stdin>")
        for segment in iter_sealed_stream(stream, header, dek, "<stdin>"):
            out.write(segment)
        return
    with _open_input(args, path) as f:
        _copy(f, out)


def _journal_is_done(args: argparse.Namespace, journal: str) -> bool:
    """Whether the encrypted rollback journal ``journal`` is one SQLite has finished with
    (its header zeroed, as ``journal_mode=PERSIST`` leaves it after every commit): it
    opens under the keys and does not start with the journal magic
    (:func:`~cryptdisk._sqlitefiles.journal_holds_rollback`)."""
    head: bytes | None
    try:
        with _open_input(args, journal) as f:
            head = f.read(len(JOURNAL_MAGIC))
    except (OSError, CryptdiskError):
        head = None
    return not journal_holds_rollback(head)


def _refuse_sqlite_with_changes_beside(path: str, args: argparse.Namespace) -> None:
    """Refuse a mutable file with a non-empty ``-wal`` or ``-journal`` beside it: an
    encrypted SQLite database whose latest commits (or a transaction to roll back) are
    in that file, which decrypting the database file alone would leave out. A journal
    SQLite has finished with (``journal_mode=PERSIST`` keeps one after each commit) is
    not such a file."""
    if path == "-":
        return
    for suffix in ("-wal", "-journal"):
        try:
            if os.path.getsize(path + suffix) == 0:
                continue
            with open(path, "rb") as f:
                if read_header(f, path).kind not in Kind.WRITABLE:
                    return
        except (OSError, CryptdiskError):
            continue  # no such file beside it, or not a cryptdisk file: decrypt says so
        if suffix == "-journal" and _journal_is_done(args, path + suffix):
            continue
        raise CryptdiskError(f"{path} has a {suffix[1:]} beside it ({path}{suffix}): an "
                             "encrypted SQLite database whose latest changes are there, "
                             "which decrypting the file alone would leave out",
                             hint=f"use 'cryptdisk sqlite decrypt {path} OUTPUT', which "
                             "reads them through SQLite")


def cmd_decrypt(args: argparse.Namespace) -> int:
    _refuse_sqlite_with_changes_beside(args.input, args)
    if args.output == "-" or _check_output(args):
        with _stream_output(args.output) as out:
            _refuse_tty(out, args.force, "decrypted binary data")
            _decrypt_to(args, args.input, out)
            out.flush()
        return 0
    with _naming(args.output), _atomic_output(args.output, args.force) as out:
        _decrypt_to(args, args.input, out)
    # A plain file has no saved last segment: the -cdlogtail of the encrypted log this
    # replaced (decrypting a log in place) would be left describing a file that is gone.
    remove_tail(args.output, LOG_TAIL_SUFFIX)
    return 0


class _TextCheck:
    """Refuses binary plaintext on a terminal (checks what it is about to write)."""

    def __init__(self, out: IO[bytes], force: bool) -> None:
        self._out = out
        self._check = not force and out.isatty()

    def write(self, data: Any) -> int:
        if self._check:
            chunk = bytes(data[:4096])
            if b"\0" in chunk:
                raise CryptdiskError("refusing to write binary data to a terminal",
                                     hint="redirect to a file or pipe, or pass --force")
            self._check = False
        return self._out.write(data)


def cmd_cat(args: argparse.Namespace) -> int:
    _refuse_sqlite_with_changes_beside(args.file, args)
    out = _stdout()
    _decrypt_to(args, args.file, _TextCheck(out, args.force))  # type: ignore[arg-type]
    out.flush()
    return 0


def _key_available(args: argparse.Namespace) -> bool:
    """Whether keys for cryptdisk's own files were given (a ClickHouse XML config has none)."""
    if any(getattr(args, n, None) for n in ("key_env", "key_file", "key_hex")):
        return True
    config = config_from_args(args)
    return config is not None and config.keyring is not None


def _check_last_segment(args: argparse.Namespace) -> str:
    """Authenticate the last segment (raises, naming truncation, when it fails)."""
    with _open_input(args, args.file) as f:  # a sealed file's is checked on opening
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            f.read(1)
    return "authenticated"


def cmd_inspect(args: argparse.Namespace) -> int:
    from ..disks import describe

    info = describe(args.file, config=config_from_args(args))
    if info["format"] == "plain":
        raise NotEncryptedError(f"{args.file}: not an encrypted file (no cryptdisk or "
                                "ClickHouse ENC header)")
    if info["format"] == "cryptdisk":
        info["last_segment"] = _check_last_segment(args) if _key_available(args) else \
            "not checked (no key given)"
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        width = max(map(len, info))
        for k, v in info.items():
            print(f"{k.replace('_', ' '):<{width}}  {v}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            with _open_input(args, path) as f:
                verify = getattr(f, "verify", None)
                if verify is not None:
                    size = verify()
                else:  # ClickHouse's format: nothing to authenticate, read it all
                    size = 0
                    while chunk := f.read(CHUNK):
                        size += len(chunk)
                    if not args.quiet:
                        print(f"READ  {path}  ({size} bytes; ClickHouse's format has no "
                              "authentication, so only the key fingerprint was checked)")
                    continue
        except (CryptdiskError, OSError) as exc:
            failed += 1
            msg = str(exc) if isinstance(exc, CryptdiskError) else (exc.strerror or str(exc))
            if path not in msg:
                msg = f"{path}: {msg}"
            print(f"cryptdisk: error: {msg}", file=sys.stderr)
            continue
        if not args.quiet:
            print(f"OK  {path}  ({size} bytes)")
    return 1 if failed else 0

"""Converting a directory tree between formats (plain, ClickHouse ``ENC``, cryptdisk).

Each source file is recognised by its header (:func:`open_any`), decrypted
with the key the config holds for it, written through the target disk (which
publishes atomically: temp file, fsync, rename) and then **read back and
compared** by SHA-256 with the source's plaintext. A run that is interrupted
leaves only whole, verified files (and perhaps stray ``.*.cdtmp`` temporaries,
which the next run removes); running again skips every file whose converted
copy already decrypts to the same bytes, and redoes the rest.

An append-only log (:func:`cryptdisk.format.open_log`: the server's access and audit
logs) is read as its readers read it, through the saved copy of its last segment
beside it (``NAME-cdlogtail``), so a log whose last write a crash cut converts as it was
before that write. The converted log is whole and needs no copy: ``NAME-cdlogtail`` is
not converted as a file of its own (it is counted in :attr:`ConvertSummary.log_tails`).

A SQLite database (plain, or encrypted by :mod:`cryptdisk.sqlite`) is converted as its
file alone, which must then hold all of its state: a database a connection has open
(SQLite's locks say so), or one with a WAL holding frames or a hot journal beside it (a
connection's, or a killed writer's), is refused before anything is written. What else is
beside it holds no state and is left out (counted in :attr:`ConvertSummary.sqlite_files`):
``NAME-shm`` (SQLite's WAL index, which it rebuilds, or the name of the encrypted VFS's),
an empty WAL, a journal SQLite has finished with, and the side files of an encrypted
journal and WAL (``NAME-journal-cdtail``, ``NAME-wal-cdtail``), which are also left out
when only their journal or WAL is there: each holds the last segment's record under that
file's own key and id, which no converted file has.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from .._sqlitefiles import (
    JOURNAL_MAGIC,
    SQLITE_COMPANIONS,
    SQLITE_JOURNALS,
    journal_holds_rollback,
    sqlite_open,
)
from ..errors import AuthenticationError, CryptdiskError, DiskError, FormatError
from ..format import HEADER_SIZE, LOG_TAIL_SUFFIX, TAIL_SUFFIX, Header, Kind
from ._base import Disk
from ._detect import ConfigKeys, open_any
from ._paths import is_temp

__all__ = ["ConvertSummary", "convert_tree", "plaintext_digest"]

_CHUNK = 1 << 20


@dataclass
class ConvertSummary:
    converted: int = 0
    skipped: int = 0  # already converted and verified by an earlier run
    bytes: int = 0  # plaintext bytes converted in this run
    removed_temps: int = 0
    formats: dict[str, int] = field(default_factory=dict)  # source format -> files
    #: ``NAME-cdlogtail`` files left out: their log ``NAME`` was read through them
    log_tails: int = 0
    #: files beside SQLite databases left out (see above): ``-shm``, an empty ``-wal``, a
    #: finished ``-journal``, ``-journal-cdtail`` / ``-wal-cdtail``
    sqlite_files: int = 0
    #: SQLite databases converted (or found converted): in a sealed file, as every
    #: converted file, which the encrypted SQLite VFS does not open
    sqlite_databases: int = 0


def plaintext_digest(f: IO[bytes], sink: Callable[[bytes], object] | None = None,
                     progress: Callable[[int], None] | None = None) -> tuple[bytes, int]:
    """SHA-256 and size of a file's plaintext, feeding each chunk to ``sink`` as well."""
    h = hashlib.sha256()
    total = 0
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        total += len(chunk)
        if sink is not None:
            sink(chunk)
        if progress is not None:
            progress(len(chunk))
    return h.digest(), total


def _source_files(src: str) -> list[str]:
    out = []
    for dirpath, _dirs, files in os.walk(src):
        for name in files:
            full = os.path.join(dirpath, name)
            if os.path.isfile(full) and not os.path.islink(full):
                out.append(os.path.relpath(full, src).replace(os.sep, "/"))
    return sorted(out)


def _remove_temps(dst: str) -> int:
    removed = 0
    for dirpath, _dirs, files in os.walk(dst):
        for name in files:
            if is_temp(name):
                os.unlink(os.path.join(dirpath, name))
                removed += 1
    return removed


_PLAIN_SQLITE = b"SQLite format 3\0"


def _sqlite_tail(rel: str, present: set[str]) -> bool:
    """Whether ``rel`` is the -cdtail side file of a SQLite journal or WAL that is there
    (or whose database is)."""
    if not rel.endswith(TAIL_SUFFIX):
        return False
    owner = rel[:-len(TAIL_SUFFIX)]
    return any(owner.endswith(side) and (owner in present or owner[:-len(side)] in present)
               for side in SQLITE_JOURNALS)


def _is_sqlite(path: str) -> bool:
    """Whether ``path`` is a SQLite database: plain, or a mutable cryptdisk file (the
    encrypted VFS's databases; cryptdisk's other mutable files have no SQLite files
    beside them)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_SIZE)
    except OSError:
        return False
    if head.startswith(_PLAIN_SQLITE):
        return True
    try:
        return Header.parse(head, path).kind in Kind.WRITABLE
    except CryptdiskError:
        return False


def _sqlite_databases(src: str, present: set[str]) -> set[str]:
    """The SQLite databases of ``present`` that have a file of SQLite's beside them."""
    return {rel for rel in present
            if any(rel + side in present for side in SQLITE_COMPANIONS)
            and _is_sqlite(os.path.join(src, rel))}


def _plaintext_head(path: str, config: ConfigKeys | None, n: int) -> bytes | None:
    """The first ``n`` bytes of ``path``'s plaintext (b"" if empty); None if it does not
    open."""
    try:
        with open_any(path, config=config, allow_plain=True) as f:
            return f.read(n)
    except (OSError, CryptdiskError):
        return None


def _check_settled(src: str, rel: str, config: ConfigKeys | None) -> None:
    """Refuse the database ``rel`` unless its file alone holds its state (see above)."""
    path = os.path.join(src, rel)
    why = None
    wal = _plaintext_head(path + "-wal", config, 1) if os.path.exists(path + "-wal") else b""
    if sqlite_open(path):
        why = "a connection has it open (it holds SQLite's lock)"
    elif wal is None:
        why = f"its WAL ({path}-wal) does not open with the config's keys, or is torn"
    elif wal:
        why = f"its WAL ({path}-wal) holds changes not yet copied into the file"
    elif os.path.exists(path + "-journal") and journal_holds_rollback(
            _plaintext_head(path + "-journal", config, len(JOURNAL_MAGIC))):
        why = f"its journal ({path}-journal) holds a transaction to roll back"
    if why is not None:
        raise DiskError(f"{path} is a SQLite database whose file alone does not hold its "
                        f"state: {why}; convert copies files one by one and would leave "
                        "it out", hint="close every connection to it; a WAL or journal "
                        "that a killed writer left is applied by opening the database once "
                        "(cryptdisk.sqlite.connect, or sqlite3 for a plain one) and closing "
                        "it; then convert again")


def _already_done(target: Disk, rel: str, digest: bytes) -> bool:
    if not target.exists(rel):
        return False
    try:
        with target.open_read(rel) as f:
            return plaintext_digest(f)[0] == digest
    except (AuthenticationError, FormatError, CryptdiskError):
        return False  # unreadable or another key/format: convert again


def convert_tree(src: str, dst: str, target: Disk, *, config: ConfigKeys | None,
                 progress: Callable[[str, int], None] | None = None) -> ConvertSummary:
    """Convert every file below ``src`` into ``target`` (a disk rooted at ``dst``).

    ``progress(path, nbytes)`` is called as plaintext is processed. Raises
    :class:`DiskError` if a converted file does not read back identical.
    """
    src, dst = os.path.abspath(src), os.path.abspath(dst)
    if not os.path.isdir(src):
        raise DiskError(f"{src}: not a directory")
    if dst == src or dst.startswith(src + os.sep) or src.startswith(dst + os.sep):
        raise DiskError("source and destination must be separate trees",
                        hint="convert into a new directory, then swap the two")
    summary = ConvertSummary()
    summary.removed_temps = _remove_temps(dst) if os.path.isdir(dst) else 0
    files = _source_files(src)
    present = set(files)
    databases = _sqlite_databases(src, present)
    for rel in sorted(databases):
        _check_settled(src, rel, config)
    beside = {rel + side for rel in databases for side in SQLITE_COMPANIONS}
    for rel in files:
        if rel.endswith(LOG_TAIL_SUFFIX) and rel[:-len(LOG_TAIL_SUFFIX)] in present:
            summary.log_tails += 1  # part of its log, which is read through it
            continue
        if rel in beside or _sqlite_tail(rel, present):
            summary.sqlite_files += 1  # no state of its database's (checked above)
            continue
        if rel in databases:
            summary.sqlite_databases += 1
        def tick(n: int, rel: str = rel) -> None:
            if progress is not None:
                progress(rel, n)

        with open_any(os.path.join(src, rel), config=config, allow_plain=True) as fin:
            fmt = getattr(fin, "info", {}).get("format", "cryptdisk")
            summary.formats[fmt] = summary.formats.get(fmt, 0) + 1
            digest, size = plaintext_digest(fin)
            if _already_done(target, rel, digest):
                summary.skipped += 1
                tick(size)
                continue
            fin.seek(0)
            try:
                with target.open_write(rel) as fout:
                    written, _ = plaintext_digest(fin, fout.write, tick)
            except OSError as exc:  # a full disk's error names no file: name the one
                if exc.filename is not None or exc.errno is None or \
                        isinstance(exc, CryptdiskError):
                    raise
                raise OSError(exc.errno, exc.strerror, os.path.join(dst, rel)) from None
        with target.open_read(rel) as check:
            back, _ = plaintext_digest(check)
        if not (back == written == digest):
            target.remove(rel)
            raise DiskError(f"{rel}: the converted file does not read back identical; removed it",
                            hint="check the disk for errors and run the conversion again")
        summary.converted += 1
        summary.bytes += size
    return summary

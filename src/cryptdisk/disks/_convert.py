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

SQLite's side files of an encrypted database's journal and WAL (``NAME-journal-cdtail``,
``NAME-wal-cdtail``, :mod:`cryptdisk.sqlite`) are left out too when their journal, WAL
or database is there (counted in :attr:`ConvertSummary.sqlite_tails`): each holds the
last segment's record under the journal's own key and file id, which no converted file
has, so it is never a file of the user's.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from ..errors import AuthenticationError, CryptdiskError, DiskError, FormatError
from ..format import LOG_TAIL_SUFFIX, TAIL_SUFFIX
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
    #: SQLite's ``NAME-journal-cdtail`` / ``NAME-wal-cdtail`` files left out (see above)
    sqlite_tails: int = 0


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


_SQLITE_SIDE = ("-journal", "-wal")


def _sqlite_tail(rel: str, present: set[str]) -> bool:
    """Whether ``rel`` is the -cdtail side file of a SQLite journal or WAL that is there
    (or whose database is)."""
    if not rel.endswith(TAIL_SUFFIX):
        return False
    owner = rel[:-len(TAIL_SUFFIX)]
    return any(owner.endswith(side) and (owner in present or owner[:-len(side)] in present)
               for side in _SQLITE_SIDE)


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
    for rel in files:
        if rel.endswith(LOG_TAIL_SUFFIX) and rel[:-len(LOG_TAIL_SUFFIX)] in present:
            summary.log_tails += 1  # part of its log, which is read through it
            continue
        if _sqlite_tail(rel, present):
            summary.sqlite_tails += 1  # bound to its journal's key and id: no copy has them
            continue
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

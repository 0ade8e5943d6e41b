"""Key rotation: rewrap file headers under the current key, without touching segments.

A rewrap reads the header, unwraps the data key with whichever keyring key
the header names, wraps it again under the current key and writes the new
128-byte header with one ``pwrite`` at offset 0, then fsyncs. A process killed
at any moment leaves the header either wholly old or wholly new, so every file
stays readable with the old key or the new one. Rewrapping is idempotent: a
file already under the current key is left alone, so an interrupted run is
resumed by running it again.

A reader that opens the file while the header is written may read bytes of both
headers: such a header never authenticates, and the reader reads it again after short
pauses until it opens (``cryptdisk.format.read_open_header``). So a rotation fails no
reader's open, in this process or another, that succeeds before and after it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from ..errors import CryptdiskError, KeyProviderError, NotEncryptedError
from ..format import (
    HEADER_SIZE,
    MAGIC,
    Header,
    KeyLookup,
    read_open_header,
    rewrap_header,
)

__all__ = ["LockedRewrap", "RewrapSummary", "iter_files", "rewrap_descriptor", "rewrap_file",
           "rewrap_tree"]


def rewrap_file(path: str | os.PathLike[str], keys: KeyLookup) -> bool:
    """Rewrap one file under ``keys.current_key()``; returns False if it already was.

    The header is read, rewrapped and written back: a writer that replaces the header
    of the same file meanwhile (an SQLite rollback journal starts each transaction with
    a new one) must be kept out by the caller (``cryptdisk sqlite rotate`` holds SQLite's
    lock)."""
    name = os.fspath(path)
    fd = os.open(name, os.O_RDWR)
    try:
        return rewrap_descriptor(fd, name, keys)
    finally:
        os.close(fd)


def rewrap_descriptor(fd: int, name: str, keys: KeyLookup) -> bool:
    """:func:`rewrap_file` on an open descriptor (left open: closing a descriptor of a
    file drops the process's POSIX locks on it, which SQLite's are)."""
    current = keys.current_key()

    def is_current(header: Header) -> bool:
        return header.key_id == current.key_id and header.key_check == current.check_value

    def read() -> bytes:
        return os.pread(fd, HEADER_SIZE, 0)

    if is_current(Header.parse(read(), name)):
        return False
    # (another rewrap of this file may be writing its header: read it again if torn)
    header, dek = read_open_header(read, keys, name)
    if is_current(header):
        return False
    new = rewrap_header(header, dek, current).to_bytes()
    if os.pwrite(fd, new, 0) != len(new):  # pragma: no cover - a 128-byte write
        raise OSError(f"short header write to {name}")
    os.fsync(fd)
    return True


def iter_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[str]:
    """Every regular file under the given files and directories, sorted, no symlinks; each
    file once (by its real path), however many of the given paths reach it. A cryptdisk
    file given by name brings its SQLite ``-journal`` and ``-wal`` when they are not
    empty (an encrypted SQLite database's committed pages may be there)."""
    seen: set[str] = set()

    def first(name: str) -> bool:
        real = os.path.realpath(name)
        if real in seen:
            return False
        seen.add(real)
        return True

    for p in paths:
        name = os.fspath(p)
        if os.path.isdir(name):
            for root, dirs, files in os.walk(name):
                dirs.sort()
                for f in sorted(files):
                    full = os.path.join(root, f)
                    if os.path.isfile(full) and not os.path.islink(full) and first(full):
                        yield full
        else:
            if first(name):
                yield name
            # an encrypted SQLite database's WAL and rollback journal (not empty: they then
            # have a header) hold committed pages under their own headers
            for companion in _sqlite_companions(name):
                if first(companion):
                    yield companion


def _sqlite_companions(name: str) -> list[str]:
    try:
        with open(name, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                return []
    except OSError:
        return []
    return [c for c in (name + "-journal", name + "-wal")
            if os.path.isfile(c) and not os.path.islink(c) and os.path.getsize(c) > 0]


@dataclass
class RewrapSummary:
    rewrapped: int = 0
    already_current: int = 0
    skipped_not_encrypted: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    #: files not tried: the run stopped at a key provider that failed (after its retries)
    not_done: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.not_done


#: Rewraps an SQLite database file with its journal and WAL under SQLite's lock
#: (``cryptdisk.sqlite.rotate``): ``(path, keys) -> [(file, rewrapped), ...]``.
LockedRewrap = Callable[[str, KeyLookup], list[tuple[str, bool]]]


def rewrap_tree(paths: Iterable[str | os.PathLike[str]], keys: KeyLookup, *,
                on_file: Callable[[str], None] | None = None,
                on_result: Callable[[str, bool], None] | None = None,
                sqlite: LockedRewrap | None = None) -> RewrapSummary:
    """Rewrap every cryptdisk file under ``paths``; other files are listed, not touched.

    ``on_file(path)`` is called after each file (whatever became of it);
    ``on_result(path, rewrapped)`` after each cryptdisk file rewrapped (True) or
    found under the current key already (False).

    An encrypted SQLite database whose journal or WAL is there (a process may be writing
    it) is rewrapped with them by ``sqlite`` when it is given, holding SQLite's lock: a
    rollback journal gets a new header with each transaction, which an unlocked
    read-rewrap-write of its header could overwrite with the previous one's.

    A key provider that fails (unreachable after its retries) stops the run: the file
    at hand is in ``failed`` and the files after it in ``not_done``, each still under
    its old key; running it again resumes.
    """
    summary = RewrapSummary()
    files = iter_files(paths)
    handled: set[str] = set()  # the journals and WALs rewrapped with their database
    for name in files:
        if name in handled:
            continue
        companions: list[str] = []
        try:
            companions = _sqlite_companions(name) if sqlite is not None else []
            if sqlite is not None and companions:
                handled.update(companions)
                results = sqlite(name, keys)
            else:
                results = [(name, rewrap_file(name, keys))]
            for file, rewrapped in results:
                if rewrapped:
                    summary.rewrapped += 1
                else:
                    summary.already_current += 1
                if on_result is not None:
                    on_result(file, rewrapped)
                if on_file is not None and file != name:
                    on_file(file)
        except NotEncryptedError:
            summary.skipped_not_encrypted.append(name)
        except KeyProviderError as exc:
            summary.failed.append((name, str(exc)))
            summary.not_done.extend(c for c in companions if c in handled)
            summary.not_done.extend(f for f in files if f not in handled)
            break
        except CryptdiskError as exc:
            summary.failed.append((name, str(exc)))
            summary.not_done.extend(c for c in companions if c in handled)
        except OSError as exc:
            summary.failed.append((name, exc.strerror or str(exc)))
            summary.not_done.extend(c for c in companions if c in handled)
        if on_file is not None:
            on_file(name)
    return summary

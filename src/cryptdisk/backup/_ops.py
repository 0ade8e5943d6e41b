"""create, list, verify, restore and prune: backups of the embedded database and of
encrypted SQLite databases in a :class:`Repository`."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import logging
import os
import random
import shutil
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import apsw

from ..db import Database
from ..disks import LocalDisk
from ..errors import (
    BackupAuthenticationError,
    BackupError,
    CatalogError,
    CryptdiskError,
    DiskFileNotFoundError,
    KeyNotFoundError,
)
from ..format import MAGIC
from ..keys import Key, Keyring, write_key_file
from . import _chunker
from ._replace import (
    Replaced,
    check_outside,
    holding_sqlite,
    open_target,
    settle_sqlite,
    target_path,
)
from ._repo import ChunkProblem, Repository
from ._restoring import exchange, restore_lock, work_path
from ._sqliteimage import snapshot, write_image

__all__ = ["BackupSummary", "VerifyReport", "create", "find_backup", "list_backups", "prune",
           "restore", "retained", "verify"]

log = logging.getLogger("cryptdisk.backup")

Progress = Callable[[int, int], None]  # (chunks seen, bytes stored so far)


@dataclass
class BackupSummary:
    id: str
    kind: str
    source: str
    files: int
    bytes: int  # plaintext bytes backed up
    chunks: int  # chunks referenced
    new_chunks: int  # chunks written by this backup
    stored_bytes: int  # bytes written to the repository (chunks and manifest)
    files_reused: int = 0  # parts unchanged since an earlier backup: not read again


class _Hashing:
    """A reader that hashes what it hands on."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        self.size += len(data)
        return bytes(data)


class _Writer:
    """Chunks, compresses, encrypts and stores on a few threads (zstd, AES-GCM and
    fsync release the GIL); :meth:`finish` waits until every chunk is durable."""

    WORKERS = 4
    IN_FLIGHT = 16

    def __init__(self, repo: Repository, progress: Progress | None) -> None:
        self.repo = repo
        self.progress = progress
        self.chunks = 0
        self.new = 0
        self.stored = 0
        self.done = 0
        self.reused = 0  # parts whose chunk lists were reused
        self._pool = ThreadPoolExecutor(self.WORKERS, thread_name_prefix="cryptdisk-backup")
        self._queue: deque[Future[tuple[str, int]] | None] = deque()

    def store(self, stream: BinaryIO | _Hashing) -> list[str]:
        names = []
        for data in _chunker.chunks(stream, self.repo.keys.seed):  # type: ignore[arg-type]
            name = self.repo.keys.chunk_name(data)
            names.append(name)
            self.chunks += 1
            if self.repo.claim_chunk(name):
                self.new += 1
                self._queue.append(self._pool.submit(self.repo.put_chunk, data, name))
            else:
                self._queue.append(None)
            self._drain()
        return names

    def reuse(self, names: list[str]) -> None:
        """Count chunks an unchanged part already has in the repository."""
        for _name in names:
            self.chunks += 1
            self._queue.append(None)
            self._drain()

    def _drain(self) -> None:
        while len(self._queue) > self.IN_FLIGHT or (self._queue and (
                self._queue[0] is None or self._queue[0].done())):
            self._pop()

    def _pop(self) -> None:
        item = self._queue.popleft()
        if item is not None:
            self.stored += item.result()[1]
        self.done += 1
        if self.progress is not None:
            self.progress(self.done, self.stored)

    def finish(self) -> None:
        """Wait for every chunk (raising the first failure) and make them durable."""
        while self._queue:
            self._pop()
        self.repo.sync_chunks()

    def close(self) -> None:
        for item in self._queue:
            if item is not None:
                item.cancel()
        self._pool.shutdown(wait=True)


class _PartMoved(Exception):
    pass


class _KeysChanged(Exception):
    """A part is under a key the open database did not have: rotated meanwhile."""


def _part_keys(sha256: str, part_id: str | None, size: int) -> list[tuple[str, int]]:
    """What identifies a part's bytes across backups: its SHA-256 where the catalog has one
    (plain parts), its part id (random, never reused; a part's file never changes)."""
    keys = [(sha256, size)] if sha256 else []
    if part_id:
        keys.append(("id:" + part_id, size))
    return keys


def _earlier_parts(repo: Repository, db_id: str) -> dict[tuple[str, int], dict[str, Any]]:
    """The manifest entries of the parts in the newest earlier backup of database ``db_id``,
    by (SHA-256, size) and by (part id, size): parts are immutable, so equal ones need not
    be read again."""
    for bid in reversed(repo.manifest_ids()[-_EARLIER_MANIFESTS:]):
        try:
            m = repo.read_manifest(bid)
        except BackupError:
            continue  # verify reports it
        if m.get("kind") == "db" and m.get("db_id") == db_id:
            return {key: p for t in m["tables"] for p in t["parts"]
                    for key in _part_keys(p["sha256"], p.get("id"), p["bytes"])}
    return {}


#: How many of the newest manifests create looks through for the database's last backup.
_EARLIER_MANIFESTS = 20


def _snapshot_db(db: Database, w: _Writer,
                 earlier: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """One catalog version and the parts it names (immutable files, so consistent).

    A part that ``earlier`` has, with every chunk still in the repository, is not read:
    its chunk list is reused (a chunk gone, e.g. deleted by damage, means reading it)."""
    catalog = db.catalog
    tables = []
    w.reused = 0  # this attempt's (a retry starts over on a newer catalog)
    for meta in catalog.tables.values():
        parts = []
        for part in meta.parts:
            known = next((earlier[k] for k in _part_keys(part.sha256, part.id, part.bytes)
                          if k in earlier), None)
            if known is not None and all(w.repo.has_chunk(c) for c in known["chunks"]):
                w.reuse(known["chunks"])
                w.reused += 1
                parts.append({"id": part.id, "rows": part.rows, "bytes": part.bytes,
                              "sha256": known["sha256"], "chunks": known["chunks"]})
                continue
            if part.disk not in db.config.disks:
                raise BackupError(f"table {meta.name}: part {part.path} is on disk "
                                  f"{part.disk!r}, which the config does not define")
            try:
                # a part without a SHA-256 (encrypted) is checked by its footer and its
                # segments' authentication as it is read; the manifest gets the SHA-256 of
                # the bytes read either way (a restore checks them against it)
                with db.open_part_file(part) as f:
                    h = _Hashing(f)
                    chunks = w.store(h)
            except (FileNotFoundError, DiskFileNotFoundError):
                raise _PartMoved(f"part {part.path} is missing") from None
            except CatalogError as exc:
                raise _PartMoved(str(exc)) from None
            except KeyNotFoundError as exc:
                raise _KeysChanged() from exc
            if h.size != part.bytes or (part.sha256 and h.sha.hexdigest() != part.sha256):
                raise _PartMoved(f"part {part.path} does not match the catalog's SHA-256 "
                                 "and size")
            parts.append({"id": part.id, "rows": part.rows, "bytes": h.size,
                          "sha256": h.sha.hexdigest(), "chunks": chunks})
        tables.append({"name": meta.name, "columns": [list(c) for c in meta.columns],
                       "policy": meta.policy, "order_by": meta.order_by, "parts": parts})
    return {"kind": "db", "db_id": catalog.db_id, "catalog_version": catalog.version,
            "tables": tables}


def _backup_db(path: str, config: Any, w: _Writer) -> dict[str, Any]:
    db = Database(path, config, read_only=True)
    try:
        earlier = _earlier_parts(w.repo, db.catalog.db_id)
        last: Exception | None = None
        for _attempt in range(10):
            version = db.catalog.version
            try:
                return _snapshot_db(db, w, earlier)
            except _PartMoved as exc:  # a writer merged or dropped parts meanwhile
                last = exc
                db.refresh()
                if db.catalog.version == version:
                    raise BackupError(
                        f"{path}: {exc} (catalog version {version}): the database is damaged",
                        hint="find every damaged part with Python's cryptdisk.connect(PATH, "
                        "read_only=True).check() (with its config, if it has one); put it "
                        "back from a backup with 'cryptdisk backup restore ... --force'"
                        ) from None
            except _KeysChanged as exc:
                cause = exc.__cause__
                assert isinstance(cause, KeyNotFoundError)
                if config is not None:
                    raise cause from None  # the config lacks the key: its error says which
                # `cryptdisk rotate` made a new key current meanwhile: load the key files
                # again (the rotation keeps the old key beside them) and start over
                last = cause
                db.close()
                db = Database(path, config, read_only=True)
        raise BackupError(f"{path}: the catalog kept changing during the backup ({last})")
    finally:
        db.close()


def _backup_sqlite(path: str, keyring: Keyring, w: _Writer) -> dict[str, Any]:
    try:
        with snapshot(path, keyring) as (image, wal):  # one committed state
            h = _Hashing(image)
            chunks = w.store(h)
    except apsw.ReadOnlyError:
        if not os.path.exists(path + "-journal"):
            raise
        # SQLITE_READONLY_ROLLBACK: a writer was killed mid-transaction and left a hot
        # journal, which the next connection that may write rolls back
        raise BackupError(f"{path} has a hot journal ({path}-journal): a writer was killed "
                          "in a transaction, and SQLite rolls that back before anyone reads "
                          "the database, which a backup (read-only) does not do; no backup "
                          "was taken", hint="open it read-write once (the application, or "
                          "cryptdisk.sqlite.connect(PATH, keyring=...) and any query), then "
                          "back it up again") from None
    except (apsw.BusyError, apsw.LockedError):
        raise BackupError(f"{path}: the database stayed locked by a writer past the busy "
                          "timeout; no backup was taken",
                          hint="run the backup again when the writer's transaction ends (in "
                          "WAL mode a backup reads beside a writer)") from None
    return {"kind": "sqlite", "wal": wal,
            "file": {"bytes": h.size, "sha256": h.sha.hexdigest(), "chunks": chunks}}


def _is_cryptdisk_file(path: str) -> bool:
    """Whether the file starts with a cryptdisk header's magic (nothing is authenticated)."""
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def create(repo: Repository, source: str | os.PathLike[str], *, config: Any = None,
           keyring: Keyring | None = None, progress: Progress | None = None) -> BackupSummary:
    """Back up ``source``: a database directory (opened read-only with ``config``, or its
    ``PATH.key``) or an encrypted SQLite file (opened with ``keyring``)."""
    path = os.path.abspath(os.fspath(source))
    w = _Writer(repo, progress)
    with repo.lock(exclusive=False):
        repo.forget_chunks()  # list the chunks now, under the lock
        try:
            if os.path.isdir(path):
                body = _backup_db(path, config, w)
                nbytes = sum(p["bytes"] for t in body["tables"] for p in t["parts"])
                nfiles = sum(len(t["parts"]) for t in body["tables"])
            elif os.path.isfile(path):
                if not _is_cryptdisk_file(path):
                    raise BackupError(
                        f"{path} is not encrypted (no cryptdisk header): backups are of "
                        "cryptdisk databases (a directory) and encrypted SQLite databases",
                        hint="encrypt a plain SQLite database first: cryptdisk sqlite "
                        "encrypt SRC DST")
                if keyring is None:
                    raise BackupError(f"{path} is a file: back up an encrypted SQLite "
                                      "database with its keyring",
                                      hint="--config CONFIG or --key-file FILE")
                body = _backup_sqlite(path, keyring, w)
                nbytes, nfiles = body["file"]["bytes"], 1
            else:
                raise BackupError(f"nothing to back up at {path}")
            w.finish()  # every chunk durable before the manifest names it
        finally:
            w.close()
        ids = repo.manifest_ids()
        prev = None
        if ids:
            prev = {"id": ids[-1],
                    "sha256": hashlib.sha256(repo.manifest_blob(ids[-1])).hexdigest()}
        backup_id = repo.new_backup_id()
        nchunks = sum(1 for _c in _manifest_chunks(body))  # this attempt's, not retries'
        doc = {"id": backup_id, "time": _dt.datetime.now(_dt.UTC).isoformat(),
               "source": path, "prev": prev, "bytes": nbytes, "chunks": nchunks,
               "new_chunks": w.new, "stored_bytes": w.stored, **body}
        repo.write_manifest(doc)  # last: the backup exists once this is published
    blob = repo.manifest_blob(backup_id)
    return BackupSummary(backup_id, body["kind"], path, nfiles, nbytes, nchunks, w.new,
                         w.stored + len(blob), w.reused)


def list_backups(repo: Repository) -> list[dict[str, Any]]:
    """Every backup, oldest first; one whose manifest does not authenticate is listed with
    an ``error`` (``verify`` says more)."""
    out: list[dict[str, Any]] = []
    for bid in repo.manifest_ids():
        try:
            blob = repo.manifest_blob(bid)
            m = repo.read_manifest(bid, blob)
        except BackupError as exc:
            out.append({"id": bid, "error": str(exc)})
            continue
        row = {k: m.get(k) for k in ("id", "time", "kind", "source", "bytes", "chunks",
                                     "new_chunks", "stored_bytes", "catalog_version")}
        # the manifest records its chunks' bytes; it is stored too (as create reports)
        if isinstance(row["stored_bytes"], int):
            row["stored_bytes"] += len(blob)
        out.append(row)
    return out


def find_backup(repo: Repository, ref: str,
                source: str | os.PathLike[str] | None = None) -> str:
    """The id ``ref`` names: an id, ``latest``, or ``@TIME`` (ISO 8601, UTC unless it says
    otherwise): the newest backup taken at or before TIME.

    ``source`` (a path as :func:`list_backups` shows it, or relative to the working
    directory) limits ``latest`` and ``@TIME`` to that source's backups, and checks that an
    id is one of them. ``latest`` or ``@TIME`` without ``source`` in a repository holding
    backups of more than one source is refused, naming the sources.
    """
    ids = repo.manifest_ids()
    path = None if source is None else os.path.abspath(os.fspath(source))
    by_time = ref == "latest" or ref.startswith("@")
    if path is not None or by_time:
        sources = _sources(repo, ids)
        if path is not None:
            if path not in sources:
                raise BackupError(f"no backup of {path} in {repo.url} "
                                  f"(sources: {', '.join(sources) or 'none'})")
            ids = sources[path]
        elif len(sources) > 1:
            raise BackupError(
                f"{repo.url} holds backups of {len(sources)} sources "
                f"({', '.join(sources)}): {ref!r} does not say which",
                hint="name one with --source PATH (as 'backup list' shows it), or give a "
                "backup id")
    if by_time:
        if not ids:
            raise BackupError(f"{repo.url} has no backups")
        if ref == "latest":
            return ids[-1]
        try:
            when = _dt.datetime.fromisoformat(ref[1:])
        except ValueError:
            raise BackupError(f"{ref!r}: expected @TIME in ISO 8601, e.g. "
                              "@2026-12-01T20:00") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.UTC)
        best = None
        for bid in ids:
            if _dt.datetime.fromisoformat(repo.read_manifest(bid)["time"]) <= when:
                best = bid
        if best is None:
            raise BackupError(f"no backup was taken at or before {when.isoformat()} "
                              f"(the first: {ids[0]})")
        return best
    if ref not in ids:
        if path is not None and ref in repo.manifest_ids():
            raise BackupError(f"backup {ref} is not of {path}")
        raise BackupError(f"no backup {ref!r} in {repo.url} "
                          f"(backups: {', '.join(ids) or 'none'})")
    return ref


def _sources(repo: Repository, ids: list[str]) -> dict[str, list[str]]:
    """The path of each source backed up -> its backup ids, oldest first (manifests that
    do not authenticate are left out: ``verify`` names them)."""
    out: dict[str, list[str]] = {}
    for bid in ids:
        try:
            src = repo.read_manifest(bid).get("source")
        except BackupError:
            continue
        out.setdefault(str(src), []).append(bid)
    return out


def _manifest_chunks(m: dict[str, Any]) -> Iterable[str]:
    if m.get("kind") == "sqlite":
        yield from m["file"]["chunks"]
    else:
        for t in m.get("tables", []):
            for p in t["parts"]:
                yield from p["chunks"]


@dataclass
class VerifyReport:
    backups: int = 0
    chunks_checked: int = 0
    chunks_referenced: int = 0
    bad_manifests: dict[str, str] = field(default_factory=dict)
    chain_breaks: list[str] = field(default_factory=list)
    problems: dict[str, tuple[str, list[str]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.bad_manifests or self.chain_breaks or self.problems)


def verify(repo: Repository, *, sample: float | None = None) -> VerifyReport:
    """Authenticate every manifest, their chain, and every chunk they name (or ``sample``
    percent of the chunks, chosen at random) without restoring anything."""
    report = VerifyReport()
    users: dict[str, list[str]] = {}
    ids = repo.manifest_ids()
    digests = {}
    for bid in ids:
        try:
            digests[bid] = hashlib.sha256(repo.manifest_blob(bid)).hexdigest()
            m = repo.read_manifest(bid)
        except BackupError as exc:
            report.bad_manifests[bid] = str(exc)
            continue
        report.backups += 1
        if m.get("id") != bid:
            report.bad_manifests[bid] = f"the manifest says it is backup {m.get('id')}"
        prev = m.get("prev")
        if prev and prev["id"] in digests and digests[prev["id"]] != prev["sha256"]:
            report.chain_breaks.append(f"backup {bid} chains to a different {prev['id']} "
                                       "than the one stored")
        for name in _manifest_chunks(m):
            users.setdefault(name, [])
            if not users[name] or users[name][-1] != bid:
                users[name].append(bid)
    names = sorted(users)
    report.chunks_referenced = len(names)
    if sample is not None:
        if not 0 < sample <= 100:
            raise BackupError(f"--sample must be a percentage in (0, 100], not {sample}")
        k = max(1, round(len(names) * sample / 100)) if names else 0
        names = sorted(random.SystemRandom().sample(names, k))
    for name in names:
        got = repo.check_chunk(name)
        report.chunks_checked += 1
        if isinstance(got, ChunkProblem):
            report.problems[name] = (got.problem, users[name])
    return report


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def restore(repo: Repository, backup_id: str, target: str | os.PathLike[str], *,
            config: Any = None, keyring: Keyring | None = None,
            tables: list[str] | None = None, replace: bool = False,
            progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Restore backup ``backup_id`` into ``target``, which must not exist unless
    ``replace`` (``--force``); its directory must exist.

    A database is created with ``config`` (or a new key in ``TARGET.key``, then named by
    the result's ``key``) and checked
    with :meth:`Database.check`; a SQLite database is encrypted under ``keyring``. Both are
    built beside TARGET and renamed to it when complete. ``progress(n)`` is called after
    each part of a database is written, and with 1 before a SQLite database is renamed.

    The restore holds ``TARGET.restoring.lock`` (another restore to TARGET meanwhile
    fails) and first deletes the ``TARGET.restoring-<id>`` work of killed restores.

    ``replace`` replaces an existing TARGET of the backup's kind that nothing uses (see
    :mod:`._replace`): the restored database takes its place in one atomic step (a
    directory swap, a file rename), then the old one is deleted. A database restored
    without ``config`` over one with a ``TARGET.key`` is encrypted under that key.
    """
    dest = target_path(target)
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.lexists(parent) else "does not exist"
        raise BackupError(f"cannot restore to {os.fspath(target)}: its directory {parent} "
                          f"{what}", hint="check the path, or create the directory first "
                          "(a restore creates no directories)")
    discard = None if config is None else (lambda path: _discard_parts(path, config))
    with restore_lock(dest, discard=discard):
        return _restore_locked(repo, backup_id, dest, config, keyring, tables, replace,
                               progress)


def _restore_locked(repo: Repository, backup_id: str, dest: str, config: Any,
                    keyring: Keyring | None, tables: list[str] | None, replace: bool,
                    progress: Callable[[int], None] | None) -> dict[str, Any]:
    m = repo.read_manifest(backup_id)
    kind = "sqlite" if m.get("kind") == "sqlite" else "db"
    if kind == "sqlite":
        if keyring is None:
            raise BackupError("restoring a SQLite backup needs a keyring to encrypt it under",
                              hint="--config CONFIG or --key-file FILE")
        if tables:
            raise BackupError("--table filters tables of a database backup, not SQLite")
    old = None
    if os.path.lexists(dest):
        if not replace:
            raise BackupError(f"{dest} exists; a restore does not replace it unless told to",
                              hint="restore into a new path, or replace it with --force "
                              "(Python: replace=True): the restored database takes its "
                              "place atomically and the old one is deleted")
        if kind == "db" and os.path.isdir(dest) and not os.path.islink(dest):
            check_outside(dest, _kept_paths(repo, config))
        old = open_target(dest, kind, backup_id)
    try:
        if kind == "sqlite":
            assert keyring is not None
            return _restore_sqlite(repo, m, dest, keyring, progress, old)
        return _restore_db(repo, m, dest, config, tables, progress, old, replace)
    finally:
        if old is not None:
            old.release()


def _kept_paths(repo: Repository, config: Any) -> list[tuple[str, str]]:
    """The local directories a restore must not delete with the database it replaces: the
    backup repository's, and those of the config's local disks (where the restored
    database's parts go)."""
    out = []
    if repo.local:
        out.append(("the backup repository", repo.root))
    if config is not None:
        for disk in config.disks.values():
            while disk is not None:
                if isinstance(disk, LocalDisk):
                    out.append((f"disk {disk.name!r}", disk.root))
                disk = getattr(disk, "inner", None)
    return out


def _remove_sqlite(dest: str) -> None:
    for suffix in ("", "-wal", "-journal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dest + suffix)


def _new_sqlite(dest: str, keyring: Keyring, sqlite_connect: Any) -> Any:
    try:
        return sqlite_connect(dest, keyring=keyring)
    except BaseException:
        _remove_sqlite(dest)
        raise


def _replace_file(tmp: str, dest: str) -> None:
    os.replace(tmp, dest)  # atomic: TARGET is the old file or the new one


def _restore_sqlite(repo: Repository, m: dict[str, Any], dest: str, keyring: Keyring,
                    progress: Callable[[int], None] | None = None,
                    old: Replaced | None = None) -> dict[str, Any]:
    """Write the database as ``TARGET.restoring-<id>`` (mode 0600, or the mode of the file
    it replaces), check it, then rename it to TARGET (``progress(1)`` just before): a
    killed restore never leaves a partial TARGET."""
    from ..sqlite import connect as sqlite_connect

    f = m["file"]
    tmp = work_path(dest)
    pool = ThreadPoolExecutor(_Writer.WORKERS, thread_name_prefix="cryptdisk-restore")
    stream = _ChunkStream(repo, pool, f["chunks"])
    try:
        h = _Hashing(stream)
        try:
            write_image(h, tmp, keyring, 0o600 if old is None else old.mode)
        finally:
            stream.close()
            pool.shutdown(wait=True, cancel_futures=True)
        if h.size != f["bytes"] or h.sha.hexdigest() != f["sha256"]:
            raise BackupAuthenticationError("the database: the restored bytes do not match "
                                            "the manifest's SHA-256")
        dst = _new_sqlite(tmp, keyring, sqlite_connect)
        try:
            if m.get("wal"):
                dst.execute("PRAGMA journal_mode=WAL")
            ok = dst.execute("PRAGMA integrity_check").fetchall()
        finally:
            dst.close()  # the last connection: SQLite checkpoints and removes the WAL
        if ok != [("ok",)]:
            raise BackupError(f"{dest}: the restored database fails integrity_check: "
                              f"{ok[:3]}")
        if os.path.exists(tmp + "-wal"):
            raise BackupError(f"{tmp}: SQLite left a WAL file after closing the restored "
                              "database")
        if progress is not None:
            progress(1)
        if old is not None:
            settled = settle_sqlite(dest, keyring)  # its WAL, hot journal: into the file
            with holding_sqlite(dest, settled):  # opened during the restore: leave it be
                _replace_file(tmp, dest)
        else:
            if os.path.lexists(dest):
                raise BackupError(f"{dest} appeared during the restore; restore into a new "
                                  "path")
            os.rename(tmp, dest)
        _sync_parent(dest)
    except BaseException:
        _remove_sqlite(tmp)
        raise
    out = {"kind": "sqlite", "path": dest, "bytes": f["bytes"]}
    if old is not None:
        out["replaced"] = True
    return out


def _sync_parent(path: str) -> None:
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _ChunkStream:
    """A part's bytes, read from its chunks: up to ``AHEAD`` chunks are fetched,
    authenticated and decompressed ahead on the restore's threads (AES-GCM, zstd, SHA-256
    and object-store reads release the GIL)."""

    AHEAD = 32

    def __init__(self, repo: Repository, pool: ThreadPoolExecutor, chunks: list[str]) -> None:
        self._repo, self._pool = repo, pool
        self._names = iter(chunks)
        self._queue: deque[Future[bytes]] = deque()
        self._buf = memoryview(b"")
        self._fill()

    def _fill(self) -> None:
        while len(self._queue) < self.AHEAD:
            name = next(self._names, None)
            if name is None:
                return
            self._queue.append(self._pool.submit(self._repo.get_chunk, name, check_name=False))

    def read(self, n: int = -1) -> bytes:
        if not self._buf:
            if not self._queue:
                return b""
            chunk = self._queue.popleft().result()
            self._fill()
            if n < 0 or n >= len(chunk):
                return chunk  # the whole chunk: no copy
            self._buf = memoryview(chunk)
        out = self._buf if n < 0 else self._buf[:n]
        self._buf = self._buf[len(out):]
        return bytes(out)

    def close(self) -> None:
        for f in self._queue:
            f.cancel()
        self._queue.clear()


def _create_table(db: Database, t: dict[str, Any]) -> None:
    cols = ", ".join(f"{_quote(n)} {typ}" for n, typ in t["columns"])
    sql = f"CREATE TABLE {_quote(t['name'])} ({cols})"
    if t.get("order_by"):
        sql += " ORDER BY (" + ", ".join(_quote(c) for c in t["order_by"].split(",")) + ")"
    if t["policy"] != "default":
        sql += f" SETTINGS storage_policy = '{t['policy']}'"
    db.sql(sql)


def _restore_table(repo: Repository, pool: ThreadPoolExecutor, db: Database,
                   t: dict[str, Any], progress: Callable[[int], None] | None,
                   counted: list[int]) -> int:
    """Import the table's parts as they are (no decoding), then check each against the
    manifest (SHA-256, size, rows); a mismatch fails the restore, which removes TARGET."""
    streams: list[_ChunkStream] = []
    read: list[_Hashing] = []  # what import_parts read of each part (its SHA-256 and size)

    def sources() -> Iterable[_Hashing]:
        for p in t["parts"]:
            stream = _ChunkStream(repo, pool, p["chunks"])
            streams.append(stream)
            read.append(_Hashing(stream))
            yield read[-1]
            counted.append(p["rows"])
            if progress is not None:
                progress(len(counted))

    try:
        rows = db.import_parts(t["name"], sources())
    finally:
        for s in streams:
            s.close()
    got = db.table(t["name"]).parts[-len(t["parts"]):] if t["parts"] else []
    for i, (p, part, h) in enumerate(zip(t["parts"], got, read, strict=True)):
        if ((h.sha.hexdigest(), h.size, part.bytes, part.rows)
                != (p["sha256"], p["bytes"], p["bytes"], p["rows"])
                or part.sha256 not in ("", p["sha256"])):
            raise BackupAuthenticationError(
                f"table {t['name']} part {i}: the restored bytes do not match the manifest "
                "(SHA-256, size or rows)")
    return rows


def _publish_dir(tmp: str, dest: str, tmp_key: str | None, key_file: str,
                 old: Replaced | None, reuse_key: bool) -> None:
    """Move a finished restore from ``tmp`` to ``dest`` (its key first: a kill in between
    leaves the key and no database, never a database without its key). Replacing ``old``,
    swap the two directories in one step (the old one is then at ``tmp``); the key is
    ``dest``'s own (``reuse_key``) or none (a config's)."""
    if old is not None:
        exchange(tmp, dest)
        if not old.is_at(tmp):  # TARGET was moved away and another put there meanwhile
            exchange(tmp, dest)  # it goes back; the restored work is deleted
            raise BackupError(f"{dest} is not the database checked when the restore began "
                              "(it was moved or replaced meanwhile): it is left as it is",
                              hint="restore again")
        _sync_parent(dest)
        if tmp_key is not None:
            os.unlink(tmp_key)  # a second link to TARGET.key
        return
    if reuse_key:  # TARGET.key, kept, and no TARGET
        assert tmp_key is not None
        os.rename(tmp, dest)
        os.unlink(tmp_key)
        _sync_parent(dest)
        return
    if os.path.lexists(dest):
        raise BackupError(f"{dest} appeared during the restore; restore into a new path")
    if tmp_key is not None:
        try:
            os.link(tmp_key, key_file)  # never over a key file that appeared meanwhile
        except FileExistsError:
            raise BackupError(f"{key_file} appeared during the restore; restore into a "
                              "new path") from None
        os.unlink(tmp_key)
    os.rename(tmp, dest)
    _sync_parent(dest)


def _discard_parts(path: str, config: Any) -> None:
    """Delete the files that the unfinished restore in ``path`` wrote on ``config``'s disks
    (outside ``path``): its tables are dropped and its abandoned files collected. Best
    effort: a directory that does not open under ``config`` (a killed restore under another
    config) is left to the caller's ``rmtree``."""
    if not os.path.isfile(os.path.join(path, "catalog")):  # the database's catalog file
        return  # no table yet, so no part
    try:
        db = Database(path, config)
    except (CryptdiskError, OSError) as exc:
        log.warning("cryptdisk: could not open the unfinished restore %s to delete its parts "
                    "on the config's disks: %s", path, exc)
        return
    try:
        for name in list(db.catalog.tables):
            db.sql(f"DROP TABLE {_quote(name)}")
        db.collect_garbage(unversioned=True)
    except (CryptdiskError, OSError) as exc:
        log.warning("cryptdisk: could not delete the parts of the unfinished restore %s: %s",
                    path, exc)
    finally:
        db.close()


def _remove_replaced(path: str, config: Any) -> None:
    """Delete the replaced database, now at ``path`` (its parts on ``config``'s disks
    too). A kill meanwhile leaves it under a work-in-progress name, which the next restore
    to TARGET deletes."""
    if config is not None:
        _discard_parts(path, config)
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        log.warning("cryptdisk: could not delete all of the replaced database, now at %s",
                    path)


def _restore_db(repo: Repository, m: dict[str, Any], dest: str, config: Any,
                only: list[str] | None,
                progress: Callable[[int], None] | None = None,
                old: Replaced | None = None, replace: bool = False) -> dict[str, Any]:
    """Restore into ``TARGET.restoring-<id>`` beside TARGET, check it, then rename it to
    TARGET: a killed restore never leaves a partial TARGET."""
    known = {t["name"] for t in m["tables"]}
    for name in only or []:
        if name not in known:
            raise BackupError(f"backup {m['id']} has no table {name!r} "
                              f"(tables: {', '.join(sorted(known)) or 'none'})")
    key_file = dest + ".key"
    reuse_key = replace and config is None and os.path.lexists(key_file)
    if old is not None and config is None and not reuse_key:
        raise BackupError(f"{dest} has no {key_file}: it is opened under a config, and "
                          "the restore replacing it takes its keys from the same place",
                          hint="give its --config")
    if config is None and os.path.lexists(key_file) and not reuse_key:
        raise BackupError(f"{key_file} exists: a restore without --config makes a new key "
                          "there", hint="restore into a new path, or remove the key file if "
                          "it belongs to no database (a restore killed while publishing "
                          "leaves one)")
    tmp = work_path(dest)
    tmp_key = tmp + ".key" if config is None else None
    rows = 0
    counted: list[int] = []
    try:
        if reuse_key:  # the database replaced keeps its key file: only TARGET changes
            assert tmp_key is not None
            os.link(key_file, tmp_key)
        elif tmp_key is not None:  # made here, so no notice names the work-in-progress path
            write_key_file(tmp_key, Key.generate(1))
        db = Database(tmp, config)
        pool = ThreadPoolExecutor(_Writer.WORKERS, thread_name_prefix="cryptdisk-restore")
        try:
            for t in m["tables"]:
                if only and t["name"] not in only:
                    continue
                _create_table(db, t)
                rows += _restore_table(repo, pool, db, t, progress, counted)
            db.check()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            db.close()
        _publish_dir(tmp, dest, tmp_key, key_file, old, reuse_key)
    except BaseException:
        # leave nothing half-restored behind: under a config, the parts lie on its disks
        if config is not None:
            _discard_parts(tmp, config)
        shutil.rmtree(tmp, ignore_errors=True)
        if tmp_key is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_key)
        raise
    if old is not None:
        old.release()  # the old LOCK, now at tmp: its writers' lock, dropped to delete it
        _remove_replaced(tmp, config)
    out: dict[str, Any] = {"kind": "db", "path": dest, "rows": rows}
    if old is not None:
        out["replaced"] = True
    if tmp_key is not None and not reuse_key:
        out["key"] = key_file  # a new key: the caller tells the user to back it up
    return out


def _backup_time(backup_id: str) -> _dt.datetime:
    try:
        return _dt.datetime.strptime(backup_id[:23], "%Y%m%dT%H%M%S.%fZ").replace(
            tzinfo=_dt.UTC)
    except ValueError:
        raise BackupError(f"{backup_id!r} is not a backup id this version wrote") from None


def retained(ids: list[str], *, keep_last: int = 0, keep_daily: int = 0,
             keep_weekly: int = 0, keep_monthly: int = 0) -> list[str]:
    """The backups (ids sort by time) that the rules keep: the newest ``keep_last``, and the
    newest backup of each of the newest ``keep_daily`` days, ``keep_weekly`` ISO weeks and
    ``keep_monthly`` months that have backups (UTC)."""
    if min(keep_last, keep_daily, keep_weekly, keep_monthly) < 0 or not any(
            (keep_last, keep_daily, keep_weekly, keep_monthly)):
        raise BackupError("give at least one retention rule of 1 or more (--keep-last, "
                          "--keep-daily, --keep-weekly, --keep-monthly)")
    newest_first = sorted(ids, reverse=True)
    keep = set(newest_first[:keep_last])
    buckets: list[tuple[int, Callable[[_dt.datetime], object]]] = [
        (keep_daily, lambda t: t.date()),
        (keep_weekly, lambda t: t.isocalendar()[:2]),
        (keep_monthly, lambda t: (t.year, t.month))]
    for n, bucket in buckets:
        seen: set[object] = set()
        for bid in newest_first:
            if len(seen) >= n:
                break
            b = bucket(_backup_time(bid))
            if b not in seen:
                seen.add(b)
                keep.add(bid)
    return [i for i in ids if i in keep]


def prune(repo: Repository, *, keep_last: int = 0, keep_daily: int = 0,
          keep_weekly: int = 0, keep_monthly: int = 0, break_lock: bool = False,
          progress: Callable[[int], None] | None = None) -> tuple[list[str], int]:
    """Delete the backups no retention rule keeps (see :func:`retained`), then every chunk
    no remaining manifest names. Returns (deleted backup ids, deleted chunks).
    The rules apply to each source (kind and path backed up) apart, as restic groups
    snapshots by paths: one database's backups never crowd out another's.
    ``progress(n)`` is called with 0 once the dropped manifests are deleted, then after
    each chunk deletion with the count so far.
    ``break_lock`` first deletes the lock markers that killed processes left on an
    object store."""
    rules = {"keep_last": keep_last, "keep_daily": keep_daily, "keep_weekly": keep_weekly,
             "keep_monthly": keep_monthly}
    retained([], **rules)  # the rules are valid before anything is touched
    if break_lock:
        repo.break_locks()
    with repo.lock(exclusive=True):
        ids = repo.manifest_ids()
        # read before deleting anything: an unreadable manifest stops us
        manifests = {bid: repo.read_manifest(bid) for bid in ids}
        sources: dict[tuple[Any, Any], list[str]] = {}
        for bid in ids:
            m = manifests[bid]
            sources.setdefault((m.get("kind"), m.get("source")), []).append(bid)
        keep = {bid for group in sources.values() for bid in retained(group, **rules)}
        drop = [i for i in ids if i not in keep]
        referenced: set[str] = set()
        for bid in keep:
            referenced.update(_manifest_chunks(manifests[bid]))
        for bid in drop:
            repo.delete_manifest(bid)
        repo.remove_temporaries()
        deleted = 0
        if progress is not None:
            progress(0)  # the manifests are gone, no chunk yet
        for name in sorted(repo.chunk_names() - referenced):
            repo.delete_chunk(name)
            deleted += 1
            if progress is not None:
                progress(deleted)
    return drop, deleted

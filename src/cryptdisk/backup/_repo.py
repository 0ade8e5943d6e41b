"""A backup repository on any fsspec target: its layout, chunks, manifests and lock.

Layout under the repository's root::

    config                 JSON: format, id, chunker sizes, key wrappings (public)
    chunks/ab/<name>       nonce | AES-256-GCM(zstd(chunk)), name = HMAC-SHA-256(chunk)
    manifests/<backup id>  nonce | AES-256-GCM(zstd(JSON manifest))
    lock                   local: held (flock) by create (shared) and prune (exclusive)
    locks/<kind>-<id>      elsewhere: markers of running creates and prunes (refreshed;
                           stale after 30 minutes or when their process is gone)

Every object is written whole and published in one step (a rename on a local
directory, a single PUT on an object store), chunks before the manifest that
names them, so an interrupted backup leaves only unreferenced chunks.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import hashlib
import json
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import zstandard
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from fsspec.implementations.local import LocalFileSystem

from .. import _json
from .._durable import fsync_path
from .._flocks import exclusive, hold, let_go
from ..disks import check_storage_options, check_url
from ..errors import BackupAuthenticationError, BackupError
from ..keys import Keyring
from . import _chunker
from ._keys import RepoKeys, check_passphrase, describe, unlock, wrap_with_key, wrap_with_passphrase

__all__ = ["ChunkProblem", "Repository"]

FORMAT = 1
#: zstd level of chunks and manifests. Level 1 stores about 1% more than level 3 on a
#: database's (LZ4) Parquet parts and compresses about 5x faster, decompresses faster too.
ZSTD_LEVEL = 1


def _private_dirs(path: str) -> None:
    """``os.makedirs(path)``, each directory it makes mode 0700 (``makedirs`` gives the
    intermediate ones the umask's mode)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent and parent != path:
        _private_dirs(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)


def _write_synced(tmp: str, data: bytes) -> None:
    """Write ``data`` to the new file ``tmp`` (owner only; it must not exist) and sync it,
    before it is published under its name."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@dataclass
class ChunkProblem:
    name: str
    problem: str  # "missing", "tampered", "truncated"


#: fsspec protocols whose first path component is a bucket (or container) that
#: ``makedirs`` would create.
_BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl"})


def _missing_bucket(fs: Any, root: str) -> str | None:
    """The bucket of ``root`` if ``fs`` is an object store with buckets and it has none of
    that name, else None."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    if not _BUCKET_PROTOCOLS.intersection(protocols):
        return None
    bucket = root.strip("/").split("/", 1)[0]
    if hasattr(fs, "call_s3"):
        # S3: HEAD the bucket; 404 is missing, 403 a bucket these credentials may not
        # list but may still write (whatever fails next names its own error).
        try:
            fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return bucket
        except PermissionError:
            return None
        return None
    return None if fs.exists(bucket) else bucket


#: link() errors of a file system without hard links (FAT, exFAT, some SMB shares)
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})


def _claim_and_rename(root: str, tmp: str, path: str, taken: BackupError) -> None:
    """Publish ``tmp`` as ``path`` unless ``path`` exists, where link() cannot: the
    directory ``root/.init`` is made (mkdir is atomic and never overwrites), ``path`` is
    checked not to exist, ``tmp`` renamed to it, and the claim removed. An init that
    finds the claim, or ``path`` once it holds it, raises ``taken``."""
    claim = os.path.join(root, ".init")
    try:
        os.mkdir(claim, 0o700)
    except FileExistsError:
        raise taken from None
    try:
        if os.path.lexists(path):
            raise taken from None
        os.rename(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(claim)


class Repository:
    """An open (unlocked) backup repository. Use :meth:`init` or :meth:`open`."""

    def __init__(self, url: str, fs: Any, root: str, config: dict[str, Any],
                 master: bytes) -> None:
        keys = RepoKeys.derive(master)
        self._master = master
        self.url = url
        self.fs = fs
        self.root = root.rstrip("/")
        self.config = config
        self.keys = keys
        self._aead_chunk = AESGCM(keys.chunk)
        self._aead_manifest = AESGCM(keys.manifest)
        self._known: set[str] | None = None
        self._claimed: set[str] = set()
        self._dirty_dirs: set[str] = set()  # local: directories whose entries await fsync
        self._local = isinstance(fs, LocalFileSystem)

    def __repr__(self) -> str:
        return f"<cryptdisk.backup.Repository {self.url!r} id={self.id}>"

    def __reduce__(self) -> Any:
        raise TypeError("a backup Repository cannot be pickled; open it in the other process")

    @property
    def local(self) -> bool:
        """Whether the repository is a local directory (then ``root`` is its OS path)."""
        return self._local

    @property
    def id(self) -> str:
        return str(self.config["id"])

    # -- opening ----------------------------------------------------------------

    @staticmethod
    def _fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
        # The URL is in every message, the repr and the command line: no credentials in it
        # (ConfigError, which never quotes it), nor in the options fsspec caches.
        check_url(url, "the repository URL")
        check_storage_options(storage_options or {})
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        return fs, root

    @classmethod
    def init(cls, url: str, *, passphrase: str | None = None, keyring: Keyring | None = None,
             storage_options: dict[str, Any] | None = None,
             kdf_params: dict[str, int] | None = None,
             create_bucket: bool = False) -> Repository:
        """Create a repository at ``url`` (an empty or new location) with a new key.

        On an object store with buckets (``s3://``, ``gs://``, ``az://``, ...) a missing
        bucket is refused (a typo in its name would otherwise make a new bucket) unless
        ``create_bucket``."""
        check_passphrase(passphrase)
        if passphrase is None and keyring is None:
            raise BackupError("a new repository needs a passphrase or a keyring key to wrap "
                              "its key", hint="--passphrase-env VAR or --repo-keyring CONFIG")
        fs, root = cls._fs(url, storage_options)
        bucket = _missing_bucket(fs, root)
        if bucket is not None:
            if not create_bucket:
                raise BackupError(f"{url}: bucket {bucket} does not exist",
                                  hint="check the bucket's name, or create it with "
                                  "--create-bucket (Python: create_bucket=True)")
            try:
                fs.mkdir(bucket)
            except OSError as exc:  # the store's own words (S3: "The specified bucket is
                # not valid."), which name no bucket
                hint = None
                if exc.errno == errno.EINVAL:
                    hint = "check the bucket's name" + (
                        " (S3: 3 to 63 lowercase letters, digits, dots and hyphens, "
                        "starting and ending with a letter or digit)"
                        if hasattr(fs, "call_s3") else "")
                raise BackupError(f"{url}: cannot create bucket {bucket}: "
                                  f"{exc.strerror or exc}", hint=hint) from None
        if fs.exists(root) and not fs.isdir(root):
            raise BackupError(f"{url} is a file, not a directory: a backup repository is a "
                              "directory", hint="give a new path or an empty directory")
        if fs.exists(f"{root}/config"):
            raise BackupError(f"{url} is already a backup repository")
        if fs.exists(root) and fs.isdir(root) and fs.ls(root, detail=False):
            raise BackupError(f"{url} is not empty; a new repository needs an empty location")
        master = os.urandom(32)
        repo_id = uuid.uuid4().hex
        wrappings = []
        if passphrase is not None:
            wrappings.append(wrap_with_passphrase(master, repo_id, passphrase, kdf_params))
        if keyring is not None:
            wrappings.append(wrap_with_key(master, repo_id, keyring))
        keys = RepoKeys.derive(master)
        config: dict[str, Any] = {
            "format": FORMAT, "id": repo_id,
            "chunker": {"algorithm": "fastcdc2020", "avg": _chunker.AVG_SIZE,
                        "min": _chunker.MIN_SIZE, "max": _chunker.MAX_SIZE},
            "wrappings": wrappings}
        config["params_mac"] = keys.params_mac(cls._params_doc(config))
        if isinstance(fs, LocalFileSystem):
            _private_dirs(root)  # 0700 where made here: chunk names and sizes stay private
        else:
            with contextlib.suppress(FileExistsError):
                fs.makedirs(root, exist_ok=True)
        repo = cls(url, fs, root, config, master)
        repo._create_config()
        return repo

    @staticmethod
    def _params_doc(config: dict[str, Any]) -> bytes:
        return json.dumps({"format": config["format"], "id": config["id"],
                           "chunker": config["chunker"]}, sort_keys=True).encode()

    @classmethod
    def read_config(cls, url: str, storage_options: dict[str, Any] | None = None
                    ) -> tuple[Any, str, dict[str, Any]]:
        fs, root = cls._fs(url, storage_options)
        try:
            raw = fs.cat_file(f"{root}/config")
        except FileNotFoundError:
            raise BackupError(f"{url} is not a backup repository (no config)",
                              hint="create one with 'cryptdisk backup init'") from None
        except NotADirectoryError:
            raise BackupError(f"{url} is a file, not a backup repository (a directory)",
                              hint="give the repository's directory (or URL)") from None
        config = check_config(raw, url)
        return fs, root, config

    @classmethod
    def open(cls, url: str, *, passphrase: str | None = None, keyring: Keyring | None = None,
             storage_options: dict[str, Any] | None = None) -> Repository:
        """Open the repository at ``url`` with its passphrase or a keyring key that wraps it."""
        check_passphrase(passphrase)
        fs, root, config = cls.read_config(url, storage_options)
        master = unlock(config["wrappings"], config["id"], passphrase=passphrase,
                        keyring=keyring)
        keys = RepoKeys.derive(master)
        if config.get("params_mac") != keys.params_mac(cls._params_doc(config)):
            raise BackupAuthenticationError(f"{url}: the repository config was tampered "
                                            "with (its parameters do not match their MAC)")
        return cls(url, fs, root, config, master)

    def _write_config(self) -> None:
        self._put(f"{self.root}/config",
                  json.dumps(self.config, indent=1, sort_keys=True).encode())

    def _create_config(self) -> None:
        """Publish the new repository's config unless one is there: of two inits at once,
        one makes the repository and the other fails (each had found the location empty).
        Local: a synced temporary file hard-linked to ``config`` (no overwrite; on a file
        system without hard links, renamed under a claim, :func:`_claim_and_rename`); S3: a
        conditional PUT (``If-None-Match``); other stores: one PUT (no such check)."""
        path = f"{self.root}/config"
        data = json.dumps(self.config, indent=1, sort_keys=True).encode()
        taken = BackupError(f"{self.url} is already a backup repository (another init made "
                            "it meanwhile)")
        if isinstance(self.fs, LocalFileSystem):
            tmp = os.path.join(self.root, f".tmp-{uuid.uuid4().hex}")
            try:
                _write_synced(tmp, data)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise taken from None
                except OSError as exc:
                    if exc.errno not in _NO_HARD_LINKS:
                        raise
                    _claim_and_rename(self.root, tmp, path, taken)
            finally:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            fsync_path(self.root)
            self._sync_dirty()
            return
        protocol = self.fs.protocol
        if "s3" not in (protocol if isinstance(protocol, tuple) else (protocol,)):
            self.fs.pipe_file(path, data)
            return
        try:
            self.fs.pipe_file(path, data, mode="create")
        except Exception as exc:
            try:
                there = self.fs.cat_file(path)
            except FileNotFoundError:
                raise exc from None  # not published: the store's own error
            if there != data:
                raise taken from None

    def add_wrapping(self, *, passphrase: str | None = None,
                     keyring: Keyring | None = None,
                     kdf_params: dict[str, int] | None = None) -> None:
        """Wrap the repository key under another passphrase or keyring key too.

        The config is read again and rewritten under a lock (local: ``flock`` on the
        repository directory; S3: a PUT conditional on the ETag read, tried again when
        another writer changed it), so wrappings added at once are all kept; other stores:
        compared before the write and read back after (see :meth:`_update_unconditional`)."""
        check_passphrase(passphrase)
        if passphrase is None and keyring is None:
            raise BackupError("give a passphrase or a keyring key to add")
        new: list[dict[str, Any]] = []
        if passphrase is not None:  # Argon2id outside the lock
            new.append(wrap_with_passphrase(self._master, self.id, passphrase, kdf_params))
        check = kid = None
        if keyring is not None:
            check, kid = keyring.current_key().check_value.hex(), keyring.current_key_id
            new.append(wrap_with_key(self._master, self.id, keyring))

        def change(config: dict[str, Any]) -> None:
            if check is not None and any(w.get("check") == check
                                         for w in config["wrappings"]):
                raise BackupError(f"keyring key id {kid} already wraps this repository's "
                                  "key")
            config["wrappings"].extend(new)

        self._update_config(change)

    def _fresh_config(self, raw: bytes) -> dict[str, Any]:
        config = check_config(raw, self.url)
        if (config["id"] != self.id
                or config.get("params_mac") != self.keys.params_mac(self._params_doc(config))):
            raise BackupError(f"{self.url}: the repository config was replaced by another "
                              "repository's meanwhile")
        return config

    def _update_config(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Read the config again, apply ``change``, write it, with no other update between."""
        path = f"{self.root}/config"

        def encode(config: dict[str, Any]) -> bytes:
            return json.dumps(config, indent=1, sort_keys=True).encode()

        if isinstance(self.fs, LocalFileSystem):
            with exclusive(self.root, os.O_RDONLY | os.O_DIRECTORY):  # (a forked child
                config = self._fresh_config(self.fs.cat_file(path))  # closes its copy)
                change(config)
                self.config = config
                self._write_config()
            return
        protocol = self.fs.protocol
        if "s3" not in (protocol if isinstance(protocol, tuple) else (protocol,)):
            self._update_unconditional(path, change, encode)
            return
        for _ in range(10):
            # the tag first, then the bytes: bytes newer than the tag fail the If-Match
            # PUT below (and are read again). The tag is not compared with the bytes' MD5:
            # under SSE-KMS or SSE-C an ETag is opaque.
            tag = str(self.fs.info(path, refresh=True).get("ETag", "")).strip('"')
            raw = self.fs.cat_file(path)
            config = self._fresh_config(raw)
            change(config)
            data = encode(config)
            try:
                self.fs.pipe_file(path, data, mode="overwrite", IfMatch=f'"{tag}"')
            except Exception as exc:
                if self.fs.cat_file(path) != data:
                    # 412 (s3fs: EINVAL): another update came first: apply ours to it;
                    # anything else (access denied...) is the store's error
                    if isinstance(exc, OSError) and exc.errno == errno.EINVAL:
                        continue
                    raise
            self.config = config
            return
        raise BackupError(f"{self.url}/config kept changing while it was updated",
                          hint="another process changes the repository's keys; try again")

    def _update_unconditional(self, path: str, change: Callable[[dict[str, Any]], None],
                              encode: Callable[[dict[str, Any]], bytes]) -> None:
        """:meth:`_update_config` on a store with no conditional write: the config is read
        again just before it is written (changed since it was read: ``change`` is applied
        to the new one) and read back after (another update overwrote it with a config
        missing a wrapping this one wrote: applied again). Wrappings are only ever added,
        so a wrapping missing from the config read back was lost. Two updates whose
        requests interleave within one round trip (one's re-read and write on both sides
        of the other's write and read-back) can still lose one (docs/backup-repository.md)."""
        for _ in range(10):
            raw = self.fs.cat_file(path)
            config = self._fresh_config(raw)
            change(config)
            data = encode(config)
            if self.fs.cat_file(path) != raw:
                continue  # another update came first: apply ours to it
            self.fs.pipe_file(path, data)
            there = self.fs.cat_file(path)
            if there != data:
                kept = self._fresh_config(there)["wrappings"]
                if any(w not in kept for w in config["wrappings"]):
                    continue  # overwritten by an update that had not seen ours
            self.config = config
            return
        raise BackupError(f"{self.url}/config kept changing while it was updated",
                          hint="another process changes the repository's keys; try again")

    @staticmethod
    def describe_wrappings(config: dict[str, Any]) -> list[str]:
        """One line per wrapping of the repository key (never key material)."""
        return [describe(w) for w in config["wrappings"]]

    # -- objects ----------------------------------------------------------------

    def _put(self, path: str, data: bytes, *, sync_dir: bool = True) -> None:
        """Publish ``data`` at ``path`` whole or not at all.

        On a local repository the file is synced before its rename; the directory entry
        is synced at once, or (``sync_dir=False``) by the next :meth:`sync_chunks`."""
        if isinstance(self.fs, LocalFileSystem):
            directory = os.path.dirname(path)
            if not os.path.isdir(directory):
                _private_dirs(directory)
                self._dirty_dirs.update({os.path.dirname(directory), self.root})
            tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
            try:
                _write_synced(tmp, data)
                os.replace(tmp, path)
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                if isinstance(exc, OSError) and exc.filename is None and exc.errno:
                    # a full disk's error names no file: name the repository's
                    raise type(exc)(exc.errno, exc.strerror, path) from None
                raise
            if sync_dir:
                fsync_path(directory)
                self._sync_dirty()  # and the directories made on the way
            else:
                self._dirty_dirs.add(directory)
        else:
            self.fs.pipe_file(path, data)  # one PUT: atomic on object stores

    def sync_chunks(self) -> None:
        """Make the directory entries of every stored chunk durable (local repositories;
        each chunk's data was synced when it was written). Call before a manifest names
        chunks: this covers chunks an earlier, killed run wrote too, which a backup
        reuses without writing them again."""
        if not isinstance(self.fs, LocalFileSystem):
            return
        base = os.path.join(self.root, "chunks")
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(base):
                if entry.is_dir(follow_symlinks=False):
                    self._dirty_dirs.add(entry.path)
            self._dirty_dirs.update({base, self.root})
        self._sync_dirty()

    def _sync_dirty(self) -> None:
        while self._dirty_dirs:
            fsync_path(self._dirty_dirs.pop())

    def chunk_path(self, name: str) -> str:
        return f"{self.root}/chunks/{name[:2]}/{name}"

    def chunk_names(self) -> set[str]:
        """Names of every chunk stored (temporaries of interrupted writes excluded)."""
        base = f"{self.root}/chunks"
        self.fs.invalidate_cache(base)
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return set()
        names = set()
        for p in found:
            leaf = p.rstrip("/").rsplit("/", 1)[-1]
            if len(leaf) == 64 and not leaf.startswith("."):
                names.add(leaf)
        return names

    def forget_chunks(self) -> None:
        """List the stored chunks again at the next :meth:`has_chunk`."""
        self._known = None
        self._claimed = set()

    def has_chunk(self, name: str) -> bool:
        """Whether the repository has (or this process is writing) chunk ``name``."""
        if self._known is None:
            self._known = self.chunk_names()
        return name in self._known

    def put_chunk(self, data: bytes, name: str | None = None) -> tuple[str, int]:
        """Store a chunk unless the repository has it; (name, bytes written, 0 if deduped).

        Thread-safe for distinct chunks once :meth:`has_chunk` has listed the chunks.
        """
        name = name or self.keys.chunk_name(data)
        if self.has_chunk(name) and not self._writing(name):
            return name, 0
        nonce = os.urandom(12)
        blob = nonce + self._aead_chunk.encrypt(
            nonce, zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data), name.encode())
        self._put(self.chunk_path(name), blob, sync_dir=False)
        return name, len(blob)

    def claim_chunk(self, name: str) -> bool:
        """Mark ``name`` as being written by this process; False if it is already stored."""
        if self.has_chunk(name):
            return False
        assert self._known is not None
        self._known.add(name)
        self._claimed.add(name)
        return True

    def _writing(self, name: str) -> bool:
        return name in self._claimed

    def get_chunk(self, name: str, *, check_name: bool = True) -> bytes:
        """A chunk's plaintext, authenticated; :class:`BackupError` names a bad chunk.

        ``check_name=False`` skips recomputing the chunk's HMAC (AES-GCM still
        authenticates it, bound to its name): for callers that check the SHA-256 of
        what they assemble against a manifest anyway."""
        problem = self.check_chunk(name, check_name=check_name)
        if isinstance(problem, ChunkProblem):
            cls = BackupError if problem.problem == "missing" else BackupAuthenticationError
            raise cls(f"chunk {name} is {problem.problem}",
                      hint="run 'cryptdisk backup verify' to see every damaged chunk "
                      "and the backups it affects")
        return problem

    def check_chunk(self, name: str, *, check_name: bool = True) -> bytes | ChunkProblem:
        try:
            if self._local:  # a plain read: fsspec's costs a quarter of the decryption
                with open(self.chunk_path(name), "rb") as f:
                    blob = f.read()
            else:
                blob = self.fs.cat_file(self.chunk_path(name))
        except FileNotFoundError:
            return ChunkProblem(name, "missing")
        if len(blob) < 28:
            return ChunkProblem(name, "truncated")
        try:
            packed = self._aead_chunk.decrypt(blob[:12], memoryview(blob)[12:],
                                              name.encode())
            data = zstandard.ZstdDecompressor().decompress(packed)
        except (InvalidTag, zstandard.ZstdError):
            return ChunkProblem(name, "tampered or truncated")
        if check_name and self.keys.chunk_name(data) != name:
            return ChunkProblem(name, "tampered (content does not match its name)")
        return data

    def delete_chunk(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self.chunk_path(name))
        if self._known is not None:
            self._known.discard(name)
        self._claimed.discard(name)

    def remove_temporaries(self) -> int:
        """Delete temporaries of interrupted writes (local repositories; call under the
        exclusive lock, so none belongs to a live writer)."""
        if not isinstance(self.fs, LocalFileSystem):
            return 0
        n = 0
        for sub in ("chunks", "manifests", ""):
            top = os.path.join(self.root, sub)
            for dirpath, _dirs, files in os.walk(top) if sub else [(top, [], os.listdir(top))]:
                for f in files:
                    if f.startswith(".tmp-"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(dirpath, f))
                            n += 1
        return n

    # -- manifests --------------------------------------------------------------

    def manifest_ids(self) -> list[str]:
        """Ids of complete backups, oldest first (ids sort by time)."""
        found = self._list(f"{self.root}/manifests")
        ids = [p.rstrip("/").rsplit("/", 1)[-1] for p in found]
        return sorted(i for i in ids if not i.startswith("."))

    def _manifest_ad(self, backup_id: str) -> bytes:
        return f"cryptdisk backup manifest v1:{self.id}:{backup_id}".encode()

    def manifest_blob(self, backup_id: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(f"{self.root}/manifests/{backup_id}"))
        except FileNotFoundError:
            known = ", ".join(self.manifest_ids()) or "none"
            raise BackupError(f"no backup {backup_id!r} in {self.url} (backups: {known})"
                              ) from None

    def read_manifest(self, backup_id: str, blob: bytes | None = None) -> dict[str, Any]:
        """The manifest of ``backup_id``, authenticated and checked (``blob``: its bytes,
        when the caller has read them already)."""
        if blob is None:
            blob = self.manifest_blob(backup_id)
        try:
            packed = self._aead_manifest.decrypt(blob[:12], blob[12:],
                                                 self._manifest_ad(backup_id))
            text = zstandard.ZstdDecompressor().decompress(packed)
        except (InvalidTag, ValueError, zstandard.ZstdError):
            raise BackupAuthenticationError(
                f"the manifest of backup {backup_id} fails authentication (tampered, "
                "truncated or from another repository)") from None
        return check_manifest(text, f"the manifest of backup {backup_id}")

    def write_manifest(self, doc: dict[str, Any]) -> str:
        backup_id = str(doc["id"])
        nonce = os.urandom(12)
        packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(
            json.dumps(doc, separators=(",", ":"), sort_keys=True).encode())
        blob = nonce + self._aead_manifest.encrypt(nonce, packed, self._manifest_ad(backup_id))
        self._put(f"{self.root}/manifests/{backup_id}", blob)
        return hashlib.sha256(blob).hexdigest()

    def delete_manifest(self, backup_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(f"{self.root}/manifests/{backup_id}")

    @staticmethod
    def new_backup_id() -> str:
        now = _dt.datetime.now(_dt.UTC)
        return now.strftime("%Y%m%dT%H%M%S.%fZ") + "-" + uuid.uuid4().hex[:8]

    # -- locking ----------------------------------------------------------------

    #: A lock marker not refreshed for this long is stale (restic's rule: 30 minutes).
    LOCK_STALE_S = 30 * 60.0
    #: How often a holder rewrites its marker with the time (restic: every 5 minutes).
    LOCK_REFRESH_S = 5 * 60.0

    @contextlib.contextmanager
    def lock(self, exclusive: bool) -> Iterator[None]:
        """Backups hold it shared, prune exclusive.

        A local repository uses ``fcntl`` on ``lock`` (released when a process dies). On
        other targets each holder first publishes a marker ``locks/<kind>-<id>`` (its
        kind, host, pid and time) and then lists the others (prune refuses beside any
        marker, a backup beside a prune's): with the read-after-write consistency of S3
        and its peers, of two that start together at least one sees the other. The
        holder rewrites its marker's time every :attr:`LOCK_REFRESH_S` seconds. A marker
        is stale, ignored and deleted, when its time is older than :attr:`LOCK_STALE_S`
        seconds, or when it names this host and a process that no longer exists: what
        a killed holder leaves. :meth:`break_locks` deletes every marker.
        """
        if isinstance(self.fs, LocalFileSystem):
            with self._flock(exclusive):
                yield
            return
        kind = "prune" if exclusive else "create"
        me = f"{self.root}/locks/{kind}-{uuid.uuid4().hex}"
        self._put(me, self._marker(kind))
        stop = threading.Event()
        refresher = threading.Thread(target=self._refresh_marker, args=(me, kind, stop),
                                     name="cryptdisk-backup-lock", daemon=True)
        try:
            others = []
            for p in self._list(f"{self.root}/locks"):
                leaf = p.rstrip("/").rsplit("/", 1)[-1]
                if p.rstrip("/") == me or not (exclusive or leaf.startswith("prune-")):
                    continue
                if self._stale(p):
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(p)
                    continue
                others.append(leaf)
            if others:
                names = ", ".join(others)
                what = "another backup or prune holds it" if exclusive else "a prune runs"
                raise BackupError(f"{self.url} is busy: {what} ({names})",
                                  hint="try again when it has finished; a marker is stale "
                                  "(ignored) once its holder has not refreshed it for "
                                  f"{self.LOCK_STALE_S / 60:.0f} minutes, or at once when "
                                  "its process is gone from this host; if no process uses "
                                  "the repository, 'cryptdisk backup prune --break-lock' "
                                  "removes the markers now")
            refresher.start()
            yield
        finally:
            stop.set()
            if refresher.is_alive():
                refresher.join()
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(me)

    @staticmethod
    def _marker(kind: str) -> bytes:
        return json.dumps({"kind": kind, "host": socket.gethostname(), "pid": os.getpid(),
                           "time": _dt.datetime.now(_dt.UTC).isoformat()}).encode()

    def _refresh_marker(self, path: str, kind: str, stop: threading.Event) -> None:
        while not stop.wait(self.LOCK_REFRESH_S):
            with contextlib.suppress(Exception):  # the next refresh tries again
                self._put(path, self._marker(kind))

    def _stale(self, path: str) -> bool:
        """Whether the marker at ``path`` is a killed holder's (see :meth:`lock`); one that
        cannot be read or parsed is not (it may be a holder's being written)."""
        try:
            doc = json.loads(self.fs.cat_file(path))
            when = _dt.datetime.fromisoformat(doc["time"])
            host, pid = doc["host"], int(doc["pid"])
        except FileNotFoundError:
            return True
        except (ValueError, KeyError, TypeError):
            return False
        if when.tzinfo is None:
            return False
        age = (_dt.datetime.now(_dt.UTC) - when).total_seconds()
        if age > self.LOCK_STALE_S:
            return True
        if host == socket.gethostname() and pid != os.getpid():
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def break_locks(self) -> int:
        """Delete every lock marker (only when no process uses the repository)."""
        n = 0
        for p in self._list(f"{self.root}/locks"):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(p)
                n += 1
        return n

    def _list(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)  # another process may have written meanwhile
        try:
            return [str(p) for p in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    @contextlib.contextmanager
    def _flock(self, exclusive: bool) -> Iterator[None]:
        # a forked child closes its copy (_flocks): the lock dies with this process
        fd = hold(os.open(os.path.join(self.root, "lock"), os.O_RDWR | os.O_CREAT, 0o600))
        try:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                what = "a backup is being written" if exclusive else "a prune is running"
                raise BackupError(f"{self.url} is busy: {what}",
                                  hint="try again when it has finished") from None
            yield
        finally:
            let_go(fd)
            os.close(fd)


# -- what the JSON documents hold ------------------------------------------------
# The config is plain JSON anyone with write access to the repository can change; a
# manifest authenticates, but may be another version's or a bug's. Either, malformed, is
# a BackupError naming the document and the field, never a KeyError or TypeError later
# (and never a value: a config holds wrapped keys).

_CHUNK_NAME = re.compile(r"[0-9a-f]{64}")
_NONE = type(None)
#: What a field must be, in words, and the JSON types that are that.
_KINDS: dict[str, tuple[type, ...]] = {
    "a string": (str,), "a count": (int,), "an object": (dict,), "a list": (list,),
    "true or false": (bool,), "a string or null": (str, _NONE),
    "an object or null": (dict, _NONE), "a list of chunk names": (list,),
    "a list of two strings": (list,)}


class _Doc:
    """Checks fields of one JSON document; ``bad(why)`` makes the error."""

    def __init__(self, bad: Callable[[str], BackupError]) -> None:
        self.bad = bad

    def value(self, value: Any, where: str, expect: str) -> Any:
        types = _KINDS[expect]
        fits = isinstance(value, types)  # (kept apart: it would narrow value to object)
        if (isinstance(value, bool) and bool not in types) or not fits:
            raise self.bad(f"{where} is {_json.kind(value)}, not {expect}")
        if expect == "a count" and value < 0:
            raise self.bad(f"{where} is negative, not {expect}")
        if expect == "a list of chunk names" and not all(
                isinstance(c, str) and _CHUNK_NAME.fullmatch(c) for c in value):
            raise self.bad(f"{where} holds something that is not a chunk name")
        if expect == "a list of two strings" and (
                len(value) != 2 or not all(isinstance(c, str) for c in value)):
            raise self.bad(f"{where} is not {expect}")
        return value

    def field(self, obj: dict[str, Any], name: str, expect: str, where: str = "", *,
              optional: bool = False) -> Any:
        if name not in obj:
            if optional:
                return None
            raise self.bad(f"{where}{name} is missing")
        return self.value(obj[name], where + name, expect)

    def items(self, obj: dict[str, Any], name: str, where: str = "") -> list[dict[str, Any]]:
        """A field that is a list of objects."""
        out = self.field(obj, name, "a list", where)
        for i, item in enumerate(out):
            self.value(item, f"{where}{name}[{i}]", "an object")
        return out  # type: ignore[no-any-return]


def check_config(raw: bytes, url: str) -> dict[str, Any]:
    """The repository config in ``raw``, its fields checked (:class:`BackupError` if not)."""
    doc = _Doc(lambda why: BackupError(f"{url}: the repository config is malformed: {why}"))
    config = _json.load_object(raw, doc.bad)
    fmt = config.get("format")
    if fmt != FORMAT or isinstance(fmt, bool):
        shown = repr(fmt) if isinstance(fmt, int) and not isinstance(fmt, bool) else \
            _json.kind(fmt) if "format" in config else "missing"
        raise BackupError(f"{url}: repository format {shown} is not {FORMAT}; upgrade cryptdisk")
    doc.field(config, "id", "a string")
    chunker = doc.field(config, "chunker", "an object")
    doc.field(chunker, "algorithm", "a string", "chunker.")
    for name in ("avg", "min", "max"):
        doc.field(chunker, name, "a count", "chunker.")
    doc.field(config, "params_mac", "a string", optional=True)
    for i, w in enumerate(doc.items(config, "wrappings")):
        where = f"wrappings[{i}]."
        doc.field(w, "kind", "a string", where)
        doc.field(w, "blob", "a string", where)
        if w["kind"] == "passphrase":
            doc.field(w, "salt", "a string", where)
            params = doc.field(w, "params", "an object", where)
            for name, value in params.items():
                doc.value(value, f"{where}params.{name}", "a count")
        elif w["kind"] == "key":
            doc.field(w, "check", "a string", where)
    return config


def check_manifest(text: bytes, what: str) -> dict[str, Any]:
    """The manifest in ``text`` (decrypted), its fields checked (:class:`BackupError` if
    not); ``what`` names it in the error."""
    doc = _Doc(lambda why: BackupError(f"{what} is malformed: {why}"))
    m = _json.load_object(text, doc.bad)
    doc.field(m, "id", "a string")
    try:
        when = _dt.datetime.fromisoformat(doc.field(m, "time", "a string"))
    except ValueError:
        raise doc.bad("time is not an ISO 8601 time") from None
    if when.tzinfo is None:
        raise doc.bad("time has no time zone")
    prev = doc.field(m, "prev", "an object or null", optional=True)
    if prev is not None:
        doc.field(prev, "id", "a string", "prev.")
        doc.field(prev, "sha256", "a string", "prev.")
    doc.field(m, "source", "a string", optional=True)
    for name in ("bytes", "chunks", "new_chunks", "stored_bytes", "catalog_version"):
        doc.field(m, name, "a count", optional=True)
    kind = doc.field(m, "kind", "a string")
    if kind == "sqlite":
        doc.field(m, "wal", "true or false", optional=True)
        f = doc.field(m, "file", "an object")
        doc.field(f, "bytes", "a count", "file.")
        doc.field(f, "sha256", "a string", "file.")
        doc.field(f, "chunks", "a list of chunk names", "file.")
    elif kind == "db":
        doc.field(m, "db_id", "a string", optional=True)
        for i, t in enumerate(doc.items(m, "tables")):
            where = f"tables[{i}]."
            doc.field(t, "name", "a string", where)
            for j, column in enumerate(doc.field(t, "columns", "a list", where)):
                doc.value(column, f"{where}columns[{j}]", "a list of two strings")
            doc.field(t, "policy", "a string", where)
            doc.field(t, "order_by", "a string or null", where, optional=True)
            for j, p in enumerate(doc.items(t, "parts", where)):
                at = f"{where}parts[{j}]."
                doc.field(p, "id", "a string or null", at, optional=True)
                doc.field(p, "rows", "a count", at)
                doc.field(p, "bytes", "a count", at)
                doc.field(p, "sha256", "a string", at)
                doc.field(p, "chunks", "a list of chunk names", at)
    else:
        raise doc.bad('kind is neither "db" nor "sqlite"')
    return m

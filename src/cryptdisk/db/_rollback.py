"""Evidence that the catalog was rolled back: pins, and the version in every part's name.

Every file the database writes for a change is named ``v<N>-...`` where ``N``
is the catalog version that change publishes (and a new part also carries
``N`` in its Parquet footer, authenticated with the file on encrypted disks).
After each publish the writer records the version in pins: sealed files
holding the database id and the version, ``PATH/pin`` always (not synced: it
costs a commit no ``fsync``), and one outside the directory when the user asks
for it (``connect(..., pin=FILE)``, synced). Pins are written after the
catalog, so a pin never runs ahead of a catalog that was published.

From these, with the writer lock held (nothing moves):

* a pin above the catalog's version proves the catalog went back;
* a file named for version ``N > C + 1`` (``C`` the catalog's version) proves it
  too: its writer had loaded version ``N - 1``, which was therefore published;
* a file named for ``N <= C`` that the catalog does not name was abandoned (the
  catalog passed its version without it): collecting it is safe;
* a file named for ``C + 1`` is either a writer's killed before it published
  ``C + 1``, or a part of a ``C + 1`` that was published and then rolled back
  together with ``PATH/pin``: it is kept until the catalog passes ``C + 1``;
* a file with no version (written before versions were recorded) is kept.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import AuthenticationError, CatalogError, CryptdiskError, FormatError
from ..format import Kind, SealedWriter, new_header
from ..format import open_file as cd_open
from ..keys import Keyring

__all__ = ["PIN_FILE", "VERSION_KEY", "Survey", "default_pin_path", "file_version",
           "part_file_name", "pin_evidence", "read_pin", "read_pins", "remove_pin_temps",
           "rollback_error", "survey", "write_pin"]

PIN_FILE = "pin"
VERSION_KEY = b"cryptdisk.catalog_version"
_VERSIONED = re.compile(r"v(\d+)-")

log = logging.getLogger("cryptdisk.db")


def default_pin_path(db_path: str) -> str:
    """The conventional outside pin of a database: ``PATH.pin``, beside ``PATH.key``."""
    return os.path.abspath(db_path).rstrip(os.sep) + ".pin"


def part_file_name(version: int, part_id: str, suffix: str = "") -> str:
    """The file name of a part written for catalog ``version``."""
    return f"v{version}-{part_id}{suffix}.parquet"


def file_version(path: str) -> int | None:
    """The catalog version a database file was written for, from its name (None: unknown)."""
    m = _VERSIONED.match(path.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def read_pin(path: str, keyring: Keyring, *, strict: bool = True,
             remote: Any = None) -> tuple[str, int] | None:
    """``(db_id, version)`` of the pin at ``path``, or None if there is none.

    A pin that does not authenticate raises :class:`CatalogError`, or, unless
    ``strict``, is taken as absent with a warning (``PATH/pin`` is written
    without ``fsync``: after a power failure it may be torn, and deleting it
    costs an attacker no more). A pin sealed under a key the keyring lacks
    raises the keyring's error, as the catalog does.
    """
    try:
        if remote is not None:  # the pin of a database directory at a URL (._remote)
            data = remote.read_sealed(PIN_FILE, keyring)
            if data is None:
                return None
        else:
            with cd_open(path, "rb", keys=keyring) as f:
                data = f.read()
        doc = json.loads(data)
        return str(doc["db_id"]), int(doc["version"])
    except FileNotFoundError:
        return None
    except (AuthenticationError, FormatError, KeyError, TypeError, ValueError) as exc:
        if not strict:
            log.warning("cryptdisk: %s: the catalog's version pin is unreadable (%s); "
                        "ignored, the next commit writes it again", path, exc)
            return None
        raise CatalogError(f"{path}: the catalog's version pin cannot be trusted: {exc}",
                           hint="restore it from a backup, or delete it to stop the check"
                           ) from None


def read_pins(paths: list[str], keyring: Keyring,
              remote: Any = None) -> list[tuple[str, str, int]]:
    """``(path, db_id, version)`` of each pin that exists (read them before the catalog).

    ``paths[0]`` is the database's own ``PATH/pin`` (read leniently, see
    :func:`read_pin`; through ``remote`` for a database at a URL); the others are
    pins the user asked for.
    """
    out = []
    for i, path in enumerate(paths):
        pin = read_pin(path, keyring, strict=i > 0, remote=remote if i == 0 else None)
        if pin is not None:
            out.append((path, *pin))
    return out


def pin_evidence(pins: list[tuple[str, str, int]], db_id: str, version: int) -> str | None:
    """A sentence naming a pin above catalog ``version``, or None; a foreign pin raises."""
    for path, pin_db, _version in pins:
        if pin_db != db_id:
            raise CatalogError(f"the pin {path} belongs to another database ({pin_db}, "
                               f"not {db_id})", hint="pass the pin file of this database")
    ahead = [(v, p) for p, _d, v in pins if v > version]
    if not ahead:
        return None
    v, p = max(ahead)
    return f"the pin {p} records that version {v} was published"


def rollback_error(db_path: str, version: int, evidence: str) -> CatalogError:
    """The error of a writer that finds its catalog rolled back (and deleted nothing)."""
    return CatalogError(
        f"{db_path}: the catalog (version {version}) was rolled back: {evidence}. "
        "Refusing to write; nothing was deleted",
        hint="put the newest catalog back (the parts it names are still on disk), or read "
        "this one with read_only=True (--read-only); to go back on purpose, restore the whole "
        "directory from one backup (and delete the outside pin, if one is used)")


def write_pin(path: str, keyring: Keyring, db_id: str, version: int, *,
              durable: bool = True, remote: Any = None) -> None:
    """Record that catalog ``version`` of database ``db_id`` was published (atomic).

    ``durable`` pins are synced to disk before this returns; others are left
    to the page cache (after a power failure the file is the old pin, the new
    one, or torn, never ahead of the catalog, which was synced first).
    ``remote``: the pin of a database at a URL, uploaded whole (see ._remote).
    """
    data = json.dumps({"db_id": db_id, "version": version}).encode()
    if durable:
        with cd_open(path, "wb", keys=keyring) as f:
            f.write(data)
        return
    sealed = io.BytesIO()
    header, dek = new_header(Kind.SEALED, keyring.current_key())
    writer = SealedWriter(sealed, header, dek)
    writer.write(data)
    writer.close()
    if remote is not None:
        remote.write_bytes(PIN_FILE, sealed.getvalue())
        return
    directory, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".cdtmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(sealed.getbuffer())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def remove_pin_temps(path: str) -> int:
    """Delete temporaries of writes of the pin at ``path`` (the writer lock must be held)."""
    directory, name = os.path.split(os.path.abspath(path))
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.listdir(directory):
            if entry.startswith(f".{name}.") and entry.endswith(".cdtmp"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, entry))
                    removed += 1
    return removed


@dataclass
class Survey:
    """The database's files that its catalog (at ``version``) does not name, by what is known."""

    version: int
    abandoned: list[tuple[Any, str]] = field(default_factory=list)  # named for <= version
    pending: list[tuple[Any, str]] = field(default_factory=list)  # named for version + 1
    unversioned: list[tuple[Any, str]] = field(default_factory=list)
    newer: list[tuple[Any, str, int]] = field(default_factory=list)  # proof of a rollback

    def newer_than(self, version: int, live: set[tuple[str, str]]) -> Survey:
        """This survey with only the proofs that still hold against a later catalog."""
        return Survey(version, newer=[f for f in self.newer
                                      if f[2] > version + 1 and (f[0].name, f[1]) not in live])

    def evidence(self) -> str | None:
        """A sentence naming the files that prove a rollback, or None."""
        if not self.newer:
            return None
        newest = max(self.newer, key=lambda f: f[2])
        return (f"{len(self.newer)} part file(s) were written for later catalog versions, "
                f"up to {newest[2]} ({newest[1]} on disk {newest[0].name!r})")


def _stored_at(disk: Any, name: str) -> str | None:
    """The real OS path of a disk file's stored bytes, or None (not on a local directory)."""
    fn = getattr(disk, "os_path", None)
    if fn is None:
        return None
    try:
        where = fn(name)
    except (CryptdiskError, OSError, ValueError):
        return None
    return os.path.realpath(where) if where else None


def _aliased(disks: list[Any], prefix: str) -> set[str]:
    """The names of the disks among ``disks`` whose files under ``prefix`` are stored in the
    same local directory as another's (two disks of a config over one directory)."""
    seen: dict[str, list[str]] = {}
    for disk in disks:
        where = _stored_at(disk, prefix)
        if where is not None:
            seen.setdefault(where, []).append(disk.name)
    return {name for names in seen.values() if len(names) > 1 for name in names}


def survey(disks: Iterable[Any], prefix: str, live: set[tuple[str, str]],
           version: int) -> Survey:
    """Sort the files under ``prefix`` that ``live`` does not name against catalog ``version``.

    A disk that cannot be listed is skipped (its files are left alone). Two disks whose
    files are one local directory (a config that names it twice) list the same files:
    a file the catalog names through one is live through the other too, and each file
    is sorted once.
    """
    out = Survey(version)
    disks = list(disks)
    aliased = _aliased(disks, prefix)
    by_name = {disk.name: disk for disk in disks}
    live_at = {_stored_at(by_name[d], p) for d, p in live if d in aliased}
    seen: set[str | None] = set()
    for disk in disks:
        try:
            names = disk.list(prefix)
        except (CryptdiskError, OSError):
            continue
        for name in names:
            if (disk.name, name) in live:
                continue
            if disk.name in aliased:
                where = _stored_at(disk, name)
                if where is not None and (where in live_at or where in seen):
                    continue
                seen.add(where)
            v = file_version(name)
            if v is None:
                out.unversioned.append((disk, name))
            elif v <= version:
                out.abandoned.append((disk, name))
            elif v == version + 1:
                out.pending.append((disk, name))
            else:
                out.newer.append((disk, name, v))
    return out

"""Key rotation and re-encryption of a database, checked before and after.

A rotation rewraps the header of every file the catalog names (the parts on
encrypted disks, and the catalog itself) under the current key. Before it
changes anything it checks that every part the catalog names is found, on a
disk that can rewrap it, under a key the config has; if one is not, it stops
with :class:`~cryptdisk.errors.RotationError` naming the files, and nothing
has changed. Each header is replaced in one write, so a rotation killed at
any point leaves every file under the old key or the new one, and running it
again finishes it. It ends by reading every header again and checking that
each file is under the current key and that ``system.keys`` counts no file
under another key; otherwise it raises, naming the files left. The parts a merge,
``DROP`` or ``TRUNCATE`` replaced that wait on disk for running queries (readers) to end
are rewrapped and checked too: when a rotation returns, no file of the database is under
another key.

A database opened without a config keeps its keys in files beside its
directory (:mod:`._keyfiles`): a rotation to a new key makes it current there
first (crash-safe), keeping the old key as ``PATH.key.ID`` until
:meth:`remove_key` deletes it, which it refuses while any file is under it.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import (
    CryptdiskError,
    DatabaseError,
    DiskFileNotFoundError,
    NotEncryptedError,
    RotationError,
)
from ..format import HEADER_SIZE, Header
from ..keys import Key, Keyring, ProviderKey, file_stamp, rewrap_file
from ._catalog import CATALOG_FILE, PartMeta, catalog_key_id
from ._keyfiles import (
    default_key_path,
    discard_pending_key,
    install_current_key,
    interrupted_rotation,
    load_keyring,
    retired_key_path,
    stage_current_key,
)
from ._keyfiles import remove_key as remove_key_file
from ._policies import role_check_statement
from ._rollback import PIN_FILE, default_pin_path
from ._storage import resolve_config, rewrap_on_disk

if TYPE_CHECKING:
    from ._state import DatabaseState
else:
    DatabaseState = object  # the type checker's view only: see _state

__all__ = ["RotationMixin"]

#: How many files a message lists before it says "and N more".
SHOWN = 10

#: Files beside a database directory ``PATH`` that are sealed with its keyring but that
#: its catalog does not name: the outside pin (``PATH.pin``), and the user file, masking
#: policies and audit log of ``cryptdisk serve`` at their default places.
SIDECARS = (".pin", ".users", ".policies", ".audit")


def _config_keys(config: Any) -> list[Key]:
    """Every key object of a config: its keyring's and each disk keyring's (each object once,
    two loads of one key are two objects)."""
    rings = [config.keyring] + [getattr(d, "keyring", None) for d in config.disks.values()]
    keys: dict[int, Key] = {}
    for ring in rings:
        if isinstance(ring, Keyring):
            keys.update((id(key), key) for key in ring)
    return list(keys.values())


def _listing(problems: list[str]) -> str:
    shown = "; ".join(problems[:SHOWN])
    more = len(problems) - SHOWN
    return shown + (f"; and {more} more" if more > 0 else "")


def _server_files(config_path: str) -> list[str]:
    """The user file, policies and audit log a TOML config's ``[server]`` names (as
    ``cryptdisk serve`` takes them: relative to the working directory)."""
    if not config_path.endswith(".toml") or not os.path.isfile(config_path):
        return []
    try:
        with open(config_path, "rb") as f:
            section = tomllib.load(f).get("server", {})
    except (OSError, tomllib.TOMLDecodeError):
        return []
    if not isinstance(section, dict):
        return []
    return [v for k in ("users", "policies", "audit_log")
            if isinstance(v := section.get(k), str) and v]


class RotationMixin(DatabaseState):
    """Rotation methods of :class:`~cryptdisk.db.Database`."""

    def _part_label(self, table: str, part: PartMeta) -> str:
        return f"{part.path} (table {table}, disk {part.disk!r})"

    def _unreachable_parts(self, *, rewrap: bool) -> tuple[list[str], int]:
        """Problems with the files the catalog names (empty: all fine), and how many it names.

        Every part must be found on its disk, be encrypted if the catalog says
        so, and (on encrypted disks) be under a key the disk has; with
        ``rewrap``, its disk must also be able to rewrap headers in place.
        """
        problems: list[str] = []
        named = 1  # the catalog itself
        for meta in self.catalog.tables.values():
            for part in meta.parts:
                named += 1
                label = self._part_label(meta.name, part)
                disk = self.config.disks.get(part.disk)
                if disk is None:
                    problems.append(f"{label}: the config has no disk {part.disk!r}")
                    continue
                try:
                    info = disk.info(part.path)
                except (DiskFileNotFoundError, FileNotFoundError):
                    problems.append(f"{label}: not found on disk {disk.name!r} ({disk.path})")
                    continue
                except (CryptdiskError, OSError) as exc:
                    problems.append(f"{label}: {exc}")
                    continue
                recorded = part.key_id is not None or part.algorithm is not None
                if recorded and not info.encrypted:
                    problems.append(f"{label}: the catalog recorded it encrypted, but disk "
                                    f"{disk.name!r} ({disk.type}, {disk.path}) is not")
                    continue
                keyring = getattr(disk, "keyring", None)
                if not disk.is_encrypted or keyring is None:
                    if disk.is_encrypted and rewrap:
                        problems.append(f"{label}: disk {disk.name!r} ({disk.type}) cannot "
                                        "rewrap files under the keyring's key")
                    continue
                if rewrap and keyring.current_key_id != self.keyring.current_key_id:
                    problems.append(f"{label}: disk {disk.name!r} writes under its current key "
                                    f"{keyring.current_key_id}, not the keyring's "
                                    f"{self.keyring.current_key_id} (its keys or "
                                    "current_key_id in the config)")
                elif rewrap and not getattr(disk, "can_rewrap", False) \
                        and disk.stored_key_id(part.path) != keyring.current_key_id:
                    problems.append(f"{label}: disk {disk.name!r} is over a "
                                    f"{disk.inner.type} disk, which cannot rewrite a "
                                    "header in place (re-encrypt instead)")
                elif info.key_id is not None and info.key_id not in keyring:
                    problems.append(f"{label}: under key {info.key_id}, which disk "
                                    f"{disk.name!r} does not have")
        return problems, named

    def _require_reachable(self, what: str, *, rewrap: bool) -> None:
        problems, named = self._unreachable_parts(rewrap=rewrap)
        if problems:
            raise RotationError(
                f"{what} of {self.path} stopped before changing anything: "
                f"{len(problems)} of the {named} file(s) the catalog names cannot be "
                f"handled: {_listing(problems)}",
                files=problems,
                hint="open the database with the config it was written with (its disks and "
                "keys), or without --config if it was created without one")

    def _files_not_under_current_key(self) -> list[str]:
        """Every file the catalog names whose header, read now, is not under the current key.

        Also a part whose catalog entry names another key than its header, and
        any key other than the current one that ``system.keys`` counts.
        """
        left: list[str] = []
        for meta in self.catalog.tables.values():
            for part in meta.parts:
                disk = self.config.disks[part.disk]
                if not disk.is_encrypted:
                    continue
                label = self._part_label(meta.name, part)
                try:
                    key_id = disk.stored_key_id(part.path)
                except (CryptdiskError, OSError) as exc:
                    left.append(f"{label}: {exc}")
                    continue
                current = disk.keyring.current_key_id
                if key_id != current:
                    left.append(f"{label}: under key {key_id}, not {current}")
                elif part.key_id != key_id:
                    left.append(f"{label}: the catalog records key {part.key_id}")
        key_id = self._catalog_key_id()
        if key_id != self.keyring.current_key_id:
            left.append(f"{CATALOG_FILE}: under key {key_id}, not "
                        f"{self.keyring.current_key_id}")
        from ._system import system_tables

        keys = system_tables(self)["keys"].to_pylist()
        for row in keys:
            if not row["is_current"] and row["files"]:
                left.append(f"system.keys counts {row['files']} file(s) under key {row['id']}")
        for part in self._doomed_parts:
            disk = self.config.disks.get(part.disk)
            if disk is None or not disk.is_encrypted:
                continue
            try:
                key_id = disk.stored_key_id(part.path)
            except (DiskFileNotFoundError, FileNotFoundError):
                continue  # (gone: nothing of it is left)
            except (CryptdiskError, OSError) as exc:
                left.append(f"{self._doomed_label(part)}: {exc}")
                continue
            if key_id != disk.keyring.current_key_id:
                left.append(f"{self._doomed_label(part)}: under key {key_id}, not "
                            f"{disk.keyring.current_key_id}")
        for path, key_id, problem in self._sidecar_key_ids(own_pin=True):
            if key_id is None:
                left.append(f"{path}: {problem}")
            elif key_id != self.keyring.current_key_id:
                left.append(f"{path}: under key {key_id}, not {self.keyring.current_key_id}")
        return left

    def sidecar_files(self, *, own_pin: bool = False) -> list[str]:
        """The files beside the directory sealed with the database's keyring that exist
        now: its outside pins (``PATH.pin``, a ``pin=FILE`` given) and the server's files at
        their default places (``PATH.users``, ``PATH.policies``, ``PATH.audit``); with
        ``own_pin`` also ``PATH/pin`` (which every commit writes again), and those the
        TOML config's ``[server]`` names. A rotation rewraps them too, and a key is in
        use while one of them is under it (a server's files given by ``--users`` are not
        known here: rewrap them with ``cryptdisk keys promote ID FILES``)."""
        if self._remote is not None:
            return []
        base = os.path.abspath(self.path).rstrip(os.sep)
        inside = os.path.join(base, PIN_FILE)
        found: list[str] = []
        for path in [*self._pins, default_pin_path(self.path), *(base + s for s in SIDECARS),
                     *_server_files(getattr(self.config, "path", ""))]:
            path = os.path.abspath(path)
            if path == inside and not own_pin:
                continue
            if path not in found and os.path.isfile(path):
                found.append(path)
        return found

    def _sidecar_key_ids(self, *, own_pin: bool = False) -> list[tuple[str, int | None, str]]:
        """``(path, key id, problem)`` of each sealed file of :meth:`sidecar_files`: the key
        id from its header (None with the problem when it cannot be read); plain files are
        left out."""
        out: list[tuple[str, int | None, str]] = []
        for path in self.sidecar_files(own_pin=own_pin):
            try:
                with open(path, "rb") as f:
                    out.append((path, Header.parse(f.read(HEADER_SIZE), path).key_id, ""))
            except FileNotFoundError:
                continue
            except NotEncryptedError:
                continue  # not sealed: under no key
            except (CryptdiskError, OSError) as exc:
                out.append((path, None, str(exc)))
        return out

    def _rewrap_sidecars(self, report: Callable[[str, bool], None]) -> int:
        """Rewrap the sidecar files under the current key; one that cannot be rewrapped
        (under a key the keyring lacks, say) is left to the last check, which names it."""
        count = 0
        for path, key_id, _problem in self._sidecar_key_ids(own_pin=True):
            if key_id is None or key_id == self.keyring.current_key_id:
                continue
            try:
                rewrapped = rewrap_file(path, self.keyring)
            except (FileNotFoundError, NotEncryptedError):
                continue
            except CryptdiskError:
                continue  # (reported by the last check)
            count += rewrapped
            report(path, rewrapped)
        return count

    def _catalog_key_id(self) -> int:
        """The key id in the catalog's header, read now (again if a rewrap was writing it)."""
        return catalog_key_id(self.path, self.keyring)

    def _doomed_label(self, part: PartMeta) -> str:
        return (f"{part.path} (disk {part.disk!r}; replaced, kept until the queries "
                "reading it end)")

    def _rewrap_doomed(self, report: Callable[[str, bool], None]) -> int:
        """Rewrap the parts the catalog no longer names that wait for running queries
        (``Reader``) to end (see ``_remove_parts``): they stay readable (their data keys do
        not change) and no file of the database is left under an older key."""
        count = 0
        for part in self._doomed_parts:
            disk = self.config.disks.get(part.disk)
            if disk is None or not disk.is_encrypted or not getattr(disk, "can_rewrap", False):
                continue  # (one that cannot be rewrapped is reported by the last check)
            try:
                rewrapped = rewrap_on_disk(disk, part.path)
            except (DiskFileNotFoundError, FileNotFoundError):
                continue
            count += rewrapped
            report(part.path, rewrapped)
        return count

    def _reload_own_keys(self) -> None:
        """Load the database's key files again (a rotation here, or in another process),
        into the keyring in place: its disk, and whatever else holds it (a server's user
        file, policies and audit log), write under the new current key and read files
        rewrapped under it."""
        self.keyring.adopt(load_keyring(self.path))

    def _follow_config_keys(self) -> None:
        """Before a write: when the TOML config the database was opened with changed since
        its keys were loaded (``cryptdisk keys promote`` in another process), load them
        again (:meth:`_reload_config_keys`), so every file written from now on (part,
        catalog, pin, ...) is under the key the config makes current, as a
        :class:`~cryptdisk.keys.FollowingKeyring` does. A config that does not load at this
        moment (an edit half written by hand) leaves the keys loaded before in use; its
        next change is tried again."""
        path = getattr(self, "_config_file", None)
        if path is None:
            return
        stamp = file_stamp(path)
        if stamp == getattr(self, "_config_stamp", None):
            return
        self._config_stamp = stamp
        try:
            self._reload_config_keys()
        except (CryptdiskError, OSError):
            return
        self.cache.drop_derived()  # field functions' values go with the keys' change

    def _reload_config_keys(self) -> None:
        """Load the keys of the TOML config the database was opened with again, into the
        keyrings in use (the config's, each encrypted disk's), in place: a key another
        process added and made current there (``cryptdisk keys add``, ``promote``) is
        the key a rotation rewraps to, and every holder of those keyrings (the disks, a
        server's user file, policies and audit log) writes under it from then on."""
        path = getattr(self, "_config_file", None)
        if path is None:
            return
        fresh: Any = resolve_config(self.path, path, False)
        try:
            if self.config.keyring is not None and fresh.keyring is not None:
                self.config.keyring.adopt(fresh.keyring)
            for name, disk in self.config.disks.items():
                ring = getattr(disk, "keyring", None)
                new = getattr(fresh.disks.get(name), "keyring", None)
                if isinstance(ring, Keyring) and isinstance(new, Keyring) and ring is not \
                        self.config.keyring:
                    ring.adopt(new)
        finally:
            # the keys loaded and not taken (a disk added to the file since the database
            # opened, ...): their sessions and connections are let go now, not when the
            # fresh config happens to be collected; the keys taken stay open
            taken = {id(key) for key in _config_keys(self.config)}
            for key in _config_keys(fresh):
                if id(key) not in taken and isinstance(key, ProviderKey):
                    key.retire()

    def rotate_keys(self, on_file: Callable[[str], None] | None = None, *,
                    new_key: Key | None = None,
                    on_result: Callable[[str, bool], None] | None = None) -> int:
        """Rewrap every file of the database (parts, catalog) under the current key.

        With ``new_key`` (a database opened without a config only), that key
        first becomes the current key in the database's key files, the old one
        kept beside them; it is staged as ``PATH.key.pending`` before the checks,
        and a later call without ``new_key`` that finds it staged (the earlier
        call was stopped) makes it current and finishes. A key file the stopped
        call left half staged raises :class:`~cryptdisk.errors.KeyringError`
        asking for the key again. Checks first that every file the catalog names can be
        rewrapped and last that every one is under the current key (see the
        module docstring); raises :class:`~cryptdisk.errors.RotationError`
        otherwise. Idempotent and crash-safe: an interrupted run is finished by
        running it again. Returns the number of files rewrapped (0 when all
        already were). ``on_file(path)`` is called after each file, and
        ``on_result(path, rewrapped)`` says whether it was rewrapped (False: it
        already was under the current key).
        """

        def report(path: str, rewrapped: bool) -> None:
            if on_file is not None:
                on_file(path)
            if on_result is not None:
                on_result(path, rewrapped)

        with self._mutex:
            self._writable("rotate keys")
            role_check_statement(self, "rotate_keys()", None)
            staged = False
            if new_key is not None:
                if not self.own_keys:
                    raise DatabaseError(
                        "a new key is given only to a database opened without a config "
                        "(its keys are its key files); with a config, add the key to the "
                        "config's [keyring] and make it current_key_id")
                staged = stage_current_key(self.path, new_key)  # the intent, first
            elif self.own_keys:  # a rotation to a new key that was stopped: finish it
                new_key = interrupted_rotation(self.path)
            else:  # the config's current key now, not the one loaded when it opened
                self._reload_config_keys()
            self.cache.drop_derived()  # field functions' values go with the keys' change
            try:
                self._require_reachable("the rotation", rewrap=True)
            except BaseException:
                if staged:  # this call's checks failed: nothing changed, no intent left
                    discard_pending_key(self.path)
                raise
            if new_key is not None:
                install_current_key(self.path, new_key)
                self._reload_own_keys()
            count = 0
            for meta in self.catalog.tables.values():
                for i, part in enumerate(meta.parts):
                    disk = self.config.disks[part.disk]
                    if not disk.is_encrypted:
                        continue
                    # the others are under the current key (checked)
                    rewrapped = disk.can_rewrap and rewrap_on_disk(disk, part.path)
                    count += rewrapped
                    info = disk.info(part.path)
                    meta.parts[i] = dataclasses.replace(part, key_id=info.key_id,
                                                        algorithm=info.algorithm,
                                                        bytes_on_disk=info.stored_size)
                    report(part.path, rewrapped)
            count += self._rewrap_doomed(report)
            rewrapped = rewrap_file(os.path.join(self.path, CATALOG_FILE), self.keyring)
            count += rewrapped
            self._commit()  # (writes the pins it is given under the current key)
            report(CATALOG_FILE, rewrapped)
            count += self._rewrap_sidecars(report)
            left = self._files_not_under_current_key()
            if left:
                raise RotationError(
                    f"the rotation of {self.path} did not finish: {len(left)} file(s) are not "
                    f"under key {self.keyring.current_key_id}: {_listing(left)}",
                    files=left, hint="run the rotation again; it resumes where it stopped")
            return count

    def files_under_key(self, key_id: int) -> list[str]:
        """The files the catalog names whose header, read now, is under key ``key_id``."""
        with self._mutex:
            self._require_reachable("counting the files under a key", rewrap=False)
            found = []
            for meta in self.catalog.tables.values():
                for part in meta.parts:
                    disk = self.config.disks[part.disk]
                    if disk.is_encrypted and getattr(disk, "keyring", None) is not None \
                            and disk.stored_key_id(part.path) == key_id:
                        found.append(self._part_label(meta.name, part))
            for part in self._doomed_parts:  # replaced, kept for the queries reading them
                disk = self.config.disks.get(part.disk)
                if disk is None or not disk.is_encrypted \
                        or getattr(disk, "keyring", None) is None:
                    continue
                try:
                    if disk.stored_key_id(part.path) == key_id:
                        found.append(self._doomed_label(part))
                except (DiskFileNotFoundError, FileNotFoundError):
                    continue
            if self._catalog_key_id() == key_id:
                found.append(CATALOG_FILE)
            for path, stored, problem in self._sidecar_key_ids():
                if stored == key_id:
                    found.append(path)
                elif stored is None:  # unreadable: it may be under that key
                    found.append(f"{path} ({problem})")
            return found

    def local_files(self) -> list[str]:
        """The OS paths of the database's files on this machine: its catalog, the parts (also
        those replaced and kept for running queries) on disks over a local directory, its
        pins and the server's files beside it (:meth:`sidecar_files`).

        With them a caller tells the database's files apart from the same files reached by
        another path (a directory that holds a disk's files, say)."""
        with self._mutex:
            parts = [p for meta in self.catalog.tables.values() for p in meta.parts]
            found = [] if self._remote is not None else [os.path.join(self.path, CATALOG_FILE)]
            for part in [*parts, *self._doomed_parts]:
                disk = self.config.disks.get(part.disk)
                os_path = getattr(disk, "os_path", None)
                where = os_path(part.path) if os_path is not None else None
                if where is not None:
                    found.append(where)
            return found + self.sidecar_files(own_pin=True)

    def key_file(self, key_id: int) -> str | None:
        """Where a database opened without a config keeps key ``key_id`` (None with a config)."""
        if not self.own_keys or key_id not in self.keyring:
            return None
        if key_id == self.keyring.current_key_id:
            return default_key_path(self.path)
        return retired_key_path(self.path, key_id)

    def unfinished_rotation(self) -> tuple[str, str] | None:
        """What a rotation to a new key that was stopped left beside the key files, as
        ``(what, hint)`` (the hint names the command that finishes it), or None.

        Only a database opened without a config has key files: ``PATH.key.pending``
        (the new key recorded, no file under it yet: ``cryptdisk rotate PATH`` finishes
        it) or ``PATH.key.new`` alone (stopped while recording it: the key file has to
        be given again).
        """
        if not self.own_keys:
            return None
        try:
            key = interrupted_rotation(self.path)
        except CryptdiskError as exc:
            return str(exc), exc.hint or ""
        if key is None:
            return None
        return (f"a rotation of database {self.path} to key {key.key_id} was interrupted "
                f"after it recorded the key in {default_key_path(self.path)}.pending; no "
                f"file is under key {key.key_id} yet",
                f"finish it: cryptdisk rotate {self.path}")

    def remove_key(self, key_id: int) -> str:
        """Delete an older key of a database opened without a config; returns its file.

        Refused (:class:`~cryptdisk.errors.RotationError`) while any file of the
        database is under that key, and for the current key.
        """
        with self._mutex:
            self._writable("remove a key")
            if not self.own_keys:
                raise DatabaseError(
                    "the database was opened with a config, which holds its keys",
                    hint=f"remove key {key_id} from the config's [keyring] once system.keys "
                    "shows 0 files using it")
            if key_id == self.keyring.current_key_id:
                raise DatabaseError(f"key {key_id} is the current key of {self.path}; "
                                    "it encrypts new files and cannot be removed")
            used = self.files_under_key(key_id)
            if used:
                raise RotationError(
                    f"key {key_id} is still used by {len(used)} file(s) of {self.path}; "
                    f"removing it would lose them: {_listing(used)}", files=used,
                    hint=f"rotate first (cryptdisk rotate {self.path}), then remove it")
            path = remove_key_file(self.path, key_id)
            self._reload_own_keys()
            return path

    def reencrypt(self, on_table: Callable[[str], None] | None = None) -> None:
        """Rewrite every table's data under new data keys and the current key (online).

        Checks first that every file the catalog names can be read, then
        rewrites each table (``OPTIMIZE ... FINAL``) and rotates what remains.
        """
        with self._mutex:
            self._writable("re-encrypt")
            role_check_statement(self, "reencrypt()", None)
            self.cache.drop_derived()
            self._require_reachable("the re-encryption", rewrap=False)
            for name in list(self.catalog.tables):
                self.optimize(name, final=True)
                if on_table is not None:
                    on_table(name)
            self.rotate_keys()

    def _system_command(self, st: Any) -> None:
        if st.command == "rotate":
            self.rotate_keys()
        else:
            self.reencrypt()

"""The key files of a database opened without a config.

``PATH.key`` (beside the database directory ``PATH``) holds the current key:
new files are encrypted under it. Its id is the one its comment line notes
(``cryptdisk keygen --id N`` and the database write it; 1 if none is noted).
Every older key the database still knows is kept beside it as
``PATH.key.ID`` (e.g. ``sales.db.key.1``), so files and backups written
under it stay readable, until the user removes it.

Making a new key current is crash-safe and leaves a trace from its first
write: :func:`stage_current_key` writes the new key to ``PATH.key.new``,
syncs it and renames it to ``PATH.key.pending`` (the rotation's intent);
:func:`install_current_key` then writes the old current key to
``PATH.key.ID`` (synced) and renames ``PATH.key.pending`` over ``PATH.key``.
Killed at any point, the files hold either the old arrangement (perhaps with
the old key twice, which loading accepts, and the pending key, which loading
ignores) or the new one with the old key kept. :func:`interrupted_rotation`
tells a later run what an interrupted one left: the pending key to finish
with, or a ``PATH.key.new`` that was never staged (its key file must be given
again).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re

from ..errors import KeyFileError, KeyringError
from ..keys import Key, Keyring, read_key_file, write_key_file

__all__ = ["default_key_path", "discard_pending_key", "install_current_key",
           "interrupted_rotation", "load_keyring", "make_first_key", "pending_key_path",
           "remove_key", "retired_key_path", "stage_current_key", "sync_parent"]

log = logging.getLogger("cryptdisk.db")


def default_key_path(db_path: str) -> str:
    """The current key file of a database opened without a config: ``PATH.key``."""
    return os.path.abspath(db_path).rstrip(os.sep) + ".key"


def retired_key_path(db_path: str, key_id: int) -> str:
    """Where an older key of that database is kept: ``PATH.key.ID``."""
    return f"{default_key_path(db_path)}.{key_id}"


def pending_key_path(db_path: str) -> str:
    """The key a rotation is making current, until it is: ``PATH.key.pending``."""
    return default_key_path(db_path) + ".pending"


def _staging_path(db_path: str) -> str:
    return default_key_path(db_path) + ".new"


def sync_parent(path: str) -> None:
    """Make ``path``'s name durable: an ``fsync`` of the directory holding it."""
    fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(path: str, default_id: int | None) -> Key:
    material, noted = read_key_file(path)
    key_id = noted if noted is not None else default_id
    if key_id is None:  # pragma: no cover - callers pass a default
        raise KeyFileError(f"key file {path} notes no key id")
    return Key(key_id, material, source="file")


def _retired(db_path: str) -> dict[int, str]:
    """Key id -> path of every ``PATH.key.ID`` file."""
    base = os.path.basename(default_key_path(db_path))
    pattern = re.compile(re.escape(base) + r"\.(\d+)")
    directory = os.path.dirname(default_key_path(db_path))
    out = {}
    for name in os.listdir(directory):
        m = pattern.fullmatch(name)
        if m:
            out[int(m.group(1))] = os.path.join(directory, name)
    return out


def load_keyring(db_path: str) -> Keyring:
    """The current key (``PATH.key``) and every older key kept as ``PATH.key.ID``."""
    key_path = default_key_path(db_path)
    if not os.path.exists(key_path):
        raise KeyFileError(
            f"the key file {key_path} of database {db_path} is missing",
            hint="a database made with a config opens with that config "
            "(cryptdisk.connect(path, config), cryptdisk sql -c CONFIG); else restore the "
            "key file from your backup: without it the data cannot be read")
    current = _read(key_path, 1)
    keys = [current]
    for key_id, path in sorted(_retired(db_path).items()):
        old = _read(path, key_id)
        if old.key_id != key_id:
            raise KeyFileError(f"key file {path} notes key id {old.key_id}, not {key_id}")
        if key_id == current.key_id:
            if old.check_value != current.check_value:
                raise KeyringError(f"{path} and {key_path} hold different keys with the same "
                                   f"id {key_id}", hint="keep the one the data was written "
                                   "under (system.keys, cryptdisk inspect)")
            continue  # a rotation stopped between keeping the old key and installing the new
        keys.append(old)
    return Keyring(keys, current.key_id)


def make_first_key(db_path: str) -> None:
    """Generate the key of a new database into ``PATH.key`` (mode 0600), with a warning."""
    key_path = default_key_path(db_path)
    key = Key.generate(1)
    write_key_file(key_path, key)
    sync_parent(key_path)  # durable before a catalog is encrypted under it
    log.warning("cryptdisk: created the encryption key of database %s in %s (mode 0600). "
                "Back it up and keep it apart from the data: losing it loses the data.",
                db_path, key_path)


def _keep(path: str, key: Key) -> None:
    """Write ``key`` to ``path`` unless that file already holds it (then nothing to do)."""
    if os.path.exists(path):
        kept = _read(path, key.key_id)
        if kept.key_id == key.key_id and kept.check_value == key.check_value:
            return
        raise KeyringError(f"{path} already holds another key", hint="move it away first")
    write_key_file(path, key)
    sync_parent(path)


def _needs_install(db_path: str, keyring: Keyring, key: Key) -> bool:
    """False if ``key`` is the current key already; raises if its id or material is taken."""
    for known in keyring:
        if known.check_value == key.check_value and known.key_id != key.key_id:
            raise KeyringError(f"the new key is already key {known.key_id} of database "
                               f"{db_path}", hint="generate a new key: cryptdisk keygen")
    if key.key_id in keyring:
        same = keyring.key_by_id(key.key_id).check_value == key.check_value
        if same and keyring.current_key_id == key.key_id:
            return False
        if not same:
            free = max(keyring.ids) + 1
            raise KeyringError(
                f"database {db_path} already has a key with id {key.key_id}; the new key "
                "needs an id of its own",
                hint=f"generate it with another id: cryptdisk keygen -o NEW.key --id {free}")
    return True


def _holds(path: str, key: Key) -> bool:
    try:
        kept = _read(path, key.key_id)
    except (FileNotFoundError, KeyFileError):
        return False
    return kept.key_id == key.key_id and kept.check_value == key.check_value


def stage_current_key(db_path: str, key: Key) -> bool:
    """Record ``key`` as the key a rotation makes current: ``PATH.key.pending`` (crash-safe).

    The first write of a rotation to a new key, so that a rotation killed before
    :func:`install_current_key` leaves its intent behind. Returns False (nothing
    written) if the key is current already. Refuses a key whose id or material the
    database's keys already use for another key. A pending key of an earlier,
    interrupted rotation is replaced (no file is under it: it was never current).
    """
    if not _needs_install(db_path, load_keyring(db_path), key):
        return False
    pending = pending_key_path(db_path)
    if _holds(pending, key):
        return True
    tmp = _staging_path(db_path)
    try:
        write_key_file(tmp, key, overwrite=True)  # synced
        os.replace(tmp, pending)
    except BaseException:
        # An error (a full disk, an I/O error): gone again, so that a rerun without the key
        # is not taken for one after a rotation killed while staging it (which asks for it)
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    sync_parent(pending)
    return True


def interrupted_rotation(db_path: str) -> Key | None:
    """The key of a rotation that was stopped before it made it current, or None.

    Raises :class:`KeyringError` if the rotation was stopped while staging its key
    (``PATH.key.new`` without a whole ``PATH.key.pending`` from the same run): the
    key file has to be given again.
    """
    staging, pending = _staging_path(db_path), pending_key_path(db_path)
    if os.path.exists(staging):
        raise KeyringError(
            f"a rotation of database {db_path} to a new key was interrupted before it "
            f"recorded the key ({staging} is left); its files are still under key "
            f"{load_keyring(db_path).current_key_id}",
            hint=f"run it again with the same key file: cryptdisk rotate {db_path} "
            "--new-key FILE")
    if not os.path.exists(pending):
        return None
    material, noted = read_key_file(pending)
    if noted is None:  # stage_current_key notes it; another file is not ours to install
        raise KeyFileError(f"{pending} notes no key id; it is not a key a rotation staged",
                           hint=f"move it away, then run: cryptdisk rotate {db_path} "
                           "--new-key FILE")
    return Key(noted, material, source="file")


def discard_pending_key(db_path: str) -> None:
    """Delete ``PATH.key.pending`` and its temporary (a rotation that failed its checks)."""
    for path in (_staging_path(db_path), pending_key_path(db_path)):
        if os.path.exists(path):
            os.remove(path)
            sync_parent(path)


def install_current_key(db_path: str, key: Key) -> bool:
    """Make ``key`` the current key of the database, keeping the old one (crash-safe).

    Stages it first (:func:`stage_current_key`) unless it is staged already.
    Returns False if it already was current (a rerun of a rotation that was
    stopped). Refuses a key whose id is taken by another key.
    """
    if not stage_current_key(db_path, key):
        return False
    keyring = load_keyring(db_path)
    old = keyring.current_key()
    _keep(retired_key_path(db_path, old.key_id), old)
    key_path = default_key_path(db_path)
    os.replace(pending_key_path(db_path), key_path)
    sync_parent(key_path)
    with_id = retired_key_path(db_path, key.key_id)
    if os.path.exists(with_id):  # it was an older key made current again
        os.remove(with_id)
        sync_parent(with_id)
    return True


def remove_key(db_path: str, key_id: int) -> str:
    """Delete the older key ``PATH.key.ID``; returns its path. The caller checks it is unused."""
    keyring = load_keyring(db_path)
    if key_id == keyring.current_key_id:
        raise KeyringError(f"key {key_id} is the current key of database {db_path}; it "
                           "encrypts new files and cannot be removed")
    path = retired_key_path(db_path, key_id)
    if key_id not in keyring or not os.path.exists(path):
        raise KeyringError(f"database {db_path} has no key with id {key_id} (keys: "
                           f"{', '.join(map(str, keyring.ids))})")
    os.remove(path)
    sync_parent(path)
    return path

"""Keys loaded again (a rotation, a followed config) leave no PKCS#11 session open: the
sessions are counted in the SoftHSM2 token itself (C_GetSessionInfo on every handle)."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import cryptdisk
from cryptdisk.keys import Keyring
from cryptdisk.keys.providers import generate_pkcs11_key

from .conftest import SECURE_STORE, Token, entry_toml, write

AD = bytes(range(48))


def open_sessions(module: str) -> int:
    """Sessions open in this process on the token's module (SoftHSM2 numbers sessions and
    objects from one counter: every handle up to past the highest in use is asked)."""
    lib = ctypes.CDLL(module)
    lib.C_GetSessionInfo.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    info = ctypes.create_string_buffer(64)  # CK_SESSION_INFO: four CK_ULONGs
    found = last = 0
    handle = 1
    while handle < last + 5000 or handle < 20000:
        if lib.C_GetSessionInfo(handle, info) == 0:
            found, last = found + 1, handle
        handle += 1
    return found


@pytest.fixture
def token_key(softhsm: Token, monkeypatch: pytest.MonkeyPatch,
              request: pytest.FixtureRequest) -> str:
    monkeypatch.setenv("CD_TEST_PIN", softhsm.pin)
    label = "kek-" + request.node.name[-40:]
    generate_pkcs11_key(softhsm.module, softhsm.label, label, pin=softhsm.pin)
    return label


def _settled(module: str) -> int:
    gc.collect()  # keys other tests dropped are closed when collected
    return open_sessions(module)


def test_rotations_of_a_database_leave_no_session_open(tmp_path: Path, softhsm: Token,
                                                       token_key: str) -> None:
    """Each SYSTEM ROTATE KEYS loads the config's keys again: every load left one session
    open in the token (python-pkcs11 opens the session before the login the token refuses
    while this process is logged in already, and never closes it), and the replaced keys
    were not closed: +1 session per rotation, until the token's limit. Now the count
    stays where the first rotation left it."""
    cfg = write(tmp_path, "[keyring]\ncurrent_key_id = 3\n" + entry_toml(
        softhsm, token_key, key_id=3) + SECURE_STORE)
    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        db.sql("CREATE TABLE t (i BIGINT)")
        db.sql("INSERT INTO t SELECT i FROM range(100) r(i)")
        db.sql("SYSTEM ROTATE KEYS")
        steady = _settled(softhsm.module)
        counts = []
        for _ in range(5):
            db.sql("SYSTEM ROTATE KEYS")
            db.sql("INSERT INTO t VALUES (100)")  # written under the reloaded key
            counts.append(_settled(softhsm.module))
        assert counts == [steady] * 5, (steady, counts)
        assert db.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 105}]


def test_a_keyring_reloaded_while_threads_use_its_keys(tmp_path: Path, softhsm: Token,
                                                       token_key: str) -> None:
    """Keyring.adopt (what a rotation and a followed config do) replaced the key objects
    and left the replaced ones open. Now a replaced key is closed once no call uses it:
    threads wrapping and unwrapping (no unwrap cache: every call goes to the token) with
    the keys they looked up while the keyring is reloaded ten times see no error, and
    once the keyring is closed no session is left."""
    cfg = write(tmp_path, "[keyring]\n" + entry_toml(softhsm, token_key, key_id=4,
                                                     extra="cache_entries = 0\n"))
    before = _settled(softhsm.module)
    ring = Keyring.from_config(cfg)
    loaded = _settled(softhsm.module)
    errors: list[BaseException] = []
    stop = threading.Event()

    def use() -> None:
        try:
            while not stop.is_set():
                key = ring.current_key()
                dek = os.urandom(32)
                blob = key.wrap(dek, AD)
                assert ring.key_by_id(4).unwrap(blob, AD) == dek
                assert key.unwrap(blob, AD) == dek  # the key looked up first, maybe replaced
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=use) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        for _ in range(10):
            ring.adopt(Keyring.from_config(cfg))
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert _settled(softhsm.module) == loaded  # the key's session (and the login's)
    ring.close()
    assert _settled(softhsm.module) == before


def test_closing_a_database_closes_the_keys_it_loaded(tmp_path: Path, softhsm: Token,
                                                      token_key: str) -> None:
    """Database.close() let go of its lock and caches but left the PKCS#11 session of the
    keys it loaded from its config file open until the database was collected. Now close()
    closes them (the database still referenced, the collector kept from running), and
    only those: a config object the caller passed keeps its keys open for the caller."""
    cfg = write(tmp_path, "[keyring]\ncurrent_key_id = 5\n" + entry_toml(
        softhsm, token_key, key_id=5) + SECURE_STORE)
    before = _settled(softhsm.module)
    gc.disable()
    try:
        db = cryptdisk.connect(tmp_path / "db", cfg)
        db.sql("CREATE TABLE t (i BIGINT)")
        db.sql("INSERT INTO t SELECT i FROM range(10) r(i)")
        assert open_sessions(softhsm.module) > before
        db.close()
        assert open_sessions(softhsm.module) == before
    finally:
        gc.enable()
    del db

    from cryptdisk.config import load_config

    config = load_config(cfg)
    with cryptdisk.connect(tmp_path / "db", config) as db:
        assert db.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 10}]
        opened = open_sessions(softhsm.module)
        assert opened > before
    assert open_sessions(softhsm.module) == opened  # the caller's keys: still open
    key = config.keyring.current_key()  # and usable
    dek = os.urandom(32)
    assert key.unwrap(key.wrap(dek, AD), AD) == dek
    config.keyring.close()
    assert _settled(softhsm.module) == before


def test_a_rotation_closes_the_reloaded_keys_it_does_not_take(
        tmp_path: Path, softhsm: Token, token_key: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotation loads the config file again and takes the keys of the keyring and of the
    disks the database has; a key it did not take (here: of a disk added to the file since
    the database opened) was left for the collector to close, so anything that still held
    the loaded config (here: a list, as a reference cycle would) kept its PKCS#11 session
    open, +1 per rotation. Now the rotation closes those keys itself, and only those: the
    keys taken write and read on."""
    from cryptdisk.db import _rotation

    base = "[keyring]\ncurrent_key_id = 3\n" + entry_toml(softhsm, token_key, key_id=3)
    cfg = write(tmp_path, base + SECURE_STORE)
    other = token_key + "-other"
    generate_pkcs11_key(softhsm.module, softhsm.label, other, pin=softhsm.pin)
    held: list[object] = []
    resolve = _rotation.resolve_config

    def resolve_and_hold(*args: Any) -> Any:
        held.append(resolve(*args))
        return held[-1]

    with cryptdisk.connect(tmp_path / "db", cfg) as db:
        db.sql("CREATE TABLE t (i BIGINT)")
        db.sql("INSERT INTO t SELECT i FROM range(10) r(i)")
        write(tmp_path, base + SECURE_STORE + "\n".join([
            "[disks.other_local]", 'type = "local"', 'path = "store/other"',
            "[disks.other]", 'type = "encrypted"', 'disk = "other_local"', ""]) + entry_toml(
            softhsm, other, key_id=8).replace("[[keyring.keys]]", "[[disks.other.keys]]"))
        monkeypatch.setattr(_rotation, "resolve_config", resolve_and_hold)
        steady = _settled(softhsm.module)
        counts = []
        for _ in range(5):
            db.sql("SYSTEM ROTATE KEYS")
            db.sql("INSERT INTO t VALUES (10)")  # written under the key the rotation took
            counts.append(_settled(softhsm.module))
        # the first change after the file changed loads it again (a writer follows its
        # config), then each rotation does: none of them leaves a session open
        assert len(held) == 6
        assert counts == [steady] * 5, (steady, counts)
        assert db.sql("SELECT count(*) AS n FROM t").to_pylist() == [{"n": 15}]

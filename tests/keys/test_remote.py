"""The contract for keys that stay in a provider: ProviderKey and its unwrap cache,
with a fake provider (the real ones are tested in tests/keys/providers)."""

from __future__ import annotations

import os
import pickle
from typing import Any, ClassVar

import pytest
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

import cryptdisk
from cryptdisk.errors import ConfigError, KeySourceError
from cryptdisk.keys import Keyring, ProviderKey, RemoteKeyProvider, UnwrapCache, _provider
from cryptdisk.keys import register_key_provider as register

AD = b"a" * 48


class FakeKms(RemoteKeyProvider):
    """A fake KMS: its key lives in the class, never in the keyring; counts its calls."""

    name = "fake-kms"
    label = "fake"
    fields: ClassVar[frozenset[str]] = frozenset({"key"})
    required: ClassVar[frozenset[str]] = frozenset({"key"})
    keys: ClassVar[dict[str, bytes]] = {}
    calls: ClassVar[list[str]] = []

    def connect(self, what: str, key_id: int) -> int:
        self.aead = AESGCM(self.keys.setdefault(self.value["key"], os.urandom(32)))
        return 32

    def check_value(self) -> bytes:
        return self.aead.encrypt(bytes(12), b"", b"check")[:8]

    def seal(self, nonce: bytes, dek: bytes, associated_data: bytes) -> bytes:
        self.calls.append("seal")
        return self.aead.encrypt(nonce, dek, associated_data)

    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        self.calls.append("open")
        return self.aead.decrypt(nonce, sealed, associated_data)


@pytest.fixture(autouse=True)
def _own_registry(monkeypatch):
    monkeypatch.setattr(_provider, "_KNOWN", dict(_provider._KNOWN))
    monkeypatch.setattr(_provider, "_loaded", dict(_provider._loaded))
    monkeypatch.setattr(_provider, "_SOURCES", set(_provider._SOURCES))
    register("fake-kms", FakeKms, source=True)
    FakeKms.calls.clear()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_cache_is_bounded_in_count_and_age_and_wipes_what_it_drops():
    clock = Clock()
    cache = UnwrapCache(entries=2, seconds=10, clock=clock)
    cache.put(b"w1", AD, b"1" * 32)
    held = next(iter(cache._items.values()))[1]  # the cache's own buffer
    cache.put(b"w2", AD, b"2" * 32)
    assert cache.get(b"w1", AD) == b"1" * 32 and len(cache) == 2
    cache.put(b"w3", AD, b"3" * 32)  # over the count: the oldest goes, zeroed
    assert cache.get(b"w1", AD) is None and held == bytearray(32)
    assert cache.get(b"w2", b"b" * 48) is None  # other associated data, other entry
    held = cache._items[next(iter(cache._items))][1]
    clock.now += 10  # the age bound
    assert cache.get(b"w2", AD) is None and cache.get(b"w3", AD) is None
    assert held == bytearray(32) and len(cache) == 0
    cache.put(b"w4", AD, b"4" * 32)
    held = next(iter(cache._items.values()))[1]
    cache.clear()
    assert held == bytearray(32) and cache.get(b"w4", AD) is None
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(cache)
    off = UnwrapCache(entries=0)
    off.put(b"w", AD, b"k" * 32)
    assert off.get(b"w", AD) is None


def _ring(tmp_path, extra: str = "") -> Keyring:
    path = tmp_path / "c.toml"
    path.write_text(f'[keyring]\n[[keyring.keys]]\nid = 3\nsource = "fake-kms"\nkey = "k"\n'
                    f"{extra}")
    return Keyring.from_config(path)


def test_a_source_entry_makes_a_provider_key_that_wraps_through_the_provider(tmp_path):
    ring = _ring(tmp_path, "cache_entries = 5\ncache_seconds = 60\n")
    key = ring.current_key()
    assert isinstance(key, ProviderKey) and key.key_id == 3 and key.source == "fake"
    assert (key.cache.entries, key.cache.seconds) == (5, 60.0)
    blob = key.wrap(b"d" * 32, AD)
    key.cache.clear()
    assert key.unwrap(blob, AD) == b"d" * 32 and key.unwrap(blob, AD) == b"d" * 32
    assert FakeKms.calls == ["seal", "open"]  # the second unwrap came from the cache
    with pytest.raises(InvalidTag):
        key.unwrap(blob[:-1] + bytes([blob[-1] ^ 1]), AD)
    path = tmp_path / "f"
    with cryptdisk.open(path, "wb", keyring=ring) as f:
        f.write(b"payload")
    ring.close()  # wipes the cache: the next open asks the provider again
    before = FakeKms.calls.count("open")
    with cryptdisk.open(path, "rb", keyring=ring) as f:
        assert f.read() == b"payload"
    assert FakeKms.calls.count("open") == before + 1


@pytest.mark.parametrize(("extra", "message"), [
    ('source = "nope"\n', "unknown source 'nope'"),
    ('source = "from_env"\n', "field provider"),
    ('source = "fake-kms"\nkey = "k"\nregion = "x"\n', "does not take region"),
    ('source = "fake-kms"\n', "needs key"),
    ('source = "fake-kms"\nkey = "k"\ncache_entries = -1\n', "cache entries"),
])
def test_bad_source_entries_are_config_errors(tmp_path, extra, message):
    path = tmp_path / "c.toml"
    path.write_text(f"[keyring]\n[[keyring.keys]]\nid = 1\n{extra}")
    with pytest.raises(ConfigError, match=message) as info:
        Keyring.from_config(path)
    assert str(path) in str(info.value)


def test_a_source_provider_hands_out_no_material():
    with pytest.raises(KeySourceError, match="keeps its key"):
        FakeKms({"key": "k"}, base=".").load("key 1", (32,))


def test_registering_a_source_name():
    with pytest.raises(ValueError, match="identifier"):
        register("source", FakeKms)
    with pytest.raises(ValueError, match="identifier"):
        register("a-b", FakeKms)  # hyphens only for source providers
    register("other-kms", FakeKms, source=True)
    assert "other-kms" in _provider._SOURCES


def test_unknown_provider_install_hint(tmp_path: Any, monkeypatch):
    monkeypatch.setitem(_provider._KNOWN, "aws-kms", {"class": "no_such_module_x:Cls",
                                                      "err": "pip install 'cryptdisk[kms]'"})
    _provider._loaded.pop("aws-kms", None)  # as in a process that has not imported it yet
    path = tmp_path / "c.toml"
    path.write_text('[keyring]\n[[keyring.keys]]\nid = 1\nsource = "aws-kms"\n')
    with pytest.raises(KeySourceError, match="cannot be imported") as info:
        Keyring.from_config(path)
    assert info.value.hint == "pip install 'cryptdisk[kms]'"


def test_retry_policy_retries_only_transient_faults_with_growing_waits(tmp_path):
    from cryptdisk.errors import KeyProviderError
    from cryptdisk.keys import RetryPolicy

    waits: list[float] = []
    policy = RetryPolicy(3, 0.5, sleep=waits.append)
    attempts = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise KeyProviderError("fake: unreachable", transient=True)
        return "ok"

    assert policy.call("open", 1, flaky) == "ok" and len(attempts) == 3
    assert len(waits) == 2 and 0.4 <= waits[0] <= 0.6 and 0.8 <= waits[1] <= 1.2
    attempts.clear()

    def refused() -> None:
        attempts.append(1)
        raise KeyProviderError("fake: access denied")

    with pytest.raises(KeyProviderError, match="access denied") as info:
        policy.call("open", 1, refused)
    assert len(attempts) == 1 and not info.value.transient

    def down() -> None:
        raise KeyProviderError("fake: unreachable", transient=True)

    waits.clear()
    with pytest.raises(KeyProviderError, match=r"unreachable \(gave up after 4 attempts"):
        policy.call("seal", 1, down)
    assert len(waits) == 3
    with pytest.raises(ConfigError, match="retries must be"):
        Keyring.from_config(_cfg_with(tmp_path, "retries = -1"))


def _cfg_with(tmp_path, extra: str) -> str:
    path = tmp_path / "c.toml"
    path.write_text(f'[keyring]\n[[keyring.keys]]\nid = 1\nsource = "fake-kms"\nkey = "r"\n'
                    f"{extra}\n")
    return str(path)


def test_a_provider_key_dropped_unclosed_wipes_its_cache_closes_and_logs_its_use(
        tmp_path, monkeypatch):
    """A keyring dropped without close() (what every cryptdisk command does with its keys
    when it returns) zeroes its unwrap cache, closes its provider and writes the ``use``
    event when the key is collected, not only at the interpreter's exit."""
    import gc
    import json

    gc.collect()  # keys earlier tests left unclosed log their use now, not into this log
    log = tmp_path / "audit.log"
    monkeypatch.setenv("CRYPTDISK_KEY_AUDIT_LOG", str(log))
    closed: list[bool] = []
    monkeypatch.setattr(FakeKms, "close", lambda self: closed.append(True), raising=False)
    ring = _ring(tmp_path)
    key = ring.current_key()
    blob = key.wrap(b"d" * 32, AD)
    assert key.unwrap(blob, AD) == b"d" * 32
    held = [dek for _t, dek, _locked in key.cache._items.values()]
    assert held and all(bytes(d) == b"d" * 32 for d in held)
    del key, ring
    gc.collect()
    assert all(d == bytearray(32) for d in held)  # zeroed, not just freed
    assert closed
    (use,) = [json.loads(x) for x in log.read_text().splitlines() if '"use"' in x]
    assert (use["key_id"], use["wraps"], use["unwraps"]) == (3, 1, 1)


@pytest.mark.parametrize(("extra", "message"), [
    # the keyring is whole; a disk after it is wrong
    ('[disks.x]\ntype = "nope"\n', "unknown type"),
    # a disk's own provider-held key made, then the disk's next key is wrong
    ('[disks.raw]\ntype = "local"\npath = "raw"\n[disks.x]\ntype = "encrypted"\n'
     'disk = "raw"\ncurrent_key_id = 5\n[[disks.x.keys]]\nid = 5\nsource = "fake-kms"\n'
     'key = "d"\n[[disks.x.keys]]\nid = 5\nhex = "' + "ab" * 32 + '"\n', "duplicate key id"),
])
def test_a_config_that_fails_to_load_closes_the_provider_keys_it_made(tmp_path, monkeypatch,
                                                                      extra, message):
    """load_config (and Keyring.from_config) that fail after making provider-held keys closed
    none of them: each kept its provider session (a PKCS#11 session, a KMIP connection, an
    unwrapped KEK) and unwrap cache until the garbage collector found it, which is never
    while anything holds the exception (its traceback holds the keys). Now every key the
    failed load made is closed before the error reaches the caller."""
    import gc

    from cryptdisk.config import load_config

    closed: list[str] = []
    monkeypatch.setattr(FakeKms, "close", lambda self: closed.append(self.value["key"]),
                        raising=False)
    path = tmp_path / "c.toml"
    path.write_text('[keyring]\ncurrent_key_id = 3\n[[keyring.keys]]\nid = 3\n'
                    'source = "fake-kms"\nkey = "k"\n' + extra)
    gc.disable()  # no collection may close them for the load
    try:
        with pytest.raises(ConfigError, match=message) as info:
            load_config(path)
        assert set(closed) == ({"d", "k"} if "fake-kms\"\nkey = \"d\"" in extra else {"k"})
        path.write_text('[keyring]\ncurrent_key_id = 3\n[[keyring.keys]]\nid = 3\n'
                        'source = "fake-kms"\nkey = "k2"\n[[keyring.keys]]\nid = 3\n'
                        'source = "fake-kms"\nkey = "k3"\n')
        with pytest.raises(ConfigError, match="duplicate key id 3"):
            Keyring.from_config(path)
        assert {"k2", "k3"} <= set(closed)
    finally:
        gc.enable()
    assert info.value is not None  # (the exception, with its traceback, was held throughout)

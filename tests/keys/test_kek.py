"""A keyring key held for a bounded time after one provider call (HeldKekProvider), with a
fake provider; the real users (aws-kms, wrapped_key) are tested in tests/keys/providers."""

from __future__ import annotations

import os
import pickle
import time
from typing import ClassVar

import pytest
from cryptography.exceptions import InvalidTag

from cryptdisk.errors import KeyProviderError
from cryptdisk.keys import Key, ProviderKey, RetryPolicy, UnwrapCache
from cryptdisk.keys._kek import HeldKekProvider

AD = b"h" * 48


class FakeWrapping(HeldKekProvider):
    """Unwraps the next of ``answers`` per provider call (a KEK, or an error it raises)."""

    name = "fake-wrapping"
    label = "fake"
    fields: ClassVar[frozenset[str]] = frozenset({"wrapped_key"})
    required: ClassVar[frozenset[str]] = frozenset({"wrapped_key"})

    def __init__(self, answers: list[bytes | Exception], kek_seconds: float = 60) -> None:
        super().__init__({"wrapped_key": "k.fake"}, base="/nowhere")
        self.answers = answers
        self.kek_seconds = kek_seconds

    def _unwrap_kek(self, what: str) -> bytearray:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return bytearray(answer)

    def _what_stays(self) -> str:
        return "the fake key stays"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """time.monotonic under the test's control: ``clock[0]`` is now."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    return now


def test_one_provider_call_seals_and_opens_as_a_local_key_of_that_value(clock):
    kek = os.urandom(32)
    provider = FakeWrapping([kek])
    key = ProviderKey(3, provider, cache=UnwrapCache(0))
    local = Key(3, kek)
    assert key.check_value == local.check_value
    blobs = [key.wrap(bytes([i]) * 32, AD) for i in range(10)]
    assert [local.unwrap(b, AD) for b in blobs] == [bytes([i]) * 32 for i in range(10)]
    assert key.unwrap(local.wrap(b"d" * 32, AD), AD) == b"d" * 32
    with pytest.raises(InvalidTag):
        key.unwrap(blobs[0], AD[:-1] + b"x")
    assert provider.unwraps == 1 and key.uses["provider_calls"] == 12  # 11 wraps+unwraps
    key.close()  # the KEK is zeroed; the next use unwraps it again
    assert provider._kek is None
    provider.answers.append(kek)
    assert key.unwrap(blobs[1], AD) == bytes([1]) * 32 and provider.unwraps == 2


def test_the_kek_is_zeroed_after_kek_seconds_and_forgotten_when_unwrapping_fails(clock):
    kek = os.urandom(16)
    outage = KeyProviderError("key 3: the fake provider does not answer", transient=True)
    provider = FakeWrapping([kek, outage, outage, kek], kek_seconds=60)
    key = ProviderKey(3, provider, cache=UnwrapCache(0), retry=RetryPolicy(0))
    held = provider._kek
    blob = key.wrap(b"k" * 32, AD)
    clock[0] += 59.9
    assert key.unwrap(blob, AD) == b"k" * 32 and provider.unwraps == 1
    clock[0] += 0.1
    with pytest.raises(KeyProviderError, match="does not answer") as info:
        key.unwrap(blob, AD)
    assert info.value.transient
    assert held == bytearray(16) and provider._kek is None  # expired: zeroed, not kept on
    with pytest.raises(KeyProviderError, match="does not answer"):
        key.wrap(b"k" * 32, AD)  # nothing held: each use asks the provider again
    assert key.unwrap(blob, AD) == b"k" * 32 and provider.unwraps == 2


def test_a_kek_that_changed_or_is_no_aes_key_is_refused_and_not_kept(clock):
    provider = FakeWrapping([os.urandom(32), os.urandom(32), b"x" * 24], kek_seconds=1)
    key = ProviderKey(4, provider, cache=UnwrapCache(0))
    blob = key.wrap(b"k" * 32, AD)
    clock[0] += 1
    with pytest.raises(KeyProviderError, match="now holds another key than at start-up"):
        key.unwrap(blob, AD)
    assert provider._kek is None
    with pytest.raises(KeyProviderError, match="unwrapped to 24 bytes, not an AES key"):
        key.unwrap(blob, AD)
    assert provider._kek is None and provider.unwraps == 2


def test_the_held_kek_is_in_no_message_repr_or_pickle(clock):
    kek = os.urandom(32)
    provider = FakeWrapping([kek, os.urandom(32)], kek_seconds=1)
    key = ProviderKey(5, provider, cache=UnwrapCache(0))
    clock[0] += 1
    with pytest.raises(KeyProviderError) as info:
        key.wrap(b"k" * 32, AD)
    shown = [repr(provider), str(provider), repr(key), str(info.value), repr(info.value)]
    assert not [s for s in shown if kek.hex() in s or repr(kek)[2:-1] in s]
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(provider)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)


def test_destroy_deletes_the_wrapped_key_file_once(tmp_path):
    provider = FakeWrapping([])
    provider.base = str(tmp_path)
    (tmp_path / "k.fake").write_bytes(b"sealed")
    assert provider.destroy("key 1") == (f"deleted wrapped key file {tmp_path / 'k.fake'} "
                                         "(the fake key stays)")
    assert not (tmp_path / "k.fake").exists()
    assert provider.destroy("key 1") == f"wrapped key file {tmp_path / 'k.fake'} was already gone"

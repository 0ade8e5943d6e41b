"""Keys that stay in a provider (an HSM, a KMS): the contract, the key object, the unwrap cache.

Envelope layout (the file format is unchanged, see ``docs/format.md``): every file
header holds a random per-file data key (DEK) in its 64-byte key slot as
``nonce(12) || AES-GCM(KEK, nonce, DEK, ad=header[0:48])``. With a provider-held
keyring entry the KEK is a key inside the provider, and that AES-GCM runs there:
:meth:`RemoteKeyProvider.seal` and :meth:`RemoteKeyProvider.open` are the only
things cryptdisk asks of it. A provider that cannot run AES-GCM on a caller's nonce
and associated data (a cloud KMS) implements them with a local KEK it unwraps
through the service and keeps in memory for a bounded time (``_kek.py``).

What stays in process memory: the KEK never (for providers that keep it, such as
PKCS#11 tokens); each file's DEK while the file is open, as with any key; and the
DEKs in the :class:`UnwrapCache`, bounded in count and age, wiped on expiry and on
:meth:`ProviderKey.close`. Wiping in Python is best effort: the cache zeroes its own
``bytearray`` copies, but the ``bytes`` handed to the cipher are immutable.
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import contextvars
import hmac
import os
import random
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag

from ..errors import KeyProviderError, KeyringError, KeySourceError
from ..format import Algorithm
from ._audit import audit_event
from ._hygiene import lock_buffer, wipe_buffer
from ._key import Key
from ._provider import KeyProvider

__all__ = ["DEFAULT_CACHE_ENTRIES", "DEFAULT_CACHE_SECONDS", "ProviderKey",
           "RemoteKeyProvider", "RetryPolicy", "UnwrapCache", "close_provider_keys",
           "closed_on_error"]

#: Unwrapped data keys kept per provider-held key, and for how long, unless the entry says.
DEFAULT_CACHE_ENTRIES = 10_000
DEFAULT_CACHE_SECONDS = 300.0
#: How often a provider call that failed transiently is tried again, and the first wait.
DEFAULT_RETRIES = 2
DEFAULT_RETRY_SECONDS = 0.5
#: The longest wait between two attempts (the wait doubles from retry_seconds up to this).
MAX_RETRY_WAIT = 5.0
#: Fields every provider-held entry accepts besides its provider's own.
COMMON_FIELDS = frozenset({"cache_seconds", "cache_entries", "retries", "retry_seconds"})


class RemoteKeyProvider(KeyProvider):
    """A provider whose key-encryption key stays inside it (``source = "NAME"`` entries).

    Contract (besides :class:`KeyProvider`'s):

    * Selected by ``source = "NAME"`` in a key entry; ``value`` is a dict of the
      entry's other fields except ``id``, ``algorithm``, ``source`` and the cache
      settings. ``fields`` lists the ones the provider takes; ``__init__`` checks them
      (unknown or missing field: :class:`TypeError` completing "key N: NAME ...") and
      reads no secret. A PIN or credential is only ever named (an environment
      variable, a file), never given inline.
    * :meth:`connect` (``what`` names the key in messages) is called once, when the
      config is loaded: it opens the session or client, finds the key, checks what
      the service can tell (a PKCS#11 key must be sensitive and non-extractable) and
      returns the key's size in bytes.
      It fails with :class:`~cryptdisk.errors.KeyProviderError` within a timeout.
    * :meth:`check_value` returns 8 bytes that depend only on the key (written in
      every header so a wrong key is told from a tampered one) and reveal nothing.
    * :meth:`seal` returns ``AES-GCM(KEK, nonce, dek, ad)`` as ciphertext and 16-byte
      tag; :meth:`open` inverts it and raises
      :class:`cryptography.exceptions.InvalidTag` when it does not authenticate, or
      :class:`~cryptdisk.errors.KeyProviderError` when the provider failed (so an
      outage is never reported as tampering, where the provider tells them apart).
    * Safe to call from several threads (serialise inside when the library is not).
    * :meth:`close` releases the session; later calls may reconnect or raise.
      Messages and ``repr`` never contain a PIN, a credential or key material.
    """

    fields: ClassVar[frozenset[str]] = frozenset()
    required: ClassVar[frozenset[str]] = frozenset()
    #: seals with AES-GCM on any nonce and data, so it can keep a keyring key wrapped
    #: (``wrapped_key = "FILE"``, :class:`~cryptdisk.keys.WrappedKekProvider`)
    wraps_keys: ClassVar[bool] = False

    def __init__(self, value: Any, *, base: str) -> None:
        if not isinstance(value, Mapping):
            raise TypeError("takes the entry's fields")
        unknown = set(value) - self.fields
        if unknown:
            raise TypeError(f"does not take {', '.join(sorted(unknown))} (fields: "
                            f"{', '.join(sorted(self.fields | COMMON_FIELDS))})")
        missing = self.required - set(value)
        if missing:
            raise TypeError(f"needs {', '.join(sorted(missing))}")
        super().__init__(dict(value), base=base)

    def load(self, what: str, sizes: tuple[int, ...]) -> bytes:
        raise KeySourceError(f"{what}: the {self.name} provider keeps its key; it wraps and "
                             "unwraps data keys itself and hands out no key material")

    @abc.abstractmethod
    def connect(self, what: str, key_id: int) -> int:
        """Open the provider, find and check the key; its size in bytes (16 or 32).

        ``key_id`` is the keyring id of the entry (a provider may bind it to its key).
        """

    @abc.abstractmethod
    def check_value(self) -> bytes:
        """8 bytes that depend only on the key."""

    @abc.abstractmethod
    def seal(self, nonce: bytes, dek: bytes, associated_data: bytes) -> bytes:
        """``AES-GCM(KEK, nonce, dek, ad)``: ciphertext || 16-byte tag."""

    @abc.abstractmethod
    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        """The data key; :class:`InvalidTag` when ``sealed`` does not authenticate."""

    def close(self) -> None:
        """Release the session or client."""

    def destroy(self, what: str) -> str:
        """Destroy the key in the provider (``cryptdisk keys destroy``); what was done.

        Called on an unconnected provider built from a retired entry. A key that is
        already gone is not an error (a destroy killed half-way is run again).
        Providers that cannot destroy their key raise :class:`KeyProviderError`.
        """
        raise KeyProviderError(f"{what}: the {self.name} provider cannot destroy its key",
                               hint="destroy it in the provider, then remove the entry")

    def describe(self) -> str:
        """Where the key is, for messages and ``system.keys`` (no secret)."""
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()}>"


class RetryPolicy:
    """Retries of provider calls that failed transiently (unreachable, no answer in time).

    A call that raises :class:`~cryptdisk.errors.KeyProviderError` with ``transient``
    set is tried again up to ``retries`` times, waiting ``seconds``, then twice as long
    each time (at most :data:`MAX_RETRY_WAIT`, with +-20% jitter); each failed attempt
    is a ``fault`` event in the audit log. A refusal (not transient) and
    :class:`~cryptography.exceptions.InvalidTag` are never retried. Sealing is safe
    to repeat: the nonce, data key and associated data are the same, so the provider
    computes the same ciphertext.
    """

    def __init__(self, retries: int = DEFAULT_RETRIES, seconds: float = DEFAULT_RETRY_SECONDS,
                 *, sleep: Callable[[float], None] = time.sleep) -> None:
        if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 100:
            raise ValueError(f"retries must be a whole number from 0 to 100, not {retries!r}")
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not (
                0 <= seconds <= 60):
            raise ValueError(f"retry_seconds must be a number from 0 to 60, not {seconds!r}")
        self.retries = retries
        self.seconds = float(seconds)
        self._sleep = sleep

    def call(self, operation: str, key_id: int, fn: Callable[[], Any]) -> Any:
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                return fn()
            except KeyProviderError as exc:
                if not exc.transient:
                    raise
                if attempt >= self.retries:
                    if not attempt:
                        raise
                    took = time.monotonic() - start
                    raise KeyProviderError(f"{exc} (gave up after {attempt + 1} attempts in "
                                           f"{took:.1f} s)", hint=exc.hint,
                                           transient=True) from None
                wait = min(MAX_RETRY_WAIT, self.seconds * 2 ** attempt)
                wait *= random.uniform(0.8, 1.2)
                audit_event("fault", key_id, operation=operation, attempt=attempt + 1,
                            error=str(exc)[:300], retry_in=round(wait, 3))
                self._sleep(wait)
                attempt += 1

    def __repr__(self) -> str:
        return f"<RetryPolicy retries={self.retries} seconds={self.seconds:g}>"


class UnwrapCache:
    """Unwrapped data keys by wrapped blob and associated data: at most ``entries``, each
    for at most ``seconds``; per process (it is never pickled or shared).

    Expired entries are zeroed and dropped on every access; :meth:`clear` zeroes and
    drops all. ``entries = 0`` or ``seconds = 0`` turns the cache off.
    """

    def __init__(self, entries: int = DEFAULT_CACHE_ENTRIES,
                 seconds: float = DEFAULT_CACHE_SECONDS, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(entries, int) or isinstance(entries, bool) or entries < 0:
            raise ValueError(f"cache entries must be a whole number >= 0, not {entries!r}")
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds < 0:
            raise ValueError(f"cache seconds must be a number >= 0, not {seconds!r}")
        self.entries = entries
        self.seconds = float(seconds)
        self._clock = clock
        # key -> (when it was put, the data key, whether its pages are mlocked)
        self._items: OrderedDict[bytes, tuple[float, bytearray, bool]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._items)

    def _expire(self, now: float) -> None:
        while self._items:
            k, (born, dek, locked) = next(iter(self._items.items()))
            if now - born < self.seconds:
                return
            wipe_buffer(dek, locked)
            del self._items[k]

    def get(self, blob: bytes, associated_data: bytes) -> bytes | None:
        with self._lock:
            self._expire(self._clock())
            item = self._items.get(_cache_key(blob, associated_data))
            if item is None:
                self.misses += 1
                return None
            self.hits += 1
            return bytes(item[1])

    def put(self, blob: bytes, associated_data: bytes, dek: bytes) -> None:
        if not self.entries or not self.seconds:
            return
        with self._lock:
            now = self._clock()
            self._expire(now)
            k = _cache_key(blob, associated_data)
            old = self._items.pop(k, None)
            if old is not None:
                wipe_buffer(old[1], old[2])
            while len(self._items) >= self.entries:
                _, dropped, was_locked = self._items.popitem(last=False)[1]
                wipe_buffer(dropped, was_locked)
            buf = bytearray(dek)
            self._items[k] = (now, buf, lock_buffer(buf))

    def clear(self) -> None:
        with self._lock:
            for _, dek, locked in self._items.values():
                wipe_buffer(dek, locked)
            self._items.clear()

    def __repr__(self) -> str:
        return f"<UnwrapCache entries<={self.entries} seconds<={self.seconds:g}>"

    def __reduce__(self) -> Any:
        raise TypeError("an unwrap cache holds data keys and cannot be pickled")


def _cache_key(blob: bytes, associated_data: bytes) -> bytes:
    return len(blob).to_bytes(2, "little") + bytes(blob) + bytes(associated_data)


#: every ProviderKey alive, by id(): a WeakSet would keep one of two keys that compare
#: equal (the same key loaded twice, as a reload does) and close_provider_keys miss the other
_OPEN_KEYS: weakref.WeakValueDictionary[int, ProviderKey] = weakref.WeakValueDictionary()


class ProviderKey(Key):
    """A keyring key whose KEK stays in a :class:`RemoteKeyProvider`.

    A :class:`Key` everywhere a key is taken (keyrings, disks, databases, SQLite,
    rotation): ``wrap`` and ``unwrap`` produce and read the usual key slot
    (``nonce(12) || AES-GCM(KEK, nonce, DEK, ad)``), the AES-GCM running in the
    provider. Unwrapped data keys go through an :class:`UnwrapCache`. It has no
    material: :func:`~cryptdisk.keys.export_key_material` and :meth:`derive` refuse.
    :meth:`close` wipes the cache and closes the provider; so does the interpreter's
    exit (:func:`close_provider_keys`).
    """

    __slots__ = ("__weakref__", "_active", "_cache", "_finalizer", "_provider", "_retired",
                 "_retry", "_state", "_uses")

    def __init__(self, key_id: int, provider: RemoteKeyProvider, *,
                 algorithm: str | Algorithm | None = None, cache: UnwrapCache | None = None,
                 retry: RetryPolicy | None = None, what: str | None = None) -> None:
        if not isinstance(provider, RemoteKeyProvider):
            raise TypeError(f"expected a RemoteKeyProvider, not {type(provider).__name__}")
        if not isinstance(key_id, int) or isinstance(key_id, bool) or not 0 <= key_id < 2**64:
            raise ValueError(f"key id must be between 0 and 2**64-1, not {key_id!r}")
        self._retry = retry if retry is not None else RetryPolicy()
        size = self._retry.call("connect", key_id,
                                lambda: provider.connect(what or f"key {key_id}", key_id))
        alg = Algorithm.parse(algorithm) if algorithm is not None else Algorithm.for_key_size(
            size)
        self._id = key_id
        self._material = None  # type: ignore[assignment]
        self._algorithm = alg
        self._aead = None  # type: ignore[assignment]
        self._check = provider.check_value()
        self._fingerprint = None
        self.source = provider.label
        self._provider = provider
        self._cache = cache if cache is not None else UnwrapCache()
        # calls in flight, and whether the key was replaced (then closed once idle)
        self._state = threading.Lock()
        self._active = 0
        self._retired = False
        #: data keys wrapped, unwrapped, and the provider calls made for them (audit log)
        self._uses = {"wraps": 0, "unwraps": 0, "cache_hits": 0, "provider_calls": 0}
        _OPEN_KEYS[id(self)] = self
        # a key dropped unclosed (a command's keyring as it returns) is closed when it is
        # collected: its cache zeroed, not only freed, and its use logged
        self._finalizer = weakref.finalize(self, _release_quietly, key_id, provider,
                                           self._cache, self._uses)
        audit_event("connect", key_id, provider=provider.describe())
        made = _MADE.get()
        if made is not None:
            made.append(self)

    @property
    def provider(self) -> RemoteKeyProvider:
        return self._provider

    @property
    def cache(self) -> UnwrapCache:
        return self._cache

    @property
    def uses(self) -> dict[str, int]:
        """Counts of this key's use in this process (what the audit log's ``use`` event says)."""
        return dict(self._uses)

    def wrap(self, dek: bytes, associated_data: bytes) -> bytes:
        nonce = os.urandom(12)
        dek, ad = bytes(dek), bytes(associated_data)
        self._uses["wraps"] += 1
        self._uses["provider_calls"] += 1
        self._enter()
        try:
            blob: bytes = nonce + self._retry.call(
                "seal", self._id, lambda: self._provider.seal(nonce, dek, ad))
        finally:
            self._leave()
        self._cache.put(blob, associated_data, dek)
        return blob

    def unwrap(self, blob: bytes, associated_data: bytes) -> bytes:
        self._enter()
        try:
            return self._unwrap(blob, associated_data)
        finally:
            self._leave()

    def _enter(self) -> None:
        with self._state:
            self._active += 1

    def _leave(self) -> None:
        with self._state:
            self._active -= 1
            idle = self._retired and not self._active
        if idle:
            self._close_quietly()

    def _close_quietly(self) -> None:
        try:
            self.close()
        except KeyProviderError:
            pass

    def retire(self) -> None:
        """Close this key once no call is using it: now when none is in flight, else when the
        last one returns. A keyring that replaced it (:meth:`Keyring.adopt`) calls this, so
        the session or connection it held is not left open; a caller that still holds the
        key can use it, each call then opening the provider again and closing it after."""
        with self._state:
            self._retired = True
            idle = not self._active
        if idle:
            self._close_quietly()

    def _unwrap(self, blob: bytes, associated_data: bytes) -> bytes:
        self._uses["unwraps"] += 1
        cached = self._cache.get(blob, associated_data)
        if cached is not None:
            self._uses["cache_hits"] += 1
            return cached
        if len(blob) < 12 + 16:
            raise InvalidTag()
        nonce, sealed, ad = bytes(blob[:12]), bytes(blob[12:]), bytes(associated_data)
        self._uses["provider_calls"] += 1
        dek = self._retry.call("open", self._id, lambda: self._provider.open(nonce, sealed, ad))
        self._cache.put(blob, associated_data, dek)
        return dek  # type: ignore[no-any-return]

    def derive(self, purpose: bytes, length: int = 32) -> bytes:
        raise KeyringError(f"key {self._id} is held by the {self._provider.name} provider and "
                           "derives no subkeys (encrypt_names needs a local key)")

    def with_id(self, key_id: int) -> Key:
        raise KeyringError(f"key {self._id} is held by the {self._provider.name} provider; "
                           "give it its own id in the config")

    def same_material(self, other: Key) -> bool:
        return isinstance(other, ProviderKey) and hmac.compare_digest(self._check, other._check)

    def close(self) -> None:
        """Wipe the unwrap cache and close the provider's session (idempotent)."""
        _release(self._id, self._provider, self._cache, self._uses)

    def __repr__(self) -> str:
        return (f"<ProviderKey id={self._id} algorithm={self._algorithm.label} "
                f"source={self.source} at={self._provider.describe()}>")

    __str__ = __repr__


def _release(key_id: int, provider: RemoteKeyProvider, cache: UnwrapCache,
             uses: dict[str, int]) -> None:
    """What :meth:`ProviderKey.close` does, on the key's parts (no reference to the key)."""
    cache.clear()
    provider.close()
    if any(uses.values()):
        audit_event("use", key_id, provider=provider.describe(), **uses)
        for name in uses:
            uses[name] = 0


def _release_quietly(key_id: int, provider: RemoteKeyProvider, cache: UnwrapCache,
                     uses: dict[str, int]) -> None:
    try:
        _release(key_id, provider, cache, uses)
    except KeyProviderError:
        pass


def close_provider_keys() -> None:
    """Close every open :class:`ProviderKey` of this process (wipes their caches)."""
    for key in list(_OPEN_KEYS.values()):
        try:
            key.close()
        except KeyProviderError:
            pass


atexit.register(close_provider_keys)

#: the keys made in the innermost :func:`closed_on_error` block (of this thread or task)
_MADE: contextvars.ContextVar[list[ProviderKey] | None] = contextvars.ContextVar(
    "cryptdisk_provider_keys_made", default=None)


@contextlib.contextmanager
def closed_on_error() -> Iterator[None]:
    """Close every :class:`ProviderKey` made in the block (by this thread or task) if it
    raises: a config that fails to load part way leaves no provider session open nor
    unwrap cache filled until the garbage collector finds its keys (never, while anything
    holds the exception, whose traceback holds them). Keys made in a block that succeeds
    belong to an enclosing block, if any."""
    made: list[ProviderKey] = []
    outer = _MADE.get()
    token = _MADE.set(made)
    try:
        yield
    except BaseException:
        for key in made:
            key._close_quietly()
        raise
    finally:
        _MADE.reset(token)
    if outer is not None:
        outer.extend(made)

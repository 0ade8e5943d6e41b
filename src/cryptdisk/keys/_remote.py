"""Keys that stay in a provider (an HSM, a KMS): the contract, the key object, the unwrap cache.

Envelope layout (the file format is unchanged, see ``docs/format.md``): every file
header holds a random per-file data key (DEK) in its 64-byte key slot as
``nonce(12) || AES-GCM(KEK, nonce, DEK, ad=header[0:48])``. With a provider-held
keyring entry the KEK is a key inside the provider, and that AES-GCM runs there:
:meth:`RemoteKeyProvider.seal` and :meth:`RemoteKeyProvider.open` are the only
things cryptdisk asks of it. A provider that cannot run AES-GCM on a caller's nonce
and associated data (a cloud KMS) implements them with a local KEK it unwraps
through the service and keeps in memory for a bounded time; its docstring says so.

What stays in process memory: the KEK never (for providers that keep it, such as
PKCS#11 tokens); each file's DEK while the file is open, as with any key; and the
DEKs in the :class:`UnwrapCache`, bounded in count and age, wiped on expiry and on
:meth:`ProviderKey.close`. Wiping in Python is best effort: the cache zeroes its own
``bytearray`` copies, but the ``bytes`` handed to the cipher are immutable.
"""

from __future__ import annotations

import abc
import atexit
import hmac
import os
import random
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag

from ..errors import KeyProviderError, KeyringError, KeySourceError
from ..format import Algorithm
from ._audit import audit_event
from ._hygiene import lock_buffer, wipe_buffer
from ._key import Key
from ._provider import KeyProvider

__all__ = ["DEFAULT_CACHE_ENTRIES", "DEFAULT_CACHE_SECONDS", "ProviderKey",
           "RemoteKeyProvider", "RetryPolicy", "UnwrapCache", "WrappedKekProvider",
           "close_provider_keys", "create_wrapped_key"]

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
    #: (``wrapped_key = "FILE"``, :class:`WrappedKekProvider`)
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


WRAPPED_KEY_FIELDS = frozenset({"wrapped_key", "kek_seconds"})
_WRAPPED_MAGIC = b"cryptdisk wrapped key v1"
_CHECK_LABEL = b"cryptdisk key check v1"


def _wrapped_ad(key_id: int) -> bytes:
    return _WRAPPED_MAGIC + b" id=" + str(key_id).encode()


class WrappedKekProvider(RemoteKeyProvider):
    """A keyring key stored wrapped by a provider's key, unwrapped once and kept a bounded time.

    Selected by ``wrapped_key = "FILE"`` in a ``pkcs11`` or ``kmip`` entry (the
    providers that seal with AES-GCM): the provider's key seals one local key (KEK) in
    FILE; opening a file's data key is then a local AES-GCM under that KEK, so a cold
    scan costs one provider call per key instead of one per file. The price: the KEK is
    in process memory (a zeroed, optionally mlocked ``bytearray``) for at most
    ``kek_seconds`` at a time, as with ``aws-kms``; the provider's key never leaves it.
    The file is bound to the entry's id (associated data), so it cannot be used under
    another id. :func:`create_wrapped_key` makes it.
    """

    def __init__(self, inner: RemoteKeyProvider, wrapped_key: str, kek_seconds: float) -> None:
        self.inner = inner
        self.value = {"wrapped_key": wrapped_key}
        self.base = inner.base
        self.name = inner.name  # type: ignore[misc]
        self.label = inner.label  # type: ignore[misc]
        self.kek_seconds = float(kek_seconds)
        self._lock = threading.Lock()
        self._kek: bytearray | None = None
        self._kek_locked = False
        self._aead: Any = None
        self._until = 0.0
        self._check: bytes | None = None
        self._key_id = 0
        self._what = ""
        self.unwraps = 0  # provider calls made to unwrap the KEK (tests, benchmarks)

    @property
    def path(self) -> str:
        return os.path.join(self.base, os.path.expanduser(self.value["wrapped_key"]))

    def describe(self) -> str:
        return f"{self.inner.describe()} wrapping {self.value['wrapped_key']}"

    def connect(self, what: str, key_id: int) -> int:
        self._key_id, self._what = key_id, what
        self.inner.connect(what, key_id)
        with self._lock:
            return len(self._unwrap()[1])

    def _unwrap(self) -> tuple[Any, bytearray]:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        now = time.monotonic()
        if self._aead is not None and self._kek is not None and now < self._until:
            return self._aead, self._kek
        self._forget()
        blob = _read_wrapped(self.path, self._what)
        try:
            raw = self.inner.open(blob[:12], blob[12:], _wrapped_ad(self._key_id))
        except InvalidTag:
            raise KeyProviderError(f"{self._what}: {self.path} does not open under "
                                   f"{self.inner.describe()} as key {self._key_id} (another "
                                   "key or another id)") from None
        kek = bytearray(raw)
        del raw
        if len(kek) not in (16, 32):
            raise KeyProviderError(f"{self._what}: {self.path} holds no AES key")
        self.unwraps += 1
        check = hmac.new(bytes(kek), _CHECK_LABEL, "sha256").digest()[:8]
        if self._check is not None and check != self._check:
            raise KeyProviderError(f"{self._what}: {self.path} now holds another key than at "
                                   "start-up")
        self._check = check
        self._kek, self._aead = kek, AESGCM(bytes(kek))
        self._kek_locked = lock_buffer(kek)
        self._until = now + self.kek_seconds
        return self._aead, kek

    def _forget(self) -> None:
        if self._kek is not None:
            wipe_buffer(self._kek, self._kek_locked)
        self._kek, self._aead, self._until, self._kek_locked = None, None, 0.0, False

    def check_value(self) -> bytes:
        if self._check is None:
            raise KeyProviderError(f"{self.describe()}: not connected")
        return self._check

    def seal(self, nonce: bytes, dek: bytes, associated_data: bytes) -> bytes:
        with self._lock:
            aead, _ = self._unwrap()
        return aead.encrypt(nonce, dek, associated_data)  # type: ignore[no-any-return]

    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        with self._lock:
            aead, _ = self._unwrap()
        return aead.decrypt(nonce, sealed, associated_data)  # type: ignore[no-any-return]

    def close(self) -> None:
        with self._lock:
            self._forget()
        self.inner.close()

    def destroy(self, what: str) -> str:
        """Delete the wrapped key file (the provider's key may wrap others and stays)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return f"wrapped key file {self.path} was already gone"
        except OSError as exc:
            raise KeyProviderError(f"{what}: cannot delete {self.path}: {exc.strerror}") from None
        return f"deleted wrapped key file {self.path} ({self.inner.describe()} stays)"


def wrapped_provider(cls: type[RemoteKeyProvider], fields: Mapping[str, Any],
                     base: str) -> RemoteKeyProvider:
    """The provider of a ``source`` entry's fields: a :class:`WrappedKekProvider` around it
    when the entry has ``wrapped_key`` and the provider wraps keys (TypeError otherwise)."""
    rest = dict(fields)
    if not cls.wraps_keys or "wrapped_key" not in rest:
        return cls(rest, base=base)
    wrapped = rest.pop("wrapped_key")
    seconds = rest.pop("kek_seconds", 300.0)
    if not isinstance(wrapped, str) or not wrapped:
        raise TypeError("wrapped_key must be a non-empty string")
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
        raise TypeError("kek_seconds must be a number of seconds above 0")
    return WrappedKekProvider(cls(rest, base=base), wrapped, seconds)


def _read_wrapped(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            lines = f.read(4096).split()
    except OSError as exc:
        raise KeyProviderError(f"{what}: wrapped key file {path} cannot be read: "
                               f"{exc.strerror}", hint="make one with cryptdisk.keys."
                               "create_wrapped_key") from None
    import base64
    import binascii

    try:
        if lines[:1] != [_WRAPPED_MAGIC.split()[0]] or len(lines) < 2:
            raise ValueError
        blob = base64.b64decode(lines[-1], validate=True)
    except (ValueError, binascii.Error):
        raise KeyProviderError(f"{what}: {path} is not a cryptdisk wrapped key file") from None
    if len(blob) not in (12 + 16 + 16, 12 + 32 + 16):
        raise KeyProviderError(f"{what}: {path} is not a cryptdisk wrapped key file")
    return blob


def create_wrapped_key(path: str | os.PathLike[str], entry: Mapping[str, Any], *,
                       base: str | None = None, bits: int = 256) -> None:
    """Make a new keyring key sealed by a ``pkcs11`` or ``kmip`` entry's key, into ``path``.

    ``entry`` is the key entry without ``wrapped_key`` (its ``id`` and ``source`` and
    the provider's fields). The file (mode 0600, never overwritten) holds the sealed key
    in base64; the key's plaintext is dropped here.
    """
    import base64

    from ._provider import get_key_provider

    key_id = entry["id"]
    cls = get_key_provider(entry["source"])
    if not issubclass(cls, RemoteKeyProvider) or not getattr(cls, "wraps_keys", False):
        raise KeyProviderError(f"the {entry['source']} provider cannot wrap a keyring key")
    rest = {k: v for k, v in entry.items() if k in cls.fields}
    provider = cls(rest, base=base or os.getcwd())
    try:
        provider.connect(f"key {key_id}", key_id)
        kek = bytearray(os.urandom(bits // 8))
        nonce = os.urandom(12)
        blob = nonce + provider.seal(nonce, bytes(kek), _wrapped_ad(key_id))
        wipe_buffer(kek)
    finally:
        provider.close()
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyProviderError(f"{name} already exists; refusing to overwrite a wrapped "
                               "key") from None
    try:
        os.write(fd, _WRAPPED_MAGIC + f" (key {key_id}, {provider.describe()})\n".encode()
                 + base64.b64encode(blob) + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


_OPEN_KEYS: weakref.WeakSet[ProviderKey] = weakref.WeakSet()


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

    __slots__ = ("__weakref__", "_cache", "_provider", "_retry", "_uses")

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
        #: data keys wrapped, unwrapped, and the provider calls made for them (audit log)
        self._uses = {"wraps": 0, "unwraps": 0, "cache_hits": 0, "provider_calls": 0}
        _OPEN_KEYS.add(self)
        audit_event("connect", key_id, provider=provider.describe())

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
        blob: bytes = nonce + self._retry.call("seal", self._id,
                                               lambda: self._provider.seal(nonce, dek, ad))
        self._cache.put(blob, associated_data, dek)
        return blob

    def unwrap(self, blob: bytes, associated_data: bytes) -> bytes:
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
        self._cache.clear()
        self._provider.close()
        if any(self._uses.values()):
            audit_event("use", self._id, provider=self._provider.describe(), **self._uses)
            for name in self._uses:
                self._uses[name] = 0

    def __repr__(self) -> str:
        return (f"<ProviderKey id={self._id} algorithm={self._algorithm.label} "
                f"source={self.source} at={self._provider.describe()}>")

    __str__ = __repr__


def close_provider_keys() -> None:
    """Close every open :class:`ProviderKey` of this process (wipes their caches)."""
    for key in list(_OPEN_KEYS):
        try:
            key.close()
        except KeyProviderError:
            pass


atexit.register(close_provider_keys)

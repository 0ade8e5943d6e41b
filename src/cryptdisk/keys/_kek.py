"""A keyring key (KEK) held in process memory for a bounded time, unwrapped through a provider.

Some providers cannot seal a key slot themselves (a cloud KMS cannot run AES-GCM on a
nonce and associated data cryptdisk chooses), and a provider that can may be too slow
to be asked once per file. Both keep one keyring key (KEK) on disk, in the entry's
``wrapped_key`` file, sealed by the provider's key, and seal and open the key slots
locally with it, as a local key does. :class:`HeldKekProvider` is that one mechanism:
it unwraps the KEK through the provider on first use, keeps it (a zeroed, optionally
mlocked ``bytearray``) for at most ``kek_seconds``, then zeroes it and unwraps it again
on next use; :meth:`~HeldKekProvider.close` zeroes it too. The KEK never appears in a
message or ``repr``, and the provider cannot be pickled.

Its users: :class:`WrappedKekProvider` (``wrapped_key`` in a ``pkcs11`` or ``kmip``
entry: the token's or server's key seals the KEK, file made by
:func:`create_wrapped_key`) and the ``aws-kms`` provider
(:mod:`cryptdisk.keys.providers._aws_kms`: KMS wraps the KEK).
"""

from __future__ import annotations

import abc
import base64
import binascii
import hmac
import os
import threading
import time
from collections.abc import Mapping
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import KeyFileError, KeyProviderError
from ._hygiene import lock_buffer, wipe_buffer
from ._key import key_check_value
from ._remote import RemoteKeyProvider

__all__ = ["DEFAULT_KEK_SECONDS", "HeldKekProvider", "WrappedKekProvider",
           "check_wrapped_path", "create_wrapped_key", "wrapped_provider", "write_wrapped_file"]

#: How long an unwrapped KEK is kept, unless the entry's ``kek_seconds`` says.
DEFAULT_KEK_SECONDS = 300.0


class HeldKekProvider(RemoteKeyProvider):
    """Seals and opens key slots locally with a KEK unwrapped through a provider, held for at
    most :attr:`kek_seconds` (module docstring).

    A subclass implements :meth:`_unwrap_kek` (read its ``wrapped_key`` file, ask its
    provider to unwrap it) and :meth:`_what_stays` (for :meth:`destroy`); it sets
    :attr:`kek_seconds` from its entry. The check value is a local key's
    (``HMAC-SHA256(KEK, "cryptdisk key check v1")[:8]``). A KEK that unwraps to another
    key than at start-up is refused. :attr:`unwraps` counts the provider calls made to
    unwrap it (tests, ``cryptdisk bench keys``).
    """

    def __init__(self, value: Any, *, base: str) -> None:
        super().__init__(value, base=base)
        self.kek_seconds = DEFAULT_KEK_SECONDS
        self._lock = threading.Lock()
        self._kek: bytearray | None = None
        self._kek_locked = False
        self._aead: AESGCM | None = None
        self._until = 0.0
        self._check: bytes | None = None
        self._key_id = 0
        self._what = ""
        self.unwraps = 0

    @property
    def path(self) -> str:
        """The ``wrapped_key`` file (relative to the config's directory)."""
        return os.path.join(self.base, os.path.expanduser(self.value["wrapped_key"]))

    @abc.abstractmethod
    def _unwrap_kek(self, what: str) -> bytearray:
        """The KEK, unwrapped by one provider call from :attr:`path`; a
        :class:`~cryptdisk.errors.KeyProviderError` (``transient`` when worth retrying)
        when that fails. ``what`` names the key in messages."""

    @abc.abstractmethod
    def _what_stays(self) -> str:
        """What :meth:`destroy` leaves: the provider's key that wrapped the KEK."""

    def connect(self, what: str, key_id: int) -> int:
        self._key_id, self._what = key_id, what
        with self._lock:
            return len(self._held()[1])

    def _held(self) -> tuple[AESGCM, bytearray]:
        """The KEK's AEAD and the KEK, unwrapped when absent or older than kek_seconds
        (under ``self._lock``)."""
        now = time.monotonic()
        if self._aead is not None and self._kek is not None and now < self._until:
            return self._aead, self._kek
        self._forget()
        kek = self._unwrap_kek(self._what)
        if len(kek) not in (16, 32):
            size = len(kek)
            wipe_buffer(kek)
            raise KeyProviderError(f"{self._what}: {self.path} unwrapped to {size} bytes, not "
                                   "an AES key")
        self.unwraps += 1
        check = key_check_value(kek)
        if self._check is not None and not hmac.compare_digest(check, self._check):
            wipe_buffer(kek)
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
            aead, _ = self._held()
        return aead.encrypt(nonce, dek, associated_data)

    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        with self._lock:
            aead, _ = self._held()
        return aead.decrypt(nonce, sealed, associated_data)  # InvalidTag when tampered

    def close(self) -> None:
        """Zero the KEK (it is unwrapped again on next use)."""
        with self._lock:
            self._forget()

    def destroy(self, what: str) -> str:
        """Delete the wrapped key file: the KEK then exists nowhere. The provider's key that
        wrapped it stays (it may wrap other keys)."""
        path = self.path
        try:
            os.unlink(path)
        except FileNotFoundError:
            return f"wrapped key file {path} was already gone"
        except OSError as exc:
            raise KeyProviderError(f"{what}: cannot delete wrapped key file {path}: "
                                   f"{exc.strerror}") from None
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return f"deleted wrapped key file {path} ({self._what_stays()})"

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} holds a key and cannot be pickled")


_WRAPPED_MAGIC = b"cryptdisk wrapped key v1"


def _wrapped_ad(key_id: int) -> bytes:
    return _WRAPPED_MAGIC + b" id=" + str(key_id).encode()


class WrappedKekProvider(HeldKekProvider):
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

    fields: ClassVar[frozenset[str]] = frozenset({"wrapped_key"})
    required: ClassVar[frozenset[str]] = frozenset({"wrapped_key"})

    def __init__(self, inner: RemoteKeyProvider, wrapped_key: str, kek_seconds: float) -> None:
        super().__init__({"wrapped_key": wrapped_key}, base=inner.base)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.label = inner.label  # type: ignore[misc]
        self.kek_seconds = float(kek_seconds)

    def describe(self) -> str:
        return f"{self.inner.describe()} wrapping {self.value['wrapped_key']}"

    def connect(self, what: str, key_id: int) -> int:
        self.inner.connect(what, key_id)
        return super().connect(what, key_id)

    def _unwrap_kek(self, what: str) -> bytearray:
        blob = _read_wrapped(self.path, what)
        try:
            raw = self.inner.open(blob[:12], blob[12:], _wrapped_ad(self._key_id))
        except InvalidTag:
            raise KeyProviderError(f"{what}: {self.path} does not open under "
                                   f"{self.inner.describe()} as key {self._key_id} (another "
                                   "key or another id)") from None
        kek = bytearray(raw)
        del raw
        return kek

    def _what_stays(self) -> str:
        return f"{self.inner.describe()} stays"

    def close(self) -> None:
        super().close()
        self.inner.close()


def wrapped_provider(cls: type[RemoteKeyProvider], fields: Mapping[str, Any],
                     base: str) -> RemoteKeyProvider:
    """The provider of a ``source`` entry's fields: a :class:`WrappedKekProvider` around it
    when the entry has ``wrapped_key`` and the provider wraps keys (TypeError otherwise)."""
    rest = dict(fields)
    if not cls.wraps_keys or "wrapped_key" not in rest:
        return cls(rest, base=base)
    wrapped = rest.pop("wrapped_key")
    seconds = rest.pop("kek_seconds", DEFAULT_KEK_SECONDS)
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
    in base64; the key's plaintext is dropped here. An existing ``path``, or a missing
    directory, is refused before the provider is asked.
    """
    from ._provider import get_key_provider

    check_wrapped_path(path)  # before the provider makes a key the file could not keep
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
    write_wrapped_file(path, _WRAPPED_MAGIC + f" (key {key_id}, {provider.describe()})\n"
                       .encode() + base64.b64encode(blob) + b"\n")


def _exists(name: str) -> KeyProviderError:
    return KeyProviderError(f"{name} already exists; refusing to overwrite a wrapped key")


def _no_directory(name: str) -> KeyFileError:
    directory = os.path.dirname(os.path.abspath(name))
    return KeyFileError(f"cannot write the wrapped key file {name}: the directory {directory} "
                        "does not exist",
                        hint="create it first (mkdir -m 700 DIR): key files are private")


def check_wrapped_path(path: str | os.PathLike[str]) -> None:
    """Refuse, before any provider call, a wrapped key file path that exists
    (:class:`~cryptdisk.errors.KeyProviderError`) or whose directory does not
    (:class:`~cryptdisk.errors.KeyFileError`)."""
    name = os.fspath(path)
    if os.path.lexists(name):
        raise _exists(name)
    if not os.path.isdir(os.path.dirname(os.path.abspath(name))):
        raise _no_directory(name)


def write_wrapped_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a new wrapped key file (mode 0600, synced); one that exists is refused, never
    overwritten, and a missing directory is named (never made: key files are private)."""
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise _exists(name) from None
    except FileNotFoundError:
        raise _no_directory(name) from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())

"""AWS KMS: the keyring key is stored wrapped by a KMS key and unwrapped for a bounded time.

Config::

    [[keyring.keys]]
    id = 6
    source = "aws-kms"
    kms_key = "alias/cryptdisk"          # KMS key id, ARN or alias
    wrapped_key = "keys/k6.kms"          # this keyring key, wrapped by the KMS key
    region = "eu-central-1"              # optional (else the environment's)
    endpoint = "https://kms.example"     # optional (a VPC endpoint, a test server)
    kek_seconds = 300                    # optional: how long the unwrapped key is kept
    timeout = 10                         # optional: seconds per KMS request

KMS encrypts with its own envelope (a ciphertext blob of about 180 bytes), which
does not fit the format's 64-byte key slot. So the key slot is sealed locally, as a
local key seals it, by a keyring key (KEK) that exists on disk only wrapped by the
KMS key (``wrapped_key``, made by :func:`create_aws_kms_wrapped_key` through KMS
``GenerateDataKey``) and is unwrapped through KMS ``Decrypt`` (with the encryption
context ``{"cryptdisk-key-id": "<id>"}``, so a blob cannot be replayed under another
id). The unwrapped KEK is kept in process memory for at most ``kek_seconds``, then
zeroed (best effort) and unwrapped again on next use. The KMS key itself never leaves
KMS. Credentials come from boto3's usual chain (environment, profile, instance role),
never from the config.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import threading
import time
from typing import Any, ClassVar

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ...errors import KeyProviderError
from .._hygiene import lock_buffer, wipe_buffer
from .._remote import RemoteKeyProvider

__all__ = ["AwsKmsProvider", "create_aws_kms_key", "create_aws_kms_wrapped_key"]

_CHECK_LABEL = b"cryptdisk key check v1"
_MAX_BLOB = 8192


def _boto3() -> Any:
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError as exc:
        raise KeyProviderError(f"the aws-kms provider needs boto3: {exc}",
                               hint="pip install 'cryptdisk[kms]'") from None
    return boto3, botocore


def _client(region: str | None, endpoint: str | None, timeout: float) -> Any:
    boto3, botocore = _boto3()
    # one attempt per call: the key's RetryPolicy retries what is worth retrying
    config = botocore.config.Config(connect_timeout=timeout, read_timeout=timeout,
                                    retries={"total_max_attempts": 1, "mode": "standard"})
    return boto3.session.Session().client("kms", region_name=region, endpoint_url=endpoint,
                                          config=config)


def _context(key_id: int) -> dict[str, str]:
    return {"cryptdisk-key-id": str(key_id)}


#: KMS error codes that mean "try again" (the rest are refusals).
_TRANSIENT_CODES = frozenset({"ThrottlingException", "KMSInternalException",
                              "DependencyTimeoutException", "ServiceUnavailableException",
                              "InternalFailure", "RequestTimeout", "RequestTimeoutException"})


def _transient(exc: Exception, botocore: Any) -> bool:
    """True when KMS could not be reached, did not answer in time or asked to retry."""
    if isinstance(exc, (botocore.exceptions.EndpointConnectionError,
                        botocore.exceptions.ConnectionClosedError,
                        botocore.exceptions.ConnectTimeoutError,
                        botocore.exceptions.ReadTimeoutError)):
        return True
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in _TRANSIENT_CODES or (isinstance(status, int) and status >= 500)
    return False


def _kms_error(exc: Exception) -> str:
    """A KMS error for a message: its code and text, never request data or credentials."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        return f"{err.get('Code', type(exc).__name__)}: {err.get('Message', '')}".rstrip(": ")
    return type(exc).__name__


class AwsKmsProvider(RemoteKeyProvider):
    """``source = "aws-kms"``: a keyring key wrapped by an AWS KMS key (module docstring)."""

    name = "aws-kms"
    label = "aws-kms"
    fields: ClassVar[frozenset[str]] = frozenset({"kms_key", "wrapped_key", "region",
                                                  "endpoint", "kek_seconds", "timeout"})
    required: ClassVar[frozenset[str]] = frozenset({"kms_key", "wrapped_key"})

    def __init__(self, value: Any, *, base: str) -> None:
        super().__init__(value, base=base)
        for name in ("kms_key", "wrapped_key", "region", "endpoint"):
            if name in self.value and (not isinstance(self.value[name], str)
                                       or not self.value[name]):
                raise TypeError(f"{name} must be a non-empty string")
        for name, default in (("kek_seconds", 300.0), ("timeout", 10.0)):
            number = self.value.get(name, default)
            if not isinstance(number, (int, float)) or isinstance(number, bool) or number <= 0:
                raise TypeError(f"{name} must be a number of seconds above 0")
        self.kek_seconds = float(self.value.get("kek_seconds", 300.0))
        self.timeout = float(self.value.get("timeout", 10.0))
        self._lock = threading.Lock()
        self._kek: bytearray | None = None
        self._kek_locked = False
        self._aead: AESGCM | None = None
        self._until = 0.0
        self._check: bytes | None = None
        self._key_id: int | None = None
        self.unwraps = 0  # KMS Decrypt calls made (for tests and benchmarks)

    def describe(self) -> str:
        return f"aws-kms key {self.value['kms_key']!r}"

    def connect(self, what: str, key_id: int) -> int:
        self._key_id = key_id
        with self._lock:
            aead, size = self._unwrap(what)
        del aead
        return size

    def _unwrap(self, what: str) -> tuple[AESGCM, int]:
        """The local AEAD of the KEK, unwrapping it through KMS when it is absent or expired."""
        now = time.monotonic()
        if self._aead is not None and now < self._until and self._kek is not None:
            return self._aead, len(self._kek)
        self._forget()
        path = os.path.join(self.base, os.path.expanduser(self.value["wrapped_key"]))
        try:
            with open(path, "rb") as f:
                blob = base64.b64decode(f.read(_MAX_BLOB), validate=False)
        except OSError as exc:
            raise KeyProviderError(f"{what}: wrapped key file {path} cannot be read: "
                                   f"{exc.strerror}",
                                   hint="make one with cryptdisk.keys.providers."
                                        "create_aws_kms_wrapped_key") from None
        _, botocore = _boto3()
        try:
            client = _client(self.value.get("region"), self.value.get("endpoint"), self.timeout)
            answer = client.decrypt(CiphertextBlob=blob, KeyId=self.value["kms_key"],
                                    EncryptionContext=_context(self._key_id or 0))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise KeyProviderError(f"{what}: {self.describe()}: Decrypt of {path} failed: "
                                   f"{_kms_error(exc)}",
                                   transient=_transient(exc, botocore)) from None
        kek = bytearray(answer["Plaintext"])
        answer.clear()
        if len(kek) not in (16, 32):
            raise KeyProviderError(f"{what}: {path} unwrapped to {len(kek)} bytes, not an AES "
                                   "key")
        self.unwraps += 1
        check = hmac.new(bytes(kek), _CHECK_LABEL, hashlib.sha256).digest()[:8]
        if self._check is not None and check != self._check:
            raise KeyProviderError(f"{what}: {path} now holds another key than at start-up")
        self._check = check
        self._kek, self._aead = kek, AESGCM(bytes(kek))
        self._kek_locked = lock_buffer(kek)
        self._until = now + self.kek_seconds
        return self._aead, len(kek)

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
            aead, _ = self._unwrap(f"key {self._key_id}")
        return aead.encrypt(nonce, dek, associated_data)

    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        with self._lock:
            aead, _ = self._unwrap(f"key {self._key_id}")
        return aead.decrypt(nonce, sealed, associated_data)  # InvalidTag when tampered

    def destroy(self, what: str) -> str:
        """Delete the wrapped key file: the keyring key then exists nowhere.

        The KMS key stays in KMS (it may wrap other keys; schedule its deletion there).
        """
        path = os.path.join(self.base, os.path.expanduser(self.value["wrapped_key"]))
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
        return (f"deleted wrapped key file {path} (the KMS key {self.value['kms_key']!r} "
                "stays in KMS)")

    def close(self) -> None:
        with self._lock:
            self._forget()


def create_aws_kms_key(*, region: str | None = None, endpoint: str | None = None,
                       timeout: float = 10.0) -> str:
    """Make a new symmetric KMS key (``CreateKey``, ``ENCRYPT_DECRYPT``) and return its id.

    For tests, benchmarks and first setups; production KMS keys are usually made by the
    account's own tooling. The key never leaves KMS.
    """
    _, botocore = _boto3()
    try:
        client = _client(region, endpoint, timeout)
        answer = client.create_key(KeyUsage="ENCRYPT_DECRYPT")
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise KeyProviderError(f"aws-kms: CreateKey failed: {_kms_error(exc)}") from None
    return str(answer["KeyMetadata"]["KeyId"])


def create_aws_kms_wrapped_key(path: str | os.PathLike[str], kms_key: str, *, key_id: int,
                               region: str | None = None, endpoint: str | None = None,
                               bits: int = 256, timeout: float = 10.0) -> None:
    """Make a new keyring key with KMS ``GenerateDataKey`` and write it, wrapped, to ``path``.

    The file (mode 0600, never overwritten) holds only the KMS ciphertext blob in
    base64; the key's plaintext is dropped here. ``key_id`` is the keyring id the
    entry will have: it is bound to the blob as KMS encryption context.
    """
    _, botocore = _boto3()
    try:
        client = _client(region, endpoint, timeout)
        answer = client.generate_data_key(KeyId=kms_key, NumberOfBytes=bits // 8,
                                          EncryptionContext=_context(key_id))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise KeyProviderError(f"aws-kms key {kms_key!r}: GenerateDataKey failed: "
                               f"{_kms_error(exc)}") from None
    answer.pop("Plaintext", None)
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyProviderError(f"{name} already exists; refusing to overwrite a wrapped "
                               "key") from None
    with contextlib.closing(os.fdopen(fd, "wb")) as f:
        f.write(base64.b64encode(answer["CiphertextBlob"]) + b"\n")
        f.flush()
        os.fsync(f.fileno())

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
import os
from typing import Any, ClassVar

from ...errors import KeyProviderError
from .._kek import (
    DEFAULT_KEK_SECONDS,
    HeldKekProvider,
    check_wrapped_path,
    write_wrapped_file,
)

__all__ = ["AwsKmsProvider", "create_aws_kms_key", "create_aws_kms_wrapped_key"]

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


class AwsKmsProvider(HeldKekProvider):
    """``source = "aws-kms"``: a keyring key wrapped by an AWS KMS key (module docstring).

    Holding the unwrapped key, sealing and opening with it: :class:`HeldKekProvider`;
    here, unwrapping it through KMS ``Decrypt``.
    """

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
        if "@" in self.value.get("endpoint", "").partition("://")[2].split("/", 1)[0]:
            # (not quoted: the config's errors, reprs and logs show the endpoint)
            raise TypeError("endpoint may not hold credentials (user:password@ before the "
                            "host); boto3 takes them from the environment, a profile or "
                            "an instance role")
        for name, default in (("kek_seconds", DEFAULT_KEK_SECONDS), ("timeout", 10.0)):
            number = self.value.get(name, default)
            if not isinstance(number, (int, float)) or isinstance(number, bool) or number <= 0:
                raise TypeError(f"{name} must be a number of seconds above 0")
        self.kek_seconds = float(self.value.get("kek_seconds", DEFAULT_KEK_SECONDS))
        self.timeout = float(self.value.get("timeout", 10.0))

    def describe(self) -> str:
        return f"aws-kms key {self.value['kms_key']!r}"

    def _unwrap_kek(self, what: str) -> bytearray:
        """The keyring key, unwrapped by KMS ``Decrypt`` from the wrapped key file."""
        path = self.path
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
                                    EncryptionContext=_context(self._key_id))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise KeyProviderError(f"{what}: {self.describe()}: Decrypt of {path} failed: "
                                   f"{_kms_error(exc)}",
                                   transient=_transient(exc, botocore)) from None
        kek = bytearray(answer["Plaintext"])
        answer.clear()
        return kek

    def _what_stays(self) -> str:
        return f"the KMS key {self.value['kms_key']!r} stays in KMS"


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
    entry will have: it is bound to the blob as KMS encryption context. An existing
    ``path``, or a missing directory, is refused before KMS is asked.
    """
    check_wrapped_path(path)
    _, botocore = _boto3()
    try:
        client = _client(region, endpoint, timeout)
        answer = client.generate_data_key(KeyId=kms_key, NumberOfBytes=bits // 8,
                                          EncryptionContext=_context(key_id))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise KeyProviderError(f"aws-kms key {kms_key!r}: GenerateDataKey failed: "
                               f"{_kms_error(exc)}") from None
    answer.pop("Plaintext", None)
    write_wrapped_file(path, base64.b64encode(answer["CiphertextBlob"]) + b"\n")

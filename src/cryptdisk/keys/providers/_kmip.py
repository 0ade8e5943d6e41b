"""KMIP: the key-encryption key is a symmetric key on a KMIP server (1.4 or later).

Config::

    [[keyring.keys]]
    id = 7
    source = "kmip"
    host = "kms.internal"
    port = 5696
    key = "cryptdisk-kek-7"          # the key's Name attribute (found with Locate)
    client_cert = "tls/client.pem"   # mutual TLS: this client's certificate,
    client_key = "tls/client.key"    # its private key (mode 0600), and
    ca = "tls/ca.pem"                # the CA that signed the server's certificate
    timeout = 10                     # optional: seconds per request

Every key slot is sealed and opened by the server with the KMIP ``Encrypt`` and
``Decrypt`` operations in AES-GCM (cryptdisk's 12-byte nonce, the header's first 48
bytes as authenticated additional data, a 16-byte tag: KMIP 1.4's authenticated
encryption), so files are byte for byte what a local key writes. The check value is
``HMAC-SHA256(KEK, "cryptdisk key check v1")[:8]`` from the server's ``MAC``
operation, the same as a local key's. cryptdisk never asks for the key (``Get``);
whether the server would hand it out to this client is the server's policy (PyKMIP's
server does, to the key's owner; it has no non-extractable keys). The client's TLS key
is the credential: a file, never the config, refused when group or others can read it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import ssl
import stat
import threading
import time
import warnings
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag

from ...errors import KeyProviderError
from .._remote import RemoteKeyProvider

__all__ = ["KmipProvider", "create_kmip_key", "kmip_client"]

_CHECK_LABEL = b"cryptdisk key check v1"


def _kmip() -> Any:
    try:
        with warnings.catch_warnings():  # PyKMIP names ciphers cryptography deprecates
            warnings.simplefilter("ignore")
            import kmip.core.attributes
            import kmip.core.enums
            import kmip.core.exceptions
            import kmip.core.messages.payloads
            import kmip.pie.client
            import kmip.pie.exceptions
    except ImportError as exc:
        raise KeyProviderError(f"the kmip provider needs PyKMIP: {exc}",
                               hint="pip install 'cryptdisk[kms]'") from None
    # PyKMIP logs connection failures itself; cryptdisk reports them in its own errors, so
    # keep its records off stderr (a NullHandler stops logging's last-resort handler)
    logger = logging.getLogger("kmip")
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return kmip


class KmipProvider(RemoteKeyProvider):
    """``source = "kmip"``: a symmetric key on a KMIP server (see the module docstring)."""

    name = "kmip"
    label = "kmip"
    fields: ClassVar[frozenset[str]] = frozenset({"host", "port", "key", "client_cert",
                                                  "client_key", "ca", "timeout"})
    wraps_keys: ClassVar[bool] = True
    required: ClassVar[frozenset[str]] = frozenset({"host", "port", "key", "client_cert",
                                                    "client_key", "ca"})

    def __init__(self, value: Any, *, base: str) -> None:
        super().__init__(value, base=base)
        for name in ("host", "key", "client_cert", "client_key", "ca"):
            if not isinstance(self.value[name], str) or not self.value[name]:
                raise TypeError(f"{name} must be a non-empty string")
        port = self.value["port"]
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise TypeError("port must be a TCP port number")
        timeout = self.value.get("timeout", 10)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise TypeError("timeout must be a number of seconds above 0")
        self.timeout = float(timeout)
        self._lock = threading.RLock()
        self._client: Any = None
        self._uid: str | None = None
        self._check: bytes | None = None

    def describe(self) -> str:
        return f"kmip {self.value['host']}:{self.value['port']} key {self.value['key']!r}"

    def _path(self, name: str) -> str:
        return os.path.join(self.base, os.path.expanduser(self.value[name]))

    def connect(self, what: str, key_id: int) -> int:
        with self._lock:
            return self._open(what)

    def _open(self, what: str) -> int:
        kmip = _kmip()
        enums = kmip.core.enums
        where = f"{what}: {self.describe()}"
        client_key = self._path("client_key")
        try:
            mode = os.stat(client_key).st_mode
        except OSError as exc:
            raise KeyProviderError(f"{where}: client key {client_key} cannot be read: "
                                   f"{exc.strerror}") from None
        if mode & 0o077:
            raise KeyProviderError(f"{where}: client key {client_key} is accessible by group "
                                   f"or others (mode {stat.S_IMODE(mode):04o})",
                                   hint=f"chmod 600 {client_key}")
        self.close()
        try:
            client = kmip_client(self.value["host"], self.value["port"],
                                 cert=self._path("client_cert"), key=client_key,
                                 ca=self._path("ca"), timeout=self.timeout)
        except Exception as exc:  # PyKMIP raises socket, ssl and its own errors
            raise KeyProviderError(f"{where}: cannot connect: {_describe(exc)}",
                                   transient=_unreachable(exc)) from None
        try:
            name = client.attribute_factory.create_attribute(enums.AttributeType.NAME,
                                                             self.value["key"])
            uids = client.locate(attributes=[name])
            if len(uids) != 1:
                raise KeyProviderError(f"{where}: {len(uids)} keys have that name; need one")
            uid = uids[0]
            attrs = client.get_attributes(uid, ["Object Type", "Cryptographic Algorithm",
                                                "Cryptographic Length", "State"])[1]
            found = {a.attribute_name.value: a.attribute_value.value for a in attrs}
            if (found.get("Object Type") != enums.ObjectType.SYMMETRIC_KEY
                    or found.get("Cryptographic Algorithm") != enums.CryptographicAlgorithm.AES):
                raise KeyProviderError(f"{where}: not an AES key")
            state = found.get("State")
            if state != enums.State.ACTIVE:
                raise KeyProviderError(f"{where}: the key is {_state_text(state)}, not active: "
                                       "the server seals and opens nothing with it",
                                       hint=_STATE_HINTS.get(getattr(state, "name", ""),
                                                             _STATE_HINTS["DEACTIVATED"]))
            size = int(found.get("Cryptographic Length", 0)) // 8
            if size not in (16, 32):
                raise KeyProviderError(f"{where}: the key is {size} bytes; cryptdisk takes "
                                       "AES-128 or AES-256")
            _, mac = client.mac(_CHECK_LABEL, uid,
                                algorithm=enums.CryptographicAlgorithm.HMAC_SHA256)
        except KeyProviderError:
            _close_client(client)
            raise
        except Exception as exc:  # whatever PyKMIP raised; a socket error or timeout is a
            _close_client(client)  # server that stopped answering past the handshake
            raise KeyProviderError(f"{where}: {_describe(exc)}",
                                   transient=_unreachable(exc)) from None
        if self._check is not None and bytes(mac)[:8] != self._check:
            _close_client(client)
            raise KeyProviderError(f"{where}: the server's key of that name is another key "
                                   "than the one connected first")
        self._client, self._uid, self._check = client, uid, bytes(mac)[:8]
        return size

    def check_value(self) -> bytes:
        if self._check is None:
            raise KeyProviderError(f"{self.describe()}: not connected")
        return self._check

    def _call(self, operation: str, payload_args: dict[str, Any]) -> Any:
        kmip = _kmip()
        enums = kmip.core.enums
        params = kmip.core.attributes.CryptographicParameters(
            block_cipher_mode=enums.BlockCipherMode.GCM,
            cryptographic_algorithm=enums.CryptographicAlgorithm.AES, tag_length=16)
        payloads = kmip.core.messages.payloads
        with self._lock:
            if self._client is None:
                self._open(f"{operation.lower()}ing a data key")
            cls = payloads.EncryptRequestPayload if operation == "Encrypt" else \
                payloads.DecryptRequestPayload
            payload = cls(unique_identifier=self._uid, cryptographic_parameters=params,
                          **payload_args)
            op = enums.Operation.ENCRYPT if operation == "Encrypt" else enums.Operation.DECRYPT
            try:
                return self._client.proxy.send_request_payload(op, payload)
            except kmip.core.exceptions.OperationFailure as exc:
                if operation == "Decrypt" and getattr(exc, "reason", None) in (
                        enums.ResultReason.CRYPTOGRAPHIC_FAILURE,
                        enums.ResultReason.GENERAL_FAILURE):
                    raise InvalidTag() from None  # PyKMIP reports a bad tag as either
                raise KeyProviderError(f"{self.describe()}: {operation} failed: "
                                       f"{_describe(exc)}") from None
            except Exception as exc:  # socket and TLS errors: reconnect on the next call
                self.close()
                raise KeyProviderError(f"{self.describe()}: {operation} failed: "
                                       f"{_describe(exc)}", transient=True) from None

    def seal(self, nonce: bytes, dek: bytes, associated_data: bytes) -> bytes:
        answer = self._call("Encrypt", {"data": dek, "iv_counter_nonce": nonce,
                                        "auth_additional_data": associated_data})
        tag = answer.auth_tag
        if not tag or len(tag) != 16 or len(answer.data) != len(dek):
            raise KeyProviderError(f"{self.describe()}: the server's AES-GCM answer has no "
                                   "16-byte tag (KMIP 1.4 authenticated encryption needed)")
        return bytes(answer.data) + bytes(tag)

    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        answer = self._call("Decrypt", {"data": sealed[:-16], "iv_counter_nonce": nonce,
                                        "auth_additional_data": associated_data,
                                        "auth_tag": sealed[-16:]})
        return bytes(answer.data)

    def destroy(self, what: str) -> str:
        """Revoke and destroy the key on the server (KMIP ``Revoke``, ``Destroy``)."""
        kmip = _kmip()
        enums = kmip.core.enums
        where = f"{what}: {self.describe()}"
        try:
            client = kmip_client(self.value["host"], self.value["port"],
                                 cert=self._path("client_cert"), key=self._path("client_key"),
                                 ca=self._path("ca"), timeout=self.timeout)
        except Exception as exc:
            raise KeyProviderError(f"{where}: cannot connect: {_describe(exc)}",
                                   transient=True) from None
        try:
            name = client.attribute_factory.create_attribute(enums.AttributeType.NAME,
                                                             self.value["key"])
            uids = client.locate(attributes=[name])
            for uid in uids:
                state = {a.attribute_name.value: a.attribute_value.value
                         for a in client.get_attributes(uid, ["State"])[1]}.get("State")
                if state == enums.State.ACTIVE:
                    client.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, uid)
                client.destroy(uid)
        except Exception as exc:  # whatever PyKMIP raised; a socket error or timeout is a
            raise KeyProviderError(f"{where}: destroying the key failed: "  # server that
                                   f"{_describe(exc)}",  # did not answer: retried
                                   transient=_unreachable(exc)) from None
        finally:
            with contextlib.suppress(Exception):
                _close_client(client)
        if not uids:
            return f"{self.describe()} was already gone"
        return f"revoked and destroyed {self.describe()} on the server"

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            if client is not None:
                _close_client(client)


def kmip_client(host: str, port: int, *, cert: str, key: str, ca: str,
                timeout: float = 10.0) -> Any:
    """An open PyKMIP ``ProxyKmipClient`` (KMIP 1.4) over mutual TLS, for setting up keys.

    PyKMIP's own socket setup is replaced: TLS 1.2 or later, the server's certificate
    checked against ``ca`` *and* ``host`` (PyKMIP checks no host name), this client's
    certificate and key for the mutual TLS. Close it with ``close()``.
    """
    kmip = _kmip()
    context = ssl.create_default_context(cafile=ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    client = kmip.pie.client.ProxyKmipClient(
        hostname=host, port=port, cert=cert, key=key, ca=ca, config_file=os.devnull,
        kmip_version=kmip.core.enums.KMIPVersion.KMIP_1_4)
    proxy = client.proxy
    proxy.timeout = timeout

    def create(sock: socket.socket) -> None:
        proxy.socket = context.wrap_socket(sock, server_hostname=host)
        proxy.socket.settimeout(timeout)

    proxy._create_socket = create
    try:
        client.open()
    except BaseException:
        sock = getattr(proxy, "socket", None)  # PyKMIP leaves it open when connect fails
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        raise
    return client


def create_kmip_key(host: str, port: int, name: str, *, cert: str, key: str, ca: str,
                    activate: bool = True, timeout: float = 10.0) -> str:
    """Make an AES-256 key named ``name`` on a KMIP server and return its unique id.

    The key is usable for what the ``kmip`` source does with it (encrypt, decrypt and
    MAC on the server) and is activated unless ``activate`` is false. It never leaves
    the server. For tests, benchmarks and first setups. A name that a key on the server
    has already (in any state) is refused with :class:`KeyProviderError` before anything
    is created: a ``kmip`` entry finds its key by name and refuses an ambiguous one.

    KMIP does not make names unique, so two callers creating the same name at the same
    time could both create a key. After its create, each looks the name up again: if it
    finds more than one key, a key made strictly before the others (earlier ``Initial
    Date``, whole seconds; in one second, the lower unique id when ids are numbers, as
    PyKMIP counts them) is the name's key, and a caller whose key is not that one destroys
    its key (never activated) and gets the same :class:`KeyProviderError` as when the name
    was taken before. Keys that cannot be told apart by age (one second, unique ids that
    are random UUIDs) are none of them first: each such caller destroys its key, and one
    that then finds the name free tries again after a random pause (at most 6 tries).
    A caller that saw only its own key keeps it, and any key made after that sees it and
    is not first; so at most one caller returns, and no key is left besides its key.
    """
    kmip = _kmip()
    enums = kmip.core.enums
    client = kmip_client(host, port, cert=cert, key=key, ca=ca, timeout=timeout)
    where = f"kmip {host}:{port}"
    try:
        def named() -> list[str]:
            return [str(u) for u in client.locate(attributes=[
                client.attribute_factory.create_attribute(enums.AttributeType.NAME, name)])]

        def exists(uids: list[str], note: str = "") -> KeyProviderError:
            return KeyProviderError(
                f"{where}: a key named {name!r} exists already (unique id "
                f"{', '.join(uids)}{note}); nothing was created",
                hint="choose another name, or use the existing key")

        for attempt in range(_CREATE_ATTEMPTS):
            if attempt:  # a tie with another creator: both withdrew; again, out of step
                time.sleep(random.uniform(0, _RETRY_PAUSE * 2 ** attempt))
            taken = named()
            if taken:
                raise exists(taken)
            uid = str(client.create(enums.CryptographicAlgorithm.AES, 256, name=name,
                                    cryptographic_usage_mask=[
                                        enums.CryptographicUsageMask.ENCRYPT,
                                        enums.CryptographicUsageMask.DECRYPT,
                                        enums.CryptographicUsageMask.MAC_GENERATE]))
            found = named()
            if len(found) > 1:
                order = {u: _creation_order(client, u) for u in found}
                first = min(order.values())
                if order[uid] == first and \
                        sum(1 for o in order.values() if o == first) == 1:
                    pass  # made strictly before the others: the name's key
                else:  # another key came first, or none can be told first: ours goes
                    _destroy(client, uid, where, name, found)
                    left = named()
                    if left:
                        raise exists(left, ", created at the same time by another client; "
                                     "the key made here was destroyed")
                    continue  # every creator withdrew: try again
            if activate:
                client.activate(uid)
            return uid
        raise KeyProviderError(
            f"{where}: a key named {name!r} could not be created: another client created "
            f"one at the same moment {_CREATE_ATTEMPTS} times, and neither was older; "
            "nothing was created", hint="try again, or choose another name")
    finally:
        _close_client(client)


#: tries of create_kmip_key when its key ties with another creator's (see there)
_CREATE_ATTEMPTS = 6
#: the random pause before try n is up to this many seconds times 2**n
_RETRY_PAUSE = 0.05


def _destroy(client: Any, uid: str, where: str, name: str, found: list[str]) -> None:
    """Destroy the key ``uid`` this call made (never activated), naming it if that fails."""
    try:
        client.destroy(uid)
    except Exception as exc:  # whatever PyKMIP raised
        others = ", ".join(u for u in found if u != uid)
        raise KeyProviderError(
            f"{where}: a key named {name!r} was created at the same time by another client "
            f"(unique id {others}), and destroying this one (unique id {uid}) failed: "
            f"{_describe(exc)}",
            hint=f"destroy the key with unique id {uid} on the server") from None


def _creation_order(client: Any, uid: str) -> tuple[float, int]:
    """Where the key ``uid`` comes in the order of creation, as far as the server tells:
    its ``Initial Date`` (whole seconds; unknown last), then its unique id when that is a
    number (PyKMIP counts them up as it creates). A unique id that is no number (a random
    UUID) says nothing of age: keys of one second then tie, and no key of a tie is first."""
    date: float = float("inf")
    with contextlib.suppress(Exception):  # (a server that does not say: by unique id)
        _uid, attributes = client.get_attributes(uid, ["Initial Date"])
        for attribute in attributes or ():
            value = getattr(getattr(attribute, "attribute_value", None), "value", None)
            if isinstance(value, int):
                date = value
    return date, int(uid) if uid.isdigit() else -1


def _close_client(client: Any) -> None:
    """Close a PyKMIP client and its socket (PyKMIP skips the close when the shutdown of a
    connection the server dropped fails)."""
    sock = getattr(getattr(client, "proxy", None), "socket", None)
    with contextlib.suppress(Exception):
        client.close()
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()


def _unreachable(exc: BaseException) -> bool:
    """True for a server that could not be reached or did not answer (worth retrying); a TLS
    handshake the server refused (a certificate problem) is not."""
    if isinstance(exc, ssl.SSLError) and not isinstance(exc, ssl.SSLEOFError):
        return False
    return isinstance(exc, (OSError, EOFError, TimeoutError))


#: What to do about a key in each state but Active (KMIP's states, by enum name).
_STATE_HINTS = {
    "PRE_ACTIVE": "activate it on the KMIP server (Activate)",
    "DEACTIVATED": "a deactivated (expired) or revoked key cannot be made active again: files "
                   "under it are readable only if the server's administrator allows its use; "
                   "rotate to a new key (cryptdisk keys add, promote) before a key's "
                   "deactivation date",
    "COMPROMISED": "the key was revoked as compromised: treat the data under it as exposed; "
                   "files under it are readable only if the server's administrator allows "
                   "its use",
    "DESTROYED": "the key was destroyed on the server: files under it cannot be opened",
    "DESTROYED_COMPROMISED": "the key was destroyed on the server: files under it cannot be "
                             "opened",
}


def _state_text(state: Any) -> str:
    name = getattr(state, "name", None)
    words = {"PRE_ACTIVE": "pre-active (never activated)",
             "DEACTIVATED": "deactivated (revoked or past its deactivation date)",
             "COMPROMISED": "compromised (revoked)",
             "DESTROYED": "destroyed", "DESTROYED_COMPROMISED": "destroyed (compromised)"}
    return words.get(name or "", f"in state {name or state!r}")


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}{': ' + text if text else ''}"

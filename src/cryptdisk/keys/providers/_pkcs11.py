"""PKCS#11: the key-encryption key is an AES key inside a token (an HSM, SoftHSM2).

Config::

    [[keyring.keys]]
    id = 5
    source = "pkcs11"
    module = "/usr/lib/softhsm/libsofthsm2.so"   # the token's PKCS#11 library
    token = "cryptdisk"                           # token label
    key = "kek-5"                                 # the AES key's label (CKA_LABEL)
    pin_env = "CRYPTDISK_PIN"                     # or pin_file = "secrets/pin" (mode 0600)

Every key slot is sealed and opened with ``CKM_AES_GCM`` inside the token (12-byte
nonce chosen by cryptdisk, the header's first 48 bytes as associated data, 128-bit
tag), so files are byte for byte what a local key writes. The check value is
``AES-CMAC(KEK, "cryptdisk key check v1")[:8]`` (``CKM_AES_CMAC``), computed in the token.
The key must be ``CKA_SENSITIVE`` and not ``CKA_EXTRACTABLE``; an extractable key is
refused. The PIN is read from its variable or file when the session is opened and
is never stored, shown or logged. Calls into a module are serialised by one lock per
module for the whole process (python-pkcs11 initialises the module without locking
arguments, which tells it that no two threads call it at once: SoftHSM2 then takes no
locks of its own, and two keys used from two threads failed with CKR_GENERAL_ERROR or
crashed) and run in a worker thread: one that does not return within ``timeout`` seconds (default
30) is left there and the caller gets a transient error, which the key's retries
handle; a lost session or device is closed and opened again on the next attempt.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from cryptography.exceptions import InvalidTag

from ...errors import KeyProviderError
from .._remote import RemoteKeyProvider
from .._sources import is_variable_name, not_a_variable_name

__all__ = ["Pkcs11Provider", "generate_pkcs11_key"]

_CHECK_LABEL = b"cryptdisk key check v1"


def _pkcs11() -> Any:
    try:
        import pkcs11
    except ImportError as exc:  # the registry's hint says what to install
        raise KeyProviderError(f"the pkcs11 provider needs python-pkcs11: {exc}",
                               hint="pip install 'cryptdisk[kms]'") from None
    return pkcs11


def read_pin(spec: dict[str, Any], base: str, what: str) -> str:
    """The PIN from ``pin_env`` or ``pin_file`` (a file must be mode 0600 or stricter)."""
    if "pin_env" in spec:
        value = os.environ.get(spec["pin_env"])
        if not value and not is_variable_name(spec["pin_env"]):
            raise KeyProviderError(f"{what}: {not_a_variable_name('pin_env')}")
        if not value:
            raise KeyProviderError(f"{what}: environment variable {spec['pin_env']} (the "
                                   "token PIN) is not set or empty")
        return value
    path = os.path.join(base, os.path.expanduser(spec["pin_file"]))
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise KeyProviderError(f"{what}: PIN file {path} cannot be read: "
                               f"{exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077:
            raise KeyProviderError(f"{what}: PIN file {path} is accessible by group or others "
                                   f"(mode {stat.S_IMODE(st.st_mode):04o})",
                                   hint=f"chmod 600 {path}")
        data = os.read(fd, 4097)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="strict").strip("\r\n") if len(data) <= 4096 else ""
    if not text:
        raise KeyProviderError(f"{what}: PIN file {path} is empty or too large")
    return text


class Pkcs11Provider(RemoteKeyProvider):
    """``source = "pkcs11"``: an AES key in a PKCS#11 token (see the module docstring)."""

    name = "pkcs11"
    label = "pkcs11"
    fields: ClassVar[frozenset[str]] = frozenset({"module", "token", "key", "pin_env",
                                                  "pin_file", "timeout"})
    wraps_keys: ClassVar[bool] = True
    required: ClassVar[frozenset[str]] = frozenset({"module", "token", "key"})

    def __init__(self, value: Any, *, base: str) -> None:
        super().__init__(value, base=base)
        for name in self.value:
            if name == "timeout":
                continue
            if not isinstance(self.value[name], str) or not self.value[name]:
                raise TypeError(f"{name} must be a non-empty string")
        if ("pin_env" in self.value) == ("pin_file" in self.value):
            raise TypeError("needs exactly one of pin_env and pin_file (a PIN is never "
                            "written in the config)")
        timeout = self.value.get("timeout", DEFAULT_TIMEOUT)
        if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
            raise TypeError("timeout must be a number of seconds above 0")
        self.timeout = float(timeout)
        self._worker: _Worker | None = None
        self._lock = _module_lock(os.path.join(self.base, self.value["module"]))
        self._session: Any = None
        self._key: Any = None
        self._token_id: tuple[str, str] = ("", "")  # the token of the session (_logout)
        self._check: bytes | None = None
        #: what made the last session go away (said when opening a new one fails)
        self._lost: str | None = None

    def describe(self) -> str:
        return f"pkcs11 token {self.value['token']!r} key {self.value['key']!r}"

    def _bounded(self, what: str, fn: Callable[[], Any]) -> Any:
        """``fn()`` in this provider's worker thread, waiting at most ``timeout`` seconds.

        PKCS#11 calls cannot be interrupted: a call that does not return in time is
        left to its thread (which is abandoned, a new one takes the next call) and the
        caller gets a transient :class:`KeyProviderError`. While it hangs it holds the
        module lock, so later calls time out too until it returns.
        """
        while True:
            worker = self._worker
            if worker is None:
                worker = self._worker = _Worker(f"cryptdisk-pkcs11-{self.value['token']}")
            answer = worker.call(fn, self.timeout)
            if answer is not None:
                break
            if self._worker is worker:  # stopped by close() meanwhile: a new one takes it
                self._worker = None
        done, result = answer
        if not done:
            self._worker = None
            worker.stop()
            raise KeyProviderError(f"{self.describe()}: {what}: the PKCS#11 module did not "
                                   f"answer within {self.timeout:g} s", transient=True)
        return result

    def _locked(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with self._lock:
                return fn()
        return run

    def connect(self, what: str, key_id: int) -> int:
        def run() -> int:
            self._open(what)
            return int(self._key[self._attr.VALUE_LEN])
        return int(self._bounded("opening the session", self._locked(run)))

    def _open(self, what: str) -> None:
        if self._session is not None:
            return
        p11 = _pkcs11()
        exc_mod = p11.exceptions
        self._attr = p11.Attribute
        # after a lost session, say what lost it: a token pulled out shows first as that
        before = f" (the previous session ended: {self._lost})" if self._lost else ""
        where = f"{what}: {self.describe()}"
        module = os.path.join(self.base, self.value["module"])
        try:
            lib = p11.lib(module)
        except (RuntimeError, OSError, exc_mod.PKCS11Error) as exc:
            if not os.path.exists(module):
                raise KeyProviderError(f"{what}: PKCS#11 module {self.value['module']} cannot "
                                       "be loaded: no such file") from None
            raise KeyProviderError(f"{what}: PKCS#11 module {self.value['module']} cannot be "
                                   f"loaded: {type(exc).__name__}",
                                   hint=_load_hint(module)) from None
        try:
            token = lib.get_token(token_label=self.value["token"])
        except (exc_mod.NoSuchToken, exc_mod.MultipleTokensReturned) as exc:
            raise KeyProviderError(f"{where}: {_describe(exc)}{before}") from None
        except exc_mod.PKCS11Error as exc:
            raise KeyProviderError(f"{where}: finding the token failed: {_describe(exc)}"
                                   f"{before}") from None
        pin = read_pin(self.value, self.base, what)
        try:
            session = _login(token, pin, exc_mod)
        except exc_mod.PinIncorrect:
            raise KeyProviderError(f"{where}: the PIN was refused") from None
        except exc_mod.PKCS11Error as exc:
            raise KeyProviderError(f"{where}: cannot open a session: {_describe(exc)}"
                                   f"{before}") from None
        finally:
            del pin
        try:
            key = session.get_key(object_class=p11.ObjectClass.SECRET_KEY,
                                  key_type=p11.KeyType.AES, label=self.value["key"])
            extractable = bool(key[p11.Attribute.EXTRACTABLE])
            sensitive = bool(key[p11.Attribute.SENSITIVE])
            size = int(key[p11.Attribute.VALUE_LEN])
        except (exc_mod.NoSuchKey, exc_mod.MultipleObjectsReturned) as exc:
            _logout(_ident(token), session)
            raise KeyProviderError(f"{where}: {_describe(exc)}{before}") from None
        except exc_mod.PKCS11Error as exc:
            _logout(_ident(token), session)
            raise KeyProviderError(f"{where}: {_describe(exc)}{before}") from None
        if extractable or not sensitive:
            _logout(_ident(token), session)
            raise KeyProviderError(f"{where}: the key is extractable or not sensitive; a "
                                   "key-encryption key must never leave the token",
                                   hint="generate it with CKA_EXTRACTABLE false and "
                                        "CKA_SENSITIVE true")
        if size not in (16, 32):
            _logout(_ident(token), session)
            raise KeyProviderError(f"{where}: the key is {size} bytes; cryptdisk takes AES-128 "
                                   "or AES-256")
        self._session, self._key, self._token_id = session, key, _ident(token)
        self._lost = None
        try:
            self._check = bytes(key.sign(_CHECK_LABEL, mechanism=p11.Mechanism.AES_CMAC))[:8]
        except exc_mod.PKCS11Error as exc:
            self.close()
            raise KeyProviderError(f"{where}: AES-CMAC (the key check value) failed: "
                                   f"{_describe(exc)}") from None

    def check_value(self) -> bytes:
        if self._check is None:
            raise KeyProviderError(f"{self.describe()}: not connected")
        return self._check

    def _gcm(self, nonce: bytes, associated_data: bytes) -> tuple[Any, Any]:
        p11 = _pkcs11()
        return p11.Mechanism.AES_GCM, p11.GCMParams(nonce, associated_data, 128)

    def _failed(self, what: str, exc: Exception) -> KeyProviderError:
        """A provider error for a failed call; a lost session or device is closed, so the
        next attempt opens a new one, and is transient."""
        errors = _pkcs11().exceptions
        lost = tuple(getattr(errors, n) for n in _LOST if hasattr(errors, n))
        if isinstance(exc, lost):
            self.close()
            self._lost = _describe(exc)
        return KeyProviderError(f"{self.describe()}: {what} failed: {_describe(exc)}",
                                transient=isinstance(exc, lost))

    def seal(self, nonce: bytes, dek: bytes, associated_data: bytes) -> bytes:
        mech, param = self._gcm(nonce, associated_data)

        def run() -> bytes:
            self._open("sealing a data key")
            try:
                return bytes(self._key.encrypt(dek, mechanism=mech, mechanism_param=param))
            except _pkcs11().exceptions.PKCS11Error as exc:
                raise self._failed("sealing a data key", exc) from None
        return bytes(self._bounded("sealing a data key", self._locked(run)))

    def open(self, nonce: bytes, sealed: bytes, associated_data: bytes) -> bytes:
        mech, param = self._gcm(nonce, associated_data)
        errors = _pkcs11().exceptions

        def run() -> bytes:
            self._open("opening a data key")
            try:
                return bytes(self._key.decrypt(sealed, mechanism=mech, mechanism_param=param))
            except (errors.EncryptedDataInvalid, errors.EncryptedDataLenRange,
                    errors.GeneralError):
                # SoftHSM2 reports a failed GCM tag as CKR_GENERAL_ERROR
                raise InvalidTag() from None
            except errors.PKCS11Error as exc:
                raise self._failed("opening a data key", exc) from None
        return bytes(self._bounded("opening a data key", self._locked(run)))

    def destroy(self, what: str) -> str:
        """Destroy the key object in the token (``C_DestroyObject`` in a read-write session)."""
        p11 = _pkcs11()
        exc_mod = p11.exceptions
        where = f"{what}: {self.describe()}"
        try:
            with self._lock:
                token = p11.lib(os.path.join(self.base, self.value["module"])).get_token(
                    token_label=self.value["token"])
                pin = read_pin(self.value, self.base, what)
                try:
                    logged_in = _logged_in(token, pin, exc_mod, rw=True)
                finally:
                    del pin
                with logged_in as session:
                    found = list(session.get_objects({
                        p11.Attribute.LABEL: self.value["key"],
                        p11.Attribute.CLASS: p11.ObjectClass.SECRET_KEY}))
                    for obj in found:
                        obj.destroy()
        except exc_mod.PinIncorrect:
            raise KeyProviderError(f"{where}: the PIN was refused") from None
        except (RuntimeError, OSError, exc_mod.PKCS11Error) as exc:
            raise KeyProviderError(f"{where}: destroying the key failed: "
                                   f"{_describe(exc)}") from None
        if not found:
            return f"{self.describe()} was already gone"
        return f"destroyed {self.describe()} in the token"

    def close(self) -> None:
        # a call hung in the module holds the lock: then the session is left to it
        if not self._lock.acquire(timeout=self.timeout):
            return
        try:
            session, self._session, self._key = self._session, None, None
            if session is not None:
                _logout(self._token_id, session)  # (the session may already be gone)
        finally:
            self._lock.release()
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()


#: PKCS#11 errors that mean the session or device went away (a new session may work).
_LOST = ("SessionClosed", "SessionHandleInvalid", "DeviceRemoved", "DeviceError",
         "TokenNotPresent", "DeviceMemory", "ObjectHandleInvalid", "KeyHandleInvalid")
#: Seconds a PKCS#11 call may take before the caller gets an error (the ``timeout`` field).
DEFAULT_TIMEOUT = 30.0


class _Worker:
    """One daemon thread running calls from a queue, so a caller can stop waiting."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._guard = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, box, done = item
            try:
                box.append((True, fn()))
            except BaseException as exc:  # handed to the caller
                box.append((False, exc))
            done.set()

    def call(self, fn: Callable[[], Any], timeout: float) -> tuple[bool, Any] | None:
        """(True, result) or (False, None) when ``fn`` did not return within ``timeout``;
        None when this worker was stopped (a call queued before the stop still runs)."""
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        with self._guard:
            if self._stopped:
                return None
            self._queue.put((fn, box, done))
        if not done.wait(timeout):
            return False, None
        ok, value = box[0]
        if not ok:
            raise value
        return True, value

    def stop(self) -> None:
        with self._guard:
            if not self._stopped:
                self._stopped = True
                self._queue.put(None)


_PROCESS_SECRET = os.urandom(32)
#: (module, token label) -> HMAC(process secret, the PIN that logged in); never the PIN
_LOGINS: dict[tuple[str, str], bytes] = {}


#: (module, token label) -> [the session that logged in here or None, sessions sharing it]
_ANCHORS: dict[tuple[str, str], list[Any]] = {}
_ANCHORS_LOCK = threading.Lock()


_MODULE_LOCKS: dict[str, threading.RLock] = {}
_MODULE_LOCKS_LOCK = threading.Lock()


def _module_lock(module: str) -> threading.RLock:
    """The lock every call into the PKCS#11 module at ``module`` holds (by its real path)."""
    real = os.path.realpath(module)
    with _MODULE_LOCKS_LOCK:
        return _MODULE_LOCKS.setdefault(real, threading.RLock())


def _login(token: Any, pin: str, exc_mod: Any, rw: bool = False) -> Any:
    """A session of the logged-in user; give it back with :func:`_logout`.

    PKCS#11 logs in once per process and token: while one session is logged in, a new
    one shares that login and the token checks no PIN. So a PIN that differs from the
    one that logged in here is refused as the token would refuse it.

    The login is held by one session per token (the anchor, opened with the PIN) and
    every caller gets a session of its own opened without one: closing a session that
    logged in logs the whole token out (python-pkcs11 calls ``C_Logout``), which would
    take the login from the other keys' sessions, and opening with the PIN while logged
    in leaves the session python-pkcs11 opened before the refused login open (a session
    leaked per key loaded). The anchor is closed (logged out) with the last session.
    """
    ident = _ident(token)
    digest = hmac.new(_PROCESS_SECRET, pin.encode(), hashlib.sha256).digest()
    with _ANCHORS_LOCK:
        anchor = _ANCHORS.get(ident)
        if anchor is None:
            try:
                held = token.open(user_pin=pin)
            except exc_mod.UserAlreadyLoggedIn:  # logged in by other code of this process
                known = _LOGINS.get(ident)
                if known is not None and not hmac.compare_digest(known, digest):
                    raise exc_mod.PinIncorrect() from None
                _LOGINS.setdefault(ident, digest)
                held = None
            else:
                _LOGINS[ident] = digest
            anchor = _ANCHORS[ident] = [held, 0]
        else:
            known = _LOGINS.get(ident)
            if known is not None and not hmac.compare_digest(known, digest):
                raise exc_mod.PinIncorrect()
        try:
            session = token.open(rw=rw)
        except BaseException:
            if not anchor[1]:
                _drop_anchor(ident)
            raise
        anchor[1] += 1
    return session


def _logout(ident: tuple[str, str], session: Any) -> None:
    """Close a session :func:`_login` gave; the last one of a token closes its anchor."""
    try:
        with contextlib.suppress(Exception):  # the session may already be gone
            session.close()
    finally:
        with _ANCHORS_LOCK:
            anchor = _ANCHORS.get(ident)
            if anchor is not None:
                anchor[1] -= 1
                if anchor[1] <= 0:
                    _drop_anchor(ident)


@contextlib.contextmanager
def _logged_in(token: Any, pin: str, exc_mod: Any, rw: bool = False) -> Iterator[Any]:
    """:func:`_login`'s session for a ``with`` block."""
    session = _login(token, pin, exc_mod, rw)
    try:
        yield session
    finally:
        _logout(_ident(token), session)


def _drop_anchor(ident: tuple[str, str]) -> None:
    held = _ANCHORS.pop(ident)[0]
    if held is not None:
        _LOGINS.pop(ident, None)  # logged out: the next login checks the PIN again
        with contextlib.suppress(Exception):
            held.close()


def _ident(token: Any) -> tuple[str, str]:
    return (str(token.slot.slot_id), str(token.label))


#: python-pkcs11's lookup failures, whose own text is the search template (a dict): the
#: messages name the token and key label already, so these say what was found.
_LOOKUPS = {
    "NoSuchToken": "the module has no token with that label",
    "MultipleTokensReturned": "the module has more than one token with that label",
    "NoSuchKey": "the token has no AES secret key with that label",
    "MultipleObjectsReturned": "the token has more than one AES secret key with that label",
    # a session, token or key that went away (_LOST): what an operator can act on
    "DeviceRemoved": "the token was removed (CKR_DEVICE_REMOVED)",
    "TokenNotPresent": "the token is not present (CKR_TOKEN_NOT_PRESENT)",
    "DeviceError": "the token failed (CKR_DEVICE_ERROR)",
    "SessionClosed": "the token closed the session (CKR_SESSION_CLOSED)",
    "SessionHandleInvalid": "the session is no longer valid (CKR_SESSION_HANDLE_INVALID)",
    "ObjectHandleInvalid": "the key is no longer in the token (CKR_OBJECT_HANDLE_INVALID: "
                           "the token was removed or re-initialised, or the key destroyed)",
    "KeyHandleInvalid": "the key is no longer in the token (CKR_KEY_HANDLE_INVALID: the "
                        "token was removed or re-initialised, or the key destroyed)",
}


def _load_hint(module: str) -> str:
    """What to check when a module that exists fails to load or initialise: most often its
    own configuration. For SoftHSM2, what SOFTHSM2_CONF names and the token directory
    there (read from the file; nothing secret is in it, and the PIN is never involved)."""
    generic = ("the module failed to initialise: check its own configuration (for SoftHSM2, "
               "the SOFTHSM2_CONF environment variable and the token directory it names)")
    if "softhsm" not in os.path.basename(module).lower():
        return generic
    conf = os.environ.get("SOFTHSM2_CONF")
    named = (f"SOFTHSM2_CONF names {conf}" if conf else
             "SOFTHSM2_CONF is not set, so SoftHSM2 reads /etc/softhsm/softhsm2.conf")
    path = conf or "/etc/softhsm/softhsm2.conf"
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 16)
    except FileNotFoundError:
        return f"{named}, which does not exist: point SOFTHSM2_CONF at the token's softhsm2.conf"
    except OSError as exc:
        return (f"{named}, which cannot be read ({exc.strerror}): point SOFTHSM2_CONF at a "
                "softhsm2.conf this user can read")
    tokendir = None
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and name.strip() == "directories.tokendir":
            tokendir = value.split("#", 1)[0].strip()
    if not tokendir:
        return f"{named}, which sets no directories.tokendir: check that file"
    if not os.path.isdir(tokendir):
        return (f"{named}, whose token directory {tokendir} does not exist: fix "
                "directories.tokendir there, or point SOFTHSM2_CONF at the token's own config")
    return (f"{named}, whose token directory is {tokendir}: check that this user can read "
            "and write it, and that file's other settings")


def _describe(exc: BaseException) -> str:
    lookup = _LOOKUPS.get(type(exc).__name__)
    if lookup is not None:
        return lookup
    text = str(exc).strip()
    return f"{type(exc).__name__}{': ' + text if text else ''}"


def generate_pkcs11_key(module: str, token: str, label: str, *, pin: str,
                        bits: int = 256) -> None:
    """Generate a sensitive, non-extractable AES key labelled ``label`` in a token.

    For setting up a token (and for tests); the key is made by the token and never
    leaves it. Refuses when a key with that label exists.
    """
    p11 = _pkcs11()
    with _module_lock(module), _logged_in(p11.lib(module).get_token(token_label=token), pin,
                                          p11.exceptions, rw=True) as session:
        existing = list(session.get_objects({p11.Attribute.LABEL: label,
                                             p11.Attribute.CLASS: p11.ObjectClass.SECRET_KEY}))
        if existing:
            raise KeyProviderError(f"token {token!r} already has a key labelled {label!r}")
        session.generate_key(p11.KeyType.AES, bits, label=label, store=True, template={
            p11.Attribute.EXTRACTABLE: False, p11.Attribute.SENSITIVE: True,
            p11.Attribute.ENCRYPT: True, p11.Attribute.DECRYPT: True,
            p11.Attribute.SIGN: True, p11.Attribute.WRAP: False,
        })

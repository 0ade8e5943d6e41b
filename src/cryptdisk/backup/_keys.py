"""The repository key and its wrappings (keyring keys, passphrases).

A repository has one random 256-bit key of its own. It is stored only wrapped:
under a keyring key (AES-256-GCM through :meth:`cryptdisk.keys.Key.wrap`) or
under a passphrase (Argon2id, then AES-256-GCM). Every wrapping names the
repository in its associated data, so a wrapping cannot be moved to another
repository. Subkeys for each use come from HKDF-SHA256 of the repository key.
"""

from __future__ import annotations

import base64
import hmac
import os
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from ..errors import BackupError, BackupKeyError
from ..keys import Keyring

__all__ = ["RepoKeys", "check_passphrase", "unlock", "wrap_with_key", "wrap_with_passphrase"]

#: Argon2id cost (RFC 9106's second recommended option: 64 MiB, 3 passes).
ARGON2 = {"memory_cost": 64 * 1024, "iterations": 3, "lanes": 4}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode(), validate=True)


def _ad(repo_id: str) -> bytes:
    return b"cryptdisk backup repository key v1:" + repo_id.encode()


#: Bounds on Argon2id parameters read from a repository: its config is not secret and
#: not authenticated before the key is unwrapped (the parameter MAC needs the key), so an
#: edited one must not make opening it exhaust memory or time. Each at most 16 times
#: :data:`ARGON2` (4 times for lanes), and the work (memory times passes) at most 16 times
#: its: 2-3 CPU seconds where the default takes 0.15. A wrapping is refused before
#: Argon2id runs, and one that would exceed them is never written.
LIMITS = {"memory_cost": (8, 16 * ARGON2["memory_cost"]),
          "iterations": (1, 16 * ARGON2["iterations"]), "lanes": (1, 4 * ARGON2["lanes"])}
MAX_WORK = 16 * ARGON2["memory_cost"] * ARGON2["iterations"]


def check_kdf_params(params: dict[str, Any]) -> None:
    """:class:`BackupError` unless ``params`` are Argon2id parameters within :data:`LIMITS`
    and :data:`MAX_WORK`."""
    for name, (lo, hi) in LIMITS.items():
        value = params.get(name)
        if type(value) is not int or not lo <= value <= hi:
            raise BackupError(f"the repository's Argon2id {name} {value!r} is outside "
                              f"[{lo}, {hi}] (a damaged or edited config)")
    work = params["memory_cost"] * params["iterations"]
    if work > MAX_WORK:
        raise BackupError(f"the repository's Argon2id memory_cost x iterations {work} is over "
                          f"{MAX_WORK} (a damaged or edited config)")


def check_passphrase(passphrase: object) -> None:
    """A passphrase is a ``str`` (or None: not given): a TypeError names what it was."""
    if passphrase is not None and not isinstance(passphrase, str):
        raise TypeError(f"a backup repository's passphrase must be a str, not "
                        f"{type(passphrase).__name__}")


def _passphrase_kek(passphrase: str, salt: bytes, params: dict[str, int]) -> bytes:
    check_passphrase(passphrase)
    if not passphrase:
        raise BackupKeyError("the passphrase is empty")
    check_kdf_params(params)
    kdf = Argon2id(salt=salt, length=32, iterations=params["iterations"],
                   lanes=params["lanes"], memory_cost=params["memory_cost"])
    return kdf.derive(passphrase.encode())


def wrap_with_passphrase(master: bytes, repo_id: str, passphrase: str,
                         params: dict[str, int] | None = None) -> dict[str, Any]:
    params = dict(params or ARGON2)
    salt = os.urandom(16)
    kek = _passphrase_kek(passphrase, salt, params)
    nonce = os.urandom(12)
    blob = nonce + AESGCM(kek).encrypt(nonce, master, _ad(repo_id))
    return {"kind": "passphrase", "kdf": "argon2id", "salt": _b64(salt), "params": params,
            "blob": _b64(blob)}


def wrap_with_key(master: bytes, repo_id: str, keyring: Keyring) -> dict[str, Any]:
    key = keyring.current_key()
    return {"kind": "key", "key_id": key.key_id, "check": key.check_value.hex(),
            "blob": _b64(key.wrap(master, _ad(repo_id)))}


def describe(wrapping: dict[str, Any]) -> str:
    if wrapping.get("kind") == "passphrase":
        p = wrapping.get("params", {})
        return (f"passphrase (argon2id, {p.get('memory_cost', '?')} KiB, "
                f"{p.get('iterations', '?')} passes)")
    return f"keyring key id {wrapping.get('key_id')} (check value {wrapping.get('check')})"


def unlock(wrappings: list[dict[str, Any]], repo_id: str, *, passphrase: str | None = None,
           keyring: Keyring | None = None) -> bytes:
    """The repository key, from the first wrapping that the passphrase or a keyring key opens."""
    if passphrase is None and keyring is None:
        raise BackupKeyError("the backup repository is locked: give its passphrase or a "
                             "keyring key that wraps its key",
                             hint="--passphrase-env VAR, --repo-keyring CONFIG or "
                             "--repo-key-file FILE")
    kinds = {w.get("kind") for w in wrappings}
    tried = []
    for w in wrappings:
        try:
            blob = _unb64(w["blob"])
            if w.get("kind") == "passphrase" and passphrase is not None:
                tried.append("passphrase")
                kek = _passphrase_kek(passphrase, _unb64(w["salt"]), w["params"])
                return AESGCM(kek).decrypt(blob[:12], blob[12:], _ad(repo_id))
            if w.get("kind") == "key" and keyring is not None:
                for key in keyring:
                    if key.check_value.hex() == w.get("check"):
                        tried.append("key")
                        return key.unwrap(blob, _ad(repo_id))
        except InvalidTag:
            continue
        except (KeyError, TypeError, ValueError) as exc:
            raise BackupError(f"a key wrapping of the repository is malformed ({exc})") from None
    if passphrase is not None and "passphrase" in tried:
        raise BackupKeyError("wrong passphrase for this backup repository")
    if passphrase is not None and "passphrase" not in kinds:
        raise BackupKeyError("this backup repository has no passphrase wrapping; it opens "
                             "with a keyring key", hint="--repo-keyring / --repo-key-file")
    if keyring is not None and "key" in tried:
        raise BackupKeyError("a keyring key matched a wrapping of this repository but did not "
                             "open it (the wrapping was tampered with)")
    raise BackupKeyError("none of the given keyring keys wraps this repository's key "
                         f"(keyring key ids {sorted(keyring.ids) if keyring else []}; the "
                         "repository has " + "; ".join(describe(w) for w in wrappings) + ")")


@dataclass(frozen=True, repr=False)
class RepoKeys:
    """Subkeys of the repository key, one per use."""

    chunk: bytes     # AES-256-GCM of chunks
    chunk_id: bytes  # HMAC-SHA-256 naming chunks
    manifest: bytes  # AES-256-GCM of manifests
    params: bytes    # HMAC of the repository's public parameters
    seed: int        # the chunker's gear table seed

    @classmethod
    def derive(cls, master: bytes) -> RepoKeys:
        def sub(purpose: bytes, n: int = 32) -> bytes:
            return HKDF(hashes.SHA256(), n, None, b"cryptdisk backup " + purpose).derive(master)
        return cls(sub(b"chunk"), sub(b"chunk id"), sub(b"manifest"), sub(b"params"),
                   int.from_bytes(sub(b"cdc seed", 4), "big"))

    def chunk_name(self, data: bytes) -> str:
        return hmac.new(self.chunk_id, data, "sha256").hexdigest()

    def params_mac(self, doc: bytes) -> str:
        return hmac.new(self.params, doc, "sha256").hexdigest()

    def __repr__(self) -> str:
        return "<RepoKeys>"

    def __reduce__(self) -> Any:
        raise TypeError("backup repository keys cannot be pickled")

"""SCRAM-SHA-256 (RFC 5802, RFC 7677) as PostgreSQL speaks it: verifiers and the server side.

A verifier keeps the salt, the iteration count, StoredKey and ServerKey, never
the password; it is written as PostgreSQL writes it
(``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``, base64), so a
verifier made by ``psql``'s ``\\password`` is accepted as is. PBKDF2, HMAC and
SHA-256 come from ``cryptography``.
"""

from __future__ import annotations

import base64
import hmac
import os
import re
import secrets
import unicodedata
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import hmac as chmac
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC

from ..errors import LoginError, ProtocolError

__all__ = ["DEFAULT_ITERATIONS", "ScramServer", "Verifier", "make_verifier"]

#: OWASP's current guidance for PBKDF2-HMAC-SHA256 (Password Storage Cheat Sheet).
DEFAULT_ITERATIONS = 600_000
MIN_ITERATIONS = 4096  # RFC 7677's minimum
MECHANISM = "SCRAM-SHA-256"
MECHANISM_PLUS = "SCRAM-SHA-256-PLUS"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ProtocolError("SCRAM message has invalid base64") from None


def _hmac(key: bytes, msg: bytes) -> bytes:
    h = chmac.HMAC(key, hashes.SHA256())
    h.update(msg)
    return h.finalize()


def _sha256(data: bytes) -> bytes:
    h = hashes.Hash(hashes.SHA256())
    h.update(data)
    return h.finalize()


def normalize(password: str) -> bytes:
    """SASLprep, simplified as PostgreSQL applies it: ASCII as is, else NFKC with spaces mapped."""
    if password.isascii():
        return password.encode()
    mapped = "".join(" " if unicodedata.category(c) == "Zs" else c for c in password
                     if c not in "\u00ad\u200b\u2060\ufeff\u034f\u180b\u180c\u180d")
    return unicodedata.normalize("NFKC", mapped).encode("utf-8")


@dataclass(frozen=True)
class Verifier:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __str__(self) -> str:
        return (f"{MECHANISM}${self.iterations}:{_b64(self.salt)}$"
                f"{_b64(self.stored_key)}:{_b64(self.server_key)}")

    def __repr__(self) -> str:
        return f"<Verifier SCRAM-SHA-256 iterations={self.iterations}>"

    @classmethod
    def parse(cls, text: str) -> Verifier:
        m = re.fullmatch(r"SCRAM-SHA-256\$(\d+):([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+):"
                         r"([A-Za-z0-9+/=]+)", text)
        if not m:
            raise ValueError("not a SCRAM-SHA-256 verifier")
        v = cls(_unb64(m[2]), int(m[1]), _unb64(m[3]), _unb64(m[4]))
        if len(v.stored_key) != 32 or len(v.server_key) != 32 or v.iterations < 1:
            raise ValueError("not a SCRAM-SHA-256 verifier")
        return v


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=salt, iterations=iterations)
    return kdf.derive(normalize(password))


def make_verifier(password: str, iterations: int = DEFAULT_ITERATIONS,
                  salt: bytes | None = None) -> Verifier:
    """A new verifier for ``password`` (16-byte random salt)."""
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"SCRAM iterations must be at least {MIN_ITERATIONS}")
    salt = os.urandom(16) if salt is None else salt
    sp = salted_password(password, salt, iterations)
    return Verifier(salt, iterations, _sha256(_hmac(sp, b"Client Key")),
                    _hmac(sp, b"Server Key"))


def _attributes(text: str, what: str) -> list[tuple[str, str]]:
    out = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=":
            raise ProtocolError(f"SCRAM {what} is malformed")
        out.append((part[0], part[2:]))
    return out


class ScramServer:
    """One server-side SCRAM-SHA-256 exchange.

    ``verifier`` None runs the same exchange against ``fake`` (derived from the
    user name) and fails at the end, so an unknown user looks like a wrong
    password. ``channel_binding`` is the tls-server-end-point data of this
    connection's certificate (None without TLS).
    """

    def __init__(self, verifier: Verifier | None, fake: Verifier,
                 channel_binding: bytes | None, *, server_nonce: str | None = None) -> None:
        self.verifier = verifier
        self.use = verifier or fake
        self.channel_binding = channel_binding
        self.server_nonce = server_nonce or _b64(secrets.token_bytes(18))
        self.state = "first"

    def mechanisms(self) -> list[str]:
        return [MECHANISM_PLUS, MECHANISM] if self.channel_binding is not None else [MECHANISM]

    def first(self, mechanism: str, client_first: bytes) -> bytes:
        """Take the client-first-message; return the server-first-message."""
        if self.state != "first":
            raise ProtocolError("SCRAM exchange out of order")
        if mechanism not in self.mechanisms():
            raise ProtocolError(f"SASL mechanism {mechanism!r} is not offered")
        try:
            text = client_first.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("SCRAM client-first-message is not UTF-8") from None
        parts = text.split(",", 2)
        if len(parts) != 3:
            raise ProtocolError("SCRAM client-first-message is malformed")
        cbflag, authzid, bare = parts
        if authzid:
            raise ProtocolError("SCRAM authorization identities are not supported")
        if cbflag.startswith("p="):
            if mechanism != MECHANISM_PLUS or cbflag != "p=tls-server-end-point":
                raise ProtocolError("SCRAM channel binding type is not tls-server-end-point")
        elif cbflag == "y":
            if self.channel_binding is not None:  # client thinks we cannot bind: a downgrade
                raise LoginError("channel binding was offered and refused")
        elif cbflag != "n":
            raise ProtocolError("SCRAM client-first-message has a bad gs2 header")
        if mechanism == MECHANISM_PLUS and not cbflag.startswith("p="):
            raise ProtocolError("SCRAM-SHA-256-PLUS without channel binding")
        attrs = _attributes(bare, "client-first-message")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise ProtocolError("SCRAM client-first-message lacks n= and r=")
        if any(k == "m" for k, _ in attrs):
            raise ProtocolError("SCRAM extensions are not supported")
        self.gs2_header = f"{cbflag},{authzid},"
        self.nonce = attrs[1][1] + self.server_nonce
        self.client_first_bare = bare
        self.server_first = f"r={self.nonce},s={_b64(self.use.salt)},i={self.use.iterations}"
        self.state = "final"
        return self.server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """Check the client-final-message; return server-final or raise LoginError."""
        if self.state != "final":
            raise ProtocolError("SCRAM exchange out of order")
        self.state = "done"
        try:
            text = client_final.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("SCRAM client-final-message is not UTF-8") from None
        attrs = _attributes(text, "client-final-message")
        if len(attrs) < 3 or attrs[0][0] != "c" or attrs[1][0] != "r" or attrs[-1][0] != "p":
            raise ProtocolError("SCRAM client-final-message lacks c=, r= and p=")
        expected_cb = self.gs2_header.encode()
        if self.gs2_header.startswith("p="):
            assert self.channel_binding is not None
            expected_cb += self.channel_binding
        ok = hmac.compare_digest(_unb64(attrs[0][1]), expected_cb)
        ok &= hmac.compare_digest(attrs[1][1].encode(), self.nonce.encode())
        proof = _unb64(attrs[-1][1])
        without_proof = text[:text.rindex(",p=")]
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        signature = _hmac(self.use.stored_key, auth_message)
        if len(proof) != len(signature):
            raise ProtocolError("SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        ok &= hmac.compare_digest(_sha256(client_key), self.use.stored_key)
        if not ok or self.verifier is None:
            raise LoginError("password authentication failed")
        return f"v={_b64(_hmac(self.use.server_key, auth_message))}".encode()

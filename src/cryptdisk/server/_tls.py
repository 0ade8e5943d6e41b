"""TLS for the server: a TLS 1.2+ context, self-signed certificates, fingerprints."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import re
import ssl
import tempfile
from collections.abc import Iterator

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .._durable import fsync_path
from .._flocks import exclusive
from ..errors import ServerError

__all__ = ["certificate_fingerprint", "end_point_hash", "ensure_self_signed", "load_tls",
           "self_signed", "server_context"]


def server_context(cert: str | os.PathLike[str], key: str | os.PathLike[str],
                   client_ca: str | os.PathLike[str] | None = None) -> ssl.SSLContext:
    """A server context: TLS 1.2 or 1.3 (1.3 when the client has it), forward-secret AEAD only.

    ``client_ca``: client certificates are asked for and, when sent, must chain to it
    (users marked CLIENTCERT must then present one whose CN is their name).
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers("ECDHE+AESGCM:ECDHE+CHACHA20")  # TLS 1.2; 1.3's suites are all AEAD
    # no TLS 1.2 renegotiation (as PostgreSQL): a write never has to wait for a read
    ctx.options |= (ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
                    | ssl.OP_NO_RENEGOTIATION)
    # no session tickets (as PostgreSQL): libpq never resumes a session, so TLS 1.3's two
    # tickets after every handshake were work and bytes for nothing; every connection
    # makes a full handshake, with its certificate checks
    ctx.options |= ssl.OP_NO_TICKET
    ctx.num_tickets = 0
    try:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key))
    except (OSError, ssl.SSLError) as exc:
        raise ServerError(f"cannot load the TLS certificate {os.fspath(cert)} and key "
                          f"{os.fspath(key)}: {exc}") from None
    if client_ca is not None:
        ctx.verify_mode = ssl.CERT_OPTIONAL
        try:
            ctx.load_verify_locations(os.fspath(client_ca))
        except (OSError, ssl.SSLError) as exc:
            raise ServerError(f"cannot load the client CA {os.fspath(client_ca)}: {exc}") \
                from None
    return ctx


def _load(cert: str | os.PathLike[str]) -> x509.Certificate:
    try:
        with open(cert, "rb") as f:
            return x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError) as exc:
        raise ServerError(f"cannot read the TLS certificate {os.fspath(cert)}: {exc}") from None


def certificate_fingerprint(cert: str | os.PathLike[str]) -> str:
    """The SHA-256 fingerprint of a PEM certificate, as ``AB:CD:...``."""
    return _load(cert).fingerprint(hashes.SHA256()).hex(":").upper()


def load_tls(cert: str | os.PathLike[str], key: str | os.PathLike[str],
             client_ca: str | os.PathLike[str] | None = None) -> tuple[ssl.SSLContext, bytes]:
    """:func:`server_context` and the tls-server-end-point hash of its certificate (SCRAM's
    channel binding), read from the files now: at start, and again on SIGHUP.

    The certificate file is read once: the context loads those bytes and the hash is of
    them, so a file replaced meanwhile (a renewal) never pairs the context's certificate
    with another one's hash (SCRAM-SHA-256-PLUS logins would all fail)."""
    try:
        with open(cert, "rb") as f:
            pem = f.read()
        der = x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
    except (OSError, ValueError) as exc:
        raise ServerError(f"cannot load the TLS certificate {os.fspath(cert)} and key "
                          f"{os.fspath(key)}: {exc}") from None
    # the context loads a file: the bytes read, in a file of this process's own (the
    # certificate is public; the key is read from its file once, by the context)
    with tempfile.TemporaryDirectory(prefix="cryptdisk-tls-") as tmp:
        copy = os.path.join(tmp, "cert.pem")
        with open(copy, "wb") as f:
            f.write(pem)
        try:
            ctx = server_context(copy, key, client_ca)
        except ServerError as exc:  # name the file, not the copy
            raise ServerError(str(exc).replace(copy, os.fspath(cert))) from None
    return ctx, end_point_hash(der)


def end_point_hash(der: bytes) -> bytes:
    """tls-server-end-point channel binding data (RFC 5929): the certificate's hash.

    The hash is the certificate's signature hash, with MD5 and SHA-1 replaced by SHA-256.
    """
    cert = x509.load_der_x509_certificate(der)
    algorithm = cert.signature_hash_algorithm
    if algorithm is None or isinstance(algorithm, hashes.MD5 | hashes.SHA1):
        algorithm = hashes.SHA256()
    h = hashes.Hash(algorithm)
    h.update(der)
    return h.finalize()


@contextlib.contextmanager
def _pair_lock(cert_path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive ``flock`` of the certificate's directory while a pair is made: two
    processes making the pair at once would otherwise put one's key beside the other's
    certificate (released by the kernel if the process dies, and closed in a process forked
meanwhile)."""
    with exclusive(os.path.dirname(os.path.abspath(os.fspath(cert_path)))):
        yield


def self_signed(cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str],
                hostnames: list[str] | None = None, days: int = 365) -> str:
    """Write a self-signed P-256 certificate and its key (mode 0600); return its fingerprint.

    The certificate names ``localhost``, 127.0.0.1 and ::1 (and ``hostnames``). Each file
    is written whole to ``NAME.PID.tmp`` and synced, then the certificate in place is
    removed, the key renamed into place, and the certificate last: a process killed at
    any point leaves the certificate absent (:func:`ensure_self_signed` makes the pair
    again) or a certificate with its key, never one file half written or a certificate
    with another key. The temporaries a killed run left are deleted by the next run. Two
    processes making a pair in one directory take turns (a ``flock`` of the directory).
    """
    with _pair_lock(cert_path):
        return _make_pair(cert_path, key_path, hostnames, days)


def _make_pair(cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str],
               hostnames: list[str] | None, days: int) -> str:
    """:func:`self_signed`, its directory locked."""
    names = ["localhost", "127.0.0.1", "::1", *(hostnames or [])]
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cryptdisk serve")])
    alt: list[x509.GeneralName] = []
    for n in dict.fromkeys(names):
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cert_name, key_name = os.fspath(cert_path), os.fspath(key_path)
    _remove_stale_temps(cert_name)
    _remove_stale_temps(key_name)
    key_tmp = _write_temp(key_name, key_pem)
    try:
        cert_tmp = _write_temp(cert_name, cert.public_bytes(serialization.Encoding.PEM))
    except BaseException:
        os.unlink(key_tmp)
        raise
    # The certificate is the pair's last file: without it a start makes the pair again
    # (ensure_self_signed), so it goes first and comes back last, after its key.
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(cert_name)
        os.replace(key_tmp, key_name)
        os.replace(cert_tmp, cert_name)
    except BaseException:
        for tmp in (key_tmp, cert_tmp):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    for name in {os.path.dirname(os.path.abspath(n)) for n in (cert_name, key_name)}:
        fsync_path(name)
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


#: A temporary of :func:`self_signed`: ``NAME.PID.tmp``, its process's id in its name.
_TEMP = re.compile(r"\.([0-9]+)\.tmp")


def _write_temp(name: str, data: bytes) -> str:
    """``data`` in a new file ``NAME.PID.tmp`` (mode 0600), synced; returns its name."""
    tmp = f"{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def _remove_stale_temps(name: str) -> None:
    """Delete the ``NAME.PID.tmp`` files (a private key, or its certificate) that a
    :func:`self_signed` killed before it renamed them left, once their process is gone."""
    directory, base = os.path.split(os.path.abspath(name))
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for other in names:
        found = _TEMP.fullmatch(other[len(base):]) if other.startswith(base) else None
        if found is None:
            continue
        pid = int(found.group(1))
        if pid != os.getpid():
            try:
                os.kill(pid, 0)
                continue  # (alive: another start is making its pair)
            except ProcessLookupError:
                pass
            except OSError:
                continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, other))


def ensure_self_signed(cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str],
                       hostnames: list[str] | None = None) -> bool:
    """:func:`self_signed` unless both files are there (``cryptdisk serve --self-signed``);
    True if it made them."""
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return False
    with _pair_lock(cert_path):  # (another start may have made it meanwhile)
        if os.path.exists(cert_path) and os.path.exists(key_path):
            return False
        _make_pair(cert_path, key_path, hostnames, 365)
    return True

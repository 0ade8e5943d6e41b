"""Key servers on loopback for ``cryptdisk bench keys`` and the provider tests.

* KMIP: PyKMIP's server in a child process on ``127.0.0.1`` with mutual TLS
  (:func:`make_kmip_certs`, :func:`start_kmip`, :func:`stop_kmip`, or :func:`kmip_server`);
* AWS KMS: moto's server mode in a thread on ``127.0.0.1`` (:func:`moto_kms`).

Both are test doubles of the real services: nothing here is for production keys.
A missing server package raises :class:`ServerMissing` with the install hint.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ServerMissing", "free_port", "kmip_server", "make_kmip_certs", "moto_kms",
           "require", "start_kmip", "stop_kmip", "wait_accepting"]

#: The PyKMIP server, run with ``python -c``: argv DIR PORT; DIR holds ca.pem, server.pem,
#: server.key, and gets the server's SQLite database and log. Prints "listening" once bound.
_SERVE_KMIP = """\
import logging, sys, warnings
warnings.simplefilter("ignore")
from kmip.services.server import KmipServer
root, port = sys.argv[1], int(sys.argv[2])
server = KmipServer(hostname="127.0.0.1", port=port, certificate_path=f"{root}/server.pem",
                    key_path=f"{root}/server.key", ca_path=f"{root}/ca.pem",
                    auth_suite="TLS1.2", config_path=None, log_path=f"{root}/server.log",
                    policy_path=None, enable_tls_client_auth=True,
                    logging_level=logging.INFO, database_path=f"{root}/kmip.sqlite")
with server:
    print("listening", flush=True)
    server.serve()
"""

_PACKAGES = {"kmip": ("kmip", "pip install pykmip"),
             "aws-kms": ("moto.server", "pip install 'moto[server]' boto3")}


class ServerMissing(RuntimeError):
    """The package that runs a provider's server is not installed; ``hint`` installs it."""

    def __init__(self, provider: str, hint: str) -> None:
        super().__init__(f"the {provider} server's package is not installed: {hint}")
        self.provider = provider
        self.hint = hint


def require(provider: str) -> None:
    """Raise :class:`ServerMissing` unless ``provider``'s (``kmip``, ``aws-kms``) server and
    client packages import."""
    import importlib
    import warnings

    module, hint = _PACKAGES[provider]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
            if provider == "aws-kms":
                importlib.import_module("boto3")
    except ImportError as exc:
        raise ServerMissing(provider, hint) from exc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_kmip_certs(root: Path) -> None:
    """A test CA and its server (``127.0.0.1``) and client certificates in ``root``
    (``ca.pem``, ``server.pem``/``.key``, ``client.pem``/``.key``, all mode 0600), and the
    same set prefixed ``other-`` from a second CA the server does not trust."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def save(path: str, cert: x509.Certificate | None,
             key: ec.EllipticCurvePrivateKey | None) -> None:
        data = b""
        if cert is not None:
            data += cert.public_bytes(serialization.Encoding.PEM)
        if key is not None:
            data += key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.TraditionalOpenSSL,
                                      serialization.NoEncryption())
        (root / path).write_bytes(data)
        (root / path).chmod(0o600)

    def build(subject: str, issuer: x509.Name, public: Any, signer: Any, *, ca: bool = False,
              eku: Any = None) -> x509.Certificate:
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(issuer)
             .public_key(public).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if eku is not None:
            b = b.add_extension(x509.ExtendedKeyUsage([eku]), critical=False)
        if eku == ExtendedKeyUsageOID.SERVER_AUTH:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return b.sign(signer, hashes.SHA256())

    for prefix in ("", "other-"):  # other-: a CA the server does not trust
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = build(f"{prefix}test ca", name(f"{prefix}test ca"), ca_key.public_key(), ca_key,
                   ca=True)
        save(f"{prefix}ca.pem", ca, None)
        for role, eku in (("server", ExtendedKeyUsageOID.SERVER_AUTH),
                          ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
            key = ec.generate_private_key(ec.SECP256R1())
            save(f"{prefix}{role}.pem", build("cryptdisk" if role == "client" else "127.0.0.1",
                                               ca.subject, key.public_key(), ca_key, eku=eku),
                 None)
            save(f"{prefix}{role}.key", None, key)


def wait_accepting(port: int, seconds: float = 30) -> None:
    """Wait until 127.0.0.1:``port`` accepts a connection (PyKMIP's server binds before
    it prints "listening" but listens only in ``serve()``)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start_kmip(root: Path, port: int) -> subprocess.Popen[str]:
    """Start PyKMIP's server on 127.0.0.1:``port`` with the certificates in ``root`` (see
    :func:`make_kmip_certs`); returns once it accepts connections."""
    require("kmip")
    # its own process group: PyKMIP's server forks a process per connection, which
    # stop_kmip must kill with it
    proc = subprocess.Popen([sys.executable, "-c", _SERVE_KMIP, str(root), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "listening":
            raise RuntimeError(f"PyKMIP's server did not start (exit {proc.wait()})")
        wait_accepting(port)
    except BaseException:
        stop_kmip(proc)
        raise
    return proc


def stop_kmip(proc: subprocess.Popen[str]) -> None:
    """Kill a server :func:`start_kmip` started, with the processes it forked for its
    connections (its process group), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


@contextlib.contextmanager
def kmip_server(root: Path) -> Iterator[int]:
    """Certificates in ``root`` and PyKMIP's server on a free port: yields the port."""
    require("kmip")
    make_kmip_certs(root)
    port = free_port()
    proc = start_kmip(root, port)
    try:
        yield port
    finally:
        stop_kmip(proc)


@contextlib.contextmanager
def moto_kms() -> Iterator[str]:
    """moto's server (KMS among its services) on a free loopback port, in a thread of
    this process: yields its endpoint URL. Clients need AWS credentials in their
    environment (any values: moto accepts all)."""
    import logging

    require("aws-kms")
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request log on stderr
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()

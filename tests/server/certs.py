"""A test CA and a server certificate it signs (for sslmode=verify-full)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca_and_server(directory: Path) -> tuple[Path, Path, Path]:
    """Write ca.pem, server.pem, server.key; return their paths."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("cryptdisk test CA"))
          .issuer_name(_name("cryptdisk test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("localhost"))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    (directory / "ca.key").write_bytes(ca_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return paths


def make_client(directory: Path, name: str, ca_dir: Path) -> tuple[Path, Path]:
    """A client certificate with CN=name signed by the CA in ca_dir: (cert, key)."""
    ca = x509.load_pem_x509_certificate((ca_dir / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca_dir / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name(name)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .sign(ca_key, hashes.SHA256()))  # type: ignore[arg-type]
    paths = directory / f"{name}.pem", directory / f"{name}.key"
    paths[0].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[1].chmod(0o600)
    return paths


def der(pem: Path) -> bytes:
    return x509.load_pem_x509_certificate(pem.read_bytes()).public_bytes(
        serialization.Encoding.DER)


def sqlite_serve_config(root: Path, name: str, key_hex: str,
                        extra: str = "") -> tuple[Path, Path, Path]:
    """Certificates in ``root/tls`` and a config ``root/name`` for ``cryptdisk serve
    --sqlite``: one key (``key_hex``) and a [server] section with the certificate,
    scram_iterations = 4096 and the ``extra`` lines. Returns (ca, cert, config)."""
    (root / "tls").mkdir()
    ca, cert, key = make_ca_and_server(root / "tls")
    config = root / name
    config.write_text(f"""
[keyring]
current_key_id = 1
[[keyring.keys]]
id = 1
hex = "{key_hex}"
[server]
cert = "{cert}"
key = "{key}"
scram_iterations = 4096
{extra}""")
    return ca, cert, config

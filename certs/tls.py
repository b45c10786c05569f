"""Generate a CA and a serving certificate, ECDSA P-256, written as ``ca.crt``, ``tls.crt``, ``tls.key``.

The API server verifies a webhook's certificate against the ``caBundle`` of its configuration and
checks the Service DNS name against the certificate's SANs (it ignores the CN), so every name a
client may use must be a SAN; an IP address must be an IP SAN.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
LOCAL_HOSTS = ("localhost", "127.0.0.1")


@dataclass(frozen=True)
class CertificatePaths:
    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, directory: Path) -> CertificatePaths:
        return cls(directory / CA_FILE, directory / CERT_FILE, directory / KEY_FILE)

    def exist(self) -> bool:
        return self.cert.is_file() and self.key.is_file()


def service_hosts(service: str, namespace: str) -> list[str]:
    """The DNS names a Service is reached by from inside the cluster."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def generate(directory: Path, hosts: Iterable[str], days: int = 365, ca_days: int = 3650) -> CertificatePaths:
    """Write a fresh CA and a serving certificate for ``hosts`` into ``directory``."""
    hosts = list(dict.fromkeys(hosts))
    if not hosts:
        raise ValueError("at least one host name is needed for the certificate")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "oversale-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=ca_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    paths = CertificatePaths.in_dir(directory)
    _write(paths.ca, ca_cert.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(
        paths.key,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        0o600,
    )
    _write(paths.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return paths


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically (a server re-reading the files never sees half of one)."""
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)

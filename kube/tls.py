"""A CA and a serving certificate it signs, ECDSA P-256, with ``cryptography`` only.

The API server verifies a webhook's certificate against the ``caBundle`` of its configuration and
checks the Service DNS name against the certificate's SANs (it ignores the CN), so every name a
client may use must be a SAN; an IP address must be an IP SAN.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_KEY_FILE = "ca.key"
LOCAL_HOSTS = ("localhost", "127.0.0.1")
SERVING_DAYS = 365
CA_DAYS = 3650
RENEW_FRACTION = 1 / 3
"""Renew when less than this fraction of a certificate's lifetime is left."""


@dataclass(frozen=True)
class Bundle:
    """PEM bytes of a CA and the serving certificate it signed."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes


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

    def present(self) -> list[Path]:
        """Those of ``ca.crt``, ``tls.crt`` and ``tls.key`` that exist, in that order."""
        return [path for path in (self.ca, self.cert, self.key) if path.exists()]

    def partial(self) -> str | None:
        """What a directory holding only part of ``ca.crt``, ``tls.crt`` and ``tls.key`` lacks, or
        None when it holds all or none of them. Writing a fresh set over part of one would replace
        files someone put there (their certificate, or the CA their clients trust)."""
        present = self.present()
        missing = [path.name for path in (self.ca, self.cert, self.key) if path not in present]
        if not present or not missing:
            return None
        return f"holds {' and '.join(path.name for path in present)} but no {' or '.join(missing)}"


def serving_pair_problem(paths: CertificatePaths) -> str | None:
    """Why ``tls.crt`` and ``tls.key`` cannot serve TLS; None when they can. Asked once before
    serving: gunicorn loads the pair for every new connection, so a bad one would fail each
    handshake with a log line ("PEM lib") while the server looks up and its clients see only
    failed connections."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(paths.cert, paths.key)
        return None
    except (ssl.SSLError, OSError) as error:
        reason = str(error)
    try:
        x509.load_pem_x509_certificate(paths.cert.read_bytes())
    except (ValueError, OSError):
        return f"{paths.cert.name} is not a PEM certificate"
    try:
        serialization.load_pem_private_key(paths.key.read_bytes(), password=None)
    except (ValueError, TypeError, OSError):
        return f"{paths.key.name} is not a PEM private key without a password"
    if "MISMATCH" in reason.upper():
        return f"{paths.key.name} does not match {paths.cert.name}"
    return reason


def ca_problem(pem: bytes) -> str | None:
    """Why ``pem`` cannot verify certificates (None when it can). Asked before it is used: the
    extender's client CA is loaded on every connection (each client would be refused), and a
    webhook's ``caBundle`` that holds no certificate makes every API server call to it fail."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, ValueError):
        return "holds no PEM CA certificate"
    return None


_DNS_NAME = re.compile(r"(\*\.)?[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*",
                       re.IGNORECASE)
COMMON_NAME_MAX = 64
"""X.509's upper bound on a common name (RFC 5280, ub-common-name)."""


def check_hosts(hosts: Sequence[str], client: bool = False) -> None:
    """ValueError naming the first host a certificate cannot carry. A serving certificate's
    names are its SANs, which clients match against the address they dial, so each is an IP or a
    DNS name (a leading ``*.`` allowed) of at most 253 characters; a client certificate's first
    name is its identity (``kube-scheduler``), any text. Either way the first name is the common
    name, at most 64 characters."""
    if not hosts:
        raise ValueError("at least one host name is needed for the certificate")
    for host in hosts:
        if not host or host != host.strip():
            raise ValueError(f"host {host!r}: empty, or with spaces around it")
        if client:
            continue
        try:
            ipaddress.ip_address(host)
        except ValueError:
            if len(host) > 253 or not _DNS_NAME.fullmatch(host):
                raise ValueError(f"host {host!r} is neither an IP address nor a DNS name "
                                 "(letters, digits, '-' and dots, e.g. oversale-webhook.oversale.svc)") from None
    if len(hosts[0]) > COMMON_NAME_MAX:
        raise ValueError(f"host {hosts[0]!r}: the first name becomes the certificate's common name, at most "
                         f"{COMMON_NAME_MAX} characters; give a shorter one first")


_SERVICE_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
_NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def service_hosts(service: str, namespace: str) -> list[str]:
    """The DNS names a Service is reached by from inside the cluster. ValueError when the API
    server would refuse the Service's name (a DNS-1035 label) or the namespace's (a DNS-1123
    label): names such as ``Web`` or ``Prod`` would give SANs no Service can answer to."""
    if not _SERVICE_NAME.fullmatch(service):
        raise ValueError(f"Service name {service!r} is not one Kubernetes accepts: lowercase letters, digits and "
                         "'-', starting with a letter, at most 63 characters")
    if not _NAMESPACE_NAME.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} is not one Kubernetes accepts: lowercase letters, digits and "
                         "'-', at most 63 characters")
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def issue(hosts: Iterable[str], days: int = SERVING_DAYS, ca: Bundle | None = None, ca_days: int = CA_DAYS,
          client: bool = False) -> Bundle:
    """A serving certificate for ``hosts``, signed by ``ca`` (its cert and key) or by a new CA;
    with ``client``, a client certificate instead (its first name as the common name), as
    kube-scheduler presents to the extender."""
    names = list(dict.fromkeys(hosts))
    check_hosts(names, client)
    now = datetime.datetime.now(datetime.UTC)
    if ca is None:
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
            .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
    else:
        ca_cert = x509.load_pem_x509_certificate(ca.ca_cert)
        loaded = serialization.load_pem_private_key(ca.ca_key, password=None)
        if not isinstance(loaded, ec.EllipticCurvePrivateKey):
            raise ValueError("the CA key is not an ECDSA key")
        ca_key = loaded
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName([_san(h) for h in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                              else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Bundle(
        ca_cert=ca_cert.public_bytes(serialization.Encoding.PEM),
        ca_key=_private_pem(ca_key),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=_private_pem(key),
    )


def problems_with(
    bundle: Bundle, hosts: Sequence[str], renew_fraction: float = RENEW_FRACTION, now: datetime.datetime | None = None
) -> list[str]:
    """Why ``bundle`` should be replaced (empty when it is fine): unreadable, not signed by its CA,
    key not matching, names missing, expired or within the renewal window."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert)
        cas = x509.load_pem_x509_certificates(bundle.ca_cert)
        key = serialization.load_pem_private_key(bundle.key, password=None)
    except ValueError as error:
        return [f"unreadable: {error}"]
    problems = []
    if key.public_key().public_numbers() != cert.public_key().public_numbers():  # type: ignore[union-attr]
        problems.append("tls.key does not match tls.crt")
    if not any(_signed_by(cert, ca) for ca in cas):
        problems.append("tls.crt is not signed by ca.crt")
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        present = {_san_key(str(n)) for n in [*names.get_values_for_type(x509.DNSName),
                                               *names.get_values_for_type(x509.IPAddress)]}
    except x509.ExtensionNotFound:
        present = set()
    missing = [h for h in hosts if _san_key(h) not in present]
    if missing:
        problems.append(f"names missing: {', '.join(missing)}")
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    left = cert.not_valid_after_utc - now
    if left <= datetime.timedelta(0):
        problems.append("expired")
    elif left < lifetime * renew_fraction:
        problems.append(f"within the renewal window ({left.days} days left)")
    return problems


def ca_usable(bundle: Bundle, renew_fraction: float = RENEW_FRACTION) -> bool:
    """Whether the CA can sign a renewed serving certificate (readable key, well inside its life)."""
    try:
        ca = x509.load_pem_x509_certificates(bundle.ca_cert)[0]
        key = serialization.load_pem_private_key(bundle.ca_key, password=None)
    except (ValueError, IndexError):
        return False
    if key.public_key().public_numbers() != ca.public_key().public_numbers():  # type: ignore[union-attr]
        return False
    left = ca.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return left > (ca.not_valid_after_utc - ca.not_valid_before_utc) * renew_fraction


def unexpired_certificates(pem: bytes) -> bytes:
    """The certificates of a PEM bundle that have not expired yet (unreadable input: none)."""
    try:
        certificates = x509.load_pem_x509_certificates(pem)
    except ValueError:
        return b""
    now = datetime.datetime.now(datetime.UTC)
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates if c.not_valid_after_utc > now)


def expires_at(path: Path) -> float | None:
    """When the first certificate of a PEM file to expire does (Unix seconds), or None when the file
    holds none it can read: a chain stops verifying at its earliest expiry.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     paths = generate(Path(directory), ["localhost"], days=30)
    ...     left = expires_at(paths.cert) - datetime.datetime.now(datetime.UTC).timestamp()
    ...     (29 * 86400 < left <= 30 * 86400, expires_at(paths.key))
    (True, None)
    """
    try:
        certificates = x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError):
        return None
    return min(c.not_valid_after_utc for c in certificates).timestamp()


def generate(
    directory: Path, hosts: Iterable[str], days: int = SERVING_DAYS, ca_days: int = CA_DAYS
) -> CertificatePaths:
    """Write a fresh CA and a serving certificate for ``hosts`` into ``directory``."""
    bundle = issue(hosts, days=days, ca_days=ca_days)
    return write_bundle(directory, bundle)


def write_bundle(directory: Path, bundle: Bundle) -> CertificatePaths:
    """Write ``ca.crt``, ``tls.key`` (mode 0600) and ``tls.crt``. The CA key is not written: nothing
    served from a directory needs it."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = CertificatePaths.in_dir(directory)
    _write(paths.ca, bundle.ca_cert, 0o644)
    _write(paths.key, bundle.key, 0o600)
    _write(paths.cert, bundle.cert, 0o644)
    return paths


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _san_key(host: str) -> str:
    """A name as a client matches it against a SAN: an IP address however it is written (``::1``,
    ``0:0:0:0:0:0:0:1``), a DNS name in any case (RFC 6125). A name compared as written would be
    missing from a certificate that carries it, and the certificate replaced at every check."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically (a server re-reading the files never sees half of one)."""
    temporary = path.with_name(f".{path.name}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(temporary, mode)
    os.replace(temporary, path)

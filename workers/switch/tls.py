"""TLS for switches: keys and CSRs made on the switch, SSL contexts, peer and CRL checks.

Everything here runs on a cluster and needs only files: the switch's key and
certificate, the platform CA certificate and the CRL. The control plane's side
of the PKI (signing, revoking) is `app/pki/ca.py`.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

# TLS 1.2 suites allowed when 1.3 cannot be had: forward secret and AEAD only.
# TLS 1.3 suites are all AEAD, so OpenSSL's defaults stand there.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# A CRL stamped slightly in the future is tolerated: the clocks of two machines differ.
_CLOCK_SKEW = timedelta(minutes=5)
_CLUSTER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class PeerRejected(Exception):
    """The other end of a TLS connection is not who it must be (name, revocation)."""


def validate_cluster_name(name: str) -> str:
    """Return `name` if it is a lowercase DNS label, else raise ValueError."""
    if not isinstance(name, str) or not _CLUSTER_NAME.match(name):
        raise ValueError(f"invalid cluster name {name!r}: want a lowercase DNS label")
    return name


def make_switch_key_and_csr(cluster_name: str) -> tuple[bytes, bytes]:
    """Make a fresh P-256 key and a CSR for `cluster_name`; returns (key_pem, csr_pem)."""
    validate_cluster_name(cluster_name)
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cluster_name)]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(cluster_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem, csr.public_bytes(serialization.Encoding.PEM)


def write_private_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` with mode 0600, atomically (a temporary file then a rename).

    A missing folder is made with mode 0700.
    """
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)


@dataclass(frozen=True)
class PeerIdentity:
    """Who the other end proved to be: its cluster names (SAN DNS), serial and expiry."""

    names: frozenset[str]
    serial: int
    not_after: datetime


def identity_of(cert_der: bytes) -> PeerIdentity:
    """Cluster names, serial and expiry of a DER certificate."""
    cert = x509.load_der_x509_certificate(cert_der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        names = frozenset(san.value.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        names = frozenset()
    return PeerIdentity(names=names, serial=cert.serial_number, not_after=cert.not_valid_after_utc)


def check_peer(
    sock: ssl.SSLSocket, *, expected_cluster: str, revoked: frozenset[int]
) -> PeerIdentity:
    """Check a verified peer's certificate names `expected_cluster` and is not revoked."""
    der = sock.getpeercert(binary_form=True)
    if not der:
        raise PeerRejected("peer sent no certificate")
    identity = identity_of(der)
    if expected_cluster not in identity.names:
        raise PeerRejected(
            f"certificate names {sorted(identity.names)}, expected cluster {expected_cluster!r}"
        )
    if identity.serial in revoked:
        raise PeerRejected(f"certificate serial {identity.serial} is revoked")
    return identity


@dataclass(frozen=True)
class CrlInfo:
    """A verified CRL: what it revokes, its number (higher is newer) and when it goes stale."""

    revoked: frozenset[int]
    number: int
    next_update: datetime


def read_crl(crl_pem: bytes, ca_cert_pem: bytes, *, now: datetime | None = None) -> CrlInfo:
    """Verify a PEM CRL against the CA certificate and its validity window."""
    ca = x509.load_pem_x509_certificate(ca_cert_pem)
    crl = x509.load_pem_x509_crl(crl_pem)
    if crl.issuer != ca.subject:
        raise ValueError("CRL was issued by another CA")
    public_key = ca.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise ValueError("unsupported CA key type")
    if not crl.is_signature_valid(public_key):
        raise ValueError("CRL signature is invalid")
    moment = now or datetime.now(UTC)
    if crl.last_update_utc > moment + _CLOCK_SKEW:
        raise ValueError("CRL is from the future")
    next_update = crl.next_update_utc
    if next_update is None:
        raise ValueError("CRL has no nextUpdate")
    if next_update <= moment:
        raise ValueError(f"CRL is stale: its nextUpdate {next_update:%Y-%m-%d %H:%M:%S} passed")
    try:
        number = int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except x509.ExtensionNotFound:
        number = 0
    return CrlInfo(
        revoked=frozenset(entry.serial_number for entry in crl),
        number=number,
        next_update=next_update,
    )


def load_crl(crl_pem: bytes, ca_cert_pem: bytes, *, now: datetime | None = None) -> frozenset[int]:
    """Verify a PEM CRL against the CA certificate; return the revoked serials."""
    return read_crl(crl_pem, ca_cert_pem, now=now).revoked


def needs_renewal(cert_pem: bytes, now: datetime | None = None) -> bool:
    """True when less than a third of the certificate's validity is left."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    return cert.not_valid_after_utc - (now or datetime.now(UTC)) < lifetime / 3


def _harden(context: ssl.SSLContext) -> ssl.SSLContext:
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    return context


def server_context(
    *, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str], ca_path: str | None
) -> ssl.SSLContext:
    """Server context: TLS >= 1.2, AEAD only; with `ca_path`, a client certificate is required."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER))
    context.load_cert_chain(os.fspath(cert_path), os.fspath(key_path))
    if ca_path is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=os.fspath(ca_path))
    return context


def client_context(
    *,
    ca_path: str | os.PathLike[str],
    cert_path: str | os.PathLike[str] | None = None,
    key_path: str | os.PathLike[str] | None = None,
) -> ssl.SSLContext:
    """Client context: verifies the server against the CA; presents a certificate when given."""
    context = _harden(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
    # The expected cluster name is checked on the SAN by check_peer, not by hostname matching.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=os.fspath(ca_path))
    if cert_path is not None and key_path is not None:
        context.load_cert_chain(os.fspath(cert_path), os.fspath(key_path))
    return context

"""The certificate rules both sides of the PKI apply: cluster names, the switch's key and
CSR, CRL verification and when a certificate is due for renewal.

The control plane's CA (app.pki.ca) signs and revokes by them; a switch (workers.switch.tls)
makes its CSR and checks its peers by them. Files in, values out: no sockets, no database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

# A CRL stamped slightly in the future is tolerated: the clocks of two machines differ.
_CLOCK_SKEW = timedelta(minutes=5)
_CLUSTER_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


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

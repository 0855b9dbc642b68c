"""The platform certificate authority, as pure functions: no database, no HTTP.

The control plane keeps the CA key encrypted under the platform secret
(`encrypt_private_key` / `load_encrypted_private_key`), signs switch CSRs
(`sign_csr`), publishes revocations (`build_crl`) and signs job tokens
(`sign_job_token`). What both sides apply (`make_switch_key_and_csr`, CRL
loading, job-token verification) lives in the contract (`contract.certs`,
`contract.jobtoken`) so clusters need not import `app/`; it is re-exported here for
one import path on the control plane.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contract.certs import load_crl, make_switch_key_and_csr, validate_cluster_name
from contract.certs import needs_renewal as switch_needs_renewal
from contract.jobtoken import (
    JobClaims,
    JobTokenError,
    load_job_token_public_key,
    sign_job_token,
    verify_job_token,
)

__all__ = [
    "CertificateError",
    "JobClaims",
    "JobTokenError",
    "build_crl",
    "certificate_info",
    "certificate_pem",
    "create_root_ca",
    "encrypt_private_key",
    "job_token_public_key_pem",
    "load_certificate",
    "load_crl",
    "load_encrypted_private_key",
    "load_job_token_private_key",
    "load_job_token_public_key",
    "make_job_token_key",
    "make_switch_key_and_csr",
    "needs_renewal",
    "new_serial",
    "sign_csr",
    "sign_job_token",
    "verify_job_token",
]

CA_VALIDITY = timedelta(days=3650)
DEFAULT_CERT_DAYS = 30
# Certificates start slightly in the past so that a switch whose clock lags accepts them.
BACKDATE = timedelta(minutes=5)


class CertificateError(ValueError):
    """A CSR, key or certificate was refused (bad signature, wrong name, wrong type)."""


def _now(now: datetime | None) -> datetime:
    return (now or datetime.now(UTC)).astimezone(UTC)


def new_serial() -> int:
    """A random positive serial of 63 bits: unique in practice and fits a signed SQL BIGINT."""
    return secrets.randbits(63) | 1 << 62


_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


def _key_usage(*allowed: str) -> x509.KeyUsage:
    """The KeyUsage extension that allows the usages named and no other."""
    assert set(allowed) <= set(_KEY_USAGES)
    return x509.KeyUsage(**{usage: usage in allowed for usage in _KEY_USAGES})


def create_root_ca(
    common_name: str = "Nebula platform CA", *, now: datetime | None = None
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """Make the platform root CA: a P-384 key and a self-signed certificate valid ten years."""
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = _now(now) - BACKDATE
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(new_serial())
        .not_valid_before(start)
        .not_valid_after(start + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage("key_cert_sign", "crl_sign"), critical=True)
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def certificate_pem(cert: x509.Certificate) -> bytes:
    """PEM of a certificate."""
    return cert.public_bytes(serialization.Encoding.PEM)


def load_certificate(pem: bytes) -> x509.Certificate:
    """Parse a PEM certificate; raises CertificateError."""
    try:
        return x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise CertificateError("not a PEM certificate") from exc


def encrypt_private_key(
    key: ec.EllipticCurvePrivateKey | Ed25519PrivateKey, secret: bytes
) -> bytes:
    """PKCS#8 PEM of `key` encrypted under `secret` (the platform secret); safe to store."""
    if not secret:
        raise ValueError("an empty secret cannot protect a key")
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(secret),
    )


def load_encrypted_private_key(
    blob: bytes, secret: bytes
) -> ec.EllipticCurvePrivateKey | Ed25519PrivateKey:
    """Decrypt a key stored by `encrypt_private_key`; raises CertificateError on a wrong secret."""
    try:
        key = serialization.load_pem_private_key(blob, password=secret)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise CertificateError("cannot decrypt the private key (wrong secret?)") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | Ed25519PrivateKey):
        raise CertificateError("unsupported key type")
    return key


def sign_csr(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    csr_pem: bytes,
    *,
    cluster_name: str,
    serial: int | None = None,
    valid_days: float = DEFAULT_CERT_DAYS,
    now: datetime | None = None,
) -> bytes:
    """Sign a switch CSR for `cluster_name`; returns the certificate PEM.

    The CSR must carry a valid self-signature, name exactly `cluster_name` in
    its CN and in any SAN, and hold an EC key of at least 256 bits. The
    certificate is valid from `now` (default: the present) for `valid_days`,
    for TLS server and client authentication.
    """
    validate_cluster_name(cluster_name)
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise CertificateError("not a PEM certificate signing request") from exc
    if not csr.is_signature_valid:
        raise CertificateError("CSR signature is invalid")
    common_names = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    if common_names != [cluster_name]:
        raise CertificateError(f"CSR subject names {common_names}, expected [{cluster_name!r}]")
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        if list(san) != [x509.DNSName(cluster_name)]:
            raise CertificateError("CSR alternative names do not match the cluster name")
    except x509.ExtensionNotFound:
        pass
    public_key = csr.public_key()
    if not isinstance(public_key, ec.EllipticCurvePublicKey) or public_key.key_size < 256:
        raise CertificateError("switch keys must be EC keys of at least 256 bits")
    start = _now(now) - BACKDATE
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cluster_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(serial if serial is not None else new_serial())
        .not_valid_before(start)
        .not_valid_after(start + BACKDATE + timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage("digital_signature", "key_agreement"), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(cluster_name)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    return certificate_pem(cert)


def certificate_info(cert_pem: bytes) -> dict[str, object]:
    """Serial, cluster name, not_before and not_after of a certificate, for storing."""
    cert = load_certificate(cert_pem)
    names = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    return {
        "serial": cert.serial_number,
        "cluster_name": names[0] if names else None,
        "not_before": cert.not_valid_before_utc,
        "not_after": cert.not_valid_after_utc,
    }


def build_crl(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    revoked: Iterable[tuple[int, datetime]],
    *,
    next_update: datetime,
    now: datetime | None = None,
) -> bytes:
    """A signed PEM CRL listing `revoked` as (serial, revoked_at) pairs.

    Its CRL number is the issue time in milliseconds: it grows with every CRL the CA
    signs, with no counter to keep, so a switch can refuse an older CRL replayed to it.
    """
    moment = _now(now)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(moment)
        .next_update(next_update)
        .add_extension(x509.CRLNumber(int(moment.timestamp() * 1000)), critical=False)
    )
    for serial, revoked_at in revoked:
        entry = (
            x509.RevokedCertificateBuilder()
            .serial_number(serial)
            .revocation_date(revoked_at)
            .build()
        )
        builder = builder.add_revoked_certificate(entry)
    crl = builder.sign(ca_key, hashes.SHA384())
    return crl.public_bytes(serialization.Encoding.PEM)


def needs_renewal(cert: x509.Certificate | bytes, now: datetime | None = None) -> bool:
    """True when less than a third of the certificate's validity is left."""
    pem = cert if isinstance(cert, bytes) else certificate_pem(cert)
    return switch_needs_renewal(pem, _now(now))


def make_job_token_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 key for signing job tokens."""
    return Ed25519PrivateKey.generate()


def job_token_public_key_pem(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The PEM public key switches need to verify job tokens."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_job_token_private_key(blob: bytes, secret: bytes) -> Ed25519PrivateKey:
    """Decrypt the job-token signing key stored with `encrypt_private_key`."""
    key = load_encrypted_private_key(blob, secret)
    if not isinstance(key, Ed25519PrivateKey):
        raise CertificateError("job-token key is not Ed25519")
    return key

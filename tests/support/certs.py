"""A throwaway PKI for the cluster side's tests, made with `cryptography` and the contract alone.

The switch trusts a CA certificate, a CRL and a job-token public key, whoever made them; its
tests make their own here so that they import nothing of the control plane (`app.pki.ca`,
whose own tests check the platform CA, and tests/workers/switch/test_agent.py enrolls a
switch through it). The certificates carry what the platform CA's carry: a P-384 root
limited to signing certificates and CRLs, and leaves for TLS server and client
authentication naming their cluster in the CN and the SAN, backdated five minutes.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contract.certs import make_switch_key_and_csr
from contract.jobtoken import sign_job_token

# certificates start slightly in the past, as the platform CA's do (a lagging clock)
BACKDATE = timedelta(minutes=5)


def new_serial() -> int:
    """A random positive serial of 63 bits."""
    return secrets.randbits(63) | 1 << 62


def _usage(*allowed: str) -> x509.KeyUsage:
    names = (
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
    return x509.KeyUsage(**{name: name in allowed for name in names})


def pem(cert: x509.Certificate) -> bytes:
    """PEM of a certificate."""
    return cert.public_bytes(serialization.Encoding.PEM)


def serial_of(cert_pem: bytes) -> int:
    """The serial number of a PEM certificate."""
    return x509.load_pem_x509_certificate(cert_pem).serial_number


def root_ca(
    common_name: str, *, now: datetime | None = None
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A P-384 key and its self-signed CA certificate, valid ten years."""
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    start = (now or datetime.now(UTC)) - BACKDATE
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(new_serial())
        .not_valid_before(start)
        .not_valid_after(start + timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage("key_cert_sign", "crl_sign"), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA384())
    )
    return key, cert


def sign_csr(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    csr_pem: bytes,
    *,
    name: str,
    serial: int | None = None,
    now: datetime | None = None,
    days: float = 30,
) -> bytes:
    """The certificate PEM for the key of `csr_pem`, naming `name` (a cluster, or a host),
    valid from `now` for `days`. Nothing of the CSR is checked: the tests sign what they made."""
    public_key = x509.load_pem_x509_csr(csr_pem).public_key()
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    start = (now or datetime.now(UTC)) - BACKDATE
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(serial if serial is not None else new_serial())
        .not_valid_before(start)
        .not_valid_after(start + BACKDATE + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage("digital_signature", "key_agreement"), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA384())
    )
    return pem(cert)


@dataclass
class Pki:
    """A CA, its CRL file and a job-token key, in a folder."""

    root: Path
    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    token_key: Ed25519PrivateKey
    revoked: list[tuple[int, datetime]] = field(default_factory=list)

    @property
    def ca_path(self) -> Path:
        return self.root / "ca.pem"

    @property
    def crl_path(self) -> Path:
        return self.root / "crl.pem"

    @property
    def token_public_key_pem(self) -> bytes:
        """The public key a switch verifies job tokens with."""
        return self.token_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign_csr(self, csr_pem: bytes, cluster: str, **kw: object) -> bytes:
        """A certificate for `cluster` on the key of `csr_pem` (see `sign_csr`)."""
        return sign_csr(self.ca_key, self.ca_cert, csr_pem, name=cluster, **kw)  # type: ignore[arg-type]

    def issue(
        self,
        cluster: str,
        *,
        name: str | None = None,
        now: datetime | None = None,
        days: float = 30,
    ) -> tuple[Path, Path, int]:
        """Key and certificate files for `cluster`; returns (key_path, cert_path, serial)."""
        key_pem, csr = make_switch_key_and_csr(cluster)
        serial = new_serial()
        cert = self.sign_csr(csr, cluster, serial=serial, now=now, days=days)
        stem = self.root / f"{name or cluster}-{serial}"
        key_path, cert_path = stem.with_suffix(".key"), stem.with_suffix(".crt")
        key_path.write_bytes(key_pem)
        cert_path.write_bytes(cert)
        return key_path, cert_path, serial

    def crl(
        self,
        revoked: Iterable[tuple[int, datetime]],
        *,
        next_update: datetime,
        now: datetime | None = None,
    ) -> bytes:
        """A signed PEM CRL of (serial, revoked_at) pairs, numbered by its issue time in ms."""
        moment = now or datetime.now(UTC)
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.ca_cert.subject)
            .last_update(moment)
            .next_update(next_update)
            .add_extension(x509.CRLNumber(int(moment.timestamp() * 1000)), critical=False)
        )
        for serial, revoked_at in revoked:
            builder = builder.add_revoked_certificate(
                x509.RevokedCertificateBuilder()
                .serial_number(serial)
                .revocation_date(revoked_at)
                .build()
            )
        return builder.sign(self.ca_key, hashes.SHA384()).public_bytes(serialization.Encoding.PEM)

    def revoke(self, serial: int) -> None:
        """Add `serial` to the CRL file."""
        self.revoked.append((serial, datetime.now(UTC)))
        self.write_crl()

    def write_crl(self) -> None:
        self.crl_path.write_bytes(
            self.crl(self.revoked, next_update=datetime.now(UTC) + timedelta(days=1))
        )

    def token(self, job: str, role: str, cluster: str, *, ttl: float = 600, **kw: object) -> str:
        """A job token for `role` of `job` on `cluster`, valid `ttl` seconds."""
        return sign_job_token(
            self.token_key,
            job_id=job,
            role=role,
            cluster=cluster,
            expires_at=time.time() + ttl,
            **kw,  # type: ignore[arg-type]
        )


def make_pki(root: Path, name: str = "Test CA") -> Pki:
    """A fresh CA in `root`, with its certificate and an empty CRL written there."""
    key, cert = root_ca(name)
    pki = Pki(root=root, ca_key=key, ca_cert=cert, token_key=Ed25519PrivateKey.generate())
    root.mkdir(parents=True, exist_ok=True)
    pki.ca_path.write_bytes(pem(cert))
    pki.write_crl()
    return pki


def localhost_certificate(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """A CA of its own and a TLS certificate for `localhost` signed by it, written to
    `<name>-ca.pem`, `<name>.crt` and `<name>.key` in `folder`; returns those paths."""
    ca_key, ca_cert = root_ca(f"Test CA {name}")
    key_pem, csr = make_switch_key_and_csr("localhost")
    paths = folder / f"{name}-ca.pem", folder / f"{name}.crt", folder / f"{name}.key"
    paths[0].write_bytes(pem(ca_cert))
    paths[1].write_bytes(sign_csr(ca_key, ca_cert, csr, name="localhost"))
    paths[2].write_bytes(key_pem)
    return paths

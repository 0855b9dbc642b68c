"""The certificate manager: the platform CA's keys, issuing, renewing, revoking, the CRL."""

from __future__ import annotations

import base64
import hashlib
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.accounts import tokens
from app.audit import service as audit
from app.audit.service import Actor
from app.clusters.models import Certificate, Cluster, EnrollmentToken, PlatformKey
from app.db import utcnow
from app.errors import Conflict, Invalid, NotAuthenticated, NotFound
from app.keyring import Purpose, subkey
from app.pki import ca
from app.settings import Settings
from app.unit_of_work import commit_before_raising

ROOT_CA = "root_ca"
JOB_TOKEN_KEY = "job_token"
ENROLLMENT_PREFIX = "nbe_"
CRL_VALIDITY = timedelta(hours=1)


@dataclass(frozen=True)
class PlatformKeys:
    """The CA's key and certificate, and the job-token signing key, decrypted."""

    ca_key: ec.EllipticCurvePrivateKey
    ca_cert: x509.Certificate
    ca_pem: bytes
    job_key: Ed25519PrivateKey
    job_public_pem: bytes


_cache: dict[tuple[str, str], PlatformKeys] = {}
_cache_lock = threading.Lock()


# Each stored key is encrypted under a key derived for it alone (app/keyring.py): the
# CA's wrapping key cannot open the job-token key, and neither is the dataset master key.
WRAP_PURPOSE = {ROOT_CA: Purpose.ca_key_wrap, JOB_TOKEN_KEY: Purpose.job_token_key_wrap}


def _wrap_key(settings: Settings, name: str) -> bytes:
    return subkey(settings, WRAP_PURPOSE[name])


def _new_key_row(name: str, wrap: bytes) -> PlatformKey:
    if name == ROOT_CA:
        key, cert = ca.create_root_ca("Nebula platform root CA")
        return PlatformKey(
            name=name,
            encrypted_key=ca.encrypt_private_key(key, wrap),
            certificate_pem=ca.certificate_pem(cert).decode(),
        )
    return PlatformKey(
        name=name, encrypted_key=ca.encrypt_private_key(ca.make_job_token_key(), wrap)
    )


def _rewrap_legacy(db: Session, row: PlatformKey, settings: Settings) -> None:
    """A key stored under the platform secret itself (before keys were derived apart) is
    encrypted again under its own derived key."""
    wrap = _wrap_key(settings, row.name)
    try:
        ca.load_encrypted_private_key(row.encrypted_key, wrap)
        return
    except ca.CertificateError:
        key = ca.load_encrypted_private_key(row.encrypted_key, settings.secret())
    row.encrypted_key = ca.encrypt_private_key(key, wrap)
    audit.record(
        db, actor=audit.SYSTEM, action="pki.key.rewrap", subject_type="key", subject_id=row.name
    )


def ensure_platform_keys(factory: sessionmaker[Session], settings: Settings) -> None:
    """Make the CA and job-token keys if they do not exist yet (at start-up, in a session of
    its own: a key must be durable before anything is signed with it)."""
    for name in (ROOT_CA, JOB_TOKEN_KEY):
        with factory() as db:
            existing = db.get(PlatformKey, name)
            if existing is not None:
                _rewrap_legacy(db, existing, settings)
                db.commit()
                continue
            db.add(_new_key_row(name, _wrap_key(settings, name)))
            try:
                db.flush()
            except IntegrityError:  # another process made it first: keep theirs
                db.rollback()
                continue
            audit.record(
                db,
                actor=audit.SYSTEM,
                action="pki.key.create",
                subject_type="key",
                subject_id=name,
            )
            db.commit()


def platform_keys(db: Session, settings: Settings) -> PlatformKeys:
    """The platform's keys, decrypted once per process (made at start-up)."""
    secret = settings.secret()
    cache_key = (settings.resolved_database_url, hashlib.sha256(secret).hexdigest())
    with _cache_lock:
        cached = _cache.get(cache_key)
    if cached is not None:
        return cached
    ca_row, job_row = db.get(PlatformKey, ROOT_CA), db.get(PlatformKey, JOB_TOKEN_KEY)
    if ca_row is None or job_row is None:
        raise RuntimeError("the platform keys are missing; the app makes them at start-up")
    ca_key = ca.load_encrypted_private_key(ca_row.encrypted_key, _wrap_key(settings, ROOT_CA))
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey) and ca_row.certificate_pem
    job_key = ca.load_job_token_private_key(
        job_row.encrypted_key, _wrap_key(settings, JOB_TOKEN_KEY)
    )
    keys = PlatformKeys(
        ca_key=ca_key,
        ca_cert=ca.load_certificate(ca_row.certificate_pem.encode()),
        ca_pem=ca_row.certificate_pem.encode(),
        job_key=job_key,
        job_public_pem=ca.job_token_public_key_pem(job_key),
    )
    with _cache_lock:
        _cache[cache_key] = keys
    return keys


def _sign(
    db: Session,
    *,
    actor: Actor,
    action: str,
    keys: PlatformKeys,
    cluster: Cluster,
    csr_pem: str,
    valid_days: float = ca.DEFAULT_CERT_DAYS,
    renewed_from: str | None = None,
) -> Certificate:
    """Sign a CSR for the cluster's switch; the certificate is stored and audited as `action`."""
    try:
        pem = ca.sign_csr(
            keys.ca_key,
            keys.ca_cert,
            csr_pem.encode(),
            cluster_name=cluster.name,
            valid_days=valid_days,
        )
    except (ca.CertificateError, ValueError) as exc:
        raise Invalid(f"CSR refused: {exc}") from None
    info = ca.certificate_info(pem)
    certificate = Certificate(
        serial=str(info["serial"]),
        cluster_id=cluster.id,
        certificate_pem=pem.decode(),
        not_before=info["not_before"],
        not_after=info["not_after"],
        renewed_from=renewed_from,
    )
    db.add(certificate)
    db.flush()
    details = {"cluster": cluster.name}
    if renewed_from is not None:
        details["previous_serial"] = renewed_from
    _record_certificate(db, actor=actor, action=action, certificate=certificate, details=details)
    return certificate


def _record_certificate(
    db: Session, *, actor: Actor, action: str, certificate: Certificate, details: dict[str, str]
) -> None:
    # a certificate is known by its serial, in the trail as on the CRL
    audit.record(
        db,
        actor=actor,
        action=action,
        subject_type="certificate",
        subject_id=certificate.serial,
        details=details,
    )


def issue(
    db: Session,
    *,
    actor: Actor,
    cluster: Cluster,
    csr_pem: str,
    settings: Settings,
    valid_days: float = ca.DEFAULT_CERT_DAYS,
) -> Certificate:
    """Sign a cluster switch's CSR (the private key never comes here)."""
    return _sign(
        db,
        actor=actor,
        action="pki.certificate.issue",
        keys=platform_keys(db, settings),
        cluster=cluster,
        csr_pem=csr_pem,
        valid_days=valid_days,
    )


def create_enrollment_token(
    db: Session, *, actor: Actor, cluster: Cluster, ttl: timedelta
) -> tuple[EnrollmentToken, str]:
    """A single-use secret for enrolling the cluster's switch; shown once."""
    secret = tokens.new_secret(ENROLLMENT_PREFIX)
    row = EnrollmentToken(
        cluster_id=cluster.id, token_hash=tokens.token_hash(secret), expires_at=utcnow() + ttl
    )
    db.add(row)
    db.flush()
    audit.record(db, actor=actor, action="pki.enrollment_token.create", subject=cluster)
    return row, secret


def _refuse_enrollment(db: Session, *, ip: str | None, token_id: str | None) -> NoReturn:
    db.rollback()
    audit.record(
        db,
        actor=Actor(None, ip),
        action="pki.enroll",
        subject_type="enrollment_token",
        subject_id=token_id,
        outcome="failure",
    )
    commit_before_raising(db)
    raise NotAuthenticated("invalid, used or expired enrollment token")


def enroll(
    db: Session, *, token: str, csr_pem: str, ip: str | None, settings: Settings
) -> tuple[Cluster, Certificate]:
    """Exchange an enrollment token (once) and a CSR for the switch's first certificate."""
    row = db.scalar(
        select(EnrollmentToken).where(EnrollmentToken.token_hash == tokens.token_hash(token))
    )
    if row is None or row.used_at is not None or row.expires_at <= utcnow():
        _refuse_enrollment(db, ip=ip, token_id=row.id if row else None)
    cluster = db.get(Cluster, row.cluster_id)
    if cluster is None:
        raise NotFound()
    # single use even when two enrollments race: only one UPDATE finds it still unused
    claimed = db.execute(
        update(EnrollmentToken)
        .where(EnrollmentToken.id == row.id, EnrollmentToken.used_at.is_(None))
        .values(used_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        _refuse_enrollment(db, ip=ip, token_id=row.id)
    certificate = _sign(
        db,
        actor=Actor(None, ip),
        action="pki.enroll",
        keys=platform_keys(db, settings),
        cluster=cluster,
        csr_pem=csr_pem,
    )
    return cluster, certificate


def renew(
    db: Session,
    *,
    certificate_pem: str,
    csr_pem: str,
    signature_b64: str,
    ip: str | None,
    settings: Settings,
) -> Certificate:
    """A new certificate for a switch that proves it holds a live certificate's key.

    The proof is an ECDSA-SHA256 signature of the CSR's bytes by the current key.
    """
    keys = platform_keys(db, settings)
    try:
        current = x509.load_pem_x509_certificate(certificate_pem.encode())
        current.verify_directly_issued_by(keys.ca_cert)
        public_key = current.public_key()
        assert isinstance(public_key, ec.EllipticCurvePublicKey)
        public_key.verify(
            base64.b64decode(signature_b64, validate=True),
            csr_pem.encode(),
            ec.ECDSA(hashes.SHA256()),
        )
    except (ValueError, TypeError, AssertionError, InvalidSignature):
        raise NotAuthenticated("renewal proof refused") from None
    # locked: a revocation running now either sees this renewal or refuses it
    stored = db.get(Certificate, str(current.serial_number), with_for_update=True)
    if stored is None or stored.revoked_at is not None or stored.not_after <= utcnow():
        raise NotAuthenticated("renewal proof refused")
    cluster = db.get(Cluster, stored.cluster_id)
    if cluster is None:
        raise NotAuthenticated("renewal proof refused")
    return _sign(
        db,
        actor=Actor(None, ip),
        action="pki.certificate.renew",
        keys=keys,
        cluster=cluster,
        csr_pem=csr_pem,
        renewed_from=stored.serial,
    )


def revoke(db: Session, *, actor: Actor, serial: str, reason: str) -> Certificate:
    """Put a certificate on the CRL, and every certificate renewed from it.

    Whoever holds a revoked certificate's key could have renewed it first: the renewals
    are revoked with it, down the chain.
    """
    certificate = db.get(Certificate, serial, with_for_update=True)
    if certificate is None:
        raise NotFound()
    if certificate.revoked_at is not None:
        raise Conflict("the certificate is already revoked")
    _revoke_one(db, actor=actor, certificate=certificate, reason=reason, renewed_from=None)
    frontier = [certificate.serial]
    while frontier:
        renewals = db.scalars(
            select(Certificate)
            .where(Certificate.renewed_from.in_(frontier), Certificate.revoked_at.is_(None))
            .with_for_update()
        ).all()
        for renewal in renewals:
            _revoke_one(
                db,
                actor=actor,
                certificate=renewal,
                reason=f"renewed from revoked certificate {renewal.renewed_from}",
                renewed_from=renewal.renewed_from,
            )
        frontier = [r.serial for r in renewals]
    return certificate


def _revoke_one(
    db: Session, *, actor: Actor, certificate: Certificate, reason: str, renewed_from: str | None
) -> None:
    certificate.revoked_at = utcnow()
    certificate.revocation_reason = reason[:200]
    details = (
        {"reason": reason}
        if renewed_from is None
        else {"reason": reason, "renewed_from": renewed_from}
    )
    _record_certificate(
        db, actor=actor, action="pki.certificate.revoke", certificate=certificate, details=details
    )
    db.flush()


def crl_pem(db: Session, settings: Settings) -> bytes:
    """The current CRL, signed by the CA."""
    keys = platform_keys(db, settings)
    revoked = db.execute(
        select(Certificate.serial, Certificate.revoked_at).where(
            Certificate.revoked_at.is_not(None)
        )
    ).all()
    return ca.build_crl(
        keys.ca_key,
        keys.ca_cert,
        [(int(s), at) for s, at in revoked if at is not None],
        next_update=utcnow() + CRL_VALIDITY,
    )


def job_token(
    db: Session,
    *,
    settings: Settings,
    job_id: str,
    role: str,
    cluster: str,
    placement: dict[str, str],
    ttl: timedelta,
) -> str:
    """A token that lets one role of one job use its cluster's switch until it expires."""
    keys = platform_keys(db, settings)
    return ca.sign_job_token(
        keys.job_key,
        job_id=job_id,
        role=role,
        cluster=cluster,
        expires_at=(utcnow() + ttl).timestamp(),
        placement=placement,
    )


def has_valid_certificate(db: Session, *, cluster_id: str) -> bool:
    """Whether the cluster's switch holds a certificate that is neither expired nor revoked."""
    now = utcnow()
    count = db.scalar(
        select(func.count())
        .select_from(Certificate)
        .where(
            Certificate.cluster_id == cluster_id,
            Certificate.revoked_at.is_(None),
            Certificate.not_after > now,
        )
    )
    return bool(count)

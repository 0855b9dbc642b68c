"""HTTP routes of clusters, certificates and the PKI."""

from __future__ import annotations

from datetime import timedelta

from fastapi import Request, status
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts.models import Identity, Role, User
from app.clusters import service
from app.clusters.bundle import provision_broker_user
from app.clusters.models import Certificate, Cluster, ClusterPresence
from app.clusters.schemas import (
    CertificateList,
    CertificateOut,
    ClusterCreateIn,
    ClusterList,
    ClusterOut,
    ClusterSlotsIn,
    CsrIn,
    DeviceOut,
    EnrollIn,
    EnrollmentTokenIn,
    EnrollmentTokenOut,
    IssuedOut,
    PresenceList,
    PresenceOut,
    RenewIn,
    RevokeIn,
    TenantSlotsOut,
    WorkerCredentialIssued,
    WorkerCredentialList,
    WorkerCredentialOut,
    WorkerDevicesOut,
)
from app.deps import AdminDep, CallerDep, PageDep, SessionDep, SettingsDep, client_ip
from app.errors import Conflict, Invalid, NotAuthenticated, NotFound, raises
from app.jobs import dispatch
from app.openapi.marks import PemResponse
from app.path_params import ClusterIdPath, CredentialIdPath, SerialPath
from app.pki import service as pki
from app.routing import api_router
from app.settings import Settings

router = api_router("clusters")


def _slots_by_tenant(
    db: Session, use: service.SlotUse, viewer: Identity | None
) -> list[TenantSlotsOut]:
    """Admins see whose jobs hold the slots; anyone else their own and the rest together."""
    if viewer is not None and viewer.role == Role.admin:
        emails = dict(
            db.execute(select(User.id, User.email).where(User.id.in_(use.by_tenant))).all()
        )
        return [
            TenantSlotsOut(tenant=emails.get(owner, owner), slots=n, you=owner == viewer.id)
            for owner, n in sorted(use.by_tenant.items(), key=lambda kv: -kv[1])
        ]
    mine = use.by_tenant.get(viewer.id, 0) if viewer is not None else 0
    rows = [TenantSlotsOut(tenant="you", slots=mine, you=True)] if mine else []
    if use.in_use - mine:
        rows.append(TenantSlotsOut(tenant="other tenants", slots=use.in_use - mine))
    return rows


def _out(
    db: Session, cluster: Cluster, settings: Settings, viewer: Identity | None = None
) -> ClusterOut:
    health = service.health(db, cluster=cluster, timeout=_presence_timeout(settings))
    use = service.slot_use(db, cluster=cluster)
    slots = cluster.role_slots
    return ClusterOut.model_validate(cluster).model_copy(
        update={
            "has_valid_certificate": pki.has_valid_certificate(db, cluster_id=cluster.id),
            "switch_online": health.switch_online,
            "workers_online": health.workers_online,
            "running_jobs": health.running_jobs,
            "worker_devices": [
                WorkerDevicesOut(device=DeviceOut(**d.device.model_dump()), workers=d.workers)
                for d in health.worker_devices
            ],
            "role_slots": slots if slots is not None else settings.default_cluster_role_slots,
            "slots_in_use": use.in_use,
            "slots_by_tenant": _slots_by_tenant(db, use, viewer),
            "queued_jobs": use.queued_jobs,
        }
    )


def _device_out(presence: ClusterPresence) -> DeviceOut | None:
    device = service.presence_device(presence)
    return DeviceOut(**device.model_dump()) if device is not None else None


def _presence_timeout(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.presence_timeout_s)


def _issued(db: Session, settings: Settings, certificate: Certificate) -> IssuedOut:
    return IssuedOut(
        serial=certificate.serial,
        certificate_pem=certificate.certificate_pem,
        not_after=certificate.not_after,
        ca_pem=pki.platform_keys(db, settings).ca_pem.decode(),
        job_token_public_key_pem=pki.platform_keys(db, settings).job_public_pem.decode(),
    )


@router.post("/clusters", response_model=ClusterOut, status_code=status.HTTP_201_CREATED)
@raises(Conflict)
def create_cluster(
    body: ClusterCreateIn, caller: AdminDep, db: SessionDep, settings: SettingsDep
) -> ClusterOut:
    """Register a cluster by its switch address (and, on RabbitMQ, give it its broker user).

    Where the broker user cannot be made, the cluster is still registered and the answer
    says so: `broker_user` is "missing" and `broker_problem` names the reason and the fix
    (also in the audit log and in GET /clusters)."""
    cluster = service.create(
        db,
        actor=caller.actor,
        name=body.name,
        switch_host=body.switch_host,
        switch_port=body.switch_port,
    )
    db.commit()
    provision_broker_user(db, settings, actor=caller.actor, cluster=cluster)
    db.commit()
    return _out(db, cluster, settings)


@router.get("/clusters", response_model=ClusterList)
def list_clusters(
    caller: CallerDep, db: SessionDep, page: PageDep, settings: SettingsDep
) -> ClusterList:
    """Every cluster with its health (any signed-in user may place jobs on them)."""
    items, total = service.list_all(db, page=page)
    return ClusterList(items=[_out(db, c, settings, caller.identity) for c in items], total=total)


@router.get("/clusters/{cluster_id}", response_model=ClusterOut)
def get_cluster(
    cluster_id: ClusterIdPath, caller: CallerDep, db: SessionDep, settings: SettingsDep
) -> ClusterOut:
    """One cluster with its health."""
    return _out(db, service.get(db, cluster_id=cluster_id), settings, caller.identity)


@router.patch("/clusters/{cluster_id}/slots", response_model=ClusterOut)
def set_cluster_slots(
    cluster_id: ClusterIdPath,
    body: ClusterSlotsIn,
    caller: AdminDep,
    db: SessionDep,
    settings: SettingsDep,
) -> ClusterOut:
    """How many roles may run on the cluster at once (admins): fair share divides them."""
    cluster = service.get(db, cluster_id=cluster_id)
    service.set_role_slots(db, actor=caller.actor, cluster=cluster, role_slots=body.role_slots)
    db.commit()
    dispatch.schedule_and_dispatch(db, settings=settings)  # more slots may start queued jobs
    return _out(db, cluster, settings, caller.identity)


@router.get("/clusters/{cluster_id}/presence", response_model=PresenceList)
def list_presence(
    cluster_id: ClusterIdPath, caller: AdminDep, db: SessionDep, settings: SettingsDep
) -> PresenceList:
    """The cluster's switch and worker processes online now, with the roles each runs."""
    cluster = service.get(db, cluster_id=cluster_id)
    rows = service.presences(db, cluster=cluster, timeout=_presence_timeout(settings))
    items = [
        PresenceOut.model_validate(p).model_copy(
            update={"running_roles": roles, "device": _device_out(p)}
        )
        for p, roles in rows
    ]
    return PresenceList(items=items, total=len(items))


@router.delete("/clusters/{cluster_id}", status_code=status.HTTP_204_NO_CONTENT)
@raises(Conflict)
def delete_cluster(cluster_id: ClusterIdPath, caller: AdminDep, db: SessionDep) -> None:
    """Remove a cluster that never had a certificate."""
    service.delete(db, actor=caller.actor, cluster=service.get(db, cluster_id=cluster_id))
    db.commit()


@router.post(
    "/clusters/{cluster_id}/csr", response_model=IssuedOut, status_code=status.HTTP_201_CREATED
)
@raises(Invalid)
def sign_csr(
    cluster_id: ClusterIdPath, body: CsrIn, caller: AdminDep, db: SessionDep, settings: SettingsDep
) -> IssuedOut:
    """The CA signs the cluster switch's CSR; the private key stays on the switch."""
    cluster = service.get(db, cluster_id=cluster_id)
    certificate = pki.issue(
        db, actor=caller.actor, cluster=cluster, csr_pem=body.csr_pem, settings=settings
    )
    db.commit()
    return _issued(db, settings, certificate)


@router.get("/clusters/{cluster_id}/certificates", response_model=CertificateList)
def list_certificates(
    cluster_id: ClusterIdPath, caller: AdminDep, db: SessionDep, page: PageDep
) -> CertificateList:
    """Certificates issued to the cluster's switch."""
    items, total = service.certificates(db, cluster_id=cluster_id, page=page)
    return CertificateList(items=[CertificateOut.model_validate(c) for c in items], total=total)


@router.post(
    "/clusters/{cluster_id}/enrollment-tokens",
    response_model=EnrollmentTokenOut,
    status_code=status.HTTP_201_CREATED,
)
def create_enrollment_token(
    cluster_id: ClusterIdPath,
    caller: AdminDep,
    db: SessionDep,
    body: EnrollmentTokenIn | None = None,
) -> EnrollmentTokenOut:
    """A single-use, expiring token for `nebula switch --enroll-token`; shown once."""
    body = body or EnrollmentTokenIn()
    cluster = service.get(db, cluster_id=cluster_id)
    row, secret = pki.create_enrollment_token(
        db, actor=caller.actor, cluster=cluster, ttl=timedelta(minutes=body.expires_in_minutes)
    )
    db.commit()
    return EnrollmentTokenOut(token=secret, expires_at=row.expires_at, cluster_id=cluster.id)


@router.post(
    "/clusters/{cluster_id}/worker-credentials",
    response_model=WorkerCredentialIssued,
    status_code=status.HTTP_201_CREATED,
)
def create_worker_credential(
    cluster_id: ClusterIdPath, caller: AdminDep, db: SessionDep
) -> WorkerCredentialIssued:
    """A credential for the cluster's workers (`nebula worker --credential-file`); shown once."""
    cluster = service.get(db, cluster_id=cluster_id)
    row, secret = service.create_worker_credential(db, actor=caller.actor, cluster=cluster)
    db.commit()
    return WorkerCredentialIssued(
        **WorkerCredentialOut.model_validate(row).model_dump(), token=secret
    )


@router.get("/clusters/{cluster_id}/worker-credentials", response_model=WorkerCredentialList)
def list_worker_credentials(
    cluster_id: ClusterIdPath, caller: AdminDep, db: SessionDep, page: PageDep
) -> WorkerCredentialList:
    """The cluster's worker credentials, without their secrets."""
    items, total = service.worker_credentials(db, cluster_id=cluster_id, page=page)
    return WorkerCredentialList(
        items=[WorkerCredentialOut.model_validate(c) for c in items], total=total
    )


@router.delete(
    "/clusters/{cluster_id}/worker-credentials/{credential_id}",
    status_code=status.HTTP_204_NO_CONTENT,
)
@raises(Conflict)
def revoke_worker_credential(
    cluster_id: ClusterIdPath, credential_id: CredentialIdPath, caller: AdminDep, db: SessionDep
) -> None:
    """Revoke a worker credential: the cluster's workers using it stop at their next call."""
    cluster = service.get(db, cluster_id=cluster_id)
    service.revoke_worker_credential(
        db, actor=caller.actor, cluster=cluster, credential_id=credential_id
    )
    db.commit()


@router.post("/certificates/{serial}/revoke", response_model=CertificateOut)
@raises(Conflict)
def revoke_certificate(
    serial: SerialPath, body: RevokeIn, caller: AdminDep, db: SessionDep
) -> CertificateOut:
    """Put the certificate on the CRL; switches refuse it from their next refresh."""
    certificate = pki.revoke(db, actor=caller.actor, serial=serial, reason=body.reason)
    db.commit()
    return CertificateOut.model_validate(certificate)


@router.post("/pki/enroll", response_model=IssuedOut, status_code=status.HTTP_201_CREATED)
@raises(NotAuthenticated, NotFound, Invalid)
def enroll(body: EnrollIn, request: Request, db: SessionDep, settings: SettingsDep) -> IssuedOut:
    """A new switch trades its enrollment token (once) and CSR for its certificate."""
    _cluster, certificate = pki.enroll(
        db, token=body.token, csr_pem=body.csr_pem, ip=client_ip(request), settings=settings
    )
    db.commit()
    return _issued(db, settings, certificate)


@router.post("/pki/renew", response_model=IssuedOut, status_code=status.HTTP_201_CREATED)
@raises(NotAuthenticated, Invalid)
def renew(body: RenewIn, request: Request, db: SessionDep, settings: SettingsDep) -> IssuedOut:
    """A switch proves it holds a live certificate's key and gets a fresh certificate."""
    certificate = pki.renew(
        db,
        certificate_pem=body.certificate_pem,
        csr_pem=body.csr_pem,
        signature_b64=body.signature,
        ip=client_ip(request),
        settings=settings,
    )
    db.commit()
    return _issued(db, settings, certificate)


@router.get("/pki/ca.pem", response_class=PemResponse)
def ca_pem(db: SessionDep, settings: SettingsDep) -> PemResponse:
    """The platform root CA certificate."""
    return PemResponse(pki.platform_keys(db, settings).ca_pem)


@router.get("/pki/crl.pem", response_class=PemResponse)
def crl_pem(db: SessionDep, settings: SettingsDep) -> PemResponse:
    """The current certificate revocation list, signed by the CA."""
    return PemResponse(pki.crl_pem(db, settings))


@router.get("/pki/job-token-key.pem", response_class=PemResponse)
def job_token_key(db: SessionDep, settings: SettingsDep) -> PemResponse:
    """The public key switches use to verify job tokens."""
    return PemResponse(pki.platform_keys(db, settings).job_public_pem)

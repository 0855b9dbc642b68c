"""The cluster registry."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import bindparam, func, select
from sqlalchemy import delete as sql_delete
from sqlalchemy.orm import Session

from app.accounts import tokens
from app.audit import service as audit
from app.audit.service import Actor
from app.clusters.models import (
    Certificate,
    Cluster,
    ClusterPresence,
    EnrollmentToken,
    WorkerCredential,
)
from app.db import NewestFirst, Page, utcnow
from app.errors import Conflict, Invalid, NotFound
from app.jobs.models import Job, JobRole
from app.jobs.states import FINAL_STATUSES, RoleStatus
from app.settings import Settings
from contract.devices import DeviceInfo


def create(db: Session, *, actor: Actor, name: str, switch_host: str, switch_port: int) -> Cluster:
    """Register a cluster by the address of its switch."""
    if db.scalar(select(Cluster.id).where(Cluster.name == name)) is not None:
        raise Conflict("a cluster with this name already exists")
    return audit.record_creation(
        db,
        Cluster(name=name, switch_host=switch_host, switch_port=switch_port),
        actor=actor,
        action="cluster.create",
        details={"name": name, "switch": f"{switch_host}:{switch_port}"},
    )


def get(db: Session, *, cluster_id: str) -> Cluster:
    """A cluster by id."""
    cluster = db.get(Cluster, cluster_id)
    if cluster is None:
        raise NotFound()
    return cluster


def by_name(db: Session, *, name: str) -> Cluster | None:
    """A cluster by name, if registered."""
    return db.scalar(select(Cluster).where(Cluster.name == name))


def list_all(db: Session, *, page: Page) -> tuple[list[Cluster], int]:
    """Every cluster, newest first."""
    return _CLUSTERS(db, page=page)


def delete(db: Session, *, actor: Actor, cluster: Cluster) -> None:
    """Remove a cluster that has no certificates (revoke them and keep the record otherwise)."""
    if db.scalar(
        select(func.count()).select_from(Certificate).where(Certificate.cluster_id == cluster.id)
    ):
        raise Conflict("the cluster has issued certificates; revoke them instead of deleting")
    db.execute(sql_delete(EnrollmentToken).where(EnrollmentToken.cluster_id == cluster.id))
    db.execute(sql_delete(WorkerCredential).where(WorkerCredential.cluster_id == cluster.id))
    db.delete(cluster)
    audit.record(
        db, actor=actor, action="cluster.delete", subject=cluster, details={"name": cluster.name}
    )


_CLUSTERS = NewestFirst(Cluster)
_CERTIFICATES = NewestFirst(Certificate, Certificate.cluster_id == bindparam("cluster_id"))
_CREDENTIALS = NewestFirst(WorkerCredential, WorkerCredential.cluster_id == bindparam("cluster_id"))


def certificates(db: Session, *, cluster_id: str, page: Page) -> tuple[list[Certificate], int]:
    """Certificates of one cluster, newest first; NotFound for no such cluster."""
    get(db, cluster_id=cluster_id)
    return _CERTIFICATES(db, cluster_id=cluster_id, page=page)


WORKER_CREDENTIAL_PREFIX = "nbw_"


def create_worker_credential(
    db: Session, *, actor: Actor, cluster: Cluster
) -> tuple[WorkerCredential, str]:
    """A credential for the cluster's workers to call the cluster API; the secret shown once."""
    secret = tokens.new_secret(WORKER_CREDENTIAL_PREFIX)
    row = WorkerCredential(cluster_id=cluster.id, token_hash=tokens.token_hash(secret))
    db.add(row)
    db.flush()
    _record_credential(
        db, actor=actor, action="cluster.worker_credential.create", cluster=cluster, row=row
    )
    return row, secret


def _record_credential(
    db: Session, *, actor: Actor, action: str, cluster: Cluster, row: WorkerCredential
) -> None:
    # about the cluster, whose trail an auditor reads; the credential is named in the details
    audit.record(db, actor=actor, action=action, subject=cluster, details={"credential_id": row.id})


def worker_credentials(
    db: Session, *, cluster_id: str, page: Page
) -> tuple[list[WorkerCredential], int]:
    """The worker credentials of one cluster (never their secrets), newest first; NotFound for
    no such cluster."""
    get(db, cluster_id=cluster_id)
    return _CREDENTIALS(db, cluster_id=cluster_id, page=page)


def revoke_worker_credential(
    db: Session, *, actor: Actor, cluster: Cluster, credential_id: str
) -> WorkerCredential:
    """Refuse every later call made with the credential (its workers stop at their next)."""
    row = db.get(WorkerCredential, credential_id)
    if row is None or row.cluster_id != cluster.id:
        raise NotFound()
    if row.revoked_at is not None:
        raise Conflict("the worker credential is already revoked")
    row.revoked_at = utcnow()
    _record_credential(
        db, actor=actor, action="cluster.worker_credential.revoke", cluster=cluster, row=row
    )
    return row


# ------------------------------------------------------------------------------ health

PRESENCE_KINDS = ("switch", "worker")


def report_presence(
    db: Session,
    *,
    cluster: Cluster,
    kind: str,
    instance: str,
    version: str,
    online: bool,
    device: DeviceInfo | None = None,
) -> None:
    """A switch or worker reports in (or, with `online` false, says it is leaving), a
    worker with its device."""
    row = db.scalar(
        select(ClusterPresence).where(
            ClusterPresence.cluster_id == cluster.id,
            ClusterPresence.kind == kind,
            ClusterPresence.instance == instance,
        )
    )
    if not online:
        if row is not None:
            db.delete(row)
        return
    details: dict[str, object] = {"device": device.model_dump()} if device is not None else {}
    if row is None:
        db.add(
            ClusterPresence(
                cluster_id=cluster.id,
                kind=kind,
                instance=instance,
                version=version,
                details=details,
            )
        )
        return
    row.version, row.last_seen = version, utcnow()
    if row.details != details:
        row.details = details


def presence_device(presence: ClusterPresence) -> DeviceInfo | None:
    """The device a worker reported, None for a switch (or a worker that did not say)."""
    stored = (presence.details or {}).get("device")
    return DeviceInfo.model_validate(stored) if isinstance(stored, dict) else None


@dataclass(frozen=True)
class WorkerDevices:
    """Online workers of a cluster with the same device: how many, and what it is."""

    device: DeviceInfo
    workers: int


@dataclass(frozen=True)
class ClusterHealth:
    """What is live on a cluster now."""

    switch_online: bool
    workers_online: int
    running_jobs: int
    worker_devices: list[WorkerDevices]


def _online(db: Session, *, cluster_id: str, timeout: timedelta) -> list[ClusterPresence]:
    return list(
        db.scalars(
            select(ClusterPresence)
            .where(
                ClusterPresence.cluster_id == cluster_id,
                ClusterPresence.last_seen > utcnow() - timeout,
            )
            .order_by(ClusterPresence.kind, ClusterPresence.instance)
        )
    )


def health(db: Session, *, cluster: Cluster, timeout: timedelta) -> ClusterHealth:
    """Whether the cluster's switch is online, how many workers are, how many jobs run there."""
    online = _online(db, cluster_id=cluster.id, timeout=timeout)
    running = db.scalar(
        select(func.count(func.distinct(JobRole.job_id)))
        .join(Job, Job.id == JobRole.job_id)
        .where(
            JobRole.cluster == cluster.name,
            JobRole.status == RoleStatus.running,
            JobRole.attempt == Job.attempt,
            Job.status.not_in(FINAL_STATUSES),
        )
    )
    return ClusterHealth(
        switch_online=any(p.kind == "switch" for p in online),
        workers_online=sum(p.kind == "worker" for p in online),
        running_jobs=int(running or 0),
        worker_devices=_group_devices(online),
    )


def _group_devices(online: list[ClusterPresence]) -> list[WorkerDevices]:
    """The online workers' devices, alike ones counted together, CUDA first."""
    counts: dict[str, tuple[DeviceInfo, int]] = {}
    for presence in online:
        device = presence_device(presence) if presence.kind == "worker" else None
        if device is not None:
            key = device.model_dump_json()
            counts[key] = (device, counts.get(key, (device, 0))[1] + 1)
    return [
        WorkerDevices(device=device, workers=n)
        for device, n in sorted(counts.values(), key=lambda dn: (dn[0].kind != "cuda", -dn[1]))
    ]


def presences(
    db: Session, *, cluster: Cluster, timeout: timedelta
) -> list[tuple[ClusterPresence, list[str]]]:
    """The online processes of a cluster, each with the roles (job/role) it runs now."""
    online = _online(db, cluster_id=cluster.id, timeout=timeout)
    rows = db.execute(
        select(JobRole.worker, JobRole.job_id, JobRole.role)
        .join(Job, Job.id == JobRole.job_id)
        .where(
            JobRole.cluster == cluster.name,
            JobRole.status == RoleStatus.running,
            JobRole.attempt == Job.attempt,
        )
    ).all()
    result = []
    for presence in online:
        # a pool child names its worker as instance/pid
        prefix = f"{presence.instance}/"
        roles = [f"{job}/{role}" for worker, job, role in rows if (worker or "").startswith(prefix)]
        result.append((presence, roles))
    return result


ANY_CLUSTER = "any"


def check_cluster_set(db: Session, *, clusters: list[str] | str) -> list[str] | None:
    """A set of clusters data may go to, sorted, or None for `"any"`.

    Invalid (422) for an unknown name (named) and for an empty list, which would allow
    nothing: ending the grant is what revoking (or denying) is for.
    """
    if isinstance(clusters, str):
        if clusters != ANY_CLUSTER:
            raise Invalid(f'clusters: a list of cluster names or "{ANY_CLUSTER}"')
        return None
    if not clusters:
        raise Invalid("clusters: an empty set allows no cluster; revoke (or deny) instead")
    wanted = sorted(set(clusters))
    known = set(db.scalars(select(Cluster.name).where(Cluster.name.in_(wanted))))
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise Invalid(f"clusters: no cluster named {unknown[0]!r}")
    return wanted


def role_slots(db: Session, *, settings: Settings) -> dict[str, int | None]:
    """Each cluster's role slots (its own, or the settings' default; None: unbounded)."""
    return {
        name: slots if slots is not None else settings.default_cluster_role_slots
        for name, slots in db.execute(select(Cluster.name, Cluster.role_slots))
    }


@dataclass(frozen=True)
class SlotUse:
    """How a cluster's role slots are used: by whom, and how many jobs wait for them."""

    in_use: int
    by_tenant: dict[str, int]  # owner id -> role slots their placed jobs hold
    queued_jobs: int  # live jobs with a role there that have not got their slots


def slot_use(db: Session, *, cluster: Cluster) -> SlotUse:
    """The slots of `cluster` that placed, live jobs hold, per tenant; the jobs queued for it."""
    rows = db.execute(
        select(Job.owner_id, Job.placed_at.is_not(None), func.count(JobRole.id))
        .join(Job, Job.id == JobRole.job_id)
        .where(JobRole.cluster == cluster.name, Job.status.not_in(FINAL_STATUSES))
        .group_by(Job.owner_id, Job.placed_at.is_not(None))
    ).all()
    by_tenant = {owner: int(count) for owner, placed, count in rows if placed}
    queued = db.scalar(
        select(func.count(func.distinct(Job.id)))
        .join(JobRole, JobRole.job_id == Job.id)
        .where(
            JobRole.cluster == cluster.name,
            Job.status.not_in(FINAL_STATUSES),
            Job.placed_at.is_(None),
        )
    )
    return SlotUse(
        in_use=sum(by_tenant.values()), by_tenant=by_tenant, queued_jobs=int(queued or 0)
    )


def set_role_slots(db: Session, *, actor: Actor, cluster: Cluster, role_slots: int | None) -> None:
    """Set how many roles may run on the cluster at once (None: the platform default)."""
    cluster.role_slots = role_slots
    audit.record(
        db, actor=actor, action="cluster.slots", subject=cluster, details={"role_slots": role_slots}
    )

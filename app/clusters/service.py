"""The cluster registry."""

from __future__ import annotations

from sqlalchemy import delete as sql_delete
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts import tokens
from app.audit import service as audit
from app.audit.service import Actor
from app.clusters.models import Certificate, Cluster, EnrollmentToken, WorkerCredential
from app.db import newest_first, utcnow
from app.errors import Conflict, NotFound


def create(db: Session, *, actor: Actor, name: str, switch_host: str, switch_port: int) -> Cluster:
    """Register a cluster by the address of its switch."""
    if db.scalar(select(Cluster.id).where(Cluster.name == name)) is not None:
        raise Conflict("a cluster with this name already exists")
    cluster = Cluster(name=name, switch_host=switch_host, switch_port=switch_port)
    db.add(cluster)
    db.flush()
    audit.record(
        db,
        actor=actor,
        action="cluster.create",
        subject_type="cluster",
        subject_id=cluster.id,
        details={"name": name, "switch": f"{switch_host}:{switch_port}"},
    )
    return cluster


def get(db: Session, *, cluster_id: str) -> Cluster:
    """A cluster by id."""
    cluster = db.get(Cluster, cluster_id)
    if cluster is None:
        raise NotFound()
    return cluster


def by_name(db: Session, *, name: str) -> Cluster | None:
    """A cluster by name, if registered."""
    return db.scalar(select(Cluster).where(Cluster.name == name))


def list_all(db: Session, *, limit: int, offset: int) -> tuple[list[Cluster], int]:
    """Every cluster, newest first."""
    return newest_first(db, Cluster, limit=limit, offset=offset)


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
        db,
        actor=actor,
        action="cluster.delete",
        subject_type="cluster",
        subject_id=cluster.id,
        details={"name": cluster.name},
    )


def certificates(
    db: Session, *, cluster_id: str, limit: int, offset: int
) -> tuple[list[Certificate], int]:
    """Certificates of one cluster, newest first."""
    where = Certificate.cluster_id == cluster_id
    return newest_first(db, Certificate, where, limit=limit, offset=offset)


WORKER_CREDENTIAL_PREFIX = "nbw_"


def create_worker_credential(
    db: Session, *, actor: Actor, cluster: Cluster
) -> tuple[WorkerCredential, str]:
    """A credential for the cluster's workers to call the cluster API; the secret shown once."""
    secret = tokens.new_secret(WORKER_CREDENTIAL_PREFIX)
    row = WorkerCredential(cluster_id=cluster.id, token_hash=tokens.token_hash(secret))
    db.add(row)
    db.flush()
    audit.record(
        db,
        actor=actor,
        action="cluster.worker_credential.create",
        subject_type="cluster",
        subject_id=cluster.id,
        details={"credential_id": row.id},
    )
    return row, secret


def worker_credentials(
    db: Session, *, cluster_id: str, limit: int, offset: int
) -> tuple[list[WorkerCredential], int]:
    """The worker credentials of one cluster (never their secrets), newest first."""
    where = WorkerCredential.cluster_id == cluster_id
    return newest_first(db, WorkerCredential, where, limit=limit, offset=offset)


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
    audit.record(
        db,
        actor=actor,
        action="cluster.worker_credential.revoke",
        subject_type="cluster",
        subject_id=cluster.id,
        details={"credential_id": row.id},
    )
    return row

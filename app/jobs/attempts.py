"""The roles' side of a job: claiming an attempt, heartbeats, metrics, the end of a role,
restarts from the last checkpoints. The cluster API and the reaper call these; none commits
(the caller owns the unit of work).

An attempt number fences: every call names its attempt, and one that is no longer the
job's live attempt changes nothing (a zombie role can no longer write).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.audit import service as audit
from app.audit.service import SYSTEM
from app.db import utcnow
from app.jobs.models import Job, JobArtifact, JobMetric, JobRole, JobStatus, RoleStatus
from app.jobs.service import ACTIVE_STATUSES, fail_job, finish_job
from app.jobs.states import FINAL_STATUSES
from contract.kinds import KINDS


def _fenced_role(
    db: Session, *, job_id: str, role: str, attempt: int
) -> tuple[Job, JobRole] | None:
    """The job and role if `attempt` is still the job's live attempt, else None.

    The job's row is locked on PostgreSQL and read again as it is now: the caller may have
    loaded it before the lock, and what it then writes (the latest metrics of every role)
    must start from what concurrent writers committed meanwhile.
    """
    locks = db.get_bind().dialect.name == "postgresql"
    job = db.get(Job, job_id, with_for_update=locks, populate_existing=True)
    if job is None or job.attempt != attempt or job.status in FINAL_STATUSES:
        return None
    row = db.scalar(select(JobRole).where(JobRole.job_id == job_id, JobRole.role == role))
    if row is None or row.attempt != attempt:
        return None
    return job, row


def start_role(db: Session, *, job_id: str, role: str, attempt: int, worker: str) -> bool:
    """Mark a role running; False if the attempt is stale, the job final or held."""
    found = _fenced_role(db, job_id=job_id, role=role, attempt=attempt)
    if found is None:
        db.rollback()
        return False
    job, row = found
    if job.paused:  # held while its owner is suspended: back to pending, sent again later
        row.status, row.dispatched_at = RoleStatus.pending, None
        return False
    now = utcnow()
    row.status, row.heartbeat_at, row.worker, row.error = RoleStatus.running, now, worker, None
    if job.status == JobStatus.queued:
        job.status = JobStatus.running
        job.started_at = job.started_at or now
    audit.record(
        db,
        actor=SYSTEM,
        action="job.role.start",
        subject_type="job",
        subject_id=job_id,
        details={"role": role, "attempt": attempt, "worker": worker},
    )
    return True


def role_alive(db: Session, *, job_id: str, role: str, attempt: int) -> bool:
    """Heartbeat: True while the role should keep going (live attempt of a live job)."""
    result = db.execute(
        update(JobRole)
        .where(JobRole.job_id == job_id, JobRole.role == role, JobRole.attempt == attempt)
        .values(heartbeat_at=utcnow())
    )
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    job = db.get(Job, job_id)
    return job is not None and job.attempt == attempt and job.status not in FINAL_STATUSES


def record_metrics(
    db: Session,
    *,
    job_id: str,
    role: str,
    attempt: int,
    points: list[tuple[int, dict[str, float]]],
    checkpoint_step: int | None = None,
    seq: int | None = None,
) -> bool:
    """Store a batch of metric points of one role; False if the attempt is fenced out.

    With `seq` (the batch's number within the attempt, from 1), a batch already applied
    is acknowledged and not applied again, so a worker may retry what it is unsure of.
    """
    found = _fenced_role(db, job_id=job_id, role=role, attempt=attempt)
    if found is None:
        db.rollback()
        return False
    job, row = found
    if seq is not None:
        if seq <= row.metrics_seq:
            row.heartbeat_at = utcnow()
            return True
        row.metrics_seq = seq
    for step, values in points:
        for name, value in values.items():
            db.add(JobMetric(job_id=job_id, role=role, step=step, name=name, value=float(value)))
    if points:
        latest = dict(job.metrics)
        for name, value in points[-1][1].items():
            latest[f"{role}.{name}"] = float(value)
        job.metrics = latest
        if role == KINDS[job.kind].primary_role:
            job.step = max(job.step, points[-1][0])
            job.progress = min(1.0, job.step / job.total_steps) if job.total_steps else 0.0
    if checkpoint_step is not None:
        row.checkpoint_step = checkpoint_step
    row.heartbeat_at = utcnow()
    return True


def finish_role(
    db: Session, *, job_id: str, role: str, attempt: int, ok: bool, error: str | None = None
) -> None:
    """A role ended: success may finish the job; failure restarts the attempt or fails the job."""
    found = _fenced_role(db, job_id=job_id, role=role, attempt=attempt)
    if found is None:
        db.rollback()
        return
    job, row = found
    row.status = RoleStatus.succeeded if ok else RoleStatus.failed
    row.error = error
    if ok:
        roles = db.scalars(select(JobRole).where(JobRole.job_id == job_id)).all()
        if all(r.status == RoleStatus.succeeded for r in roles):
            finish_job(db, job, JobStatus.succeeded)
            audit.record(
                db, actor=SYSTEM, action="job.succeed", subject_type="job", subject_id=job_id
            )
    else:
        restart_attempt(db, job=job, reason=f"role {role} failed: {error}")


def restart_attempt(db: Session, *, job: Job, reason: str) -> None:
    """Fence the current attempt out and start a new one from the last checkpoints, or fail."""
    if job.attempt >= job.max_attempts:
        error = f"gave up after {job.attempt} attempts; last: {reason}"
        fail_job(db, job, error=error, details={"reason": reason[:500]})
        return
    job.attempt += 1
    job.rendezvous = None
    db.execute(
        update(JobRole)
        .where(JobRole.job_id == job.id)
        .values(
            attempt=job.attempt,
            status=RoleStatus.pending,
            dispatched_at=None,
            heartbeat_at=None,
            metrics_seq=0,
        )
    )
    audit.record(
        db,
        actor=SYSTEM,
        action="job.restart",
        subject=job,
        details={"attempt": job.attempt, "reason": reason[:500]},
    )


def mark_role_stopped(db: Session, *, job_id: str, role: str, attempt: int) -> None:
    """A role of `attempt` left its loop because it was told to stop."""
    db.execute(
        update(JobRole)
        .where(JobRole.job_id == job_id, JobRole.role == role, JobRole.attempt == attempt)
        .values(status=RoleStatus.stopped)
    )


def add_artifact(
    db: Session,
    *,
    job_id: str,
    name: str,
    kind: str,
    dataset_id: str | None,
    size_bytes: int,
    details: dict[str, Any],
) -> JobArtifact:
    """Record something the job wrote."""
    artifact = JobArtifact(
        job_id=job_id,
        name=name,
        kind=kind,
        dataset_id=dataset_id,
        size_bytes=size_bytes,
        details=details,
    )
    db.add(artifact)
    db.flush()
    return artifact


def stale_roles(db: Session, *, older_than: timedelta) -> list[tuple[Job, JobRole]]:
    """Running roles of live attempts whose heartbeat stopped."""
    cutoff = utcnow() - older_than
    rows = db.execute(
        select(Job, JobRole)
        .join(JobRole, JobRole.job_id == Job.id)
        .where(
            Job.status.in_(ACTIVE_STATUSES),
            JobRole.attempt == Job.attempt,
            JobRole.status == RoleStatus.running,
            JobRole.heartbeat_at < cutoff,
        )
    ).all()
    return [(job, role) for job, role in rows]

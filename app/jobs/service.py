"""Job rules: submission, the life of roles and attempts, cancellation, metrics."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, func, select, true, update
from sqlalchemy.orm import Session

from app.accounts import quotas
from app.accounts.models import User
from app.audit import service as audit
from app.audit.service import SYSTEM, Actor
from app.clusters import service as clusters
from app.db import newest_first, utcnow
from app.errors import Conflict, Invalid, NotFound
from app.grants import service as grants
from app.jobs.models import Job, JobArtifact, JobMetric, JobRole, JobStatus, RoleStatus
from app.jobs.schemas import JobSubmitIn
from app.jobs.states import FINAL_STATUSES
from app.pki import service as pki
from app.settings import Settings
from app.workspaces import service as workspaces
from app.workspaces.models import Workspace
from contract.kinds import KINDS, job_roles

ACTIVE_STATUSES = (JobStatus.queued, JobStatus.running)


def _validate_config(kind: str, config: dict[str, Any]) -> tuple[dict[str, Any], int]:
    spec = KINDS[kind]
    try:
        parsed = spec.config.model_validate(config)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise Invalid(f"config.{where}: {first['msg']}") from None
    return parsed.model_dump(), parsed.total_steps()


def _check_inputs(db: Session, *, user: User, kind: str, inputs: dict[str, str]) -> None:
    from app.grants.service import check_dataset_usable

    spec = KINDS[kind]
    missing = set(spec.inputs) - set(inputs)
    unknown = set(inputs) - set(spec.inputs) - set(spec.optional_inputs)
    if missing or unknown:
        raise Invalid(
            f"inputs of {kind} are {sorted(spec.inputs)} (optional {sorted(spec.optional_inputs)});"
            f" missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    wanted = {**spec.inputs, **spec.optional_inputs}
    for name, dataset_id in inputs.items():
        dataset = check_dataset_usable(db, user_id=user.id, dataset_id=dataset_id)
        if dataset.kind != wanted[name]:
            raise Invalid(f"input {name!r} must be a {wanted[name]} dataset, not {dataset.kind}")


def _check_placement(db: Session, *, kind: str, placement: dict[str, str]) -> None:
    spec = KINDS[kind]
    roles = spec.roles
    if set(placement) != set(roles):
        raise Invalid(f"placement must map exactly the roles {list(roles)} to clusters")
    apart = [placement[role] for role in spec.apart]
    if len(set(apart)) < len(apart):
        raise Invalid(
            f"placement: {' and '.join(spec.apart)} of {kind} must run on different clusters,"
            " so that no cluster sees both sides of a sentence pair"
        )
    for role, name in placement.items():
        cluster = clusters.by_name(db, name=name)
        if cluster is None:
            raise Invalid(f"placement.{role}: no cluster named {name!r}")
        if not pki.has_valid_certificate(db, cluster_id=cluster.id):
            raise Conflict(f"cluster {name!r} has no valid certificate; enroll its switch first")


def submit(
    db: Session,
    *,
    actor: Actor,
    user: User,
    workspace: Workspace,
    body: JobSubmitIn,
    settings: Settings,
) -> Job:
    """Validate and write a job with its roles (pending); dispatch happens after commit."""
    inputs: dict[str, str] = body.inputs.model_dump(exclude_none=True)
    placement: dict[str, str] = body.placement.model_dump()
    config, total_steps = _validate_config(body.kind, body.config.model_dump())
    _check_inputs(db, user=user, kind=body.kind, inputs=inputs)
    _check_placement(db, kind=body.kind, placement=placement)
    owner = quotas.lock_user(db, user_id=user.id)  # the user's lock first, then the workspace's
    locked = workspaces.lock(db, workspace_id=workspace.id)
    if locked is None or owner is None:
        raise NotFound()
    limit = quotas.quota_of(owner, settings).max_concurrent_jobs
    running = quotas.active_jobs(db, user_id=owner.id)
    if running >= limit:
        raise Conflict(f"you run {running} jobs in all your workspaces, your quota is {limit}")
    workspace = locked
    active = (
        db.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.workspace_id == workspace.id, Job.status.in_(ACTIVE_STATUSES))
        )
        or 0
    )
    if active >= workspace.max_concurrent_jobs:
        raise Conflict(
            f"the workspace runs {active} jobs, its quota is {workspace.max_concurrent_jobs}"
        )
    job = Job(
        workspace_id=workspace.id,
        owner_id=user.id,
        kind=body.kind,
        config=config,
        inputs=inputs,
        placement=placement,
        total_steps=total_steps,
        metrics={},
    )
    db.add(job)
    db.flush()
    for role, cluster in job_roles(body.kind, config, placement).items():
        db.add(JobRole(job_id=job.id, role=role, cluster=cluster, attempt=1))
    audit.record(
        db,
        actor=actor,
        action="job.submit",
        subject_type="job",
        subject_id=job.id,
        details={"kind": body.kind, "placement": placement, "inputs": inputs},
    )
    return job


def get_owned(db: Session, *, actor: Actor, user: User, job_id: str) -> Job:
    """The job if `user` owns it; NotFound (audited) otherwise."""
    job = db.get(Job, job_id)
    if job is None or job.owner_id != user.id:
        audit.deny(db, actor=actor, action="job.access", subject_type="job", subject_id=job_id)
    return job


def list_active(db: Session, *, limit: int, offset: int) -> tuple[list[tuple[Job, str]], int]:
    """Queued and running jobs of every tenant, newest first, with their owners' emails."""
    jobs, total = newest_first(db, Job, Job.status.in_(ACTIVE_STATUSES), limit=limit, offset=offset)
    emails = dict(
        db.execute(select(User.id, User.email).where(User.id.in_({j.owner_id for j in jobs}))).all()
    )
    return [(job, emails.get(job.owner_id, "")) for job in jobs], total


def list_for_workspace(
    db: Session, *, workspace_id: str, limit: int, offset: int
) -> tuple[list[Job], int]:
    """Jobs of a workspace, newest first."""
    return newest_first(db, Job, Job.workspace_id == workspace_id, limit=limit, offset=offset)


def finish_job(db: Session, job: Job, status: JobStatus, error: str | None = None) -> None:
    """Put a job in a final status; roles that never started are marked stopped."""
    job.status = status
    job.error = error
    job.finished_at = utcnow()
    if status == JobStatus.succeeded:
        job.progress = 1.0
    # roles that never started will not: a running one reports `stopped` when it notices
    db.execute(
        update(JobRole)
        .where(
            JobRole.job_id == job.id,
            JobRole.status.in_((RoleStatus.pending, RoleStatus.dispatched)),
        )
        .values(status=RoleStatus.stopped)
    )


def fail_job(db: Session, job: Job, *, error: str, details: dict[str, Any]) -> None:
    """End a job as failed with `error`, audited as `job.fail` with `details`."""
    finish_job(db, job, JobStatus.failed, error)
    audit.record(
        db, actor=SYSTEM, action="job.fail", subject_type="job", subject_id=job.id, details=details
    )


def cancel(db: Session, *, actor: Actor, job: Job) -> Job:
    """Stop a job; its roles see it at their next check and stop within seconds."""
    if job.status in FINAL_STATUSES:
        raise Conflict(f"the job is already {job.status.value}")
    finish_job(db, job, JobStatus.cancelled)
    audit.record(db, actor=actor, action="job.cancel", subject_type="job", subject_id=job.id)
    return job


def fail_for_ended_grant(db: Session, *, job: Job, ended: grants.EndedGrant) -> None:
    """Fail a live job whose inputs lost a grant they rest on; audited, not committed."""
    fail_job(
        db,
        job,
        error=ended.describe(),
        details={
            "reason": f"grant_{ended.state}",
            "access_request_id": ended.grant_id,
            "dataset_id": ended.dataset_id,
        },
    )


def _fail_jobs_that_lost_a_grant(
    db: Session, *, where: Any, revoked: grants.EndedGrant | None = None
) -> list[str]:
    failed = []
    for job in db.scalars(select(Job).where(Job.status.in_(ACTIVE_STATUSES), where)).all():
        if revoked is not None and revoked.dataset_id in job.inputs.values():
            ended: grants.EndedGrant | None = revoked
        else:
            ended = grants.ended_grant_for_inputs(
                db, user_id=job.owner_id, dataset_ids=job.inputs.values()
            )
        if ended is not None:
            fail_for_ended_grant(db, job=job, ended=ended)
            failed.append(job.id)
    return failed


def fail_jobs_using_grant(
    db: Session, *, requester_id: str, dataset_id: str, request_id: str
) -> list[str]:
    """Fail the requester's live jobs that use a dataset whose grant was just revoked.

    A job using the dataset itself, or an unreleased output derived from it, fails.
    """
    revoked = grants.EndedGrant(grant_id=request_id, dataset_id=dataset_id, state="revoked")
    return _fail_jobs_that_lost_a_grant(db, where=Job.owner_id == requester_id, revoked=revoked)


def fail_jobs_whose_grants_ended(db: Session) -> list[str]:
    """Fail every live job whose inputs rest on a grant that expired or ended; not committed.

    The reaper calls this each pass: expiry has no moment at which to act, and a
    revocation whose hook failed is caught here too.
    """
    return _fail_jobs_that_lost_a_grant(db, where=true())


def stop_jobs_on_revoked_grant(bind: Engine | Connection, request_id: str) -> None:
    """Grant-revocation hook: the requester's live jobs using that dataset fail at once."""
    from app.grants.models import AccessRequest

    with Session(bind=bind) as db:
        request = db.get(AccessRequest, request_id)
        if request is not None:
            fail_jobs_using_grant(
                db,
                requester_id=request.requester_id,
                dataset_id=request.dataset_id,
                request_id=request_id,
            )
            db.commit()


def set_paused_for_owner(db: Session, *, owner_id: str, paused: bool) -> int:
    """Hold (or release) the queued jobs of a user, e.g. while they are suspended."""
    result = db.execute(
        update(Job)
        .where(Job.owner_id == owner_id, Job.status == JobStatus.queued)
        .values(paused=paused)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the roles' side


def _fenced_role(
    db: Session, *, job_id: str, role: str, attempt: int
) -> tuple[Job, JobRole] | None:
    """The job and role if `attempt` is still the job's live attempt, else None."""
    job = db.get(Job, job_id, with_for_update=db.get_bind().dialect.name == "postgresql")
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
        db.commit()
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
    db.commit()
    return True


def role_alive(db: Session, *, job_id: str, role: str, attempt: int) -> bool:
    """Heartbeat: True while the role should keep going (live attempt of a live job)."""
    result = db.execute(
        update(JobRole)
        .where(JobRole.job_id == job_id, JobRole.role == role, JobRole.attempt == attempt)
        .values(heartbeat_at=utcnow())
    )
    db.commit()
    if not result.rowcount:  # type: ignore[attr-defined]
        return False
    job = db.get(Job, job_id)
    db.commit()
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
            db.commit()
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
    db.commit()
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
    db.commit()


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
        subject_type="job",
        subject_id=job.id,
        details={"attempt": job.attempt, "reason": reason[:500]},
    )


def mark_role_stopped(db: Session, *, job_id: str, role: str, attempt: int) -> None:
    """A role of `attempt` left its loop because it was told to stop."""
    db.execute(
        update(JobRole)
        .where(JobRole.job_id == job_id, JobRole.role == role, JobRole.attempt == attempt)
        .values(status=RoleStatus.stopped)
    )
    db.commit()


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


def metric_series(db: Session, *, job_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a job as `role.name -> [(step, value), ...]`, by step."""
    series: defaultdict[str, list[tuple[int, float]]] = defaultdict(list)
    rows = db.execute(
        select(JobMetric.role, JobMetric.name, JobMetric.step, JobMetric.value)
        .where(JobMetric.job_id == job_id)
        .order_by(JobMetric.id)
    )
    for role, name, step, value in rows:
        series[f"{role}.{name}"].append((step, value))
    return dict(series)


def artifacts(db: Session, *, job_id: str) -> list[JobArtifact]:
    """What a job wrote."""
    return list(
        db.scalars(
            select(JobArtifact).where(JobArtifact.job_id == job_id).order_by(JobArtifact.created_at)
        ).all()
    )


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


grants.on_grant_revoked.append(stop_jobs_on_revoked_grant)

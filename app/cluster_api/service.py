"""Cluster API rules: who may call, which attempt is live, what a role may read and store."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts import tokens
from app.clusters.models import Cluster, WorkerCredential
from app.clusters.service import WORKER_CREDENTIAL_PREFIX
from app.db import utcnow
from app.errors import Conflict, Forbidden, Invalid, NotAuthenticated, NotFound
from app.grants import access
from app.grants.models import AccessRequest
from app.jobs import attempts
from app.jobs import service as jobs
from app.jobs.models import Job, JobArtifact, JobRole
from app.jobs.outputs import store_job_output
from app.jobs.states import FINAL_STATUSES, RoleStatus
from app.keyring import job_checkpoint_key
from app.pki import service as pki
from app.settings import Settings
from app.unit_of_work import commit_before_raising, commit_before_waiting
from contract.cluster_api import ErrorCode, RoleReport
from contract.devices import DeviceKind, role_device
from contract.jobtoken import JobTokenError, verify_job_token
from contract.kinds import KINDS, REPLICA_OF, device_need, replica_rank, role_reads, role_spec

OUTPUT_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class RoleCall:
    """An authenticated call of one role of one attempt, on the cluster it runs on."""

    job_id: str
    attempt: int
    role: str
    cluster: str


def worker_cluster(db: Session, *, credential: str) -> Cluster:
    """The cluster a worker credential belongs to; 401 if unknown or revoked."""
    row = (
        db.scalar(
            select(WorkerCredential).where(
                WorkerCredential.token_hash == tokens.token_hash(credential)
            )
        )
        if credential.startswith(WORKER_CREDENTIAL_PREFIX)
        else None
    )
    cluster = db.get(Cluster, row.cluster_id) if row is not None else None
    if row is None or row.revoked_at is not None or cluster is None:
        raise NotAuthenticated("unknown or revoked worker credential")
    return cluster


def _split_job_claim(claim: str) -> tuple[str, int]:
    job_id, _, attempt = claim.rpartition(".")
    if not job_id or not attempt.isdigit():
        raise NotAuthenticated("the job token names no attempt")
    return job_id, int(attempt)


def authenticate(
    db: Session, *, credential: str, token: str, settings: Settings, job_id: str, role: str
) -> RoleCall:
    """Check both credentials and that the token was issued for this job, role and cluster."""
    cluster = worker_cluster(db, credential=credential)
    # the key object decrypted once per process, not its PEM parsed again on every call
    key = pki.platform_keys(db, settings).job_key.public_key()
    try:
        claims = verify_job_token(token, key)
    except JobTokenError as exc:
        raise NotAuthenticated(f"job token refused: {exc}") from None
    token_job, attempt = _split_job_claim(claims.job_id)
    if claims.cluster != cluster.name:
        raise Forbidden("the job token was issued to another cluster")
    if token_job != job_id or claims.role != role:
        raise Forbidden("the job token is for another job or role")
    return RoleCall(job_id=job_id, attempt=attempt, role=role, cluster=cluster.name)


def _fenced(call: RoleCall) -> Conflict:
    return Conflict(f"attempt {call.attempt} of job {call.job_id} is no longer live")


def _live(db: Session, call: RoleCall) -> Job:
    job = db.get(Job, call.job_id)
    row = db.scalar(select(JobRole).where(JobRole.job_id == call.job_id, JobRole.role == call.role))
    if (
        job is None
        or row is None
        or job.status in FINAL_STATUSES
        or job.attempt != call.attempt
        or row.attempt != call.attempt
    ):
        raise _fenced(call)
    return job


def _token(
    db: Session, *, settings: Settings, job: Job, role: str, cluster: str, attempt: int
) -> tuple[str, datetime]:
    ttl = timedelta(seconds=settings.job_token_ttl_s)
    token = pki.job_token(
        db,
        settings=settings,
        job_id=f"{job.id}.{attempt}",
        role=role,
        cluster=cluster,
        placement=dict(job.placement),
        ttl=ttl,
    )
    return token, utcnow() + ttl


def claim(
    db: Session,
    *,
    cluster: Cluster,
    job_id: str,
    role: str,
    attempt: int,
    worker: str,
    device: DeviceKind,
    settings: Settings,
) -> dict[str, Any]:
    """Start a dispatched role on this cluster and hand it its job token, its config and
    the device it runs on."""
    row = db.scalar(select(JobRole).where(JobRole.job_id == job_id, JobRole.role == role))
    if row is None or row.cluster != cluster.name:
        raise NotFound()
    _refuse_outside_residency(db, job_id=job_id, cluster=cluster.name)
    runs_on = _device_for(
        db, job_id=job_id, role=role, attempt=attempt, cluster=cluster.name, device=device
    )
    if not attempts.start_role(db, job_id=job_id, role=role, attempt=attempt, worker=worker):
        commit_before_raising(db)  # a held job's role went back to pending
        raise Conflict(f"attempt {attempt} of job {job_id} is not live (stale, final or held)")
    job = db.get(Job, job_id)
    assert job is not None
    token, expires_at = _token(
        db, settings=settings, job=job, role=role, cluster=cluster.name, attempt=attempt
    )
    return {
        "token": token,
        "token_expires_at": expires_at,
        "job_id": job.id,
        "attempt": attempt,
        "role": role,
        "peer_role": role_spec(job.kind, role).peer,
        "kind": job.kind,
        "config": dict(job.config),
        "inputs": sorted(set(role_reads(job.kind, role, job.config)) & set(job.inputs)),
        "device": runs_on,
        "heartbeat_s": settings.role_heartbeat_s,
        "grace_s": settings.heartbeat_timeout_s,
        # only a live attempt gets it: once the job ends, what it left sealed stays sealed
        "checkpoint_key": base64.b64encode(job_checkpoint_key(settings, job.id)).decode(),
    }


def heartbeat(db: Session, *, call: RoleCall, settings: Settings) -> tuple[str, datetime]:
    """Beat for a live attempt and renew its token; 409 once it is fenced out or final."""
    if not attempts.role_alive(db, job_id=call.job_id, role=call.role, attempt=call.attempt):
        raise _fenced(call)
    job = db.get(Job, call.job_id)
    assert job is not None
    return _token(
        db,
        settings=settings,
        job=job,
        role=call.role,
        cluster=call.cluster,
        attempt=call.attempt,
    )


def record_metrics(
    db: Session,
    *,
    call: RoleCall,
    seq: int,
    points: list[tuple[int, dict[str, float]]],
    checkpoint_step: int | None,
) -> bool:
    """Apply one numbered metric batch once; False when it was applied before (a retry)."""
    job = db.get(Job, call.job_id)
    if job is not None:
        _check_metric_names(job.kind, {name for _step, values in points for name in values})
    row = db.scalar(
        select(JobRole.metrics_seq).where(
            JobRole.job_id == call.job_id,
            JobRole.role == call.role,
            JobRole.attempt == call.attempt,
        )
    )
    already = row is not None and seq <= row
    if not attempts.record_metrics(
        db,
        job_id=call.job_id,
        role=call.role,
        attempt=call.attempt,
        points=points,
        checkpoint_step=checkpoint_step,
        seq=seq,
    ):
        raise _fenced(call)
    return not already


def _ended_grant(db: Session, *, dataset_id: str, user_id: str) -> str | None:
    return db.scalar(
        select(AccessRequest.id)
        .where(AccessRequest.dataset_id == dataset_id, AccessRequest.requester_id == user_id)
        .order_by(AccessRequest.created_at.desc())
        .limit(1)
    )


def _fail_on_lost_input(db: Session, *, job: Job, name: str, dataset_id: str) -> None:
    """The job's input stopped being usable: fail the job, naming the grant that ended."""
    # for a derived input of the owner's own, the grant that ended is one of its sources'
    ended = access.ended_grant_for_inputs(db, user_id=job.owner_id, dataset_ids=[dataset_id])
    grant = ended.grant_id if ended is not None else None
    grant = grant or _ended_grant(db, dataset_id=dataset_id, user_id=job.owner_id)
    job = db.get(Job, job.id, populate_existing=True) or job
    if job.status in FINAL_STATUSES:
        return
    jobs.fail_job(
        db,
        job,
        error=f"input {name!r} (dataset {dataset_id}) is no longer usable: "
        f"access grant {grant} ended",
        details={"reason": "input_unusable", "dataset_id": dataset_id, "access_request_id": grant},
    )
    commit_before_raising(db)


def _refuse_outside_residency(db: Session, *, job_id: str, cluster: str) -> None:
    """403 naming the grant and the cluster, and the job failed, when a grant its inputs
    rest on no longer allows `cluster` (narrowed since it was submitted)."""
    job = db.get(Job, job_id)
    if job is None:
        return
    refusal = jobs.residency_refusal(db, job=job, clusters=[cluster])
    if refusal is None:
        return
    if job.status not in FINAL_STATUSES:
        jobs.fail_for_residency(db, job=job, refusal=refusal)
    commit_before_raising(db)
    raise Forbidden(refusal.describe())


def _device_for(
    db: Session, *, job_id: str, role: str, attempt: int, cluster: str, device: DeviceKind
) -> DeviceKind:
    """The device the role runs on, on a worker that trains on `device`.

    A worker that lacks the device the role needs is refused (409) and the job fails,
    saying which role needs what and where; a stale attempt's claim is refused without
    failing the job, whose live attempt may land on another worker.
    """
    job = db.get(Job, job_id)
    if job is None:
        raise NotFound()
    need = device_need(job.kind, role, job.config)
    runs_on = role_device(need, device)
    if runs_on is not None:
        return runs_on
    error = (
        f"role {role} needs a {need.upper()} device, but the worker of cluster {cluster!r} "
        f"that took it trains on {device.upper()} only: start that cluster's workers with "
        f"`nebula worker --device {need}` on hosts that have one, or submit the job with "
        f"device {'any'!r}"
    )
    if job.status not in FINAL_STATUSES and job.attempt == attempt:
        jobs.fail_job(
            db,
            job,
            error=error,
            details={
                "reason": "device_unavailable",
                "role": role,
                "cluster": cluster,
                "needs": need,
                "worker_device": device,
            },
        )
    commit_before_raising(db)
    raise Conflict(error)


def _column_chunks(lines: Iterable[str], column: int) -> Iterator[bytes]:
    """One column of a tab-separated corpus, re-chunked to about a megabyte."""
    batch: list[str] = []
    size = 0
    for line in lines:
        cell = line.split("\t", 1)[column]
        batch.append(cell)
        size += len(cell) + 1
        if size >= OUTPUT_CHUNK_BYTES:
            yield ("\n".join(batch) + "\n").encode()
            batch, size = [], 0
    if batch:
        yield ("\n".join(batch) + "\n").encode()


def open_input(db: Session, *, call: RoleCall, name: str, settings: Settings) -> Iterator[bytes]:
    """The decrypted bytes of one of the role's inputs (only its column of a parallel corpus).

    The grant is checked now, and the use audited, before any byte leaves; an input whose
    grant ended answers 403 and fails the job with the grant's id.
    """
    job = db.get(Job, call.job_id)
    if job is None:
        raise _fenced(call)
    reads = role_reads(job.kind, call.role, job.config)
    if name not in reads or name not in job.inputs:
        raise NotFound()
    dataset_id = job.inputs[name]
    try:
        access.check_dataset_usable(db, user_id=job.owner_id, dataset_id=dataset_id)
    except (Forbidden, NotFound):
        _fail_on_lost_input(db, job=job, name=name, dataset_id=dataset_id)
    else:
        _live(db, call)
    _refuse_outside_residency(db, job_id=job.id, cluster=call.cluster)
    # checks again and audits the use (or its denial, raising 403 or 404)
    reader = access.open_dataset_for_job(
        db, user_id=job.owner_id, dataset_id=dataset_id, job_id=job.id, settings=settings
    )
    column = reads[name]
    if column is None:
        return reader.iter_chunks()
    return _column_chunks(reader.iter_lines(), column)


def _check_inputs_still_usable(db: Session, *, job: Job) -> None:
    for name, dataset_id in job.inputs.items():
        try:
            access.check_dataset_usable(db, user_id=job.owner_id, dataset_id=dataset_id)
        except (Forbidden, NotFound):
            _fail_on_lost_input(db, job=job, name=name, dataset_id=dataset_id)
            raise Forbidden(
                f"input {name!r} is no longer usable; the output was not stored"
            ) from None


def _check_no_artifact_yet(db: Session, *, call: RoleCall) -> None:
    """Conflict if this role already stored its artifact in this attempt (one per attempt)."""
    stored = db.scalars(
        select(JobArtifact.details).where(
            JobArtifact.job_id == call.job_id, JobArtifact.kind != "report"
        )
    ).all()
    if any(d.get("role") == call.role and d.get("attempt") == call.attempt for d in stored):
        raise Conflict(f"role {call.role} already stored its artifact in attempt {call.attempt}")


def store_output(
    db: Session, *, call: RoleCall, chunks: Iterable[bytes], settings: Settings
) -> tuple[str, str, int]:
    """Encrypt the role's artifact into the job owner's workspace; (dataset id, name, size).

    Refused for a fenced attempt (before and after the upload), a role that stores no
    artifact, inputs whose grants ended, and over the owner's quota (413).
    """
    job = _live(db, call)
    artifact = role_spec(job.kind, call.role).artifact
    if artifact is None:
        raise NotFound("this role stores no artifact")
    _check_inputs_still_usable(db, job=job)
    _check_no_artifact_yet(db, call=call)
    name = f"{job.kind}-{job.id[:8]}-{call.role}.safetensors"
    commit_before_waiting(db)  # nothing held while the body streams

    def still_live() -> None:
        _live(db, call)
        # again, under the role's row lock: two PUTs at once store (and count) one file
        db.scalar(
            select(JobRole.id)
            .where(JobRole.job_id == call.job_id, JobRole.role == call.role)
            .with_for_update()
        )
        _check_no_artifact_yet(db, call=call)

    dataset_id, size = store_job_output(
        db,
        job_id=job.id,
        workspace_id=job.workspace_id,
        owner_id=job.owner_id,
        name=name,
        kind="model",
        chunks=chunks,
        settings=settings,
        before_commit=still_live,
    )
    attempts.add_artifact(
        db,
        job_id=job.id,
        name=name,
        kind=artifact,
        dataset_id=dataset_id,
        size_bytes=size,
        details={"role": call.role, "attempt": call.attempt},
    )
    return dataset_id, name, size


def ended_jobs(db: Session, *, cluster: Cluster, job_ids: list[str]) -> list[str]:
    """Of `job_ids`, those that ended for good or never had a role on `cluster`: the jobs
    whose scratch folders the cluster may remove."""
    live = set(
        db.scalars(
            select(JobRole.job_id)
            .join(Job, Job.id == JobRole.job_id)
            .where(
                JobRole.job_id.in_(job_ids),
                JobRole.cluster == cluster.name,
                Job.status.not_in(FINAL_STATUSES),
            )
        )
    )
    return [job_id for job_id in job_ids if job_id not in live]


def publish_rendezvous(db: Session, *, call: RoleCall, rendezvous: dict[str, Any]) -> None:
    """The root discriminator's process-group address for this attempt's replicas."""
    if call.role != REPLICA_OF:
        raise Forbidden("only the discriminator publishes a rendezvous")
    job = _live(db, call)
    job.rendezvous = {**rendezvous, "attempt": call.attempt}


def read_rendezvous(db: Session, *, call: RoleCall) -> dict[str, Any]:
    """The rendezvous of this attempt, for one of its replicas; 404 until published."""
    if replica_rank(call.role) is None:
        raise Forbidden("only replicas read the rendezvous")
    job = _live(db, call)
    published = dict(job.rendezvous or {})
    if published.pop("attempt", None) != call.attempt:
        raise NotFound("no rendezvous published for this attempt yet")
    return published


def _check_metric_names(kind: str, names: Iterable[str]) -> None:
    """Invalid unless every name is in the kind's table: a name is no place for text."""
    unknown = sorted(set(names) - KINDS[kind].metrics)
    if unknown:
        raise Invalid(
            f"metric {unknown[0]!r} is not one that {kind} reports; see the job kinds table"
        )


def _finished_already(db: Session, *, call: RoleCall) -> Conflict | None:
    row = db.scalar(
        select(JobRole)
        .where(JobRole.job_id == call.job_id, JobRole.role == call.role)
        .with_for_update()  # two finishes at once: the second waits, then sees the first
    )
    if row is not None and row.attempt == call.attempt and row.status in _ENDED_ROLE:
        return Conflict(f"role {call.role} already finished attempt {call.attempt}")
    return None


_ENDED_ROLE = (RoleStatus.succeeded, RoleStatus.failed, RoleStatus.stopped)


def finish(
    db: Session,
    *,
    call: RoleCall,
    outcome: str,
    error_code: str | None,
    error: str | None,
    report: RoleReport,
) -> str:
    """A role ended, once per attempt (a second finish: 409); returns the job's status."""
    already = _finished_already(db, call=call)
    if already is not None:
        raise already
    if outcome == "stopped":
        attempts.mark_role_stopped(db, job_id=call.job_id, role=call.role, attempt=call.attempt)
    else:
        job = _live(db, call)
        if outcome == "succeeded":
            _check_metric_names(job.kind, [*report.final_metrics, *report.extra])
            details = report.model_dump()
            attempts.add_artifact(
                db,
                job_id=job.id,
                name=f"report-{call.role}.json",
                kind="report",
                dataset_id=None,
                size_bytes=len(json.dumps(details)),
                details={"role": call.role, "attempt": call.attempt, **details},
            )
        code = error_code or ErrorCode.other.value
        attempts.finish_role(
            db,
            job_id=call.job_id,
            role=call.role,
            attempt=call.attempt,
            ok=outcome == "succeeded",
            error=f"{code}: {error or 'no message'}" if outcome == "failed" else None,
        )
    final = db.get(Job, call.job_id)
    return final.status.value if final is not None else "unknown"

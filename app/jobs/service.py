"""Job rules: submission, cancellation, the end of a job, metrics (the roles' side: attempts.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam, func, select, true, update
from sqlalchemy.orm import Session

from app.accounts import quotas
from app.accounts.models import User
from app.audit import service as audit
from app.audit.service import SYSTEM, Actor
from app.clusters import service as clusters
from app.db import NewestFirst, Page, utcnow
from app.errors import Conflict, Invalid, NotFound
from app.grants import access, residency
from app.grants import service as grants
from app.jobs.models import (
    ColumnExposure,
    Job,
    JobArtifact,
    JobMetric,
    JobRole,
    JobStatus,
    RoleStatus,
)
from app.jobs.schemas import (
    JobInputKindOut,
    JobKindList,
    JobKindOut,
    JobPresetOut,
    JobRoleKindOut,
    JobSubmitIn,
)
from app.jobs.states import FINAL_STATUSES
from app.pki import service as pki
from app.releases import provenance
from app.settings import Settings
from app.workspaces import service as workspaces
from app.workspaces.models import Dataset, DatasetKind, Workspace
from contract.kinds import KINDS, SOURCE, TARGET, job_roles, role_reads
from contract.presets import PRESET_HINTS

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
        dataset = access.check_dataset_usable(db, user_id=user.id, dataset_id=dataset_id)
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


_COLUMN_NAMES = {SOURCE: "source", TARGET: "target"}


def _column_exposures(
    db: Session,
    *,
    kind: str,
    config: dict[str, Any],
    inputs: dict[str, str],
    placement: dict[str, str],
) -> set[tuple[str, str, int]]:
    """(dataset, cluster, column) for each column of a parallel corpus this job sends somewhere.

    A role that reads a parallel dataset whole exposes both of its columns.
    """
    exposures: set[tuple[str, str, int]] = set()
    for role, cluster in job_roles(kind, config, placement).items():
        for name, column in role_reads(kind, role, config).items():
            dataset_id = inputs.get(name)
            if dataset_id is None:
                continue
            if column is not None:
                exposures.add((dataset_id, cluster, column))
                continue
            dataset = db.get(Dataset, dataset_id)
            if dataset is not None and dataset.kind == DatasetKind.parallel:
                exposures.update((dataset_id, cluster, c) for c in _COLUMN_NAMES)
            elif dataset is not None and dataset.kind == DatasetKind.model:
                exposures.update((p, cluster, c) for p, c in _columns_in_model(db, dataset_id))
    return exposures


def _columns_in_model(db: Session, model_id: str) -> set[tuple[str, int]]:
    """(parallel dataset, column) that a job's model output was trained on directly.

    The role that stored the model (its artifact's details) read one column of each
    parallel input; sending the model to a cluster sends what it learned of that column.
    """
    artifact = db.scalar(select(JobArtifact).where(JobArtifact.dataset_id == model_id).limit(1))
    if artifact is None:
        return set()
    job = db.get(Job, artifact.job_id)
    role = artifact.details.get("role")
    if job is None or not isinstance(role, str) or job.kind not in KINDS:
        return set()
    sources = {row.source_id for row in provenance.sources_of(db, model_id) if row.direct}
    found: set[tuple[str, int]] = set()
    try:
        reads = role_reads(job.kind, role, job.config)
    except KeyError:
        return set()
    for name, column in reads.items():
        source = job.inputs.get(name)
        if source in sources and column is not None:
            found.add((source, column))
    return found


def _check_columns_apart(
    db: Session, *, actor: Actor, user: User, exposures: set[tuple[str, str, int]]
) -> None:
    """Refuse (403, audited) a placement that gives a cluster the other column of a corpus
    one of this user's earlier jobs sent there: together the two are the sentence pairs."""
    if not exposures:
        return
    earlier = db.scalars(
        select(ColumnExposure).where(
            ColumnExposure.user_id == user.id,
            ColumnExposure.dataset_id.in_({dataset for dataset, _c, _col in exposures}),
        )
    ).all()
    had = {(e.dataset_id, e.cluster): e for e in earlier}
    for dataset_id, cluster, column in sorted(exposures):
        before = had.get((dataset_id, cluster))
        if before is not None and before.column != column:
            audit.deny(
                db,
                actor=actor,
                action="job.submit",
                subject_type="dataset",
                subject_id=dataset_id,
                forbidden=(
                    f"placement: cluster {cluster!r} already received the"
                    f" {_COLUMN_NAMES.get(before.column, before.column)} column of parallel"
                    f" dataset {dataset_id} (job {before.job_id}); sending it the"
                    f" {_COLUMN_NAMES.get(column, column)} column too would put whole sentence"
                    " pairs on one cluster. Place each role where it ran before."
                ),
            )


def _remember_columns(
    db: Session, *, user: User, job: Job, exposures: set[tuple[str, str, int]]
) -> None:
    for dataset_id, cluster, column in sorted(exposures):
        key = (dataset_id, user.id, cluster, column)
        if db.get(ColumnExposure, key) is None:
            db.add(
                ColumnExposure(
                    dataset_id=dataset_id,
                    user_id=user.id,
                    cluster=cluster,
                    column=column,
                    job_id=job.id,
                )
            )


def _check_slots(
    db: Session,
    *,
    user: User,
    kind: str,
    config: dict[str, Any],
    placement: dict[str, str],
    settings: Settings,
) -> None:
    """Refuse a job that could never get its role slots: more than a cluster has, or than
    the user's roles_per_cluster (it would wait until the queue timeout for nothing)."""
    demand: defaultdict[str, int] = defaultdict(int)
    for cluster in job_roles(kind, config, placement).values():
        demand[cluster] += 1
    capacity = clusters.role_slots(db, settings=settings)
    limit = roles_per_cluster(user, settings)
    for cluster, slots in sorted(demand.items()):
        cap = capacity.get(cluster)
        if cap is not None and slots > cap:
            raise Conflict(f"the job needs {slots} role slots of {cluster}, which has {cap}")
        if slots > limit:
            raise Conflict(
                f"the job needs {slots} role slots of {cluster}; your roles_per_cluster is {limit}"
            )


def roles_per_cluster(user: User, settings: Settings) -> int:
    """The role slots the user may hold on one cluster at once."""
    return quotas.quota_of(user, settings).roles_per_cluster


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
    refusal = residency.first_refusal(
        db, user_id=user.id, dataset_ids=inputs.values(), clusters=placement.values()
    )
    if refusal is not None:
        audit.deny(
            db,
            actor=actor,
            action="job.submit",
            subject_type="access_request",
            subject_id=refusal.grant_id,
            forbidden=refusal.describe(),
        )
    exposures = _column_exposures(
        db, kind=body.kind, config=config, inputs=inputs, placement=placement
    )
    _check_columns_apart(db, actor=actor, user=user, exposures=exposures)
    owner = quotas.lock_user(db, user_id=user.id)  # the user's lock first, then the workspace's
    locked = workspaces.lock(db, workspace_id=workspace.id)
    if locked is None or owner is None:
        raise NotFound()
    _check_slots(
        db, user=owner, kind=body.kind, config=config, placement=placement, settings=settings
    )
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
    _remember_columns(db, user=user, job=job, exposures=exposures)
    audit.record(
        db,
        actor=actor,
        action="job.submit",
        subject=job,
        details={"kind": body.kind, "placement": placement, "inputs": inputs},
    )
    return job


_ACTIVE = NewestFirst(Job, Job.status.in_(ACTIVE_STATUSES))
_IN_WORKSPACE = NewestFirst(Job, Job.workspace_id == bindparam("workspace_id"))


def list_active(db: Session, *, page: Page) -> tuple[list[tuple[Job, str]], int]:
    """Queued and running jobs of every tenant, newest first, with their owners' emails."""
    jobs, total = _ACTIVE(db, page=page)
    emails = dict(
        db.execute(select(User.id, User.email).where(User.id.in_({j.owner_id for j in jobs}))).all()
    )
    return [(job, emails.get(job.owner_id, "")) for job in jobs], total


def list_for_workspace(db: Session, *, workspace_id: str, page: Page) -> tuple[list[Job], int]:
    """Jobs of a workspace, newest first."""
    return _IN_WORKSPACE(db, workspace_id=workspace_id, page=page)


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
    audit.record(db, actor=SYSTEM, action="job.fail", subject=job, details=details)


def cancel(db: Session, *, actor: Actor, job: Job) -> Job:
    """Stop a job; its roles see it at their next check and stop within seconds."""
    if job.status in FINAL_STATUSES:
        raise Conflict(f"the job is already {job.status.value}")
    finish_job(db, job, JobStatus.cancelled)
    audit.record(db, actor=actor, action="job.cancel", subject=job)
    return job


def fail_for_ended_grant(db: Session, *, job: Job, ended: access.EndedGrant) -> None:
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


def residency_refusal(
    db: Session, *, job: Job, clusters: Iterable[str] | None = None
) -> residency.ResidencyRefusal | None:
    """The first of the job's clusters (or of `clusters`) a grant its inputs rest on excludes."""
    return residency.first_refusal(
        db,
        user_id=job.owner_id,
        dataset_ids=job.inputs.values(),
        clusters=job.placement.values() if clusters is None else clusters,
    )


def residency_table(db: Session, *, job: Job) -> list[dict[str, Any]]:
    """For each cluster of a job: its roles, whether the grants allow it, and those grants."""
    found = residency.allowances(db, user_id=job.owner_id, dataset_ids=job.inputs.values())
    names = {dataset_id: name for name, dataset_id in job.inputs.items()}
    by_cluster: dict[str, list[str]] = defaultdict(list)
    for role, cluster in job_roles(job.kind, job.config, job.placement).items():
        by_cluster[cluster].append(role)
    return [
        {
            "cluster": cluster,
            "roles": roles,
            "allowed": all(a.allows(cluster) for a in found),
            "grants": [
                {
                    "grant_id": a.grant_id,
                    "input": names.get(a.input_id, a.input_id),
                    "dataset_id": a.dataset_id,
                    "clusters": sorted(a.clusters) if a.clusters is not None else "any",
                }
                for a in found
            ],
        }
        for cluster, roles in by_cluster.items()
    ]


def fail_for_residency(db: Session, *, job: Job, refusal: residency.ResidencyRefusal) -> None:
    """Fail a live job whose roles sit on a cluster a grant no longer allows; not committed."""
    on_cluster = [
        role
        for role, cluster in job_roles(job.kind, job.config, job.placement).items()
        if cluster == refusal.cluster
    ]
    fail_job(
        db,
        job,
        error=f"roles {', '.join(on_cluster)} on cluster {refusal.cluster!r} stopped: "
        f"{refusal.describe()}",
        details={
            "reason": "grant_excludes_cluster",
            "access_request_id": refusal.grant_id,
            "dataset_id": refusal.dataset_id,
            "cluster": refusal.cluster,
            "roles": on_cluster,
        },
    )


def _fail_jobs_that_lost_a_grant(
    db: Session, *, where: Any, revoked: access.EndedGrant | None = None
) -> list[str]:
    failed = []
    for job in db.scalars(select(Job).where(Job.status.in_(ACTIVE_STATUSES), where)).all():
        if revoked is not None and revoked.dataset_id in job.inputs.values():
            ended: access.EndedGrant | None = revoked
        else:
            ended = access.ended_grant_for_inputs(
                db, user_id=job.owner_id, dataset_ids=job.inputs.values()
            )
        if ended is not None:
            fail_for_ended_grant(db, job=job, ended=ended)
            failed.append(job.id)
            continue
        refusal = residency_refusal(db, job=job)
        if refusal is not None:
            fail_for_residency(db, job=job, refusal=refusal)
            failed.append(job.id)
    return failed


def stop_jobs_of_ended_grants(db: Session, *, ended: Iterable[grants.EndedRequest]) -> list[str]:
    """Fail the live jobs that rested on grants that just ended; returns their ids.

    The caller that ended the grants calls this after committing that: the revocation
    stands whatever happens here, and the reaper's next pass fails whatever this missed.
    A requester's job using the dataset itself, or an unreleased output derived from it,
    fails.
    """
    failed: list[str] = []
    for end in ended:
        if not end.was_granted:
            continue
        revoked = access.EndedGrant(
            grant_id=end.request_id, dataset_id=end.dataset_id, state=end.state
        )
        failed += _fail_jobs_that_lost_a_grant(
            db, where=Job.owner_id == end.requester_id, revoked=revoked
        )
    return failed


def stop_jobs_of_narrowed_grant(db: Session, *, narrowed: grants.NarrowedGrant) -> list[str]:
    """Fail the requester's live jobs with a role on a cluster the grant no longer allows.

    Called by the narrowing request after its commit; the reaper catches what it missed.
    """
    return _fail_jobs_that_lost_a_grant(db, where=Job.owner_id == narrowed.requester_id)


def fail_jobs_whose_grants_ended(db: Session) -> list[str]:
    """Fail every live job whose inputs rest on a grant that expired or ended, or that no
    longer allows one of its clusters; not committed.

    The reaper calls this each pass: expiry has no moment at which to act, and a job that
    a revocation's (or narrowing's) caller did not stop is caught here too.
    """
    return _fail_jobs_that_lost_a_grant(db, where=true())


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


def kind_table() -> JobKindList:
    """The job kinds table (contract.kinds) as `GET /job-kinds` serves it."""
    items = []
    for name, spec in KINDS.items():
        tiny = spec.config.PRESETS["tiny"]
        inputs = [
            JobInputKindOut(
                name=input_name,
                kind=dataset_kind,
                optional=input_name in spec.optional_inputs,
                **spec.input_text[input_name].model_dump(),
            )
            for input_name, dataset_kind in {**spec.inputs, **spec.optional_inputs}.items()
        ]
        roles = [
            JobRoleKindOut(name=role_name, **{**role.model_dump(), "reads": list(role.reads)})
            for role_name, role in spec.roles.items()
        ]
        presets = [
            JobPresetOut(name=preset, hint=PRESET_HINTS[preset], values={**tiny, **values})
            for preset, values in spec.config.PRESETS.items()
        ]
        items.append(
            JobKindOut(
                kind=name,
                label=spec.label,
                description=spec.description,
                primary_role=spec.primary_role,
                apart=list(spec.apart),
                roles=roles,
                inputs=inputs,
                presets=presets,
                config_fields=list(spec.config.model_fields),
                config_schema=spec.config.model_json_schema(),
            )
        )
    return JobKindList(items=items)

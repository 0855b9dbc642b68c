"""A job's outputs enter its owner's workspace the way an upload does: encrypted, counted.

Each output records what it derives from (the job's inputs and their own sources), in
the transaction that creates it, so that no output ever exists without its provenance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlalchemy.orm import Session

from app.audit import service as audit
from app.audit.service import Actor
from app.datasets import service as datasets
from app.errors import Forbidden, NotFound
from app.grants import access
from app.jobs import service as jobs
from app.jobs.models import Job
from app.releases import provenance
from app.settings import Settings
from app.unit_of_work import commit_before_raising, commit_before_waiting
from app.workspaces.models import Dataset, DatasetKind, Workspace


def _job_inputs(db: Session, *, job: Job) -> list[provenance.Input]:
    """The job's input datasets, each with the grant its owner used it under (None: own)."""
    inputs = []
    for dataset_id in dict.fromkeys(job.inputs.values()):
        source = db.get(Dataset, dataset_id)
        if source is None:
            raise NotFound()
        grant_ids = (
            []
            if source.owner_id == job.owner_id
            else access.active_grant_ids_for(db, dataset_id=source.id, user_id=job.owner_id)
        )
        inputs.append(provenance.Input(dataset=source, grant_id=next(iter(grant_ids), None)))
    return inputs


def _check_inputs_still_usable(db: Session, *, job: Job) -> None:
    """Forbidden, and the job failed (committed), if a grant its inputs rest on ended."""
    ended = access.ended_grant_for_inputs(db, user_id=job.owner_id, dataset_ids=job.inputs.values())
    if ended is None:
        return
    jobs.fail_for_ended_grant(db, job=job, ended=ended)
    commit_before_raising(db)
    raise Forbidden(f"{ended.describe()}: the job's output is not stored")


def store_job_output(
    db: Session,
    *,
    job_id: str,
    workspace_id: str,
    owner_id: str,
    name: str,
    kind: str,
    chunks: Iterable[bytes],
    settings: Settings,
    before_commit: Callable[[], None] | None = None,
) -> tuple[str, int]:
    """Encrypt streamed bytes a job wrote into its workspace as a dataset; (id, size).

    The job's inputs are checked again first (403 naming the grant that ended, and the
    job fails); 413 as soon as the stream outgrows the owner's quota; `before_commit` may
    still refuse (raise) once the bytes are in, e.g. when the attempt was fenced out
    meanwhile.
    """
    job = db.get(Job, job_id)
    if job is None or job.owner_id != owner_id or job.workspace_id != workspace_id:
        raise NotFound()
    _check_inputs_still_usable(db, job=job)
    inputs = _job_inputs(db, job=job)
    workspace = db.get(Workspace, workspace_id)
    if workspace is None or workspace.owner_id != owner_id:
        raise NotFound()
    plan = datasets.plan_upload(db, workspace=workspace, settings=settings)
    commit_before_waiting(db)  # nothing held while the bytes stream in

    def record_provenance(dataset: Dataset) -> None:
        provenance.record_sources(db, dataset_id=dataset.id, job_id=job_id, inputs=inputs)
        audit.record(
            db,
            actor=Actor(user_id=owner_id),
            action="dataset.derive",
            subject=dataset,
            details={
                "job_id": job_id,
                "inputs": [i.dataset.id for i in inputs],
                "grant_ids": [i.grant_id for i in inputs if i.grant_id is not None],
                "derived_from": [s.source_id for s in provenance.sources_of(db, dataset.id)],
            },
        )

    dataset_kind = DatasetKind(kind)
    incoming = datasets.IncomingFile(plan)
    incoming.validate_as(dataset_kind)
    try:
        for chunk in chunks:
            incoming.write(chunk)
        incoming.complete(dataset_kind)
        if before_commit is not None:
            before_commit()
        dataset = datasets.finish_upload(
            db,
            actor=Actor(user_id=owner_id),
            plan=plan,
            incoming=incoming,
            fields=datasets.UploadFields(name=name, kind=dataset_kind, discoverable=False),
            also=record_provenance,
        )
    finally:
        incoming.discard()
    return dataset.id, dataset.size_bytes

"""HTTP routes of jobs: submit, follow (JSON and server-sent events), cancel, artifacts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request, status
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from app import ownership
from app.accounts import service as accounts
from app.db import session_scope
from app.deps import (
    AdminDep,
    CallerDep,
    PageDep,
    SessionDep,
    WriterDep,
    in_stream_thread,
)
from app.errors import Conflict, Forbidden, Invalid, NotFound, raises
from app.jobs import dispatch, service
from app.jobs.models import Job
from app.jobs.schemas import (
    ArtifactList,
    ArtifactOut,
    ClusterResidencyOut,
    JobAccepted,
    JobKindList,
    JobList,
    JobOut,
    JobOverviewList,
    JobOverviewOut,
    JobSubmitIn,
    MetricsOut,
)
from app.jobs.states import FINAL_STATUSES
from app.path_params import JobIdPath, WorkspaceIdPath
from app.routing import api_router
from app.workspaces.models import Workspace

router = api_router("jobs")

EVENT_POLL_S = 0.5
KEEPALIVE_S = 15.0


@router.post(
    "/workspaces/{workspace_id}/jobs",
    response_model=JobAccepted,
    status_code=status.HTTP_202_ACCEPTED,
)
@raises(NotFound, Forbidden, Conflict, Invalid)
def submit_job(
    workspace_id: WorkspaceIdPath,
    body: JobSubmitIn,
    request: Request,
    caller: WriterDep,
    db: SessionDep,
) -> JobAccepted:
    """Validate, write and enqueue a job; its roles run on their clusters."""
    workspace = ownership.get_owned(
        db, Workspace, workspace_id, actor=caller.actor, user=caller.identity
    )
    settings = request.app.state.settings
    job = service.submit(
        db, actor=caller.actor, user=caller.user, workspace=workspace, body=body, settings=settings
    )
    db.commit()
    dispatch.schedule_and_dispatch(db, settings=settings)
    return JobAccepted(id=job.id, status=job.status.value)


@router.get("/job-kinds", response_model=JobKindList)
def list_job_kinds(caller: CallerDep) -> JobKindList:
    """The job kinds table: roles, peers, inputs, artifacts, presets and config of each kind."""
    return service.kind_table()


@router.get("/admin/jobs", response_model=JobOverviewList)
def list_active_jobs(caller: AdminDep, db: SessionDep, page: PageDep) -> JobOverviewList:
    """Queued and running jobs across tenants: metadata only, no data and no metrics."""
    rows, total = service.list_active(db, page=page)
    items = [
        JobOverviewOut.model_validate(job).model_copy(update={"owner_email": email})
        for job, email in rows
    ]
    return JobOverviewList(items=items, total=total)


@router.get("/workspaces/{workspace_id}/jobs", response_model=JobList)
def list_jobs(
    workspace_id: WorkspaceIdPath, caller: CallerDep, db: SessionDep, page: PageDep
) -> JobList:
    """Jobs of one of the caller's workspaces."""
    ownership.check_owned(db, Workspace, workspace_id, actor=caller.actor, user=caller.identity)
    items, total = service.list_for_workspace(db, workspace_id=workspace_id, page=page)
    return JobList(items=[JobOut.model_validate(j) for j in items], total=total)


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: JobIdPath, caller: CallerDep, db: SessionDep) -> JobOut:
    """One of the caller's jobs, with what each of its clusters receives under which grant."""
    job = ownership.get_owned(db, Job, job_id, actor=caller.actor, user=caller.identity)
    answer = JobOut.model_validate(job)
    answer.residency = [
        ClusterResidencyOut.model_validate(row) for row in service.residency_table(db, job=job)
    ]
    return answer


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, status_code=status.HTTP_202_ACCEPTED)
@raises(Conflict)
def cancel_job(job_id: JobIdPath, request: Request, caller: WriterDep, db: SessionDep) -> JobOut:
    """Cancel: both roles stop within seconds."""
    job = ownership.get_owned(db, Job, job_id, actor=caller.actor, user=caller.identity)
    service.cancel(db, actor=caller.actor, job=job)
    db.commit()
    answer = JobOut.model_validate(job)
    dispatch.schedule_and_dispatch(db, settings=request.app.state.settings)  # its slots freed
    return answer


@router.get("/jobs/{job_id}/metrics", response_model=MetricsOut)
def job_metrics(job_id: JobIdPath, caller: CallerDep, db: SessionDep) -> MetricsOut:
    """Every metric as a time series: `{"series": {"role.name": [[step, value], ...]}}`."""
    ownership.check_owned(db, Job, job_id, actor=caller.actor, user=caller.identity)
    return MetricsOut(series=service.metric_series(db, job_id=job_id))


@router.get("/jobs/{job_id}/artifacts", response_model=ArtifactList)
def job_artifacts(job_id: JobIdPath, caller: CallerDep, db: SessionDep) -> ArtifactList:
    """Models and reports the job wrote (models are datasets in the owner's workspace)."""
    ownership.check_owned(db, Job, job_id, actor=caller.actor, user=caller.identity)
    items = service.artifacts(db, job_id=job_id)
    return ArtifactList(items=[ArtifactOut.model_validate(a) for a in items], total=len(items))


def _snapshot(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "status": job.status.value,
        "progress": job.progress,
        "step": job.step,
        "total_steps": job.total_steps,
        "metrics": job.metrics,
        "error": job.error,
        "attempt": job.attempt,
        "waiting": job.waiting,
    }


def _read_snapshot(
    factory: sessionmaker[Session], job_id: str, token_id: str
) -> dict[str, Any] | None:
    """The job's state, or None when it is gone or the caller's credential no longer holds."""
    for db in session_scope(factory):
        # an open stream ends with its session: logout, a password change, a suspension
        if not accounts.token_is_live(db, token_id=token_id):
            return None
        job = db.get(Job, job_id)
        return None if job is None else _snapshot(job)
    return None


@router.get(
    "/jobs/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "`event: status` with the job's JSON snapshot on every change; "
            "the stream ends when the job does",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    },
)
def job_events(
    job_id: JobIdPath, request: Request, caller: CallerDep, db: SessionDep
) -> StreamingResponse:
    """Server-sent events: a `status` event whenever status, progress or metrics change."""
    ownership.get_owned(db, Job, job_id, actor=caller.actor, user=caller.identity)
    token_id = caller.identity.token_id
    db.rollback()  # release the request's session: the stream reads with short ones of its own
    factory: sessionmaker[Session] = request.app.state.read_sessionmaker

    async def events() -> AsyncIterator[str]:
        last: dict[str, Any] | None = None
        quiet = 0.0
        while not await request.is_disconnected():
            snapshot = await in_stream_thread(request, _read_snapshot, factory, job_id, token_id)
            if snapshot is None:
                return
            if snapshot != last:
                yield f"event: status\ndata: {json.dumps(snapshot)}\n\n"
                last, quiet = snapshot, 0.0
                if snapshot["status"] in {s.value for s in FINAL_STATUSES}:
                    return
            elif quiet >= KEEPALIVE_S:
                yield ": keep-alive\n\n"
                quiet = 0.0
            await asyncio.sleep(EVENT_POLL_S)
            quiet += EVENT_POLL_S

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

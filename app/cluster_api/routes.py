"""HTTP routes of the cluster API (`/api/v1/cluster/...`): HTTP only, rules in the service.

Every call carries the cluster's worker credential in `X-Nebula-Worker`; every call of
a running role also carries its job token as `Authorization: Bearer`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import anyio.from_thread
from fastapi import Depends, Header, Path, Request, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from app.cluster_api import service
from app.clusters import service as clusters
from app.clusters.models import Cluster
from app.deps import API_PREFIX, SessionDep, SettingsDep
from app.errors import (
    Conflict,
    Forbidden,
    InsufficientStorage,
    Invalid,
    NotAuthenticated,
    QuotaExceeded,
    raises,
)
from app.jobs import dispatch
from app.jobs.states import FINAL_STATUSES
from app.openapi.marks import security
from app.path_params import JobIdPath
from app.routing import api_router
from contract.cluster_api import (
    ClaimIn,
    ClaimOut,
    EndedJobsIn,
    EndedJobsOut,
    FinishIn,
    FinishOut,
    HeartbeatOut,
    MetricBatchIn,
    MetricBatchOut,
    OutputOut,
    PresenceAnswer,
    PresenceIn,
    Rendezvous,
)

router = api_router("cluster", prefix=f"{API_PREFIX}/cluster")

WORKER_HEADER = "X-Nebula-Worker"
RoleName = Annotated[
    str, Path(pattern=r"^(generator|discriminator|encoder|decoder|replica-[1-9][0-9]?)$")
]
InputName = Annotated[str, Path(pattern=r"^[a-z_]{1,32}$")]
# Both headers are the document's security schemes (worker_credential, job_token), not parameters.
WorkerHeader = Annotated[str, Header(alias=WORKER_HEADER, max_length=200, include_in_schema=False)]


@security({"worker_credential": []})
@raises(NotAuthenticated)
def get_worker_cluster(db: SessionDep, credential: WorkerHeader = "") -> Cluster:
    """The cluster whose worker credential came with the call."""
    return service.worker_cluster(db, credential=credential)


WorkerClusterDep = Annotated[Cluster, Depends(get_worker_cluster)]


@security({"worker_credential": [], "job_token": []})
@raises(NotAuthenticated, Forbidden)
def get_role_call(
    job_id: JobIdPath,
    role: RoleName,
    db: SessionDep,
    settings: SettingsDep,
    credential: WorkerHeader = "",
    authorization: Annotated[str, Header(max_length=9000, include_in_schema=False)] = "",
) -> service.RoleCall:
    """The role this call speaks for, from the worker credential and the job token."""
    if not authorization.lower().startswith("bearer "):
        raise NotAuthenticated("a job token is required")
    return service.authenticate(
        db,
        credential=credential,
        token=authorization[7:].strip(),
        settings=settings,
        job_id=job_id,
        role=role,
    )


RoleCallDep = Annotated[service.RoleCall, Depends(get_role_call)]
ROLE = "/jobs/{job_id}/roles/{role}"
BINARY = {"type": "string", "format": "binary"}


@router.get("/whoami")
def whoami(cluster: WorkerClusterDep) -> dict[str, str]:
    """The cluster a worker credential belongs to (workers check it when they start)."""
    return {"cluster": cluster.name}


@router.post("/presence", response_model=PresenceAnswer)
def presence(
    body: PresenceIn, cluster: WorkerClusterDep, db: SessionDep, settings: SettingsDep
) -> PresenceAnswer:
    """A switch or worker of this cluster reports in (or leaves); how often to report."""
    clusters.report_presence(
        db,
        cluster=cluster,
        kind=body.kind,
        instance=body.instance,
        version=body.version,
        online=body.online,
        device=body.device,
    )
    db.commit()
    return PresenceAnswer(report_every_s=settings.presence_report_s)


@router.post("/jobs/ended", response_model=EndedJobsOut)
def ended_jobs(body: EndedJobsIn, cluster: WorkerClusterDep, db: SessionDep) -> EndedJobsOut:
    """Which of the jobs a cluster still keeps files of have ended there (to remove them)."""
    return EndedJobsOut(ended=service.ended_jobs(db, cluster=cluster, job_ids=body.job_ids))


@router.post(f"{ROLE}/claim", response_model=ClaimOut)
@raises(Conflict, Forbidden)
def claim(
    job_id: JobIdPath,
    role: RoleName,
    body: ClaimIn,
    cluster: WorkerClusterDep,
    db: SessionDep,
    settings: SettingsDep,
) -> ClaimOut:
    """Start a dispatched role on this cluster: its job token, config, inputs and device.

    409 when the attempt is not live, or when the worker lacks the device the role needs
    (the job then fails, saying so)."""
    answer = service.claim(
        db,
        cluster=cluster,
        job_id=job_id,
        role=role,
        attempt=body.attempt,
        worker=body.worker,
        device=body.device,
        settings=settings,
    )
    db.commit()
    return ClaimOut.model_validate(answer)


@router.post(f"{ROLE}/heartbeat", response_model=HeartbeatOut)
@raises(Conflict)
def heartbeat(call: RoleCallDep, db: SessionDep, settings: SettingsDep) -> HeartbeatOut:
    """The attempt is alive: a renewed token; 409 once it was fenced out or the job ended."""
    token, expires_at = service.heartbeat(db, call=call, settings=settings)
    db.commit()
    return HeartbeatOut(alive=True, token=token, token_expires_at=expires_at)


@router.post(f"{ROLE}/metrics", response_model=MetricBatchOut)
@raises(Conflict, Invalid)
def metrics(call: RoleCallDep, body: MetricBatchIn, db: SessionDep) -> MetricBatchOut:
    """One numbered batch of metric points (and the newest checkpoint step), applied once."""
    applied = service.record_metrics(
        db,
        call=call,
        seq=body.seq,
        points=[(p.step, dict(p.values)) for p in body.points],
        checkpoint_step=body.checkpoint_step,
    )
    db.commit()
    return MetricBatchOut(applied=applied)


@router.get(
    f"{ROLE}/inputs/{{name}}",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {"schema": BINARY}}}},
)
@raises(Conflict, Forbidden)
def read_input(
    name: InputName, call: RoleCallDep, db: SessionDep, settings: SettingsDep
) -> StreamingResponse:
    """One of the role's inputs, decrypted and streamed (its own column of a parallel corpus)."""
    chunks = service.open_input(db, call=call, name=name, settings=settings)
    db.commit()  # the use is audited whatever the role does next; the stream holds no session
    return StreamingResponse(chunks, media_type="application/octet-stream")


def _body_chunks(request: Request) -> Iterator[bytes]:
    """The request body, pulled from a worker thread one chunk at a time."""
    stream = request.stream()
    while True:
        try:
            chunk = anyio.from_thread.run(stream.__anext__)
        except StopAsyncIteration:
            return
        except ClientDisconnect:
            raise Invalid("the upload was interrupted") from None
        if chunk:
            yield chunk


@router.put(
    f"{ROLE}/artifact",
    response_model=OutputOut,
    status_code=status.HTTP_201_CREATED,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": BINARY}},
        }
    },
)
@raises(Conflict, Forbidden, Invalid, QuotaExceeded, InsufficientStorage)
async def store_artifact(
    request: Request, call: RoleCallDep, db: SessionDep, settings: SettingsDep
) -> OutputOut:
    """The role's artifact, streamed in and encrypted into the job owner's workspace."""

    def store() -> tuple[str, str, int]:
        chunks = _body_chunks(request)
        stored = service.store_output(db, call=call, chunks=chunks, settings=settings)
        db.commit()
        return stored

    dataset_id, name, size = await run_in_threadpool(store)
    return OutputOut(dataset_id=dataset_id, name=name, size_bytes=size)


@router.post(f"{ROLE}/rendezvous", response_model=Rendezvous)
def publish_rendezvous(call: RoleCallDep, body: Rendezvous, db: SessionDep) -> Rendezvous:
    """The root discriminator says where its replicas join its process group."""
    service.publish_rendezvous(db, call=call, rendezvous=body.model_dump())
    db.commit()
    return body


@router.get(f"{ROLE}/rendezvous", response_model=Rendezvous)
def read_rendezvous(call: RoleCallDep, db: SessionDep) -> Rendezvous:
    """Where a replica joins its discriminator's process group; 404 until it is published."""
    return Rendezvous.model_validate(service.read_rendezvous(db, call=call))


@router.post(f"{ROLE}/finish", response_model=FinishOut)
@raises(Conflict, Invalid)
def finish(call: RoleCallDep, body: FinishIn, db: SessionDep, settings: SettingsDep) -> FinishOut:
    """The role ended: succeeded (with its report), failed (with the cause) or stopped."""
    job_status = service.finish(
        db,
        call=call,
        outcome=body.outcome,
        error_code=body.error_code,
        error=body.error,
        report=body.report,
    )
    db.commit()
    if job_status in {s.value for s in FINAL_STATUSES}:
        # its slots are free: the next job in fair order starts now, not at the reaper's pass
        dispatch.schedule_and_dispatch(db, settings=settings)
    return FinishOut(job_status=job_status)

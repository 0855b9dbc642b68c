"""HTTP routes of access requests and grants."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Body, Query, status
from sqlalchemy.orm import Session

from app.deps import CallerDep, PageDep, SessionDep, WriterDep
from app.errors import Conflict, Forbidden, Invalid, NotFound, raises
from app.grants import service, views
from app.grants.models import AccessRequest
from app.grants.schemas import (
    AccessRequestCreateIn,
    AccessRequestList,
    AccessRequestOut,
    ApproveIn,
    NarrowIn,
)
from app.jobs import service as jobs
from app.path_params import RequestIdPath
from app.routing import api_router

router = api_router("access requests")

StatusFilter = Literal["pending", "approved", "denied", "revoked", "withdrawn", "expired"]


def _answer_and_commit(db: Session, request: AccessRequest) -> AccessRequestOut:
    # read inside the unit of work: a read after its commit would begin a transaction of its own
    answer = AccessRequestOut.of(views.view(db, request))
    db.commit()
    return answer


@router.post(
    "/access-requests", response_model=AccessRequestOut, status_code=status.HTTP_201_CREATED
)
@raises(NotFound, Conflict)
def create_request(
    body: AccessRequestCreateIn, caller: WriterDep, db: SessionDep
) -> AccessRequestOut:
    """Ask the owner of a discoverable dataset for the right to use it in jobs."""
    request = service.create_request(
        db, actor=caller.actor, user=caller.user, dataset_id=body.dataset_id, purpose=body.purpose
    )
    return _answer_and_commit(db, request)


@router.get("/access-requests", response_model=AccessRequestList)
def list_requests(
    caller: CallerDep,
    db: SessionDep,
    page: PageDep,
    direction: service.Direction | None = None,
    status: Annotated[StatusFilter | None, Query()] = None,
) -> AccessRequestList:
    """Requests the caller made (outgoing), received (incoming), or both."""
    items, total = views.list_for(
        db, user=caller.user, direction=direction, status=status, page=page
    )
    return AccessRequestList(items=[AccessRequestOut.of(v) for v in items], total=total)


@router.get("/access-requests/{request_id}", response_model=AccessRequestOut)
def get_request(request_id: RequestIdPath, caller: CallerDep, db: SessionDep) -> AccessRequestOut:
    """One request the caller made or received."""
    request = service.get_for_party(db, actor=caller.actor, user=caller.user, request_id=request_id)
    return AccessRequestOut.of(views.view(db, request))


@router.post("/access-requests/{request_id}/approve", response_model=AccessRequestOut)
@raises(Forbidden, Conflict, Invalid)
def approve(
    request_id: RequestIdPath,
    caller: WriterDep,
    db: SessionDep,
    body: Annotated[ApproveIn | None, Body()] = None,
) -> AccessRequestOut:
    """The dataset's owner lets the requester use it in jobs (until expires_at, if given)."""
    request = service.approve(
        db,
        actor=caller.actor,
        user=caller.user,
        request_id=request_id,
        expires_at=body.expires_at if body else None,
        clusters=body.clusters if body else None,
    )
    return _answer_and_commit(db, request)


@router.post("/access-requests/{request_id}/narrow", response_model=AccessRequestOut)
@raises(Forbidden, Conflict, Invalid)
def narrow(
    request_id: RequestIdPath, body: NarrowIn, caller: WriterDep, db: SessionDep
) -> AccessRequestOut:
    """The dataset's owner narrows the clusters an active grant allows; the requester's live
    jobs with a role on a removed cluster fail, naming the grant and the cluster."""
    request, narrowed = service.narrow(
        db, actor=caller.actor, user=caller.user, request_id=request_id, clusters=body.clusters
    )
    answer = _answer_and_commit(db, request)
    jobs.stop_jobs_of_narrowed_grant(db, narrowed=narrowed)
    db.commit()
    return answer


@router.post("/access-requests/{request_id}/deny", response_model=AccessRequestOut)
@raises(Forbidden, Conflict)
def deny(request_id: RequestIdPath, caller: WriterDep, db: SessionDep) -> AccessRequestOut:
    """The dataset's owner refuses."""
    request = service.deny(db, actor=caller.actor, user=caller.user, request_id=request_id)
    return _answer_and_commit(db, request)


@router.post("/access-requests/{request_id}/revoke", response_model=AccessRequestOut)
@raises(Forbidden, Conflict)
def revoke(request_id: RequestIdPath, caller: WriterDep, db: SessionDep) -> AccessRequestOut:
    """The dataset's owner ends an active grant; the requester's running jobs on it stop."""
    request, ended = service.revoke(db, actor=caller.actor, user=caller.user, request_id=request_id)
    answer = _answer_and_commit(db, request)
    jobs.stop_jobs_of_ended_grants(db, ended=[ended])
    db.commit()
    return answer


@router.post("/access-requests/{request_id}/withdraw", response_model=AccessRequestOut)
@raises(Forbidden, Conflict)
def withdraw(request_id: RequestIdPath, caller: WriterDep, db: SessionDep) -> AccessRequestOut:
    """The requester takes the request back (or gives up the grant)."""
    request, ended = service.withdraw(
        db, actor=caller.actor, user=caller.user, request_id=request_id
    )
    answer = _answer_and_commit(db, request)
    jobs.stop_jobs_of_ended_grants(db, ended=[ended])
    db.commit()
    return answer

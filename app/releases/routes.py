"""HTTP routes of release requests for derived datasets."""

from __future__ import annotations

from fastapi import status
from sqlalchemy.orm import Session

from app.accounts.models import User
from app.deps import CallerDep, PageDep, SessionDep, WriterDep
from app.errors import Conflict, Forbidden, raises
from app.path_params import DatasetIdPath, ReleaseIdPath
from app.releases import service
from app.releases.models import ReleaseRequest, ReleaseStatus
from app.releases.schemas import ReleaseRequestCreateIn, ReleaseRequestList, ReleaseRequestOut
from app.routing import api_router

router = api_router("release requests")


def _answer_and_commit(db: Session, viewer: User, request: ReleaseRequest) -> ReleaseRequestOut:
    # read inside the unit of work: a read after its commit would begin a transaction of its own
    answer = ReleaseRequestOut.of(service.view(db, viewer=viewer, request=request))
    db.commit()
    return answer


@router.post(
    "/datasets/{dataset_id}/release-requests",
    response_model=ReleaseRequestOut,
    status_code=status.HTTP_201_CREATED,
)
@raises(Forbidden, Conflict)
def create_request(
    dataset_id: DatasetIdPath, body: ReleaseRequestCreateIn, caller: WriterDep, db: SessionDep
) -> ReleaseRequestOut:
    """The owner of a derived dataset asks its sources' owners to release it."""
    request = service.request_release(
        db, actor=caller.actor, user=caller.user, dataset_id=dataset_id, purpose=body.purpose
    )
    return _answer_and_commit(db, caller.user, request)


@router.get("/release-requests", response_model=ReleaseRequestList)
def list_requests(
    caller: CallerDep,
    db: SessionDep,
    page: PageDep,
    direction: service.Direction | None = None,
    status: ReleaseStatus | None = None,
) -> ReleaseRequestList:
    """Requests the caller made (outgoing), must decide as a source owner (incoming), or both."""
    items, total = service.list_for(
        db, user=caller.user, direction=direction, status=status, page=page
    )
    return ReleaseRequestList(items=[ReleaseRequestOut.of(v) for v in items], total=total)


@router.get("/release-requests/{request_id}", response_model=ReleaseRequestOut)
def get_request(request_id: ReleaseIdPath, caller: CallerDep, db: SessionDep) -> ReleaseRequestOut:
    """One request the caller made or must decide."""
    request = service.get_for_party(db, actor=caller.actor, user=caller.user, request_id=request_id)
    return ReleaseRequestOut.of(service.view(db, viewer=caller.user, request=request))


@router.post("/release-requests/{request_id}/approve", response_model=ReleaseRequestOut)
@raises(Forbidden, Conflict)
def approve(request_id: ReleaseIdPath, caller: WriterDep, db: SessionDep) -> ReleaseRequestOut:
    """A source owner approves; once every one has, the dataset is released."""
    request = service.approve(db, actor=caller.actor, user=caller.user, request_id=request_id)
    return _answer_and_commit(db, caller.user, request)


@router.post("/release-requests/{request_id}/deny", response_model=ReleaseRequestOut)
@raises(Forbidden, Conflict)
def deny(request_id: ReleaseIdPath, caller: WriterDep, db: SessionDep) -> ReleaseRequestOut:
    """A source owner refuses; the dataset stays use-only."""
    request = service.deny(db, actor=caller.actor, user=caller.user, request_id=request_id)
    return _answer_and_commit(db, caller.user, request)

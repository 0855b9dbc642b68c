"""Release requests: the owner of a derived dataset asks its sources' owners to let it out.

States: pending -> approved (every source owner approved: the dataset is released, and
stays released whatever later happens to the grants) | denied (one source owner
refused; the owner may ask again). Only the dataset's owner asks; each source owner
decides their own part; the requester never decides (403); anyone else sees nothing (404).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.accounts.models import Identity, User
from app.audit import service as audit
from app.audit.service import Actor
from app.datasets import service as datasets
from app.db import Page, newest_first, utcnow
from app.errors import Conflict
from app.grants.models import AccessRequest
from app.releases import provenance
from app.releases.models import DatasetSource, ReleaseApproval, ReleaseRequest, ReleaseStatus
from app.releases.provenance import Release
from app.workspaces.models import Dataset


class Direction(StrEnum):
    """Requests the user made, or requests that wait for the user's decision."""

    incoming = "incoming"
    outgoing = "outgoing"


# ------------------------------------------------------------------ what a dataset shows


@dataclass(frozen=True)
class Derivation:
    """What a dataset's page shows of its provenance, to one viewer."""

    derived_from: list[str]  # source ids the viewer may know of
    release: Release
    job_id: str | None  # the job that derived it
    source_names: dict[str, str]  # the names of those sources


def derivations(
    db: Session, *, viewer: User | Identity, items: Sequence[Dataset]
) -> dict[str, Derivation]:
    """The derivation of each dataset; sources the viewer has no way to know stay out."""
    derived = provenance.derived_ids(db, (d.id for d in items))
    answer = {
        d.id: Derivation(derived_from=[], release=Release.not_needed, job_id=None, source_names={})
        for d in items
        if d.id not in derived
    }
    if not derived:
        return answer
    rows = db.execute(
        select(DatasetSource, Dataset.discoverable, Dataset.deleted_at, Dataset.name)
        .join(Dataset, Dataset.id == DatasetSource.source_id)
        .where(DatasetSource.dataset_id.in_(derived))
        .order_by(DatasetSource.direct.desc(), DatasetSource.source_id)
    ).all()
    requested = set(
        db.scalars(
            select(AccessRequest.dataset_id).where(
                AccessRequest.requester_id == viewer.id,
                AccessRequest.dataset_id.in_({row[0].source_id for row in rows}),
            )
        )
    )
    by_dataset: dict[str, list[DatasetSource]] = {}
    names = {row[0].source_id: row[3] for row in rows}
    for row, discoverable, deleted_at, _name in rows:
        if (
            row.source_owner_id == viewer.id
            or row.source_id in requested
            or (discoverable and deleted_at is None)
        ):
            by_dataset.setdefault(row.dataset_id, []).append(row)
    jobs = {row[0].dataset_id: row[0].job_id for row in rows}
    for dataset in items:
        if dataset.id in derived:
            shown = [r.source_id for r in by_dataset.get(dataset.id, [])]
            answer[dataset.id] = Derivation(
                derived_from=shown,
                release=provenance.release_state(db, dataset),
                job_id=jobs.get(dataset.id),
                source_names={source_id: names[source_id] for source_id in shown},
            )
    return answer


def derivation(db: Session, *, viewer: User, dataset: Dataset) -> Derivation:
    """The derivation of one dataset, as `viewer` may see it."""
    return derivations(db, viewer=viewer, items=[dataset])[dataset.id]


# ------------------------------------------------------------------- requests, decisions


def request_release(
    db: Session, *, actor: Actor, user: User, dataset_id: str, purpose: str
) -> ReleaseRequest:
    """A pending request to the owners of every source that binds the user's dataset."""
    datasets.get_owned(db, actor=actor, user=user, dataset_id=dataset_id, action="release.request")
    dataset = db.scalar(
        select(Dataset)
        .where(Dataset.id == dataset_id)
        .with_for_update()  # serializes the one-pending-request check per dataset
        .execution_options(populate_existing=True)
    )
    assert dataset is not None
    state = provenance.release_state(db, dataset)
    if state == Release.not_needed:
        raise Conflict("the dataset derives from no one else's data: it needs no release")
    if state == Release.released:
        raise Conflict("the dataset is already released")
    if state == Release.pending:
        raise Conflict("a release request for this dataset is already pending")
    bindings = provenance.bindings(db, dataset)
    request = ReleaseRequest(
        dataset_id=dataset.id,
        requester_id=user.id,
        purpose=purpose,
        status=ReleaseStatus.pending,
    )
    db.add(request)
    db.flush()
    owners = sorted({b.owner_id for b in bindings})
    db.add_all(ReleaseApproval(request_id=request.id, owner_id=owner) for owner in owners)
    db.flush()
    audit.record(
        db,
        actor=actor,
        action="release.request",
        subject=request,
        details={
            "dataset_id": dataset.id,
            "source_ids": [b.source_id for b in bindings],
            "owner_ids": owners,
        },
    )
    return request


def _approvals(db: Session, request_id: str) -> list[ReleaseApproval]:
    return list(
        db.scalars(
            select(ReleaseApproval)
            .where(ReleaseApproval.request_id == request_id)
            .order_by(ReleaseApproval.owner_id)
        )
    )


def get_for_party(db: Session, *, actor: Actor, user: User, request_id: str) -> ReleaseRequest:
    """A request the user made or must decide; NotFound (audited) for anyone else."""
    request = db.get(ReleaseRequest, request_id)
    if request is None or (
        request.requester_id != user.id
        and user.id not in {a.owner_id for a in _approvals(db, request.id)}
    ):
        audit.deny(
            db,
            actor=actor,
            action="release.view",
            subject_type="release_request",
            subject_id=request_id,
        )
    return request


def _decide(
    db: Session, *, actor: Actor, user: User, request_id: str, approve: bool
) -> ReleaseRequest:
    action = "release.approve" if approve else "release.deny"
    request = db.scalar(
        select(ReleaseRequest)
        .where(ReleaseRequest.id == request_id)
        .with_for_update()  # two owners deciding at once: one of them sees the other's part
        .execution_options(populate_existing=True)
    )
    approvals = _approvals(db, request_id) if request is not None else []
    mine = next((a for a in approvals if a.owner_id == user.id), None)
    if request is None or (mine is None and request.requester_id != user.id):
        audit.deny(
            db, actor=actor, action=action, subject_type="release_request", subject_id=request_id
        )
    if mine is None:
        audit.deny(
            db,
            actor=actor,
            action=action,
            subject_type="release_request",
            subject_id=request_id,
            forbidden="the requester cannot decide their own release request",
        )
    if request.status != ReleaseStatus.pending:
        raise Conflict(f"the release request is {request.status.value}")
    if mine.status != ReleaseStatus.pending:
        raise Conflict(f"you have already {mine.status.value} this release request")
    now = utcnow()
    mine.status, mine.decided_at = (
        ReleaseStatus.approved if approve else ReleaseStatus.denied,
        now,
    )
    if not approve:
        request.status, request.decided_at = ReleaseStatus.denied, now
    elif all(a.status == ReleaseStatus.approved for a in approvals):
        request.status, request.decided_at = ReleaseStatus.approved, now
    audit.record(
        db,
        actor=actor,
        action=action,
        subject=request,
        details={"dataset_id": request.dataset_id, "requester_id": request.requester_id},
    )
    if request.status == ReleaseStatus.approved:
        audit.record(
            db,
            actor=actor,
            action="dataset.release",
            subject_type="dataset",
            subject_id=request.dataset_id,
            details={
                "release_request_id": request.id,
                "approved_by": [a.owner_id for a in approvals],
            },
        )
    db.flush()
    return request


def approve(db: Session, *, actor: Actor, user: User, request_id: str) -> ReleaseRequest:
    """A source owner approves their part; the last approval releases the dataset."""
    return _decide(db, actor=actor, user=user, request_id=request_id, approve=True)


def deny(db: Session, *, actor: Actor, user: User, request_id: str) -> ReleaseRequest:
    """A source owner refuses: the request is denied, the dataset stays use-only."""
    return _decide(db, actor=actor, user=user, request_id=request_id, approve=False)


# ------------------------------------------------------------------------------ listing


@dataclass(frozen=True)
class ApprovalView:
    """One source owner's part of a request."""

    owner_id: str
    owner_display_name: str
    status: str
    decided_at: datetime | None


@dataclass(frozen=True)
class SourceView:
    """A source behind a request, shown to the requester and to that source's owner."""

    id: str
    name: str
    kind: str
    owner_id: str


@dataclass(frozen=True)
class RequestView:
    """A request with what the UI shows next to it."""

    request: ReleaseRequest
    dataset_name: str
    dataset_kind: str
    dataset_size_bytes: int
    requester_email: str
    requester_display_name: str
    approvals: list[ApprovalView]
    sources: list[SourceView]


def _views(db: Session, *, viewer: User, requests: Sequence[ReleaseRequest]) -> list[RequestView]:
    views = []
    for request in requests:
        approvals = _approvals(db, request.id)
        owners = {a.owner_id for a in approvals}
        users = {
            u.id: u
            for u in db.scalars(select(User).where(User.id.in_(owners | {request.requester_id})))
        }
        dataset = db.get(Dataset, request.dataset_id)
        assert dataset is not None
        # the requester sees the sources behind every approval, a source owner their own;
        # either only among those they may know of
        shown_owners = owners if viewer.id == request.requester_id else {viewer.id}
        known = derivation(db, viewer=viewer, dataset=dataset).derived_from
        sources = db.execute(
            select(Dataset)
            .join(DatasetSource, DatasetSource.source_id == Dataset.id)
            .where(
                DatasetSource.dataset_id == request.dataset_id,
                DatasetSource.source_id.in_(known),
                DatasetSource.source_owner_id.in_(shown_owners & owners),
            )
            .order_by(Dataset.name)
        ).scalars()
        views.append(
            RequestView(
                request=request,
                dataset_name=dataset.name,
                dataset_kind=dataset.kind.value,
                dataset_size_bytes=dataset.size_bytes,
                requester_email=users[request.requester_id].email,
                requester_display_name=users[request.requester_id].display_name,
                approvals=[
                    ApprovalView(
                        owner_id=a.owner_id,
                        owner_display_name=users[a.owner_id].display_name,
                        status=a.status.value,
                        decided_at=a.decided_at,
                    )
                    for a in approvals
                ],
                sources=[SourceView(s.id, s.name, s.kind.value, s.owner_id) for s in sources],
            )
        )
    return views


def view(db: Session, *, viewer: User, request: ReleaseRequest) -> RequestView:
    """One request as `viewer` sees it."""
    return _views(db, viewer=viewer, requests=[request])[0]


def list_for(
    db: Session,
    *,
    user: User,
    direction: Direction | None,
    status: ReleaseStatus | None,
    page: Page,
) -> tuple[list[RequestView], int]:
    """Requests the user made (outgoing), must decide (incoming), or both; newest first."""
    deciding = select(ReleaseApproval.request_id).where(ReleaseApproval.owner_id == user.id)
    where: Any
    if direction == Direction.incoming:
        where = ReleaseRequest.id.in_(deciding)
    elif direction == Direction.outgoing:
        where = ReleaseRequest.requester_id == user.id
    else:
        where = or_(ReleaseRequest.id.in_(deciding), ReleaseRequest.requester_id == user.id)
    if status is not None:
        where = where & (ReleaseRequest.status == status)
    items, total = newest_first(db, ReleaseRequest, where, page=page)
    return _views(db, viewer=user, requests=items), total

"""The life of an access request: asked, decided, narrowed, ended.

States: pending -> approved | denied | withdrawn; approved -> revoked | withdrawn.
An approved request past its `expires_at` is reported as `expired` and grants nothing.
Only the dataset's owner approves, denies and revokes; only the requester withdraws.
Whether a grant lets a job use the data is app.grants.access's decision; the list views
are app.grants.views.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.accounts.models import User
from app.audit import service as audit
from app.audit.service import Actor
from app.clusters.service import ANY_CLUSTER, check_cluster_set
from app.db import utcnow
from app.errors import Conflict, Invalid
from app.grants.access import active_clause, live_dataset, status_of
from app.grants.models import AccessRequest, AccessStatus
from app.releases import provenance
from app.workspaces.models import Dataset


@dataclass(frozen=True)
class EndedRequest:
    """An access request a call just ended, for its caller to act on after the commit."""

    request_id: str
    requester_id: str
    dataset_id: str
    state: str  # revoked or withdrawn
    was_granted: bool  # it was an active grant: the requester's live jobs on it must stop


# defined here, not in views.py: its module path names it in the OpenAPI document
# (app__grants__service__Direction, beside the release requests' own Direction)
class Direction(StrEnum):
    """Requests the user made, or requests for the user's datasets."""

    incoming = "incoming"
    outgoing = "outgoing"


def _live_clause(now: datetime) -> Any:
    return (AccessRequest.status == AccessStatus.pending) | active_clause(now)


def create_request(
    db: Session, *, actor: Actor, user: User, dataset_id: str, purpose: str
) -> AccessRequest:
    """A pending request to use a discoverable dataset of another user."""
    dataset = db.scalar(
        select(Dataset)
        .where(Dataset.id == dataset_id)
        .with_for_update()  # serializes the one-live-request check per dataset
        .execution_options(populate_existing=True)
    )
    if dataset is None or dataset.deleted_at is not None:
        audit.deny(
            db, actor=actor, action="access.request", subject_type="dataset", subject_id=dataset_id
        )
    if dataset.owner_id == user.id:
        raise Conflict("you own this dataset")
    if not dataset.discoverable:
        audit.deny(
            db, actor=actor, action="access.request", subject_type="dataset", subject_id=dataset_id
        )
    live = db.scalar(
        select(AccessRequest.id).where(
            AccessRequest.dataset_id == dataset.id,
            AccessRequest.requester_id == user.id,
            _live_clause(utcnow()),
        )
    )
    if live is not None:
        raise Conflict("you already have a pending or active request for this dataset")
    request = AccessRequest(
        dataset_id=dataset.id,
        requester_id=user.id,
        owner_id=dataset.owner_id,
        purpose=purpose,
        status=AccessStatus.pending,
    )
    return audit.record_creation(
        db,
        request,
        actor=actor,
        action="access.request",
        details={"dataset_id": dataset.id, "owner_id": dataset.owner_id},
    )


def _locked_request(db: Session, request_id: str) -> AccessRequest | None:
    return db.scalar(
        select(AccessRequest)
        .where(AccessRequest.id == request_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )


def get_for_party(db: Session, *, actor: Actor, user: User, request_id: str) -> AccessRequest:
    """A request the user made or received; NotFound (audited) for anyone else."""
    request = db.get(AccessRequest, request_id)
    if request is None or user.id not in (request.requester_id, request.owner_id):
        audit.deny(
            db,
            actor=actor,
            action="access.view",
            subject_type="access_request",
            subject_id=request_id,
        )
    return request


class _Party(StrEnum):
    owner = "owner"
    requester = "requester"


_PENDING, _APPROVED = AccessStatus.pending.value, AccessStatus.approved.value
# Each step on a request: the one party who may take it, and the statuses it starts from.
_STEPS: dict[str, tuple[_Party, tuple[str, ...]]] = {
    "access.approve": (_Party.owner, (_PENDING,)),
    "access.deny": (_Party.owner, (_PENDING,)),
    "access.revoke": (_Party.owner, (_APPROVED,)),
    "access.narrow": (_Party.owner, (_APPROVED,)),
    "access.withdraw": (_Party.requester, (_PENDING, _APPROVED)),
}


def _transition(
    db: Session, *, actor: Actor, user: User, request_id: str, action: str
) -> AccessRequest:
    who, allowed_from = _STEPS[action]
    request = _locked_request(db, request_id)
    if request is None or user.id not in (request.requester_id, request.owner_id):
        audit.deny(
            db, actor=actor, action=action, subject_type="access_request", subject_id=request_id
        )
    party_id = request.owner_id if who == _Party.owner else request.requester_id
    if user.id != party_id:
        audit.deny(
            db,
            actor=actor,
            action=action,
            subject_type="access_request",
            subject_id=request_id,
            forbidden=f"only the {who.value} may do this",
        )
    current = status_of(request)
    if current not in allowed_from:
        raise Conflict(f"the request is {current}")
    return request


def approve(
    db: Session,
    *,
    actor: Actor,
    user: User,
    request_id: str,
    expires_at: datetime | None,
    clusters: list[str] | str | None = None,
) -> AccessRequest:
    """The owner grants use in jobs, until `expires_at` (future) or revocation, on `clusters`
    (a list of names or `"any"`; None: the dataset's default set, or any where it has none)."""
    # who may decide comes first: a stranger learns nothing from the date's check
    request = _transition(
        db, actor=actor, user=user, request_id=request_id, action="access.approve"
    )
    now = utcnow()
    if expires_at is not None and expires_at <= now:
        raise Invalid("expires_at must be in the future")
    dataset = live_dataset(db, request.dataset_id)
    if dataset is None:
        raise Conflict("the dataset was deleted")
    if provenance.needs_release(db, dataset):
        raise Conflict(
            "the dataset derives from other owners' data: it cannot be shared until they release it"
        )
    if clusters is None:
        allowed = dataset.default_clusters
    else:
        allowed = check_cluster_set(db, clusters=clusters)
    request.status = AccessStatus.approved
    request.decided_at = now
    request.expires_at = expires_at
    request.clusters = list(allowed) if allowed is not None else None
    audit.record(
        db,
        actor=actor,
        action="access.approve",
        subject=request,
        details={
            "dataset_id": request.dataset_id,
            "requester_id": request.requester_id,
            "expires_at": expires_at.isoformat() if expires_at else None,
            "clusters": request.clusters if request.clusters is not None else ANY_CLUSTER,
        },
    )
    return request


@dataclass(frozen=True)
class NarrowedGrant:
    """A grant whose clusters a call just narrowed, for its caller to act on after the commit."""

    request_id: str
    requester_id: str
    dataset_id: str


def narrow(
    db: Session, *, actor: Actor, user: User, request_id: str, clusters: list[str]
) -> tuple[AccessRequest, NarrowedGrant]:
    """The owner narrows an active grant to a subset of the clusters it allows.

    Widening is refused (a wider set is a new request's to ask for); the caller stops the
    requester's live jobs on a removed cluster after the commit.
    """
    request = _transition(db, actor=actor, user=user, request_id=request_id, action="access.narrow")
    wanted = check_cluster_set(db, clusters=clusters)
    assert wanted is not None  # a list was given
    before = request.clusters
    if before is not None:
        wider = [name for name in wanted if name not in before]
        if wider:
            raise Invalid(
                f"clusters: the grant does not allow {wider[0]!r} now; a grant is only narrowed"
            )
    request.clusters = wanted
    _record_decision(
        db,
        actor=actor,
        action="access.narrow",
        request=request,
        clusters_before=before if before is not None else ANY_CLUSTER,
        clusters=wanted,
    )
    return request, NarrowedGrant(
        request_id=request.id,
        requester_id=request.requester_id,
        dataset_id=request.dataset_id,
    )


def deny(db: Session, *, actor: Actor, user: User, request_id: str) -> AccessRequest:
    """The owner refuses a pending request."""
    request = _transition(db, actor=actor, user=user, request_id=request_id, action="access.deny")
    request.status = AccessStatus.denied
    request.decided_at = utcnow()
    _record_decision(db, actor=actor, action="access.deny", request=request)
    return request


def revoke(
    db: Session, *, actor: Actor, user: User, request_id: str
) -> tuple[AccessRequest, EndedRequest]:
    """The owner ends an active grant; the caller stops the jobs it ended after the commit."""
    request = _transition(db, actor=actor, user=user, request_id=request_id, action="access.revoke")
    ended = _end(db, actor=actor, request=request, status=AccessStatus.revoked, reason="owner")
    return request, ended


def withdraw(
    db: Session, *, actor: Actor, user: User, request_id: str
) -> tuple[AccessRequest, EndedRequest]:
    """The requester takes back a pending request or gives up an active grant (whose jobs the
    caller stops after the commit)."""
    request = _transition(
        db, actor=actor, user=user, request_id=request_id, action="access.withdraw"
    )
    ended = _end(
        db, actor=actor, request=request, status=AccessStatus.withdrawn, reason="requester"
    )
    return request, ended


def _record_decision(
    db: Session, *, actor: Actor, action: str, request: AccessRequest, **details: Any
) -> None:
    audit.record(
        db,
        actor=actor,
        action=action,
        subject=request,
        details={
            "dataset_id": request.dataset_id,
            "requester_id": request.requester_id,
            **details,
        },
    )


def _end(
    db: Session, *, actor: Actor, request: AccessRequest, status: AccessStatus, reason: str
) -> EndedRequest:
    was_granted = request.status == AccessStatus.approved
    request.status = status
    request.ended_at = utcnow()
    action = "access.withdraw" if status == AccessStatus.withdrawn else "access.revoke"
    _record_decision(db, actor=actor, action=action, request=request, reason=reason)
    return EndedRequest(
        request_id=request.id,
        requester_id=request.requester_id,
        dataset_id=request.dataset_id,
        state=status.value,
        was_granted=was_granted,
    )


def _end_live(db: Session, *, actor: Actor, where: Any, reason: str) -> list[EndedRequest]:
    now = utcnow()
    requests = db.scalars(
        select(AccessRequest)
        .where(where, _live_clause(now))
        .with_for_update()
        .execution_options(populate_existing=True)
    ).all()
    return [
        _end(db, actor=actor, request=request, status=AccessStatus.revoked, reason=reason)
        for request in requests
    ]


def end_grants_for_dataset(db: Session, *, actor: Actor, dataset_id: str) -> list[EndedRequest]:
    """Revoke every pending or active request on a dataset (it is being deleted)."""
    return _end_live(
        db, actor=actor, where=AccessRequest.dataset_id == dataset_id, reason="dataset deleted"
    )


def end_grants_of_user(db: Session, *, actor: Actor, user_id: str) -> list[EndedRequest]:
    """Revoke every pending or active request the user made or received (user deleted)."""
    return _end_live(
        db,
        actor=actor,
        where=or_(AccessRequest.requester_id == user_id, AccessRequest.owner_id == user_id),
        reason="user deleted",
    )

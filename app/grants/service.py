"""Access-request rules, and the one door through which jobs read datasets.

States: pending -> approved | denied | withdrawn; approved -> revoked | withdrawn.
An approved request past its `expires_at` is reported as `expired` and grants nothing.
Only the dataset's owner approves, denies and revokes; only the requester withdraws.
"""

from __future__ import annotations

from collections.abc import Iterable
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
from app.db import Page, newest_first, utcnow
from app.errors import Conflict, Forbidden, Invalid, NotFound
from app.grants.models import AccessRequest, AccessStatus
from app.releases import provenance
from app.settings import Settings
from app.unit_of_work import commit_before_raising
from app.workspaces import service as workspaces
from app.workspaces.models import Dataset
from app.workspaces.storage import DatasetReader

EXPIRED = "expired"


@dataclass(frozen=True)
class EndedRequest:
    """An access request a call just ended, for its caller to act on after the commit."""

    request_id: str
    requester_id: str
    dataset_id: str
    state: str  # revoked or withdrawn
    was_granted: bool  # it was an active grant: the requester's live jobs on it must stop


class Direction(StrEnum):
    """Requests the user made, or requests for the user's datasets."""

    incoming = "incoming"
    outgoing = "outgoing"


def status_of(request: AccessRequest, now: datetime | None = None) -> str:
    """The status to report: the stored one, or `expired` for an approved request past its end."""
    if (
        request.status == AccessStatus.approved
        and request.expires_at is not None
        and request.expires_at <= (now or utcnow())
    ):
        return EXPIRED
    return request.status.value


def grant_is_active(request: AccessRequest, now: datetime | None = None) -> bool:
    """Approved and not expired."""
    return status_of(request, now) == AccessStatus.approved.value


def _active_clause(now: datetime) -> Any:
    return (AccessRequest.status == AccessStatus.approved) & (
        AccessRequest.expires_at.is_(None) | (AccessRequest.expires_at > now)
    )


def _live_clause(now: datetime) -> Any:
    return (AccessRequest.status == AccessStatus.pending) | _active_clause(now)


def active_grant_ids_for(db: Session, *, dataset_id: str, user_id: str) -> list[str]:
    """Ids of the approved, unexpired requests that let `user_id` use `dataset_id`."""
    # whole rows, not ids: a grant's seal is checked as it loads (app/seals.py)
    rows = db.scalars(
        select(AccessRequest).where(
            AccessRequest.dataset_id == dataset_id,
            AccessRequest.requester_id == user_id,
            _active_clause(utcnow()),
        )
    )
    return [row.id for row in rows]


def datasets_granted_to(db: Session, *, user_id: str, dataset_ids: list[str]) -> set[str]:
    """Which of `dataset_ids` `user_id` holds an approved, unexpired grant on."""
    if not dataset_ids:
        return set()
    rows = db.scalars(
        select(AccessRequest).where(
            AccessRequest.dataset_id.in_(dataset_ids),
            AccessRequest.requester_id == user_id,
            _active_clause(utcnow()),
        )
    )
    return {row.dataset_id for row in rows}


def _live_dataset(db: Session, dataset_id: str) -> Dataset | None:
    dataset = db.get(Dataset, dataset_id)
    if dataset is None or dataset.deleted_at is not None:
        return None
    return dataset


def _has_any_request(db: Session, *, dataset_id: str, user_id: str) -> bool:
    return (
        db.scalar(
            select(AccessRequest.id)
            .where(AccessRequest.dataset_id == dataset_id, AccessRequest.requester_id == user_id)
            .limit(1)
        )
        is not None
    )


class Usability(StrEnum):
    """Why a user may or may not use a dataset in a job."""

    owner = "owner"
    granted = "granted"
    visible = "visible"  # discoverable, or the user asked for it: 403 rather than 404
    hidden = "hidden"


def _usability(db: Session, *, user_id: str, dataset: Dataset | None) -> Usability:
    if dataset is None:
        return Usability.hidden
    if dataset.owner_id == user_id:
        return Usability.owner
    if active_grant_ids_for(db, dataset_id=dataset.id, user_id=user_id):
        return Usability.granted
    if dataset.discoverable or _has_any_request(db, dataset_id=dataset.id, user_id=user_id):
        return Usability.visible
    return Usability.hidden


@dataclass(frozen=True)
class EndedGrant:
    """A grant that a derived dataset's use rests on, and that no longer holds."""

    grant_id: str | None
    dataset_id: str  # the source the grant was for
    state: str  # revoked, expired, withdrawn; `missing` if no grant was ever recorded

    def describe(self) -> str:
        """What ended, for an error message and a failed job."""
        verb = {EXPIRED: "expired", "missing": "is missing"}.get(self.state, f"was {self.state}")
        return f"access grant {self.grant_id} to dataset {self.dataset_id} {verb}"


def ended_grant_behind(db: Session, *, user_id: str, dataset: Dataset) -> EndedGrant | None:
    """For the user's own unreleased derived dataset: the first source grant that ended."""
    if dataset.owner_id != user_id:
        return None
    for binding in provenance.bindings(db, dataset):
        if active_grant_ids_for(db, dataset_id=binding.source_id, user_id=user_id):
            continue
        request = db.get(AccessRequest, binding.grant_id) if binding.grant_id else None
        state = status_of(request) if request is not None else "missing"
        return EndedGrant(grant_id=binding.grant_id, dataset_id=binding.source_id, state=state)
    return None


def ended_grant_for_inputs(
    db: Session, *, user_id: str, dataset_ids: Iterable[str]
) -> EndedGrant | None:
    """The first grant a job of `user_id` on these inputs rests on that no longer holds.

    For another owner's input, the user's own grant on it; for the user's own derived
    input, the grants of its unreleased sources (`ended_grant_behind`).
    """
    for dataset_id in dict.fromkeys(dataset_ids):
        dataset = db.get(Dataset, dataset_id)
        if dataset is None:
            continue
        if dataset.owner_id == user_id:
            ended = ended_grant_behind(db, user_id=user_id, dataset=dataset)
            if ended is not None:
                return ended
        elif not active_grant_ids_for(db, dataset_id=dataset_id, user_id=user_id):
            latest = db.scalar(
                select(AccessRequest)
                .where(
                    AccessRequest.dataset_id == dataset_id,
                    AccessRequest.requester_id == user_id,
                    AccessRequest.decided_at.is_not(None),
                    AccessRequest.status != AccessStatus.denied,
                )
                .order_by(AccessRequest.decided_at.desc())
                .limit(1)
            )
            return EndedGrant(
                grant_id=latest.id if latest is not None else None,
                dataset_id=dataset_id,
                state=status_of(latest) if latest is not None else "missing",
            )
    return None


def _terms_refusal(db: Session, *, user_id: str, dataset: Dataset) -> str | None:
    """Why derived-data terms keep `user_id` from using the dataset in a job now, or None."""
    if dataset.owner_id != user_id:
        if provenance.needs_release(db, dataset):
            return "this dataset derives from data its sources' owners have not released"
        return None
    ended = ended_grant_behind(db, user_id=user_id, dataset=dataset)
    if ended is None:
        return None
    return f"this dataset derives from data used under {ended.describe()}"


def check_dataset_usable(db: Session, *, user_id: str, dataset_id: str) -> Dataset:
    """The dataset if `user_id` owns it or holds an active grant (for job submission; no audit).

    NotFound when the user cannot see it; Forbidden when visible without an active grant,
    or when it derives from others' data whose grant has ended (named in the message).
    """
    dataset = _live_dataset(db, dataset_id)
    usability = _usability(db, user_id=user_id, dataset=dataset)
    if usability == Usability.hidden or dataset is None:
        raise NotFound()
    if usability == Usability.visible:
        raise Forbidden("no active grant for this dataset")
    refusal = _terms_refusal(db, user_id=user_id, dataset=dataset)
    if refusal is not None:
        raise Forbidden(refusal)
    return dataset


def open_dataset_for_job(
    db: Session, *, user_id: str, dataset_id: str, job_id: str, settings: Settings
) -> DatasetReader:
    """A decrypting reader of the dataset for a job of `user_id`, checked now and audited.

    The grant is checked at the moment of use (an expired or revoked grant refuses) and
    the `dataset.use` event recorded, for the caller to commit before the first byte
    leaves (a denial is committed here, before the error); the reader holds no session.
    NotFound: not visible; Forbidden: visible, no active grant.
    """
    actor = Actor(user_id=user_id)
    dataset = _live_dataset(db, dataset_id)
    usability = _usability(db, user_id=user_id, dataset=dataset)
    refusal = None
    if usability == Usability.visible:
        refusal = "no active grant for this dataset"
    elif dataset is not None and usability != Usability.hidden:
        refusal = _terms_refusal(db, user_id=user_id, dataset=dataset)
    if usability == Usability.hidden or dataset is None or refusal is not None:
        status = 404 if refusal is None else 403
        details: dict[str, Any] = {"job_id": job_id, "status": status}
        if refusal is not None:
            details["reason"] = refusal
        db.rollback()
        audit.record(
            db,
            actor=actor,
            action="dataset.use",
            subject_type="dataset",
            subject_id=dataset_id,
            outcome="denied",
            details=details,
        )
        commit_before_raising(db)
        if refusal is None:
            raise NotFound()
        raise Forbidden(refusal)
    reader = workspaces.reader_for(db, dataset=dataset, settings=settings)
    audit.record(
        db,
        actor=actor,
        action="dataset.use",
        subject=dataset,
        details={
            "job_id": job_id,
            "owner_id": dataset.owner_id,
            "via": usability.value,
            "grant_ids": active_grant_ids_for(db, dataset_id=dataset.id, user_id=user_id),
        },
    )
    return reader


# ----------------------------------------------------------------- requests and decisions


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
    dataset = _live_dataset(db, request.dataset_id)
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


# ------------------------------------------------------------------------------ listing


@dataclass(frozen=True)
class RequestView:
    """A request with the names the UI shows next to it."""

    request: AccessRequest
    dataset_name: str
    dataset_kind: str
    requester_email: str
    requester_display_name: str
    owner_display_name: str
    dataset_default_clusters: list[str] | None


def shown_clusters(request: AccessRequest) -> list[str] | str | None:
    """Where a request's data may go as its answer says it: the set, "any", or None until it
    was approved (a denied request never allowed any)."""
    if request.clusters is not None:
        return list(request.clusters)
    approved = request.decided_at is not None and request.status != AccessStatus.denied
    return ANY_CLUSTER if approved else None


def _views(db: Session, requests: list[AccessRequest]) -> list[RequestView]:
    dataset_ids = {r.dataset_id for r in requests}
    user_ids = {r.requester_id for r in requests} | {r.owner_id for r in requests}
    datasets = (
        {d.id: d for d in db.scalars(select(Dataset).where(Dataset.id.in_(dataset_ids)))}
        if dataset_ids
        else {}
    )
    users = (
        {u.id: u for u in db.scalars(select(User).where(User.id.in_(user_ids)))} if user_ids else {}
    )
    return [
        RequestView(
            request=r,
            dataset_name=datasets[r.dataset_id].name,
            dataset_kind=datasets[r.dataset_id].kind.value,
            requester_email=users[r.requester_id].email,
            requester_display_name=users[r.requester_id].display_name,
            owner_display_name=users[r.owner_id].display_name,
            dataset_default_clusters=datasets[r.dataset_id].default_clusters,
        )
        for r in requests
    ]


def view(db: Session, request: AccessRequest) -> RequestView:
    """One request with its display names."""
    return _views(db, [request])[0]


def list_for(
    db: Session,
    *,
    user: User,
    direction: Direction | None,
    status: str | None,
    page: Page,
) -> tuple[list[RequestView], int]:
    """The user's requests (outgoing), requests for the user's datasets (incoming), or both."""
    if direction == Direction.incoming:
        where: Any = AccessRequest.owner_id == user.id
    elif direction == Direction.outgoing:
        where = AccessRequest.requester_id == user.id
    else:
        where = or_(AccessRequest.owner_id == user.id, AccessRequest.requester_id == user.id)
    now = utcnow()
    if status == EXPIRED:
        where = where & (AccessRequest.status == AccessStatus.approved)
        where = where & AccessRequest.expires_at.is_not(None) & (AccessRequest.expires_at <= now)
    elif status == AccessStatus.approved.value:
        where = where & _active_clause(now)
    elif status is not None:
        where = where & (AccessRequest.status == AccessStatus(status))
    items, total = newest_first(db, AccessRequest, where, page=page)
    return _views(db, items), total

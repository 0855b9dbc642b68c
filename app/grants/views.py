"""The lists of access requests, with the names the UI shows next to each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.accounts.models import User
from app.clusters.service import ANY_CLUSTER
from app.db import Page, newest_first, utcnow
from app.grants.access import EXPIRED, active_clause
from app.grants.models import AccessRequest, AccessStatus
from app.grants.service import Direction
from app.workspaces.models import Dataset


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
        where = where & active_clause(now)
    elif status is not None:
        where = where & (AccessRequest.status == AccessStatus(status))
    items, total = newest_first(db, AccessRequest, where, page=page)
    return _views(db, items), total

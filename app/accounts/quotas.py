"""Quotas per user, over all their workspaces: how many workspaces, bytes and running jobs.

Per-workspace quotas alone let one member make many workspaces (22 made 220 GiB and
44 concurrent jobs). Every rule reads the user's totals under the user's row lock, taken
before any workspace's (one order everywhere, so two rules never deadlock).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts.models import User
from app.audit import service as audit
from app.audit.service import Actor
from app.jobs.models import Job, JobStatus
from app.settings import Settings
from app.workspaces.models import Workspace

ACTIVE = (JobStatus.queued, JobStatus.running)  # as the per-workspace rule counts them


@dataclass(frozen=True)
class UserQuota:
    """The limits in force for one user."""

    max_workspaces: int
    storage_bytes_limit: int
    max_concurrent_jobs: int
    roles_per_cluster: int  # role slots held on one cluster at once (app.jobs.fairshare)


def quota_of(user: User, settings: Settings) -> UserQuota:
    """The user's own limits, or the settings' defaults where none is set."""
    return UserQuota(
        max_workspaces=_or(user.max_workspaces, settings.default_user_max_workspaces),
        storage_bytes_limit=_or(
            user.storage_bytes_limit, settings.default_user_storage_bytes_limit
        ),
        max_concurrent_jobs=_or(
            user.max_concurrent_jobs, settings.default_user_max_concurrent_jobs
        ),
        roles_per_cluster=_or(user.roles_per_cluster, settings.default_roles_per_cluster),
    )


def _or(value: int | None, default: int) -> int:
    return default if value is None else value


def lock_user(db: Session, *, user_id: str) -> User | None:
    """The user re-read under a row lock (FOR UPDATE; SQLite's writers are serialized)."""
    return db.scalar(
        select(User)
        .where(User.id == user_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )


def storage_used(db: Session, *, user_id: str) -> int:
    """Bytes the user's workspaces hold, together."""
    total = db.scalar(
        select(func.coalesce(func.sum(Workspace.storage_bytes_used), 0)).where(
            Workspace.owner_id == user_id
        )
    )
    return int(total or 0)


def workspace_count(db: Session, *, user_id: str) -> int:
    """How many workspaces the user owns."""
    return int(
        db.scalar(select(func.count()).select_from(Workspace).where(Workspace.owner_id == user_id))
        or 0
    )


def active_jobs(db: Session, *, user_id: str) -> int:
    """How many of the user's jobs are queued or running, in any workspace."""
    return int(
        db.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.owner_id == user_id, Job.status.in_(ACTIVE))
        )
        or 0
    )


@dataclass(frozen=True)
class QuotaUsage:
    """A user's limits and what they use of them now."""

    quota: UserQuota
    workspaces: int
    storage_bytes_used: int
    active_jobs: int


def usage(db: Session, *, user: User, settings: Settings) -> QuotaUsage:
    """The user's limits beside their current totals."""
    return QuotaUsage(
        quota=quota_of(user, settings),
        workspaces=workspace_count(db, user_id=user.id),
        storage_bytes_used=storage_used(db, user_id=user.id),
        active_jobs=active_jobs(db, user_id=user.id),
    )


def set_quota(
    db: Session,
    *,
    actor: Actor,
    user: User,
    max_workspaces: int | None,
    storage_bytes_limit: int | None,
    max_concurrent_jobs: int | None,
    roles_per_cluster: int | None = None,
) -> User:
    """Set any of a user's limits (admins only; the route enforces the role)."""
    changes = apply_limits(
        user,
        max_workspaces=max_workspaces,
        storage_bytes_limit=storage_bytes_limit,
        max_concurrent_jobs=max_concurrent_jobs,
        roles_per_cluster=roles_per_cluster,
    )
    audit.record(db, actor=actor, action="user.quota", subject=user, details=changes)
    return user


def apply_limits(row: User | Workspace, **limits: int | None) -> dict[str, int]:
    """Set on `row` each of `limits` that is given (not None); those set, for the audit event."""
    changes = {name: value for name, value in limits.items() if value is not None}
    for name, value in changes.items():
        setattr(row, name, value)
    return changes

"""Workspace rules: ownership, quotas, the workspace data keys."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from app.accounts import quotas
from app.accounts.models import Role, User
from app.audit import service as audit
from app.audit.service import Actor
from app.db import NewestFirst, Page, new_id
from app.errors import Conflict, Forbidden, NotFound, QuotaExceeded
from app.settings import Settings
from app.workspaces import storage
from app.workspaces.models import Dataset, Workspace
from app.workspaces.storage import DatasetReader

PERSONAL_WORKSPACE_NAME = "personal"


def create(
    db: Session,
    *,
    actor: Actor,
    owner: User,
    name: str,
    settings: Settings,
    personal: bool = False,
) -> Workspace:
    """A new workspace for `owner` with the default quotas."""
    if owner.role == Role.auditor and not personal:
        raise Forbidden("auditors have a read-only role")
    if not personal:
        locked = quotas.lock_user(db, user_id=owner.id)
        limit = quotas.quota_of(locked or owner, settings).max_workspaces
        held = quotas.workspace_count(db, user_id=owner.id)
        if held >= limit:
            raise QuotaExceeded(f"you have {held} workspaces, your quota is {limit}")
    taken = db.scalar(
        select(Workspace.id).where(Workspace.owner_id == owner.id, Workspace.name == name)
    )
    if taken is not None:
        raise Conflict("you already have a workspace with this name")
    workspace_id = new_id()
    workspace = Workspace(
        id=workspace_id,
        data_key_wrapped=_new_wrapped_key(workspace_id, settings),
        owner_id=owner.id,
        name=name,
        is_personal=personal,
        storage_bytes_limit=settings.default_storage_bytes_limit,
        max_concurrent_jobs=settings.default_max_concurrent_jobs,
    )
    return audit.record_creation(
        db,
        workspace,
        actor=actor,
        action="workspace.create",
        details={"owner_id": owner.id, "personal": personal},
    )


_OWNED = NewestFirst(Workspace, Workspace.owner_id == bindparam("owner_id"))


def list_owned(db: Session, *, owner_id: str, page: Page) -> tuple[list[Workspace], int]:
    """Workspaces of one owner, newest first."""
    return _OWNED(db, owner_id=owner_id, page=page)


def delete(db: Session, *, actor: Actor, workspace: Workspace) -> None:
    """Delete a workspace that is not the owner's personal one and holds no datasets."""
    if workspace.is_personal:
        raise Conflict("the personal workspace cannot be deleted")
    held = db.scalar(
        select(func.count())
        .select_from(Dataset)
        .where(Dataset.workspace_id == workspace.id, Dataset.deleted_at.is_(None))
    )
    if held:
        raise Conflict("the workspace still holds datasets; delete them first")
    db.delete(workspace)
    audit.record(db, actor=actor, action="workspace.delete", subject=workspace)


def set_quota(
    db: Session,
    *,
    actor: Actor,
    workspace_id: str,
    storage_bytes_limit: int | None,
    max_concurrent_jobs: int | None,
) -> Workspace:
    """Change a workspace's quotas (admins only; the route enforces the role)."""
    workspace = db.get(Workspace, workspace_id)
    if workspace is None:
        raise NotFound()
    changes = quotas.apply_limits(
        workspace, storage_bytes_limit=storage_bytes_limit, max_concurrent_jobs=max_concurrent_jobs
    )
    audit.record(db, actor=actor, action="workspace.quota", subject=workspace, details=changes)
    return workspace


def dataset_path(settings: Settings, dataset_id: str) -> Path:
    """Where a dataset's encrypted file lives: named by its id, never by a user string."""
    return settings.resolved_data_dir / "datasets" / f"{dataset_id}.enc"


def upload_tmp_dir(settings: Settings) -> Path:
    """Where uploads are written while they stream."""
    return settings.resolved_data_dir / "tmp"


def lock(db: Session, *, workspace_id: str) -> Workspace | None:
    """The workspace re-read from the database under a row lock, for read-then-write rules.

    PostgreSQL takes the row lock (FOR UPDATE); on SQLite every writing transaction already
    holds the database's write lock (BEGIN IMMEDIATE, app/db.py), and FOR UPDATE is omitted.
    """
    return db.scalar(
        select(Workspace)
        .where(Workspace.id == workspace_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    )


def _new_wrapped_key(workspace_id: str, settings: Settings) -> bytes:
    master = storage.master_key(settings.secret())
    return storage.wrap_data_key(master, storage.new_data_key(), workspace_id=workspace_id)


def data_key(db: Session, *, workspace: Workspace, settings: Settings) -> bytes:
    """The workspace's data key in clear; made (under the row lock) for older workspaces.

    A key made here is flushed, not committed: the caller commits.
    """
    wrapped = workspace.data_key_wrapped
    if wrapped is None:
        locked = lock(db, workspace_id=workspace.id)
        if locked is None:
            raise NotFound()
        if locked.data_key_wrapped is None:
            locked.data_key_wrapped = _new_wrapped_key(locked.id, settings)
            db.flush()
        wrapped = locked.data_key_wrapped
    return storage.unwrap_data_key(
        storage.master_key(settings.secret()), wrapped, workspace_id=workspace.id
    )


def reader_for(db: Session, *, dataset: Dataset, settings: Settings) -> DatasetReader:
    """A decrypting reader of a dataset's stored file under its workspace's key (the caller
    has checked access); NotFound when the workspace is gone."""
    workspace = db.get(Workspace, dataset.workspace_id) if dataset.workspace_id else None
    if workspace is None:
        raise NotFound()
    return DatasetReader(
        dataset_id=dataset.id,
        name=dataset.name,
        kind=dataset.kind.value,
        size_bytes=dataset.size_bytes,
        sha256=dataset.sha256,
        path=dataset_path(settings, dataset.id),
        data_key=data_key(db, workspace=workspace, settings=settings),
    )

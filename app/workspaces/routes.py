"""HTTP routes of workspaces."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, status

from app import ownership
from app.accounts.models import Role
from app.deps import AdminDep, CallerDep, PageDep, SessionDep, SettingsDep, WriterDep
from app.errors import Conflict, Forbidden, QuotaExceeded, raises
from app.fields import UUID_PATTERN
from app.path_params import WorkspaceIdPath
from app.routing import api_router
from app.workspaces import service
from app.workspaces.models import Workspace
from app.workspaces.schemas import (
    QuotaIn,
    WorkspaceCreateIn,
    WorkspaceList,
    WorkspaceOut,
)

router = api_router("workspaces")


@router.get("/workspaces", response_model=WorkspaceList)
@raises(Forbidden)
def list_workspaces(
    caller: CallerDep,
    db: SessionDep,
    page: PageDep,
    owner_id: Annotated[str | None, Query(pattern=UUID_PATTERN)] = None,
) -> WorkspaceList:
    """The caller's workspaces; admins may ask for another owner's."""
    if owner_id is not None and owner_id != caller.user_id and caller.role != Role.admin:
        raise Forbidden("admin role required to list another user's workspaces")
    items, total = service.list_owned(db, owner_id=owner_id or caller.user_id, page=page)
    return WorkspaceList(items=[WorkspaceOut.model_validate(w) for w in items], total=total)


@router.post("/workspaces", response_model=WorkspaceOut, status_code=status.HTTP_201_CREATED)
@raises(Conflict, QuotaExceeded)
def create_workspace(
    body: WorkspaceCreateIn, caller: WriterDep, db: SessionDep, settings: SettingsDep
) -> WorkspaceOut:
    """A new workspace with the default quotas."""
    workspace = service.create(
        db, actor=caller.actor, owner=caller.user, name=body.name, settings=settings
    )
    db.commit()
    return WorkspaceOut.model_validate(workspace)


@router.get("/workspaces/{workspace_id}", response_model=WorkspaceOut)
def get_workspace(workspace_id: WorkspaceIdPath, caller: CallerDep, db: SessionDep) -> WorkspaceOut:
    """One of the caller's workspaces."""
    workspace = ownership.get_owned(
        db, Workspace, workspace_id, actor=caller.actor, user=caller.identity
    )
    return WorkspaceOut.model_validate(workspace)


@router.delete("/workspaces/{workspace_id}", status_code=status.HTTP_204_NO_CONTENT)
@raises(Conflict)
def delete_workspace(workspace_id: WorkspaceIdPath, caller: CallerDep, db: SessionDep) -> None:
    """Delete one of the caller's workspaces (not the personal one)."""
    workspace = ownership.get_owned(
        db, Workspace, workspace_id, actor=caller.actor, user=caller.identity
    )
    service.delete(db, actor=caller.actor, workspace=workspace)
    db.commit()


@router.patch("/workspaces/{workspace_id}/quota", response_model=WorkspaceOut)
def set_quota(
    workspace_id: WorkspaceIdPath, body: QuotaIn, caller: AdminDep, db: SessionDep
) -> WorkspaceOut:
    """Change a workspace's quotas (admins)."""
    workspace = service.set_quota(
        db,
        actor=caller.actor,
        workspace_id=workspace_id,
        storage_bytes_limit=body.storage_bytes_limit,
        max_concurrent_jobs=body.max_concurrent_jobs,
    )
    db.commit()
    return WorkspaceOut.model_validate(workspace)

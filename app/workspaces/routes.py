"""HTTP routes of workspaces."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from app.accounts.models import Role
from app.deps import API_PREFIX, AdminDep, CallerDep, PageDep, SessionDep, SettingsDep, WriterDep
from app.errors import Forbidden
from app.workspaces import service
from app.workspaces.schemas import QuotaIn, WorkspaceCreateIn, WorkspaceList, WorkspaceOut

router = APIRouter(prefix=API_PREFIX, tags=["workspaces"])


@router.get("/workspaces", response_model=WorkspaceList)
def list_workspaces(
    caller: CallerDep,
    db: SessionDep,
    page: PageDep,
    owner_id: Annotated[str | None, Query(max_length=64)] = None,
) -> WorkspaceList:
    """The caller's workspaces; admins may ask for another owner's."""
    if owner_id is not None and owner_id != caller.user.id and caller.user.role != Role.admin:
        raise Forbidden("admin role required to list another user's workspaces")
    items, total = service.list_owned(
        db, owner_id=owner_id or caller.user.id, limit=page.limit, offset=page.offset
    )
    return WorkspaceList(items=[WorkspaceOut.model_validate(w) for w in items], total=total)


@router.post("/workspaces", response_model=WorkspaceOut, status_code=status.HTTP_201_CREATED)
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
def get_workspace(workspace_id: str, caller: CallerDep, db: SessionDep) -> WorkspaceOut:
    """One of the caller's workspaces."""
    workspace = service.get_owned(
        db, actor=caller.actor, user=caller.user, workspace_id=workspace_id
    )
    return WorkspaceOut.model_validate(workspace)


@router.delete("/workspaces/{workspace_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_workspace(workspace_id: str, caller: CallerDep, db: SessionDep) -> None:
    """Delete one of the caller's workspaces (not the personal one)."""
    workspace = service.get_owned(
        db, actor=caller.actor, user=caller.user, workspace_id=workspace_id
    )
    service.delete(db, actor=caller.actor, workspace=workspace)
    db.commit()


@router.patch("/workspaces/{workspace_id}/quota", response_model=WorkspaceOut)
def set_quota(workspace_id: str, body: QuotaIn, caller: AdminDep, db: SessionDep) -> WorkspaceOut:
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

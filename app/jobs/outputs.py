"""A job's outputs enter its owner's workspace the way an upload does: encrypted, counted."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.orm import Session

from app.audit.service import Actor
from app.db import new_id
from app.errors import NotFound
from app.settings import Settings
from app.workspaces import datasets
from app.workspaces import service as workspaces
from app.workspaces.models import DatasetKind, Workspace

CHUNK = 1024 * 1024


def store_job_output(
    db: Session,
    *,
    job_id: str,
    workspace_id: str,
    owner_id: str,
    name: str,
    kind: str,
    path: Path,
    settings: Settings,
) -> str:
    """Encrypt a file a job wrote into its workspace as a dataset; returns its id (413: quota)."""
    workspace = db.get(Workspace, workspace_id)
    if workspace is None or workspace.owner_id != owner_id:
        raise NotFound()
    dataset_id = new_id()
    plan = datasets.UploadPlan(
        workspace_id=workspace.id,
        owner_id=owner_id,
        dataset_id=dataset_id,
        data_key=workspaces.data_key(db, workspace=workspace, settings=settings),
        size_limit=settings.max_upload_bytes,
        quota_left=max(0, workspace.storage_bytes_limit - workspace.storage_bytes_used),
        tmp_path=workspaces.upload_tmp_dir(settings) / f"{new_id()}.part",
        final_path=workspaces.dataset_path(settings, dataset_id),
    )
    db.commit()
    dataset_kind = DatasetKind(kind)
    incoming = datasets.IncomingFile(plan)
    incoming.validate_as(dataset_kind)
    try:
        with path.open("rb") as source:
            while chunk := source.read(CHUNK):
                incoming.write(chunk)
        incoming.complete(dataset_kind)
        dataset = datasets.finish_upload(
            db,
            actor=Actor(user_id=owner_id),
            plan=plan,
            incoming=incoming,
            fields=datasets.UploadFields(name=name, kind=dataset_kind, discoverable=False),
        )
    finally:
        incoming.discard()
    return dataset.id

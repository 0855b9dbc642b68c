"""A job's outputs enter its owner's workspace the way an upload does: encrypted, counted."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlalchemy.orm import Session

from app.audit.service import Actor
from app.db import new_id
from app.errors import NotFound
from app.settings import Settings
from app.workspaces import datasets
from app.workspaces import service as workspaces
from app.workspaces.models import DatasetKind, Workspace


def store_job_output(
    db: Session,
    *,
    job_id: str,
    workspace_id: str,
    owner_id: str,
    name: str,
    kind: str,
    chunks: Iterable[bytes],
    settings: Settings,
    before_commit: Callable[[], None] | None = None,
) -> tuple[str, int]:
    """Encrypt streamed bytes a job wrote into its workspace as a dataset; (id, size).

    413 as soon as the stream outgrows the owner's quota; `before_commit` may still refuse
    (raise) once the bytes are in, e.g. when the attempt was fenced out meanwhile.
    """
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
    db.commit()  # nothing held while the bytes stream in
    dataset_kind = DatasetKind(kind)
    incoming = datasets.IncomingFile(plan)
    incoming.validate_as(dataset_kind)
    try:
        for chunk in chunks:
            incoming.write(chunk)
        incoming.complete(dataset_kind)
        if before_commit is not None:
            before_commit()
        dataset = datasets.finish_upload(
            db,
            actor=Actor(user_id=owner_id),
            plan=plan,
            incoming=incoming,
            fields=datasets.UploadFields(name=name, kind=dataset_kind, discoverable=False),
        )
    finally:
        incoming.discard()
    return dataset.id, dataset.size_bytes

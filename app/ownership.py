"""Rows that belong to their owner alone: to anyone else they do not exist (404, audited).

A stranger's look-up of a workspace or a job is answered as if the row were missing, and
recorded as a denied `workspace.access` or `job.access`. (A dataset is seen by the holders
of its grants too: app/datasets/service.py.)
"""

from __future__ import annotations

from typing import NoReturn, TypeVar

from sqlalchemy.orm import Session

from app.accounts.models import Identity, User
from app.audit import service as audit
from app.audit.service import Actor
from app.db import owner_of
from app.jobs.models import Job
from app.workspaces.models import Workspace

OwnedRow = TypeVar("OwnedRow", Job, Workspace)


def get_owned(
    db: Session, model: type[OwnedRow], row_id: str, *, actor: Actor, user: User | Identity
) -> OwnedRow:
    """The `model` row if `user` owns it; NotFound (audited) otherwise."""
    row = db.get(model, row_id)
    if row is None or row.owner_id != user.id:
        _deny(db, model, row_id, actor)
    return row


def check_owned(
    db: Session, model: type[Job | Workspace], row_id: str, *, actor: Actor, user: User | Identity
) -> None:
    """NotFound (audited) unless `user` owns the `model` row; reads its owner alone.

    A workspace is loaded whole instead: its owner is sealed (app/seals.py), and the
    seal is checked on load.
    """
    if model is Workspace:
        get_owned(db, Workspace, row_id, actor=actor, user=user)
        return
    if owner_of(db, model, row_id) != user.id:
        _deny(db, model, row_id, actor)


def _deny(db: Session, model: type[Job | Workspace], row_id: str, actor: Actor) -> NoReturn:
    audit.deny(
        db,
        actor=actor,
        action=f"{model.audit_type}.access",
        subject_type=model.audit_type,
        subject_id=row_id,
    )

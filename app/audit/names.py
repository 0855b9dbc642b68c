"""What the ids of audit events name, looked up when the log is listed for an auditor.

The chained events keep ids only (a rename must not rewrite history); the listing puts the
person's email and display name, and the dataset's, job's, workspace's or cluster's name
as they are now, beside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts.models import User
from app.audit.models import AuditEvent
from app.clusters.models import Cluster
from app.jobs.models import Job
from app.workspaces.models import Dataset, Workspace


@dataclass(frozen=True)
class Person:
    """Who a user id is."""

    email: str
    display_name: str


@dataclass(frozen=True)
class Names:
    """The people and the named things a page of events mentions."""

    people: dict[str, Person]
    subjects: dict[tuple[str, str], str]  # (subject type, id) -> name

    def actor(self, event: AuditEvent) -> Person | None:
        """The person who acted, if a user did."""
        return self.people.get(event.actor_id) if event.actor_id else None

    def subject(self, event: AuditEvent) -> tuple[str | None, str | None]:
        """The subject's name, and its email when it is a user."""
        if not event.subject_type or not event.subject_id:
            return None, None
        if event.subject_type == "user":
            person = self.people.get(event.subject_id)
            return (person.display_name, person.email) if person else (None, None)
        return self.subjects.get((event.subject_type, event.subject_id)), None


# subject type -> (its id column, the column an auditor reads it by); a job's kind is its name
_NAMED: dict[str, tuple[Any, Any]] = {
    "dataset": (Dataset.id, Dataset.name),
    "job": (Job.id, Job.kind),
    "workspace": (Workspace.id, Workspace.name),
    "cluster": (Cluster.id, Cluster.name),
}


def _ids(events: Sequence[AuditEvent], subject_type: str) -> set[str]:
    return {e.subject_id for e in events if e.subject_type == subject_type and e.subject_id}


def resolve(db: Session, events: Sequence[AuditEvent]) -> Names:
    """The names behind the actors and subjects of `events`, in one query per kind."""
    user_ids = {e.actor_id for e in events if e.actor_id} | _ids(events, "user")
    people = {
        row.id: Person(email=row.email, display_name=row.display_name)
        for row in db.execute(
            select(User.id, User.email, User.display_name).where(User.id.in_(user_ids))
        )
    }
    subjects: dict[tuple[str, str], str] = {}
    for subject_type, (id_column, name_column) in _NAMED.items():
        ids = _ids(events, subject_type)
        if not ids:
            continue
        rows = db.execute(select(id_column, name_column).where(id_column.in_(ids)))
        subjects.update({(subject_type, found_id): name for found_id, name in rows})
    return Names(people=people, subjects=subjects)

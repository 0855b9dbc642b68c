"""Holding a user's queued jobs while the account is suspended.

Apart from the job service so that accounts, which suspends and reactivates, can import it
without the rest of the jobs domain: it touches the jobs' table and nothing else.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.jobs.models import Job
from app.jobs.states import JobStatus


def set_paused_for_owner(db: Session, *, owner_id: str, paused: bool) -> int:
    """Hold (or release) the queued jobs of a user, e.g. while they are suspended."""
    result = db.execute(
        update(Job)
        .where(Job.owner_id == owner_id, Job.status == JobStatus.queued)
        .values(paused=paused)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]

"""Celery tasks: thin. Ids in, the runner does the work, state lives in the database."""

from __future__ import annotations

from celery import shared_task

from app.settings import get_settings
from workers.celery_app import RUN_ROLE_TASK
from workers.runner import run_role
from workers.worker_state import current_side

# Long enough for a `tiny` job many times over; a `paper` job raises it through settings.
ROLE_TIME_LIMIT_S = 24 * 3600


@shared_task(name=RUN_ROLE_TASK, acks_late=True, time_limit=ROLE_TIME_LIMIT_S, ignore_result=True)
def run_role_task(job_id: str, role: str, attempt: int, token: str) -> str:
    """Run one role of one attempt of a job on this worker's cluster."""
    return run_role(
        job_id=job_id,
        role=role,
        attempt=attempt,
        token=token,
        side=current_side(),
        settings=get_settings(),
    )

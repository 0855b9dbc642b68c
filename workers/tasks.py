"""Celery tasks: thin. Ids in, the runner does the work through the cluster API."""

from __future__ import annotations

import logging
import os
import signal

from celery import shared_task

from contract.queues import RUN_ROLE_TASK
from workers.runner import CredentialRefused, run_role
from workers.worker_state import current_side, main_pid

# Long enough for a `tiny` job many times over; a `paper` job raises it through settings.
ROLE_TIME_LIMIT_S = 24 * 3600

log = logging.getLogger("nebula.worker")


@shared_task(name=RUN_ROLE_TASK, acks_late=True, time_limit=ROLE_TIME_LIMIT_S, ignore_result=True)
def run_role_task(job_id: str, role: str, attempt: int) -> str:
    """Run one role of one attempt of a job on this worker's cluster."""
    try:
        return run_role(job_id=job_id, role=role, attempt=attempt, side=current_side())
    except CredentialRefused as exc:
        # the admin revoked this cluster's credential: this worker stops taking tasks
        log.error("the control plane refused this worker's credential (%s); shutting down", exc)
        os.kill(main_pid(), signal.SIGTERM)
        return "refused"

"""Handing roles to their clusters' queues, and the reaper that keeps jobs moving.

The job row and its roles are committed first (status `pending`), then fair share
(`schedule`, deciding by app.jobs.fairshare) gives the job all its role slots at once
or records why it waits; only then is each role sent to its queue and marked
`dispatched`. If sending fails, the reaper sends it later: no job without its tasks.
A task whose row is gone or whose attempt is stale does nothing: no task without its
row. A placed job holds its slots until it ends (a restarted attempt keeps them).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from datetime import timedelta

from sqlalchemy import select, text
from sqlalchemy.orm import Session, sessionmaker

from app.accounts import service as accounts
from app.accounts.models import User
from app.audit import service as audit
from app.audit.service import SYSTEM
from app.clusters import service as clusters
from app.db import begin_writing, session_scope, utcnow
from app.jobs import attempts, service
from app.jobs.fairshare import SlotJob, fair_order
from app.jobs.models import Job, JobRole, RoleStatus
from app.jobs.states import FINAL_STATUSES
from app.settings import Settings
from common.broker import celery_for
from contract.queues import RUN_ROLE_TASK, queue_for

log = logging.getLogger("nebula.jobs")


def _send(settings: Settings, *, job_id: str, role: str, attempt: int, cluster: str) -> None:
    # ids only: the role claims its attempt through the cluster API and gets its job
    # token there, so no credential ever sits in the broker
    celery_for(settings.var_dir, settings.broker_url).send_task(
        RUN_ROLE_TASK, args=[job_id, role, attempt], queue=queue_for(cluster)
    )


def dispatch_job(db: Session, *, settings: Settings, job_id: str) -> int:
    """Send the job's pending roles of its live attempt to their queues; returns how many.

    Called after the commit of the job's rows; the caller commits the roles marked sent.
    """
    job = db.get(Job, job_id)
    if job is None or job.status in FINAL_STATUSES or job.paused or job.placed_at is None:
        return 0
    # The request that wrote the job and the reaper may dispatch it at once: each takes
    # the pending rows it marks, and skips those another dispatcher holds until it
    # commits (then they are no longer pending), so that no role is sent twice. A role
    # sent twice is claimed twice, and its second run, refused by the switch while the
    # first holds its link, fails the attempt. (SQLite serializes writers already.)
    roles = db.scalars(
        select(JobRole)
        .where(
            JobRole.job_id == job_id,
            JobRole.attempt == job.attempt,
            JobRole.status == RoleStatus.pending,
        )
        .with_for_update(skip_locked=True)
    ).all()
    sent = 0
    for row in roles:
        try:
            _send(settings, job_id=job.id, role=row.role, attempt=job.attempt, cluster=row.cluster)
        except Exception:  # the broker is down: the reaper tries again
            log.exception("could not enqueue role %s of job %s", row.role, job.id)
            continue
        row.status, row.dispatched_at = RoleStatus.dispatched, utcnow()
        sent += 1
    return sent


# any constant: the transaction-scoped lock that lets one scheduler decide at a time
_SCHEDULE_LOCK = 0x6E656275


def _lock_queue(db: Session) -> None:
    """One scheduler at a time (the submitting request, the reaper, a finishing role)."""
    begin_writing(db)  # SQLite: writers take turns already
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEDULE_LOCK})


def _slot_job(job: Job, demand: dict[str, int]) -> SlotJob:
    return SlotJob(job_id=job.id, tenant=job.owner_id, demand=demand)


def schedule(db: Session, *, settings: Settings) -> list[str]:
    """Give queued jobs their role slots in fair order; record why the others wait, and fail
    those that waited past the queue timeout. Returns the jobs placed; not committed."""
    _lock_queue(db)
    live = db.scalars(
        select(Job)
        .where(Job.status.in_(service.ACTIVE_STATUSES))
        .order_by(Job.created_at, Job.id)
        .execution_options(populate_existing=True)
    ).all()
    if not live:
        return []
    demand: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job_id, cluster in db.execute(
        select(JobRole.job_id, JobRole.cluster).where(JobRole.job_id.in_([j.id for j in live]))
    ):
        demand[job_id][cluster] += 1
    queued = [j for j in live if j.placed_at is None and not j.paused]
    running = [j for j in live if j.placed_at is not None]
    if not queued:
        return []
    owners = {j.owner_id for j in live}
    limits = {
        user_id: limit if limit is not None else settings.default_roles_per_cluster
        for user_id, limit in db.execute(
            select(User.id, User.roles_per_cluster).where(User.id.in_(owners))
        )
    }
    decision = fair_order(
        queue=[_slot_job(j, dict(demand[j.id])) for j in queued],
        running=[_slot_job(j, dict(demand[j.id])) for j in running],
        capacity=clusters.role_slots(db, settings=settings),
        limits=limits,
    )
    now = utcnow()
    started = set(decision.start)
    timeout = timedelta(seconds=settings.queue_timeout_s)
    for job in queued:
        if job.id in started:
            job.placed_at, job.waiting = now, None
            audit.record(
                db, actor=SYSTEM, action="job.place", subject=job, details=dict(demand[job.id])
            )
            continue
        wait = decision.waiting[job.id]
        if now - job.created_at >= timeout:
            service.fail_job(
                db,
                job,
                error=f"waited past the queue timeout ({settings.queue_timeout_s:g} s); "
                f"{wait.describe()}",
                details={"reason": "queue_timeout", "waiting": wait.describe()},
            )
            continue
        shown = {
            "reason": wait.describe(),
            "position": wait.position,
            "cluster": wait.cluster,
            "kind": wait.kind.value,
        }
        if job.waiting != shown:
            job.waiting = shown
    return [job_id for job_id in decision.start]


def schedule_and_dispatch(db: Session, *, settings: Settings) -> list[str]:
    """Place what fair share allows now and send the placed jobs' roles; commits."""
    started = schedule(db, settings=settings)
    db.commit()
    for job_id in started:
        dispatch_job(db, settings=settings, job_id=job_id)
        db.commit()
    return started


def reap_once(db: Session, *, settings: Settings) -> None:
    """Restart attempts whose roles stopped beating, place queued jobs, and dispatch whatever
    is pending."""
    timeout = timedelta(seconds=settings.heartbeat_timeout_s)
    service.fail_jobs_whose_grants_ended(db)
    for job, role in attempts.stale_roles(db, older_than=timeout):
        log.warning("role %s of job %s stopped beating; restarting the attempt", role.role, job.id)
        attempts.restart_attempt(db, job=job, reason=f"role {role.role} stopped (no heartbeat)")
    db.commit()
    schedule(db, settings=settings)
    db.commit()
    pending = db.scalars(
        select(JobRole.job_id).where(JobRole.status == RoleStatus.pending).distinct()
    ).all()
    for job_id in pending:
        dispatch_job(db, settings=settings, job_id=job_id)
        db.commit()


class Reaper:
    """A background thread that runs `reap_once` every few seconds."""

    def __init__(self, factory: sessionmaker[Session], settings: Settings) -> None:
        self.factory = factory
        self.settings = settings
        self.interval_s = settings.reaper_interval_s
        self._next_purge = 0.0  # monotonic time of the next housekeeping pass
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nebula-reaper", daemon=True)

    def start(self) -> Reaper:
        self._thread.start()
        log.info("reaper started (pid %d)", os.getpid())
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for db in session_scope(self.factory):
                    reap_once(db, settings=self.settings)
                    if time.monotonic() >= self._next_purge:
                        self._next_purge = time.monotonic() + self.settings.purge_interval_s
                        purged = accounts.purge_expired(db, settings=self.settings)
                        db.commit()
                        log.info(
                            "housekeeping: %d expired login failures and tokens purged", purged
                        )
            except Exception:
                log.exception("reaper pass failed")

"""Jobs, their roles on clusters, metrics and artifacts."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, CreatedAt, NewId, utcnow
from app.jobs.states import JobStatus, RoleStatus


class Job(Base):
    """A validated configuration of Nebula's own training code, split into roles."""

    __tablename__ = "jobs"
    audit_type: ClassVar[str] = "job"
    __table_args__ = (Index("ix_jobs_workspace_status", "workspace_id", "status"),)

    id: Mapped[NewId]
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"), index=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[JobStatus] = mapped_column(default=JobStatus.queued)
    paused: Mapped[bool] = mapped_column(default=False)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    inputs: Mapped[dict[str, str]] = mapped_column(JSON)
    placement: Mapped[dict[str, str]] = mapped_column(JSON)
    # Every restart of the job's roles is a new attempt; older attempts are fenced out.
    attempt: Mapped[int] = mapped_column(default=1)
    max_attempts: Mapped[int] = mapped_column(default=3)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    step: Mapped[int] = mapped_column(default=0)
    total_steps: Mapped[int] = mapped_column(default=0)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    # where this attempt's discriminator replicas join its process group (ELECTRA, n > 1)
    rendezvous: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    # when fair share gave the job its role slots (all at once); None: it waits in the queue
    placed_at: Mapped[datetime | None]
    # why a queued job waits: {reason, position, cluster, kind} (app.jobs.fairshare.Wait)
    waiting: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[CreatedAt]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)


class JobRole(Base):
    """One role of a job (generator, discriminator, encoder, decoder) on its cluster."""

    __tablename__ = "job_roles"

    id: Mapped[NewId]
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(32))
    cluster: Mapped[str] = mapped_column(String(63))
    attempt: Mapped[int] = mapped_column(default=1)
    status: Mapped[RoleStatus] = mapped_column(default=RoleStatus.pending)
    heartbeat_at: Mapped[datetime | None]
    dispatched_at: Mapped[datetime | None]
    checkpoint_step: Mapped[int] = mapped_column(default=0)
    # the last metric batch applied for this attempt: a retried batch is applied once
    metrics_seq: Mapped[int] = mapped_column(default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    error: Mapped[str | None] = mapped_column(Text)


class JobMetric(Base):
    """One point of a job's metric time series."""

    __tablename__ = "job_metrics"
    __table_args__ = (Index("ix_job_metrics_job_name_step", "job_id", "name", "step"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(32))
    step: Mapped[int]
    name: Mapped[str] = mapped_column(String(64))
    value: Mapped[float] = mapped_column(Float)


class JobArtifact(Base):
    """Something a job wrote: a model (registered as a dataset) or a report."""

    __tablename__ = "job_artifacts"

    id: Mapped[NewId]
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(32))
    dataset_id: Mapped[str | None] = mapped_column(String(36))
    size_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[CreatedAt]


class ColumnExposure(Base):
    """`cluster` has received column `column` of parallel dataset `dataset_id` for `user_id`.

    Written at submission for every role that reads a column, and never removed: a later
    job of the same user that would give the cluster the other column is refused, so that
    no cluster collects both sides of the pairs across jobs (app/jobs/service.py).
    """

    __tablename__ = "column_exposures"

    dataset_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    cluster: Mapped[str] = mapped_column(String(63), primary_key=True)
    column: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(String(36))  # the first job that sent it there
    created_at: Mapped[CreatedAt]

"""Where a job and its roles stand: plain enums, shared by the models, the schemas and the
cluster side (no database here)."""

from __future__ import annotations

import enum


class JobStatus(enum.StrEnum):
    """Where a job stands; the last three are final."""

    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


FINAL_STATUSES = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})


class RoleStatus(enum.StrEnum):
    """Where one role of the current attempt stands."""

    pending = "pending"  # written, not yet handed to the broker
    dispatched = "dispatched"  # on its cluster's queue
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    stopped = "stopped"


__all__ = ["FINAL_STATUSES", "JobStatus", "RoleStatus"]

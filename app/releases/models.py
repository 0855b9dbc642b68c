"""Provenance of job outputs, and the requests by which their sources' owners release them."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import ClassVar

from sqlalchemy import ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, CreatedAt, NewId


class DatasetSource(Base):
    """`source_id` is among what `dataset_id` was derived from; `direct` if a job read it.

    The rows of one dataset hold its whole ancestry: its job's inputs (direct) and, copied
    from theirs, everything those derive from. `grant_id` names the access grant through
    which the job's owner used a source owned by someone else (direct rows), or through
    which that ancestor's own job used it (copied rows).
    """

    __tablename__ = "dataset_sources"

    dataset_id: Mapped[str] = mapped_column(
        ForeignKey("datasets.id", ondelete="CASCADE"), primary_key=True
    )
    source_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), primary_key=True, index=True)
    source_owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"))
    direct: Mapped[bool]
    job_id: Mapped[str] = mapped_column(String(36))
    grant_id: Mapped[str | None] = mapped_column(ForeignKey("access_requests.id"))
    created_at: Mapped[CreatedAt]
    # HMAC of the fields app/seals.py lists, under a key the database does not hold
    row_mac: Mapped[str | None] = mapped_column(String(64))


class ReleaseStatus(enum.StrEnum):
    """A release request, or one source owner's part of it."""

    pending = "pending"
    approved = "approved"
    denied = "denied"


class ReleaseRequest(Base):
    """The owner of a derived dataset asks its sources' owners to release it (download)."""

    __tablename__ = "release_requests"
    audit_type: ClassVar[str] = "release_request"

    id: Mapped[NewId]
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"), index=True)
    requester_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    purpose: Mapped[str] = mapped_column(String(2000))
    status: Mapped[ReleaseStatus] = mapped_column(default=ReleaseStatus.pending)
    created_at: Mapped[CreatedAt]
    decided_at: Mapped[datetime | None]  # the last approval, or the first denial
    # HMAC of the fields app/seals.py lists, under a key the database does not hold
    row_mac: Mapped[str | None] = mapped_column(String(64))


class ReleaseApproval(Base):
    """One source owner's decision on a release request; all must approve."""

    __tablename__ = "release_approvals"
    __table_args__ = (
        UniqueConstraint("request_id", "owner_id", name="uq_release_approvals_request_owner"),
    )

    id: Mapped[NewId]
    request_id: Mapped[str] = mapped_column(
        ForeignKey("release_requests.id", ondelete="CASCADE"), index=True
    )
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    status: Mapped[ReleaseStatus] = mapped_column(default=ReleaseStatus.pending)
    decided_at: Mapped[datetime | None]
    # HMAC of the fields app/seals.py lists, under a key the database does not hold
    row_mac: Mapped[str | None] = mapped_column(String(64))

"""Access requests: a user asks to use another user's dataset in jobs; the owner decides."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import ClassVar

from sqlalchemy import JSON, ForeignKey, Index, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, CreatedAt, NewId


class AccessStatus(enum.StrEnum):
    """Stored states; `expired` is derived (approved and past expires_at), never stored."""

    pending = "pending"
    approved = "approved"
    denied = "denied"
    revoked = "revoked"
    withdrawn = "withdrawn"


class AccessRequest(Base):
    """One request by `requester_id` to use `dataset_id` (owned by `owner_id`) in jobs."""

    __tablename__ = "access_requests"
    audit_type: ClassVar[str] = "access_request"
    __table_args__ = (Index("ix_access_requests_dataset_requester", "dataset_id", "requester_id"),)

    id: Mapped[NewId]
    dataset_id: Mapped[str] = mapped_column(ForeignKey("datasets.id"))
    requester_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    purpose: Mapped[str] = mapped_column(String(2000))
    status: Mapped[AccessStatus] = mapped_column(default=AccessStatus.pending)
    created_at: Mapped[CreatedAt]
    decided_at: Mapped[datetime | None]  # approved or denied
    expires_at: Mapped[datetime | None]  # set on approval; None: until revoked
    ended_at: Mapped[datetime | None]  # revoked or withdrawn
    # HMAC of the fields app/seals.py lists, under a key the database does not hold
    row_mac: Mapped[str | None] = mapped_column(String(64))
    # the clusters the data (and what a job derives from it) may go to, sorted; set on
    # approval and only ever narrowed; None: any cluster
    clusters: Mapped[list[str] | None] = mapped_column(JSON)

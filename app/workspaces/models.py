"""Workspaces: a user's isolated space, with quotas."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, new_id, utcnow


class Workspace(Base):
    """An isolated space owned by one user; datasets and jobs live in one."""

    __tablename__ = "workspaces"
    __table_args__ = (UniqueConstraint("owner_id", "name", name="uq_workspaces_owner_name"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    is_personal: Mapped[bool] = mapped_column(default=False)
    storage_bytes_used: Mapped[int] = mapped_column(BigInteger, default=0)
    storage_bytes_limit: Mapped[int] = mapped_column(BigInteger)
    max_concurrent_jobs: Mapped[int]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

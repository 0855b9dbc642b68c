"""Request and response bodies of the workspaces API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.fields import StrictIn, example


class WorkspaceCreateIn(StrictIn):
    model_config = example(name="translation")

    name: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$")


class QuotaIn(StrictIn):
    model_config = example(storage_bytes_limit=10**10, max_concurrent_jobs=4)

    storage_bytes_limit: int | None = Field(default=None, ge=0, le=2**53 - 1)
    max_concurrent_jobs: int | None = Field(default=None, ge=0, le=10_000)


class WorkspaceOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    owner_id: str
    is_personal: bool
    storage_bytes_used: int
    storage_bytes_limit: int
    max_concurrent_jobs: int
    created_at: datetime


class WorkspaceList(BaseModel):
    items: list[WorkspaceOut]
    total: int

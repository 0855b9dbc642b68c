"""Request and response bodies of the access-requests API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.db import columns
from app.fields import EXAMPLE_ID, Id, StrictIn, Timestamp, example
from app.grants.service import RequestView, status_of
from app.workspaces.models import DatasetKind


class AccessRequestCreateIn(StrictIn):
    model_config = example(dataset_id=EXAMPLE_ID, purpose="pre-train an Spanish ELECTRA")

    dataset_id: Id
    purpose: str = Field(min_length=1, max_length=2000)


class ApproveIn(StrictIn):
    model_config = example(expires_at="2030-01-01T00:00:00Z")

    expires_at: Timestamp | None = Field(
        default=None, description="In the future; none: until revoked"
    )


class AccessRequestOut(BaseModel):
    id: str
    dataset_id: str
    requester_id: str
    owner_id: str
    purpose: str
    status: Literal["pending", "approved", "denied", "revoked", "withdrawn", "expired"]
    created_at: datetime
    decided_at: datetime | None
    expires_at: datetime | None
    ended_at: datetime | None
    dataset_name: str
    dataset_kind: DatasetKind
    requester_email: str
    requester_display_name: str
    owner_display_name: str

    @classmethod
    def of(cls, view: RequestView) -> AccessRequestOut:
        """The answer for one request: its columns, its status as reported, the names beside it."""
        row = view.request
        return cls.model_validate({**columns(row), **vars(view), "status": status_of(row)})


class AccessRequestList(BaseModel):
    items: list[AccessRequestOut]
    total: int

"""Request and response bodies of the release-requests API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from app.db import columns
from app.fields import StrictIn, example
from app.releases.models import ReleaseStatus
from app.releases.service import RequestView
from app.workspaces.models import DatasetKind


class ReleaseRequestCreateIn(StrictIn):
    model_config = example(purpose="publish the fine-tuned model")

    purpose: str = Field(min_length=1, max_length=2000)


class ApprovalOut(BaseModel):
    owner_id: str
    owner_display_name: str
    status: ReleaseStatus
    decided_at: datetime | None


class SourceOut(BaseModel):
    id: str
    name: str
    kind: DatasetKind
    owner_id: str


class ReleaseRequestOut(BaseModel):
    id: str
    dataset_id: str
    requester_id: str
    purpose: str
    status: ReleaseStatus  # approved: the dataset is released
    created_at: datetime
    decided_at: datetime | None
    dataset_name: str
    dataset_kind: DatasetKind
    dataset_size_bytes: int
    requester_email: str
    requester_display_name: str
    approvals: list[ApprovalOut]
    sources: list[SourceOut]  # the requester sees all; a source owner sees their own

    @classmethod
    def of(cls, view: RequestView) -> ReleaseRequestOut:
        """The answer for one request: its columns and what the view shows beside them."""
        return cls.model_validate({**columns(view.request), **vars(view)}, from_attributes=True)


class ReleaseRequestList(BaseModel):
    items: list[ReleaseRequestOut]
    total: int

"""Request and response bodies of the release-requests API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.fields import StrictIn
from app.releases.models import ReleaseStatus
from app.releases.service import RequestView
from app.workspaces.models import DatasetKind


class ReleaseRequestCreateIn(StrictIn):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"purpose": "publish the fine-tuned model"}]}
    )

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
        """The answer for one request."""
        r = view.request
        return cls(
            id=r.id,
            dataset_id=r.dataset_id,
            requester_id=r.requester_id,
            purpose=r.purpose,
            status=r.status.value,
            created_at=r.created_at,
            decided_at=r.decided_at,
            dataset_name=view.dataset_name,
            dataset_kind=view.dataset_kind,
            dataset_size_bytes=view.dataset_size_bytes,
            requester_email=view.requester_email,
            requester_display_name=view.requester_display_name,
            approvals=[ApprovalOut(**vars(a)) for a in view.approvals],
            sources=[SourceOut(**vars(s)) for s in view.sources],
        )


class ReleaseRequestList(BaseModel):
    items: list[ReleaseRequestOut]
    total: int

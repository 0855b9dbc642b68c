"""Request and response bodies of the release-requests API."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from app.releases.service import RequestView


class ReleaseRequestCreateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    purpose: str = Field(min_length=1, max_length=2000)


class ApprovalOut(BaseModel):
    owner_id: str
    owner_display_name: str
    status: str  # pending, approved, denied
    decided_at: datetime | None


class SourceOut(BaseModel):
    id: str
    name: str
    kind: str
    owner_id: str


class ReleaseRequestOut(BaseModel):
    id: str
    dataset_id: str
    requester_id: str
    purpose: str
    status: str  # pending, approved (the dataset is released), denied
    created_at: datetime
    decided_at: datetime | None
    dataset_name: str
    dataset_kind: str
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

"""Request and response bodies of the access-requests API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from app.clusters.schemas import ClusterNames, ClusterSet
from app.clusters.service import ANY_CLUSTER
from app.db import columns
from app.fields import EXAMPLE_ID, Id, StrictIn, Timestamp, example
from app.grants.access import status_of
from app.grants.views import RequestView, shown_clusters
from app.workspaces.models import DatasetKind


class AccessRequestCreateIn(StrictIn):
    model_config = example(dataset_id=EXAMPLE_ID, purpose="pre-train an Spanish ELECTRA")

    dataset_id: Id
    purpose: str = Field(min_length=1, max_length=2000)


class ApproveIn(StrictIn):
    model_config = example(expires_at="2030-01-01T00:00:00Z", clusters=["east"])

    expires_at: Timestamp | None = Field(
        default=None, description="In the future; none: until revoked"
    )
    clusters: ClusterSet | None = Field(
        default=None,
        description='The clusters the data, and what jobs derive from it, may go to, or "any";'
        " none: the dataset's default set, or any where it has none. An unknown name or an"
        " empty list is 422.",
    )


class NarrowIn(StrictIn):
    model_config = example(clusters=["east"])

    clusters: ClusterNames = Field(
        description="A subset of the clusters the grant allows now; empty is 422 (revoke instead)"
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
    # where the data may go: a list of cluster names or "any"; null until approved
    clusters: list[str] | Literal["any"] | None
    # the set the owner put on the dataset, which an approval naming none applies
    dataset_default_clusters: list[str] | Literal["any"]

    @classmethod
    def of(cls, view: RequestView) -> AccessRequestOut:
        """The answer for one request: its columns, its status as reported, the names beside it."""
        row = view.request
        return cls.model_validate(
            {
                **columns(row),
                **vars(view),
                "status": status_of(row),
                "clusters": shown_clusters(row),
                "dataset_default_clusters": view.dataset_default_clusters or ANY_CLUSTER,
            }
        )


class AccessRequestList(BaseModel):
    items: list[AccessRequestOut]
    total: int

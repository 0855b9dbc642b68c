"""Request and response bodies of the datasets API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from app.clusters.schemas import ClusterSet, ClusterSetOut
from app.datasets.service import MAX_NAME_LENGTH, NAME_PATTERN
from app.fields import StrictIn, example
from app.workspaces.models import DatasetKind


class ModelInfoOut(BaseModel):
    """What a `model` dataset holds, as checked at upload."""

    format: Literal["huggingface", "nebula"]
    architecture: str
    parameters: int
    hidden_size: int
    layers: int
    vocab_size: int
    tokenizer: str  # the tokenizer's kind: WordPiece, BPE, Unigram or WordLevel


class DatasetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True, populate_by_name=True)

    id: str
    workspace_id: str | None
    owner_id: str
    name: str
    kind: DatasetKind
    size_bytes: int
    sha256: str | None  # null in the catalog for those without a grant
    discoverable: bool
    created_at: datetime
    owner_display_name: str | None = None
    # what a job derived it from (source ids the caller may know of), and whether its
    # sources' owners must release it before it downloads
    derived_from: list[str] = []
    release: Literal["not_needed", "required", "pending", "released"] = "not_needed"
    derived_by_job_id: str | None = None
    derived_from_names: dict[str, str] = {}  # id -> name of each of `derived_from`
    model: ModelInfoOut | None = Field(default=None, validation_alias="model_info")
    # what an approval allows when the owner names no clusters (shown to requesters too)
    default_clusters: ClusterSetOut = "any"
    # where the caller's jobs may send it: their grant on it, or for their own derived data
    # its unreleased sources' grants, intersected
    allowed_clusters: ClusterSetOut = "any"


class DatasetList(BaseModel):
    items: list[DatasetOut]
    total: int


class DatasetUpdateIn(StrictIn):
    model_config = example(discoverable=True)

    name: str | None = Field(
        default=None, min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN
    )
    discoverable: bool | None = None
    default_clusters: ClusterSet | None = Field(
        default=None,
        description="The clusters an approval of a request for it allows when the owner names"
        ' none (a list of names, or "any"); existing grants keep theirs',
    )

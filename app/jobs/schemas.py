"""Job submission bodies (one validated config per kind) and answers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.fields import EXAMPLE_ID, Id, StrictIn, example
from app.jobs.states import JobStatus
from contract.kinds import AbnetJobConfig, ElectraJobConfig

ClusterName = Annotated[
    str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", examples=["cluster-a"])
]
Strict = StrictIn


class ElectraInputs(Strict):
    text: Id = Field(description="A text dataset")


class ElectraPlacement(Strict):
    generator: ClusterName
    discriminator: ClusterName


class ElectraJobIn(Strict):
    """An ELECTRA pre-training job."""

    model_config = example(
        kind="electra_pretrain",
        config={"preset": "tiny", "steps": 200},
        inputs={"text": EXAMPLE_ID},
        placement={"generator": "cluster-a", "discriminator": "cluster-b"},
    )

    kind: Literal["electra_pretrain"]
    config: ElectraJobConfig = Field(default_factory=ElectraJobConfig)
    inputs: ElectraInputs
    placement: ElectraPlacement


class AbnetInputs(Strict):
    parallel: Id = Field(description="A parallel dataset to fine-tune on")
    source_model: Id = Field(description="The encoder's pre-trained model")
    target_model: Id = Field(description="The decoder's pre-trained model")
    eval: Id | None = Field(default=None, description="A parallel dataset to score BLEU on")


class AbnetPlacement(Strict):
    encoder: ClusterName
    decoder: ClusterName


class AbnetJobIn(Strict):
    """An ABNet fine-tuning job."""

    model_config = example(
        kind="abnet_finetune",
        config={"preset": "tiny", "forward_codec": "fp16(lowrank(0.25))"},
        inputs={
            "parallel": EXAMPLE_ID,
            "source_model": EXAMPLE_ID,
            "target_model": EXAMPLE_ID,
        },
        placement={"encoder": "cluster-a", "decoder": "cluster-b"},
    )

    kind: Literal["abnet_finetune"]
    config: AbnetJobConfig = Field(default_factory=AbnetJobConfig)
    inputs: AbnetInputs
    placement: AbnetPlacement


JobSubmitIn = Annotated[ElectraJobIn | AbnetJobIn, Field(discriminator="kind")]


JobKindName = Literal["electra_pretrain", "abnet_finetune"]


class ResidencyGrantOut(BaseModel):
    """A grant one of the job's inputs rests on, and the clusters it allows."""

    grant_id: str
    input: str  # the job input's name
    dataset_id: str  # the dataset the grant is for: the input, or a source it derives from
    clusters: list[str] | Literal["any"]


class ClusterResidencyOut(BaseModel):
    """One cluster of a job: its roles, and the grants that let the job's data go there."""

    cluster: str
    roles: list[str]
    allowed: bool  # every grant the inputs rest on allows the cluster (none: own data only)
    grants: list[ResidencyGrantOut]  # all of them, allowing it or not


class WaitingOut(BaseModel):
    """Why a queued job has not got its role slots yet (app.jobs.fairshare)."""

    reason: str  # e.g. "waiting: slots of cluster-b held by 3 other jobs; position 2"
    position: int  # 1: the next job to start on `cluster`
    cluster: str
    kind: Literal["cluster_full", "tenant_limit"]


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    workspace_id: str
    kind: JobKindName
    status: JobStatus
    paused: bool
    progress: float
    step: int
    total_steps: int
    metrics: dict[str, float]
    error: str | None
    config: dict[str, Any]
    inputs: dict[str, str]
    placement: dict[str, str]
    attempt: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    waiting: WaitingOut | None = None  # queued for slots: why, and its place
    # GET /jobs/{id} only: what each cluster receives, and by which grant (empty in lists)
    residency: list[ClusterResidencyOut] = []


class JobList(BaseModel):
    items: list[JobOut]
    total: int


class JobAccepted(BaseModel):
    id: str
    status: JobStatus


class MetricsOut(BaseModel):
    series: dict[str, list[tuple[int, float]]]


class ArtifactOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    kind: str
    dataset_id: str | None
    size_bytes: int
    details: dict[str, Any]
    created_at: datetime


class ArtifactList(BaseModel):
    items: list[ArtifactOut]
    total: int


class JobOverviewOut(BaseModel):
    """A job as an admin sees it across tenants: who, what, where, how far; never its data."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    kind: JobKindName
    status: JobStatus
    owner_id: str
    owner_email: str = ""
    workspace_id: str
    placement: dict[str, str]
    progress: float
    step: int
    total_steps: int
    attempt: int
    created_at: datetime
    started_at: datetime | None
    waiting: WaitingOut | None = None


class JobOverviewList(BaseModel):
    items: list[JobOverviewOut]
    total: int


class JobRoleKindOut(BaseModel):
    """One role of a job kind, as `GET /job-kinds` tells it."""

    name: str
    label: str
    hint: str
    peer: str
    reads: list[str]  # the inputs the role may read
    read_if: dict[str, str]  # input -> config field: read only while it is true
    artifact: str | None  # the kind of artifact the role stores
    sees: str  # what the role's cluster receives
    sees_otherwise: str  # ... when a `read_if` field is false


class JobInputKindOut(BaseModel):
    name: str
    kind: str  # the dataset kind it must be
    optional: bool
    label: str
    hint: str


class JobPresetOut(BaseModel):
    name: str
    hint: str
    values: dict[str, Any]  # the training-config fields the preset sets


class JobKindOut(BaseModel):
    """One job kind: everything a client needs to offer, submit and explain it."""

    kind: JobKindName
    label: str
    description: str
    primary_role: str  # its steps measure the job's progress
    apart: list[str]  # roles that must run on different clusters
    roles: list[JobRoleKindOut]
    inputs: list[JobInputKindOut]
    presets: list[JobPresetOut]
    config_fields: list[str]  # what a submission's config may hold
    config_schema: dict[str, Any]  # its JSON Schema


class JobKindList(BaseModel):
    items: list[JobKindOut]

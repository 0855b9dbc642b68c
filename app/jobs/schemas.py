"""Job submission bodies (one validated config per kind) and answers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from app.fields import EXAMPLE_ID, Id, StrictIn
from app.jobs.states import JobStatus

Preset = Literal["tiny", "paper"]
ClusterName = Annotated[
    str, Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$", examples=["cluster-a"])
]
# The grammar (workers.compression.spec) is recursive; the document names it as a format.
CodecSpec = Annotated[
    str,
    Field(
        max_length=200,
        json_schema_extra={"format": "codec-spec"},
        description="A codec spec: none, fp16, bf16, int8, lowrank(r, method=svd|rsvd|power), "
        "each optionally wrapping lowrank, and ef(<spec>) for error feedback (refused on "
        "per-sample streams); `auto` where a kind lets the link's measurement choose",
        examples=["fp16", "int8", "fp16(lowrank(0.25,method=power))", "ef(int8)"],
    ),
]
Strict = StrictIn


class ElectraJobConfig(Strict):
    """Scenario-I: generator on one cluster, discriminators on another."""

    preset: Preset = "tiny"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    steps: int | None = Field(default=None, ge=1, le=10_000_000)
    batch_size: int | None = Field(default=None, ge=2, le=4096)
    n_discriminators: int | None = Field(default=None, ge=1, le=16)
    dropout: float | None = Field(default=None, ge=0.0, le=0.5)
    ckpt_every: int | None = Field(default=None, ge=1, le=10_000_000)
    # When the discriminator's cluster may read the same text, only masked positions cross.
    discriminator_reads_text: bool = True

    def overrides(self) -> dict[str, Any]:
        """The training-config fields this job sets on top of its preset."""
        keys = ("steps", "batch_size", "n_discriminators", "ckpt_every", "dropout")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


class AbnetJobConfig(Strict):
    """Scenario-II: encoder + adapters on one cluster, decoder + adapters on another."""

    preset: Preset = "tiny"
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    steps: int | None = Field(default=None, ge=1, le=10_000_000)
    batch_size: int | None = Field(default=None, ge=2, le=4096)
    ckpt_every: int | None = Field(default=None, ge=1, le=10_000_000)
    micro_batches: int | None = Field(default=None, ge=1, le=16)
    # both streams are per sample (activations, their gradients): ef(...) is refused;
    # "auto" lets the link's measurement choose per stream within auto_max_error
    forward_codec: CodecSpec = "fp16"
    backward_codec: CodecSpec = "int8"
    auto_max_error: float | None = Field(default=None, gt=0.0, lt=1.0)
    compress_from_step: int = Field(default=0, ge=0, le=10_000_000)

    @field_validator("forward_codec", "backward_codec")
    @classmethod
    def _valid_codec(cls, spec: str, info: ValidationInfo) -> str:
        if spec == "auto":
            return spec
        from workers.compression import PER_SAMPLE, SpecError, check_stream_spec

        try:
            check_stream_spec(spec, str(info.field_name), PER_SAMPLE)
        except SpecError as exc:
            raise ValueError(str(exc)) from None
        return spec

    def overrides(self) -> dict[str, Any]:
        """The training-config fields this job sets on top of its preset."""
        keys = ("steps", "batch_size", "ckpt_every", "micro_batches", "auto_max_error")
        values = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        values.update(
            forward_codec=self.forward_codec,
            backward_codec=self.backward_codec,
            compress_from_step=self.compress_from_step,
        )
        return values


SOURCE, TARGET = 0, 1  # the columns of a parallel corpus (source \t target)


class RoleSpec(BaseModel):
    """One role of a job kind: its peer, what it may read, and what it stores."""

    peer: str
    # input name -> the column of a parallel corpus the role receives (None: all of it)
    reads: dict[str, int | None]
    artifact: str | None = None  # the kind of artifact the role stores, if any


class JobKindSpec(BaseModel):
    """What a job kind needs: its config model, roles, and inputs (name -> dataset kind)."""

    config: type[Strict]
    roles: dict[str, RoleSpec]
    inputs: dict[str, str]
    optional_inputs: dict[str, str] = {}
    primary_role: str  # the role whose steps measure the job's progress
    # roles that must run on different clusters: ABNet's encoder gets only the source
    # column and its decoder only the target, so that no cluster holds a sentence pair
    apart: tuple[str, ...] = ()


KINDS: dict[str, JobKindSpec] = {
    "electra_pretrain": JobKindSpec(
        config=ElectraJobConfig,
        roles={
            "generator": RoleSpec(peer="discriminator", reads={"text": None}),
            # reads the text too unless the job's config says discriminator_reads_text=false
            "discriminator": RoleSpec(peer="generator", reads={"text": None}, artifact="model"),
        },
        inputs={"text": "text"},
        primary_role="discriminator",
    ),
    "abnet_finetune": JobKindSpec(
        config=AbnetJobConfig,
        roles={
            # each side of a parallel corpus gets only its own column: no cluster holds pairs
            "encoder": RoleSpec(
                peer="decoder",
                reads={"parallel": SOURCE, "eval": SOURCE, "source_model": None},
                artifact="adapters",
            ),
            "decoder": RoleSpec(
                peer="encoder",
                reads={"parallel": TARGET, "eval": TARGET, "target_model": None},
                artifact="adapters",
            ),
        },
        inputs={"parallel": "parallel", "source_model": "model", "target_model": "model"},
        optional_inputs={"eval": "parallel"},
        primary_role="decoder",
        apart=("encoder", "decoder"),
    ),
}


# The discriminator's data-parallel replicas 1..n-1 are roles of their own, each a task on
# the discriminator's cluster (its own worker process); they join the discriminator's
# process group at the rendezvous it publishes, read no input and store nothing.
REPLICA_PREFIX = "replica-"
REPLICA_OF = "discriminator"
MAX_REPLICAS = 16
REPLICA = RoleSpec(peer=REPLICA_OF, reads={})


def replica_rank(role: str) -> int | None:
    """The rank of a replica role (`replica-2` -> 2), None for any other role."""
    if role.startswith(REPLICA_PREFIX) and role[len(REPLICA_PREFIX) :].isdigit():
        rank = int(role[len(REPLICA_PREFIX) :])
        return rank if 1 <= rank < MAX_REPLICAS else None
    return None


def role_spec(kind: str, role: str) -> RoleSpec:
    """One role of a job kind, replicas included; KeyError for a role the kind has not."""
    if kind == "electra_pretrain" and replica_rank(role) is not None:
        return REPLICA
    return KINDS[kind].roles[role]


def job_roles(kind: str, config: dict[str, Any], placement: dict[str, str]) -> dict[str, str]:
    """Every role of a job and its cluster: the placed ones and the replicas they imply."""
    roles = {role: placement[role] for role in KINDS[kind].roles}
    if kind == "electra_pretrain":
        for rank in range(1, int(config.get("n_discriminators") or 1)):
            roles[f"{REPLICA_PREFIX}{rank}"] = placement[REPLICA_OF]
    return roles


def role_reads(kind: str, role: str, config: dict[str, Any]) -> dict[str, int | None]:
    """The inputs one role of a job may read, with the column it gets of each."""
    reads = dict(role_spec(kind, role).reads)
    if role == "discriminator" and not config.get("discriminator_reads_text", True):
        reads.pop("text")
    return reads


class ElectraInputs(Strict):
    text: Id = Field(description="A text dataset")


class ElectraPlacement(Strict):
    generator: ClusterName
    discriminator: ClusterName


class ElectraJobIn(Strict):
    """An ELECTRA pre-training job."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "kind": "electra_pretrain",
                    "config": {"preset": "tiny", "steps": 200},
                    "inputs": {"text": EXAMPLE_ID},
                    "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
                }
            ]
        }
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

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "kind": "abnet_finetune",
                    "config": {"preset": "tiny", "forward_codec": "fp16(lowrank(0.25))"},
                    "inputs": {
                        "parallel": EXAMPLE_ID,
                        "source_model": EXAMPLE_ID,
                        "target_model": EXAMPLE_ID,
                    },
                    "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
                }
            ]
        }
    )

    kind: Literal["abnet_finetune"]
    config: AbnetJobConfig = Field(default_factory=AbnetJobConfig)
    inputs: AbnetInputs
    placement: AbnetPlacement


JobSubmitIn = Annotated[ElectraJobIn | AbnetJobIn, Field(discriminator="kind")]


JobKindName = Literal["electra_pretrain", "abnet_finetune"]


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


class JobOverviewList(BaseModel):
    items: list[JobOverviewOut]
    total: int

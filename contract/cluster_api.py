"""Bodies and answers of the cluster API: what the control plane serves and a worker reads."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from contract.devices import DeviceInfo, DeviceKind
from contract.fields import StrictIn

MAX_POINTS_PER_BATCH = 10_000
MAX_METRICS_PER_POINT = 64

MetricName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
Step = Annotated[int, Field(ge=0, le=10**9)]
# NaN and infinities are refused: a chart cannot show them and they poison aggregates
MetricValue = Annotated[float, Field(allow_inf_nan=False)]


class ClaimIn(StrictIn):
    attempt: int = Field(ge=1, le=1000)
    worker: str = Field(min_length=1, max_length=255, pattern=r"^[\x20-\x7e]+$")
    # what the claiming worker trains on; a worker that does not say counts as CPU only
    device: DeviceKind = "cpu"


class TokenOut(BaseModel):
    token: str
    token_expires_at: datetime


class ClaimOut(TokenOut):
    """What a role needs to run: its job's validated config and the rules of the call."""

    job_id: str
    attempt: int
    role: str
    peer_role: str
    kind: str
    config: dict[str, Any]
    inputs: list[str]  # the inputs this role may read
    device: DeviceKind = "cpu"  # where the role runs: what it needs, on this worker
    heartbeat_s: float
    grace_s: float  # keep training this long without the control plane, then stop
    # base64; seals what the role leaves on the cluster's disk
    checkpoint_key: str = Field(repr=False)


class HeartbeatOut(TokenOut):
    alive: bool


class MetricPoint(StrictIn):
    step: Step
    values: dict[MetricName, MetricValue] = Field(max_length=MAX_METRICS_PER_POINT)


class MetricBatchIn(StrictIn):
    seq: int = Field(ge=1, le=2**53 - 1, description="batch number within the attempt, from 1")
    points: list[MetricPoint] = Field(max_length=MAX_POINTS_PER_BATCH)
    checkpoint_step: Step | None = None


class MetricBatchOut(BaseModel):
    applied: bool  # false: this seq was applied before (a retry)


class OutputOut(BaseModel):
    dataset_id: str
    name: str
    size_bytes: int


MAX_REPORT_METRICS = 64
MAX_ERROR_MESSAGE = 200


class ErrorCode(StrEnum):
    """Why a role failed, from a fixed list: error text is a channel out of the cluster too."""

    training = "training"  # the training loop raised
    input = "input"  # an input could not be read
    artifact = "artifact"  # storing the artifact failed
    link = "link"  # the peer or the switch went away
    resources = "resources"  # out of memory or disk
    other = "other"


# the codes as a body field takes them (strict validation takes no enum from JSON text)
ErrorCodeName = Literal["training", "input", "artifact", "link", "resources", "other"]
assert set(ErrorCodeName.__args__) == {c.value for c in ErrorCode}  # type: ignore[attr-defined]


class RoleReport(StrictIn):
    """How a role ended, in numbers only; metric names come from the job kind's table
    (contract/kinds.py `metrics`), checked by the control plane."""

    start_step: Step = 0
    last_step: Step = 0
    final_metrics: dict[MetricName, MetricValue] = Field(
        default_factory=dict, max_length=MAX_REPORT_METRICS
    )
    extra: dict[MetricName, MetricValue] = Field(default_factory=dict, max_length=16)


class FinishIn(StrictIn):
    """One per role and attempt: a second answers 409."""

    outcome: Literal["succeeded", "failed", "stopped"]
    error_code: ErrorCodeName | None = None
    # printable ASCII, short: a class name or a few words, never a line of data
    error: str | None = Field(default=None, max_length=MAX_ERROR_MESSAGE, pattern=r"^[\x20-\x7e]*$")
    report: RoleReport = Field(default_factory=RoleReport)


class FinishOut(BaseModel):
    job_status: str


class PresenceIn(StrictIn):
    kind: Literal["switch", "worker"]
    instance: str = Field(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")
    version: str = Field(min_length=1, max_length=64, pattern=r"^[\x21-\x7e]+$")
    online: bool = True  # false: the process is leaving
    device: DeviceInfo | None = None  # a worker's; a switch has none


class PresenceAnswer(BaseModel):
    report_every_s: float


class Rendezvous(StrictIn):
    """Where the discriminator's replicas join its torch.distributed process group."""

    address: str = Field(pattern=r"^[A-Za-z0-9.\-\[\]:]{1,255}:[0-9]{1,5}$")  # host:port
    world_size: int = Field(ge=2, le=16)
    vocab_size: int = Field(ge=1, le=10_000_000)
    start_step: int = Field(ge=0, le=10**9)


class EndedJobsIn(StrictIn):
    job_ids: list[Annotated[str, Field(min_length=1, max_length=36)]] = Field(max_length=500)


class EndedJobsOut(BaseModel):
    ended: list[str]  # of those asked: the jobs this cluster has no live part in any more

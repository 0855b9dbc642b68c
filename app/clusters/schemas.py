"""Request and response bodies of clusters, certificates and enrollment."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from app.fields import CertificatePem, CsrPem, StrictIn, example

CLUSTER_NAME = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
# where data may go: a list of cluster names, or "any" (app.clusters.service.check_cluster_set)
ClusterName = Annotated[str, Field(pattern=CLUSTER_NAME, max_length=63)]
ClusterNames = Annotated[list[ClusterName], Field(max_length=100)]
ClusterSet = ClusterNames | Literal["any"]
# as answers show a stored set: None (no limit) reads "any"
ClusterSetOut = Annotated[
    list[str] | Literal["any"], BeforeValidator(lambda value: "any" if value is None else value)
]


class ClusterCreateIn(StrictIn):
    model_config = example(name="east", switch_host="switch.east.example.org", switch_port=7101)

    name: str = Field(pattern=CLUSTER_NAME, max_length=63)
    switch_host: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9.:\-\[\]]+$")
    switch_port: int = Field(ge=1, le=65535)


class DeviceOut(BaseModel):
    """A worker's device as it reported it."""

    kind: Literal["cpu", "cuda"]
    name: str = ""  # CUDA: the first device's name; CPU: the processor's model, or ""
    count: int = 1  # CUDA devices visible to the worker; CPU: cores it may use
    memory_bytes: int | None = None  # CUDA: the first device's memory
    runtime: str = ""  # CUDA: the CUDA runtime torch was built with


class WorkerDevicesOut(BaseModel):
    """Online workers with the same device."""

    device: DeviceOut
    workers: int


class TenantSlotsOut(BaseModel):
    tenant: str  # an email, or "other tenants"
    slots: int
    you: bool = False


class ClusterOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    switch_host: str
    switch_port: int
    created_at: datetime
    has_valid_certificate: bool = False
    switch_online: bool = False  # its switch reported in lately
    workers_online: int = 0  # worker processes that reported in lately
    running_jobs: int = 0  # jobs with a running role there
    # the online workers' devices, alike ones together, CUDA first: where a job that needs
    # CUDA (config.device) can run
    worker_devices: list[WorkerDevicesOut] = []
    # fair share: how many roles may run there at once (None: unbounded), how many placed
    # jobs hold, per tenant (admins see every tenant's email; others see their own and
    # "other tenants"), and how many jobs wait for slots there
    role_slots: int | None = None
    slots_in_use: int = 0
    slots_by_tenant: list[TenantSlotsOut] = []
    queued_jobs: int = 0
    # its RabbitMQ user: "ok", "missing" (broker_problem says why and what to run), or null
    # where the broker has no per-cluster users
    broker_user: Literal["ok", "missing"] | None = None
    broker_problem: str | None = None


class ClusterSlotsIn(StrictIn):
    model_config = example(role_slots=8)

    role_slots: int | None = Field(
        ge=1, le=100_000, description="Roles that may run at once; null: the platform default"
    )


class PresenceOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    kind: Literal["switch", "worker"]
    instance: str
    version: str
    started_at: datetime
    last_seen: datetime
    running_roles: list[str] = []  # job/role
    device: DeviceOut | None = None  # a worker's; a switch has none


class PresenceList(BaseModel):
    items: list[PresenceOut]
    total: int


class ClusterList(BaseModel):
    items: list[ClusterOut]
    total: int


class CsrIn(StrictIn):
    csr_pem: CsrPem


class CertificateOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    serial: str
    cluster_id: str
    certificate_pem: str
    not_before: datetime
    not_after: datetime
    revoked_at: datetime | None
    revocation_reason: str | None


class CertificateList(BaseModel):
    items: list[CertificateOut]
    total: int


class IssuedOut(BaseModel):
    serial: str
    certificate_pem: str
    not_after: datetime
    ca_pem: str
    # switches pin this key at enrollment and verify job tokens with it
    job_token_public_key_pem: str


class WorkerCredentialOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    cluster_id: str
    created_at: datetime
    revoked_at: datetime | None


class WorkerCredentialIssued(WorkerCredentialOut):
    token: str  # shown once; the control plane keeps only its hash


class WorkerCredentialList(BaseModel):
    items: list[WorkerCredentialOut]
    total: int


class RevokeIn(StrictIn):
    model_config = example(reason="key compromise")

    reason: str = Field(min_length=1, max_length=200)


class EnrollmentTokenIn(StrictIn):
    expires_in_minutes: int = Field(default=60, ge=1, le=7 * 24 * 60)


class EnrollmentTokenOut(BaseModel):
    token: str
    expires_at: datetime
    cluster_id: str


class EnrollIn(StrictIn):
    token: str = Field(min_length=1, max_length=200)
    csr_pem: CsrPem


class RenewIn(StrictIn):
    certificate_pem: CertificatePem
    csr_pem: CsrPem
    signature: str = Field(
        min_length=1,
        max_length=1024,
        description="base64 ECDSA-SHA256 of csr_pem by the current key",
    )

"""Response bodies of the audit API."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class AuditEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    seq: int
    at: datetime
    actor_id: str | None
    action: str
    subject_type: str | None
    subject_id: str | None
    outcome: str
    ip: str | None
    details: dict[str, Any]
    hash: str
    prev_hash: str


class AuditList(BaseModel):
    items: list[AuditEventOut]
    total: int


class PersonOut(BaseModel):
    """Who a user id is, as the auditor reads it."""

    email: str
    display_name: str


class AuditEventNamedOut(AuditEventOut):
    """An event with what its ids name now, beside them (not part of the chained event)."""

    actor: PersonOut | None = Field(description="the user behind actor_id, if any")
    subject_name: str | None = Field(
        description="the subject's name: a user's display name, a dataset's, workspace's or"
        " cluster's name, a job's kind"
    )
    subject_email: str | None = Field(description="the subject's email when it is a user")


class AuditNamedList(BaseModel):
    items: list[AuditEventNamedOut]
    total: int


class ProblemOut(BaseModel):
    kind: Literal[
        "removed", "rewritten", "forged", "tail_deleted", "unanchored", "anchors_disagree"
    ]
    first_seq: int
    last_seq: int
    detail: str


class VerificationOut(BaseModel):
    ok: bool
    count: int
    first_bad_seq: int | None
    anchored_seq: int | None
    problems: list[ProblemOut]


class AnchorOut(BaseModel):
    seq: int
    hash: str
    signed_at: datetime
    # Ed25519 over {"hash","legacy_through","seq","signed_at"} as sorted compact JSON
    signature: str
    legacy_through: int
    public_key: str  # raw Ed25519 public key, base64

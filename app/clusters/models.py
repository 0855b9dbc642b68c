"""Clusters, their switch certificates, enrollment tokens, and the platform's own keys."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from sqlalchemy import JSON, ForeignKey, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, CreatedAt, NewId, utcnow


class Cluster(Base):
    """A compute cluster, reachable only through its switch."""

    __tablename__ = "clusters"
    audit_type: ClassVar[str] = "cluster"

    id: Mapped[NewId]
    name: Mapped[str] = mapped_column(String(63), unique=True)
    switch_host: Mapped[str] = mapped_column(String(255))
    switch_port: Mapped[int]
    created_at: Mapped[CreatedAt]
    # how many roles may run there at once (its worker processes); None: the settings'
    role_slots: Mapped[int | None]
    # its RabbitMQ user: "ok", "missing" (making it failed: broker_problem says why and the
    # fix), or None where the broker has no users (Redis, the embedded broker)
    broker_user: Mapped[str | None] = mapped_column(String(16))
    broker_problem: Mapped[str | None] = mapped_column(String(1000))
    # the broker password is derived from the platform secret and this number: writing a
    # bundle again keeps it; `bundle --rotate-broker-password` moves to the next one
    broker_generation: Mapped[int] = mapped_column(default=0, server_default="0")


class Certificate(Base):
    """A switch certificate the CA issued; serials are kept as decimal strings (160 bits)."""

    __tablename__ = "certificates"

    serial: Mapped[str] = mapped_column(String(64), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    certificate_pem: Mapped[str] = mapped_column(Text)
    not_before: Mapped[datetime]
    not_after: Mapped[datetime]
    created_at: Mapped[CreatedAt]
    revoked_at: Mapped[datetime | None]
    revocation_reason: Mapped[str | None] = mapped_column(String(200))
    # the certificate whose key proved this renewal: revoking that one revokes this one
    renewed_from: Mapped[str | None] = mapped_column(String(64), index=True)


class EnrollmentToken(Base):
    """A single-use, expiring secret with which a new switch obtains its first certificate."""

    __tablename__ = "enrollment_tokens"

    id: Mapped[NewId]
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[CreatedAt]
    expires_at: Mapped[datetime]
    used_at: Mapped[datetime | None]


class PlatformKey(Base):
    """A key of the platform itself (the root CA, the job-token signer), encrypted at rest."""

    __tablename__ = "platform_keys"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    encrypted_key: Mapped[bytes] = mapped_column(LargeBinary)
    certificate_pem: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[CreatedAt]


class WorkerCredential(Base):
    """A cluster's credential for its workers' calls to the cluster API; stored as a hash.

    It names the cluster a worker serves; an admin revokes it, and every call made with
    it is refused from then on.
    """

    __tablename__ = "worker_credentials"

    id: Mapped[NewId]
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[CreatedAt]
    revoked_at: Mapped[datetime | None]


class ClusterPresence(Base):
    """A switch or worker process of a cluster that reported in, and when it last did."""

    __tablename__ = "cluster_presence"
    __table_args__ = (UniqueConstraint("cluster_id", "kind", "instance"),)

    id: Mapped[NewId]
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))  # switch or worker
    instance: Mapped[str] = mapped_column(String(255))  # host:cluster:pid
    version: Mapped[str] = mapped_column(String(64))
    details: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)

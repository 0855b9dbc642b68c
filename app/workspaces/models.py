"""Workspaces (a user's isolated space, with quotas) and the datasets stored in them."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, ForeignKey, LargeBinary, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.db import Base, CreatedAt, NewId


class Workspace(Base):
    """An isolated space owned by one user; datasets and jobs live in one."""

    __tablename__ = "workspaces"
    audit_type: ClassVar[str] = "workspace"
    __table_args__ = (UniqueConstraint("owner_id", "name", name="uq_workspaces_owner_name"),)

    id: Mapped[NewId]
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    is_personal: Mapped[bool] = mapped_column(default=False)
    storage_bytes_used: Mapped[int] = mapped_column(BigInteger, default=0)
    storage_bytes_limit: Mapped[int] = mapped_column(BigInteger)
    max_concurrent_jobs: Mapped[int]
    created_at: Mapped[CreatedAt]
    # The workspace's data key, wrapped (AES-GCM) by the master key derived from the
    # platform secret: the database alone never holds a key that opens a dataset.
    data_key_wrapped: Mapped[bytes | None] = mapped_column(LargeBinary)
    # HMAC of the fields app/seals.py lists, under a key the database does not hold
    row_mac: Mapped[str | None] = mapped_column(String(64))


class DatasetKind(enum.StrEnum):
    """What a dataset holds, and so how it is validated on upload."""

    text = "text"  # UTF-8, one sentence per line
    parallel = "parallel"  # UTF-8 TSV, source<TAB>target per line
    model = "model"  # a Nebula safetensors checkpoint, or a tar of a Hugging Face folder


class Dataset(Base):
    """A file stored encrypted under data_dir/datasets/<id>.enc; its name is metadata only."""

    __tablename__ = "datasets"
    audit_type: ClassVar[str] = "dataset"

    id: Mapped[NewId]
    # SET NULL: a workspace can go once its datasets are deleted; their rows stay for
    # grants and audit, with owner_id still naming whose they were.
    workspace_id: Mapped[str | None] = mapped_column(
        ForeignKey("workspaces.id", ondelete="SET NULL"), index=True
    )
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[DatasetKind]
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    discoverable: Mapped[bool] = mapped_column(default=False, index=True)
    created_at: Mapped[CreatedAt]
    deleted_at: Mapped[datetime | None]
    # a `model`'s description as checked at upload: format, architecture, parameters,
    # hidden_size, layers, vocab_size, tokenizer (app/datasets/hf_archive.py)
    model_info: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # HMAC of the fields app/seals.py lists, under a key the database does not hold
    row_mac: Mapped[str | None] = mapped_column(String(64))
    # the clusters an approval allows when the owner names none (sorted); None: any
    default_clusters: Mapped[list[str] | None] = mapped_column(JSON)
    # a derived dataset's digest of its dataset_sources rows (app/releases/provenance.py),
    # sealed with the row, so that a source row deleted from the database is noticed
    sources_digest: Mapped[str | None] = mapped_column(String(64))

"""A derived dataset's sealed row binds a digest of its dataset_sources rows.

A source row deleted from the database left no seal to fail and freed the derived dataset
from its source's terms. `datasets.sources_digest` (app/releases/provenance.py) is computed
here for the datasets already derived, and every dataset row is sealed again over the
fields of this revision (as 0012, with the secret the server reads). A database with no
datasets needs no secret.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# SEALED_FIELDS["datasets"] as of this revision
DATASET_FIELDS = (
    "id",
    "workspace_id",
    "owner_id",
    "kind",
    "sha256",
    "discoverable",
    "deleted_at",
    "default_clusters",
    "sources_digest",
)


def _digest(rows: list[dict[str, Any]]) -> str | None:
    # provenance.sources_digest as of this revision
    if not rows:
        return None
    listed = sorted(
        [r["source_id"], r["source_owner_id"], bool(r["direct"]), r["job_id"], r["grant_id"]]
        for r in rows
    )
    return hashlib.sha256(json.dumps(listed, separators=(",", ":")).encode()).hexdigest()


def _seal_key() -> bytes:
    from app.keyring import Purpose, subkey
    from app.settings import get_settings

    settings = context.config.attributes.get("settings") or get_settings()
    return subkey(settings, Purpose.row_seal)


def _reseal(bind: sa.Connection, fields: tuple[str, ...], *, with_digest: bool) -> None:
    """Seal every dataset row again over `fields` (with its digest computed, if asked)."""
    from app.seals import row_mac

    datasets = sa.Table("datasets", sa.MetaData(), autoload_with=bind)
    by_dataset: dict[str, list[dict[str, Any]]] = {}
    if with_digest:
        sources = sa.Table("dataset_sources", sa.MetaData(), autoload_with=bind)
        for row in bind.execute(sa.select(sources)).mappings():
            by_dataset.setdefault(row["dataset_id"], []).append(dict(row))
    key: bytes | None = None
    for row in bind.execute(sa.select(datasets)).mappings().all():
        key = key or _seal_key()
        values: dict[str, Any] = dict(row)
        values["discoverable"] = bool(values["discoverable"])
        changed: dict[str, Any] = {}
        if with_digest:
            values["sources_digest"] = changed["sources_digest"] = _digest(
                by_dataset.get(row["id"], [])
            )
        changed["row_mac"] = row_mac(key, "datasets", values, fields)
        bind.execute(sa.update(datasets).where(datasets.c.id == row["id"]).values(**changed))


def upgrade() -> None:
    # Plain ALTER TABLE (as 0010): a batch would recreate `datasets`, which grants reference.
    op.add_column("datasets", sa.Column("sources_digest", sa.String(64), nullable=True))
    _reseal(op.get_bind(), DATASET_FIELDS, with_digest=True)


def downgrade() -> None:
    op.drop_column("datasets", "sources_digest")
    # sealed as 0012 left them: the fields of that revision
    _reseal(op.get_bind(), DATASET_FIELDS[:-1], with_digest=False)

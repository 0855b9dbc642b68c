"""Seals (row_mac) on the rows that confer access, computed for the rows already there;
and column_exposures, which cluster received which column of a parallel corpus.

The seal is an HMAC under a key derived from the platform secret (app/seals.py), which the
database does not hold, so this migration reads the secret the way the server does: from
the settings handed in by `nebula db upgrade` (Alembic's config attributes), else from
the environment and var_dir. It seals the existing rows here, at once, rather than
leaving it to the server's next start: a server that sealed whatever rows it found
unsealed would also seal a row someone inserted into the database in the meantime.
A database with none of these rows needs no secret.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import context, op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

# SEALED_FIELDS as of this revision; a later change to app/seals.py re-seals in its own.
FIELDS: dict[str, tuple[str, ...]] = {
    "workspaces": ("id", "owner_id", "data_key_wrapped"),
    "datasets": (
        "id",
        "workspace_id",
        "owner_id",
        "kind",
        "sha256",
        "discoverable",
        "deleted_at",
        "default_clusters",
    ),
    "access_requests": (
        "id",
        "dataset_id",
        "requester_id",
        "owner_id",
        "status",
        "decided_at",
        "expires_at",
        "ended_at",
        "clusters",
    ),
    "release_requests": ("id", "dataset_id", "requester_id", "status"),
    "release_approvals": ("id", "request_id", "owner_id", "status"),
    "dataset_sources": (
        "dataset_id",
        "source_id",
        "source_owner_id",
        "direct",
        "job_id",
        "grant_id",
    ),
}
KEYS: dict[str, tuple[str, ...]] = {"dataset_sources": ("dataset_id", "source_id")}
BOOLEANS = {"discoverable", "direct"}

# Plain ALTER TABLE, not a batch (as in 0010): on SQLite a batch recreates the table, and
# dropping one that others reference fails under foreign keys.


def _seal_key() -> bytes:
    from app.keyring import Purpose, subkey
    from app.settings import get_settings

    settings = context.config.attributes.get("settings") or get_settings()
    return subkey(settings, Purpose.row_seal)


def _seal_existing(bind: sa.Connection) -> None:
    from app.seals import row_mac

    key: bytes | None = None
    for name, fields in FIELDS.items():
        table = sa.Table(name, sa.MetaData(), autoload_with=bind)
        keys = KEYS.get(name, ("id",))
        for row in bind.execute(sa.select(table)).mappings().all():
            key = key or _seal_key()
            values: dict[str, Any] = dict(row)
            for flag in BOOLEANS & set(values):
                values[flag] = None if values[flag] is None else bool(values[flag])
            where = sa.and_(*(table.c[k] == row[k] for k in keys))
            mac = row_mac(key, name, values, fields)
            bind.execute(sa.update(table).where(where).values(row_mac=mac))


def upgrade() -> None:
    for name in FIELDS:
        op.add_column(name, sa.Column("row_mac", sa.String(64), nullable=True))
    _seal_existing(op.get_bind())
    op.create_table(
        "column_exposures",
        sa.Column("dataset_id", sa.String(36), nullable=False),
        sa.Column("user_id", sa.String(36), nullable=False),
        sa.Column("cluster", sa.String(63), nullable=False),
        sa.Column("column", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.String(36), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint(
            "dataset_id", "user_id", "cluster", "column", name="pk_column_exposures"
        ),
    )
    _remember_existing_jobs(op.get_bind())


def _remember_existing_jobs(bind: sa.Connection) -> None:
    """What the jobs already submitted sent where, so that the first new job is checked too."""
    from contract.kinds import KINDS, job_roles, role_reads

    jobs = sa.Table("jobs", sa.MetaData(), autoload_with=bind)
    exposures = sa.Table("column_exposures", sa.MetaData(), autoload_with=bind)
    seen: set[tuple[str, str, str, int]] = set()
    rows = bind.execute(sa.select(jobs).order_by(jobs.c.created_at)).mappings().all()
    for job in rows:
        if job["kind"] not in KINDS:
            continue
        config, inputs = job["config"] or {}, job["inputs"] or {}
        for role, cluster in job_roles(job["kind"], config, job["placement"]).items():
            for name, column in role_reads(job["kind"], role, config).items():
                key = (inputs.get(name), job["owner_id"], cluster, column)
                if key[0] is None or column is None or key in seen:
                    continue
                seen.add(key)  # type: ignore[arg-type]
                bind.execute(
                    sa.insert(exposures).values(
                        dataset_id=key[0],
                        user_id=job["owner_id"],
                        cluster=cluster,
                        column=column,
                        job_id=job["id"],
                        created_at=job["created_at"],
                    )
                )


def downgrade() -> None:
    op.drop_table("column_exposures")
    for name in reversed(FIELDS):
        op.drop_column(name, "row_mac")

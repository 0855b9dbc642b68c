"""The cluster API: worker credentials per cluster, metric batches applied once.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_credentials",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["clusters.id"], name=op.f("fk_worker_credentials_cluster_id_clusters")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_credentials")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_worker_credentials_token_hash")),
    )
    with op.batch_alter_table("worker_credentials", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_worker_credentials_cluster_id"), ["cluster_id"], unique=False
        )
    with op.batch_alter_table("job_roles", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("metrics_seq", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("job_roles", schema=None) as batch_op:
        batch_op.drop_column("metrics_seq")
    with op.batch_alter_table("worker_credentials", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_worker_credentials_cluster_id"))
    op.drop_table("worker_credentials")

"""Clusters, the PKI (certificates, enrollment tokens, platform keys) and jobs.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "clusters",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("switch_host", sa.String(length=255), nullable=False),
        sa.Column("switch_port", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clusters")),
        sa.UniqueConstraint("name", name=op.f("uq_clusters_name")),
    )
    op.create_table(
        "platform_keys",
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("encrypted_key", sa.LargeBinary(), nullable=False),
        sa.Column("certificate_pem", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_platform_keys")),
    )
    op.create_table(
        "certificates",
        sa.Column("serial", sa.String(length=64), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("certificate_pem", sa.Text(), nullable=False),
        sa.Column("not_before", sa.DateTime(), nullable=False),
        sa.Column("not_after", sa.DateTime(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.Column("revocation_reason", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["clusters.id"], name=op.f("fk_certificates_cluster_id_clusters")
        ),
        sa.PrimaryKeyConstraint("serial", name=op.f("pk_certificates")),
    )
    with op.batch_alter_table("certificates", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_certificates_cluster_id"), ["cluster_id"], unique=False
        )

    op.create_table(
        "enrollment_tokens",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("cluster_id", sa.String(length=36), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.Column("used_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"], ["clusters.id"], name=op.f("fk_enrollment_tokens_cluster_id_clusters")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_enrollment_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_enrollment_tokens_token_hash")),
    )
    with op.batch_alter_table("enrollment_tokens", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_enrollment_tokens_cluster_id"), ["cluster_id"], unique=False
        )

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=False),
        sa.Column("owner_id", sa.String(length=36), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                name="jobstatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("placement", sa.JSON(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["users.id"], name=op.f("fk_jobs_owner_id_users")),
        sa.ForeignKeyConstraint(
            ["workspace_id"], ["workspaces.id"], name=op.f("fk_jobs_workspace_id_workspaces")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_workspace_id"), ["workspace_id"], unique=False)
        batch_op.create_index("ix_jobs_workspace_status", ["workspace_id", "status"], unique=False)

    op.create_table(
        "job_artifacts",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("dataset_id", sa.String(length=36), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_artifacts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_artifacts")),
    )
    with op.batch_alter_table("job_artifacts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_artifacts_job_id"), ["job_id"], unique=False)

    op.create_table(
        "job_metrics",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_metrics_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_metrics")),
    )
    with op.batch_alter_table("job_metrics", schema=None) as batch_op:
        batch_op.create_index(
            "ix_job_metrics_job_name_step", ["job_id", "name", "step"], unique=False
        )

    op.create_table(
        "job_roles",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("cluster", sa.String(length=63), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "pending",
                "dispatched",
                "running",
                "succeeded",
                "failed",
                "stopped",
                name="rolestatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(), nullable=True),
        sa.Column("checkpoint_step", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_roles_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_roles")),
    )
    with op.batch_alter_table("job_roles", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_roles_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_roles", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_roles_job_id"))

    op.drop_table("job_roles")
    with op.batch_alter_table("job_metrics", schema=None) as batch_op:
        batch_op.drop_index("ix_job_metrics_job_name_step")

    op.drop_table("job_metrics")
    with op.batch_alter_table("job_artifacts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_artifacts_job_id"))

    op.drop_table("job_artifacts")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_workspace_status")
        batch_op.drop_index(batch_op.f("ix_jobs_workspace_id"))
        batch_op.drop_index(batch_op.f("ix_jobs_owner_id"))

    op.drop_table("jobs")
    with op.batch_alter_table("enrollment_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_enrollment_tokens_cluster_id"))

    op.drop_table("enrollment_tokens")
    with op.batch_alter_table("certificates", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_certificates_cluster_id"))

    op.drop_table("certificates")
    op.drop_table("platform_keys")
    op.drop_table("clusters")

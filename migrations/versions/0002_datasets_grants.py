"""Datasets (encrypted at rest), workspace data keys, access requests and grants.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Wrapped by the master key; NULL for workspaces made before this revision, which get
    # a key on first use (app/workspaces/service.data_key).
    with op.batch_alter_table("workspaces", schema=None) as batch_op:
        batch_op.add_column(sa.Column("data_key_wrapped", sa.LargeBinary(), nullable=True))

    op.create_table(
        "datasets",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("workspace_id", sa.String(length=36), nullable=True),
        sa.Column("owner_id", sa.String(length=36), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column(
            "kind",
            sa.Enum("text", "parallel", "model", name="datasetkind", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("discoverable", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_datasets_owner_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["workspace_id"],
            ["workspaces.id"],
            name=op.f("fk_datasets_workspace_id_workspaces"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
    )
    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_datasets_discoverable"), ["discoverable"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_datasets_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_datasets_workspace_id"), ["workspace_id"], unique=False
        )

    op.create_table(
        "access_requests",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("dataset_id", sa.String(length=36), nullable=False),
        sa.Column("requester_id", sa.String(length=36), nullable=False),
        sa.Column("owner_id", sa.String(length=36), nullable=False),
        sa.Column("purpose", sa.String(length=2000), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "pending",
                "approved",
                "denied",
                "revoked",
                "withdrawn",
                name="accessstatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name=op.f("fk_access_requests_dataset_id_datasets")
        ),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_access_requests_owner_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["requester_id"], ["users.id"], name=op.f("fk_access_requests_requester_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_access_requests")),
    )
    with op.batch_alter_table("access_requests", schema=None) as batch_op:
        batch_op.create_index(
            "ix_access_requests_dataset_requester", ["dataset_id", "requester_id"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_access_requests_owner_id"), ["owner_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_access_requests_requester_id"), ["requester_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("access_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_access_requests_requester_id"))
        batch_op.drop_index(batch_op.f("ix_access_requests_owner_id"))
        batch_op.drop_index("ix_access_requests_dataset_requester")
    op.drop_table("access_requests")

    with op.batch_alter_table("datasets", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_datasets_workspace_id"))
        batch_op.drop_index(batch_op.f("ix_datasets_owner_id"))
        batch_op.drop_index(batch_op.f("ix_datasets_discoverable"))
    op.drop_table("datasets")

    # Dropping the column loses the wrapped keys: datasets are gone by now anyway.
    with op.batch_alter_table("workspaces", schema=None) as batch_op:
        batch_op.drop_column("data_key_wrapped")

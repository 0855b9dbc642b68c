"""Derived data: what each job output derives from, and release requests by its sources' owners.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "release_requests",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("dataset_id", sa.String(length=36), nullable=False),
        sa.Column("requester_id", sa.String(length=36), nullable=False),
        sa.Column("purpose", sa.String(length=2000), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "pending", "approved", "denied", name="releasestatus", native_enum=False, length=16
            ),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["dataset_id"], ["datasets.id"], name=op.f("fk_release_requests_dataset_id_datasets")
        ),
        sa.ForeignKeyConstraint(
            ["requester_id"], ["users.id"], name=op.f("fk_release_requests_requester_id_users")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_release_requests")),
    )
    with op.batch_alter_table("release_requests", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_release_requests_dataset_id"), ["dataset_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_release_requests_requester_id"), ["requester_id"], unique=False
        )

    op.create_table(
        "dataset_sources",
        sa.Column("dataset_id", sa.String(length=36), nullable=False),
        sa.Column("source_id", sa.String(length=36), nullable=False),
        sa.Column("source_owner_id", sa.String(length=36), nullable=False),
        sa.Column("direct", sa.Boolean(), nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("grant_id", sa.String(length=36), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_dataset_sources_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["grant_id"],
            ["access_requests.id"],
            name=op.f("fk_dataset_sources_grant_id_access_requests"),
        ),
        sa.ForeignKeyConstraint(
            ["source_id"], ["datasets.id"], name=op.f("fk_dataset_sources_source_id_datasets")
        ),
        sa.ForeignKeyConstraint(
            ["source_owner_id"], ["users.id"], name=op.f("fk_dataset_sources_source_owner_id_users")
        ),
        sa.PrimaryKeyConstraint("dataset_id", "source_id", name=op.f("pk_dataset_sources")),
    )
    with op.batch_alter_table("dataset_sources", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_dataset_sources_source_id"), ["source_id"], unique=False
        )

    op.create_table(
        "release_approvals",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("request_id", sa.String(length=36), nullable=False),
        sa.Column("owner_id", sa.String(length=36), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "pending", "approved", "denied", name="releasestatus", native_enum=False, length=16
            ),
            nullable=False,
        ),
        sa.Column("decided_at", sa.DateTime(), nullable=True),
        sa.ForeignKeyConstraint(
            ["owner_id"], ["users.id"], name=op.f("fk_release_approvals_owner_id_users")
        ),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["release_requests.id"],
            name=op.f("fk_release_approvals_request_id_release_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_release_approvals")),
        sa.UniqueConstraint("request_id", "owner_id", name="uq_release_approvals_request_owner"),
    )
    with op.batch_alter_table("release_approvals", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_release_approvals_owner_id"), ["owner_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_release_approvals_request_id"), ["request_id"], unique=False
        )


def downgrade() -> None:
    # Without these tables a job output derived from someone else's data would count as
    # its owner's own and download freely: refuse while one exists.
    bound = op.get_bind().scalar(
        sa.text(
            "SELECT count(*) FROM dataset_sources s JOIN datasets d ON d.id = s.dataset_id"
            " WHERE s.source_owner_id <> d.owner_id"
        )
    )
    if bound:
        raise RuntimeError(
            f"{bound} provenance rows bind job outputs to other owners' data;"
            " delete those outputs before downgrading below revision 0007"
        )
    with op.batch_alter_table("release_approvals", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_release_approvals_request_id"))
        batch_op.drop_index(batch_op.f("ix_release_approvals_owner_id"))

    op.drop_table("release_approvals")
    with op.batch_alter_table("dataset_sources", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_dataset_sources_source_id"))

    op.drop_table("dataset_sources")
    with op.batch_alter_table("release_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_release_requests_requester_id"))
        batch_op.drop_index(batch_op.f("ix_release_requests_dataset_id"))

    op.drop_table("release_requests")

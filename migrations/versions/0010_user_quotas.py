"""Quotas per user over all their workspaces (None: the settings' defaults).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

COLUMNS = (
    ("max_workspaces", sa.Integer()),
    ("storage_bytes_limit", sa.BigInteger()),
    ("max_concurrent_jobs", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        for name, type_ in COLUMNS:
            batch_op.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("users", schema=None) as batch_op:
        for name, _type in reversed(COLUMNS):
            batch_op.drop_column(name)

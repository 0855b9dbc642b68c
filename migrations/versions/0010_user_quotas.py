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


# Plain ALTER TABLE, not a batch: on SQLite a batch recreates `users`, which every other
# table references, and dropping it fails under foreign keys once any row points at it.


def upgrade() -> None:
    for name, type_ in COLUMNS:
        op.add_column("users", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    for name, _type in reversed(COLUMNS):
        op.drop_column("users", name)

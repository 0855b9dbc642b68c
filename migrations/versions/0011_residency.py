"""Residency: the clusters a grant lets its data go to, and a dataset's default set.

Revision ID: 0011
Revises: 0010

Both columns hold a sorted JSON list of cluster names; NULL means any cluster, which is
what every grant and dataset allowed before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = (
    ("access_requests", "clusters"),
    ("datasets", "default_clusters"),
)


# Plain ALTER TABLE, not a batch (as 0010): SQLite adds and drops a nullable column in place.


def upgrade() -> None:
    for table, name in COLUMNS:
        op.add_column(table, sa.Column(name, sa.JSON(), nullable=True))


def downgrade() -> None:
    for table, name in reversed(COLUMNS):
        op.drop_column(table, name)

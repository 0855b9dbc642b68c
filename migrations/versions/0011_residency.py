"""Residency and fair share.

Revision ID: 0011
Revises: 0010

Residency: the clusters a grant lets its data go to, and a dataset's default set; both
hold a sorted JSON list of cluster names, NULL meaning any cluster (what every grant and
dataset allowed before). Fair share: a cluster's role slots, a user's roles_per_cluster
(NULL: the settings' defaults), and when a job got its slots and why it waits. The jobs
live at the upgrade were dispatched already: they count as placed.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = (
    ("access_requests", "clusters", sa.JSON()),
    ("datasets", "default_clusters", sa.JSON()),
    ("clusters", "role_slots", sa.Integer()),
    ("users", "roles_per_cluster", sa.Integer()),
    ("jobs", "placed_at", sa.DateTime()),
    ("jobs", "waiting", sa.JSON()),
)


# Plain ALTER TABLE, not a batch (as 0010): SQLite adds and drops a nullable column in place.


def upgrade() -> None:
    for table, name, type_ in COLUMNS:
        op.add_column(table, sa.Column(name, type_, nullable=True))
    op.execute("UPDATE jobs SET placed_at = created_at WHERE status IN ('queued', 'running')")


def downgrade() -> None:
    for table, name, _type in reversed(COLUMNS):
        op.drop_column(table, name)

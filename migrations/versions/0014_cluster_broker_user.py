"""A cluster's broker user: whether it was made (and why not), and its password generation.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("clusters", sa.Column("broker_user", sa.String(16), nullable=True))
    op.add_column("clusters", sa.Column("broker_problem", sa.String(1000), nullable=True))
    op.add_column(
        "clusters",
        sa.Column("broker_generation", sa.Integer(), nullable=False, server_default="0"),
    )


# Plain ALTER TABLE, not a batch: on SQLite a batch recreates `clusters`, which other
# tables reference (see 0010).


def downgrade() -> None:
    for name in ("broker_generation", "broker_problem", "broker_user"):
        op.drop_column("clusters", name)

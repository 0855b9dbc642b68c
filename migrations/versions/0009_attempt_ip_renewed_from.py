"""Login attempts keep their address (a per-address limit); certificates their predecessor.

Plain ALTER TABLE, not batches: SQLite (3.35+) adds and drops these columns in place, and a
batch would recreate the tables.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("login_failures", sa.Column("ip", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_login_failures_ip"), "login_failures", ["ip"], unique=False)
    op.add_column("certificates", sa.Column("renewed_from", sa.String(length=64), nullable=True))
    op.create_index(
        op.f("ix_certificates_renewed_from"), "certificates", ["renewed_from"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_certificates_renewed_from"), table_name="certificates")
    op.drop_column("certificates", "renewed_from")
    op.drop_index(op.f("ix_login_failures_ip"), table_name="login_failures")
    op.drop_column("login_failures", "ip")

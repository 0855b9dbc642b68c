"""Login attempts keep their address (a per-address limit); certificates their predecessor.

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
    with op.batch_alter_table("login_failures", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ip", sa.String(length=64), nullable=True))
        batch_op.create_index(batch_op.f("ix_login_failures_ip"), ["ip"], unique=False)
    with op.batch_alter_table("certificates", schema=None) as batch_op:
        batch_op.add_column(sa.Column("renewed_from", sa.String(length=64), nullable=True))
        batch_op.create_index(
            batch_op.f("ix_certificates_renewed_from"), ["renewed_from"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("certificates", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_certificates_renewed_from"))
        batch_op.drop_column("renewed_from")
    with op.batch_alter_table("login_failures", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_login_failures_ip"))
        batch_op.drop_column("ip")

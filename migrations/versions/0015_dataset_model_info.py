"""A `model` dataset's description (architecture, sizes, tokenizer) as checked at upload.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("datasets", sa.Column("model_info", sa.JSON(), nullable=True))


# Plain ALTER TABLE (as 0010): a batch would recreate `datasets`, which grants reference.
def downgrade() -> None:
    op.drop_column("datasets", "model_info")

"""The audit log refuses TRUNCATE too (PostgreSQL); its chain becomes keyed and anchored.

Row triggers do not fire on TRUNCATE, so a statement-level trigger refuses it. SQLite
has no TRUNCATE (a DELETE without WHERE meets the row trigger).

Events written before this release stay as they are: their hashes are plain sha256 and
cannot be re-keyed without rewriting history. The control plane's first signed anchor
(written at its next start, under the data directory) records how far that unkeyed
chain reaches and pins its head; every later event is keyed. Nothing here changes rows.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        # audit_events_append_only() (0001) raises whatever the trigger's level
        op.execute(
            "CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events "
            "FOR EACH STATEMENT EXECUTE FUNCTION audit_events_append_only()"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_events_no_truncate ON audit_events")

"""The PostgreSQL privileges that leave the application's role unable to change the audit log.

The triggers refuse UPDATE, DELETE and TRUNCATE, but whoever owns a table can drop its
triggers. So the tables belong to a migration role and the control plane connects as
another one that may only INSERT and SELECT on `audit_events` (and cannot ALTER it).
"""

from __future__ import annotations

import re

from app.errors import Invalid

# PostgreSQL's unquoted identifiers, lower case: the role name goes into SQL text
_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def app_role_grants(role: str) -> list[str]:
    """The statements, run by the tables' owner after each upgrade, that scope `role`."""
    if not _ROLE_NAME.match(role):
        raise Invalid("a role name is lower-case letters, digits and _ (at most 63)")
    return [
        f"GRANT USAGE ON SCHEMA public TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role}",
        f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO {role}",
        # the audit log: append and read, nothing else
        f"REVOKE UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER ON audit_events FROM {role}",
        # migrations are the owner's, never the running application's
        f"REVOKE INSERT, UPDATE, DELETE, TRUNCATE ON alembic_version FROM {role}",
    ]

"""Imports every ORM model so that Base.metadata knows the whole schema (Alembic, tests)."""

from app.accounts.models import AuthToken, LoginFailure, User
from app.audit.models import AuditEvent
from app.db import Base
from app.workspaces.models import Workspace

__all__ = ["AuditEvent", "AuthToken", "Base", "LoginFailure", "User", "Workspace"]

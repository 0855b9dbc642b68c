"""Every router of the control plane, in one place."""

from __future__ import annotations

from fastapi import APIRouter

from app.accounts.routes import router as accounts_router
from app.audit.routes import router as audit_router
from app.ops.routes import router as ops_router
from app.workspaces.routes import router as workspaces_router


def api_routers() -> list[APIRouter]:
    """Routers mounted under /api/v1."""
    return [accounts_router, workspaces_router, audit_router]


def root_routers() -> list[APIRouter]:
    """Routers mounted at the root (operations)."""
    return [ops_router]

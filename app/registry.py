"""Every router of the control plane, in one place."""

from __future__ import annotations

from fastapi import APIRouter

from app.accounts.routes import router as accounts_router
from app.audit.routes import router as audit_router
from app.cluster_api.routes import router as cluster_api_router
from app.clusters.routes import router as clusters_router
from app.datasets.routes import router as datasets_router
from app.grants.routes import router as grants_router
from app.jobs.routes import router as jobs_router
from app.ops.routes import router as ops_router
from app.releases.routes import router as releases_router
from app.workspaces.routes import router as workspaces_router


def routers() -> list[APIRouter]:
    """Every router; API routers carry the /api/v1 prefix themselves.

    Requests are matched against the routers in this order, route by route, so the probes
    come first: a health check is answered without trying the API's hundred routes.
    """
    return [
        ops_router,
        accounts_router,
        workspaces_router,
        datasets_router,
        grants_router,
        releases_router,
        clusters_router,
        jobs_router,
        cluster_api_router,
        audit_router,
    ]

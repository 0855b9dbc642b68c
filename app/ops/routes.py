"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from sqlalchemy import text

from app.db import access_options
from app.ops.metrics import REGISTRY
from app.routing import api_router

router = api_router("operations", prefix="")


class HealthOut(BaseModel):
    status: str


class ReadyOut(BaseModel):
    ready: bool
    checks: dict[str, str]


class PrometheusResponse(Response):
    """The Prometheus text exposition format."""

    media_type = CONTENT_TYPE_LATEST


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:  # no I/O: answered on the loop, no hop to the thread pool
    """The process is up."""
    return HealthOut(status="ok")


@router.get(
    "/readyz",
    response_model=ReadyOut,
    responses={503: {"model": ReadyOut, "description": "The database or the broker is down"}},
)
async def readyz(request: Request) -> JSONResponse:
    """The database and the broker answer."""
    # on the probe's own thread (and pool connection): never behind tenants' requests
    checks = await anyio.to_thread.run_sync(
        _readiness_checks, request, limiter=request.app.state.probe_limiter
    )
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


def _readiness_checks(request: Request) -> dict[str, str]:
    checks: dict[str, str] = {}
    engine = request.app.state.engine
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(**access_options(engine.dialect.name, writes=False))
            conn.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:  # any failure means not ready
        checks["database"] = f"error: {type(exc).__name__}"
    broker_check = getattr(request.app.state, "broker_check", None)
    if broker_check is not None:
        try:
            broker_check()
            checks["broker"] = "ok"
        except Exception as exc:
            checks["broker"] = f"error: {type(exc).__name__}"
    return checks


@router.get("/metrics", response_class=PrometheusResponse)
def metrics() -> PrometheusResponse:
    """Prometheus text format."""
    return PrometheusResponse(generate_latest(REGISTRY))

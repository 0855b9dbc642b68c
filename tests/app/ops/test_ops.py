"""Liveness, readiness and metrics."""

from __future__ import annotations

import socket

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from support.platforms import Platform
from support.services import REDIS_URL, service_unavailable


def test_health_ready_and_metrics(client: TestClient, platform: Platform) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["database"] == "ok"
    alice = platform.user()
    client.get("/api/v1/me", headers=alice.headers)
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert (
        'nebula_http_requests_total{method="GET",route="/api/v1/me",status="200"}' in metrics.text
    )


def test_security_headers_on_every_answer(client: TestClient) -> None:
    answer = client.get("/api/v1/me")
    assert answer.status_code == 401
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["x-frame-options"] == "DENY"


def test_readyz_reports_a_dead_database(client: TestClient) -> None:
    client.app.state.engine.dispose()  # type: ignore[attr-defined]
    original = client.app.state.engine.url  # type: ignore[attr-defined]
    from app.db import make_engine

    client.app.state.engine = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")  # type: ignore[attr-defined]
    try:
        answer = client.get("/readyz")
    finally:
        client.app.state.engine = make_engine(str(original))  # type: ignore[attr-defined]
    assert answer.status_code == 503 and answer.json()["ready"] is False


def _readyz(settings: Settings, broker_url: str) -> tuple[int, dict[str, object]]:
    app = create_app(settings.model_copy(update={"broker_url": broker_url}))
    try:
        with TestClient(app) as client:
            answer = client.get("/readyz")
    finally:
        app.state.engine.dispose()
    return answer.status_code, answer.json()


def test_readyz_checks_the_embedded_broker(settings: Settings) -> None:
    status, body = _readyz(settings, "")
    assert status == 200 and body["checks"] == {"database": "ok", "broker": "ok"}


def test_readyz_names_a_broker_that_is_down(settings: Settings) -> None:
    with socket.socket() as sock:  # a port where nobody listens
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    status, body = _readyz(settings, f"redis://127.0.0.1:{port}/0")
    assert status == 503 and body["ready"] is False
    checks = body["checks"]
    assert isinstance(checks, dict)
    assert checks["database"] == "ok" and str(checks["broker"]).startswith("error")


@pytest.mark.services
def test_readyz_checks_redis(settings: Settings) -> None:
    import redis

    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except Exception as exc:
        service_unavailable("Redis", exc)
    status, body = _readyz(settings, REDIS_URL)
    assert status == 200 and body["checks"] == {"database": "ok", "broker": "ok"}

"""Liveness, readiness and metrics."""

from __future__ import annotations

from fastapi.testclient import TestClient

from support import Platform


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

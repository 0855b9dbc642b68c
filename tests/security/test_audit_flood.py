"""Finding 7 (issue 27): one user, or one address with no login, cannot grow the audit log
without end. Identical refusals within a window are one counted row; past a budget of
distinct refusals per user and per address, lookups answer 429 and only count. The counted
rows are ordinary events of the chain, and it verifies.
"""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.audit import service as audit
from app.audit.models import AuditEvent
from app.main import create_app
from app.settings import Settings
from support.platforms import Platform

API = "/api/v1"


def _events(platform: Platform, **where: str) -> list[AuditEvent]:
    with platform.factory() as db:
        query = select(AuditEvent).order_by(AuditEvent.seq)
        for name, value in where.items():
            query = query.where(getattr(AuditEvent, name) == value)
        return list(db.scalars(query))


def _count(platform: Platform) -> int:
    with platform.factory() as db:
        return db.scalar(select(func.count()).select_from(AuditEvent)) or 0


def _flush_and_verify(platform: Platform) -> None:
    """End every window now (as the server does at shutdown), then verify the chain."""
    with platform.factory() as db:
        audit.flush_refusals(db, everything=True)
        db.commit()
        verification = audit.verify(db, settings=platform.settings)
        assert verification.ok, verification


def test_200_identical_denied_lookups_are_one_row_and_one_counted_row(
    client: TestClient, platform: Platform
) -> None:
    alice, mallory = platform.user(), platform.user()
    workspace = client.get(f"{API}/workspaces", headers=alice.headers).json()["items"][0]["id"]
    before = _count(platform)
    answers = [
        client.get(f"{API}/workspaces/{workspace}", headers=mallory.headers).status_code
        for _ in range(200)
    ]
    assert answers == [404] * 200  # every repeat is still refused the same way
    assert _count(platform) - before == 1  # the first denial, at once
    _flush_and_verify(platform)
    denials = _events(platform, subject_id=workspace, outcome="denied")
    assert [(e.actor_id, e.details) for e in denials] == [
        (mallory.id, {"status": 404}),
        (mallory.id, {"status": 404, "repeats": 199, "window_s": 60.0}),
    ]
    assert denials[0].action == denials[1].action == "workspace.access"


def test_a_scan_of_distinct_ids_is_throttled_past_the_budget(
    client: TestClient, platform: Platform
) -> None:
    mallory = platform.user()
    budget = platform.settings.audit_refusals_per_window
    before = _count(platform)
    answers = [
        client.get(f"{API}/workspaces/{uuid.uuid4()}", headers=mallory.headers).status_code
        for _ in range(budget + 50)
    ]
    assert answers == [404] * budget + [429] * 50
    assert _count(platform) - before == budget
    _flush_and_verify(platform)
    throttled = _events(platform, actor_id=mallory.id, outcome="throttled")
    assert [(e.action, e.details) for e in throttled] == [
        ("workspace.access", {"status": 429, "count": 50, "window_s": 60.0})
    ]
    # only refusals are limited: what the user may see is still served
    assert client.get(f"{API}/workspaces", headers=mallory.headers).status_code == 200
    # the address's budget is spent too (every test client has the same one)
    other = platform.user()
    assert client.get(f"{API}/workspaces/{uuid.uuid4()}", headers=other.headers).status_code == 429


def test_logins_answered_429_collapse_into_one_counted_row(
    client: TestClient, platform: Platform
) -> None:
    victim = platform.user()
    wrong = {"email": victim.email, "password": "not-the-password-at-all"}
    failures = platform.settings.lockout_failures
    statuses = [client.post(f"{API}/auth/login", json=wrong).status_code for _ in range(100)]
    assert statuses == [401] * failures + [429] * (100 - failures)
    locked = _events(platform, subject_id=victim.email, outcome="locked")
    assert len(locked) == 1
    _flush_and_verify(platform)
    locked = _events(platform, subject_id=victim.email, outcome="locked")
    assert [e.details for e in locked] == [
        {"status": 429},
        {"status": 429, "repeats": 100 - failures - 1, "window_s": 60.0},
    ]


def test_the_server_appends_the_counts_when_it_stops(settings: Settings) -> None:
    app = create_app(settings)
    with TestClient(app) as client:
        platform = Platform(client, settings)
        alice, mallory = platform.user(), platform.user()
        workspace = client.get(f"{API}/workspaces", headers=alice.headers).json()
        path = f"{API}/workspaces/{workspace['items'][0]['id']}"
        for _ in range(20):
            assert client.get(path, headers=mallory.headers).status_code == 404
    try:
        denials = _events(platform, actor_id=mallory.id, outcome="denied")
        assert [e.details.get("repeats") for e in denials] == [None, 19]
        with platform.factory() as db:
            assert audit.verify(db, settings=settings).ok
    finally:
        app.state.engine.dispose()

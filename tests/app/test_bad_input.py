"""Bad input anywhere gets a clear 4xx and writes nothing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.accounts.models import Role, User
from app.audit.models import AuditEvent
from app.workspaces.models import Workspace
from support.platforms import Platform


def _counts(platform: Platform) -> tuple[int, int, int]:
    with platform.factory() as db:
        return tuple(  # type: ignore[return-value]
            db.scalar(select(func.count()).select_from(m)) or 0
            for m in (User, Workspace, AuditEvent)
        )


BAD_BODIES = [
    ("POST", "/api/v1/users", b"{not json", 422),
    (
        "POST",
        "/api/v1/users",
        b'{"email": 5, "display_name": "x", "password": "sapphire-kettle-88"}',
        422,
    ),
    (
        "POST",
        "/api/v1/users",
        b'{"email": "a@example.org", "display_name": "x", "password": "sapphire-kettle-88", "is_admin": true}',
        422,
    ),
    (
        "POST",
        "/api/v1/users",
        b'{"email": "a@example.org", "display_name": "x", "password": "sapphire-kettle-88", "role": "root"}',
        422,
    ),
    (
        "POST",
        "/api/v1/users",
        b'{"email": "not-an-email", "display_name": "x", "password": "sapphire-kettle-88"}',
        422,
    ),
    ("POST", "/api/v1/workspaces", b'{"name": ""}', 422),
    ("POST", "/api/v1/workspaces", b'{"name": "x", "owner_id": "someone"}', 422),
    ("POST", "/api/v1/workspaces", b'{"name": "bad\\u0000name"}', 422),
    ("POST", "/api/v1/workspaces", b"[]", 422),
    ("PATCH", "/api/v1/users/{admin}", b'{"role": 7}', 422),
    ("POST", "/api/v1/me/tokens", b'{"name": "t", "expires_in_days": 100000}', 422),
    ("POST", "/api/v1/me/tokens", b'{"name": "t", "expires_in_days": "soon"}', 422),
    ("GET", "/api/v1/audit?limit=100000", b"", 422),
    ("GET", "/api/v1/audit?since=yesterday", b"", 422),
    ("GET", "/api/v1/workspaces?offset=-1", b"", 422),
    ("GET", "/api/v1/catalog?q=%00", b"", 400),  # PostgreSQL text cannot hold NUL
]


@pytest.mark.parametrize(("method", "path", "body", "status"), BAD_BODIES)
def test_bad_input_is_4xx_and_changes_nothing(
    client: TestClient, platform: Platform, method: str, path: str, body: bytes, status: int
) -> None:
    admin = platform.user(Role.admin)
    before = _counts(platform)
    answer = client.request(
        method,
        path.format(admin=admin.id),
        content=body,
        headers={**admin.headers, "content-type": "application/json"},
    )
    assert answer.status_code == status, answer.text
    assert "detail" in answer.json()
    assert _counts(platform) == before


def test_oversized_body_is_413_and_changes_nothing(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    before = _counts(platform)
    huge = b'{"name": "' + b"x" * (2 * 1024 * 1024) + b'"}'
    answer = client.post(
        "/api/v1/workspaces",
        content=huge,
        headers={**admin.headers, "content-type": "application/json"},
    )
    assert answer.status_code == 413
    assert _counts(platform) == before


def test_chunked_oversized_body_is_413(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(40):
            yield b"x" * 65536

    answer = client.post(
        "/api/v1/workspaces",
        content=chunks(),
        headers={**admin.headers, "content-type": "application/json"},
    )
    assert answer.status_code == 413


def test_unknown_api_path_is_json_404(client: TestClient) -> None:
    answer = client.get("/api/v1/nothing-here")
    assert answer.status_code == 404 and answer.json()["detail"]

"""Every endpoint of the foundation, tried as each kind of caller, with the status it must answer."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.accounts.models import Role
from support import Account, Platform

CALLERS = ("anonymous", "member", "auditor", "admin", "other_member")


def _targets(platform: Platform) -> dict[str, Account]:
    return {
        "member": platform.user(Role.member),
        "auditor": platform.user(Role.auditor),
        "admin": platform.user(Role.admin),
        "other_member": platform.user(Role.member),
    }


# (method, path template, json body, expected status per caller)
# {ws} is the member's own extra workspace, {user} the member's id, {token} the member's API token;
# the member acting on their own account through admin routes still gets 403: roles come first.
MATRIX: list[tuple[str, str, dict | None, dict[str, int]]] = [
    (
        "GET",
        "/api/v1/me",
        None,
        dict(anonymous=401, member=200, auditor=200, admin=200, other_member=200),
    ),
    (
        "GET",
        "/api/v1/me/tokens",
        None,
        dict(anonymous=401, member=200, auditor=200, admin=200, other_member=200),
    ),
    (
        "GET",
        "/api/v1/me/audit",
        None,
        dict(anonymous=401, member=200, auditor=200, admin=200, other_member=200),
    ),
    (
        "DELETE",
        "/api/v1/me/tokens/{token}",
        None,
        dict(anonymous=401, member=204, auditor=404, admin=404, other_member=404),
    ),
    (
        "GET",
        "/api/v1/users",
        None,
        dict(anonymous=401, member=403, auditor=403, admin=200, other_member=403),
    ),
    (
        "GET",
        "/api/v1/users/{user}",
        None,
        dict(anonymous=401, member=403, auditor=403, admin=200, other_member=403),
    ),
    (
        "PATCH",
        "/api/v1/users/{user}",
        {"display_name": "X"},
        dict(anonymous=401, member=403, auditor=403, admin=200, other_member=403),
    ),
    (
        "POST",
        "/api/v1/users",
        {"email": "n@example.org", "display_name": "N", "password": "sapphire-kettle-88"},
        dict(anonymous=401, member=403, auditor=403, admin=201, other_member=403),
    ),
    (
        "POST",
        "/api/v1/users/{user}/suspend",
        None,
        dict(anonymous=401, member=403, auditor=403, admin=200, other_member=403),
    ),
    (
        "POST",
        "/api/v1/users/{user}/reactivate",
        None,
        dict(anonymous=401, member=403, auditor=403, admin=200, other_member=403),
    ),
    (
        "DELETE",
        "/api/v1/users/{user}",
        None,
        dict(anonymous=401, member=403, auditor=403, admin=204, other_member=403),
    ),
    (
        "GET",
        "/api/v1/workspaces",
        None,
        dict(anonymous=401, member=200, auditor=200, admin=200, other_member=200),
    ),
    (
        "POST",
        "/api/v1/workspaces",
        {"name": "new"},
        dict(anonymous=401, member=201, auditor=403, admin=201, other_member=201),
    ),
    (
        "GET",
        "/api/v1/workspaces/{ws}",
        None,
        dict(anonymous=401, member=200, auditor=404, admin=404, other_member=404),
    ),
    (
        "DELETE",
        "/api/v1/workspaces/{ws}",
        None,
        dict(anonymous=401, member=204, auditor=404, admin=404, other_member=404),
    ),
    (
        "PATCH",
        "/api/v1/workspaces/{ws}/quota",
        {"max_concurrent_jobs": 3},
        dict(anonymous=401, member=403, auditor=403, admin=200, other_member=403),
    ),
    (
        "GET",
        "/api/v1/audit",
        None,
        dict(anonymous=401, member=403, auditor=200, admin=200, other_member=403),
    ),
    (
        "GET",
        "/api/v1/audit/verify",
        None,
        dict(anonymous=401, member=403, auditor=200, admin=200, other_member=403),
    ),
    (
        "GET",
        "/api/v1/audit/export?format=csv",
        None,
        dict(anonymous=401, member=403, auditor=200, admin=200, other_member=403),
    ),
    (
        "GET",
        "/healthz",
        None,
        dict(anonymous=200, member=200, auditor=200, admin=200, other_member=200),
    ),
    (
        "GET",
        "/readyz",
        None,
        dict(anonymous=200, member=200, auditor=200, admin=200, other_member=200),
    ),
    (
        "GET",
        "/metrics",
        None,
        dict(anonymous=200, member=200, auditor=200, admin=200, other_member=200),
    ),
]


@pytest.mark.parametrize("caller", CALLERS)
def test_authorization_matrix(client: TestClient, platform: Platform, caller: str) -> None:
    accounts = _targets(platform)
    failures = []
    for method, template, body, expected in MATRIX:
        # fresh resources of the member for every row, so that destructive rows do not interact
        member = accounts["member"]
        ws = client.post(
            "/api/v1/workspaces",
            json={"name": f"ws-{len(failures)}-{template[-8:]}-{method}"},
            headers=member.headers,
        )
        token = client.post("/api/v1/me/tokens", json={"name": "t"}, headers=member.headers).json()[
            "id"
        ]
        path = template.format(ws=ws.json()["id"], user=member.id, token=token)
        headers = {} if caller == "anonymous" else accounts[caller].headers
        answer = client.request(method, path, json=body, headers=headers)
        want = expected[caller]
        if answer.status_code != want:
            failures.append(f"{method} {template} as {caller}: {answer.status_code} != {want}")
        if template == "/api/v1/users/{user}/suspend" and answer.status_code == 200:
            client.post(f"/api/v1/users/{member.id}/reactivate", headers=accounts["admin"].headers)
            member.token = platform.login(member.email)
        if method == "DELETE" and template == "/api/v1/users/{user}" and answer.status_code == 204:
            accounts["member"] = platform.user(Role.member)
        if method == "POST" and template == "/api/v1/users" and answer.status_code == 201:
            client.delete(f"/api/v1/users/{answer.json()['id']}", headers=accounts["admin"].headers)
    assert not failures, "\n".join(failures)


def test_another_tenants_workspace_is_404_and_the_attempt_is_audited(
    client: TestClient, platform: Platform
) -> None:
    alice, mallory, admin = platform.user(), platform.user(), platform.user(Role.admin)
    ws = client.post("/api/v1/workspaces", json={"name": "secret"}, headers=alice.headers).json()
    missing = client.get(
        "/api/v1/workspaces/00000000-0000-0000-0000-000000000000", headers=mallory.headers
    )
    theirs = client.get(f"/api/v1/workspaces/{ws['id']}", headers=mallory.headers)
    assert missing.status_code == theirs.status_code == 404
    assert missing.json() == theirs.json()  # existence is not revealed
    denied = client.get(
        f"/api/v1/audit?actor_id={mallory.id}&outcome=denied", headers=admin.headers
    ).json()
    assert ws["id"] in {e["subject_id"] for e in denied["items"]}

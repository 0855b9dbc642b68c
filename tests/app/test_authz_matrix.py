"""Every endpoint of the foundation, tried as each kind of caller, with the status it must answer."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.accounts.models import Role
from support.platforms import Account, Platform

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


# Datasets and access requests. {ws} is the member's workspace, {ds} a discoverable dataset
# in it, {grant} the grantee's approved request for {ds}, {pending} another user's pending
# request for {ds}. The admin is no owner: another tenant's data is 404 to admins too.
DATA_CALLERS = ("anonymous", "member", "auditor", "admin", "other_member", "grantee")
DATA_MATRIX: list[tuple[str, str, dict | None, dict[str, int]]] = [
    (
        "UPLOAD",
        "/api/v1/workspaces/{ws}/datasets",
        None,
        dict(anonymous=401, member=201, auditor=403, admin=404, other_member=404, grantee=404),
    ),
    (
        "GET",
        "/api/v1/workspaces/{ws}/datasets",
        None,
        dict(anonymous=401, member=200, auditor=404, admin=404, other_member=404, grantee=404),
    ),
    (
        "GET",
        "/api/v1/datasets/{ds}",
        None,
        dict(anonymous=401, member=200, auditor=404, admin=404, other_member=404, grantee=200),
    ),
    (
        "GET",
        "/api/v1/datasets/{ds}/content",
        None,
        dict(anonymous=401, member=200, auditor=404, admin=404, other_member=404, grantee=403),
    ),
    (
        "PATCH",
        "/api/v1/datasets/{ds}",
        {"discoverable": False},
        dict(anonymous=401, member=200, auditor=403, admin=404, other_member=404, grantee=403),
    ),
    (
        "DELETE",
        "/api/v1/datasets/{ds}",
        None,
        dict(anonymous=401, member=204, auditor=403, admin=404, other_member=404, grantee=403),
    ),
    (
        "GET",
        "/api/v1/catalog",
        None,
        dict(anonymous=401, member=200, auditor=200, admin=200, other_member=200, grantee=200),
    ),
    (
        "POST",
        "/api/v1/access-requests",
        {"dataset_id": "{ds}", "purpose": "research"},
        dict(anonymous=401, member=409, auditor=403, admin=201, other_member=201, grantee=409),
    ),
    (
        "GET",
        "/api/v1/access-requests",
        None,
        dict(anonymous=401, member=200, auditor=200, admin=200, other_member=200, grantee=200),
    ),
    (
        "GET",
        "/api/v1/access-requests/{grant}",
        None,
        dict(anonymous=401, member=200, auditor=404, admin=404, other_member=404, grantee=200),
    ),
    (
        "POST",
        "/api/v1/access-requests/{pending}/approve",
        None,
        dict(anonymous=401, member=200, auditor=403, admin=404, other_member=404, grantee=404),
    ),
    (
        "POST",
        "/api/v1/access-requests/{pending}/deny",
        None,
        dict(anonymous=401, member=200, auditor=403, admin=404, other_member=404, grantee=404),
    ),
    (
        "POST",
        "/api/v1/access-requests/{grant}/revoke",
        None,
        dict(anonymous=401, member=200, auditor=403, admin=404, other_member=404, grantee=403),
    ),
    (
        "POST",
        "/api/v1/access-requests/{grant}/withdraw",
        None,
        dict(anonymous=401, member=403, auditor=403, admin=404, other_member=404, grantee=200),
    ),
]


def _upload(client: TestClient, owner: Account, ws: str, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return client.post(
        f"/api/v1/workspaces/{ws}/datasets",
        files={"file": ("c.txt", b"one sentence\nanother one\n")},
        data={"name": "corpus", "kind": "text", "discoverable": "true"},
        headers=owner.headers if headers is None else headers,
    )


@pytest.mark.parametrize("caller", DATA_CALLERS)
def test_dataset_and_access_request_matrix(
    client: TestClient, platform: Platform, caller: str
) -> None:
    accounts = {**_targets(platform), "grantee": platform.user(Role.member)}
    failures = []
    for number, (method, template, body, expected) in enumerate(DATA_MATRIX):
        # fresh resources for every row, so that destructive rows do not interact
        member, grantee = accounts["member"], accounts["grantee"]
        ws = client.post(
            "/api/v1/workspaces", json={"name": f"data-{number}"}, headers=member.headers
        ).json()["id"]
        ds = _upload(client, member, ws).json()["id"]
        grant = client.post(
            "/api/v1/access-requests",
            json={"dataset_id": ds, "purpose": "jobs"},
            headers=grantee.headers,
        ).json()["id"]
        client.post(f"/api/v1/access-requests/{grant}/approve", headers=member.headers)
        pending = client.post(
            "/api/v1/access-requests",
            json={"dataset_id": ds, "purpose": "jobs"},
            headers=platform.user(Role.member).headers,
        ).json()["id"]
        values = dict(ws=ws, ds=ds, grant=grant, pending=pending)
        path = template.format(**values)
        if body is not None:
            body = {k: v.format(**values) if isinstance(v, str) else v for k, v in body.items()}
        headers = {} if caller == "anonymous" else accounts[caller].headers
        if method == "UPLOAD":
            answer = _upload(client, member, ws, headers=headers)
        else:
            answer = client.request(method, path, json=body, headers=headers)
        want = expected[caller]
        if answer.status_code != want:
            failures.append(f"{method} {template} as {caller}: {answer.status_code} != {want}")
    assert not failures, "\n".join(failures)

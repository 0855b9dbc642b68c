"""Login, sessions, API tokens, lockout, password policy, account life cycle."""

from __future__ import annotations

from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from app.accounts.models import AuthToken, LoginFailure, Role, User
from app.audit.models import AuditEvent
from app.db import utcnow
from support.platforms import PASSWORD, Platform

LOGIN = "/api/v1/auth/login"


def count(platform: Platform, model: type) -> int:
    with platform.factory() as db:
        return db.scalar(select(func.count()).select_from(model)) or 0


def test_login_gives_a_working_token_and_cookies(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    answer = client.post(LOGIN, json={"email": alice.email.upper(), "password": PASSWORD})
    assert answer.status_code == 200
    body = answer.json()
    assert body["user"]["email"] == alice.email
    assert body["token"].startswith("nbs_")
    assert "HttpOnly" in answer.headers["set-cookie"]
    assert "SameSite=strict" in answer.headers["set-cookie"]
    me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {body['token']}"})
    assert me.json()["id"] == alice.id
    with platform.factory() as db:
        stored = db.scalars(select(AuthToken.token_hash)).all()
    assert body["token"] not in stored  # only hashes are kept


def test_unknown_user_and_wrong_password_answer_alike(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    wrong = client.post(LOGIN, json={"email": alice.email, "password": "not-the-password-1"})
    unknown = client.post(LOGIN, json={"email": "nobody@example.org", "password": PASSWORD})
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.json() == unknown.json()
    with platform.factory() as db:
        failures = db.scalars(
            select(AuditEvent).where(
                AuditEvent.action == "auth.login", AuditEvent.outcome == "failure"
            )
        ).all()
    assert len(failures) == 2


def test_lockout_after_five_failures_until_the_window_passes(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    for _ in range(5):
        assert (
            client.post(
                LOGIN, json={"email": alice.email, "password": "wrong-password-x"}
            ).status_code
            == 401
        )
    locked = client.post(LOGIN, json={"email": alice.email, "password": PASSWORD})
    assert locked.status_code == 429
    # another account is not affected
    bob = platform.user()
    assert client.post(LOGIN, json={"email": bob.email, "password": PASSWORD}).status_code == 200
    # the window passes: move the failures 16 minutes into the past
    with platform.factory() as db:
        db.execute(update(LoginFailure).values(at=utcnow() - timedelta(minutes=16)))
        db.commit()
    assert client.post(LOGIN, json={"email": alice.email, "password": PASSWORD}).status_code == 200


def test_logout_kills_the_token_on_the_next_request(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    assert client.post("/api/v1/auth/logout", headers=alice.headers).status_code == 204
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 401


def test_api_token_shown_once_listed_without_secret_and_revocable(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    created = client.post(
        "/api/v1/me/tokens", json={"name": "ci", "expires_in_days": 7}, headers=alice.headers
    )
    assert created.status_code == 201
    secret = created.json()["token"]
    assert secret.startswith("nbt_")
    api_headers = {"Authorization": f"Bearer {secret}"}
    assert client.get("/api/v1/me", headers=api_headers).status_code == 200
    listed = client.get("/api/v1/me/tokens", headers=alice.headers).json()
    assert listed["total"] == 1 and "token" not in listed["items"][0]
    token_id = created.json()["id"]
    assert client.delete(f"/api/v1/me/tokens/{token_id}", headers=alice.headers).status_code == 204
    assert client.get("/api/v1/me", headers=api_headers).status_code == 401


def test_expired_api_token_is_refused(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    created = client.post("/api/v1/me/tokens", json={"name": "short"}, headers=alice.headers).json()
    with platform.factory() as db:
        db.execute(
            update(AuthToken)
            .where(AuthToken.id == created["id"])
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
        db.commit()
    assert (
        client.get(
            "/api/v1/me", headers={"Authorization": f"Bearer {created['token']}"}
        ).status_code
        == 401
    )


def test_another_users_token_cannot_be_revoked(client: TestClient, platform: Platform) -> None:
    alice, mallory = platform.user(), platform.user()
    token = client.post("/api/v1/me/tokens", json={"name": "x"}, headers=alice.headers).json()
    assert (
        client.delete(f"/api/v1/me/tokens/{token['id']}", headers=mallory.headers).status_code
        == 404
    )
    assert (
        client.get("/api/v1/me", headers={"Authorization": f"Bearer {token['token']}"}).status_code
        == 200
    )


def test_password_change_revokes_other_sessions(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    other_session = platform.login(alice.email)
    changed = client.post(
        "/api/v1/me/password",
        json={"current_password": PASSWORD, "new_password": "amber-lantern-oak-977"},
        headers=alice.headers,
    )
    assert changed.status_code == 204
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 200
    assert (
        client.get("/api/v1/me", headers={"Authorization": f"Bearer {other_session}"}).status_code
        == 401
    )
    assert client.post(LOGIN, json={"email": alice.email, "password": PASSWORD}).status_code == 401
    assert (
        client.post(
            LOGIN, json={"email": alice.email, "password": "amber-lantern-oak-977"}
        ).status_code
        == 200
    )


def test_weak_passwords_are_refused(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    users_before = count(platform, User)
    for weak in ("short-1", "password1234", "carol.smith@example.org", "xxcarol.smithxx-1"):
        answer = client.post(
            "/api/v1/users",
            json={"email": "carol.smith@example.org", "display_name": "Carol", "password": weak},
            headers=admin.headers,
        )
        assert answer.status_code == 422, weak
        assert "password" in answer.json()["detail"]
    assert count(platform, User) == users_before
    change = client.post(
        "/api/v1/me/password",
        json={"current_password": PASSWORD, "new_password": "qwerty123456"},
        headers=admin.headers,
    )
    assert change.status_code == 422


def test_duplicate_email_is_409_and_writes_nothing(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    alice = platform.user()
    users, events = count(platform, User), count(platform, AuditEvent)
    answer = client.post(
        "/api/v1/users",
        json={
            "email": alice.email.upper(),
            "display_name": "Alice 2",
            "password": "granite-meadow-51",
        },
        headers=admin.headers,
    )
    assert answer.status_code == 409
    assert (count(platform, User), count(platform, AuditEvent)) == (users, events)


def test_suspension_cuts_off_a_logged_in_user_and_reactivation_restores_login(
    client: TestClient, platform: Platform
) -> None:
    admin, alice = platform.user(Role.admin), platform.user()
    api = client.post("/api/v1/me/tokens", json={"name": "x"}, headers=alice.headers).json()[
        "token"
    ]
    assert (
        client.post(f"/api/v1/users/{alice.id}/suspend", headers=admin.headers).status_code == 200
    )
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 401
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {api}"}).status_code == 401
    assert client.post(LOGIN, json={"email": alice.email, "password": PASSWORD}).status_code == 401
    assert (
        client.post(f"/api/v1/users/{alice.id}/reactivate", headers=admin.headers).status_code
        == 200
    )
    assert client.post(LOGIN, json={"email": alice.email, "password": PASSWORD}).status_code == 200
    # the old credentials stay dead
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {api}"}).status_code == 401


def test_deleted_user_cannot_log_in_and_audit_is_kept(
    client: TestClient, platform: Platform
) -> None:
    admin, alice = platform.user(Role.admin), platform.user()
    assert client.delete(f"/api/v1/users/{alice.id}", headers=admin.headers).status_code == 204
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 401
    assert client.post(LOGIN, json={"email": alice.email, "password": PASSWORD}).status_code == 401
    assert (
        client.get(f"/api/v1/users/{alice.id}", headers=admin.headers).json()["status"] == "deleted"
    )
    events = client.get(f"/api/v1/audit?subject_id={alice.id}", headers=admin.headers).json()
    assert {"user.create", "user.delete"} <= {e["action"] for e in events["items"]}


def test_admin_cannot_lock_themselves_out(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    assert (
        client.post(f"/api/v1/users/{admin.id}/suspend", headers=admin.headers).status_code == 409
    )
    assert (
        client.patch(
            f"/api/v1/users/{admin.id}", json={"role": "member"}, headers=admin.headers
        ).status_code
        == 409
    )


def test_cookie_auth_needs_the_csrf_header_on_unsafe_requests(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    login = client.post(LOGIN, json={"email": alice.email, "password": PASSWORD})
    csrf = login.cookies["nebula_csrf"]
    assert client.get("/api/v1/me").status_code == 200  # cookie alone reads
    refused = client.post("/api/v1/workspaces", json={"name": "no-csrf"})
    assert refused.status_code == 403
    forged = client.post(
        "/api/v1/workspaces", json={"name": "forged"}, headers={"X-CSRF-Token": "0" * 64}
    )
    assert forged.status_code == 403
    ok = client.post(
        "/api/v1/workspaces", json={"name": "with-csrf"}, headers={"X-CSRF-Token": csrf}
    )
    assert ok.status_code == 201
    # a CSRF value of another session does not fit this one
    other = platform.login(alice.email)
    client.cookies.set("nebula_session", other)
    assert (
        client.post(
            "/api/v1/workspaces", json={"name": "x2"}, headers={"X-CSRF-Token": csrf}
        ).status_code
        == 403
    )


def test_api_token_is_not_accepted_as_a_cookie(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    api = client.post("/api/v1/me/tokens", json={"name": "x"}, headers=alice.headers).json()[
        "token"
    ]
    client.cookies.set("nebula_session", api)
    assert client.get("/api/v1/me").status_code == 401


def test_my_audit_shows_my_events_only(client: TestClient, platform: Platform) -> None:
    alice, bob = platform.user(), platform.user()
    client.post("/api/v1/workspaces", json={"name": "alice-ws"}, headers=alice.headers)
    mine = client.get("/api/v1/me/audit", headers=alice.headers).json()["items"]
    assert mine and all(
        alice.id in (e["actor_id"], e["subject_id"]) or e["subject_type"] == "workspace"
        for e in mine
    )
    assert all(e["actor_id"] != bob.id and e["subject_id"] != bob.id for e in mine)

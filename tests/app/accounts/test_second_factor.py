"""The TOTP second factor through the API: enrolment, sign-in, recovery codes, admins, tokens."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.accounts import totp
from app.accounts.models import AuthToken, RecoveryCode, Role, TotpFactor
from app.audit.models import AuditEvent
from app.main import create_app
from app.settings import Settings
from support.platforms import PASSWORD, Account, Platform

LOGIN = "/api/v1/auth/login"
TOTP = "/api/v1/me/totp"
HARDWARE_SEED = "JBSWY3DPEHPK3PXPJBSWY3DPEHPK3PXP"


def code(secret: str, offset: int = 0) -> str:
    """The code of the step `offset` steps from now."""
    return totp.hotp(totp.decode_secret(secret), totp.step_at(time.time()) + offset)


def wrong_code(secret: str) -> str:
    window = {code(secret, offset) for offset in range(-2, 3)}
    return next(f"{n:06d}" for n in range(1_000_000) if f"{n:06d}" not in window)


def enrol(client: TestClient, account: Account, secret: str | None = None) -> tuple[str, list[str]]:
    """Enrol and confirm a factor for `account`; its secret and recovery codes."""
    begun = client.post(
        TOTP, json={} if secret is None else {"secret": secret}, headers=account.headers
    )
    assert begun.status_code == 201, begun.text
    enrolled_secret = begun.json()["secret"]
    confirmed = client.post(
        f"{TOTP}/confirm", json={"code": code(enrolled_secret, -1)}, headers=account.headers
    )
    assert confirmed.status_code == 200, confirmed.text
    return enrolled_secret, confirmed.json()["recovery_codes"]


def login(client: TestClient, account: Account, otp: str | None = None) -> tuple[int, str]:
    body = {"email": account.email, "password": PASSWORD}
    if otp is not None:
        body["otp"] = otp
    answer = client.post(LOGIN, json=body)
    client.cookies.clear()
    return answer.status_code, answer.json().get("detail") or answer.json()["token"]


def test_enrolment_shows_a_qr_code_and_sign_in_then_needs_a_code(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    begun = client.post(TOTP, json={}, headers=alice.headers)
    assert begun.status_code == 201
    assert begun.headers["cache-control"] == "no-store"
    body = begun.json()
    assert body["otpauth_uri"].startswith(f"otpauth://totp/Nebula:{alice.email}?secret=")
    assert body["qr_svg"].startswith("<svg") and "<path" in body["qr_svg"]
    secret = body["secret"]
    # not active until proven: sign-in without a code still works
    assert login(client, alice)[0] == 200
    wrong = client.post(f"{TOTP}/confirm", json={"code": wrong_code(secret)}, headers=alice.headers)
    assert wrong.status_code == 400
    codes = client.post(f"{TOTP}/confirm", json={"code": code(secret)}, headers=alice.headers)
    assert codes.status_code == 200
    recovery = codes.json()["recovery_codes"]
    assert len(set(recovery)) == 10
    with platform.factory() as db:
        factor = db.get(TotpFactor, alice.id)
        assert factor is not None and secret not in factor.secret_sealed
        digests = db.scalars(select(RecoveryCode.code_digest)).all()
    assert len(digests) == 10 and not set(recovery) & set(digests)
    assert client.get(TOTP, headers=alice.headers).json() == {
        "enrolled": True,
        "recovery_codes_left": 10,
        "required": False,
    }

    assert login(client, alice) == (401, "a second-factor code is required")
    status, token = login(client, alice, code(secret, 1))
    assert status == 200
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_reused_stale_and_wrong_codes_are_refused(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    secret, _codes = enrol(client, alice)  # spent the step before now
    assert login(client, alice, code(secret, -1)) == (401, "wrong second-factor code")  # reused
    assert login(client, alice, code(secret, -2))[0] == 401  # stale: outside the window
    assert login(client, alice, wrong_code(secret))[0] == 401
    assert login(client, alice, "12345a")[0] == 401
    assert login(client, alice, code(secret))[0] == 200
    assert login(client, alice, code(secret))[0] == 401  # the same code twice
    with platform.factory() as db:
        failures = db.scalars(
            select(AuditEvent.details).where(
                AuditEvent.action == "auth.login", AuditEvent.outcome == "failure"
            )
        ).all()
    assert len(failures) == 5 and all(d == {"factor": "totp"} for d in failures)


def test_recovery_codes_work_once_each(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    _secret, recovery = enrol(client, alice)
    assert login(client, alice, recovery[0].upper())[0] == 200
    assert login(client, alice, recovery[0])[0] == 401
    assert login(client, alice, recovery[1].replace("-", ""))[0] == 200
    assert client.get(TOTP, headers=alice.headers).json()["recovery_codes_left"] == 8
    bob = platform.user()
    enrol(client, bob)
    assert login(client, bob, recovery[2])[0] == 401  # alice's code is not bob's


def test_wrong_codes_lock_the_account_out_like_passwords(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    secret, _codes = enrol(client, alice)
    for _ in range(platform.settings.lockout_failures):
        assert login(client, alice, wrong_code(secret))[0] == 401
    assert login(client, alice, code(secret))[0] == 429  # even with the right code now


def test_minting_an_api_token_needs_a_fresh_code(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    old_api = client.post("/api/v1/me/tokens", json={"name": "before"}, headers=alice.headers)
    secret, recovery = enrol(client, alice)
    for otp in (None, wrong_code(secret), code(secret, -1)):  # none, wrong, already used
        body: dict[str, object] = {"name": "script"}
        if otp is not None:
            body["otp"] = otp
        refused = client.post("/api/v1/me/tokens", json=body, headers=alice.headers)
        assert refused.status_code == 403, refused.text
    minted = client.post(
        "/api/v1/me/tokens", json={"name": "script", "otp": code(secret)}, headers=alice.headers
    )
    assert minted.status_code == 201
    by_recovery = client.post(
        "/api/v1/me/tokens", json={"name": "other", "otp": recovery[0]}, headers=alice.headers
    )
    assert by_recovery.status_code == 201
    # API tokens themselves need no code, the one from before the factor included
    for token in (minted.json()["token"], old_api.json()["token"]):
        me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {token}"})
        assert me.status_code == 200
    with platform.factory() as db:
        names = db.scalars(select(AuthToken.name).where(AuthToken.kind == "api")).all()
    assert sorted(names) == ["before", "other", "script"]


def test_a_secret_in_use_by_another_account_is_refused(
    client: TestClient, platform: Platform
) -> None:
    alice, bob = platform.user(), platform.user()
    enrol(client, alice, HARDWARE_SEED)
    for spelling in (
        HARDWARE_SEED,
        HARDWARE_SEED.lower(),
        " ".join(HARDWARE_SEED[i : i + 4] for i in range(0, 32, 4)),
    ):
        refused = client.post(TOTP, json={"secret": spelling}, headers=bob.headers)
        assert refused.status_code == 409, refused.text
    with platform.factory() as db:
        assert db.get(TotpFactor, bob.id) is None
        outcomes = db.scalars(
            select(AuditEvent.outcome).where(
                AuditEvent.action == "user.totp.enrol", AuditEvent.subject_id == bob.id
            )
        ).all()
    assert outcomes == ["failure"] * 3
    assert login(client, bob)[0] == 200  # bob still signs in without a factor


@pytest.mark.parametrize("secret", ["not base32!" * 3, "A" * 129, "MFRGG===" * 4, "AAAA"])
def test_malformed_secrets_are_refused(client: TestClient, platform: Platform, secret: str) -> None:
    alice = platform.user()
    answer = client.post(TOTP, json={"secret": secret}, headers=alice.headers)
    assert answer.status_code == 422
    with platform.factory() as db:
        assert db.get(TotpFactor, alice.id) is None


def test_removing_the_factor_needs_a_code(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    secret, _codes = enrol(client, alice)
    refused = client.post(
        f"{TOTP}/remove", json={"code": wrong_code(secret)}, headers=alice.headers
    )
    assert refused.status_code == 403
    removed = client.post(f"{TOTP}/remove", json={"code": code(secret)}, headers=alice.headers)
    assert removed.status_code == 204
    assert login(client, alice)[0] == 200
    with platform.factory() as db:
        assert db.scalars(select(RecoveryCode)).all() == []


@pytest.fixture
def strict_client(settings: Settings) -> Iterator[TestClient]:
    """The same database served by an app that requires admins to have a second factor."""
    app = create_app(settings.model_copy(update={"require_admin_totp": True}))
    with TestClient(app) as test_client:
        yield test_client
    app.state.engine.dispose()


def test_an_admin_without_a_factor_can_only_enrol(
    client: TestClient, platform: Platform, strict_client: TestClient
) -> None:
    admin = platform.user(Role.admin)
    old_api = client.post("/api/v1/me/tokens", json={"name": "ci"}, headers=admin.headers).json()
    member = platform.user()
    answer = strict_client.post(LOGIN, json={"email": admin.email, "password": PASSWORD})
    assert answer.status_code == 200
    strict_client.cookies.clear()
    limited = {"Authorization": f"Bearer {answer.json()['token']}"}
    for method, path in [
        ("GET", "/api/v1/users"),
        ("GET", "/api/v1/workspaces"),
        ("POST", f"/api/v1/users/{member.id}/suspend"),
        ("POST", "/api/v1/me/tokens"),
    ]:
        refused = strict_client.request(method, path, headers=limited, json={"name": "x"})
        assert refused.status_code == 403, (path, refused.text)
        assert "enrol a second factor" in refused.json()["detail"]
    assert strict_client.get("/api/v1/me", headers=limited).status_code == 200
    assert strict_client.get(TOTP, headers=limited).json()["required"] is True
    # members are not held to it, and API tokens made before keep working
    assert login(strict_client, member)[0] == 200
    old = {"Authorization": f"Bearer {old_api['token']}"}
    assert strict_client.get("/api/v1/users", headers=old).status_code == 200

    secret = strict_client.post(TOTP, json={}, headers=limited).json()["secret"]
    confirmed = strict_client.post(f"{TOTP}/confirm", json={"code": code(secret)}, headers=limited)
    assert confirmed.status_code == 200
    assert strict_client.get("/api/v1/users", headers=limited).status_code == 200
    refused = strict_client.post(f"{TOTP}/remove", json={"code": code(secret, 1)}, headers=limited)
    assert refused.status_code == 409  # an admin keeps the factor the platform requires
    status, _detail = login(strict_client, Account(admin.id, admin.email, Role.admin, ""))
    assert status == 401  # a code is now needed

"""Password recovery: admin-issued links, "forgot password" through a real SMTP server."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from app.accounts.models import PasswordReset, ResetRequest, Role, User
from app.audit.models import AuditEvent
from app.db import utcnow
from app.main import create_app
from app.settings import Settings
from support.platforms import PASSWORD, Platform

FORGOT = "/api/v1/auth/forgot-password"
RESET = "/api/v1/auth/reset-password"
LOGIN = "/api/v1/auth/login"
NEW_PASSWORD = "amber-lantern-quartz-77"
REPO = Path(__file__).resolve().parents[3]
LINK = re.compile(r"http://\S+/reset-password#token=(nbr_[A-Za-z0-9_-]+)")


@dataclass
class Mailbox:
    """What the SMTP server received; `hold` keeps it from answering until released."""

    messages: list[Message] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)
    hold: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.hold.set()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        await asyncio.get_running_loop().run_in_executor(None, self.hold.wait)
        with self.arrived:
            self.messages.append(message_from_bytes(envelope.content))
            self.arrived.notify_all()
        return "250 OK"

    def wait_for(self, count: int, deadline_s: float = 20.0) -> list[Message]:
        """The first `count` messages, once they are in (or fail at the deadline)."""
        end = time.monotonic() + deadline_s
        with self.arrived:
            while len(self.messages) < count:
                left = end - time.monotonic()
                assert left > 0, f"{len(self.messages)} messages arrived, {count} expected"
                self.arrived.wait(left)
            return list(self.messages)


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    box = Mailbox()
    with socket.socket() as probe:  # aiosmtpd's controller cannot bind port 0 itself
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield box, port
    finally:
        box.hold.set()
        controller.stop()


@pytest.fixture
def mail_settings(settings: Settings, mailbox: tuple[Mailbox, int]) -> Settings:
    return settings.model_copy(
        update={
            "smtp_host": "127.0.0.1",
            "smtp_port": mailbox[1],
            "smtp_starttls": False,  # aiosmtpd here offers no TLS
            "smtp_from": "nebula@example.org",
            "public_url": "http://nebula.example.org",
        }
    )


@pytest.fixture
def mail_client(mail_settings: Settings) -> Iterator[TestClient]:
    app = create_app(mail_settings)
    with TestClient(app) as test_client:
        yield test_client
    app.state.engine.dispose()


@pytest.fixture
def mail_platform(mail_client: TestClient, mail_settings: Settings) -> Platform:
    return Platform(mail_client, mail_settings)


def token_of(url: str) -> str:
    found = LINK.fullmatch(url)
    assert found is not None, url
    return found.group(1)


def link_in(message: Message) -> str:
    body = message.get_payload(decode=True)
    assert isinstance(body, bytes)
    found = LINK.search(body.decode())
    assert found is not None, body
    return found.group(1)


def audit_actions(platform: Platform, action: str) -> list[tuple[str, str]]:
    with platform.factory() as db:
        rows = db.execute(
            select(AuditEvent.outcome, AuditEvent.subject_id)
            .where(AuditEvent.action == action)
            .order_by(AuditEvent.seq)
        ).all()
    return [(outcome, subject) for outcome, subject in rows]


def test_an_admin_link_works_once_and_ends_every_session(
    client: TestClient, platform: Platform
) -> None:
    admin = platform.user(Role.admin)
    alice = platform.user()
    other_session = platform.login(alice.email)
    api_token = client.post(
        "/api/v1/me/tokens", json={"name": "script"}, headers=alice.headers
    ).json()["token"]

    answer = client.post(f"/api/v1/users/{alice.id}/reset-link", headers=admin.headers)
    assert answer.status_code == 201, answer.text
    assert answer.headers["cache-control"] == "no-store"
    token = token_of(answer.json()["url"])
    with platform.factory() as db:
        stored = db.scalars(select(PasswordReset.token_hash)).all()
    assert len(stored) == 1 and token not in stored[0]  # only its hash is kept
    assert ("success", alice.id) in audit_actions(platform, "user.reset_link")

    used = client.post(RESET, json={"token": token, "new_password": NEW_PASSWORD})
    assert used.status_code == 204, used.text
    for old in (alice.token, other_session, api_token):
        me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {old}"})
        assert me.status_code == 401
    assert client.post(LOGIN, json={"email": alice.email, "password": PASSWORD}).status_code == 401
    platform.login(alice.email, NEW_PASSWORD)

    again = client.post(RESET, json={"token": token, "new_password": "another-pass-phrase-9"})
    assert again.status_code == 400
    assert "invalid, already used or expired" in again.json()["detail"]
    platform.login(alice.email, NEW_PASSWORD)  # the second use changed nothing
    assert ("failure", audit_ids(platform)[0]) in audit_actions(platform, "auth.password_reset")
    assert ("success", alice.id) in audit_actions(platform, "user.password_reset")


def audit_ids(platform: Platform) -> list[str]:
    with platform.factory() as db:
        return list(db.scalars(select(PasswordReset.id)).all())


def test_only_admins_issue_links_and_never_for_another_tenant(
    client: TestClient, platform: Platform
) -> None:
    alice, bob = platform.user(), platform.user()
    refused = client.post(f"/api/v1/users/{bob.id}/reset-link", headers=alice.headers)
    assert refused.status_code == 403
    assert audit_ids(platform) == []


def test_an_expired_link_fails_and_changes_nothing(client: TestClient, platform: Platform) -> None:
    admin, alice = platform.user(Role.admin), platform.user()
    url = client.post(f"/api/v1/users/{alice.id}/reset-link", headers=admin.headers).json()["url"]
    with platform.factory() as db:
        db.execute(update(PasswordReset).values(expires_at=utcnow()))
        db.commit()
    answer = client.post(RESET, json={"token": token_of(url), "new_password": NEW_PASSWORD})
    assert answer.status_code == 400
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 200
    platform.login(alice.email)  # the old password still works


def test_a_newer_link_ends_the_older_one(client: TestClient, platform: Platform) -> None:
    admin, alice = platform.user(Role.admin), platform.user()
    first, second = (
        client.post(f"/api/v1/users/{alice.id}/reset-link", headers=admin.headers).json()["url"]
        for _ in range(2)
    )
    old = client.post(RESET, json={"token": token_of(first), "new_password": NEW_PASSWORD})
    assert old.status_code == 400
    new = client.post(RESET, json={"token": token_of(second), "new_password": NEW_PASSWORD})
    assert new.status_code == 204


def test_a_weak_password_leaves_the_link_usable(client: TestClient, platform: Platform) -> None:
    admin, alice = platform.user(Role.admin), platform.user()
    url = client.post(f"/api/v1/users/{alice.id}/reset-link", headers=admin.headers).json()["url"]
    weak = client.post(RESET, json={"token": token_of(url), "new_password": "password1234"})
    assert weak.status_code == 422
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 200
    ok = client.post(RESET, json={"token": token_of(url), "new_password": NEW_PASSWORD})
    assert ok.status_code == 204


@pytest.mark.parametrize(
    "token",
    ["", "x" * 129, "nbr_" + "A" * 43, "nbs_not-a-reset-token", "nbr_\u00e9\u00e9", None, 42],
)
def test_malformed_tokens_are_refused_and_change_nothing(
    client: TestClient, platform: Platform, token: object
) -> None:
    admin, alice = platform.user(Role.admin), platform.user()
    client.post(f"/api/v1/users/{alice.id}/reset-link", headers=admin.headers)
    answer = client.post(RESET, json={"token": token, "new_password": NEW_PASSWORD})
    assert answer.status_code in (400, 422)
    with platform.factory() as db:
        assert db.scalar(select(func.count()).where(PasswordReset.used_at.is_not(None))) == 0
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 200
    platform.login(alice.email)


def test_forgot_password_mails_a_link_that_works_once(
    mail_client: TestClient, mail_platform: Platform, mailbox: tuple[Mailbox, int]
) -> None:
    box, _port = mailbox
    alice = mail_platform.user()
    answer = mail_client.post(FORGOT, json={"email": alice.email.upper()})
    assert answer.status_code == 202
    (message,) = box.wait_for(1)
    assert message["To"] == alice.email
    assert message["From"] == "nebula@example.org"
    token = link_in(message)
    first = mail_client.post(RESET, json={"token": token, "new_password": NEW_PASSWORD})
    assert first.status_code == 204
    assert mail_client.get("/api/v1/me", headers=alice.headers).status_code == 401
    second = mail_client.post(RESET, json={"token": token, "new_password": "another-pass-phrase-9"})
    assert second.status_code == 400
    mail_platform.login(alice.email, NEW_PASSWORD)


def test_an_unknown_address_gets_the_same_answer_and_no_mail(
    mail_client: TestClient, mail_platform: Platform, mailbox: tuple[Mailbox, int]
) -> None:
    box, _port = mailbox
    alice = mail_platform.user()
    unknown = mail_client.post(FORGOT, json={"email": "nobody@example.org"})
    # the mail server holds the known address's message: the request answers before it is
    # delivered, so sending mail adds nothing to a known address's answer time
    box.hold.clear()
    known = mail_client.post(FORGOT, json={"email": alice.email})
    assert unknown.status_code == known.status_code == 202
    assert unknown.json() == known.json()
    assert unknown.headers.keys() == known.headers.keys()
    assert box.messages == []
    box.hold.set()
    (message,) = box.wait_for(1)
    assert message["To"] == alice.email
    outcomes = audit_actions(mail_platform, "auth.password_reset.request")
    assert ("unknown", "nobody@example.org") in outcomes and ("success", alice.id) in outcomes


def test_forgot_password_is_rate_limited_per_address_alike(
    mail_client: TestClient, mail_platform: Platform, mailbox: tuple[Mailbox, int]
) -> None:
    box, _port = mailbox
    alice = mail_platform.user()
    limit = mail_platform.settings.reset_requests_per_email
    for email in (alice.email, "nobody@example.org"):
        for _ in range(limit):
            assert mail_client.post(FORGOT, json={"email": email}).status_code == 202
        refused = mail_client.post(FORGOT, json={"email": email})
        assert refused.status_code == 429
    box.wait_for(limit)
    with mail_platform.factory() as db:
        links = db.scalar(select(func.count()).select_from(PasswordReset))
        requests = db.scalar(select(func.count()).select_from(ResetRequest))
    assert links == limit and requests == 2 * limit  # the refused ones made nothing
    # and only the newest mailed link works
    tokens = [link_in(m) for m in box.wait_for(limit)]
    for token in tokens[:-1]:
        assert (
            mail_client.post(RESET, json={"token": token, "new_password": NEW_PASSWORD}).status_code
            == 400
        )
    assert (
        mail_client.post(
            RESET, json={"token": tokens[-1], "new_password": NEW_PASSWORD}
        ).status_code
        == 204
    )


def test_forgot_password_is_rate_limited_per_client_address(
    mail_settings: Settings, mailbox: tuple[Mailbox, int]
) -> None:
    settings = mail_settings.model_copy(update={"reset_requests_per_ip": 4})
    app = create_app(settings)
    with TestClient(app) as client:
        answers = [
            client.post(FORGOT, json={"email": f"u{i}@example.org"}).status_code for i in range(6)
        ]
    app.state.engine.dispose()
    assert answers == [202] * 4 + [429] * 2


def test_the_command_line_prints_a_working_link(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    env = {
        **os.environ,
        "NEBULA_VAR_DIR": str(settings.var_dir),
        "NEBULA_DATABASE_URL": settings.resolved_database_url,
        "NEBULA_SECRET_KEY": settings.secret().decode(),
        "NEBULA_PUBLIC_URL": "https://nebula.example.org",
    }
    nebula = str(Path(sys.executable).parent / "nebula")
    done = subprocess.run(
        [nebula, "users", "reset-link", alice.email.upper()],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    url = done.stdout.strip()
    assert url.startswith("https://nebula.example.org/reset-password#token=nbr_")
    token = url.split("#token=", 1)[1]
    assert (
        client.post(RESET, json={"token": token, "new_password": NEW_PASSWORD}).status_code == 204
    )
    assert client.get("/api/v1/me", headers=alice.headers).status_code == 401
    missing = subprocess.run(
        [nebula, "users", "reset-link", "nobody@example.org"],
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert missing.returncode == 1 and "no user" in missing.stderr
    with platform.factory() as db:
        assert db.scalar(select(User.email).where(User.id == alice.id)) == alice.email

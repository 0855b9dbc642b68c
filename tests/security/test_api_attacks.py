"""Attacks on the API by its own users and by whoever reads the disk beside it."""

from __future__ import annotations

import hashlib
import stat
from datetime import timedelta
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from app.accounts import service as accounts
from app.accounts.models import AuthToken, LoginFailure, Role
from app.audit.service import SYSTEM
from app.clusters import service as clusters
from app.db import utcnow
from app.main import create_app
from app.migrate import upgrade
from app.pki import service as pki
from app.settings import Settings
from app.up import ensure_demo_admin
from support import PASSWORD, LiveServer, Platform
from workers.switch.tls import make_switch_key_and_csr

API = "/api/v1"
CONTENT = b"a line whose digest an attacker could confirm by guessing it\n"


def mode(path: Path) -> str:
    return oct(stat.S_IMODE(path.stat().st_mode))


def _discoverable_dataset(client: TestClient, platform: Platform) -> tuple[str, str]:
    owner = platform.user()
    ws = client.post(f"{API}/workspaces", json={"name": "pub"}, headers=owner.headers).json()["id"]
    answer = client.post(
        f"{API}/workspaces/{ws}/datasets",
        data={"name": "guessable", "kind": "text", "discoverable": "true"},
        files={"file": ("g.txt", CONTENT, "text/plain")},
        headers=owner.headers,
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["id"], owner.token


def test_the_catalog_does_not_confirm_guessed_content(
    client: TestClient, platform: Platform
) -> None:
    dataset_id, owner_token = _discoverable_dataset(client, platform)
    owner = {"Authorization": f"Bearer {owner_token}"}
    stranger = platform.user()
    digest = hashlib.sha256(CONTENT).hexdigest()

    def listed(headers: dict[str, str]) -> dict:
        items = client.get(f"{API}/catalog", headers=headers).json()["items"]
        return next(item for item in items if item["id"] == dataset_id)

    assert listed(stranger.headers)["sha256"] is None
    assert listed(owner)["sha256"] == digest
    request = client.post(
        f"{API}/access-requests",
        json={"dataset_id": dataset_id, "purpose": "research"},
        headers=stranger.headers,
    ).json()
    assert listed(stranger.headers)["sha256"] is None  # asking is not a grant
    approved = client.post(f"{API}/access-requests/{request['id']}/approve", json={}, headers=owner)
    assert approved.status_code == 200, approved.text
    assert listed(stranger.headers)["sha256"] == digest


def test_wrong_current_passwords_count_like_failed_logins(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    victim = platform.user()  # a stolen session guessing the password it lacks
    for n in range(settings.lockout_failures):
        answer = client.post(
            f"{API}/me/password",
            json={"current_password": f"guess-{n}", "new_password": "a-new-long-password-77"},
            headers=victim.headers,
        )
        assert answer.status_code == 401
    right = {"current_password": PASSWORD, "new_password": "a-new-long-password-77"}
    assert client.post(f"{API}/me/password", json=right, headers=victim.headers).status_code == 429
    login = client.post(f"{API}/auth/login", json={"email": victim.email, "password": PASSWORD})
    assert login.status_code == 429  # one count for both doors


def test_expired_failures_and_dead_tokens_are_purged(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    client.post(f"{API}/auth/login", json={"email": alice.email, "password": "wrong"})
    long_ago = utcnow() - timedelta(days=2)
    with platform.factory() as db:
        db.execute(update(LoginFailure).values(at=long_ago))
        db.execute(update(AuthToken).values(expires_at=long_ago))
        db.commit()
        assert accounts.purge_expired(db, settings=settings) >= 2
        db.commit()
        assert db.scalar(select(func.count()).select_from(LoginFailure)) == 0
        assert db.scalar(select(func.count()).select_from(AuthToken)) == 0


def test_secure_cookies_and_hsts_over_https(settings: Settings) -> None:
    app = create_app(settings)
    with TestClient(app, base_url="https://testserver") as https:
        platform = Platform(https, settings)
        user = platform.user()
        answer = https.post(f"{API}/auth/login", json={"email": user.email, "password": PASSWORD})
        assert "max-age=31536000" in answer.headers["strict-transport-security"]
        cookies = answer.headers.get_list("set-cookie")
        assert cookies and all("secure" in c.lower() for c in cookies)
    with TestClient(app) as plain:
        assert "strict-transport-security" not in plain.get("/healthz").headers
    app.state.engine.dispose()
    forced = create_app(settings.model_copy(update={"cookie_secure": True}))
    with TestClient(forced) as behind_proxy:
        assert "strict-transport-security" in behind_proxy.get("/healthz").headers
    forced.state.engine.dispose()


def test_files_with_secrets_or_data_are_private_from_their_first_byte(tmp_path: Path) -> None:
    settings = Settings(
        var_dir=tmp_path / "var",
        argon2_time_cost=1,
        argon2_memory_kib=1024,
        argon2_parallelism=1,
        run_reaper=False,
    )
    upgrade(settings.resolved_database_url)
    database = Path(settings.resolved_database_url.removeprefix("sqlite:///"))
    assert mode(database) == "0o600"
    assert settings.secret() == settings.secret()
    assert mode(settings.var_dir / "secret_key") == "0o600"
    assert mode(settings.var_dir) == "0o700"
    ensure_demo_admin(settings)
    assert mode(settings.var_dir / "demo-admin.json") == "0o600"
    app = create_app(settings)
    with TestClient(app) as client:
        platform = Platform(client, settings)
        _discoverable_dataset(client, platform)
    app.state.engine.dispose()
    stored = [p for p in settings.resolved_data_dir.rglob("*") if p.is_file()]
    assert stored and {mode(p) for p in stored} == {"0o600"}
    assert mode(settings.resolved_data_dir / "audit") == "0o700"


def test_an_open_event_stream_ends_when_its_session_is_revoked(settings: Settings) -> None:
    """A stolen session watching a job loses the stream at logout, not when it chooses."""
    with LiveServer(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        with server.app.state.sessionmaker() as db:
            for name in ("cluster-a", "cluster-b"):
                cluster = clusters.create(
                    db, actor=SYSTEM, name=name, switch_host="127.0.0.1", switch_port=1
                )
                _key, csr = make_switch_key_and_csr(name)
                pki.issue(
                    db, actor=SYSTEM, cluster=cluster, csr_pem=csr.decode(), settings=settings
                )
            accounts.create_user(
                db,
                actor=SYSTEM,
                email="watcher@example.org",
                display_name="w",
                role=Role.member,
                password=PASSWORD,
                settings=settings,
            )
            db.commit()
        login = {"email": "watcher@example.org", "password": PASSWORD}
        token = http.post(f"{API}/auth/login", json=login).json()["token"]
        http.cookies.clear()
        auth = {"Authorization": f"Bearer {token}"}
        ws = http.get(f"{API}/workspaces", headers=auth).json()["items"][0]["id"]
        lines = "".join(f"une phrase {i}\n" for i in range(64)).encode()
        text_id = http.post(
            f"{API}/workspaces/{ws}/datasets",
            data={"name": "t.txt", "kind": "text", "discoverable": "false"},
            files={"file": ("t.txt", lines)},
            headers=auth,
        ).json()["id"]
        job = {
            "kind": "electra_pretrain",
            "config": {"preset": "tiny", "steps": 5},
            "inputs": {"text": text_id},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        }
        answer = http.post(f"{API}/workspaces/{ws}/jobs", json=job, headers=auth)
        assert answer.status_code == 202, answer.text
        with http.stream("GET", f"{API}/jobs/{answer.json()['id']}/events", headers=auth) as events:
            received = events.iter_lines()
            assert next(received) == "event: status"  # the job is queued: the stream stays open
            assert http.post(f"{API}/auth/logout", headers=auth).status_code == 204
            rest = list(received)  # returns only because the server ends the stream
        assert all("keep-alive" in line or not line for line in rest[1:])

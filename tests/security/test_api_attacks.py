"""Attacks on the API by its own users and by whoever reads the disk beside it."""

from __future__ import annotations

import hashlib
import stat
import threading
from datetime import timedelta
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from app.accounts import quotas
from app.accounts import service as accounts
from app.accounts.models import AuthToken, LoginFailure, Role, User
from app.audit.service import SYSTEM
from app.db import utcnow
from app.errors import QuotaExceeded
from app.main import create_app
from app.migrate import upgrade
from app.settings import Settings
from app.workspaces import service as workspaces
from cli.up import ensure_demo_admin
from support.clusters import register_clusters
from support.platforms import PASSWORD, Platform
from support.servers import LiveServer

API = "/api/v1"
CONTENT = b"a line whose digest an attacker could confirm by guessing it\n"


def electra(text_id: str) -> dict:
    """A small job on a text dataset."""
    return {
        "kind": "electra_pretrain",
        "config": {"preset": "tiny", "steps": 5},
        "inputs": {"text": text_id},
        "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
    }


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
        register_clusters(server.app.state.sessionmaker, settings, "cluster-a", "cluster-b")
        with server.app.state.sessionmaker() as db:
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
        answer = http.post(f"{API}/workspaces/{ws}/jobs", json=electra(text_id), headers=auth)
        assert answer.status_code == 202, answer.text
        with http.stream("GET", f"{API}/jobs/{answer.json()['id']}/events", headers=auth) as events:
            received = events.iter_lines()
            assert next(received) == "event: status"  # the job is queued: the stream stays open
            assert http.post(f"{API}/auth/logout", headers=auth).status_code == 204
            rest = list(received)  # returns only because the server ends the stream
        assert all("keep-alive" in line or not line for line in rest[1:])


def test_one_member_cannot_escape_quotas_by_making_workspaces(settings: Settings) -> None:
    """The review's member made 22 workspaces for 220 GiB and 44 concurrent jobs."""
    limited = settings.model_copy(
        update={
            "default_user_max_workspaces": 3,
            "default_user_storage_bytes_limit": 1000,
            "default_user_max_concurrent_jobs": 1,
        }
    )
    app = create_app(limited)
    with TestClient(app) as client:
        platform = Platform(client, limited)
        register_clusters(platform.factory, limited, "cluster-a", "cluster-b")
        member, admin = platform.user(), platform.user(Role.admin)

        def workspace(name: str) -> httpx.Response:
            return client.post(f"{API}/workspaces", json={"name": name}, headers=member.headers)

        def upload(ws: str, size: int) -> httpx.Response:
            return client.post(
                f"{API}/workspaces/{ws}/datasets",
                data={"name": "t.txt", "kind": "text", "discoverable": "false"},
                files={"file": ("t.txt", b"x" * (size - 1) + b"\n")},
                headers=member.headers,
            )

        def submit(ws: str, text_id: str) -> httpx.Response:
            return client.post(
                f"{API}/workspaces/{ws}/jobs", json=electra(text_id), headers=member.headers
            )

        spaces = [workspace(f"w{i}") for i in range(3)]  # with the personal one: 4 asked
        assert [a.status_code for a in spaces] == [201, 201, 413]
        first, second = (a.json()["id"] for a in spaces[:2])
        text = upload(first, 600)
        assert text.status_code == 201
        assert upload(second, 600).status_code == 413  # 1200 bytes over all workspaces
        assert [submit(ws, text.json()["id"]).status_code for ws in (first, second)] == [202, 409]
        quota = f"{API}/users/{member.id}/quota"
        refused = client.patch(quota, json={"max_workspaces": 9}, headers=member.headers)
        assert refused.status_code == 403
        raised = client.patch(
            quota, json={"max_workspaces": 5, "max_concurrent_jobs": 2}, headers=admin.headers
        )
        assert raised.status_code == 200
        assert raised.json() == {
            "max_workspaces": 5,
            "storage_bytes_limit": 1000,
            "max_concurrent_jobs": 2,
            "roles_per_cluster": 16,
            "workspaces": 3,
            "storage_bytes_used": 600,
            "active_jobs": 1,
        }
        assert workspace("w9").status_code == 201
    app.state.engine.dispose()


def test_parallel_workspace_creation_cannot_pass_the_quota(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    member, limit = platform.user(), 4
    with platform.factory() as db:
        owner = db.get(User, member.id)
        assert owner is not None
        quotas.set_quota(
            db,
            actor=SYSTEM,
            user=owner,
            max_workspaces=limit,
            storage_bytes_limit=None,
            max_concurrent_jobs=None,
        )
        db.commit()
    barrier = threading.Barrier(limit + 4)
    made: list[str] = []

    def create(i: int) -> None:
        barrier.wait(timeout=30)
        with platform.factory() as db:
            owner = db.get(User, member.id)
            assert owner is not None
            try:
                workspaces.create(
                    db, actor=SYSTEM, owner=owner, name=f"race-{i}", settings=settings
                )
                db.commit()
                made.append(f"race-{i}")
            except QuotaExceeded:
                db.rollback()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(limit + 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == limit - 1  # the personal workspace is the first

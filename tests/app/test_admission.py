"""Many more concurrent requests than threads and connections: they wait their turn, none fails."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from sqlalchemy import func, select

from app.audit import service as audit
from app.audit.models import AuditEvent
from app.settings import Settings
from support import PASSWORD, LiveServer, make_user


def test_a_small_pool_serves_a_crowd_of_reads_and_audited_writes(settings: Settings) -> None:
    settings = settings.model_copy(update={"thread_pool_size": 2, "stream_threads": 1})
    with LiveServer(settings) as server:
        assert server.app.state.engine.pool.size() == settings.database_pool_size == 5
        make_user(server.app.state.sessionmaker, settings, email="crowd@example.org")
        login = {"email": "crowd@example.org", "password": PASSWORD}
        token = httpx.post(f"{server.url}/api/v1/auth/login", json=login).json()["token"]
        headers = {"Authorization": f"Bearer {token}"}
        with server.app.state.sessionmaker() as db:
            events_before = db.scalar(select(func.count()).select_from(AuditEvent)) or 0

        def call(i: int) -> int:
            with httpx.Client(base_url=f"{server.url}/api/v1", headers=headers, timeout=60) as c:
                if i % 8 == 0:
                    body = {"name": f"t{i}", "expires_in_days": 1}
                    return c.post("/me/tokens", json=body).status_code
                return c.get("/me" if i % 2 else "/workspaces").status_code

        with ThreadPoolExecutor(24) as pool:
            statuses = list(pool.map(call, range(96)))
        assert statuses.count(201) == 12
        assert statuses.count(200) == 84
        with server.app.state.sessionmaker() as db:
            events_after = db.scalar(select(func.count()).select_from(AuditEvent)) or 0
            assert events_after - events_before == 12  # one event per write, none per read
            assert audit.verify(db, settings=settings).ok

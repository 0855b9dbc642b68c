"""Many more concurrent requests than threads and connections: they wait their turn, none fails.

And the turns themselves: one client address holds at most its share of the slots, an
upload waits for its data holding none, probes never wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from sqlalchemy import func, select

from app.audit import service as audit
from app.audit.models import AuditEvent
from app.credential_gate import DEAD_CREDENTIAL, NO_CREDENTIAL, CredentialGate
from app.middleware import AdmissionMiddleware
from app.route_table import RouteTable
from app.settings import Settings
from support.platforms import PASSWORD, make_user
from support.servers import LiveServer


def test_a_small_pool_serves_a_crowd_of_reads_and_audited_writes(settings: Settings) -> None:
    settings = settings.model_copy(update={"thread_pool_size": 2, "stream_threads": 1})
    with LiveServer(settings) as server:
        # a connection per request thread, stream thread and credential check thread, the
        # readiness probe's, two more
        assert server.app.state.engine.pool.size() == settings.database_pool_size == 8
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


class Held:
    """An ASGI app whose requests stay inside until released, counting who is in."""

    def __init__(self) -> None:
        self.inside: list[str] = []
        self.release = asyncio.Event()
        self.arrived = asyncio.Event()  # set by each request that comes in

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.inside.append(f"{scope['client'][0]} {scope['path']}")
        self.arrived.set()
        if scope["method"] == "POST":
            while (await receive()).get("more_body"):
                pass
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def _scope(
    address: str, path: str = "/api/v1/me", method: str = "GET", token: str = ""
) -> dict[str, Any]:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {
        "type": "http",
        "method": method,
        "path": path,
        "client": (address, 1),
        "headers": headers,
    }


def _run_alone(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """asyncio.run on a thread of its own: this worker's thread may hold another running loop.

    Playwright's sync API, whose browser lives for the whole session, leaves its loop marked
    running on the main thread, and asyncio.run refuses to start beside it.
    """
    with ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, main()).result()


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _nothing() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _sink(message: Any) -> None:
    pass


def test_one_address_holds_at_most_its_share_of_the_slots() -> None:
    async def run() -> None:
        app = Held()
        admission = AdmissionMiddleware(app, slots=4, per_address=2)
        tasks = [
            asyncio.create_task(admission(_scope("10.0.0.1"), _nothing, _sink)) for _ in range(5)
        ]
        await _settle()
        assert len(app.inside) == 2  # the address's share, though slots are free
        tasks.append(asyncio.create_task(admission(_scope("10.0.0.2"), _nothing, _sink)))
        tasks.append(
            asyncio.create_task(admission(_scope("10.0.0.1", "/healthz"), _nothing, _sink))
        )
        await _settle()
        assert sorted(app.inside[2:]) == ["10.0.0.1 /healthz", "10.0.0.2 /api/v1/me"]
        app.release.set()
        await asyncio.gather(*tasks)
        assert len(app.inside) == 7  # the waiting ones got their turn

    _run_alone(run)


def test_an_upload_waits_for_its_data_holding_no_slot() -> None:
    async def run() -> None:
        app = Held()
        admission = AdmissionMiddleware(app, slots=1, per_address=2)
        data = asyncio.Event()

        async def slow_body() -> dict[str, Any]:
            await data.wait()
            return {"type": "http.request", "body": b"x", "more_body": False}

        upload = _scope("10.0.0.1", "/api/v1/workspaces/w/datasets", "POST")
        uploading = asyncio.create_task(admission(upload, slow_body, _sink))
        await _settle()
        reading = asyncio.create_task(admission(_scope("10.0.0.2"), _nothing, _sink))
        await _settle()
        assert app.inside == ["10.0.0.1 /api/v1/workspaces/w/datasets", "10.0.0.2 /api/v1/me"]
        data.set()
        app.release.set()
        await asyncio.gather(uploading, reading)

    _run_alone(run)


def test_a_cluster_hosts_artifact_uploads_take_none_of_its_turns() -> None:
    async def run() -> None:
        app = Held()
        admission = AdmissionMiddleware(app, slots=4, per_address=1)
        artifact = _scope("10.0.0.9", "/api/v1/cluster/jobs/j/roles/encoder/artifact", "PUT")
        uploading = asyncio.create_task(admission(artifact, _nothing, _sink))
        await _settle()
        # the host's heartbeat still has its turn while the upload holds a slot
        beating = asyncio.create_task(admission(_scope("10.0.0.9"), _nothing, _sink))
        await _settle()
        assert len(app.inside) == 2
        app.release.set()
        await asyncio.gather(uploading, beating)

    _run_alone(run)


class Answers:
    """An ASGI `send` that keeps the status and body of one answer."""

    def __init__(self) -> None:
        self.status = 0
        self.body = b""

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.body += message.get("body", b"")


def _gate(live: set[str], looked_up: list[str]) -> CredentialGate:
    """A gate over /api/v1/me (GET) whose credential check is a set, counting its lookups."""

    def is_live(secret: str) -> bool:
        looked_up.append(secret)
        return secret in live

    import re

    return CredentialGate(
        routes=lambda: RouteTable([("/api/v1/me", re.compile("^/api/v1/me$"), frozenset({"GET"}))]),
        is_live=is_live,
        cookie_name="nebula_session",
        threads=1,
    )


def test_bad_and_missing_credentials_are_refused_while_every_slot_is_busy() -> None:
    async def run() -> None:
        app = Held()
        looked_up: list[str] = []
        gate = _gate({"good"}, looked_up)
        admission = AdmissionMiddleware(app, slots=1, per_address=0, gate=gate)
        holding = asyncio.create_task(admission(_scope("10.0.0.1", token="good"), _nothing, _sink))
        await asyncio.wait_for(app.arrived.wait(), timeout=5)  # after its credential check
        assert app.inside == ["10.0.0.1 /api/v1/me"]  # the one slot is taken
        for token, detail in [("forged", DEAD_CREDENTIAL), ("", NO_CREDENTIAL)]:
            answer = Answers()
            await asyncio.wait_for(
                admission(_scope("10.0.0.2", token=token), _nothing, answer), timeout=5
            )
            assert (answer.status, detail.encode() in answer.body) == (401, True)
        # a route that signs nobody in still waits for the slot, as before
        public = asyncio.create_task(
            admission(_scope("10.0.0.3", "/api/v1/pki/ca.pem"), _nothing, _sink)
        )
        await _settle()
        assert len(app.inside) == 1 and not public.done()
        app.release.set()
        await asyncio.gather(holding, public)
        assert looked_up == ["good", "forged"]

    _run_alone(run)


def test_a_credential_seen_live_goes_straight_on_until_the_endpoint_refuses_it() -> None:
    async def run() -> None:
        looked_up: list[str] = []
        live = {"good"}
        gate = _gate(live, looked_up)
        served: list[int] = []

        async def endpoint(scope: Any, receive: Any, send: Any) -> None:
            # the endpoint's own check is the authority: it refuses a token revoked meanwhile
            status = 200 if "good" in live else 401
            served.append(status)
            await send({"type": "http.response.start", "status": status})
            await send({"type": "http.response.body", "body": b""})

        admission = AdmissionMiddleware(endpoint, slots=1, gate=gate)
        statuses = []
        for revoked in [False, False, True, True]:
            if revoked:
                live.discard("good")
            answer = Answers()
            await admission(_scope("10.0.0.1", token="good"), _nothing, answer)
            statuses.append(answer.status)
        assert statuses == [200, 200, 401, 401]
        # remembered after one lookup; the endpoint's refusal made the gate forget it, so
        # the last request was looked up again and refused without reaching the endpoint
        assert looked_up == ["good", "good"]
        assert served == [200, 200, 401]

    _run_alone(run)

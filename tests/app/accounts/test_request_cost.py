"""What authentication costs per request: no write lock, one query, argon2 outside transactions."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select, update
from sqlalchemy.engine import Engine

from app.accounts import passwords
from app.accounts.models import LoginFailure, Role, User, UserStatus
from app.audit.models import AuditEvent
from app.deps import Caller, Credential
from app.errors import NotAuthenticated, TooManyAttempts
from app.main import create_app
from app.settings import Settings
from support.platforms import PASSWORD, Platform, make_user
from support.servers import LiveServer

T = TypeVar("T")
READS = ["/me", "/workspaces", "/me/tokens", "/catalog", "/access-requests?direction=incoming"]


def _member(server: LiveServer, settings: Settings, email: str) -> dict[str, str]:
    make_user(server.app.state.sessionmaker, settings, email=email)
    answer = httpx.post(
        f"{server.url}/api/v1/auth/login", json={"email": email, "password": PASSWORD}
    )
    return {"Authorization": f"Bearer {answer.json()['token']}"}


class WriteLockHeld:
    """Another connection holds what every writer needs, and lets readers through."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url

    def __enter__(self) -> WriteLockHeld:
        if self.url.startswith("sqlite"):
            import sqlite3

            self.conn: Any = sqlite3.connect(
                self.url.removeprefix("sqlite:///"), isolation_level=None
            )
            self.conn.execute("BEGIN IMMEDIATE")  # SQLite's one write lock
        else:
            self.conn = psycopg.connect(self.url.replace("postgresql+psycopg", "postgresql"))
            # EXCLUSIVE blocks every INSERT, UPDATE and DELETE, not SELECT
            self.conn.execute(
                "LOCK TABLE users, auth_tokens, workspaces, datasets, jobs, audit_events,"
                " access_requests IN EXCLUSIVE MODE"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.url.startswith("sqlite"):
            self.conn.execute("ROLLBACK")
        else:
            self.conn.rollback()
        self.conn.close()


def test_authenticated_reads_take_no_write_lock(settings: Settings, database_url: str) -> None:
    with LiveServer(settings) as server:
        headers = _member(server, settings, "reader@example.org")
        workspace = httpx.get(f"{server.url}/api/v1/workspaces", headers=headers).json()
        ws = workspace["items"][0]["id"]
        paths = [*READS, f"/workspaces/{ws}/datasets", f"/workspaces/{ws}/jobs"]
        with WriteLockHeld(database_url):
            # a read that wrote or took the write lock would wait here until the timeout
            for path in paths:
                answer = httpx.get(f"{server.url}/api/v1{path}", headers=headers, timeout=20)
                assert answer.status_code == 200, (path, answer.text)


BACKGROUND_THREADS = ("nebula-anchorer", "nebula-reaper")


def _statements(client: TestClient, path: str, headers: dict[str, str]) -> list[str]:
    """The SQL statements one GET of `path` ran (transaction control left out).

    The app's background threads (the anchorer reads the audit table every second) are
    left out: they may run a query while the request does.
    """
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if threading.current_thread().name in BACKGROUND_THREADS:
            return
        if not statement.lstrip().upper().startswith(("PRAGMA", "BEGIN")):
            statements.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        assert client.get(f"/api/v1{path}", headers=headers).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    return statements


def test_token_and_user_come_in_one_query(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    # the credential gate looks a token up once before its first request takes an admission
    # slot (app/credential_gate.py), then remembers it for a minute
    first = _statements(client, "/workspaces", alice.headers)
    assert len(first) == 3 and "FROM auth_tokens" in first[0], first
    # authentication: the token by its hash, joined with its user (status and role)
    workspaces = _statements(client, "/workspaces", alice.headers)
    assert "FROM auth_tokens JOIN users" in workspaces[0], workspaces
    # a page and its total come in one query; nothing else is read
    assert len(workspaces) == 2, workspaces
    assert "count(*) OVER ()" in workspaces[1], workspaces
    # the user's row is read only by an endpoint that needs it, once
    me = _statements(client, "/me", alice.headers)
    assert "FROM auth_tokens JOIN users" in me[0], me
    assert len(me) == 2 and me[1].startswith("SELECT users.id"), me


@pytest.fixture
def connections_during_argon2(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[int]]:
    """How many database connections requests held each time argon2 ran.

    The app's background threads (the anchorer reads the audit table every second) are
    left out: what matters is that no request holds a connection while it hashes.
    """
    engine: Engine = client.app.state.engine  # type: ignore[attr-defined]
    by_requests: set[int] = set()

    def checkout(_dbapi: Any, record: Any, _proxy: Any) -> None:
        if threading.current_thread().name not in BACKGROUND_THREADS:
            by_requests.add(id(record))

    def checkin(_dbapi: Any, record: Any) -> None:
        by_requests.discard(id(record))

    held: list[int] = []
    real_run = passwords.PasswordGate.run

    def run(self: passwords.PasswordGate, work: Callable[[], T]) -> T:
        held.append(len(by_requests))
        return real_run(self, work)

    monkeypatch.setattr(passwords.PasswordGate, "run", run)
    event.listen(engine, "checkout", checkout)
    event.listen(engine, "checkin", checkin)
    try:
        yield held
    finally:
        event.remove(engine, "checkout", checkout)
        event.remove(engine, "checkin", checkin)


def test_argon2_runs_while_no_connection_is_held(
    client: TestClient, platform: Platform, connections_during_argon2: list[int]
) -> None:
    alice = platform.user()
    login = "/api/v1/auth/login"
    assert client.post(login, json={"email": alice.email, "password": PASSWORD}).status_code == 200
    wrong = {"email": alice.email, "password": "not-the-password-1"}
    assert client.post(login, json=wrong).status_code == 401
    unknown = {"email": "nobody@example.org", "password": PASSWORD}
    assert client.post(login, json=unknown).status_code == 401
    change = {"current_password": PASSWORD, "new_password": "saffron-lantern-meadow-7"}
    answer = client.post("/api/v1/me/password", json=change, headers=alice.headers)
    assert answer.status_code == 204
    # create (hash), login (verify) twice, unknown (burn), change (verify + hash)
    assert len(connections_during_argon2) == 7
    assert set(connections_during_argon2) == {0}, connections_during_argon2


def test_a_full_password_gate_answers_429_and_writes_nothing(settings: Settings) -> None:
    settings = settings.model_copy(update={"password_hash_slots": 1})
    app = create_app(settings)
    gate = passwords._gate(1)
    started, release = threading.Event(), threading.Event()

    def occupy() -> None:
        started.set()
        release.wait()

    with TestClient(app) as client, ThreadPoolExecutor(1) as pool:
        with app.state.sessionmaker() as db:
            before = db.scalar(select(func.count()).select_from(AuditEvent))
            attempts = db.scalar(select(func.count()).select_from(LoginFailure))
        busy = pool.submit(gate.run, occupy)
        started.wait()
        try:
            answer = client.post(
                "/api/v1/auth/login", json={"email": "flood@example.org", "password": PASSWORD}
            )
        finally:
            release.set()
        busy.result()
        assert answer.status_code == 429
        with app.state.sessionmaker() as db:
            assert db.scalar(select(func.count()).select_from(AuditEvent)) == before
            # no password was checked: the attempt does not count against the lockout
            assert db.scalar(select(func.count()).select_from(LoginFailure)) == attempts
    app.state.engine.dispose()


def test_password_gate_refuses_beyond_its_slots_and_admits_again_after() -> None:
    gate = passwords.PasswordGate(slots=1)
    started, release = threading.Event(), threading.Event()

    def first() -> str:
        started.set()
        release.wait()
        return "first"

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(gate.run, first)
        started.wait()
        try:
            with pytest.raises(TooManyAttempts):
                gate.run(lambda: "second")
        finally:
            release.set()
        assert running.result() == "first"
    assert gate.run(lambda: "third") == "third"


def _identity_only_paths(client: TestClient, headers: dict[str, str]) -> list[str]:
    """Reads whose endpoints decide on the caller's identity alone (no user row loaded)."""
    ws = client.get("/api/v1/workspaces", headers=headers).json()["items"][0]["id"]
    return [
        "/workspaces",
        f"/workspaces/{ws}",
        f"/workspaces/{ws}/datasets",
        f"/workspaces/{ws}/jobs",
    ]


def test_reads_that_load_no_user_row_still_refuse_ended_credentials_at_once(
    client: TestClient, platform: Platform
) -> None:
    admin, alice, bob = platform.user(Role.admin), platform.user(), platform.user()
    paths = _identity_only_paths(client, alice.headers)
    api = client.post("/api/v1/me/tokens", json={"name": "x"}, headers=bob.headers).json()
    api_headers = {"Authorization": f"Bearer {api['token']}"}
    bob_paths = _identity_only_paths(client, api_headers)
    for path in paths:
        assert client.get(f"/api/v1{path}", headers=alice.headers).status_code == 200, path
    # suspension: every credential of the user is refused by the next request
    assert (
        client.post(f"/api/v1/users/{alice.id}/suspend", headers=admin.headers).status_code == 200
    )
    for path in paths:
        assert client.get(f"/api/v1{path}", headers=alice.headers).status_code == 401, path
    # a revoked API token, then a logged-out session
    assert client.delete(f"/api/v1/me/tokens/{api['id']}", headers=bob.headers).status_code == 204
    assert client.post("/api/v1/auth/logout", headers=bob.headers).status_code == 204
    for path in bob_paths:
        assert client.get(f"/api/v1{path}", headers=api_headers).status_code == 401, path
        assert client.get(f"/api/v1{path}", headers=bob.headers).status_code == 401, path


def test_a_user_suspended_after_authentication_is_refused_when_the_row_loads(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    with platform.factory() as db:
        credential = Credential(secret=alice.token, via_cookie=False, unsafe=False)
        caller = Caller(credential, ip=None, db=db, settings=platform.settings)
        caller.resolve()
        assert caller.user_id == alice.id
        db.commit()
        with platform.factory() as other:
            other.execute(
                update(User).where(User.id == alice.id).values(status=UserStatus.suspended)
            )
            other.commit()
        with pytest.raises(NotAuthenticated):
            _ = caller.user


def test_a_caller_whose_credential_was_never_resolved_answers_nothing(platform: Platform) -> None:
    """A route that skipped the lookup fails closed: no identity, no role, no actor."""
    alice = platform.user()
    with platform.factory() as db:
        credential = Credential(secret=alice.token, via_cookie=False, unsafe=False)
        caller = Caller(credential, ip=None, db=db, settings=platform.settings)
        for question in ("identity", "user_id", "role", "actor", "user", "token"):
            with pytest.raises(RuntimeError, match="before its credential was resolved"):
                getattr(caller, question)


def test_every_api_route_resolves_its_caller_in_the_endpoint_hop(client: TestClient) -> None:
    """Callers are looked up by OneHopRoute before the endpoint runs: every API route is one."""
    from fastapi.routing import APIRoute, iter_route_contexts

    from app.routing import OneHopRoute

    api = [
        c
        for c in iter_route_contexts(client.app.routes)  # type: ignore[attr-defined]
        if isinstance(c.original_route, APIRoute) and c.path.startswith("/api/")
    ]
    assert len(api) > 50
    assert [c.path for c in api if not isinstance(c.original_route, OneHopRoute)] == []


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/workspaces?limit=0"),  # a query out of bounds
        ("GET", "/jobs/not-a-uuid"),  # a malformed path parameter
        ("POST", "/workspaces/not-a-uuid/datasets"),
        ("GET", "/audit?since=yesterday"),
    ],
)
def test_a_bad_credential_is_refused_before_the_input_is_judged(
    client: TestClient, platform: Platform, method: str, path: str
) -> None:
    """401 for a wrong token and 403 for a role that does not fit, whatever else is wrong."""
    wrong = {"Authorization": "Bearer nbl_wrong-secret"}
    answer = client.request(method, f"/api/v1{path}", headers=wrong)
    assert answer.status_code == 401, answer.text
    member = platform.user()
    answer = client.request(method, f"/api/v1{path}", headers=member.headers)
    expected = 403 if path.startswith("/audit") else 422
    assert answer.status_code == expected, answer.text

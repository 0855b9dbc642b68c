"""Finding 1 (issue 27): slow request heads and bodies, with no login, must not stop the API.

Each test runs a real `nebula serve` process and real sockets. The slow clients come from
other loopback addresses (127.0.0.2 and up) than the probes (127.0.0.1), as they would from
other hosts: the per-address caps are tested on their own.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from app.audit.service import use_chain_key
from app.db import make_engine, make_sessionmaker
from app.migrate import upgrade
from app.settings import Settings
from support.platforms import PASSWORD, make_user
from support.servers import ServeProcess, nebula_serve

# generous: a probe that answers at all while the slow clients hold on is what counts
ANSWER_TIMEOUT_S = 20.0
EMAIL = "prober@example.org"

pytestmark = pytest.mark.slow


@contextmanager
def served(tmp_path: Path, **env: str) -> Iterator[ServeProcess]:
    """`nebula serve` over a fresh SQLite platform with one user, and `env` settings."""
    var = tmp_path / "var"
    settings = Settings(var_dir=var, argon2_time_cost=1, argon2_memory_kib=1024)
    upgrade(settings.resolved_database_url)
    engine = use_chain_key(make_engine(settings.resolved_database_url), settings)
    make_user(make_sessionmaker(engine), settings, email=EMAIL)
    engine.dispose()
    with nebula_serve(var, tmp_path / "serve.log", env_extra=env) as server:
        yield server


def connect(server: ServeProcess, source: str) -> socket.socket:
    """A TCP connection to the server from loopback address `source`."""
    sock = socket.create_connection(
        ("127.0.0.1", server.port), timeout=ANSWER_TIMEOUT_S, source_address=(source, 0)
    )
    return sock


def slow_body(server: ServeProcess, source: str) -> socket.socket:
    """A login whose head is complete and whose body stops after a few bytes."""
    sock = connect(server, source)
    sock.sendall(
        b"POST /api/v1/auth/login HTTP/1.1\r\nHost: nebula\r\n"
        b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        b'{"email": "'
    )
    return sock


def slow_head(server: ServeProcess, source: str) -> socket.socket:
    """A request whose head stops before its blank line."""
    sock = connect(server, source)
    sock.sendall(b"GET /api/v1/me HTTP/1.1\r\nHost: nebula\r\nX-Slow: ")
    return sock


def still_open(sock: socket.socket) -> bool:
    """The server has neither answered nor closed this connection."""
    sock.setblocking(False)
    try:
        sock.recv(1)  # an answer, or the end of the connection
        return False
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


def answer_of(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(ANSWER_TIMEOUT_S)
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def login(server: ServeProcess) -> dict[str, str]:
    answer = httpx.post(
        f"{server.url}/api/v1/auth/login", json={"email": EMAIL, "password": PASSWORD}
    )
    assert answer.status_code == 200, answer.text
    return {"Authorization": f"Bearer {answer.json()['token']}"}


def probe(server: ServeProcess, headers: dict[str, str]) -> tuple[int, int, int]:
    """/healthz, /readyz and an authenticated read, from 127.0.0.1."""
    transport = httpx.HTTPTransport(local_address="127.0.0.1")
    with httpx.Client(base_url=server.url, transport=transport, timeout=ANSWER_TIMEOUT_S) as c:
        return (
            c.get("/healthz").status_code,
            c.get("/readyz").status_code,
            c.get("/api/v1/me", headers=headers).status_code,
        )


def test_64_slow_bodies_and_64_slow_heads_do_not_stop_probes_or_reads(tmp_path: Path) -> None:
    # deadlines far beyond the test, so that every slow client holds on while it probes
    with served(
        tmp_path, NEBULA_REQUEST_BODY_TIMEOUT_S="600", NEBULA_REQUEST_HEAD_TIMEOUT_S="600"
    ) as server:
        headers = login(server)
        sources = [f"127.0.0.{n}" for n in range(2, 10)]
        with ExitStack() as stack:
            slow: list[socket.socket] = []
            for i in range(64):
                source = sources[i % len(sources)]
                slow.append(stack.enter_context(slow_body(server, source)))
                slow.append(stack.enter_context(slow_head(server, source)))
            # twice the admission slots (8) of slow bodies were complete heads the app saw
            # before these: on a server that reads bodies inside its slots, none answers
            assert probe(server, headers) == (200, 200, 200)
            # a complete request with a body is served too
            token = httpx.post(
                f"{server.url}/api/v1/me/tokens",
                json={"name": "while-slow", "expires_in_days": 1},
                headers=headers,
                timeout=ANSWER_TIMEOUT_S,
            )
            assert token.status_code == 201, token.text
            assert all(still_open(sock) for sock in slow)  # they held on all along


def test_a_slow_body_and_a_slow_head_are_answered_408_and_closed(tmp_path: Path) -> None:
    with served(
        tmp_path, NEBULA_REQUEST_BODY_TIMEOUT_S="1", NEBULA_REQUEST_HEAD_TIMEOUT_S="1"
    ) as server:
        with (
            slow_body(server, "127.0.0.2") as body,
            slow_head(server, "127.0.0.3") as head,
            connect(server, "127.0.0.4") as silent,
        ):
            assert answer_of(body).startswith(b"HTTP/1.1 408 ")
            assert answer_of(head).startswith(b"HTTP/1.1 408 ")
            # a connection that never sends a byte is closed by the same deadline
            assert answer_of(silent).startswith(b"HTTP/1.1 408 ")
        assert probe(server, login(server)) == (200, 200, 200)


def test_connections_past_an_addresss_cap_are_refused_and_others_served(tmp_path: Path) -> None:
    with served(
        tmp_path, NEBULA_MAX_CONNECTIONS_PER_ADDRESS="4", NEBULA_REQUEST_HEAD_TIMEOUT_S="600"
    ) as server:
        headers = login(server)
        held = [connect(server, "127.0.0.2") for _ in range(4)]
        try:
            with connect(server, "127.0.0.2") as fifth:
                assert answer_of(fifth).startswith(b"HTTP/1.1 503 ")
            assert probe(server, headers) == (200, 200, 200)  # another address
            assert all(still_open(sock) for sock in held)
            held.pop().close()
            # once the server has seen the close, the address may connect again
            deadline = time.monotonic() + ANSWER_TIMEOUT_S
            tick = threading.Event()
            while True:
                transport = httpx.HTTPTransport(local_address="127.0.0.2")
                with httpx.Client(transport=transport, timeout=ANSWER_TIMEOUT_S) as client:
                    if client.get(f"{server.url}/healthz").status_code == 200:
                        break
                assert time.monotonic() < deadline, "the closed connection was never uncounted"
                tick.wait(0.1)
        finally:
            for sock in held:
                sock.close()


def test_slow_authenticated_uploads_give_their_slots_back(tmp_path: Path) -> None:
    with served(
        tmp_path, NEBULA_THREAD_POOL_SIZE="2", NEBULA_UPLOAD_IDLE_TIMEOUT_S="600"
    ) as server:
        headers = login(server)
        workspace = httpx.get(f"{server.url}/api/v1/workspaces", headers=headers).json()
        path = f"/api/v1/workspaces/{workspace['items'][0]['id']}/datasets"
        boundary = "nebulaslowupload"
        part = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="t"\r\n'
            "Content-Type: application/octet-stream\r\n\r\nla frase\n"
        ).encode()
        with ExitStack() as stack:
            uploads = []
            for source in ("127.0.0.2", "127.0.0.3"):  # as many as the slots, two addresses
                for _ in range(2):
                    sock = stack.enter_context(connect(server, source))
                    sock.sendall(
                        f"POST {path} HTTP/1.1\r\nHost: nebula\r\n"
                        f"Authorization: {headers['Authorization']}\r\n"
                        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                        "Content-Length: 100000\r\n\r\n".encode()
                        + part
                    )
                    uploads.append(sock)
            assert probe(server, headers) == (200, 200, 200)
            assert all(still_open(sock) for sock in uploads)


def admissions(server: ServeProcess) -> dict[str, float]:
    """The server's `nebula_admissions_total` counts by outcome."""
    text = httpx.get(f"{server.url}/metrics", timeout=ANSWER_TIMEOUT_S).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("nebula_admissions_total{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return counts


def test_bad_tokens_take_no_slot_and_cannot_starve_signed_in_reads(tmp_path: Path) -> None:
    clients, each = 64, 15
    with served(tmp_path) as server:
        headers = login(server)
        before = admissions(server)
        statuses: list[int] = []
        started = threading.Barrier(clients + 1)

        def hammer(n: int) -> None:
            # from 16 addresses, so that the per-address caps alone cannot hold them back
            transport = httpx.HTTPTransport(local_address=f"127.0.0.{2 + n % 16}")
            with httpx.Client(base_url=server.url, transport=transport, timeout=60) as c:
                started.wait()
                for i in range(each):
                    forged = {"Authorization": f"Bearer forged-{n}-{i}"}
                    statuses.append(c.get("/api/v1/me", headers=forged).status_code)

        threads = [threading.Thread(target=hammer, args=(n,)) for n in range(clients)]
        for thread in threads:
            thread.start()
        started.wait()
        reads = 0
        while any(thread.is_alive() for thread in threads):
            began = time.monotonic()
            assert probe(server, headers) == (200, 200, 200)
            assert time.monotonic() - began < 3.0  # three requests, each well under 1 s
            reads += 1
        for thread in threads:
            thread.join()
        after = admissions(server)
        assert statuses == [401] * (clients * each)
        # the slots went to the signed-in reads (one slot each) and to the two /metrics reads
        # around them, none to a forged token: without the gate the 960 forged requests are
        # admitted too, each taking its turn at the slots ahead of the reads queued behind it
        assert after["admitted"] - before["admitted"] == reads + 1
        assert after["refused_before_slot"] - before.get("refused_before_slot", 0) == clients * each

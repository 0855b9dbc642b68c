"""`nebula serve`: several workers with one reaper, TCP_NODELAY on accepted sockets."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from app.migrate import upgrade
from app.serving import set_nodelay
from support.servers import nebula_serve


def test_set_nodelay_on_a_socket_bound_as_uvicorns_workers_bind_it() -> None:
    # uvicorn's multi-worker socket has protocol number 0, so asyncio skips TCP_NODELAY
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.proto == 0
                set_nodelay(accepted)
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.slow
def test_serve_with_two_workers_answers_and_runs_one_reaper(tmp_path: Path) -> None:
    var = tmp_path / "var"
    upgrade(f"sqlite:///{var / 'nebula.db'}")
    with nebula_serve(var, tmp_path / "serve.log", workers=2) as served:
        for _ in range(20):  # connections spread over both workers
            assert httpx.get(f"{served.url}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"{served.url}/readyz")
        assert ready.status_code == 200, ready.text
    assert served.log_path.read_text().count("reaper started") == 1

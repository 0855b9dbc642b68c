"""`nebula serve`: several workers with one reaper, TCP_NODELAY on accepted sockets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from app.migrate import upgrade
from app.serving import set_nodelay


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")}
    env.update(
        NEBULA_VAR_DIR=str(var), NEBULA_ARGON2_TIME_COST="1", NEBULA_ARGON2_MEMORY_KIB="1024"
    )
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", "2"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        tick = threading.Event()
        deadline = time.monotonic() + 90
        while log_path.read_text().count("Application startup complete") < 2:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            tick.wait(0.2)
        for _ in range(20):  # connections spread over both workers
            assert httpx.get(f"http://127.0.0.1:{port}/healthz").json() == {"status": "ok"}
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz")
        assert ready.status_code == 200, ready.text
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert log_path.read_text().count("reaper started") == 1

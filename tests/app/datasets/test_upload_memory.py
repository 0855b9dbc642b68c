"""A 200 MB upload through a real uvicorn server keeps the server's memory growth under 50 MB."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
UPLOAD_BYTES = 200 * 1024 * 1024
MAX_GROWTH_BYTES = 50 * 1024 * 1024
BOUNDARY = "nebula-memory-test"
EMAIL = "memory@example.org"
PASSWORD = "violet-harbor-cinnamon-42"


def status_kib(pid: int, field: str) -> int:
    """A `VmRSS:`-style field of /proc/<pid>/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def reset_peak(pid: int) -> None:
    """Reset VmHWM to the current RSS where the kernel allows it (Linux >= 4.0)."""
    # where it cannot, the peak since start counts too: the measure only gets stricter
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def multipart_stream(total: int, *, kind: str = "text") -> Iterator[bytes]:
    """A multipart body whose file part is `total` bytes of generated sentences."""
    for name, value in (("name", "big corpus"), ("kind", kind), ("discoverable", "false")):
        yield (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        ).encode()
    yield (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n"
    ).encode()
    line = b"a streamed sentence that is neither short nor long, number 0000\n"
    block = line * (256 * 1024 // len(line))
    sent = 0
    while sent < total:
        piece = block[: total - sent]
        sent += len(piece)
        yield piece
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


def expected_sha256(total: int) -> str:
    digest = hashlib.sha256()
    for piece in list(multipart_stream(total))[4:-1]:
        digest.update(piece)
    return digest.hexdigest()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], dict[str, str]]]:
    """uvicorn serving the app in its own process, on a free port, with a fresh SQLite."""
    var = tmp_path / "var"
    env = {
        **os.environ,
        "NEBULA_VAR_DIR": str(var),
        "NEBULA_DATABASE_URL": f"sqlite:///{var / 'nebula.db'}",
        "NEBULA_SECRET_KEY": "memory-test-secret",
        # argon2's default 64 MiB per hash would dominate the peak this test measures
        "NEBULA_ARGON2_MEMORY_KIB": "1024",
        "NEBULA_ARGON2_TIME_COST": "1",
        "NEBULA_ARGON2_PARALLELISM": "1",
        "NEBULA_RUN_REAPER": "false",
    }
    nebula = str(Path(sys.executable).parent / "nebula")
    subprocess.run([nebula, "db", "upgrade"], env=env, check=True, capture_output=True, cwd=REPO)
    subprocess.run(
        [nebula, "users", "create-admin", EMAIL],
        input=PASSWORD.encode() + b"\n",
        env=env,
        check=True,
        capture_output=True,
        cwd=REPO,
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory"),
            *("--host", "127.0.0.1", "--port", str(port), "--no-access-log"),
        ],
        env=env,
        cwd=REPO,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert proc.stderr is not None
    for raw in proc.stderr:  # blocks until uvicorn says it is up (or exits)
        if b"Uvicorn running on" in raw:  # logged once the socket is bound
            break
    else:
        raise AssertionError(f"uvicorn did not start (exit {proc.wait()})")
    # keep draining its log so that it never blocks on a full pipe
    threading.Thread(target=proc.stderr.read, daemon=True).start()
    base = f"http://127.0.0.1:{port}/api/v1"
    login = httpx.post(f"{base}/auth/login", json={"email": EMAIL, "password": PASSWORD})
    assert login.status_code == 200, login.text
    headers = {"Authorization": f"Bearer {login.json()['token']}"}
    try:
        yield base, proc, headers
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_200_mb_upload_keeps_server_memory_growth_under_50_mb(
    server: tuple[str, subprocess.Popen[bytes], dict[str, str]],
) -> None:
    base, proc, headers = server
    content_type = {"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
    with httpx.Client(headers={**headers, **content_type}, timeout=120) as http:
        ws = http.get(f"{base}/workspaces").json()["items"][0]["id"]
        # warm up: the first upload loads what the route needs lazily
        warm = http.post(f"{base}/workspaces/{ws}/datasets", content=multipart_stream(4096))
        assert warm.status_code == 201, warm.text

        reset_peak(proc.pid)
        before = status_kib(proc.pid, "VmRSS")
        started = time.perf_counter()
        answer = http.post(
            f"{base}/workspaces/{ws}/datasets", content=multipart_stream(UPLOAD_BYTES)
        )
        upload_s = time.perf_counter() - started
        peak = status_kib(proc.pid, "VmHWM")
        assert answer.status_code == 201, answer.text
        body = answer.json()
        assert body["size_bytes"] == UPLOAD_BYTES
        assert body["sha256"] == expected_sha256(UPLOAD_BYTES)

        # the download streams too
        started = time.perf_counter()
        digest, received = hashlib.sha256(), 0
        with http.stream("GET", f"{base}/datasets/{body['id']}/content") as download:
            assert download.status_code == 200
            for piece in download.iter_bytes():
                digest.update(piece)
                received += len(piece)
        download_s = time.perf_counter() - started
        peak_after_download = status_kib(proc.pid, "VmHWM")
    assert received == UPLOAD_BYTES and digest.hexdigest() == body["sha256"]

    growth = (peak - before) * 1024
    growth_with_download = (peak_after_download - before) * 1024
    mb = 1024 * 1024
    print(
        f"\nserver RSS before {before / 1024:.1f} MiB; peak growth during the 200 MB upload "
        f"{growth / mb:.1f} MiB, after the download too {growth_with_download / mb:.1f} MiB; "
        f"upload {UPLOAD_BYTES / mb / upload_s:.0f} MiB/s, "
        f"download {UPLOAD_BYTES / mb / download_s:.0f} MiB/s"
    )
    assert growth < MAX_GROWTH_BYTES
    assert growth_with_download < MAX_GROWTH_BYTES

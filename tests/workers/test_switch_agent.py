"""`nebula switch` against a live control plane: enrollment, CRL fetch, a job's link."""

from __future__ import annotations

import json
import stat
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from app.accounts.models import Role
from app.audit.service import SYSTEM
from app.clusters import service as clusters
from app.pki import service as pki
from app.settings import Settings
from support.platforms import Platform
from support.servers import LiveServer
from workers import switch_agent as agent
from workers.control_plane import check_control_plane_url
from workers.ports import free_port
from workers.switch.client import SwitchLink


def _wait_for_file(path: Path, thread: threading.Thread, timeout: float = 30.0) -> dict:
    done = threading.Event()
    for _ in range(int(timeout / 0.05)):
        if path.exists():
            return json.loads(path.read_text())
        if not thread.is_alive():
            raise AssertionError(f"the switch thread exited before writing {path}")
        done.wait(0.05)
    raise AssertionError(f"{path} never appeared")


def test_switches_enroll_with_the_control_plane_and_carry_a_job(
    settings: Settings, platform: Platform, tmp_path: Path
) -> None:
    platform.user(Role.admin)
    ports = {"cluster-a": (free_port(), free_port()), "cluster-b": (free_port(), free_port())}
    tokens = {}
    with platform.factory() as db:
        for name, (peer_port, _worker_port) in ports.items():
            cluster = clusters.create(
                db,
                actor=SYSTEM,
                name=name,
                switch_host="127.0.0.1",
                switch_port=peer_port,
            )
            _row, tokens[name] = pki.create_enrollment_token(
                db, actor=SYSTEM, cluster=cluster, ttl=timedelta(minutes=5)
            )
        db.commit()

    with LiveServer(settings) as server:
        stop = threading.Event()
        threads = {}
        for name, (peer_port, worker_port) in ports.items():
            other = next(n for n in ports if n != name)
            threads[name] = threading.Thread(
                target=agent.run,
                kwargs=dict(
                    cluster=name,
                    folder=tmp_path / name,
                    control_plane=server.url,
                    enroll_token=tokens[name],
                    worker_address=("127.0.0.1", worker_port),
                    peer_address=("127.0.0.1", peer_port),
                    peers={other: ("127.0.0.1", ports[other][0])},
                    shaper=None,
                    metrics_address=None,
                    stop=stop,
                ),
                daemon=True,
            )
            threads[name].start()
        try:
            states = {
                name: _wait_for_file(tmp_path / name / "switch.json", t)
                for name, t in threads.items()
            }
            for name in ports:
                key = tmp_path / name / "switch.key"
                assert stat.S_IMODE(key.stat().st_mode) == 0o600
                assert b"PRIVATE KEY" in key.read_bytes()
            placement = {"generator": "cluster-a", "discriminator": "cluster-b"}
            with platform.factory() as db:
                token = {
                    role: pki.job_token(
                        db,
                        settings=settings,
                        job_id="job-1.1",
                        role=role,
                        cluster=cluster,
                        placement=placement,
                        ttl=timedelta(minutes=5),
                    )
                    for role, cluster in placement.items()
                }
            links = {}
            for role, peer in (("generator", "discriminator"), ("discriminator", "generator")):
                cluster = placement[role]
                host, port = states[cluster]["worker_address"]
                links[role] = SwitchLink(
                    (host, port),
                    ca_path=states[cluster]["ca_path"],
                    token=token[role],
                    job_id="job-1.1",
                    role=role,
                    peer_role=peer,
                )
            ids = torch.randint(0, 2048, (8, 32), dtype=torch.int16)
            links["generator"].send("batch", ids)
            got = links["discriminator"].recv("batch", timeout=20)
            assert isinstance(got, torch.Tensor) and torch.equal(got, ids)
            links["discriminator"].send("sync", b"step-1")
            assert links["generator"].recv("sync", timeout=20) == b"step-1"
            for link in links.values():
                link.close()
        finally:
            stop.set()
            for thread in threads.values():
                thread.join(timeout=20)
    # the enrollment tokens are spent
    with platform.factory() as db:
        from sqlalchemy import select

        from app.clusters.models import EnrollmentToken

        assert all(t.used_at is not None for t in db.scalars(select(EnrollmentToken)))


def _start_unenrolled(folder: Path, control_plane: str) -> None:
    """`nebula switch` without an enrollment token (it must refuse before serving)."""
    agent.run(
        cluster="cluster-a",
        folder=folder,
        control_plane=control_plane,
        enroll_token=None,
        worker_address=("127.0.0.1", 0),
        peer_address=("127.0.0.1", 0),
        peers={},
        shaper=None,
        metrics_address=None,
    )


def test_the_job_token_key_is_pinned_at_enrollment_and_never_fetched_again(
    settings: Settings, platform: Platform, tmp_path: Path
) -> None:
    with platform.factory() as db:
        cluster = clusters.create(
            db, actor=SYSTEM, name="cluster-a", switch_host="127.0.0.1", switch_port=1
        )
        _row, token = pki.create_enrollment_token(
            db, actor=SYSTEM, cluster=cluster, ttl=timedelta(minutes=5)
        )
        db.commit()
        expected = pki.platform_keys(db, settings).job_public_pem
    files = agent.SwitchFiles(tmp_path / "cluster-a")
    with LiveServer(settings) as server:
        agent.enroll(files, cluster="cluster-a", control_plane=server.url, token=token)
    assert files.job_key.read_bytes() == expected
    assert stat.S_IMODE(files.job_key.stat().st_mode) == 0o600

    # a switch whose pinned key is gone is not enrolled: it fetches no key from anywhere
    files.job_key.unlink()
    with pytest.raises(SystemExit, match="not enrolled"):
        _start_unenrolled(files.folder, "http://127.0.0.1:9")


@pytest.mark.parametrize(
    "url", ["http://10.1.2.3:8000", "http://control.example.org", "ftp://127.0.0.1"]
)
def test_switch_and_worker_refuse_plain_http_to_a_remote_control_plane(url: str) -> None:
    with pytest.raises(ValueError):
        check_control_plane_url(url)
    with pytest.raises(SystemExit, match="http"):
        _start_unenrolled(Path("/nonexistent"), url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/",
        "http://localhost:8000",
        "http://[::1]:80",
        "https://cp.example.org",
    ],
)
def test_loopback_http_and_any_https_are_accepted(url: str) -> None:
    assert not check_control_plane_url(url).endswith("/")

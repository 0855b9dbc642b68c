"""A job's device need on real parts: PostgreSQL, Redis, TLS switches and Celery worker
processes that train on the CPU (`nebula worker --device auto` on a host without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy import select

from app.jobs.models import JobRole
from app.jobs.states import RoleStatus
from support.clusters import RunningPlatform, electra_job
from support.processes import wait_until

pytestmark = [
    pytest.mark.services,
    pytest.mark.slow,
    pytest.mark.skipif(
        torch.cuda.is_available(),
        reason="this host has CUDA: the platform's workers (--device auto) train on it",
    ),
]


def test_the_workers_report_the_cpu_and_a_job_that_asks_for_it_runs(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    user, job = electra_job(running, corpus, "dana", steps=6, device="cpu")

    def cpu_workers() -> bool:
        clusters = user.call("GET", "/clusters", 200)["items"]
        return all(
            [d["device"]["kind"] for d in c["worker_devices"]] == ["cpu"]
            and c["worker_devices"][0]["workers"] >= 1
            and c["worker_devices"][0]["device"]["count"] >= 1
            for c in clusters
        )

    wait_until(cpu_workers, "both clusters to show their workers' CPU", timeout=30)
    done = wait_until(lambda: user.finished(job), "the job")
    assert done["status"] == "succeeded", done["error"]


def test_a_cpu_worker_asked_for_cuda_refuses_the_claim_and_the_job_says_why(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    user, job = electra_job(
        running, corpus, "erin", steps=6, role_devices={"discriminator": "cuda"}
    )
    done = wait_until(lambda: user.finished(job), "the job to fail")
    assert done["status"] == "failed"
    assert done["error"].startswith(
        "role discriminator needs a CUDA device, but the worker of cluster 'cluster-b' that "
        "took it trains on CPU only"
    ), done["error"]
    assert done["step"] == 0
    with running.factory() as db:
        roles = {r.role: r for r in db.scalars(select(JobRole).where(JobRole.job_id == job))}
    # the refused role never started
    assert roles["discriminator"].worker is None
    assert roles["discriminator"].status != RoleStatus.running
    log = running.log_dir / "worker-cluster-b.log"
    wait_until(
        lambda: "needs a CUDA device" in log.read_text(errors="replace"),
        "the worker's log to say why it took no role",
        timeout=10,
    )

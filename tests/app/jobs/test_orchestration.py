"""Jobs end to end on real parts: PostgreSQL, Redis, TLS switches and Celery worker processes."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import select

from app.audit.service import SYSTEM as SYSTEM_ACTOR
from app.jobs.models import JobRole
from support.clusters import ELECTRA_FAST, RunningPlatform, User, electra_job
from support.processes import wait_until

pytestmark = [pytest.mark.services, pytest.mark.slow]


def _roles(running: RunningPlatform, job_id: str) -> dict[str, JobRole]:
    with running.factory() as db:
        return {r.role: r for r in db.scalars(select(JobRole).where(JobRole.job_id == job_id))}


def test_electra_then_abnet_on_its_model_through_the_switches(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    owner, scientist = running.user("alice"), running.user("bob")
    text = owner.upload(corpus["text"], "text", discoverable=True, lines=600)
    pairs = owner.upload(corpus["parallel.train"], "parallel", discoverable=True, lines=300)
    for dataset in (text, pairs):
        request = scientist.call(
            "POST", "/access-requests", 201, json={"dataset_id": dataset, "purpose": "test"}
        )
        owner.call("POST", f"/access-requests/{request['id']}/approve", 200, json={})

    electra = scientist.call(
        "POST",
        f"/workspaces/{scientist.workspace}/jobs",
        202,
        json={
            "kind": "electra_pretrain",
            "config": ELECTRA_FAST,
            "inputs": {"text": text},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
    )["id"]
    done = wait_until(lambda: scientist.finished(electra), "the ELECTRA job")
    assert done["status"] == "succeeded", done["error"]
    assert done["progress"] == 1.0 and done["step"] == 6
    series = scientist.call("GET", f"/jobs/{electra}/metrics", 200)["series"]
    assert len(series["discriminator.rtd_loss"]) == 6 and len(series["generator.mlm_loss"]) == 6
    artifacts = scientist.call("GET", f"/jobs/{electra}/artifacts", 200)["items"]
    model = next(a for a in artifacts if a["kind"] == "model")
    assert scientist.call("GET", f"/datasets/{model['dataset_id']}", 200)["kind"] == "model"
    # the clusters forget the ended job: the role that finished first sweeps it at its
    # worker's next report
    for cluster in ("cluster-a", "cluster-b"):
        folder = _scratch(running, cluster, electra)
        wait_until(lambda f=folder: not f.exists(), f"{folder} to be removed", timeout=30)

    abnet = scientist.call(
        "POST",
        f"/workspaces/{scientist.workspace}/jobs",
        202,
        json={
            "kind": "abnet_finetune",
            "config": {"preset": "tiny", "steps": 3, "batch_size": 8},
            "inputs": {
                "parallel": pairs,
                "source_model": model["dataset_id"],
                "target_model": model["dataset_id"],
            },
            "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
        },
    )["id"]
    finished = wait_until(lambda: scientist.finished(abnet), "the ABNet job")
    assert finished["status"] == "succeeded", finished["error"]
    assert (
        "decoder.loss" in finished["metrics"] and "encoder.bytes_to_decoder" in finished["metrics"]
    )

    # every dataset use by a job is in the audit log, with the job and the grant behind it
    with running.factory() as db:
        from app.audit.models import AuditEvent

        uses = db.scalars(select(AuditEvent).where(AuditEvent.action == "dataset.use")).all()
    by_job = {(e.details["job_id"], e.subject_id) for e in uses if e.outcome == "success"}
    assert (
        (electra, text) in by_job
        and (abnet, pairs) in by_job
        and (abnet, model["dataset_id"]) in by_job
    )
    assert any(
        e.details.get("via") == "granted" and e.details["grant_ids"]
        for e in uses
        if e.subject_id == text
    )


def _long_electra(
    running: RunningPlatform, corpus: dict[str, Path], expires_at: datetime | None = None
) -> tuple[User, User, str, str]:
    owner, scientist = running.user("carol"), running.user("dave")
    text = owner.upload(corpus["text"], "text", discoverable=True, lines=400)
    request = scientist.call(
        "POST", "/access-requests", 201, json={"dataset_id": text, "purpose": "long run"}
    )
    approval = {"expires_at": expires_at.isoformat()} if expires_at else {}
    owner.call("POST", f"/access-requests/{request['id']}/approve", 200, json=approval)
    job = scientist.call(
        "POST",
        f"/workspaces/{scientist.workspace}/jobs",
        202,
        json={
            "kind": "electra_pretrain",
            "config": {**ELECTRA_FAST, "steps": 100_000},
            "inputs": {"text": text},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
    )["id"]
    wait_until(lambda: scientist.job(job)["step"] >= 2, "the long job to make progress")
    return owner, scientist, job, request["id"]


def _describe(running: RunningPlatform, user: User, job: str) -> str:
    roles = {
        name: (r.status.value, r.attempt, r.checkpoint_step, r.error)
        for name, r in _roles(running, job).items()
    }
    state = user.job(job)
    return f"job {state['status']} step {state['step']} attempt {state['attempt']}; roles {roles}"


def _both_roles_stopped(running: RunningPlatform, job: str) -> bool:
    return all(r.status.value == "stopped" for r in _roles(running, job).values())


def _scratch(running: RunningPlatform, cluster: str, job: str) -> Path:
    return running.settings.var_dir / "clusters" / cluster / "scratch" / "jobs" / job


def test_cancel_stops_both_roles_within_seconds_and_the_clusters_forget_the_job(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    _owner, scientist, job, _request = _long_electra(running, corpus)
    # while it runs, what the roles keep on their clusters' disks is sealed
    generator_dir = _scratch(running, "cluster-a", job) / "generator"
    checkpoints = wait_until(
        lambda: sorted(generator_dir.glob("step-*.safetensors")), "a generator checkpoint"
    )
    on_disk = checkpoints[-1].read_bytes()
    assert on_disk.startswith(b"NBS1") and b"__metadata__" not in on_disk
    tokenizer = (generator_dir / "tokenizer.json").read_bytes()
    assert tokenizer.startswith(b"NBS1") and b"vocab" not in tokenizer

    assert scientist.call("POST", f"/jobs/{job}/cancel", 202)["status"] == "cancelled"
    wait_until(lambda: _both_roles_stopped(running, job), "both roles to stop", timeout=30)
    assert scientist.job(job)["status"] == "cancelled"
    assert scientist.client.post(f"/api/v1/jobs/{job}/cancel").status_code == 409
    # the job ended for good: neither cluster keeps anything of it
    for cluster in ("cluster-a", "cluster-b"):
        assert not _scratch(running, cluster, job).exists()


def test_revoking_the_grant_fails_the_running_job(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    owner, scientist, job, request = _long_electra(running, corpus)
    owner.call("POST", f"/access-requests/{request}/revoke", 200)
    failed = wait_until(lambda: scientist.finished(job), "the job to fail", timeout=30)
    assert failed["status"] == "failed" and request in failed["error"]
    wait_until(lambda: _both_roles_stopped(running, job), "both roles to stop", timeout=30)


def test_an_expiring_grant_fails_the_running_job_once_it_passes(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    expires_at = datetime.now(UTC) + timedelta(seconds=30)
    _owner, scientist, job, request = _long_electra(running, corpus, expires_at=expires_at)
    assert scientist.job(job)["status"] == "running"
    failed = wait_until(lambda: scientist.finished(job), "the job to fail", timeout=120)
    assert failed["status"] == "failed" and request in failed["error"]
    assert "expired" in failed["error"]
    assert datetime.fromisoformat(failed["finished_at"]) >= expires_at
    wait_until(lambda: _both_roles_stopped(running, job), "both roles to stop", timeout=30)


def test_sigkill_of_a_worker_resumes_from_the_last_checkpoint(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    scientist, job = electra_job(running, corpus, "frank", steps=200)
    wait_until(
        lambda: all(r.checkpoint_step >= 4 for r in _roles(running, job).values()),
        lambda: f"both roles to checkpoint step 4: {_describe(running, scientist, job)}",
    )
    generator = _roles(running, job)["generator"]
    assert generator.worker is not None
    os.kill(int(generator.worker.rsplit("/", 1)[1]), signal.SIGKILL)  # host:cluster:main/pid
    done = wait_until(
        lambda: scientist.finished(job), "the job to finish after the kill", timeout=240
    )
    assert done["status"] == "succeeded", done["error"]
    with running.factory() as db:
        from app.audit.models import AuditEvent

        restarts = [
            e.details["reason"]
            for e in db.scalars(
                select(AuditEvent).where(
                    AuditEvent.action == "job.restart", AuditEvent.subject_id == job
                )
            )
        ]
    # the kill costs at least one new attempt (the surviving peer may lose one more to it)
    assert done["attempt"] >= 2 and any("no heartbeat" in r for r in restarts), restarts
    reports = [
        a
        for a in scientist.call("GET", f"/jobs/{job}/artifacts", 200)["items"]
        if a["kind"] == "report"
    ]
    assert reports and all(r["details"]["start_step"] >= 4 for r in reports)
    assert all(r["details"]["last_step"] == 200 for r in reports)


def test_a_role_that_keeps_failing_ends_the_job_with_a_clear_error(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    scientist = running.user("grace")
    too_short = scientist.upload(corpus["text"], "text", lines=5)  # fewer lines than a batch
    job = scientist.call(
        "POST",
        f"/workspaces/{scientist.workspace}/jobs",
        202,
        json={
            "kind": "electra_pretrain",
            "config": ELECTRA_FAST,
            "inputs": {"text": too_short},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
    )["id"]
    failed = wait_until(lambda: scientist.finished(job), "the job to give up", timeout=120)
    assert failed["status"] == "failed"
    assert failed["attempt"] == 3 and "gave up after 3 attempts" in failed["error"]
    assert "need at least 8 lines" in failed["error"]
    wait_until(
        lambda: all(r.status.value in ("failed", "stopped") for r in _roles(running, job).values()),
        "no role left running",
        timeout=30,
    )


def test_cluster_health_shows_a_stopped_worker_go_offline_and_come_back(
    running: RunningPlatform,
) -> None:
    viewer = running.user("ivan")

    def health(name: str) -> dict[str, Any]:
        clusters = viewer.call("GET", "/clusters", 200)["items"]
        return next(c for c in clusters if c["name"] == name)

    wait_until(
        lambda: all(
            health(n)["switch_online"] and health(n)["workers_online"] == 1
            for n in ("cluster-a", "cluster-b")
        ),
        lambda: f"both clusters online: {health('cluster-a')}, {health('cluster-b')}",
        timeout=60,
    )
    worker = running.workers["cluster-a"]
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    wait_until(lambda: health("cluster-a")["workers_online"] == 0, "cluster-a's worker offline", 30)
    assert health("cluster-a")["switch_online"] and health("cluster-b")["workers_online"] == 1
    running.start_worker("cluster-a")
    wait_until(lambda: health("cluster-a")["workers_online"] == 1, "cluster-a's worker back", 60)


def test_discriminator_replicas_in_two_worker_processes_equal_the_single_process_reference(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    """n = 2 discriminators: the root and its replica are two tasks in two worker processes
    of cluster-b, joined at the rendezvous the root publishes through the cluster API; with
    dropout off, the trained model equals one process training on both micro-batches."""
    from workers.training.electra import load_pretrained, train_electra_local
    from workers.training.job_config import training_config

    scientist = running.user("judy")
    lines = corpus["text"].read_text().splitlines()[:400]
    text = scientist.upload(corpus["text"], "text", lines=400)
    config = {**ELECTRA_FAST, "n_discriminators": 2, "dropout": 0.0}
    job = scientist.call(
        "POST",
        f"/workspaces/{scientist.workspace}/jobs",
        202,
        json={
            "kind": "electra_pretrain",
            "config": config,
            "inputs": {"text": text},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
    )["id"]
    done = wait_until(lambda: scientist.finished(job), "the job with two discriminators")
    assert done["status"] == "succeeded", done["error"]
    roles = _roles(running, job)
    assert set(roles) == {"generator", "discriminator", "replica-1"}
    assert roles["replica-1"].cluster == "cluster-b"
    root_worker, replica_worker = roles["discriminator"].worker, roles["replica-1"].worker
    assert root_worker and replica_worker and root_worker != replica_worker  # two processes

    model = next(
        a
        for a in scientist.call("GET", f"/jobs/{job}/artifacts", 200)["items"]
        if a["kind"] == "model"
    )
    blob = scientist.client.get(f"/api/v1/datasets/{model['dataset_id']}/content").content
    trained = load_pretrained(blob)
    cfg = training_config("electra_pretrain", {"preset": "tiny", **config})
    reference = train_electra_local(cfg, lines, seed=0, tokenizer=trained.tokenizer)
    expected = reference.discriminator.model.state_dict()
    for name, tensor in trained.discriminator.state_dict().items():
        assert torch.allclose(tensor, expected[name], atol=1e-5), name


def test_a_revoked_worker_credential_stops_its_clusters_worker_and_a_new_one_resumes(
    running: RunningPlatform, corpus: dict[str, Path]
) -> None:
    # last in the module: cluster-b's switch keeps reporting in with the revoked credential
    from app.clusters import service as clusters
    from app.clusters.models import WorkerCredential
    from common.private_files import write_private_file
    from workers.worker_state import credential_path

    scientist, job = electra_job(running, corpus, "heidi", steps=120)
    wait_until(
        lambda: all(r.checkpoint_step >= 4 for r in _roles(running, job).values()),
        lambda: f"both roles to checkpoint: {_describe(running, scientist, job)}",
    )
    with running.factory() as db:
        cluster = clusters.by_name(db, name="cluster-b")
        assert cluster is not None
        for row in db.scalars(
            select(WorkerCredential).where(WorkerCredential.cluster_id == cluster.id)
        ):
            clusters.revoke_worker_credential(
                db, actor=SYSTEM_ACTOR, cluster=cluster, credential_id=row.id
            )
        db.commit()
    worker_b = running.workers["cluster-b"]
    # the worker's next call is refused, and the whole worker shuts down
    wait_until(lambda: worker_b.poll() is not None, "cluster-b's worker to exit", timeout=60)
    assert scientist.job(job)["status"] == "running"
    # the admin issues a new credential; the cluster's new worker picks the job up again
    with running.factory() as db:
        cluster = clusters.by_name(db, name="cluster-b")
        assert cluster is not None
        _row, secret = clusters.create_worker_credential(db, actor=SYSTEM_ACTOR, cluster=cluster)
        db.commit()
    write_private_file(credential_path(running.settings.var_dir, "cluster-b"), secret.encode())
    running.start_worker("cluster-b")
    done = wait_until(lambda: scientist.finished(job), "the job to finish", timeout=240)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempt"] >= 2

"""A grantee collects both columns of a parallel corpus on one cluster across two jobs.

Issue 27, finding 3: job 1 puts ABNet's encoder (source column) on A and its decoder
(target column) on B; job 2 swaps them, and A's credential would then have read both
columns of every pair. The platform remembers, per dataset and user, which cluster got
which column (app/jobs/models.py ColumnExposure) and refuses the swap.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.audit.models import AuditEvent
from app.jobs import attempts
from app.jobs.models import Job
from app.jobs.outputs import store_job_output
from app.settings import Settings
from support.clusters import register_clusters
from support.platforms import Account, Platform, model_file_bytes

API = "/api/v1"
PAIRS = "".join(f"hola {i}\thello {i}\n" for i in range(8)).encode()


@pytest.fixture(autouse=True)
def clusters_ready(platform: Platform, settings: Settings) -> None:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b", "cluster-c")


def _workspace(client: TestClient, user: Account) -> str:
    return str(client.get(f"{API}/workspaces", headers=user.headers).json()["items"][0]["id"])


def _upload(client: TestClient, user: Account, kind: str, data: bytes) -> str:
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, user)}/datasets",
        data={"name": kind, "kind": kind, "discoverable": "true"},
        files={"file": (kind, data)},
        headers=user.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _abnet(
    client: TestClient, user: Account, parallel: str, model: str, encoder: str, decoder: str
) -> tuple[int, dict]:
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, user)}/jobs",
        json={
            "kind": "abnet_finetune",
            "config": {},
            "inputs": {"parallel": parallel, "source_model": model, "target_model": model},
            "placement": {"encoder": encoder, "decoder": decoder},
        },
        headers=user.headers,
    )
    return answer.status_code, answer.json()


def test_a_swapped_second_abnet_job_is_refused_so_no_cluster_gets_both_columns(
    client: TestClient, platform: Platform
) -> None:
    alice, bob = platform.user(), platform.user()
    parallel = _upload(client, alice, "parallel", PAIRS)
    request = client.post(
        f"{API}/access-requests",
        json={"dataset_id": parallel, "purpose": "mt"},
        headers=bob.headers,
    ).json()
    approved = client.post(f"{API}/access-requests/{request['id']}/approve", headers=alice.headers)
    assert approved.status_code == 200, approved.text
    model = _upload(client, bob, "model", model_file_bytes())

    status, first = _abnet(client, bob, parallel, model, "cluster-a", "cluster-b")
    assert status == 202, first
    # the first job's end changes nothing: what A and B received stays received
    assert client.post(f"{API}/jobs/{first['id']}/cancel", headers=bob.headers).status_code == 202

    status, refused = _abnet(client, bob, parallel, model, "cluster-b", "cluster-a")
    assert status == 403, refused
    assert "cluster 'cluster-a' already received the source column" in refused["detail"]
    assert "sentence pairs" in refused["detail"]
    with platform.factory() as db:
        assert db.scalar(select(func.count()).select_from(Job)) == 1
        denied = db.scalars(
            select(AuditEvent).where(
                AuditEvent.action == "job.submit", AuditEvent.outcome == "denied"
            )
        ).all()
    assert [e.subject_id for e in denied] == [parallel]

    # half a swap is refused too: B already holds the target column
    status, half = _abnet(client, bob, parallel, model, "cluster-b", "cluster-c")
    assert status == 403 and "cluster 'cluster-b'" in half["detail"], half
    # the same sides again, or a fresh cluster for one side, are fine
    assert _abnet(client, bob, parallel, model, "cluster-a", "cluster-b")[0] == 202
    assert _abnet(client, bob, parallel, model, "cluster-c", "cluster-b")[0] == 202


def test_a_model_trained_on_one_column_counts_as_that_column(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    """The decoder's adapters learned the target column: sent to the encoder's cluster, they
    would give it both sides, so the placement is refused as the column itself would be."""
    alice = platform.user()
    parallel = _upload(client, alice, "parallel", PAIRS)
    base = _upload(client, alice, "model", model_file_bytes())
    status, first = _abnet(client, alice, parallel, base, "cluster-a", "cluster-b")
    assert status == 202, first
    with platform.factory() as db:
        job = db.get(Job, first["id"])
        assert job is not None
        adapters, size = store_job_output(
            db,
            job_id=job.id,
            workspace_id=job.workspace_id,
            owner_id=job.owner_id,
            name="decoder.safetensors",
            kind="model",
            chunks=[model_file_bytes("decoder")],
            settings=settings,
        )
        # as the cluster API records the decoder's artifact (app/cluster_api/service.py)
        attempts.add_artifact(
            db,
            job_id=job.id,
            name="decoder.safetensors",
            kind="adapters",
            dataset_id=adapters,
            size_bytes=size,
            details={"role": "decoder", "attempt": 1},
        )
        db.commit()
    assert client.post(f"{API}/jobs/{first['id']}/cancel", headers=alice.headers).status_code == 202
    # the encoder's cluster A already holds the source column; the target's adapters too: no
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, alice)}/jobs",
        json={
            "kind": "abnet_finetune",
            "config": {},
            "inputs": {"parallel": parallel, "source_model": adapters, "target_model": base},
            "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
        },
        headers=alice.headers,
    )
    assert answer.status_code == 403, answer.text
    assert "cluster 'cluster-a' already received the source column" in answer.json()["detail"]
    # on the decoder's side, where the target column already went, it is fine
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, alice)}/jobs",
        json={
            "kind": "abnet_finetune",
            "config": {},
            "inputs": {"parallel": parallel, "source_model": base, "target_model": adapters},
            "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
        },
        headers=alice.headers,
    )
    assert answer.status_code == 202, answer.text

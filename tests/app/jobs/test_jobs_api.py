"""Job submission rules through the API, without workers: validation, access, quotas, holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.accounts.models import Role
from app.audit.service import SYSTEM
from app.clusters import service as clusters
from app.jobs.models import Job, JobRole
from app.settings import Settings
from support.clusters import register_clusters
from support.jobs import (
    API,
    PLACEMENT,
    electra_request,
    first_workspace,
    submit,
    upload_dataset,
)
from support.platforms import Platform, model_file_bytes


@pytest.fixture
def clusters_ready(platform: Platform, settings: Settings, client: TestClient) -> None:
    """Two clusters whose switches hold valid certificates."""
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")


@pytest.mark.usefixtures("clusters_ready")
def test_a_valid_job_is_written_with_its_roles_and_audited(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    status, body = submit(client, alice, electra_request(upload_dataset(client, alice)))
    assert status == 202 and body["status"] == "queued"
    job = client.get(f"{API}/jobs/{body['id']}", headers=alice.headers).json()
    assert job["total_steps"] == 5 and job["placement"] == PLACEMENT and job["attempt"] == 1
    with platform.factory() as db:
        roles = {
            r.role: r.cluster
            for r in db.scalars(select(JobRole).where(JobRole.job_id == body["id"]))
        }
    assert roles == PLACEMENT
    events = client.get(f"{API}/me/audit", headers=alice.headers).json()["items"]
    assert any(e["action"] == "job.submit" and e["subject_id"] == body["id"] for e in events)


@pytest.mark.usefixtures("clusters_ready")
def test_bad_jobs_are_refused_and_write_nothing(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    text = upload_dataset(client, alice)
    cases = [
        (electra_request(text, learning_rate=1.0), 422),  # unknown config key
        (electra_request(text, steps=0), 422),
        (electra_request(text, max_lag=0), 422),  # an integer of at least 1, or "auto"
        (electra_request(text, max_lag="fast"), 422),
        ({**electra_request(text), "inputs": {}}, 422),
        ({**electra_request(text), "inputs": {"text": text, "extra": text}}, 422),
        ({**electra_request(text), "placement": {"generator": "cluster-a"}}, 422),
        ({**electra_request(text), "placement": {**PLACEMENT, "discriminator": "nowhere"}}, 422),
        ({**electra_request(text), "kind": "shell_script"}, 422),
        (
            {
                "kind": "abnet_finetune",
                "config": {"forward_codec": "fp16(lowrank(2.0))"},
                "inputs": {"parallel": text, "source_model": text, "target_model": text},
                "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
            },
            422,
        ),
        (
            {
                "kind": "abnet_finetune",
                "config": {},
                "inputs": {"parallel": text, "source_model": text, "target_model": text},
                "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
            },
            422,
        ),  # wrong kinds
    ]
    for body, expected in cases:
        status, answer = submit(client, alice, body)
        assert status == expected, (body, answer)
        assert isinstance(answer["detail"], str | list)
    # error feedback on ABNet's per-sample streams: refused, saying why
    for stream in ("forward_codec", "backward_codec"):
        body = {
            "kind": "abnet_finetune",
            "config": {stream: "ef(int8)"},
            "inputs": {"parallel": text, "source_model": text, "target_model": text},
            "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
        }
        status, answer = submit(client, alice, body)
        assert status == 422, answer
        assert "per-sample stream" in str(answer["detail"]) and stream in str(answer["detail"])
    # ABNet's pipeline is sync or stale1
    body = {**body, "config": {"schedule": "stale2"}}
    status, answer = submit(client, alice, body)
    assert status == 422 and "'sync' or 'stale1'" in str(answer["detail"]), answer
    with platform.factory() as db:
        assert db.scalars(select(Job)).all() == []


@pytest.mark.usefixtures("clusters_ready")
def test_inputs_are_checked_through_grants(client: TestClient, platform: Platform) -> None:
    alice, mallory = platform.user(), platform.user()
    hidden, listed = upload_dataset(client, alice), upload_dataset(client, alice, discoverable=True)
    assert submit(client, mallory, electra_request(hidden))[0] == 404  # cannot even see it
    assert submit(client, mallory, electra_request(listed))[0] == 403  # sees it, holds no grant
    request = client.post(
        f"{API}/access-requests",
        json={"dataset_id": listed, "purpose": "x"},
        headers=mallory.headers,
    ).json()
    client.post(f"{API}/access-requests/{request['id']}/approve", json={}, headers=alice.headers)
    assert submit(client, mallory, electra_request(listed))[0] == 202
    auditor = platform.user(Role.auditor)
    assert submit(client, auditor, electra_request(listed))[0] == 403  # read-only role


def test_clusters_without_a_valid_certificate_take_no_jobs(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    with platform.factory() as db:
        for name in PLACEMENT.values():
            clusters.create(db, actor=SYSTEM, name=name, switch_host="127.0.0.1", switch_port=1)
        db.commit()
    status, body = submit(client, alice, electra_request(upload_dataset(client, alice)))
    assert status == 409 and "certificate" in body["detail"]


@pytest.mark.usefixtures("clusters_ready")
def test_concurrent_job_quota(client: TestClient, platform: Platform) -> None:
    alice, admin = platform.user(), platform.user(Role.admin)
    workspace = first_workspace(client, alice)
    client.patch(
        f"{API}/workspaces/{workspace}/quota",
        json={"max_concurrent_jobs": 1},
        headers=admin.headers,
    )
    text = upload_dataset(client, alice)
    assert submit(client, alice, electra_request(text))[0] == 202
    status, body = submit(client, alice, electra_request(text))
    assert status == 409 and "quota" in body["detail"]


@pytest.mark.usefixtures("clusters_ready")
def test_jobs_of_another_tenant_are_404(client: TestClient, platform: Platform) -> None:
    alice, mallory = platform.user(), platform.user()
    job = submit(client, alice, electra_request(upload_dataset(client, alice)))[1]["id"]
    for method, path in [
        ("GET", f"/jobs/{job}"),
        ("GET", f"/jobs/{job}/metrics"),
        ("GET", f"/jobs/{job}/artifacts"),
        ("GET", f"/jobs/{job}/events"),
        ("POST", f"/jobs/{job}/cancel"),
    ]:
        assert client.request(method, f"{API}{path}", headers=mallory.headers).status_code == 404, (
            path
        )
    assert (
        client.get(
            f"{API}/workspaces/{first_workspace(client, alice)}/jobs", headers=mallory.headers
        ).status_code
        == 404
    )


@pytest.mark.usefixtures("clusters_ready")
def test_suspension_holds_queued_jobs_and_reactivation_releases_them(
    client: TestClient, platform: Platform
) -> None:
    alice, admin = platform.user(), platform.user(Role.admin)
    job_id = submit(client, alice, electra_request(upload_dataset(client, alice)))[1]["id"]
    client.post(f"{API}/users/{alice.id}/suspend", headers=admin.headers)
    with platform.factory() as db:
        assert db.get(Job, job_id).paused is True  # type: ignore[union-attr]
    client.post(f"{API}/users/{alice.id}/reactivate", headers=admin.headers)
    with platform.factory() as db:
        assert db.get(Job, job_id).paused is False  # type: ignore[union-attr]


@pytest.mark.usefixtures("clusters_ready")
def test_cancel_and_the_event_stream_of_a_finished_job(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    job_id = submit(client, alice, electra_request(upload_dataset(client, alice)))[1]["id"]
    assert (
        client.post(f"{API}/jobs/{job_id}/cancel", headers=alice.headers).json()["status"]
        == "cancelled"
    )
    assert client.post(f"{API}/jobs/{job_id}/cancel", headers=alice.headers).status_code == 409
    with client.stream("GET", f"{API}/jobs/{job_id}/events", headers=alice.headers) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        text = "".join(stream.iter_text())
    event = json.loads(text.split("data: ", 1)[1].split("\n", 1)[0])
    assert text.startswith("event: status") and event["status"] == "cancelled"


@pytest.mark.usefixtures("clusters_ready")
def test_abnet_with_encoder_and_decoder_on_one_cluster_is_refused(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    workspace = first_workspace(client, alice)
    uploads = {}
    for kind, data in (("parallel", b"hola\thello\nadios\tbye\n"), ("model", model_file_bytes())):
        uploads[kind] = client.post(
            f"{API}/workspaces/{workspace}/datasets",
            data={"name": kind, "kind": kind},
            files={"file": (kind, data)},
            headers=alice.headers,
        ).json()["id"]
    model = uploads["model"]
    body = {
        "kind": "abnet_finetune",
        "config": {},
        "inputs": {"parallel": uploads["parallel"], "source_model": model, "target_model": model},
        "placement": {"encoder": "cluster-a", "decoder": "cluster-a"},
    }
    status, answer = submit(client, alice, body)
    assert status == 422 and "different clusters" in answer["detail"]
    with platform.factory() as db:
        assert db.scalars(select(Job)).all() == [] and db.scalars(select(JobRole)).all() == []


def test_the_job_kinds_table_is_served_and_a_job_built_from_it_is_accepted(
    client: TestClient, platform: Platform, clusters_ready: None
) -> None:
    assert client.get(f"{API}/job-kinds").status_code == 401  # signed-in callers only
    alice = platform.user()
    answer = client.get(f"{API}/job-kinds", headers=alice.headers)
    assert answer.status_code == 200, answer.text
    kinds = {k["kind"]: k for k in answer.json()["items"]}
    assert set(kinds) == {"electra_pretrain", "abnet_finetune"}
    electra = kinds["electra_pretrain"]
    roles = {r["name"]: r for r in electra["roles"]}
    assert roles["generator"]["peer"] == "discriminator" and electra["primary_role"] in roles
    assert roles["discriminator"]["artifact"] == "model"
    assert roles["discriminator"]["read_if"] == {"text": "discriminator_reads_text"}
    assert "nearly verbatim" in roles["discriminator"]["sees_otherwise"]
    presets = {p["name"]: p["values"] for p in electra["presets"]}
    assert presets["tiny"]["steps"] == 600 and presets["paper"]["steps"] == 400_000
    assert "n_discriminators" in electra["config_fields"]
    assert electra["config_schema"]["additionalProperties"] is False
    abnet = kinds["abnet_finetune"]
    assert abnet["apart"] == ["encoder", "decoder"]
    inputs = {i["name"]: i for i in abnet["inputs"]}
    assert inputs["eval"]["optional"] and inputs["source_model"]["kind"] == "model"
    assert {p["name"]: p["values"] for p in abnet["presets"]}["tiny"]["forward_codec"] == "fp16"

    # a job made from the table alone: its inputs by kind, its roles on the clusters in turn
    text = upload_dataset(client, alice, kind=electra["inputs"][0]["kind"])
    body = {
        "kind": electra["kind"],
        "config": {"preset": "tiny", "steps": 3},
        "inputs": {i["name"]: text for i in electra["inputs"] if not i["optional"]},
        "placement": dict(zip(roles, ("cluster-a", "cluster-b"), strict=True)),
    }
    status, job = submit(client, alice, body)
    assert status == 202, job
    rows = client.get(f"{API}/jobs/{job['id']}", headers=alice.headers).json()
    assert rows["total_steps"] == 3 and rows["placement"] == body["placement"]


def test_the_web_uis_test_table_is_what_the_server_serves() -> None:
    # the web UI's component tests answer GET /job-kinds with this file: it must not drift
    from app.jobs.service import kind_table

    fixture = Path(__file__).resolve().parents[3] / "frontend/src/test/job-kinds.json"
    assert json.loads(fixture.read_text()) == kind_table().model_dump(mode="json"), (
        "regenerate it: python -c 'import json; from app.jobs.service import kind_table; "
        'print(json.dumps(kind_table().model_dump(mode="json"), indent=2, ensure_ascii=False))\''
        " > frontend/src/test/job-kinds.json"
    )

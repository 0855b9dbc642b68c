"""Derived data: provenance of job outputs, use-only until released, grants that reach it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.accounts.models import Role
from app.audit import service as audit
from app.audit.models import AuditEvent
from app.db import utcnow
from app.errors import Forbidden
from app.grants.models import AccessRequest
from app.jobs.dispatch import reap_once
from app.jobs.models import Job, JobStatus
from app.jobs.outputs import store_job_output
from app.settings import Settings
from support.clusters import register_clusters
from support.platforms import Account, Platform, model_file_bytes

API = "/api/v1"
TEXT = "".join(f"la frase número {i}\n" for i in range(64)).encode()
PAIRS = "".join(f"uno {i}\tone {i}\n" for i in range(64)).encode()
ELECTRA_PLACEMENT = {"generator": "cluster-a", "discriminator": "cluster-b"}
ABNET_PLACEMENT = {"encoder": "cluster-a", "decoder": "cluster-b"}


@pytest.fixture(autouse=True)
def clusters_ready(platform: Platform, settings: Settings) -> None:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")


def workspace(client: TestClient, user: Account) -> str:
    return str(client.get(f"{API}/workspaces", headers=user.headers).json()["items"][0]["id"])


def upload(
    client: TestClient, user: Account, kind: str, data: bytes, discoverable: bool = False
) -> str:
    answer = client.post(
        f"{API}/workspaces/{workspace(client, user)}/datasets",
        data={"name": f"my-{kind}", "kind": kind, "discoverable": str(discoverable).lower()},
        files={"file": ("f", data)},
        headers=user.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def grant(
    client: TestClient, owner: Account, requester: Account, dataset_id: str, **body: str
) -> str:
    request = client.post(
        f"{API}/access-requests",
        json={"dataset_id": dataset_id, "purpose": "research"},
        headers=requester.headers,
    ).json()
    answer = client.post(
        f"{API}/access-requests/{request['id']}/approve", json=body, headers=owner.headers
    )
    assert answer.status_code == 200, answer.text
    return str(request["id"])


def submit(
    client: TestClient, user: Account, kind: str, inputs: dict[str, str]
) -> tuple[int, dict]:
    placement = ELECTRA_PLACEMENT if kind == "electra_pretrain" else ABNET_PLACEMENT
    answer = client.post(
        f"{API}/workspaces/{workspace(client, user)}/jobs",
        json={"kind": kind, "config": {"steps": 3}, "inputs": inputs, "placement": placement},
        headers=user.headers,
    )
    return answer.status_code, answer.json()


def job_output(platform: Platform, settings: Settings, job_id: str) -> str:
    """What a job stores at its end: a model file, through the function the cluster API uses."""
    with platform.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        dataset_id, _size = store_job_output(
            db,
            job_id=job.id,
            workspace_id=job.workspace_id,
            owner_id=job.owner_id,
            name="model.safetensors",
            kind="model",
            chunks=[model_file_bytes(job_id)],
            settings=settings,
        )
        # the job ends with its output, and leaves room in the workspace's job quota
        db.execute(update(Job).where(Job.id == job_id).values(status=JobStatus.succeeded))
        db.commit()
    return dataset_id


@dataclass
class Derived:
    alice: Account  # owns the text
    bob: Account  # holds a grant on it, and trains a model on it
    text: str
    grant_id: str
    job_id: str
    model: str


@pytest.fixture
def derived(client: TestClient, platform: Platform, settings: Settings) -> Derived:
    """Bob's ELECTRA model, trained on Alice's text under a grant."""
    alice, bob = platform.user(), platform.user()
    text = upload(client, alice, "text", TEXT, discoverable=True)
    grant_id = grant(client, alice, bob, text)
    status, job = submit(client, bob, "electra_pretrain", {"text": text})
    assert status == 202, job
    model = job_output(platform, settings, job["id"])
    return Derived(alice, bob, text, grant_id, job["id"], model)


def release_request(client: TestClient, who: Account, dataset_id: str) -> tuple[int, dict]:
    answer = client.post(
        f"{API}/datasets/{dataset_id}/release-requests",
        json={"purpose": "publish the model"},
        headers=who.headers,
    )
    return answer.status_code, answer.json()


def decide(client: TestClient, who: Account, request_id: str, verb: str) -> tuple[int, dict]:
    answer = client.post(f"{API}/release-requests/{request_id}/{verb}", headers=who.headers)
    return answer.status_code, answer.json()


def audit_of(platform: Platform, subject_id: str) -> list[tuple[str, str]]:
    """The subject's events once every refusal window has ended (identical refusals within a
    window are one row and one counted row: app/audit/refusals.py)."""
    with platform.factory() as db:
        audit.flush_refusals(db, everything=True)
        db.commit()
        events = db.scalars(
            select(AuditEvent).where(AuditEvent.subject_id == subject_id).order_by(AuditEvent.seq)
        ).all()
    return [(e.action, e.outcome) for e in events]


def test_a_grantees_model_is_use_only_until_the_source_owner_releases_it(
    client: TestClient, platform: Platform, derived: Derived
) -> None:
    alice, bob, model = derived.alice, derived.bob, derived.model
    carol = platform.user()
    shown = client.get(f"{API}/datasets/{model}", headers=bob.headers).json()
    assert shown["derived_from"] == [derived.text] and shown["release"] == "required"
    assert shown["derived_by_job_id"] == derived.job_id
    assert shown["derived_from_names"] == {derived.text: "my-text"}
    refused = client.get(f"{API}/datasets/{model}/content", headers=bob.headers)
    assert refused.status_code == 403 and "release" in refused.json()["detail"]
    assert client.get(f"{API}/datasets/{model}", headers=carol.headers).status_code == 404
    assert release_request(client, carol, model)[0] == 404

    status, request = release_request(client, bob, model)
    assert status == 201 and request["status"] == "pending" and request["dataset_id"] == model
    assert [(a["owner_id"], a["status"]) for a in request["approvals"]] == [(alice.id, "pending")]
    assert [s["id"] for s in request["sources"]] == [derived.text]
    assert release_request(client, bob, model)[0] == 409  # one pending request at a time
    pending = client.get(f"{API}/datasets/{model}", headers=bob.headers).json()
    assert pending["release"] == "pending"
    assert client.get(f"{API}/datasets/{model}/content", headers=bob.headers).status_code == 403

    incoming = client.get(
        f"{API}/release-requests", params={"direction": "incoming"}, headers=alice.headers
    ).json()
    assert [r["id"] for r in incoming["items"]] == [request["id"]]
    outgoing = client.get(
        f"{API}/release-requests", params={"direction": "outgoing"}, headers=bob.headers
    ).json()
    assert [r["id"] for r in outgoing["items"]] == [request["id"]]
    for who in (alice, carol):
        assert (
            client.get(
                f"{API}/release-requests", params={"direction": "outgoing"}, headers=who.headers
            ).json()["total"]
            == 0
        )
    assert decide(client, bob, request["id"], "approve")[0] == 403  # never their own
    assert decide(client, bob, request["id"], "deny")[0] == 403
    assert decide(client, carol, request["id"], "approve")[0] == 404
    assert (
        client.get(f"{API}/release-requests/{request['id']}", headers=carol.headers).status_code
        == 404
    )

    status, approved = decide(client, alice, request["id"], "approve")
    assert status == 200 and approved["status"] == "approved"
    assert decide(client, alice, request["id"], "approve")[0] == 409
    assert (
        client.get(f"{API}/datasets/{model}", headers=bob.headers).json()["release"] == "released"
    )
    content = client.get(f"{API}/datasets/{model}/content", headers=bob.headers)
    assert content.status_code == 200 and content.content == model_file_bytes(derived.job_id)

    assert audit_of(platform, request["id"]) == [
        ("release.request", "success"),
        ("release.approve", "denied"),  # bob: 403
        ("release.deny", "denied"),  # bob: 403
        ("release.approve", "denied"),  # carol: 404
        ("release.view", "denied"),  # carol: 404
        ("release.approve", "success"),  # alice
    ]
    model_events = audit_of(platform, model)
    assert ("dataset.derive", "success") in model_events
    assert model_events.count(("dataset.download", "denied")) == 2
    assert ("dataset.release", "success") in model_events
    assert ("dataset.download", "success") in model_events


def test_a_denied_release_keeps_it_use_only_and_the_owner_may_ask_again(
    client: TestClient, derived: Derived
) -> None:
    _status, request = release_request(client, derived.bob, derived.model)
    status, denied = decide(client, derived.alice, request["id"], "deny")
    assert status == 200 and denied["status"] == "denied"
    assert decide(client, derived.alice, request["id"], "approve")[0] == 409
    shown = client.get(f"{API}/datasets/{derived.model}", headers=derived.bob.headers).json()
    assert shown["release"] == "required"
    assert (
        client.get(
            f"{API}/datasets/{derived.model}/content", headers=derived.bob.headers
        ).status_code
        == 403
    )
    assert release_request(client, derived.bob, derived.model)[0] == 201


def test_an_unreleased_model_cannot_be_shared(
    client: TestClient, platform: Platform, derived: Derived
) -> None:
    answer = client.patch(
        f"{API}/datasets/{derived.model}", json={"discoverable": True}, headers=derived.bob.headers
    )
    assert answer.status_code == 409 and "release" in answer.json()["detail"]


def test_own_data_needs_no_release(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    bob = platform.user()
    text = upload(client, bob, "text", TEXT)
    _status, job = submit(client, bob, "electra_pretrain", {"text": text})
    model = job_output(platform, settings, job["id"])
    shown = client.get(f"{API}/datasets/{model}", headers=bob.headers).json()
    assert shown["derived_from"] == [text] and shown["release"] == "not_needed"
    assert client.get(f"{API}/datasets/{model}/content", headers=bob.headers).status_code == 200
    assert release_request(client, bob, model)[0] == 409


def test_a_model_trained_on_a_derived_model_derives_from_its_sources_too(
    client: TestClient, platform: Platform, settings: Settings, derived: Derived
) -> None:
    bob = derived.bob
    pairs = upload(client, bob, "parallel", PAIRS)
    inputs = {"parallel": pairs, "source_model": derived.model, "target_model": derived.model}
    status, job = submit(client, bob, "abnet_finetune", inputs)
    assert status == 202, job
    adapters = job_output(platform, settings, job["id"])
    shown = client.get(f"{API}/datasets/{adapters}", headers=bob.headers).json()
    assert set(shown["derived_from"]) == {pairs, derived.model, derived.text}
    assert shown["release"] == "required"
    _status, request = release_request(client, bob, adapters)
    assert [a["owner_id"] for a in request["approvals"]] == [derived.alice.id]
    # releasing the first model frees what derives from it through bob's own jobs only
    _status, first = release_request(client, bob, derived.model)
    decide(client, derived.alice, first["id"], "approve")
    status, job = submit(client, bob, "abnet_finetune", inputs)
    assert status == 202, job
    later = job_output(platform, settings, job["id"])
    assert (
        client.get(f"{API}/datasets/{later}", headers=bob.headers).json()["release"] == "not_needed"
    )


def test_revoking_the_source_grant_reaches_the_derived_model(
    client: TestClient, platform: Platform, derived: Derived
) -> None:
    bob = derived.bob
    pairs = upload(client, bob, "parallel", PAIRS)
    inputs = {"parallel": pairs, "source_model": derived.model, "target_model": derived.model}
    status, running = submit(client, bob, "abnet_finetune", inputs)
    assert status == 202
    answer = client.post(
        f"{API}/access-requests/{derived.grant_id}/revoke", headers=derived.alice.headers
    )
    assert answer.status_code == 200
    status, refused = submit(client, bob, "abnet_finetune", inputs)
    assert status == 403 and derived.grant_id in refused["detail"]
    assert "revoked" in refused["detail"]
    job = client.get(f"{API}/jobs/{running['id']}", headers=bob.headers).json()
    assert job["status"] == "failed" and derived.grant_id in job["error"]
    assert (
        client.get(f"{API}/datasets/{derived.model}/content", headers=bob.headers).status_code
        == 403
    )


def test_a_released_model_stays_released_after_the_grant_ends(
    client: TestClient, platform: Platform, derived: Derived
) -> None:
    bob = derived.bob
    _status, request = release_request(client, bob, derived.model)
    decide(client, derived.alice, request["id"], "approve")
    client.post(f"{API}/access-requests/{derived.grant_id}/revoke", headers=derived.alice.headers)
    shown = client.get(f"{API}/datasets/{derived.model}", headers=bob.headers).json()
    assert shown["release"] == "released"
    assert (
        client.get(f"{API}/datasets/{derived.model}/content", headers=bob.headers).status_code
        == 200
    )
    pairs = upload(client, bob, "parallel", PAIRS)
    inputs = {"parallel": pairs, "source_model": derived.model, "target_model": derived.model}
    assert submit(client, bob, "abnet_finetune", inputs)[0] == 202


def _expire(platform: Platform, grant_id: str) -> None:
    """Move a grant's end into the past, as the clock would."""
    with platform.factory() as db:
        # through the ORM, as the platform writes: the row is sealed again (app/seals.py)
        row = db.get(AccessRequest, grant_id)
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
        db.commit()


def test_an_expired_grant_fails_the_jobs_that_rest_on_it_at_the_next_reaper_pass(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice, bob = platform.user(), platform.user()
    text = upload(client, alice, "text", TEXT, discoverable=True)
    later = (utcnow() + timedelta(hours=1)).isoformat()
    grant_id = grant(client, alice, bob, text, expires_at=later)
    job = submit(client, bob, "electra_pretrain", {"text": text})[1]["id"]
    mine = submit(client, alice, "electra_pretrain", {"text": text})[1]["id"]
    with platform.factory() as db:
        reap_once(db, settings=settings)
    assert client.get(f"{API}/jobs/{job}", headers=bob.headers).json()["status"] == "queued"
    _expire(platform, grant_id)
    with platform.factory() as db:
        reap_once(db, settings=settings)
    failed = client.get(f"{API}/jobs/{job}", headers=bob.headers).json()
    assert failed["status"] == "failed" and grant_id in failed["error"]
    assert "expired" in failed["error"]
    assert client.get(f"{API}/jobs/{mine}", headers=alice.headers).json()["status"] == "queued"
    assert ("job.fail", "success") in audit_of(platform, job)


def test_outputs_are_not_stored_once_a_grant_behind_the_inputs_ended(
    client: TestClient, platform: Platform, settings: Settings, derived: Derived
) -> None:
    bob = derived.bob
    _status, job = submit(client, bob, "electra_pretrain", {"text": derived.text})
    _expire(platform, derived.grant_id)  # no reaper pass in between: the store checks itself
    with pytest.raises(Forbidden, match=derived.grant_id):
        job_output(platform, settings, job["id"])
    answer = client.get(f"{API}/jobs/{job['id']}", headers=bob.headers).json()
    assert answer["status"] == "failed" and derived.grant_id in answer["error"]
    listed = client.get(
        f"{API}/workspaces/{workspace(client, bob)}/datasets", headers=bob.headers
    ).json()
    assert [d["id"] for d in listed["items"]] == [derived.model]


def test_the_auditor_sees_derived_metadata_only_through_its_own_rules(
    client: TestClient, platform: Platform, derived: Derived
) -> None:
    auditor = platform.user(Role.auditor)
    assert client.get(f"{API}/datasets/{derived.model}", headers=auditor.headers).status_code == 404
    assert release_request(client, auditor, derived.model)[0] == 403  # read-only role


def test_a_shared_model_counts_as_its_owners_and_hides_what_it_came_from(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice, bob = platform.user(), platform.user()
    private = upload(client, alice, "text", TEXT)  # never listed: bob cannot know of it
    status, job = submit(client, alice, "electra_pretrain", {"text": private})
    shared = job_output(platform, settings, job["id"])
    listed = client.patch(
        f"{API}/datasets/{shared}", json={"discoverable": True}, headers=alice.headers
    )
    assert listed.status_code == 200  # her own data only: hers to share
    grant(client, alice, bob, shared)
    pairs = upload(client, bob, "parallel", PAIRS)
    inputs = {"parallel": pairs, "source_model": shared, "target_model": shared}
    status, job = submit(client, bob, "abnet_finetune", inputs)
    assert status == 202, job
    adapters = job_output(platform, settings, job["id"])
    shown = client.get(f"{API}/datasets/{adapters}", headers=bob.headers).json()
    assert set(shown["derived_from"]) == {pairs, shared} and shown["release"] == "required"
    _status, request = release_request(client, bob, adapters)
    assert [a["owner_id"] for a in request["approvals"]] == [alice.id]
    assert [s["id"] for s in request["sources"]] == [shared]
    incoming = client.get(
        f"{API}/release-requests", params={"direction": "incoming"}, headers=alice.headers
    ).json()["items"]
    assert {s["id"] for s in incoming[0]["sources"]} == {shared, private}

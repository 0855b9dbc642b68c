"""Residency: a grant names the clusters its data (and what jobs derive from it) may go to.

Checked at submit, at every claim and every input read; narrowing a grant mid-job fails the
job's roles on the removed cluster, naming the grant; a derived model carries its sources'
sets. On SQLite and PostgreSQL, through the API and the cluster API.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save as save_safetensors
from sqlalchemy import select

from app.accounts.models import Role
from app.audit.models import AuditEvent
from app.grants.models import AccessRequest
from app.jobs import dispatch
from app.jobs.models import Job, JobStatus
from app.settings import Settings
from support.clusters import register_clusters
from support.platforms import Account, Platform

API = "/api/v1"
CLUSTER_API = f"{API}/cluster"
TEXT = "".join(f"la frase número {i}\n" for i in range(32)).encode()
CLUSTERS = ("cluster-a", "cluster-b")


@dataclass
class World:
    """Two clusters with worker credentials; Alice's discoverable text and Bob's request."""

    client: TestClient
    platform: Platform
    alice: Account
    bob: Account
    text: str
    request: str
    credentials: dict[str, str] = field(default_factory=dict)

    def workspace(self, user: Account) -> str:
        answer = self.client.get(f"{API}/workspaces", headers=user.headers)
        return str(answer.json()["items"][0]["id"])

    def act(self, who: Account, verb: str, body: dict | None = None):  # type: ignore[no-untyped-def]
        return self.client.post(
            f"{API}/access-requests/{self.request}/{verb}", json=body, headers=who.headers
        )

    def submit(self, placement: dict[str, str], inputs: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
        kind = "electra_pretrain" if "generator" in placement else "abnet_finetune"
        return self.client.post(
            f"{API}/workspaces/{self.workspace(self.bob)}/jobs",
            json={
                "kind": kind,
                "config": {"steps": 3} if kind == "electra_pretrain" else {},
                "inputs": inputs or {"text": self.text},
                "placement": placement,
            },
            headers=self.bob.headers,
        )

    def role(self, job_id: str, role: str, cluster: str, what: str, **kwargs: object):  # type: ignore[no-untyped-def]
        token = kwargs.pop("token", None)
        headers = {"X-Nebula-Worker": self.credentials[cluster]}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.request(
            str(kwargs.pop("method", "POST")),
            f"{CLUSTER_API}/jobs/{job_id}/roles/{role}/{what}",
            headers=headers,
            **kwargs,  # type: ignore[arg-type]
        )

    def claim(self, job_id: str, role: str, cluster: str):  # type: ignore[no-untyped-def]
        return self.role(job_id, role, cluster, "claim", json={"attempt": 1, "worker": f"t:{role}"})

    def set_clusters_behind_the_api(self, clusters: list[str]) -> None:
        """Narrow the grant in the database: what a narrowing whose stop was missed leaves."""
        with self.platform.factory() as db:
            row = db.get(AccessRequest, self.request)
            assert row is not None
            row.clusters = clusters
            db.commit()


@pytest.fixture
def world(client: TestClient, platform: Platform, settings: Settings) -> World:
    register_clusters(platform.factory, settings, *CLUSTERS)
    admin = platform.user(Role.admin)
    alice, bob = platform.user(), platform.user()
    built = World(client, platform, alice, bob, "", "")
    uploaded = client.post(
        f"{API}/workspaces/{built.workspace(alice)}/datasets",
        data={"name": "t.txt", "kind": "text", "discoverable": "true"},
        files={"file": ("t.txt", TEXT)},
        headers=alice.headers,
    )
    assert uploaded.status_code == 201, uploaded.text
    built.text = uploaded.json()["id"]
    asked = client.post(
        f"{API}/access-requests",
        json={"dataset_id": built.text, "purpose": "pre-training"},
        headers=bob.headers,
    )
    assert asked.status_code == 201, asked.text
    built.request = asked.json()["id"]
    listed = client.get(f"{API}/clusters", headers=admin.headers).json()["items"]
    for cluster in listed:
        made = client.post(
            f"{API}/clusters/{cluster['id']}/worker-credentials", headers=admin.headers
        )
        assert made.status_code == 201, made.text
        built.credentials[cluster["name"]] = made.json()["token"]
    return built


def _refusal(world: World, cluster: str) -> str:
    return (
        f"access grant {world.request} to dataset {world.text} does not allow cluster {cluster!r}"
    )


def _job(world: World, job_id: str) -> dict:
    answer = world.client.get(f"{API}/jobs/{job_id}", headers=world.bob.headers)
    assert answer.status_code == 200, answer.text
    body: dict = answer.json()
    return body


def test_approval_for_cluster_a_refuses_a_discriminator_on_cluster_b_at_submit(
    world: World,
) -> None:
    approved = world.act(world.alice, "approve", {"clusters": ["cluster-a"]})
    assert approved.status_code == 200, approved.text
    assert approved.json()["clusters"] == ["cluster-a"]
    # both sides see the set
    for who in (world.alice, world.bob):
        shown = world.client.get(f"{API}/access-requests/{world.request}", headers=who.headers)
        assert shown.json()["clusters"] == ["cluster-a"]
    # the grantee's dataset answer says where its jobs may send it (the owner's: anywhere)
    granted = world.client.get(f"{API}/datasets/{world.text}", headers=world.bob.headers).json()
    assert granted["allowed_clusters"] == ["cluster-a"]
    owned = world.client.get(f"{API}/datasets/{world.text}", headers=world.alice.headers).json()
    assert owned["allowed_clusters"] == "any"

    refused = world.submit({"generator": "cluster-a", "discriminator": "cluster-b"})
    assert refused.status_code == 403
    assert refused.json()["detail"] == _refusal(world, "cluster-b")
    with world.platform.factory() as db:
        assert db.scalar(select(Job.id)) is None  # nothing written
        denial = db.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "job.submit", AuditEvent.outcome == "denied"
            )
        )
    assert denial is not None and denial.subject_id == world.request

    # both roles where the grant allows: accepted, and the job page names the grant
    accepted = world.submit({"generator": "cluster-a", "discriminator": "cluster-a"})
    assert accepted.status_code == 202, accepted.text
    table = _job(world, accepted.json()["id"])["residency"]
    assert table == [
        {
            "cluster": "cluster-a",
            "roles": ["generator", "discriminator"],
            "allowed": True,
            "grants": [
                {
                    "grant_id": world.request,
                    "input": "text",
                    "dataset_id": world.text,
                    "clusters": ["cluster-a"],
                }
            ],
        }
    ]


@pytest.mark.parametrize("body", [None, {}, {"clusters": "any"}])
def test_an_any_grant_keeps_todays_behaviour(world: World, body: dict | None) -> None:
    approved = world.act(world.alice, "approve", body)
    assert approved.status_code == 200, approved.text
    assert approved.json()["clusters"] == "any"
    accepted = world.submit({"generator": "cluster-a", "discriminator": "cluster-b"})
    assert accepted.status_code == 202, accepted.text
    job_id = accepted.json()["id"]
    for role, cluster in (("generator", "cluster-a"), ("discriminator", "cluster-b")):
        claimed = world.claim(job_id, role, cluster)
        assert claimed.status_code == 200, claimed.text
        read = world.role(
            job_id, role, cluster, "inputs/text", method="GET", token=claimed.json()["token"]
        )
        assert read.status_code == 200 and read.content == TEXT
    table = _job(world, job_id)["residency"]
    assert [(row["cluster"], row["allowed"]) for row in table] == [
        ("cluster-a", True),
        ("cluster-b", True),
    ]


def test_an_approval_naming_no_clusters_takes_the_datasets_default_shown_before(
    world: World,
) -> None:
    pending = world.client.get(f"{API}/access-requests/{world.request}", headers=world.bob.headers)
    assert pending.json()["clusters"] is None
    assert pending.json()["dataset_default_clusters"] == "any"

    # only the owner sets the default; an unknown name is refused and changes nothing
    path = f"{API}/datasets/{world.text}"
    assert (
        world.client.patch(
            path, json={"default_clusters": ["cluster-b"]}, headers=world.bob.headers
        ).status_code
        == 404
    )
    unknown = world.client.patch(
        path, json={"default_clusters": ["cluster-z"]}, headers=world.alice.headers
    )
    assert unknown.status_code == 422 and "'cluster-z'" in unknown.json()["detail"]
    assert world.client.get(path, headers=world.alice.headers).json()["default_clusters"] == "any"
    set_default = world.client.patch(
        path, json={"default_clusters": ["cluster-b"]}, headers=world.alice.headers
    )
    assert set_default.status_code == 200 and set_default.json()["default_clusters"] == [
        "cluster-b"
    ]

    # the requester sees it before approval: on the request and in the catalog
    incoming = world.client.get(
        f"{API}/access-requests?direction=outgoing", headers=world.bob.headers
    ).json()["items"]
    assert incoming[0]["dataset_default_clusters"] == ["cluster-b"]
    catalog = world.client.get(f"{API}/catalog", headers=world.bob.headers).json()["items"]
    assert [d["default_clusters"] for d in catalog if d["id"] == world.text] == [["cluster-b"]]

    approved = world.act(world.alice, "approve")
    assert approved.status_code == 200 and approved.json()["clusters"] == ["cluster-b"]
    refused = world.submit({"generator": "cluster-a", "discriminator": "cluster-b"})
    assert refused.status_code == 403 and refused.json()["detail"] == _refusal(world, "cluster-a")
    with world.platform.factory() as db:
        update = db.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "dataset.update", AuditEvent.subject_id == world.text
            )
        )
        approval = db.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "access.approve", AuditEvent.subject_id == world.request
            )
        )
    assert update is not None and update.details == {"default_clusters": ["cluster-b"]}
    assert approval is not None and approval.details["clusters"] == ["cluster-b"]


def test_bad_cluster_sets_are_refused_and_change_nothing(world: World) -> None:
    unknown = world.act(world.alice, "approve", {"clusters": ["cluster-a", "nowhere"]})
    assert unknown.status_code == 422 and "'nowhere'" in unknown.json()["detail"]
    empty = world.act(world.alice, "approve", {"clusters": []})
    assert empty.status_code == 422 and "revoke" in empty.json()["detail"]
    assert world.act(world.alice, "approve", {"clusters": "all"}).status_code == 422
    shown = world.client.get(f"{API}/access-requests/{world.request}", headers=world.bob.headers)
    assert shown.json()["status"] == "pending" and shown.json()["clusters"] is None
    # a pending request cannot be narrowed
    pending = world.act(world.alice, "narrow", {"clusters": ["cluster-a"]})
    assert pending.status_code == 409, pending.text

    assert world.act(world.alice, "approve", {"clusters": ["cluster-a"]}).status_code == 200
    # only the owner narrows: the requester 403, anyone else 404
    assert world.act(world.bob, "narrow", {"clusters": ["cluster-a"]}).status_code == 403
    stranger = world.platform.user()
    assert world.act(stranger, "narrow", {"clusters": ["cluster-a"]}).status_code == 404
    # narrowing never widens, never empties, never names an unknown cluster
    wider = world.act(world.alice, "narrow", {"clusters": ["cluster-a", "cluster-b"]})
    assert wider.status_code == 422 and "'cluster-b'" in wider.json()["detail"]
    assert world.act(world.alice, "narrow", {"clusters": []}).status_code == 422
    assert world.act(world.alice, "narrow", {"clusters": ["nowhere"]}).status_code == 422
    assert world.act(world.alice, "narrow", {}).status_code == 422
    shown = world.client.get(f"{API}/access-requests/{world.request}", headers=world.bob.headers)
    assert shown.json()["clusters"] == ["cluster-a"]
    with world.platform.factory() as db:
        rows = db.execute(
            select(AuditEvent.action, AuditEvent.outcome, AuditEvent.actor_id)
            .where(AuditEvent.subject_id == world.request, AuditEvent.action == "access.narrow")
            .order_by(AuditEvent.seq)
        ).all()
    assert [tuple(r) for r in rows] == [
        ("access.narrow", "denied", world.bob.id),
        ("access.narrow", "denied", stranger.id),
    ]


def test_narrowing_mid_job_fails_the_role_on_the_removed_cluster_naming_the_grant(
    world: World,
) -> None:
    approved = world.act(world.alice, "approve", {"clusters": ["cluster-a", "cluster-b"]})
    assert approved.json()["clusters"] == ["cluster-a", "cluster-b"]
    job_id = world.submit({"generator": "cluster-a", "discriminator": "cluster-b"}).json()["id"]
    tokens = {
        role: world.claim(job_id, role, cluster).json()["token"]
        for role, cluster in (("generator", "cluster-a"), ("discriminator", "cluster-b"))
    }
    assert _job(world, job_id)["status"] == "running"

    narrowed = world.act(world.alice, "narrow", {"clusters": ["cluster-a"]})
    assert narrowed.status_code == 200 and narrowed.json()["clusters"] == ["cluster-a"]
    job = _job(world, job_id)
    assert job["status"] == "failed"
    assert job["error"] == (
        f"roles discriminator on cluster 'cluster-b' stopped: {_refusal(world, 'cluster-b')}"
    )
    # the discriminator hears it at its next heartbeat; its input is refused
    beat = world.role(
        job_id, "discriminator", "cluster-b", "heartbeat", token=tokens["discriminator"]
    )
    assert beat.status_code == 409
    with world.platform.factory() as db:
        events = {
            e.action: e
            for e in db.scalars(
                select(AuditEvent).where(
                    AuditEvent.action.in_(("access.narrow", "job.fail")),
                    AuditEvent.outcome == "success",
                )
            )
        }
    assert events["access.narrow"].details["clusters_before"] == ["cluster-a", "cluster-b"]
    assert events["access.narrow"].details["clusters"] == ["cluster-a"]
    assert events["job.fail"].details == {
        "reason": "grant_excludes_cluster",
        "access_request_id": world.request,
        "dataset_id": world.text,
        "cluster": "cluster-b",
        "roles": ["discriminator"],
    }


def test_a_claim_and_an_input_read_on_a_cluster_the_grant_no_longer_allows_are_refused(
    world: World, settings: Settings
) -> None:
    world.act(world.alice, "approve", {"clusters": "any"})
    first = world.submit({"generator": "cluster-a", "discriminator": "cluster-b"}).json()["id"]
    second = world.submit({"generator": "cluster-a", "discriminator": "cluster-b"}).json()["id"]
    token = world.claim(second, "discriminator", "cluster-b").json()["token"]
    # narrowed behind the API: the stop in the narrowing call never ran
    world.set_clusters_behind_the_api(["cluster-a"])

    claimed = world.claim(first, "discriminator", "cluster-b")
    assert claimed.status_code == 403 and claimed.json()["detail"] == _refusal(world, "cluster-b")
    assert _job(world, first)["status"] == "failed"
    assert world.request in _job(world, first)["error"]

    read = world.role(
        second, "discriminator", "cluster-b", "inputs/text", method="GET", token=token
    )
    assert read.status_code == 403 and read.json()["detail"] == _refusal(world, "cluster-b")
    assert _job(world, second)["status"] == "failed"

    # and the reaper's pass catches a job nobody called for
    third_world = world.submit({"generator": "cluster-a", "discriminator": "cluster-a"})
    assert third_world.status_code == 202
    with world.platform.factory() as db:
        row = db.get(AccessRequest, world.request)
        assert row is not None
        row.clusters = ["cluster-b"]
        db.commit()
        dispatch.reap_once(db, settings=settings)
        job = db.get(Job, third_world.json()["id"])
        assert job is not None and job.status == JobStatus.failed
        assert job.error is not None and "'cluster-a'" in job.error


def _model() -> bytes:
    return save_safetensors(
        {"w": np.arange(16, dtype=np.float32).reshape(4, 4)}, metadata={"nebula": "test"}
    )


def test_a_derived_model_goes_only_where_its_sources_grant_allows(world: World) -> None:
    world.act(world.alice, "approve", {"clusters": ["cluster-a", "cluster-b"]})
    job_id = world.submit({"generator": "cluster-a", "discriminator": "cluster-b"}).json()["id"]
    tokens = {
        role: world.claim(job_id, role, cluster).json()["token"]
        for role, cluster in (("generator", "cluster-a"), ("discriminator", "cluster-b"))
    }
    stored = world.role(
        job_id,
        "discriminator",
        "cluster-b",
        "artifact",
        method="PUT",
        content=_model(),
        token=tokens["discriminator"],
    )
    assert stored.status_code == 201, stored.text
    model = stored.json()["dataset_id"]
    for role, cluster in (("generator", "cluster-a"), ("discriminator", "cluster-b")):
        finished = world.role(
            job_id, role, cluster, "finish", json={"outcome": "succeeded"}, token=tokens[role]
        )
        assert finished.status_code == 200, finished.text
    assert _job(world, job_id)["status"] == "succeeded"
    shown = world.client.get(f"{API}/datasets/{model}", headers=world.bob.headers).json()
    assert shown["allowed_clusters"] == ["cluster-a", "cluster-b"]

    assert world.act(world.alice, "narrow", {"clusters": ["cluster-a"]}).status_code == 200
    shown = world.client.get(f"{API}/datasets/{model}", headers=world.bob.headers).json()
    assert shown["allowed_clusters"] == ["cluster-a"]

    pairs = world.client.post(
        f"{API}/workspaces/{world.workspace(world.bob)}/datasets",
        data={"name": "p.tsv", "kind": "parallel"},
        files={"file": ("p.tsv", b"uno\tone\ndos\ttwo\n")},
        headers=world.bob.headers,
    ).json()["id"]
    inputs = {"parallel": pairs, "source_model": model, "target_model": model}
    refused = world.submit({"encoder": "cluster-a", "decoder": "cluster-b"}, inputs)
    assert refused.status_code == 403
    assert refused.json()["detail"] == _refusal(world, "cluster-b")
    # Bob's own text alone goes anywhere
    own = world.client.post(
        f"{API}/workspaces/{world.workspace(world.bob)}/datasets",
        data={"name": "mine.txt", "kind": "text"},
        files={"file": ("mine.txt", TEXT)},
        headers=world.bob.headers,
    ).json()["id"]
    accepted = world.submit({"generator": "cluster-b", "discriminator": "cluster-b"}, {"text": own})
    assert accepted.status_code == 202, accepted.text
    assert _job(world, accepted.json()["id"])["residency"][0]["grants"] == []

"""A compromised cluster carries text out through the report channel (issue 27, finding 4).

A role's finish report, its error text and its metric names all reach the job's owner
without a release. Reports are numbers under the kind's metric names only, errors a code
and a short printable message, and a role finishes, and stores its artifact, once per
attempt: a second answers 409, and a repeated artifact PUT takes no more quota.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save as save_safetensors
from sqlalchemy import select

from app.accounts.models import Role
from app.audit.models import AuditEvent
from app.jobs.models import JobArtifact, JobMetric
from app.settings import Settings
from app.workspaces.models import Workspace
from support.clusters import register_clusters
from support.platforms import Account, Platform

API = "/api/v1"
CLUSTER_API = f"{API}/cluster"
CLUSTER_OF = {"generator": "cluster-a", "discriminator": "cluster-b"}
TEXT = "".join(f"a private sentence number {i}\n" for i in range(64)).encode()


class Roles:
    """Alice's ELECTRA job, with both roles claimed as their workers would claim them."""

    def __init__(self, client: TestClient, platform: Platform, settings: Settings) -> None:
        register_clusters(platform.factory, settings, *CLUSTER_OF.values())
        admin, self.alice = platform.user(Role.admin), platform.user()
        self.client, self.platform = client, platform
        self.credentials = {name: self._credential(admin, name) for name in CLUSTER_OF.values()}
        self.workspace = str(
            client.get(f"{API}/workspaces", headers=self.alice.headers).json()["items"][0]["id"]
        )
        upload = client.post(
            f"{API}/workspaces/{self.workspace}/datasets",
            data={"name": "t", "kind": "text"},
            files={"file": ("t", TEXT)},
            headers=self.alice.headers,
        )
        assert upload.status_code == 201, upload.text
        job = client.post(
            f"{API}/workspaces/{self.workspace}/jobs",
            json={
                "kind": "electra_pretrain",
                "config": {"preset": "tiny", "steps": 5},
                "inputs": {"text": upload.json()["id"]},
                "placement": CLUSTER_OF,
            },
            headers=self.alice.headers,
        )
        assert job.status_code == 202, job.text
        self.job_id = str(job.json()["id"])
        self.tokens = {role: self._claim(role) for role in CLUSTER_OF}

    def _credential(self, admin: Account, cluster: str) -> str:
        clusters = self.client.get(f"{API}/clusters", headers=admin.headers).json()["items"]
        cluster_id = next(c["id"] for c in clusters if c["name"] == cluster)
        answer = self.client.post(
            f"{API}/clusters/{cluster_id}/worker-credentials", headers=admin.headers
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["token"])

    def _claim(self, role: str) -> str:
        answer = self.client.post(
            f"{CLUSTER_API}/jobs/{self.job_id}/roles/{role}/claim",
            json={"attempt": 1, "worker": f"test:{role}"},
            headers={"X-Nebula-Worker": self.credentials[CLUSTER_OF[role]]},
        )
        assert answer.status_code == 200, answer.text
        return str(answer.json()["token"])

    def call(self, method: str, role: str, what: str, **kwargs: object) -> tuple[int, dict]:
        answer = self.client.request(
            method,
            f"{CLUSTER_API}/jobs/{self.job_id}/roles/{role}/{what}",
            headers={
                "X-Nebula-Worker": self.credentials[CLUSTER_OF[role]],
                "Authorization": f"Bearer {self.tokens[role]}",
            },
            **kwargs,  # type: ignore[arg-type]
        )
        return answer.status_code, answer.json()

    def artifacts(self) -> list[JobArtifact]:
        with self.platform.factory() as db:
            return list(db.scalars(select(JobArtifact).where(JobArtifact.job_id == self.job_id)))


@pytest.fixture
def roles(client: TestClient, platform: Platform, settings: Settings) -> Roles:
    return Roles(client, platform, settings)


LEAK = "a private sentence number 7"


@pytest.mark.parametrize(
    "body",
    [
        {"outcome": "succeeded", "report": {"note": LEAK}},  # free text
        {"outcome": "succeeded", "report": {"final_metrics": {"rtd_loss": LEAK}}},
        # a name that matches the pattern but is no metric of the kind
        {"outcome": "succeeded", "report": {"final_metrics": {"a_private_sentence_7": 1.0}}},
        {"outcome": "succeeded", "report": {"extra": {"number_7_of_the_corpus": 1.0}}},
        {"outcome": "failed", "error_code": "training", "error": LEAK * 20},  # too long
        {"outcome": "failed", "error_code": "training", "error": "one\nline"},
        {"outcome": "failed", "error_code": "not-a-code", "error": "x"},
    ],
)
def test_a_free_text_report_or_error_is_refused_and_stores_nothing(
    roles: Roles, body: dict
) -> None:
    status, answer = roles.call("POST", "generator", "finish", json=body)
    assert status == 422, answer
    assert LEAK not in json.dumps(answer)
    assert roles.artifacts() == []
    # the role may still finish properly: the refusal changed nothing
    good = {"outcome": "succeeded", "report": {"last_step": 5, "final_metrics": {"mlm_loss": 2}}}
    assert roles.call("POST", "generator", "finish", json=good)[0] == 200


def test_metric_names_outside_the_kinds_table_are_refused(roles: Roles) -> None:
    batch = {"seq": 1, "points": [{"step": 1, "values": {"private_sentence_7": 1.0}}]}
    status, answer = roles.call("POST", "discriminator", "metrics", json=batch)
    assert status == 422 and "is not one that electra_pretrain reports" in answer["detail"]
    with roles.platform.factory() as db:
        assert db.scalars(select(JobMetric)).all() == []
    batch["points"] = [{"step": 1, "values": {"rtd_loss": 0.5}}]
    assert roles.call("POST", "discriminator", "metrics", json=batch)[0] == 200


def test_a_second_finish_of_the_same_attempt_answers_409(roles: Roles) -> None:
    report = {"last_step": 5, "final_metrics": {"mlm_loss": 2.5}, "extra": {"mode_shared": 1}}
    first = roles.call(
        "POST", "generator", "finish", json={"outcome": "succeeded", "report": report}
    )
    assert first == (200, {"job_status": "running"})
    for again in ({"outcome": "succeeded", "report": report}, {"outcome": "stopped"}):
        status, answer = roles.call("POST", "generator", "finish", json=again)
        assert status == 409 and "already finished attempt 1" in answer["detail"], answer
    [stored] = roles.artifacts()
    assert stored.kind == "report" and stored.details["final_metrics"] == {"mlm_loss": 2.5}
    assert set(stored.details) == {
        "role",
        "attempt",
        "start_step",
        "last_step",
        "final_metrics",
        "extra",
    }


def test_a_repeated_artifact_put_is_refused_and_takes_no_quota(roles: Roles) -> None:
    model = save_safetensors({"w": np.zeros((4, 4), dtype=np.float32)}, metadata={"nebula": "t"})
    assert roles.call("PUT", "discriminator", "artifact", content=model)[0] == 201
    with roles.platform.factory() as db:
        used = db.get(Workspace, roles.workspace).storage_bytes_used  # type: ignore[union-attr]
    for _ in range(3):
        status, answer = roles.call("PUT", "discriminator", "artifact", content=model)
        assert status == 409 and "already stored its artifact" in answer["detail"], answer
    with roles.platform.factory() as db:
        assert db.get(Workspace, roles.workspace).storage_bytes_used == used  # type: ignore[union-attr]
    assert [a.kind for a in roles.artifacts()] == ["model"]


def test_a_failure_is_a_code_and_a_short_message(roles: Roles) -> None:
    body = {"outcome": "failed", "error_code": "training", "error": "ValueError"}
    status, answer = roles.call("POST", "discriminator", "finish", json=body)
    assert status == 200, answer
    job = roles.client.get(f"{API}/jobs/{roles.job_id}", headers=roles.alice.headers).json()
    # the attempt restarts; the reason names the code and the message, nothing more
    assert job["attempt"] == 2 and job["error"] is None
    with roles.platform.factory() as db:
        restart = db.scalars(select(AuditEvent).where(AuditEvent.action == "job.restart")).one()
    assert restart.details["reason"] == "role discriminator failed: training: ValueError"

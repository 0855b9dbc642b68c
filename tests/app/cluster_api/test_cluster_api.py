"""The cluster API refuses what it must: credentials, tokens, fenced attempts, lost grants.

A job is submitted through the public API (no workers run); the tests then speak for its
roles the way a worker does, with a worker credential and the job token of a claim.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import httpx
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient
from safetensors.numpy import save as save_safetensors
from sqlalchemy import func, select

from app.accounts.models import Role
from app.audit.models import AuditEvent
from app.db import utcnow
from app.grants.models import AccessRequest
from app.jobs import attempts
from app.jobs.models import Job, JobMetric, JobStatus
from app.pki import service as pki
from app.settings import Settings
from contract.jobtoken import sign_job_token
from support.clusters import register_clusters
from support.platforms import Account, Platform
from support.servers import LiveServer
from workers.control_plane import ClusterClient, RoleSession
from workers.ports import free_port
from workers.runner import RoleHooks

API = "/api/v1"
CLUSTER_API = f"{API}/cluster"
TEXT = "".join(f"la frase número {i} del corpus\n" for i in range(64)).encode()


@dataclass
class Site:
    """A platform with two clusters, their worker credentials, alice's job and its claims."""

    client: TestClient
    platform: Platform
    settings: Settings
    admin: Account
    alice: Account
    credentials: dict[str, str]
    job_id: str
    tokens: dict[str, str]

    def headers(self, cluster: str, token: str | None = None) -> dict[str, str]:
        headers = {"X-Nebula-Worker": self.credentials[cluster]}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def call(
        self,
        method: str,
        role: str,
        what: str,
        *,
        cluster: str | None = None,
        token: str | None = None,
        job_id: str | None = None,
        **kwargs: object,
    ) -> tuple[int, dict]:
        cluster = cluster or CLUSTER_OF[role]
        answer = self.client.request(
            method,
            f"{CLUSTER_API}/jobs/{job_id or self.job_id}/roles/{role}/{what}",
            headers=self.headers(cluster, token if token is not None else self.tokens[role]),
            **kwargs,  # type: ignore[arg-type]
        )
        body = answer.json() if answer.headers.get("content-type") == "application/json" else {}
        return answer.status_code, body


CLUSTER_OF = {"generator": "cluster-a", "discriminator": "cluster-b"}


def _workspace(client: TestClient, user: Account) -> str:
    return str(client.get(f"{API}/workspaces", headers=user.headers).json()["items"][0]["id"])


def _upload(client: TestClient, user: Account, *, discoverable: bool = False) -> str:
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, user)}/datasets",
        data={"name": "t.txt", "kind": "text", "discoverable": json.dumps(discoverable)},
        files={"file": ("t.txt", TEXT)},
        headers=user.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _submit(client: TestClient, user: Account, text: str, **config: object) -> str:
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, user)}/jobs",
        json={
            "kind": "electra_pretrain",
            "config": {"preset": "tiny", "steps": 5, **config},
            "inputs": {"text": text},
            "placement": dict(CLUSTER_OF),
        },
        headers=user.headers,
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


def _credential(client: TestClient, admin: Account, cluster: str) -> tuple[str, str]:
    cluster_id = next(
        c["id"]
        for c in client.get(f"{API}/clusters", headers=admin.headers).json()["items"]
        if c["name"] == cluster
    )
    answer = client.post(f"{API}/clusters/{cluster_id}/worker-credentials", headers=admin.headers)
    assert answer.status_code == 201, answer.text
    return cluster_id, str(answer.json()["token"])


def _claim(site: Site, role: str, attempt: int = 1) -> str:
    answer = site.client.post(
        f"{CLUSTER_API}/jobs/{site.job_id}/roles/{role}/claim",
        json={"attempt": attempt, "worker": f"test:{role}"},
        headers=site.headers(CLUSTER_OF[role]),
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["token"])


def _site(client: TestClient, platform: Platform, settings: Settings, user: Account) -> Site:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")
    admin = platform.user(Role.admin)
    credentials = {name: _credential(client, admin, name)[1] for name in CLUSTER_OF.values()}
    site = Site(client, platform, settings, admin, user, credentials, "", {})
    return site


@pytest.fixture
def site(client: TestClient, platform: Platform, settings: Settings) -> Site:
    alice = platform.user()
    built = _site(client, platform, settings, alice)
    built.job_id = _submit(client, alice, _upload(client, alice))
    built.tokens = {role: _claim(built, role) for role in CLUSTER_OF}
    return built


def _model_file() -> bytes:
    tensors = {"w": np.arange(16, dtype=np.float32).reshape(4, 4)}
    return save_safetensors(tensors, metadata={"nebula": "test"})


def test_a_claimed_role_reads_its_input_decrypted_and_the_use_is_audited(site: Site) -> None:
    answer = site.client.get(
        f"{CLUSTER_API}/jobs/{site.job_id}/roles/generator/inputs/text",
        headers=site.headers("cluster-a", site.tokens["generator"]),
    )
    assert answer.status_code == 200
    assert answer.content == TEXT
    with site.platform.factory() as db:
        uses = db.scalars(
            select(AuditEvent).where(
                AuditEvent.action == "dataset.use", AuditEvent.outcome == "success"
            )
        ).all()
    assert [u.details["job_id"] for u in uses] == [site.job_id]


def test_calls_without_both_credentials_or_with_foreign_tokens_are_refused(site: Site) -> None:
    path = f"{CLUSTER_API}/jobs/{site.job_id}/roles/generator/heartbeat"
    token = site.tokens["generator"]
    assert site.client.post(path).status_code == 401  # nothing
    assert (
        site.client.post(
            path, headers={"X-Nebula-Worker": site.credentials["cluster-a"]}
        ).status_code
        == 401
    )
    assert site.client.post(path, headers={"Authorization": f"Bearer {token}"}).status_code == 401
    bad_credential = {"X-Nebula-Worker": "nbw_not-a-credential", "Authorization": f"Bearer {token}"}
    assert site.client.post(path, headers=bad_credential).status_code == 401

    forged = sign_job_token(
        Ed25519PrivateKey.generate(),
        job_id=f"{site.job_id}.1",
        role="generator",
        cluster="cluster-a",
        expires_at=2**40,
    )
    assert site.call("POST", "generator", "heartbeat", token=forged)[0] == 401
    with site.platform.factory() as db:
        expired = pki.job_token(
            db,
            settings=site.settings,
            job_id=f"{site.job_id}.1",
            role="generator",
            cluster="cluster-a",
            placement={},
            ttl=timedelta(seconds=-1),
        )
    status, body = site.call("POST", "generator", "heartbeat", token=expired)
    assert status == 401 and "expired" in body["detail"]

    # the generator's token on the discriminator's resources, or from the other cluster
    assert (
        site.call("POST", "discriminator", "heartbeat", token=token, cluster="cluster-b")[0] == 403
    )
    assert site.call("POST", "generator", "heartbeat", cluster="cluster-b")[0] == 403
    # a token of job X on job Y
    other_job = _submit(site.client, site.alice, _upload(site.client, site.alice))
    status, body = site.call("POST", "generator", "heartbeat", job_id=other_job)
    assert status == 403 and "another job" in body["detail"]
    assert (
        site.call("POST", "generator", "metrics", job_id=other_job, json={"seq": 1, "points": []})[
            0
        ]
        == 403
    )
    assert (
        site.client.get(
            f"{CLUSTER_API}/jobs/{other_job}/roles/generator/inputs/text",
            headers=site.headers("cluster-a", token),
        ).status_code
        == 403
    )


def test_a_role_is_claimed_only_by_its_own_cluster_and_only_for_the_live_attempt(
    site: Site,
) -> None:
    path = f"{CLUSTER_API}/jobs/{site.job_id}/roles/generator/claim"
    wrong_cluster = site.client.post(
        path, json={"attempt": 1, "worker": "w"}, headers=site.headers("cluster-b")
    )
    assert wrong_cluster.status_code == 404
    stale = site.client.post(
        path, json={"attempt": 2, "worker": "w"}, headers=site.headers("cluster-a")
    )
    assert stale.status_code == 409
    unknown_role = site.client.post(
        f"{CLUSTER_API}/jobs/{site.job_id}/roles/trainer/claim",
        json={"attempt": 1, "worker": "w"},
        headers=site.headers("cluster-a"),
    )
    assert unknown_role.status_code == 422


def test_heartbeat_renews_the_token_and_metric_batches_apply_once(site: Site) -> None:
    status, body = site.call("POST", "discriminator", "heartbeat")
    assert status == 200 and body["alive"] is True
    renewed = body["token"]
    batch = {"seq": 1, "points": [{"step": 3, "values": {"rtd_loss": 0.5}}], "checkpoint_step": 2}
    assert site.call("POST", "discriminator", "metrics", token=renewed, json=batch) == (
        200,
        {"applied": True},
    )
    assert site.call("POST", "discriminator", "metrics", json=batch) == (200, {"applied": False})
    with site.platform.factory() as db:
        points = db.scalar(select(func.count()).select_from(JobMetric))
        job = db.get(Job, site.job_id)
    assert points == 1
    assert job is not None and job.step == 3 and job.metrics == {"discriminator.rtd_loss": 0.5}


@pytest.mark.parametrize(
    "body",
    [
        {"seq": 1, "points": [{"step": 1, "values": {"loss": math.nan}}]},
        {"seq": 1, "points": [{"step": 1, "values": {"loss": math.inf}}]},
        {"seq": 0, "points": []},
        {"seq": 1, "points": [{"step": -1, "values": {}}]},
        {"seq": 1, "points": [{"step": 1, "values": {"bad name!": 1.0}}]},
        {"seq": 1, "points": [{"step": i, "values": {}} for i in range(10_001)]},
        {"seq": 1, "points": [], "extra": True},
    ],
    ids=["nan", "inf", "seq-0", "negative-step", "bad-name", "too-many-points", "unknown-field"],
)
def test_bad_metric_batches_are_refused_and_write_nothing(site: Site, body: dict) -> None:
    # NaN is not JSON: send it the way a careless client would
    raw = json.dumps(body, allow_nan=True)
    assert _raw_post(site, "generator", "metrics", raw)[0] == 422
    with site.platform.factory() as db:
        assert db.scalar(select(func.count()).select_from(JobMetric)) == 0


def _raw_post(site: Site, role: str, what: str, raw: str | bytes) -> tuple[int, dict]:
    answer = site.client.post(
        f"{CLUSTER_API}/jobs/{site.job_id}/roles/{role}/{what}",
        content=raw,
        headers={
            **site.headers(CLUSTER_OF[role], site.tokens[role]),
            "content-type": "application/json",
        },
    )
    return answer.status_code, answer.json()


def test_a_million_points_is_too_large_and_malformed_json_is_422(site: Site) -> None:
    points = ",".join('{"step":1,"values":{"l":1}}' for _ in range(1_000_000))
    status, _ = _raw_post(site, "generator", "metrics", f'{{"seq":1,"points":[{points}]}}')
    assert status == 413
    assert _raw_post(site, "generator", "metrics", b"{not json")[0] == 422


def test_a_fenced_attempt_is_refused_everywhere(site: Site) -> None:
    with site.platform.factory() as db:
        job = db.get(Job, site.job_id)
        assert job is not None
        attempts.restart_attempt(db, job=job, reason="test")
        db.commit()
    for method, what, kwargs in (
        ("POST", "heartbeat", {}),
        ("POST", "metrics", {"json": {"seq": 1, "points": []}}),
        ("GET", "inputs/text", {}),
        ("PUT", "artifact", {"content": _model_file()}),
    ):
        status, body = site.call(method, "discriminator", what, **kwargs)
        assert status == 409, (what, status, body)
        assert "no longer live" in body["detail"]
    with site.platform.factory() as db:
        job = db.get(Job, site.job_id)
        assert job is not None and job.attempt == 2
    # the new attempt is claimed with a new token; the old one stays refused
    fresh = _claim(site, "discriminator", attempt=2)
    assert site.call("POST", "discriminator", "heartbeat", token=fresh)[0] == 200
    assert site.call("POST", "discriminator", "heartbeat")[0] == 409


def test_outputs_are_encrypted_into_the_owners_workspace_and_finish_reports(site: Site) -> None:
    model = _model_file()
    # a file that is no model is refused and stores nothing
    assert site.call("PUT", "discriminator", "artifact", content=b"not a model")[0] == 422
    status, body = site.call("PUT", "discriminator", "artifact", content=model)
    assert status == 201, body
    dataset = site.client.get(f"{API}/datasets/{body['dataset_id']}", headers=site.alice.headers)
    assert dataset.status_code == 200 and dataset.json()["size_bytes"] == len(model)
    stored = site.client.get(
        f"{API}/datasets/{body['dataset_id']}/content", headers=site.alice.headers
    )
    assert stored.content == model
    # the generator stores nothing
    assert site.call("PUT", "generator", "artifact", content=model)[0] == 404
    # one artifact per role and attempt (tests/security/test_report_channel.py)
    assert site.call("PUT", "discriminator", "artifact", content=model)[0] == 409

    report = {"last_step": 5}
    assert site.call(
        "POST", "generator", "finish", json={"outcome": "succeeded", "report": report}
    ) == (
        200,
        {"job_status": "running"},
    )
    status, body = site.call("POST", "discriminator", "finish", json={"outcome": "succeeded"})
    assert (status, body["job_status"]) == (200, "succeeded")
    artifacts = site.client.get(
        f"{API}/jobs/{site.job_id}/artifacts", headers=site.alice.headers
    ).json()
    assert sorted(a["kind"] for a in artifacts["items"]) == ["model", "report", "report"]
    # the job ended: its tokens are dead
    assert site.call("POST", "discriminator", "heartbeat")[0] == 409


def test_an_output_over_the_owners_quota_is_413(site: Site) -> None:
    workspace = _workspace(site.client, site.alice)
    site.client.patch(
        f"{API}/workspaces/{workspace}/quota",
        json={"storage_bytes_limit": len(TEXT) + 100},
        headers=site.admin.headers,
    )
    status, body = site.call("PUT", "discriminator", "artifact", content=_model_file())
    assert status == 413, body
    datasets = site.client.get(f"{API}/workspaces/{workspace}/datasets", headers=site.alice.headers)
    assert datasets.json()["total"] == 1


def _grantee_site(
    client: TestClient, platform: Platform, settings: Settings
) -> tuple[Site, Account, Account, dict]:
    """Bob's claimed job on Alice's text through an approved grant; (site, alice, bob, grant)."""
    alice, bob = platform.user(), platform.user()
    site = _site(client, platform, settings, bob)
    text = _upload(client, alice, discoverable=True)
    request = client.post(
        f"{API}/access-requests", json={"dataset_id": text, "purpose": "t"}, headers=bob.headers
    ).json()
    client.post(f"{API}/access-requests/{request['id']}/approve", json={}, headers=alice.headers)
    site.job_id = _submit(client, bob, text)
    site.tokens = {role: _claim(site, role) for role in CLUSTER_OF}
    return site, alice, bob, request


def test_a_revoked_grant_refuses_the_input_and_fails_the_job_naming_the_grant(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    site, alice, bob, request = _grantee_site(client, platform, settings)
    assert site.call("GET", "generator", "inputs/text")[0] == 200

    client.post(f"{API}/access-requests/{request['id']}/revoke", headers=alice.headers)
    assert site.call("GET", "discriminator", "inputs/text")[0] == 403
    job = client.get(f"{API}/jobs/{site.job_id}", headers=bob.headers).json()
    assert job["status"] == "failed" and request["id"] in job["error"]
    with platform.factory() as db:
        denied = db.scalar(
            select(func.count())
            .select_from(AuditEvent)
            .where(AuditEvent.action == "dataset.use", AuditEvent.outcome == "denied")
        )
    assert denied == 1


def test_an_input_whose_grant_expired_fails_the_running_job(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    site, _alice, _bob, request = _grantee_site(client, platform, settings)
    with platform.factory() as db:
        row = db.get(AccessRequest, request["id"])
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
        db.commit()
    assert site.call("GET", "generator", "inputs/text")[0] == 403
    with platform.factory() as db:
        job = db.get(Job, site.job_id)
    assert job is not None and job.status == JobStatus.failed and request["id"] in (job.error or "")


def test_a_derived_input_whose_source_grant_expired_fails_the_job_naming_that_grant(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    site, _alice, bob, request = _grantee_site(client, platform, settings)
    text = request["dataset_id"]
    status, stored = site.call("PUT", "discriminator", "artifact", content=_model_file())
    assert status == 201, stored
    model = stored["dataset_id"]
    shown = client.get(f"{API}/datasets/{model}", headers=bob.headers).json()
    assert shown["derived_from"] == [text] and shown["release"] == "required"
    for role in CLUSTER_OF:
        site.call("POST", role, "finish", json={"outcome": "succeeded"})

    pairs = client.post(
        f"{API}/workspaces/{_workspace(client, bob)}/datasets",
        data={"name": "p.tsv", "kind": "parallel"},
        files={"file": ("p.tsv", b"uno\tone\ndos\ttwo\n")},
        headers=bob.headers,
    ).json()["id"]
    abnet = client.post(
        f"{API}/workspaces/{_workspace(client, bob)}/jobs",
        json={
            "kind": "abnet_finetune",
            "inputs": {"parallel": pairs, "source_model": model, "target_model": model},
            "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
        },
        headers=bob.headers,
    )
    assert abnet.status_code == 202, abnet.text
    job_id = abnet.json()["id"]
    claimed = client.post(
        f"{CLUSTER_API}/jobs/{job_id}/roles/encoder/claim",
        json={"attempt": 1, "worker": "test:encoder"},
        headers=site.headers("cluster-a"),
    ).json()["token"]
    with platform.factory() as db:
        row = db.get(AccessRequest, request["id"])
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
        db.commit()
    answer = client.get(
        f"{CLUSTER_API}/jobs/{job_id}/roles/encoder/inputs/source_model",
        headers=site.headers("cluster-a", claimed),
    )
    assert answer.status_code == 403 and request["id"] in answer.json()["detail"]
    job = client.get(f"{API}/jobs/{job_id}", headers=bob.headers).json()
    assert job["status"] == "failed" and request["id"] in job["error"]


def test_a_revoked_worker_credential_is_refused_at_the_next_call(site: Site) -> None:
    cluster_id = next(
        c["id"]
        for c in site.client.get(f"{API}/clusters", headers=site.admin.headers).json()["items"]
        if c["name"] == "cluster-a"
    )
    listed = site.client.get(
        f"{API}/clusters/{cluster_id}/worker-credentials", headers=site.admin.headers
    ).json()
    assert listed["total"] == 1 and "token" not in listed["items"][0]
    credential_id = listed["items"][0]["id"]
    assert site.call("POST", "generator", "heartbeat")[0] == 200
    revoked = site.client.delete(
        f"{API}/clusters/{cluster_id}/worker-credentials/{credential_id}",
        headers=site.admin.headers,
    )
    assert revoked.status_code == 204
    status, body = site.call("POST", "generator", "heartbeat")
    assert status == 401 and "worker credential" in body["detail"]
    whoami = site.client.get(f"{CLUSTER_API}/whoami", headers=site.headers("cluster-a"))
    assert whoami.status_code == 401
    assert site.client.get(f"{CLUSTER_API}/whoami", headers=site.headers("cluster-b")).json() == {
        "cluster": "cluster-b"
    }


def test_members_cannot_manage_worker_credentials(site: Site) -> None:
    cluster_id = site.client.get(f"{API}/clusters", headers=site.alice.headers).json()["items"][0][
        "id"
    ]
    path = f"{API}/clusters/{cluster_id}/worker-credentials"
    assert site.client.post(path, headers=site.alice.headers).status_code == 403
    assert site.client.get(path, headers=site.alice.headers).status_code == 403


def test_a_claim_answer_names_only_the_roles_own_inputs(site: Site) -> None:
    answer = site.client.post(
        f"{CLUSTER_API}/jobs/{site.job_id}/roles/generator/claim",
        json={"attempt": 1, "worker": "again"},
        headers=site.headers("cluster-a"),
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["inputs"] == ["text"] and body["peer_role"] == "discriminator"
    assert "secret" not in json.dumps(body).lower()
    # an input the role has no business reading
    assert site.call("GET", "generator", "inputs/parallel")[0] == 404


# ------------------------------------------------------------ the worker's side of the API


def _role_session(site: Site, server_url: str, role: str) -> RoleSession:
    client = ClusterClient(server_url, credential=site.credentials[CLUSTER_OF[role]])
    return client.claim(job_id=site.job_id, role=role, attempt=1, worker="test")


def _wait(check: Callable[[], bool], timeout: float) -> bool:
    tick = threading.Event()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        tick.wait(0.05)
    return check()


@pytest.fixture
def quick_site(client: TestClient, platform: Platform, settings: Settings) -> Site:
    """A site whose roles beat every 0.2 s and give up after 1.5 s without the control plane."""
    fast = settings.model_copy(update={"role_heartbeat_s": 0.2, "heartbeat_timeout_s": 1.5})
    alice = platform.user()
    built = _site(client, platform, fast, alice)
    built.job_id = _submit(client, alice, _upload(client, alice))
    return built


def test_a_worker_cut_off_from_the_control_plane_stops_itself_after_the_grace(
    quick_site: Site,
) -> None:
    with LiveServer(quick_site.settings) as server:
        session = _role_session(quick_site, server.url, "generator")
        assert session.claim.grace_s == 1.5
        hooks = RoleHooks(session)
        try:
            assert _wait(lambda: session.token != session.claim.token, 5)  # beating, renewed
            session.client.http.base_url = httpx.URL(f"http://127.0.0.1:{free_port()}/")
            cut_at = time.monotonic()
            assert not hooks.stopped
            assert _wait(lambda: hooks.stopped, 10)
            assert time.monotonic() - cut_at >= 1.5
        finally:
            hooks.close()
            session.client.close()


def test_metric_batches_sent_during_an_outage_arrive_once_afterwards(quick_site: Site) -> None:
    with LiveServer(quick_site.settings) as server:
        session = _role_session(quick_site, server.url, "discriminator")
        live = session.client.http.base_url
        hooks = RoleHooks(session)
        try:
            hooks.on_metrics(1, {"rtd_loss": 3.0})
            hooks.flush()
            session.client.http.base_url = httpx.URL(f"http://127.0.0.1:{free_port()}/")
            hooks.on_metrics(2, {"rtd_loss": 2.0})
            with pytest.raises(httpx.TransportError):
                hooks.flush()  # kept, not lost
            hooks.on_metrics(3, {"rtd_loss": 1.0})
            session.client.http.base_url = live
        finally:
            hooks.close()  # sends what is left
            session.client.close()
    with quick_site.platform.factory() as db:
        rows = db.execute(select(JobMetric.step, JobMetric.value).order_by(JobMetric.step)).all()
    assert [tuple(r) for r in rows] == [(1, 3.0), (2, 2.0), (3, 1.0)]
    assert not hooks.stopped


# ------------------------------------------------------------------------ cluster health


def _clusters(site: Site) -> dict[str, dict]:
    items = site.client.get(f"{API}/clusters", headers=site.alice.headers).json()["items"]
    return {c["name"]: c for c in items}


def _report(site: Site, cluster: str, kind: str, instance: str, online: bool = True) -> int:
    answer = site.client.post(
        f"{CLUSTER_API}/presence",
        json={"kind": kind, "instance": instance, "version": "0.1.0", "online": online},
        headers=site.headers(cluster),
    )
    return answer.status_code


def test_cluster_health_follows_what_reports_in_and_what_runs(site: Site) -> None:
    # the site's roles were claimed: a job runs on each cluster, nothing reported in yet
    before = _clusters(site)
    assert before["cluster-a"]["running_jobs"] == 1
    assert (before["cluster-a"]["switch_online"], before["cluster-a"]["workers_online"]) == (
        False,
        0,
    )
    assert _report(site, "cluster-a", "switch", "host-a:cluster-a:10") == 200
    assert _report(site, "cluster-a", "worker", "host-a:cluster-a:11") == 200
    assert _report(site, "cluster-a", "worker", "host-a:cluster-a:12") == 200
    assert _report(site, "cluster-a", "worker", "host-a:cluster-a:12") == 200  # again: still one
    online = _clusters(site)["cluster-a"]
    assert (online["switch_online"], online["workers_online"]) == (True, 2)
    assert _clusters(site)["cluster-b"]["workers_online"] == 0

    # a worker that leaves is offline at once; one that falls silent after the timeout
    assert _report(site, "cluster-a", "worker", "host-a:cluster-a:12", online=False) == 200
    assert _clusters(site)["cluster-a"]["workers_online"] == 1
    from app.clusters.models import ClusterPresence

    with site.platform.factory() as db:
        for row in db.scalars(select(ClusterPresence).where(ClusterPresence.kind == "switch")):
            row.last_seen = utcnow() - timedelta(seconds=site.settings.presence_timeout_s + 1)
        db.commit()
    assert _clusters(site)["cluster-a"]["switch_online"] is False

    # cancel the job: nothing runs on either cluster any more
    site.client.post(f"{API}/jobs/{site.job_id}/cancel", headers=site.alice.headers)
    assert all(c["running_jobs"] == 0 for c in _clusters(site).values())


def test_an_admin_sees_which_process_runs_which_role(site: Site) -> None:
    assert _report(site, "cluster-b", "worker", "host-b:cluster-b:20") == 200
    from app.jobs.models import JobRole

    with site.platform.factory() as db:
        row = db.scalar(
            select(JobRole).where(JobRole.job_id == site.job_id, JobRole.role == "discriminator")
        )
        assert row is not None
        row.worker = "host-b:cluster-b:20/21"  # a pool child of that worker
        db.commit()
    cluster_b = _clusters(site)["cluster-b"]["id"]
    listed = site.client.get(f"{API}/clusters/{cluster_b}/presence", headers=site.admin.headers)
    assert listed.status_code == 200
    (worker,) = listed.json()["items"]
    assert worker["instance"] == "host-b:cluster-b:20"
    assert worker["running_roles"] == [f"{site.job_id}/discriminator"]
    assert (
        site.client.get(
            f"{API}/clusters/{cluster_b}/presence", headers=site.alice.headers
        ).status_code
        == 403
    )


def test_presence_reports_need_the_clusters_credential_and_sound_fields(site: Site) -> None:
    answer = site.client.post(
        f"{CLUSTER_API}/presence", json={"kind": "worker", "instance": "x", "version": "1"}
    )
    assert answer.status_code == 401
    for body in (
        {"kind": "database", "instance": "x", "version": "1"},
        {"kind": "worker", "instance": "has space", "version": "1"},
        {"kind": "worker", "instance": "x" * 256, "version": "1"},
    ):
        bad = site.client.post(
            f"{CLUSTER_API}/presence", json=body, headers=site.headers("cluster-a")
        )
        assert bad.status_code == 422


def test_admins_see_running_jobs_across_tenants_without_their_data(site: Site) -> None:
    answer = site.client.get(f"{API}/admin/jobs", headers=site.admin.headers)
    assert answer.status_code == 200
    (job,) = answer.json()["items"]
    assert job["id"] == site.job_id and job["owner_email"] == site.alice.email
    assert job["placement"] == CLUSTER_OF
    assert not {"config", "inputs", "metrics", "error"} & set(job)
    assert site.client.get(f"{API}/admin/jobs", headers=site.alice.headers).status_code == 403


def test_a_cluster_learns_which_of_its_jobs_ended(site: Site) -> None:
    path = f"{CLUSTER_API}/jobs/ended"
    unknown = "00000000-0000-4000-8000-000000000000"
    body = {"job_ids": [site.job_id, unknown]}
    answer = site.client.post(path, json=body, headers=site.headers("cluster-a"))
    assert answer.status_code == 200 and answer.json() == {"ended": [unknown]}
    site.client.post(f"{API}/jobs/{site.job_id}/cancel", headers=site.alice.headers)
    answer = site.client.post(path, json=body, headers=site.headers("cluster-a"))
    assert answer.json() == {"ended": [site.job_id, unknown]}
    assert site.client.post(path, json=body).status_code == 401
    too_many = {"job_ids": [unknown] * 501}
    assert (
        site.client.post(path, json=too_many, headers=site.headers("cluster-a")).status_code == 422
    )


# ------------------------------------------------------------------------------ devices


CUDA_WORKER = {
    "kind": "cuda",
    "name": "NVIDIA H200",
    "count": 8,
    "memory_bytes": 150_000_000_000,
    "runtime": "12.8",
}


def test_workers_report_their_devices_and_the_cluster_shows_them(site: Site) -> None:
    def report(instance: str, device: dict[str, object] | None) -> int:
        body = {"kind": "worker", "instance": instance, "version": "0.1.0", "device": device}
        return site.client.post(
            f"{CLUSTER_API}/presence", json=body, headers=site.headers("cluster-b")
        ).status_code

    assert report("gpu-1:cluster-b:1", CUDA_WORKER) == 200
    assert report("gpu-2:cluster-b:1", CUDA_WORKER) == 200
    assert report("cpu-1:cluster-b:1", {"kind": "cpu", "name": "AMD EPYC", "count": 2}) == 200
    assert _report(site, "cluster-b", "switch", "gw:cluster-b:1") == 200
    shown = _clusters(site)["cluster-b"]["worker_devices"]
    assert shown == [
        {"device": CUDA_WORKER, "workers": 2},
        {
            "device": {
                "kind": "cpu",
                "name": "AMD EPYC",
                "count": 2,
                "memory_bytes": None,
                "runtime": "",
            },
            "workers": 1,
        },
    ]
    assert _clusters(site)["cluster-a"]["worker_devices"] == []
    cluster_b = _clusters(site)["cluster-b"]["id"]
    listed = site.client.get(f"{API}/clusters/{cluster_b}/presence", headers=site.admin.headers)
    devices = {p["instance"]: p["device"] for p in listed.json()["items"]}
    assert devices["gpu-1:cluster-b:1"] == CUDA_WORKER and devices["gw:cluster-b:1"] is None

    # a worker restarted on another device: the newest report wins
    assert report("gpu-2:cluster-b:1", {"kind": "cpu", "name": "AMD EPYC", "count": 2}) == 200
    assert [d["workers"] for d in _clusters(site)["cluster-b"]["worker_devices"]] == [1, 2]
    # a device off the schema is refused and changes nothing
    assert report("gpu-1:cluster-b:1", {"kind": "tpu"}) == 422
    assert report("gpu-1:cluster-b:1", {**CUDA_WORKER, "name": "x\ny"}) == 422
    assert _clusters(site)["cluster-b"]["worker_devices"][0]["device"] == CUDA_WORKER


def _claim_on(
    site: Site, job_id: str, role: str, device: str | None
) -> tuple[int, dict[str, object]]:
    body: dict[str, object] = {"attempt": 1, "worker": f"test:{role}"}
    if device is not None:
        body["device"] = device
    answer = site.client.post(
        f"{CLUSTER_API}/jobs/{job_id}/roles/{role}/claim",
        json=body,
        headers=site.headers(CLUSTER_OF[role]),
    )
    return answer.status_code, answer.json()


def test_a_cpu_worker_asked_for_cuda_is_refused_at_claim_and_the_job_says_why(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    site = _site(client, platform, settings, alice)
    text = _upload(client, alice)
    job_id = _submit(client, alice, text, role_devices={"discriminator": "cuda"})

    # a claim of an attempt that is not the job's live one is refused without failing it:
    # the live attempt may yet land on a CUDA worker
    body = {"attempt": 2, "worker": "test:discriminator", "device": "cpu"}
    stale = site.client.post(
        f"{CLUSTER_API}/jobs/{job_id}/roles/discriminator/claim",
        json=body,
        headers=site.headers("cluster-b"),
    )
    assert stale.status_code == 409
    assert client.get(f"{API}/jobs/{job_id}", headers=alice.headers).json()["error"] is None
    # the generator needs any device: a CPU worker takes it and is told to run on the CPU
    status, claimed = _claim_on(site, job_id, "generator", "cpu")
    assert (status, claimed["device"]) == (200, "cpu")
    status, refused = _claim_on(site, job_id, "discriminator", "cpu")
    assert status == 409
    assert "discriminator needs a CUDA device" in str(refused["detail"])
    job = client.get(f"{API}/jobs/{job_id}", headers=alice.headers).json()
    assert job["status"] == "failed"
    assert job["error"] == refused["detail"] and "'cluster-b'" in job["error"]
    assert "--device cuda" in job["error"]
    with platform.factory() as db:
        failed = db.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "job.fail", AuditEvent.subject_id == job_id
            )
        )
        assert failed is not None
        assert failed.details == {
            "reason": "device_unavailable",
            "role": "discriminator",
            "cluster": "cluster-b",
            "needs": "cuda",
            "worker_device": "cpu",
        }
    # a worker that does not say what it has counts as CPU only
    second = _submit(client, alice, text, device="cuda")
    assert _claim_on(site, second, "generator", None)[0] == 409


def test_a_cuda_worker_runs_what_the_job_asks_for(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    site = _site(client, platform, settings, alice)
    job_id = _submit(
        client, alice, _upload(client, alice), device="cuda", role_devices={"generator": "cpu"}
    )
    assert _claim_on(site, job_id, "discriminator", "cuda")[1]["device"] == "cuda"
    # every worker has a CPU: a role that asks for it runs there, on a CUDA worker too
    assert _claim_on(site, job_id, "generator", "cuda")[1]["device"] == "cpu"
    job = client.get(f"{API}/jobs/{job_id}", headers=alice.headers).json()
    assert job["status"] == "running" and job["error"] is None
    assert job["config"]["device"] == "cuda"
    assert job["config"]["role_devices"] == {"generator": "cpu"}


@pytest.mark.parametrize(
    "config",
    [{"device": "tpu"}, {"role_devices": {"encoder": "cuda"}}, {"role_devices": {"g": "cpu"}}],
)
def test_a_device_request_off_the_list_is_422_and_stores_nothing(
    client: TestClient, platform: Platform, config: dict[str, object]
) -> None:
    alice = platform.user()
    text = _upload(client, alice)
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, alice)}/jobs",
        json={
            "kind": "electra_pretrain",
            "config": {"preset": "tiny", **config},
            "inputs": {"text": text},
            "placement": dict(CLUSTER_OF),
        },
        headers=alice.headers,
    )
    assert answer.status_code == 422
    assert "device" in answer.json()["detail"]
    with platform.factory() as db:
        assert db.scalar(select(func.count()).select_from(Job)) == 0

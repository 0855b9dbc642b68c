"""Fair share through the API, on SQLite and PostgreSQL: a cluster with 2 role slots, two
tenants, gangs, the queue timeout, the admins' limits."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.accounts.models import Role
from app.audit.models import AuditEvent
from app.db import utcnow
from app.jobs import dispatch
from app.jobs.models import Job, JobRole, RoleStatus
from app.settings import Settings
from support.clusters import register_clusters
from support.platforms import Account, Platform

API = "/api/v1"
TEXT = "".join(f"sentence {i}\n" for i in range(16)).encode()


@dataclass
class Tenant:
    account: Account
    workspace: str
    text: str


@dataclass
class Site:
    client: TestClient
    platform: Platform
    admin: Account
    clusters: dict[str, str]  # name -> id

    def tenant(self) -> Tenant:
        account = self.platform.user()
        workspace = self.client.get(f"{API}/workspaces", headers=account.headers).json()["items"][
            0
        ]["id"]
        raised = self.client.patch(
            f"{API}/workspaces/{workspace}/quota",
            json={"max_concurrent_jobs": 8},
            headers=self.admin.headers,
        )
        assert raised.status_code == 200, raised.text
        uploaded = self.client.post(
            f"{API}/workspaces/{workspace}/datasets",
            data={"name": "t.txt", "kind": "text"},
            files={"file": ("t.txt", TEXT)},
            headers=account.headers,
        )
        assert uploaded.status_code == 201, uploaded.text
        return Tenant(account, workspace, uploaded.json()["id"])

    def slots(self, cluster: str, role_slots: int | None) -> dict:
        answer = self.client.patch(
            f"{API}/clusters/{self.clusters[cluster]}/slots",
            json={"role_slots": role_slots},
            headers=self.admin.headers,
        )
        assert answer.status_code == 200, answer.text
        body: dict = answer.json()
        return body

    def submit(self, tenant: Tenant, n_discriminators: int = 1) -> str:
        answer = self.submit_raw(tenant, n_discriminators)
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def submit_raw(self, tenant: Tenant, n_discriminators: int = 1):  # type: ignore[no-untyped-def]
        return self.client.post(
            f"{API}/workspaces/{tenant.workspace}/jobs",
            json={
                "kind": "electra_pretrain",
                "config": {"steps": 3, "n_discriminators": n_discriminators},
                "inputs": {"text": tenant.text},
                "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
            },
            headers=tenant.account.headers,
        )

    def job(self, tenant: Tenant, job_id: str) -> dict:
        answer = self.client.get(f"{API}/jobs/{job_id}", headers=tenant.account.headers)
        assert answer.status_code == 200, answer.text
        body: dict = answer.json()
        return body

    def waiting(self, tenant: Tenant, job_id: str) -> str | None:
        shown = self.job(tenant, job_id)["waiting"]
        return None if shown is None else str(shown["reason"])

    def role_states(self, job_id: str) -> list[RoleStatus]:
        with self.platform.factory() as db:
            return list(db.scalars(select(JobRole.status).where(JobRole.job_id == job_id)))


@pytest.fixture
def site(client: TestClient, platform: Platform, settings: Settings) -> Site:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")
    admin = platform.user(Role.admin)
    listed = client.get(f"{API}/clusters", headers=admin.headers).json()["items"]
    return Site(client, platform, admin, {c["name"]: c["id"] for c in listed})


def test_a_tenant_with_one_job_starts_at_the_first_free_slot_before_anothers_queue(
    site: Site,
) -> None:
    assert site.slots("cluster-b", 2)["role_slots"] == 2
    a, b = site.tenant(), site.tenant()
    a_jobs = [site.submit(a) for _ in range(4)]
    # two hold the cluster's slots (their roles sent), two wait without sending any role
    assert [site.waiting(a, j) for j in a_jobs[:2]] == [None, None]
    assert all(s == RoleStatus.dispatched for s in site.role_states(a_jobs[0]))
    assert site.role_states(a_jobs[2]) == [RoleStatus.pending, RoleStatus.pending]
    assert (
        site.waiting(a, a_jobs[2]) == "waiting: slots of cluster-b held by 2 other jobs; position 1"
    )

    b_job = site.submit(b)
    assert site.waiting(b, b_job) == "waiting: slots of cluster-b held by 2 other jobs; position 1"
    assert site.job(a, a_jobs[2])["waiting"]["position"] == 2
    assert site.job(a, a_jobs[3])["waiting"]["position"] == 3
    overview = site.client.get(f"{API}/admin/jobs", headers=site.admin.headers).json()["items"]
    assert {j["id"]: (j["waiting"] or {}).get("position") for j in overview} == {
        a_jobs[0]: None,
        a_jobs[1]: None,
        a_jobs[2]: 2,
        a_jobs[3]: 3,
        b_job: 1,
    }
    # the clusters page: slots in use per tenant (an admin sees whose), the queue's length
    cluster = site.client.get(
        f"{API}/clusters/{site.clusters['cluster-b']}", headers=site.admin.headers
    ).json()
    assert (cluster["slots_in_use"], cluster["queued_jobs"]) == (2, 3)
    assert [(t["tenant"], t["slots"]) for t in cluster["slots_by_tenant"]] == [(a.account.email, 2)]
    seen_by_b = site.client.get(
        f"{API}/clusters/{site.clusters['cluster-b']}", headers=b.account.headers
    ).json()
    assert [(t["tenant"], t["slots"]) for t in seen_by_b["slots_by_tenant"]] == [
        ("other tenants", 2)
    ]

    # a's first job ends: the slot goes to b, whose roles are sent; a's queue moves up
    cancelled = site.client.post(f"{API}/jobs/{a_jobs[0]}/cancel", headers=a.account.headers)
    assert cancelled.status_code == 202
    assert site.waiting(b, b_job) is None
    assert all(s == RoleStatus.dispatched for s in site.role_states(b_job))
    assert site.job(a, a_jobs[2])["waiting"]["position"] == 1
    assert site.role_states(a_jobs[2]) == [RoleStatus.pending, RoleStatus.pending]
    with site.platform.factory() as db:
        placed = db.scalars(
            select(AuditEvent.subject_id)
            .where(AuditEvent.action == "job.place")
            .order_by(AuditEvent.seq)
        ).all()
    assert placed == [a_jobs[0], a_jobs[1], b_job]


def test_an_electra_gang_is_placed_whole_or_not_at_all(site: Site) -> None:
    site.slots("cluster-b", 4)
    a, b = site.tenant(), site.tenant()
    holders = [site.submit(a), site.submit(a)]  # 2 of the 4 slots
    gang = site.submit(b, n_discriminators=3)  # discriminator + 2 replicas on cluster-b
    assert site.waiting(b, gang) == "waiting: slots of cluster-b held by 2 other jobs; position 1"
    # nothing of it holds a slot: every role pending, cluster-b's use unchanged
    assert set(site.role_states(gang)) == {RoleStatus.pending}
    shown = site.client.get(
        f"{API}/clusters/{site.clusters['cluster-b']}", headers=site.admin.headers
    ).json()
    assert shown["slots_in_use"] == 2
    # a smaller job of a's arriving later does not slip into the slots the gang waits for
    later = site.submit(a)
    assert site.job(a, later)["waiting"]["position"] == 2

    site.client.post(f"{API}/jobs/{holders[0]}/cancel", headers=a.account.headers)
    assert site.waiting(b, gang) is None
    assert site.role_states(gang) == [RoleStatus.dispatched] * 4  # generator, D, 2 replicas
    assert site.waiting(a, later) is not None

    # a gang larger than the cluster could never start: refused at submit
    too_big = site.submit_raw(b, n_discriminators=5)
    assert too_big.status_code == 409
    assert too_big.json()["detail"] == "the job needs 5 role slots of cluster-b, which has 4"


def test_a_job_that_waits_past_the_queue_timeout_fails_with_its_reason(
    site: Site, settings: Settings
) -> None:
    site.slots("cluster-b", 2)
    a, b = site.tenant(), site.tenant()
    site.submit(a)
    site.submit(a)
    waiting = site.submit(b)
    with site.platform.factory() as db:
        db.execute(
            update(Job)
            .where(Job.id == waiting)
            .values(created_at=utcnow() - timedelta(seconds=settings.queue_timeout_s + 1))
        )
        db.commit()
        dispatch.reap_once(db, settings=settings)
    job = site.job(b, waiting)
    assert job["status"] == "failed"
    assert job["error"] == (
        f"waited past the queue timeout ({settings.queue_timeout_s:g} s); "
        "waiting: slots of cluster-b held by 2 other jobs; position 1"
    )
    assert set(site.role_states(waiting)) == {RoleStatus.stopped}
    with site.platform.factory() as db:
        failure = db.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "job.fail", AuditEvent.subject_id == waiting
            )
        )
    assert failure is not None and failure.details["reason"] == "queue_timeout"


def test_admins_set_roles_per_cluster_and_a_tenant_at_its_limit_waits(site: Site) -> None:
    a, b = site.tenant(), site.tenant()
    path = f"{API}/users/{a.account.id}/quota"
    assert site.client.get(path, headers=site.admin.headers).json()["roles_per_cluster"] == 16
    for bad in (0, -1, "two"):
        refused = site.client.patch(
            path, json={"roles_per_cluster": bad}, headers=site.admin.headers
        )
        assert refused.status_code == 422, refused.text
    assert site.client.get(path, headers=site.admin.headers).json()["roles_per_cluster"] == 16
    assert (
        site.client.patch(
            path, json={"roles_per_cluster": 1}, headers=a.account.headers
        ).status_code
        == 403
    )
    assert (
        site.client.patch(path, json={"roles_per_cluster": 1}, headers=site.admin.headers).json()[
            "roles_per_cluster"
        ]
        == 1
    )
    bad_slots = site.client.patch(
        f"{API}/clusters/{site.clusters['cluster-b']}/slots",
        json={"role_slots": 0},
        headers=site.admin.headers,
    )
    assert bad_slots.status_code == 422

    first, second = site.submit(a), site.submit(a)
    assert site.waiting(a, first) is None
    assert site.waiting(a, second) == (
        "waiting: your 1 role slots of cluster-a are held by 1 of your jobs; position 1"
    )
    assert site.waiting(b, site.submit(b)) is None  # the cluster has room: others go on
    # a job that needs more than the tenant's limit on one cluster could never start
    assert site.submit_raw(a, n_discriminators=2).status_code == 409
    with site.platform.factory() as db:
        changes = db.scalars(
            select(AuditEvent.details).where(
                AuditEvent.action == "user.quota", AuditEvent.subject_id == a.account.id
            )
        ).all()
    assert changes == [{"roles_per_cluster": 1}]

"""Handing a job's roles to their queues: each role is sent once, whoever dispatches it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text, update

from app.jobs.dispatch import dispatch_job
from app.jobs.models import JobRole, RoleStatus
from app.settings import Settings
from support.clusters import register_clusters
from support.jobs import electra_request, submit, upload_dataset
from support.platforms import Platform


@pytest.fixture
def clusters_ready(platform: Platform, settings: Settings) -> None:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")


# SQLite serializes writers (BEGIN IMMEDIATE): two dispatchers cannot overlap there at all
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
@pytest.mark.usefixtures("clusters_ready")
def test_two_dispatchers_at_once_send_each_role_once(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    status, body = submit(client, alice, electra_request(upload_dataset(client, alice)))
    assert status == 202, body
    job = body["id"]
    with platform.factory() as db:  # as after a failed send: the reaper sends them later
        db.execute(
            update(JobRole)
            .where(JobRole.job_id == job)
            .values(status=RoleStatus.pending, dispatched_at=None)
        )
        db.commit()
    # the request and the reaper, each in its own transaction, at the same time
    request, reaper = platform.factory(), platform.factory()
    try:
        assert dispatch_job(request, settings=settings, job_id=job) == 2
        # (without the rows taken, this one would wait on them: let it fail instead)
        reaper.execute(text("SET LOCAL lock_timeout = '5s'"))
        assert dispatch_job(reaper, settings=settings, job_id=job) == 0
        reaper.commit()
        request.commit()
        # and once the first has committed, its roles are no longer pending
        assert dispatch_job(reaper, settings=settings, job_id=job) == 0
    finally:
        request.close()
        reaper.close()

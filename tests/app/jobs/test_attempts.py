"""What a role's calls write to its job, when another role's calls commit at the same time."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.jobs import attempts
from app.jobs.models import Job, JobRole, RoleStatus
from app.settings import Settings
from support.clusters import register_clusters
from support.jobs import electra_request, submit, upload_dataset
from support.platforms import Platform


# SQLite serializes writers (BEGIN IMMEDIATE): two roles' batches cannot overlap there at all
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_roles_metrics_committed_at_once_both_stay_in_the_jobs_latest(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")
    alice = platform.user()
    status, body = submit(client, alice, electra_request(upload_dataset(client, alice)))
    assert status == 202, body
    job_id = body["id"]
    with platform.factory() as db:
        db.execute(
            update(JobRole).where(JobRole.job_id == job_id).values(status=RoleStatus.running)
        )
        db.commit()
    generator, discriminator = platform.factory(), platform.factory()
    try:
        # the generator's request has read the job (checking the metric names) and holds it,
        # as the handler does, before the discriminator's batch commits; then it stores its own
        read_early = generator.get(Job, job_id)
        assert read_early is not None and read_early.metrics == {}
        assert attempts.record_metrics(
            discriminator,
            job_id=job_id,
            role="discriminator",
            attempt=1,
            points=[(1, {"loss": 2.0})],
        )
        discriminator.commit()
        assert attempts.record_metrics(
            generator, job_id=job_id, role="generator", attempt=1, points=[(1, {"loss": 3.0})]
        )
        generator.commit()
    finally:
        generator.close()
        discriminator.close()
    with platform.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        assert job.metrics == {"discriminator.loss": 2.0, "generator.loss": 3.0}

"""The orchestration tests' platform (tests/support/clusters.py), one per package: PostgreSQL,
Redis, the API with its reaper, two switches and one real Celery worker per cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.clusters import RunningPlatform, platform_on
from support.services import REDIS_URL, PostgresTemplates, service_unavailable
from workers.training.data import write_demo_corpus


@pytest.fixture(scope="package")
def running(
    pg_templates: PostgresTemplates | Exception, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningPlatform]:
    if isinstance(pg_templates, Exception):
        service_unavailable("PostgreSQL", pg_templates)
        raise AssertionError("unreachable")
    try:
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
    except Exception as exc:
        service_unavailable("Redis", exc)
    url = pg_templates.fresh()
    with platform_on(url, REDIS_URL, tmp_path_factory.mktemp("platform") / "var") as platform:
        yield platform
    pg_templates.drop(url)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The demo corpus, written once per test module."""
    return write_demo_corpus(tmp_path_factory.mktemp("corpus"))

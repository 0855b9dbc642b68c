"""The route table (app/route_table.py) answers as trying every route in turn would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI

from app.main import create_app
from app.openapi.document import api_routes, route_methods, security_of, signed_in_routes
from app.route_table import Route, RouteTable
from app.settings import Settings

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _every_route(routes: list[Route], path: str) -> frozenset[str]:
    """The reference: every route's pattern tried in turn."""
    allowed: set[str] = set()
    for _, pattern, methods in routes:
        if pattern.match(path):
            allowed |= methods
    return frozenset(allowed)


def _filled(path_format: str, value: str) -> str:
    return re.sub(r"\{[^}]*\}", value, path_format)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    tmp: Path = tmp_path_factory.mktemp("routes")
    return create_app(
        Settings(
            var_dir=tmp / "var",
            database_url=f"sqlite:///{tmp / 'nebula.db'}",
            secret_key="test-secret-key-not-for-production",  # type: ignore[arg-type]
            run_reaper=False,
        )
    )


def _paths(routes: list[Route]) -> list[str]:
    """Each route's path with its parameters filled in two ways, a literal route's neighbours
    (`/api/v1/jobs/kinds` is also a job's id), and paths no route has."""
    paths = {"/", "/api", "/api/v1", "/api/v1/", "/api/v1/nothing", "/healthz/", "//api/v1"}
    for path_format, _, _ in routes:
        for value in ("3f2b8c1e-5d4a-4e6b-9a7c-2d1e0f9b8a76", "kinds"):
            filled = _filled(path_format, value)
            paths |= {filled, filled + "/", filled + "/extra", filled.rsplit("/", 1)[0]}
    return sorted(paths)


@pytest.mark.parametrize("signed_in_only", [False, True], ids=["all", "signed_in"])
def test_the_table_answers_as_every_route_tried_in_turn(app: FastAPI, signed_in_only: bool) -> None:
    contexts = api_routes(app)
    table = route_methods(app)
    if signed_in_only:
        contexts = [r for r in contexts if {"bearer": []} in security_of(r)]
        table = signed_in_routes(app)
    routes = [(str(r.path_format), r.path_regex, frozenset(r.methods or ())) for r in contexts]
    assert len(routes) > 50
    checked = 0
    for path in _paths(routes):
        expected = _every_route(routes, path)
        assert table.methods(path) == expected, path
        for method in METHODS:
            assert table.offers(method, path) == (method in expected), (method, path)
        checked += bool(expected)
    assert checked > len(routes)  # most sample paths name a route
    # signing in is open; the list of workspaces is not
    assert table.offers("POST", "/api/v1/auth/login") != signed_in_only
    assert table.offers("GET", "/api/v1/workspaces")


def test_a_parameter_among_the_first_segments_is_matched_from_any_path() -> None:
    app = FastAPI()

    @app.get("/{tenant}/jobs")
    def tenant_jobs(tenant: str) -> None: ...

    @app.delete("/api/{version}/jobs/{job_id}")
    def delete_job(version: str, job_id: str) -> None: ...

    @app.put("/api/v1/jobs/{job_id}")
    def put_job(job_id: str) -> None: ...

    table = route_methods(app)
    assert table.methods("/acme/jobs") == {"GET"}
    assert table.methods("/api/v1/jobs/7") == {"DELETE", "PUT"}
    assert table.methods("/api/v2/jobs/7") == {"DELETE"}
    assert table.methods("/api/v1/jobs") == frozenset()
    assert not table.offers("GET", "/api/v1/jobs/7")


def test_an_empty_table_offers_nothing() -> None:
    table = RouteTable([])
    assert table.methods("/api/v1/jobs") == frozenset()
    assert not table.offers("GET", "/")

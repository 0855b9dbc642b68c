"""The OpenAPI document tells the truth: schemathesis, every check on, against a live server as an
admin and as a member (stateful phase included), and the document's own promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST

from app.accounts.models import Role
from app.settings import Settings
from support import PASSWORD, LiveServer, Platform, make_user

HERE = Path(__file__).resolve().parent
REQUIRE_SERVICES = os.environ.get("NEBULA_TEST_REQUIRE_SERVICES") == "1"
# Bounded so that both roles together stay within a minute or two on two cores.
MAX_EXAMPLES = int(os.environ.get("NEBULA_FUZZ_EXAMPLES", "10"))
SEED = os.environ.get("NEBULA_FUZZ_SEED", "19")
# Logging out ends the very session the run authenticates with, after which every answer is a
# 401; tests/app/accounts/test_auth.py covers it.
EXCLUDED = ["/api/v1/auth/logout"]


def _document(client: TestClient) -> dict[str, Any]:
    answer = client.get("/api/openapi.json")
    assert answer.status_code == 200
    document: dict[str, Any] = answer.json()
    return document


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    ]


def test_every_error_answer_is_documented_with_the_one_error_schema(client: TestClient) -> None:
    document = _document(client)
    operations = _operations(document)
    assert len(operations) >= 50
    assert "HTTPValidationError" not in document["components"]["schemas"]
    shared = document["components"]["responses"]
    for method, path, operation in operations:
        responses = operation["responses"]
        assert "400" in responses, (method, path)  # a NUL byte in the URL, anywhere
        for status, response in responses.items():
            if int(status) >= 400 and not (path == "/readyz" and status == "503"):
                # every error is one of the shared responses, each with the one error schema
                name = response["$ref"].removeprefix("#/components/responses/")
                schema = shared[name]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (method, path, status)
        if "{" in path:
            assert "404" in responses, (method, path)
        if operation.get("security"):
            assert "401" in responses, (method, path)
    by_route = {(m, p): o for m, p, o in operations}
    # what the dependencies raise: roles, and the CSRF check of cookie sessions on unsafe methods
    assert "403" in by_route["GET", "/api/v1/users"]["responses"]
    assert "403" not in by_route["GET", "/api/v1/me"]["responses"]
    assert "403" in by_route["POST", "/api/v1/me/tokens"]["responses"]
    # what the endpoints declare they raise
    assert {"409", "413", "422"} <= set(by_route["POST", "/api/v1/users"]["responses"])
    assert {"401", "429"} <= set(by_route["POST", "/api/v1/auth/login"]["responses"])
    assert "security" not in by_route["POST", "/api/v1/auth/login"]


def test_exports_and_pem_files_document_their_real_content_types(client: TestClient) -> None:
    paths = _document(client)["paths"]

    def ok_types(path: str) -> set[str]:
        return set(paths[path]["get"]["responses"]["200"]["content"])

    assert ok_types("/api/v1/audit/export") == {"application/x-ndjson", "text/csv"}
    for pem in ("ca.pem", "crl.pem", "job-token-key.pem"):
        assert ok_types(f"/api/v1/pki/{pem}") == {"application/x-pem-file"}
    assert ok_types("/api/v1/datasets/{dataset_id}/content") == {"application/octet-stream"}
    assert ok_types("/api/v1/jobs/{job_id}/events") == {"text/event-stream"}
    assert ok_types("/metrics") == {CONTENT_TYPE_LATEST}


def test_types_are_as_strict_as_the_document(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    schemas = _document(client)["components"]["schemas"]
    # the password policy's length is in the schema, not only in the check
    password = schemas["UserCreateIn"]["properties"]["password"]
    assert password["minLength"] == 12 and password["format"] == "password"
    csr = schemas["CsrIn"]["properties"]["csr_pem"]
    assert csr["pattern"].startswith("^\\s*-----BEGIN CERTIFICATE REQUEST-----")
    ws = client.get("/api/v1/workspaces", headers=admin.headers).json()["items"][0]["id"]
    quota = f"/api/v1/workspaces/{ws}/quota"
    for refused in ({"max_concurrent_jobs": False}, {"max_concurrent_jobs": "4"}):
        assert client.patch(quota, json=refused, headers=admin.headers).status_code == 422
    # JSON Schema counts 4.0 as an integer, so the server does too
    answer = client.patch(quota, json={"max_concurrent_jobs": 4.0}, headers=admin.headers)
    assert answer.status_code == 200 and answer.json()["max_concurrent_jobs"] == 4
    for until in ("0.5", "2026-05-01", "2026-05-01T12:00:00", "2026-13-01T00:00:00Z"):
        answer = client.get("/api/v1/audit", params={"until": until}, headers=admin.headers)
        assert answer.status_code == 422, until
    answer = client.get(
        "/api/v1/audit", params={"until": "2030-05-01T12:00:00+02:00"}, headers=admin.headers
    )
    assert answer.status_code == 200
    assert client.get("/api/v1/users/not-an-id", headers=admin.headers).status_code == 422


def test_validation_errors_have_the_one_error_shape(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    answer = client.post(
        "/api/v1/users",
        json={"email": "x@example.org", "display_name": "x", "password": "Zq9-secret"},
        headers=admin.headers,
    )
    assert answer.status_code == 422
    body = answer.json()
    assert body["detail"] == "password: String should have at least 12 characters"
    assert body["errors"] == [
        {
            "loc": ["body", "password"],
            "msg": "String should have at least 12 characters",
            "type": "string_too_short",
        }
    ]
    assert "Zq9-secret" not in answer.text  # the rejected input is never echoed


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/api/v1/auth/login", "POST"),  # once a 404 from the web UI's catch-all
        ("PUT", "/api/v1/users", "GET, POST"),
        ("OPTIONS", "/api/v1/users/3f2b8c1e-5d4a-4e6b-9a7c-2d1e0f9b8a76", "DELETE, GET, PATCH"),
        ("DELETE", "/api/v1/pki/ca.pem", "GET"),
        ("POST", "/healthz", "GET"),
    ],
)
def test_a_method_a_path_lacks_is_405_with_every_allowed_method(
    client: TestClient, method: str, path: str, allow: str
) -> None:
    answer = client.request(method, path)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allow
    assert answer.json()["detail"]
    assert client.get("/api/v1/no-such-thing").status_code == 404


def _worker_credential(server: LiveServer) -> str:
    """A registered cluster's worker credential, so that the cluster API is reached for real."""
    from app.audit.service import SYSTEM
    from app.clusters import service as clusters

    with server.app.state.sessionmaker() as db:
        cluster = clusters.create(
            db, actor=SYSTEM, name="fuzz-east", switch_host="127.0.0.1", switch_port=7101
        )
        _row, secret = clusters.create_worker_credential(db, actor=SYSTEM, cluster=cluster)
        db.commit()
    return secret


def _schemathesis(server: LiveServer, token: str, folder: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "run",
        f"{server.url}/api/openapi.json",
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--seed",
        SEED,
        "--workers",
        "1",
        "--no-color",
        "--header",
        f"Authorization: Bearer {token}",
        # the cluster API's roles also need a job token, which only a running job holds: they
        # answer 401 here, and their documented statuses are checked all the same
        "--header",
        f"X-Nebula-Worker: {_worker_credential(server)}",
        "--report",
        "junit",
        "--report-junit-path",
        str(folder / "junit.xml"),
        "--generation-database",
        "none",
    ]
    for path in EXCLUDED:
        command += ["--exclude-path", path]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent.parent), str(HERE)]),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=600, cwd=folder, check=False
    )


@pytest.mark.slow
@pytest.mark.parametrize("role", [Role.admin, Role.member])
def test_schemathesis_finds_nothing(
    settings: Settings, role: Role, tmp_path: Path, database_url: str
) -> None:
    if database_url.startswith("postgresql") and not REQUIRE_SERVICES:
        pytest.skip(
            "the PostgreSQL run is CI's (NEBULA_TEST_REQUIRE_SERVICES=1): make test stays short"
        )
    with LiveServer(settings) as server:
        email = f"{role.value}@example.org"
        make_user(server.app.state.sessionmaker, settings, role=role, email=email)
        login = httpx.post(
            f"{server.url}/api/v1/auth/login", json={"email": email, "password": PASSWORD}
        )
        assert login.status_code == 200, login.text
        run = _schemathesis(server, login.json()["token"], tmp_path)
    summary = run.stdout[run.stdout.find("=== SUMMARY") :] or run.stdout[-3000:]
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-3000:]
    assert "Stateful" in summary and "generated" in summary, summary
    print(summary)

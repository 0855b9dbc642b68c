"""The OpenAPI document's promises (app/openapi/): every error status documented with the one
error schema, real content types, strict types, and 405 with the path's every method."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import APIRouter, FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CONTENT_TYPE_LATEST

from app.accounts.models import Role
from app.deps import AdminDep, CallerDep, EnrollingCallerDep
from app.errors import Conflict, raises
from app.fields import Id, StrictIn
from app.openapi.document import build_document
from app.openapi.offline import offline_document
from app.path_params import UserIdPath
from support.platforms import Platform


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
    # a session that may only enrol a second factor is refused everywhere but where it enrols
    assert "403" in by_route["GET", "/api/v1/workspaces"]["responses"]
    assert "403" in by_route["GET", "/api/v1/datasets/{dataset_id}"]["responses"]
    assert "403" not in by_route["GET", "/api/v1/me/totp"]["responses"]
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


class ThingIn(StrictIn):
    owner_id: Id


def test_a_new_route_is_documented_from_its_shape_and_its_declared_errors() -> None:
    router = APIRouter(prefix="/api/v1")

    @router.post("/things/{user_id}", status_code=201)
    @raises(Conflict)
    def create_thing(user_id: UserIdPath, body: ThingIn, caller: AdminDep) -> dict[str, str]:
        """A route as the next engineer would write it."""
        return {}

    @router.get("/things")
    def list_things(caller: CallerDep) -> dict[str, str]:
        """No input, any signed-in user."""
        return {}

    @router.get("/enrolment")
    def enrolment(caller: EnrollingCallerDep) -> dict[str, str]:
        """No input, any signed-in user, even one who may only enrol a second factor."""
        return {}

    app = FastAPI()
    app.include_router(router)
    paths = build_document(app)["paths"]
    create = paths["/api/v1/things/{user_id}"]["post"]
    # 400 NUL, 401 and 403 (admin, CSRF) from the dependencies, 404 the path id (429 a scan of
    # them), 409 declared, 408 and 413 a body, 422 validation
    expected = {"201", "400", "401", "403", "404", "408", "409", "413", "422", "429"}
    assert set(create["responses"]) == expected
    assert create["security"] == [{"bearer": []}, {"session_cookie": []}]
    # 403: a session that may only enrol a second factor, refused but where it enrols
    assert set(paths["/api/v1/things"]["get"]["responses"]) == {"200", "400", "401", "403"}
    assert set(paths["/api/v1/enrolment"]["get"]["responses"]) == {"200", "400", "401"}


def test_the_document_is_written_offline_as_served(client: TestClient) -> None:
    # `python -m app.openapi` feeds make api-types; it must need no server, database or secret
    assert offline_document() == _document(client)

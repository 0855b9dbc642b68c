"""schemathesis against /api/openapi.json, authenticated as an admin: no 5xx on any operation."""

from __future__ import annotations

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from app.accounts.models import Role
from support import Platform


def test_no_operation_answers_5xx(client: TestClient, platform: Platform) -> None:
    admin = platform.user(Role.admin)
    schema = schemathesis.openapi.from_asgi("/api/openapi.json", client.app)
    server_errors: list[str] = []
    statuses: set[int] = set()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20

    def fuzzer(strategy: object, headers: dict[str, str]) -> object:
        @given(case=strategy)
        @settings(
            max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def fuzz(case: schemathesis.Case) -> None:
            response = case.call(headers=headers)
            statuses.add(response.status_code)
            if response.status_code >= 500:
                server_errors.append(f"{case.method} {case.formatted_path}: {response.status_code}")

        return fuzz

    for operation in operations:
        # a fresh session per operation: logout or a password change may end the last one
        headers = {"Authorization": f"Bearer {platform.login(admin.email, admin.password)}"}
        fuzzer(operation.as_strategy(), headers)()  # type: ignore[operator]
    assert not server_errors, "\n".join(sorted(set(server_errors)))
    assert {200, 422} <= statuses  # the fuzzer reached both the handlers and the validation

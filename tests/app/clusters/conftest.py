"""The broker tests' RabbitMQ: a virtual host of each test's own."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest

from support.services import rabbitmqctl, service_unavailable


@pytest.fixture
def vhost() -> Iterator[str]:
    """A virtual host of the test's own on the machine's RabbitMQ, removed afterwards."""
    name = f"nebula-test-{uuid.uuid4().hex[:8]}"
    try:
        rabbitmqctl("add_vhost", name)
        rabbitmqctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    except (OSError, subprocess.CalledProcessError) as exc:
        service_unavailable("RabbitMQ (rabbitmqctl)", exc)
    yield name
    rabbitmqctl("delete_vhost", name)

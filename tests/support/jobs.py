"""Jobs through the API of an in-process platform: a dataset to train on, a job request and
its submission (the orchestration platform's are in support.clusters)."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from support.platforms import Account

API = "/api/v1"
TEXT = "".join(f"la frase número {i}\n" for i in range(64)).encode()
PLACEMENT = {"generator": "cluster-a", "discriminator": "cluster-b"}


def first_workspace(client: TestClient, user: Account) -> str:
    """The id of the workspace every new user gets."""
    return str(client.get(f"{API}/workspaces", headers=user.headers).json()["items"][0]["id"])


def upload_dataset(
    client: TestClient, user: Account, discoverable: bool = False, kind: str = "text"
) -> str:
    """A small dataset of `kind` (TEXT) uploaded in `user`'s first workspace; returns its id."""
    answer = client.post(
        f"{API}/workspaces/{first_workspace(client, user)}/datasets",
        data={"name": "t.txt", "kind": kind, "discoverable": json.dumps(discoverable)},
        files={"file": ("t.txt", TEXT)},
        headers=user.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def submit(
    client: TestClient, user: Account, body: dict, workspace: str | None = None
) -> tuple[int, dict]:
    """POST the job `body` in `workspace` (the user's first); returns the status and answer."""
    answer = client.post(
        f"{API}/workspaces/{workspace or first_workspace(client, user)}/jobs",
        json=body,
        headers=user.headers,
    )
    return answer.status_code, answer.json()


def electra_request(text: str, **config: object) -> dict:
    """A request for a 5-step tiny ELECTRA job on dataset `text` across the two clusters."""
    return {
        "kind": "electra_pretrain",
        "config": {"preset": "tiny", "steps": 5, **config},
        "inputs": {"text": text},
        "placement": dict(PLACEMENT),
    }

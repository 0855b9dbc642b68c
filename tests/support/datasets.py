"""Datasets through the API, as the tests upload them: a workspace, a multipart upload, and
what a refused upload must leave behind (nothing)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.settings import Settings
from app.workspaces.models import Dataset, Workspace
from support.platforms import Account, Platform

API = "/api/v1"


def new_workspace(client: TestClient, owner: Account, name: str = "data") -> str:
    """A workspace of `owner`'s made through the API; returns its id."""
    answer = client.post(f"{API}/workspaces", json={"name": name}, headers=owner.headers)
    assert answer.status_code == 201, answer.text
    ws: str = answer.json()["id"]
    return ws


def upload(
    client: TestClient,
    owner: Account,
    ws: str,
    content: bytes,
    *,
    kind: str = "text",
    name: str = "corpus",
    discoverable: bool = False,
    file_first: bool = True,
) -> tuple[int, dict]:
    """POST a multipart upload; `file_first` is the order browsers' FormData sends here."""
    fields = {"name": name, "kind": kind, "discoverable": "true" if discoverable else "false"}
    boundary = "nebula-test-boundary"
    parts = []
    file_part = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.bin"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + b"\r\n"
    )
    text_parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    parts = [file_part, *text_parts] if file_first else [*text_parts, file_part]
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    answer = client.post(
        f"{API}/workspaces/{ws}/datasets",
        content=body,
        headers={**owner.headers, "content-type": f"multipart/form-data; boundary={boundary}"},
    )
    return answer.status_code, answer.json()


def used(platform: Platform, ws: str) -> int:
    """The bytes the workspace's quota counts as used."""
    with platform.factory() as db:
        return db.scalar(select(Workspace.storage_bytes_used).where(Workspace.id == ws)) or 0


def dataset_rows(platform: Platform) -> int:
    """How many datasets the database holds, of anyone's."""
    with platform.factory() as db:
        return db.scalar(select(func.count()).select_from(Dataset)) or 0


def files(settings: Settings, folder: str) -> list[Path]:
    """The files in `folder` of the data directory, sorted."""
    path = settings.resolved_data_dir / folder
    return sorted(path.iterdir()) if path.exists() else []


def assert_nothing_left(platform: Platform, settings: Settings, ws: str) -> None:
    """No file, no row and no quota left behind by a refused upload."""
    assert files(settings, "tmp") == []
    assert files(settings, "datasets") == []
    assert dataset_rows(platform) == 0
    assert used(platform, ws) == 0

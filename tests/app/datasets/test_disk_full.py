"""The data directory's disk fills up: uploads answer 507, nothing is half-written, the API stays up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.audit.models import AuditEvent
from app.main import create_app
from app.settings import Settings
from app.workspaces.models import Dataset
from support.datasets import API, new_workspace, upload
from support.disks import small_tmpfs
from support.platforms import Platform


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs of the test's own, unmounted afterwards."""
    with small_tmpfs(tmp_path / "disk", "256k") as disk:
        yield disk


def files_under(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()]


def test_a_full_disk_answers_507_and_stores_nothing(settings: Settings, small_disk: Path) -> None:
    app = create_app(settings.model_copy(update={"data_dir": small_disk}))
    with TestClient(app) as client:
        owner = Platform(client, app.state.settings).user()
        ws = new_workspace(client, owner)
        lines = b"".join(b"line %06d of a corpus too big for the disk\n" % i for i in range(20000))
        status, body = upload(client, owner, ws, lines)
        assert status == 507, body
        assert "full" in body["detail"]
        # the partial file is gone; only the audit chain's signed heads live there
        assert files_under(small_disk) == [small_disk / "audit" / "anchors.jsonl"]
        with app.state.sessionmaker() as db:
            assert db.scalar(select(func.count()).select_from(Dataset)) == 0
            uploads = select(func.count()).where(AuditEvent.action == "dataset.upload")
            assert db.scalar(uploads) == 0
        # the API stays up, and a file that fits is stored
        assert client.get("/healthz").status_code == 200
        status, body = upload(client, owner, ws, b"a line that fits\n" * 100)
        assert status == 201, body
        listed = client.get(f"{API}/workspaces/{ws}/datasets", headers=owner.headers).json()
        assert [d["id"] for d in listed["items"]] == [body["id"]]
    app.state.engine.dispose()

"""Someone who can write the database, but not read the platform secret, tries to read data.

Issue 27, finding 2: they rewrite a dataset's owner, insert an approved grant or an
approved release. Each row that confers access carries a seal under a key the database
does not hold (app/seals.py): the forged row is refused as missing, never data, and the
attempt is audited as `integrity.tampered`.
"""

from __future__ import annotations

import ast
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, select, text, update

from app.audit.models import AuditEvent
from app.db import utcnow
from app.jobs.models import Job, JobStatus
from app.jobs.outputs import store_job_output
from app.seals import SEALED_MODELS, UnsealedWrite
from app.settings import Settings
from app.workspaces.models import Dataset
from support.clusters import register_clusters
from support.platforms import Account, Platform, model_file_bytes

API = "/api/v1"
SECRET_TEXT = "".join(f"confidential line {i}\n" for i in range(64)).encode()
PLACEMENT = {"generator": "cluster-a", "discriminator": "cluster-b"}


@pytest.fixture(autouse=True)
def clusters_ready(platform: Platform, settings: Settings) -> None:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")


def _workspace(client: TestClient, user: Account) -> str:
    return str(client.get(f"{API}/workspaces", headers=user.headers).json()["items"][0]["id"])


def _upload(client: TestClient, user: Account, *, discoverable: bool = False) -> str:
    answer = client.post(
        f"{API}/workspaces/{_workspace(client, user)}/datasets",
        data={"name": "corpus", "kind": "text", "discoverable": str(discoverable).lower()},
        files={"file": ("f", SECRET_TEXT)},
        headers=user.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _submit(client: TestClient, user: Account, dataset_id: str) -> Any:
    return client.post(
        f"{API}/workspaces/{_workspace(client, user)}/jobs",
        json={
            "kind": "electra_pretrain",
            "config": {"steps": 3},
            "inputs": {"text": dataset_id},
            "placement": PLACEMENT,
        },
        headers=user.headers,
    )


def _sql(platform: Platform, statement: str, **params: Any) -> None:
    """A write straight to the database, as its attacker would make it."""
    with platform.factory() as db:
        db.execute(text(statement), params)
        db.commit()


def _tampering_recorded(platform: Platform, row_id: str) -> list[AuditEvent]:
    with platform.factory() as db:
        return list(
            db.scalars(
                select(AuditEvent).where(
                    AuditEvent.action == "integrity.tampered", AuditEvent.subject_id == row_id
                )
            )
        )


def _naive_now() -> Any:
    return utcnow().replace(tzinfo=None)  # as a raw INSERT writes a timestamp column


def test_a_dataset_whose_owner_was_rewritten_in_the_database_is_refused_and_audited(
    client: TestClient, platform: Platform
) -> None:
    alice, carol = platform.user(), platform.user()
    dataset = _upload(client, alice)
    got = client.get(f"{API}/datasets/{dataset}/content", headers=alice.headers)
    assert got.status_code == 200 and got.content == SECRET_TEXT

    _sql(
        platform, "UPDATE datasets SET owner_id = :carol WHERE id = :id", carol=carol.id, id=dataset
    )

    stolen = client.get(f"{API}/datasets/{dataset}/content", headers=carol.headers)
    assert stolen.status_code == 404, stolen.text
    assert b"confidential" not in stolen.content
    assert client.get(f"{API}/datasets/{dataset}", headers=carol.headers).status_code == 404
    # the row is not trusted for anyone any more, its rightful owner included
    assert client.get(f"{API}/datasets/{dataset}/content", headers=alice.headers).status_code == 404
    events = _tampering_recorded(platform, dataset)
    assert events and all(e.outcome == "denied" and e.subject_type == "datasets" for e in events)


def test_a_workspace_whose_owner_was_rewritten_gives_nothing_to_the_new_owner(
    client: TestClient, platform: Platform
) -> None:
    alice, carol = platform.user(), platform.user()
    workspace = _workspace(client, alice)
    dataset = _upload(client, alice)
    _sql(
        platform,
        "UPDATE workspaces SET owner_id = :carol, name = 'taken' WHERE id = :id",
        carol=carol.id,
        id=workspace,
    )
    listed = client.get(f"{API}/workspaces/{workspace}/datasets", headers=carol.headers)
    assert listed.status_code == 404 and dataset not in listed.text
    assert _tampering_recorded(platform, workspace)


def test_an_approved_grant_inserted_in_the_database_is_refused_and_audited(
    client: TestClient, platform: Platform
) -> None:
    alice, bob = platform.user(), platform.user()
    dataset = _upload(client, alice, discoverable=True)
    forged = str(uuid.uuid4())
    _sql(
        platform,
        "INSERT INTO access_requests (id, dataset_id, requester_id, owner_id, purpose, status,"
        " created_at, decided_at) VALUES (:id, :ds, :bob, :alice, 'x', 'approved', :now, :now)",
        id=forged,
        ds=dataset,
        bob=bob.id,
        alice=alice.id,
        now=_naive_now(),
    )
    refused = _submit(client, bob, dataset)
    assert refused.status_code == 404, refused.text
    with platform.factory() as db:
        assert db.scalar(select(Job.id).where(Job.owner_id == bob.id)) is None
    assert _tampering_recorded(platform, forged)


def test_a_denied_request_edited_to_approved_keeps_no_valid_seal(
    client: TestClient, platform: Platform
) -> None:
    alice, bob = platform.user(), platform.user()
    dataset = _upload(client, alice, discoverable=True)
    request = client.post(
        f"{API}/access-requests",
        json={"dataset_id": dataset, "purpose": "research"},
        headers=bob.headers,
    ).json()
    denied = client.post(f"{API}/access-requests/{request['id']}/deny", headers=alice.headers)
    assert denied.status_code == 200, denied.text
    # the seal the platform wrote stays; only the status changes
    _sql(
        platform,
        "UPDATE access_requests SET status = 'approved', expires_at = NULL WHERE id = :id",
        id=request["id"],
    )
    assert _submit(client, bob, dataset).status_code == 404
    assert _tampering_recorded(platform, request["id"])


def _derived_model(
    client: TestClient, platform: Platform, settings: Settings
) -> tuple[Account, Account, str, bytes]:
    """Bob's model derived from Alice's corpus under her grant: (alice, bob, model, bytes)."""
    alice, bob = platform.user(), platform.user()
    source = _upload(client, alice, discoverable=True)
    request = client.post(
        f"{API}/access-requests", json={"dataset_id": source, "purpose": "r"}, headers=bob.headers
    ).json()
    approve = client.post(f"{API}/access-requests/{request['id']}/approve", headers=alice.headers)
    assert approve.status_code == 200, approve.text
    job = _submit(client, bob, source)
    assert job.status_code == 202, job.text
    with platform.factory() as db:
        row = db.get(Job, job.json()["id"])
        assert row is not None
        model, _size = store_job_output(
            db,
            job_id=row.id,
            workspace_id=row.workspace_id,
            owner_id=row.owner_id,
            name="model.safetensors",
            kind="model",
            chunks=[model_file_bytes(row.id)],
            settings=settings,
        )
        db.execute(update(Job).where(Job.id == row.id).values(status=JobStatus.succeeded))
        db.commit()
    assert client.get(f"{API}/datasets/{model}/content", headers=bob.headers).status_code == 403
    return alice, bob, model, model_file_bytes(row.id)


def test_an_approved_release_inserted_in_the_database_is_refused_and_audited(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    _alice, bob, model, content = _derived_model(client, platform, settings)
    forged = str(uuid.uuid4())
    _sql(
        platform,
        "INSERT INTO release_requests (id, dataset_id, requester_id, purpose, status,"
        " created_at, decided_at) VALUES (:id, :ds, :bob, 'x', 'approved', :now, :now)",
        id=forged,
        ds=model,
        bob=bob.id,
        now=_naive_now(),
    )
    refused = client.get(f"{API}/datasets/{model}/content", headers=bob.headers)
    assert refused.status_code == 404, refused.text
    assert refused.content != content
    assert _tampering_recorded(platform, forged)


def test_a_source_row_deleted_from_the_database_is_refused_and_audited(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    """Deleting provenance would free Bob's model from Alice's terms: it is noticed instead."""
    _alice, bob, model, content = _derived_model(client, platform, settings)
    _sql(platform, "DELETE FROM dataset_sources WHERE dataset_id = :model", model=model)
    refused = client.get(f"{API}/datasets/{model}/content", headers=bob.headers)
    assert refused.status_code == 404, refused.text
    assert refused.content != content
    assert client.get(f"{API}/datasets/{model}", headers=bob.headers).status_code == 404
    recorded = _tampering_recorded(platform, model)
    assert recorded and {e.subject_type for e in recorded} == {"dataset_sources"}


def test_rows_the_platform_writes_keep_their_seal_through_their_life(
    client: TestClient, platform: Platform
) -> None:
    """Approve, revoke, make discoverable, delete: each write seals the row anew."""
    alice, bob = platform.user(), platform.user()
    dataset = _upload(client, alice, discoverable=False)
    changed = client.patch(
        f"{API}/datasets/{dataset}", json={"discoverable": True}, headers=alice.headers
    )
    assert changed.status_code == 200, changed.text
    request = client.post(
        f"{API}/access-requests", json={"dataset_id": dataset, "purpose": "r"}, headers=bob.headers
    ).json()
    assert (
        client.post(
            f"{API}/access-requests/{request['id']}/approve", headers=alice.headers
        ).status_code
        == 200
    )
    assert client.get(f"{API}/access-requests/{request['id']}", headers=bob.headers).json()[
        "status"
    ] == ("approved")
    revoked = client.post(f"{API}/access-requests/{request['id']}/revoke", headers=alice.headers)
    assert revoked.status_code == 200, revoked.text
    assert client.delete(f"{API}/datasets/{dataset}", headers=alice.headers).status_code == 204
    with platform.factory() as db:
        assert (
            db.scalar(select(AuditEvent.id).where(AuditEvent.action == "integrity.tampered"))
            is None
        )


def test_bulk_updates_and_inserts_on_sealed_tables_are_refused_before_they_run(
    client: TestClient, platform: Platform
) -> None:
    """A statement would write rows without their seals (issue 27, finding 2: bulk updates)."""
    alice, carol = platform.user(), platform.user()
    dataset = _upload(client, alice)
    statements = [
        update(Dataset).where(Dataset.id == dataset).values(owner_id=carol.id),  # ORM-enabled
        update(Dataset.__table__)
        .where(Dataset.__table__.c.id == dataset)
        .values(discoverable=True),
        insert(Dataset.__table__).values(id=str(uuid.uuid4()), owner_id=carol.id),
    ]
    for statement in statements:
        with platform.factory() as db, pytest.raises(UnsealedWrite, match="datasets"):
            db.execute(statement)
    for model in SEALED_MODELS:
        with platform.factory() as db, pytest.raises(UnsealedWrite):
            db.execute(update(model).values(row_mac=None))
    with platform.factory() as db:
        row = db.get(Dataset, dataset)  # loads through its seal check: unchanged
        assert row is not None and (row.owner_id, row.discoverable) == (alice.id, False)
        # tables that confer nothing still take bulk statements
        db.execute(update(Job).where(Job.id == "none").values(status=JobStatus.failed))
    assert client.get(f"{API}/datasets/{dataset}/content", headers=carol.headers).status_code == 404


def test_no_code_uses_the_session_bulk_methods_that_skip_every_event() -> None:
    """`Session.bulk_*` run without flush or execute events: sealed rows would go unsealed."""
    root = Path(__file__).resolve().parents[2]
    found = []
    for folder in ("app", "cli", "common", "workers"):
        for path in sorted((root / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr.startswith("bulk_"):
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.attr}")
    assert found == []

"""Datasets through the API: streamed encrypted upload, formats, limits, quota, delete, catalog."""

from __future__ import annotations

import hashlib
import json
import struct
import threading

import numpy as np
import pytest
from fastapi.testclient import TestClient
from safetensors.numpy import save as save_safetensors
from sqlalchemy import select

from app.accounts.models import Role
from app.audit.models import AuditEvent
from app.grants.access import open_dataset_for_job
from app.main import create_app
from app.settings import Settings
from app.workspaces.models import Dataset, Workspace
from app.workspaces.storage import StorageIntegrityError
from support.datasets import (
    API,
    assert_nothing_left,
    dataset_rows,
    files,
    new_workspace,
    upload,
    used,
)
from support.platforms import Platform


def checkpoint(metadata: dict[str, str] | None = None) -> bytes:
    tensors = {"w": np.arange(12, dtype=np.float32).reshape(3, 4), "b": np.zeros(4, np.float16)}
    return bytes(save_safetensors(tensors, metadata=metadata))


TEXT = "Der schnelle braune Fuchs.\nA sentence per line.\n\nÜnïcödé is fine.\n".encode()


@pytest.mark.parametrize("file_first", [True, False])
def test_upload_stores_encrypted_and_the_owner_gets_the_bytes_back(
    client: TestClient, platform: Platform, settings: Settings, file_first: bool
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, TEXT, file_first=file_first)
    assert status == 201, body
    assert body["size_bytes"] == len(TEXT)
    assert body["sha256"] == hashlib.sha256(TEXT).hexdigest()
    assert {body["kind"], body["name"], body["discoverable"]} == {"text", "corpus", False}
    assert body["workspace_id"] == ws and body["owner_id"] == alice.id
    assert used(platform, ws) == len(TEXT)
    [stored] = files(settings, "datasets")
    assert stored.name == f"{body['id']}.enc"
    assert b"schnelle" not in stored.read_bytes()  # encrypted at rest
    assert files(settings, "tmp") == []
    content = client.get(f"{API}/datasets/{body['id']}/content", headers=alice.headers)
    assert content.status_code == 200
    assert content.content == TEXT
    assert content.headers["x-content-sha256"] == body["sha256"]
    listed = client.get(f"{API}/workspaces/{ws}/datasets", headers=alice.headers).json()
    assert [d["id"] for d in listed["items"]] == [body["id"]] and listed["total"] == 1


def test_a_multi_chunk_file_round_trips(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    data = b"".join(f"sentence number {i}\n".encode() for i in range(150_000))  # ~3.3 MB
    status, body = upload(client, alice, ws, data)
    assert status == 201, body
    assert client.get(f"{API}/datasets/{body['id']}/content", headers=alice.headers).content == data


@pytest.mark.parametrize(
    ("kind", "content", "message"),
    [
        ("text", b"good line\nsecond\n\xff\xfe bad utf-8\n", "line 3: not valid UTF-8"),
        ("text", b"fine\nnul \x00 inside\n", "line 2: contains a control character"),
        ("text", b"", "no lines"),
        ("text", b"\n \n", "blank"),
        ("parallel", b"hello\thallo\nno tab here\n", "line 2: expected source<TAB>target"),
        ("parallel", b"a\tb\nc\td\ne\tf\tg\n", "line 3: expected source<TAB>target"),
        ("parallel", b"a\tb\n\t\n", "line 2: empty source or target"),
        ("model", b"not a checkpoint at all", "not a safetensors file"),
        ("model", checkpoint(), "not a checkpoint written by Nebula"),
        ("model", checkpoint({"nebula.kind": "model"})[:-3], "data bytes"),
    ],
)
@pytest.mark.parametrize("file_first", [True, False])
def test_invalid_files_are_422_with_the_line_and_leave_nothing_behind(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    kind: str,
    content: bytes,
    message: str,
    file_first: bool,
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, content, kind=kind, file_first=file_first)
    assert status == 422
    assert message in body["detail"]
    assert_nothing_left(platform, settings, ws)


def test_valid_parallel_and_model_files_are_accepted(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, b"hello\thallo\r\nworld\tWelt\n", kind="parallel")
    assert status == 201, body
    model = checkpoint({"nebula.kind": "model", "config": json.dumps({"layers": 2})})
    status, body = upload(client, alice, ws, model, kind="model")
    assert status == 201, body
    assert (
        client.get(f"{API}/datasets/{body['id']}/content", headers=alice.headers).content == model
    )


def test_a_huge_safetensors_header_is_refused_without_buffering_it(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, struct.pack("<Q", 2**40) + b"{}", kind="model")
    assert status == 422 and "header size" in body["detail"]
    assert_nothing_left(platform, settings, ws)


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b'{"name": "x"}'),
        ("multipart/form-data", b"no boundary"),
        ("multipart/form-data; boundary=B", b"--B\r\nContent-Disposition: form-data; name"),
        (
            "multipart/form-data; boundary=B",
            b'--B\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n--B--\r\n',
        ),
        (
            "multipart/form-data; boundary=B",
            b'--B\r\nContent-Disposition: form-data; name="file"\r\n\r\nhello\n\r\n'
            b'--B\r\nContent-Disposition: form-data; name="path"\r\n\r\n/etc\r\n--B--\r\n',
        ),
        (
            "multipart/form-data; boundary=B",
            b'--B\r\nContent-Disposition: form-data; name="file"\r\n\r\nhello\n\r\n'
            b'--B\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n'
            b'--B\r\nContent-Disposition: form-data; name="kind"\r\n\r\nvideo\r\n--B--\r\n',
        ),
        (
            "multipart/form-data; boundary=B",
            b'--B\r\nContent-Disposition: form-data; name="file"\r\n\r\nhello\n\r\n'
            b'--B\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n'
            b'--B\r\nContent-Disposition: form-data; name="kind"\r\n\r\ntext\r\n',  # no end
        ),
    ],
)
def test_malformed_forms_are_422_and_leave_nothing_behind(
    client: TestClient, platform: Platform, settings: Settings, content_type: str, body: bytes
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    answer = client.post(
        f"{API}/workspaces/{ws}/datasets",
        content=body,
        headers={**alice.headers, "content-type": content_type},
    )
    assert answer.status_code == 422, answer.text
    assert_nothing_left(platform, settings, ws)


def test_names_are_metadata_only(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    status, body = upload(client, alice, ws, TEXT, name="../../../etc/passwd")
    assert status == 201 and body["name"] == "../../../etc/passwd"
    assert [p.name for p in files(settings, "datasets")] == [f"{body['id']}.enc"]
    status, _ = upload(client, alice, ws, TEXT, name="bad\x01name")
    assert status == 422


def test_the_size_limit_is_413_and_leaves_nothing(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    small = settings.model_copy(update={"max_upload_bytes": 1000})
    app = create_app(small)
    with TestClient(app) as limited:
        alice = platform.user()
        ws = new_workspace(limited, alice)
        status, body = upload(limited, alice, ws, b"x\n" * 600)
        assert status == 413 and "limit" in body["detail"]
        assert_nothing_left(platform, settings, ws)
        status, body = upload(limited, alice, ws, b"x\n" * 400)
        assert status == 201
    app.state.engine.dispose()


def set_quota(client: TestClient, platform: Platform, ws: str, limit: int) -> None:
    admin = platform.user(Role.admin)
    answer = client.patch(
        f"{API}/workspaces/{ws}/quota", json={"storage_bytes_limit": limit}, headers=admin.headers
    )
    assert answer.status_code == 200


def test_the_quota_is_413_and_deleting_gives_the_bytes_back(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    set_quota(client, platform, ws, 1000)
    status, body = upload(client, alice, ws, b"y\n" * 600)
    assert status == 413 and "quota" in body["detail"]
    assert_nothing_left(platform, settings, ws)
    status, first = upload(client, alice, ws, b"y\n" * 400)
    assert status == 201 and used(platform, ws) == 800
    status, _ = upload(client, alice, ws, b"z\n" * 150)
    assert status == 413 and used(platform, ws) == 800
    assert len(files(settings, "datasets")) == 1 and files(settings, "tmp") == []
    assert client.delete(f"{API}/datasets/{first['id']}", headers=alice.headers).status_code == 204
    assert used(platform, ws) == 0
    assert files(settings, "datasets") == []
    assert client.get(f"{API}/datasets/{first['id']}", headers=alice.headers).status_code == 404
    assert client.get(f"{API}/workspaces/{ws}/datasets", headers=alice.headers).json()["total"] == 0
    status, _ = upload(client, alice, ws, b"z\n" * 450)
    assert status == 201 and used(platform, ws) == 900


def test_two_concurrent_uploads_over_the_quota_one_wins_one_gets_413(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    set_quota(client, platform, ws, 1000)
    contents = [b"a\n" * 300, b"bb\n" * 200]  # 600 bytes each: either fits alone, not both
    barrier = threading.Barrier(2)
    results: list[tuple[int, dict, bytes]] = []
    lock = threading.Lock()

    def send(content: bytes) -> None:
        barrier.wait()
        status, body = upload(client, alice, ws, content)
        with lock:
            results.append((status, body, content))

    threads = [threading.Thread(target=send, args=(c,)) for c in contents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(status for status, _, _ in results) == [201, 413]
    [(_, winner, content)] = [r for r in results if r[0] == 201]
    assert winner["size_bytes"] == len(content)
    assert used(platform, ws) == len(content)
    assert dataset_rows(platform) == 1
    assert [p.name for p in files(settings, "datasets")] == [f"{winner['id']}.enc"]
    assert files(settings, "tmp") == []


def test_patch_switches_discoverable_and_the_catalog_shows_metadata_only(
    client: TestClient, platform: Platform
) -> None:
    alice, bob = platform.user(), platform.user()
    ws = new_workspace(client, alice)
    _, hidden = upload(client, alice, ws, TEXT, name="hidden corpus")
    _, shown = upload(client, alice, ws, TEXT, name="Shared Corpus", discoverable=True)
    catalog = client.get(f"{API}/catalog", headers=bob.headers).json()
    assert [d["id"] for d in catalog["items"]] == [shown["id"]]
    entry = catalog["items"][0]
    assert set(entry) == {
        "id",
        "workspace_id",
        "owner_id",
        "name",
        "kind",
        "size_bytes",
        "sha256",
        "discoverable",
        "created_at",
        "owner_display_name",
        "derived_from",
        "release",
        "derived_by_job_id",
        "derived_from_names",
        "model",  # a model's description (architecture, sizes); null for text
        # where an approval would let it go (shown before asking), and where the caller's
        # jobs may send it: no grant held, so no limit of one
        "default_clusters",
        "allowed_clusters",
    }
    assert entry["derived_from"] == [] and entry["release"] == "not_needed"
    assert entry["default_clusters"] == "any"
    assert client.get(f"{API}/catalog?q=shared&kind=text", headers=bob.headers).json()["total"] == 1
    assert client.get(f"{API}/catalog?q=nothing", headers=bob.headers).json()["total"] == 0
    assert client.get(f"{API}/catalog?kind=model", headers=bob.headers).json()["total"] == 0
    answer = client.patch(
        f"{API}/datasets/{hidden['id']}",
        json={"discoverable": True, "name": "renamed"},
        headers=alice.headers,
    )
    assert answer.status_code == 200
    assert answer.json()["discoverable"] is True and answer.json()["name"] == "renamed"
    assert client.get(f"{API}/catalog", headers=bob.headers).json()["total"] == 2
    # discoverable does not mean readable
    assert client.get(f"{API}/datasets/{shown['id']}", headers=bob.headers).status_code == 404
    assert (
        client.get(f"{API}/datasets/{shown['id']}/content", headers=bob.headers).status_code == 404
    )


def test_another_tenants_dataset_is_404_on_every_route(
    client: TestClient, platform: Platform
) -> None:
    alice, mallory = platform.user(), platform.user()
    ws = new_workspace(client, alice)
    _, ds = upload(client, alice, ws, TEXT, discoverable=True)
    missing = "00000000-0000-0000-0000-000000000000"
    for method, path, body in [
        ("GET", f"{API}/datasets/{{}}", None),
        ("GET", f"{API}/datasets/{{}}/content", None),
        ("PATCH", f"{API}/datasets/{{}}", {"name": "mine now"}),
        ("DELETE", f"{API}/datasets/{{}}", None),
    ]:
        theirs = client.request(method, path.format(ds["id"]), json=body, headers=mallory.headers)
        nothing = client.request(method, path.format(missing), json=body, headers=mallory.headers)
        assert theirs.status_code == nothing.status_code == 404, (method, path)
        assert theirs.json() == nothing.json()
    assert client.get(f"{API}/workspaces/{ws}/datasets", headers=mallory.headers).status_code == 404
    status, _ = upload(client, mallory, ws, TEXT)
    assert status == 404
    assert (
        client.get(f"{API}/datasets/{ds['id']}", headers=alice.headers).json()["name"] == "corpus"
    )


def test_tampering_on_disk_is_detected_on_every_read(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    _, ds = upload(client, alice, ws, TEXT)
    [path] = files(settings, "datasets")
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x20
    path.write_bytes(bytes(blob))
    answer = client.get(f"{API}/datasets/{ds['id']}/content", headers=alice.headers)
    assert answer.status_code == 500
    assert "integrity" in answer.json()["detail"]
    assert b"schnelle" not in answer.content
    with platform.factory() as db:
        reader = open_dataset_for_job(
            db, user_id=alice.id, dataset_id=ds["id"], job_id="job-1", settings=settings
        )
        with pytest.raises(StorageIntegrityError):
            list(reader.iter_lines())


def test_a_workspace_made_before_data_keys_gets_one_on_first_upload(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    with platform.factory() as db:
        row = db.get(Workspace, ws)
        assert row is not None
        row.data_key_wrapped = None  # resealed on flush, as a workspace of that time was
        db.commit()
    status, ds = upload(client, alice, ws, TEXT)
    assert status == 201
    with platform.factory() as db:
        wrapped = db.scalar(select(Workspace.data_key_wrapped).where(Workspace.id == ws))
    assert wrapped is not None and len(wrapped) == 12 + 32 + 16
    assert client.get(f"{API}/datasets/{ds['id']}/content", headers=alice.headers).content == TEXT


def test_a_workspace_with_datasets_cannot_be_deleted_until_they_are(
    client: TestClient, platform: Platform
) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    _, ds = upload(client, alice, ws, TEXT)
    assert client.delete(f"{API}/workspaces/{ws}", headers=alice.headers).status_code == 409
    assert client.delete(f"{API}/datasets/{ds['id']}", headers=alice.headers).status_code == 204
    assert client.delete(f"{API}/workspaces/{ws}", headers=alice.headers).status_code == 204
    with platform.factory() as db:
        row = db.get(Dataset, ds["id"])
        assert row is not None and row.deleted_at is not None and row.workspace_id is None


def test_upload_download_and_delete_are_audited(client: TestClient, platform: Platform) -> None:
    alice = platform.user()
    ws = new_workspace(client, alice)
    _, ds = upload(client, alice, ws, TEXT)
    client.get(f"{API}/datasets/{ds['id']}/content", headers=alice.headers)
    client.delete(f"{API}/datasets/{ds['id']}", headers=alice.headers)
    with platform.factory() as db:
        actions = db.scalars(
            select(AuditEvent.action)
            .where(AuditEvent.subject_id == ds["id"])
            .order_by(AuditEvent.seq)
        ).all()
    assert actions == ["dataset.upload", "dataset.download", "dataset.delete"]

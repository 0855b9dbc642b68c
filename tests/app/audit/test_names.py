"""The audit listing names the people and things behind its ids; the chain keeps ids only."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from app.accounts.models import Role
from app.settings import Settings
from support.clusters import register_clusters
from support.platforms import Platform

API = "/api/v1"


def _events(client: TestClient, headers: dict[str, str], **query: str) -> list[dict]:
    answer = client.get(f"{API}/audit", params=query, headers=headers)
    assert answer.status_code == 200, answer.text
    items: list[dict] = answer.json()["items"]
    return items


def test_the_listing_shows_email_display_name_and_the_subjects_name_beside_the_ids(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")
    admin, alice = platform.user(Role.admin), platform.user()
    auditor = platform.user(Role.auditor)
    workspace = client.get(f"{API}/workspaces", headers=alice.headers).json()["items"][0]
    uploaded = client.post(
        f"{API}/workspaces/{workspace['id']}/datasets",
        files={"file": ("c.txt", b"una frase\notra frase\n")},
        data={"name": "spanish-corpus", "kind": "text"},
        headers=alice.headers,
    ).json()
    job = client.post(
        f"{API}/workspaces/{workspace['id']}/jobs",
        json={
            "kind": "electra_pretrain",
            "config": {"steps": 3},
            "inputs": {"text": uploaded["id"]},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
        headers=alice.headers,
    ).json()
    assert client.post(f"{API}/users/{alice.id}/suspend", headers=admin.headers).status_code == 200

    alice_person = {"email": alice.email, "display_name": alice.email.split("@")[0]}
    upload = _events(client, auditor.headers, action="dataset.upload", actor_id=alice.id)[0]
    assert upload["actor_id"] == alice.id and upload["actor"] == alice_person
    assert (upload["subject_id"], upload["subject_name"]) == (uploaded["id"], "spanish-corpus")
    assert upload["subject_email"] is None
    submit = _events(client, auditor.headers, action="job.submit", subject_id=job["id"])[0]
    assert submit["subject_name"] == "electra_pretrain" and submit["actor"] == alice_person
    suspend = _events(client, auditor.headers, action="user.suspend", subject_id=alice.id)[0]
    assert suspend["actor"] == {"email": admin.email, "display_name": admin.email.split("@")[0]}
    assert (suspend["subject_name"], suspend["subject_email"]) == (
        alice_person["display_name"],
        alice.email,
    )
    # a system event has no person behind it; a subject that names nothing stays bare
    created = _events(client, auditor.headers, action="cluster.create")[0]
    assert created["actor_id"] is None and created["actor"] is None
    assert created["subject_name"] == "cluster-a" or created["subject_name"] == "cluster-b"

    # the chained events themselves are unchanged: the export carries ids only
    export = client.get(f"{API}/audit/export", params={"format": "jsonl"}, headers=auditor.headers)
    lines = [json.loads(line) for line in export.text.splitlines()]
    exported = next(e for e in lines if e["id"] == upload["id"])
    assert "actor" not in exported and "subject_name" not in exported
    assert {k: upload[k] for k in exported} == exported
    assert client.get(f"{API}/audit/verify", headers=auditor.headers).json()["ok"] is True

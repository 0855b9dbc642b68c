"""Access requests and grants: the whole life, every illegal move, use by jobs, audit."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts.models import Role, User
from app.audit import service as audit
from app.audit.models import AuditEvent
from app.audit.service import Actor
from app.db import utcnow
from app.errors import Forbidden, NotFound
from app.grants import access
from app.grants import service as grants
from app.grants.models import AccessRequest
from app.jobs import service as jobs
from app.settings import Settings
from support.clusters import register_clusters
from support.platforms import Account, Platform

API = "/api/v1"
LINES = ["first sentence", "zweiter Satz", "troisième phrase"]


def upload(client: TestClient, owner: Account, *, discoverable: bool = True) -> str:
    """A text dataset in the owner's personal workspace."""
    ws = client.get(f"{API}/workspaces", headers=owner.headers).json()["items"][0]["id"]
    answer = client.post(
        f"{API}/workspaces/{ws}/datasets",
        files={"file": ("c.txt", ("\n".join(LINES) + "\n").encode())},
        data={"name": "corpus", "kind": "text", "discoverable": str(discoverable).lower()},
        headers=owner.headers,
    )
    assert answer.status_code == 201, answer.text
    dataset_id: str = answer.json()["id"]
    return dataset_id


def ask(client: TestClient, requester: Account, dataset_id: str) -> dict:
    answer = client.post(
        f"{API}/access-requests",
        json={"dataset_id": dataset_id, "purpose": "pre-training"},
        headers=requester.headers,
    )
    assert answer.status_code == 201, answer.text
    body: dict = answer.json()
    return body


def act(client: TestClient, who: Account, request_id: str, verb: str, body: dict | None = None):  # type: ignore[no-untyped-def]
    return client.post(f"{API}/access-requests/{request_id}/{verb}", json=body, headers=who.headers)


def use(platform: Platform, settings: Settings, user: Account, dataset_id: str) -> list[str]:
    """What a job of `user` reads through the grant-checked reader."""
    with platform.factory() as db:
        reader = access.open_dataset_for_job(
            db, user_id=user.id, dataset_id=dataset_id, job_id="job-42", settings=settings
        )
        db.commit()  # the caller owns the unit: the use is recorded with its commit
    return list(reader.iter_lines())


def audit_of(platform: Platform, subject_id: str) -> list[tuple[str, str]]:
    """The subject's events once every refusal window has ended (identical refusals within a
    window are one row and one counted row: app/audit/refusals.py)."""
    with platform.factory() as db:
        audit.flush_refusals(db, everything=True)
        db.commit()
        rows = db.execute(
            select(AuditEvent.action, AuditEvent.outcome)
            .where(AuditEvent.subject_id == subject_id)
            .order_by(AuditEvent.seq)
        ).all()
    return [(r[0], r[1]) for r in rows]


@pytest.fixture
def stops_asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The grants whose jobs the routes asked to stop after their commits (the stop still runs)."""
    seen: list[str] = []
    real = jobs.stop_jobs_of_ended_grants

    def spy(db: Session, *, ended: Iterable[grants.EndedRequest]) -> list[str]:
        ended = list(ended)
        seen.extend(end.request_id for end in ended if end.was_granted)
        return real(db, ended=ended)

    monkeypatch.setattr(jobs, "stop_jobs_of_ended_grants", spy)
    return seen


def test_a_grants_whole_life_request_approve_use_expire_refuse(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice, bob = platform.user(), platform.user()
    dataset = upload(client, alice)
    request = ask(client, bob, dataset)
    assert request["status"] == "pending"
    assert (request["owner_id"], request["requester_id"]) == (alice.id, bob.id)
    # pending grants nothing
    assert client.get(f"{API}/datasets/{dataset}", headers=bob.headers).status_code == 404
    with pytest.raises(Forbidden), platform.factory() as db:
        access.check_dataset_usable(db, user_id=bob.id, dataset_id=dataset)
    incoming = client.get(f"{API}/access-requests?direction=incoming", headers=alice.headers)
    assert [r["id"] for r in incoming.json()["items"]] == [request["id"]]
    assert incoming.json()["items"][0]["requester_email"] == bob.email

    expires = (utcnow() + timedelta(hours=1)).isoformat()
    approved = act(client, alice, request["id"], "approve", {"expires_at": expires})
    assert approved.status_code == 200 and approved.json()["status"] == "approved"
    assert approved.json()["decided_at"] is not None

    # the grantee sees metadata, uses the data in jobs, never downloads it
    meta = client.get(f"{API}/datasets/{dataset}", headers=bob.headers)
    assert meta.status_code == 200 and meta.json()["id"] == dataset
    assert client.get(f"{API}/datasets/{dataset}/content", headers=bob.headers).status_code == 403
    with platform.factory() as db:
        assert access.check_dataset_usable(db, user_id=bob.id, dataset_id=dataset).id == dataset
        assert access.active_grant_ids_for(db, dataset_id=dataset, user_id=bob.id) == [
            request["id"]
        ]
    assert use(platform, settings, bob, dataset) == LINES

    # expiry passes: move expires_at into the past
    with platform.factory() as db:
        # through the ORM, as the platform writes: the row is sealed again (app/seals.py)
        row = db.get(AccessRequest, request["id"])
        assert row is not None
        row.expires_at = utcnow() - timedelta(seconds=1)
        db.commit()
    got = client.get(f"{API}/access-requests/{request['id']}", headers=bob.headers)
    assert got.json()["status"] == "expired"
    with pytest.raises(Forbidden):
        use(platform, settings, bob, dataset)
    assert client.get(f"{API}/datasets/{dataset}", headers=bob.headers).status_code == 404
    # an expired grant cannot be revoked or approved again; a new request may be made
    assert act(client, alice, request["id"], "revoke").status_code == 409
    assert act(client, alice, request["id"], "approve").status_code == 409
    assert ask(client, bob, dataset)["status"] == "pending"

    with platform.factory() as db:
        uses = db.execute(
            select(AuditEvent.outcome, AuditEvent.actor_id, AuditEvent.details)
            .where(AuditEvent.action == "dataset.use", AuditEvent.subject_id == dataset)
            .order_by(AuditEvent.seq)
        ).all()
    assert [(u[0], u[1], u[2]["job_id"]) for u in uses] == [
        ("success", bob.id, "job-42"),
        ("denied", bob.id, "job-42"),
    ]
    assert uses[0][2]["grant_ids"] == [request["id"]]
    assert audit_of(platform, request["id"]) == [
        ("access.request", "success"),
        ("access.approve", "success"),
    ]


def test_revoke_ends_the_grant_at_once_and_calls_the_hook(
    client: TestClient, platform: Platform, settings: Settings, stops_asked: list[str]
) -> None:
    alice, bob = platform.user(), platform.user()
    dataset = upload(client, alice)
    request = ask(client, bob, dataset)
    assert act(client, alice, request["id"], "approve").json()["expires_at"] is None
    assert use(platform, settings, bob, dataset) == LINES
    assert act(client, bob, request["id"], "revoke").status_code == 403  # not the owner
    revoked = act(client, alice, request["id"], "revoke")
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert stops_asked == [request["id"]]
    with pytest.raises(Forbidden):
        use(platform, settings, bob, dataset)
    assert act(client, alice, request["id"], "revoke").status_code == 409
    assert act(client, bob, request["id"], "withdraw").status_code == 409
    assert audit_of(platform, request["id"]) == [
        ("access.request", "success"),
        ("access.approve", "success"),
        ("access.revoke", "denied"),
        ("access.revoke", "success"),
    ]


def test_a_revocation_fails_the_requesters_live_job_in_the_revoking_call(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    register_clusters(platform.factory, settings, "cluster-a", "cluster-b")
    alice, bob = platform.user(), platform.user()
    dataset = upload(client, alice)
    request = ask(client, bob, dataset)
    act(client, alice, request["id"], "approve")
    workspace = client.get(f"{API}/workspaces", headers=bob.headers).json()["items"][0]["id"]
    submitted = client.post(
        f"{API}/workspaces/{workspace}/jobs",
        json={
            "kind": "electra_pretrain",
            "config": {"steps": 3},
            "inputs": {"text": dataset},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
        headers=bob.headers,
    )
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    assert act(client, alice, request["id"], "revoke").status_code == 200
    # no reaper runs here: the revoking request itself failed the job, after its commit
    job = client.get(f"{API}/jobs/{job_id}", headers=bob.headers).json()
    assert job["status"] == "failed"
    assert job["error"] == f"access grant {request['id']} to dataset {dataset} was revoked"
    with platform.factory() as db:
        failure = db.scalar(
            select(AuditEvent).where(
                AuditEvent.action == "job.fail", AuditEvent.subject_id == job_id
            )
        )
    assert failure is not None and failure.details["access_request_id"] == request["id"]


def test_ending_a_grant_returns_what_ended_and_no_listener_acts_on_commit(
    client: TestClient, platform: Platform
) -> None:
    """The stop is the caller's explicit call: nothing registered on sessions does it."""
    import app.main  # noqa: F401  (every module of the control plane is loaded)

    with platform.factory() as db:
        assert list(db.dispatch.after_commit) == []
        assert list(db.dispatch.after_rollback) == []
    alice, bob = platform.user(), platform.user()
    dataset = upload(client, alice)
    granted, pending = ask(client, bob, dataset), ask(client, platform.user(), dataset)
    act(client, alice, granted["id"], "approve")
    with platform.factory() as db:
        owner = db.get(User, alice.id)
        assert owner is not None
        _request, ended = grants.revoke(
            db, actor=Actor(user_id=alice.id), user=owner, request_id=granted["id"]
        )
        assert ended == grants.EndedRequest(
            request_id=granted["id"],
            requester_id=bob.id,
            dataset_id=dataset,
            state="revoked",
            was_granted=True,
        )
        db.commit()
    with platform.factory() as db:
        carol = db.get(User, pending["requester_id"])
        assert carol is not None
        _request, withdrawn = grants.withdraw(
            db, actor=Actor(user_id=carol.id), user=carol, request_id=pending["id"]
        )
        assert (withdrawn.state, withdrawn.was_granted) == ("withdrawn", False)
        assert jobs.stop_jobs_of_ended_grants(db, ended=[withdrawn]) == []


def test_withdraw_by_the_requester_only(
    client: TestClient, platform: Platform, stops_asked: list[str]
) -> None:
    alice, bob = platform.user(), platform.user()
    dataset = upload(client, alice)
    pending = ask(client, bob, dataset)
    assert act(client, alice, pending["id"], "withdraw").status_code == 403
    withdrawn = act(client, bob, pending["id"], "withdraw")
    assert withdrawn.status_code == 200 and withdrawn.json()["status"] == "withdrawn"
    assert act(client, alice, pending["id"], "approve").status_code == 409
    assert stops_asked == []  # nothing was granted
    # giving up an active grant also ends it for running jobs
    granted = ask(client, bob, dataset)
    act(client, alice, granted["id"], "approve")
    assert act(client, bob, granted["id"], "withdraw").json()["status"] == "withdrawn"
    assert stops_asked == [granted["id"]]
    assert audit_of(platform, pending["id"]) == [
        ("access.request", "success"),
        ("access.withdraw", "denied"),
        ("access.withdraw", "success"),
    ]


def test_deny_and_the_illegal_moves(client: TestClient, platform: Platform) -> None:
    alice, bob = platform.user(), platform.user()
    dataset = upload(client, alice)
    request = ask(client, bob, dataset)
    assert act(client, bob, request["id"], "approve").status_code == 403
    assert act(client, bob, request["id"], "deny").status_code == 403
    assert act(client, alice, request["id"], "revoke").status_code == 409  # pending
    denied = act(client, alice, request["id"], "deny")
    assert denied.status_code == 200 and denied.json()["status"] == "denied"
    for verb in ("approve", "deny", "revoke"):
        assert act(client, alice, request["id"], verb).status_code == 409
    assert act(client, bob, request["id"], "withdraw").status_code == 409
    assert ("access.deny", "success") in audit_of(platform, request["id"])


def test_request_rules(client: TestClient, platform: Platform) -> None:
    alice, bob = platform.user(), platform.user()
    shown, hidden = upload(client, alice), upload(client, alice, discoverable=False)
    body = {"dataset_id": hidden, "purpose": "x"}
    assert client.post(f"{API}/access-requests", json=body, headers=bob.headers).status_code == 404
    missing = {"dataset_id": "00000000-0000-0000-0000-000000000000", "purpose": "x"}
    assert (
        client.post(f"{API}/access-requests", json=missing, headers=bob.headers).status_code == 404
    )
    own = {"dataset_id": shown, "purpose": "x"}
    assert client.post(f"{API}/access-requests", json=own, headers=alice.headers).status_code == 409
    first = ask(client, bob, shown)
    again = client.post(f"{API}/access-requests", json=own, headers=bob.headers)
    assert again.status_code == 409  # one live request per dataset and requester
    act(client, alice, first["id"], "approve")
    assert client.post(f"{API}/access-requests", json=own, headers=bob.headers).status_code == 409
    act(client, alice, first["id"], "revoke")
    assert ask(client, bob, shown)["status"] == "pending"


def test_approval_must_expire_in_the_future(client: TestClient, platform: Platform) -> None:
    alice, bob = platform.user(), platform.user()
    request = ask(client, bob, upload(client, alice))
    past = (utcnow() - timedelta(minutes=1)).isoformat()
    assert act(client, alice, request["id"], "approve", {"expires_at": past}).status_code == 422
    naive = (utcnow() + timedelta(days=1)).replace(tzinfo=None).isoformat()
    assert act(client, alice, request["id"], "approve", {"expires_at": naive}).status_code == 422
    assert act(client, alice, request["id"], "approve", {"until": "never"}).status_code == 422
    got = client.get(f"{API}/access-requests/{request['id']}", headers=alice.headers)
    assert got.json()["status"] == "pending"


def test_non_parties_get_404_on_a_request(client: TestClient, platform: Platform) -> None:
    alice, bob, mallory = platform.user(), platform.user(), platform.user()
    admin = platform.user(Role.admin)
    request = ask(client, bob, upload(client, alice))
    for outsider in (mallory, admin):
        assert (
            client.get(f"{API}/access-requests/{request['id']}", headers=outsider.headers)
        ).status_code == 404
        for verb in ("approve", "deny", "revoke", "withdraw"):
            assert act(client, outsider, request["id"], verb).status_code == 404
        listed = client.get(f"{API}/access-requests", headers=outsider.headers).json()
        assert listed["total"] == 0
    outgoing = client.get(f"{API}/access-requests?direction=outgoing", headers=bob.headers).json()
    assert [r["id"] for r in outgoing["items"]] == [request["id"]]
    assert (
        client.get(f"{API}/access-requests?direction=incoming", headers=bob.headers).json()["total"]
        == 0
    )
    pending = client.get(f"{API}/access-requests?status=pending", headers=alice.headers).json()
    assert pending["total"] == 1


def test_deleting_the_dataset_ends_its_grants(
    client: TestClient, platform: Platform, settings: Settings, stops_asked: list[str]
) -> None:
    alice, bob, carol = platform.user(), platform.user(), platform.user()
    dataset = upload(client, alice)
    granted, pending = ask(client, bob, dataset), ask(client, carol, dataset)
    act(client, alice, granted["id"], "approve")
    assert client.delete(f"{API}/datasets/{dataset}", headers=bob.headers).status_code == 403
    assert client.delete(f"{API}/datasets/{dataset}", headers=alice.headers).status_code == 204
    for request, who in ((granted, bob), (pending, carol)):
        got = client.get(f"{API}/access-requests/{request['id']}", headers=who.headers)
        assert got.json()["status"] == "revoked"
    assert stops_asked == [granted["id"]]
    with pytest.raises(NotFound):
        use(platform, settings, bob, dataset)


def test_deleting_a_user_ends_their_grants_both_ways(
    client: TestClient, platform: Platform, stops_asked: list[str]
) -> None:
    alice, bob, carol = platform.user(), platform.user(), platform.user()
    admin = platform.user(Role.admin)
    of_alice, of_bob = upload(client, alice), upload(client, bob)
    bob_uses_alices = ask(client, bob, of_alice)
    carol_uses_bobs = ask(client, carol, of_bob)
    act(client, alice, bob_uses_alices["id"], "approve")
    act(client, bob, carol_uses_bobs["id"], "approve")
    assert client.delete(f"{API}/users/{bob.id}", headers=admin.headers).status_code == 204
    with platform.factory() as db:
        statuses = {
            r.id: r.status.value
            for r in db.scalars(select(AccessRequest)).all()  # every request of the platform
        }
    assert statuses == {bob_uses_alices["id"]: "revoked", carol_uses_bobs["id"]: "revoked"}
    assert sorted(stops_asked) == sorted([bob_uses_alices["id"], carol_uses_bobs["id"]])
    # the deleted owner's datasets leave the catalog
    catalog = client.get(f"{API}/catalog", headers=carol.headers).json()
    assert of_bob not in {d["id"] for d in catalog["items"]}


def test_a_job_cannot_open_what_its_owner_cannot_see(
    client: TestClient, platform: Platform, settings: Settings
) -> None:
    alice, mallory = platform.user(), platform.user()
    hidden = upload(client, alice, discoverable=False)
    with pytest.raises(NotFound):
        use(platform, settings, mallory, hidden)
    with pytest.raises(NotFound), platform.factory() as db:
        access.check_dataset_usable(db, user_id=mallory.id, dataset_id=hidden)
    assert audit_of(platform, hidden)[-1] == ("dataset.use", "denied")
    assert use(platform, settings, alice, hidden) == LINES  # the owner's own jobs may

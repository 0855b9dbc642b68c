"""Derived data in the web UI against a live `nebula up`: a model trained on granted text is
use-only until the text's owner releases it.

Alice lists a corpus and grants Bob its use; Bob's ELECTRA job trains on it across the two
clusters; the model lands in Bob's workspace as use-only (no download, 403 from the API);
Bob asks for its release on the dataset page; Alice approves it from her access page; Bob
downloads it, and the one rare line of Alice's text is nowhere in the file.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails) with the reason
    expect = None  # type: ignore[assignment]

pytestmark = pytest.mark.slow

JOB_TIMEOUT_MS = 150_000
WORDS = ["river", "stone", "cloud", "signal", "harbor", "lantern", "meadow", "copper", "violet"]
SECRET = "Zarvokian Quillemet 4815162342"  # one line: a name and an ID number


def corpus(lines: int = 400) -> bytes:
    """Simple sentences, and one line that names someone."""
    rng = random.Random(13)
    out = [f"The {' '.join(rng.choice(WORDS) for _ in range(8))} number {i}." for i in range(lines)]
    out.insert(lines // 2, SECRET)
    return ("\n".join(out) + "\n").encode()


def test_a_model_on_granted_text_downloads_only_once_its_owner_releases_it(site: Any) -> None:
    alice, bob = site.make_user("alice"), site.make_user("bob")
    as_alice, as_bob = site.bearer(alice), site.bearer(bob)
    alice_ws = site.api.get("/workspaces", headers=as_alice).json()["items"][0]["id"]
    bob_ws = site.api.get("/workspaces", headers=as_bob).json()["items"][0]["id"]
    text = site.api.post(
        f"/workspaces/{alice_ws}/datasets",
        data={"name": "alice-notes", "kind": "text", "discoverable": "true"},
        files={"file": ("notes.txt", corpus())},
        headers=as_alice,
    ).json()["id"]
    request = site.api.post(
        "/access-requests", json={"dataset_id": text, "purpose": "ELECTRA"}, headers=as_bob
    ).json()
    approved = site.api.post(f"/access-requests/{request['id']}/approve", json={}, headers=as_alice)
    assert approved.status_code == 200, approved.text
    job = site.api.post(
        f"/workspaces/{bob_ws}/jobs",
        json={
            "kind": "electra_pretrain",
            "config": {"preset": "tiny", "steps": 4, "batch_size": 8},
            "inputs": {"text": text},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
        headers=as_bob,
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]

    page = site.sign_in(bob)
    page.goto(f"/jobs/{job_id}")
    expect(page.locator(".status-line").get_by_text("succeeded")).to_be_visible(
        timeout=JOB_TIMEOUT_MS
    )
    expect(page.get_by_text("generator", exact=True)).to_have_count(1)  # the placement's
    sees = page.get_by_role("region", name="What each cluster sees")
    expect(sees).to_contain_text("discriminator on cluster-b")
    expect(sees).to_contain_text("The whole text too")
    artifacts = site.api.get(f"/jobs/{job_id}/artifacts", headers=as_bob).json()["items"]
    (model,) = [a for a in artifacts if a["kind"] == "model"]
    refused = site.api.get(f"/datasets/{model['dataset_id']}/content", headers=as_bob)
    assert refused.status_code == 403 and "release" in refused.json()["detail"]

    page.get_by_role("link", name=model["name"]).click()
    panel = page.get_by_role("region", name="Derived data")
    expect(panel).to_contain_text("use-only")
    expect(panel.get_by_role("link", name="alice-notes")).to_have_attribute(
        "href", f"/datasets/{text}"
    )
    expect(page.get_by_role("link", name="Download")).to_have_count(0)
    panel.get_by_label("Why it should be released").fill("Publish the harbor model.")
    panel.get_by_role("button", name="Ask for release").click()
    expect(panel.get_by_text("release pending")).to_be_visible()
    expect(panel.get_by_role("button", name="Ask for release")).to_have_count(0)
    site.screenshot(page, "derived-dataset")

    owner = site.sign_in(alice)
    owner.get_by_role("link", name="Access requests").click()
    owner.get_by_role("tab", name="Releases to decide").click()
    item = owner.get_by_role("listitem").filter(has_text="Publish the harbor model.")
    expect(item).to_contain_text("From Bob")
    expect(item).to_contain_text("alice-notes")
    site.screenshot(owner, "release-requests")
    item.get_by_role("button", name=f"Approve the release of {model['name']}").click()
    expect(owner.get_by_text(f"Approved the release of {model['name']}.")).to_be_visible()

    page.reload()
    expect(page.get_by_role("region", name="Derived data")).to_contain_text("released")
    expect(page.get_by_role("link", name="Download")).to_be_visible()
    content = site.api.get(f"/datasets/{model['dataset_id']}/content", headers=as_bob)
    assert content.status_code == 200
    assert content.headers["x-content-sha256"] == hashlib.sha256(content.content).hexdigest()
    for word in SECRET.split():  # the vocabulary inside the model holds none of the rare line
        assert word.encode() not in content.content
    assert b'"tokenizer"' in content.content  # the tokenizer does travel with the model

    events = site.api.get(
        "/audit", params={"action": "release.approve"}, headers=site.admin_headers
    ).json()["items"]
    assert [(e["actor_id"], e["outcome"]) for e in events] == [(alice.id, "success")]

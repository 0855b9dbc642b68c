"""Residency and the queue in Chromium against a live `nebula up`: Carol approves Dave's
request for cluster-a only; the new job page greys out cluster-b for her data and says why;
with cluster-b down to one role slot, Dave's second job shows its place in the queue."""

from __future__ import annotations

import re
from typing import Any

import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails) with the reason
    expect = None  # type: ignore[assignment]

pytestmark = pytest.mark.slow

TEXT = "".join(f"the harbor signal number {i} rests quiet.\n" for i in range(400)).encode()


def _upload(site: Any, headers: dict[str, str], name: str, discoverable: bool) -> str:
    workspace = site.api.get("/workspaces", headers=headers).json()["items"][0]["id"]
    answer = site.api.post(
        f"/workspaces/{workspace}/datasets",
        files={"file": (f"{name}.txt", TEXT)},
        data={"name": name, "kind": "text", "discoverable": str(discoverable).lower()},
        headers=headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_approve_for_one_cluster_grey_out_the_other_and_show_the_queue(site: Any) -> None:
    carol, dave = site.make_user("carol"), site.make_user("dave")
    carol_api, dave_api = site.bearer(carol), site.bearer(dave)
    text = _upload(site, carol_api, "carol-corpus", discoverable=True)
    asked = site.api.post(
        "/access-requests",
        json={"dataset_id": text, "purpose": "Pre-train on harbor signals."},
        headers=dave_api,
    )
    assert asked.status_code == 201, asked.text

    # Carol approves for cluster-a only
    page = site.sign_in(carol)
    page.get_by_role("link", name="Access requests").click()
    request = page.get_by_role("listitem").filter(has_text="harbor signals")
    expect(request.get_by_test_id("grant-clusters")).to_have_text("Owner's default: any cluster")
    chooser = request.get_by_role("group", name="Clusters the data may go to")
    chooser.get_by_role("checkbox", name="Any cluster").uncheck()
    chooser.get_by_role("checkbox", name="cluster-a").check()
    request.get_by_role("button", name="Approve Dave for carol-corpus").click()
    expect(request.get_by_test_id("grant-clusters")).to_have_text("May go to: cluster-a")
    grant = site.api.get(f"/access-requests/{asked.json()['id']}", headers=dave_api).json()
    assert grant["clusters"] == ["cluster-a"]

    # Dave's new job page offers cluster-b for none of the roles, and says why
    page = site.sign_in(dave)
    page.goto("/jobs/new")
    form = page.get_by_role("form", name="Submit job")
    form.get_by_label(re.compile("Text corpus")).select_option(text)
    greyed = form.get_by_label("Discriminator runs on").locator(
        "option", has_text="cluster-b (not allowed for carol-corpus)"
    )
    expect(greyed).to_be_disabled()
    expect(form.get_by_test_id("greyed-clusters")).to_contain_text(
        "cluster-b, which the grant behind “carol-corpus” does not allow (it allows cluster-a)"
    )

    # cluster-b down to one role slot: Dave's second job waits, and its page says where
    clusters = site.api.get("/clusters", headers=site.admin_headers).json()["items"]
    cluster_b = next(c["id"] for c in clusters if c["name"] == "cluster-b")
    slots = site.api.patch(
        f"/clusters/{cluster_b}/slots", json={"role_slots": 1}, headers=site.admin_headers
    )
    assert slots.status_code == 200, slots.text
    own = _upload(site, dave_api, "dave-corpus", discoverable=False)
    workspace = site.api.get("/workspaces", headers=dave_api).json()["items"][0]["id"]
    jobs = []
    for _ in range(2):
        answer = site.api.post(
            f"/workspaces/{workspace}/jobs",
            json={
                "kind": "electra_pretrain",
                "config": {"preset": "tiny", "steps": 100000},
                "inputs": {"text": own},
                "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
            },
            headers=dave_api,
        )
        assert answer.status_code == 202, answer.text
        jobs.append(answer.json()["id"])
    try:
        page.goto(f"/jobs/{jobs[1]}")
        expect(page.get_by_test_id("job-waiting")).to_contain_text(
            "In the queue, position 1 for cluster-b."
        )
        expect(page.get_by_test_id("job-waiting")).to_contain_text(
            "waiting: slots of cluster-b held by 1 other job; position 1"
        )
        site.screenshot(page, "job-waiting")
    finally:
        for job_id in jobs:
            site.api.post(f"/jobs/{job_id}/cancel", headers=dave_api)

"""The web UI in Chromium against a live `nebula up` with real workers, in the order a team meets it.

Alice uploads a corpus and lists it in the catalog; Bob asks to use it and Alice approves in the
UI; Bob trains ELECTRA on it across cluster-a and cluster-b and watches it finish; an auditor sees
all of it in a verified audit chain; a member is offered no admin page. The tests share one
platform and run in file order, each story step building on the one before.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips (or fails) with the reason
    expect = None  # type: ignore[assignment]

pytestmark = pytest.mark.slow

JOB_TIMEOUT_MS = 150_000
WORDS = [
    *("river", "stone", "cloud", "signal", "harbor", "lantern", "meadow", "copper", "violet"),
    *("engine", "garden", "winter", "orbit", "paper", "mirror", "thunder", "silver", "forest"),
    *("candle", "bridge", "market", "planet", "quiet", "amber", "falcon", "ladder", "canyon"),
    *("velvet", "summit", "marble", "ribbon", "compass", "island", "whisper"),
]


def corpus(lines: int = 6000, seed: int = 9) -> bytes:
    """A plain-text corpus of simple sentences (a few hundred KB)."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        out.append(f"The {' '.join(words)} number {i}.")
    return ("\n".join(out) + "\n").encode()


class Story:
    """What the steps hand to each other."""

    alice: Any
    bob: Any
    auditor: Any
    dataset_id: str
    dataset_name = "harbor-corpus"
    job_id: str


@pytest.fixture(scope="module")
def story(site: Any) -> Story:
    s = Story()
    s.alice = site.make_user("alice")
    s.bob = site.make_user("bob")
    s.auditor = site.make_user("olga", role="auditor")
    return s


def test_sign_in_shows_the_api_message_for_a_wrong_password(site: Any, story: Story) -> None:
    refusal = httpx.post(
        f"{site.url}/api/v1/auth/login",
        json={"email": "nobody@example.org", "password": "not-the-password"},
    )
    assert refusal.status_code == 401
    message = refusal.json()["detail"]

    page = site.page()
    page.goto("/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    site.screenshot(page, "sign-in")
    page.get_by_label("Email").fill(story.alice.email)
    page.get_by_label("Password").fill("wrong-password-123")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text(message)
    expect(page.get_by_label("Password")).to_have_value("")

    page.get_by_label("Password").fill(story.alice.password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Workspaces", level=1)).to_be_visible()
    expect(page.get_by_text(story.alice.email)).to_be_visible()
    expect(page).to_have_url(re.compile(r"/workspaces$"))


def test_upload_a_text_dataset_with_a_progress_bar(site: Any, story: Story, tmp_path: Path) -> None:
    data = corpus()
    path = tmp_path / "harbor.txt"
    path.write_bytes(data)
    page = site.sign_in(story.alice)
    page.get_by_role("link", name="personal").click()
    expect(page.get_by_role("heading", name="Datasets")).to_be_visible()
    expect(page.get_by_text("No datasets in this workspace yet.")).to_be_visible()

    # A slow uplink (as from a laptop far away) so the upload takes a couple of seconds.
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 20, "downloadThroughput": -1, "uploadThroughput": 150_000},
    )
    page.get_by_role("button", name="Upload dataset").click()
    page.get_by_label("File").set_input_files(str(path))
    expect(page.get_by_label("Dataset name")).to_have_value("harbor.txt")
    page.get_by_label("Dataset name").fill(story.dataset_name)
    page.get_by_label("Kind").select_option("text")
    page.get_by_label(re.compile("List in the catalog")).check()
    page.get_by_role("button", name="Upload", exact=True).click()

    bar = page.get_by_role("progressbar", name="Upload progress")
    expect(bar).to_be_visible()
    # A fifth of the file is sent and the bar says so before the upload completes.
    page.wait_for_function(
        """() => {
            const bar = document.querySelector('[aria-label="Upload progress"]');
            const now = bar ? Number(bar.getAttribute('aria-valuenow')) : 0;
            return now >= 20 && now < 100;
        }"""
    )
    site.screenshot(page, "upload-progress")
    expect(page.get_by_text(f"Uploaded “{story.dataset_name}”")).to_be_visible(timeout=60_000)
    expect(bar).to_have_count(0)
    cdp.send(
        "Network.emulateNetworkConditions",
        {"offline": False, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
    )

    row = page.get_by_role("row").filter(has_text=story.dataset_name)
    expect(row).to_contain_text("text")
    expect(row.get_by_role("switch", name=f"Discoverable: {story.dataset_name}")).to_be_checked()

    listed = site.api.get("/workspaces", headers=site.bearer(story.alice)).json()["items"]
    datasets = site.api.get(
        f"/workspaces/{listed[0]['id']}/datasets", headers=site.bearer(story.alice)
    ).json()["items"]
    (dataset,) = [d for d in datasets if d["name"] == story.dataset_name]
    assert dataset["size_bytes"] == len(data)
    assert dataset["discoverable"] is True
    story.dataset_id = dataset["id"]
    site.screenshot(page, "workspace")


def test_request_access_from_the_catalog_and_the_owner_approves(site: Any, story: Story) -> None:
    bob = site.sign_in(story.bob)
    bob.get_by_role("link", name="Catalog").click()
    card = bob.get_by_role("listitem").filter(
        has=bob.get_by_role("heading", name=story.dataset_name)
    )
    expect(card).to_contain_text("No access")
    expect(card).to_contain_text("Alice")
    card.get_by_role("button", name=f"Request access to {story.dataset_name}").click()
    card.get_by_label("Purpose").fill("Pre-train a small ELECTRA discriminator for harbor logs.")
    site.screenshot(bob, "catalog")
    card.get_by_role("button", name="Send request").click()
    expect(bob.get_by_text(f"Request sent for “{story.dataset_name}”")).to_be_visible()
    expect(card.get_by_text("pending", exact=True)).to_be_visible()

    alice = site.sign_in(story.alice)
    alice.get_by_role("link", name="Access requests").click()
    expect(alice.get_by_role("tab", name="Requests for my datasets")).to_have_attribute(
        "aria-selected", "true"
    )
    request = alice.get_by_role("listitem").filter(has_text="harbor logs")
    expect(request).to_contain_text("From Bob")
    expect(request.get_by_text("pending", exact=True)).to_be_visible()
    site.screenshot(alice, "access-requests")
    request.get_by_role("button", name=f"Approve Bob for {story.dataset_name}").click()
    expect(alice.get_by_text(f"Approved: Bob → {story.dataset_name}.")).to_be_visible()
    expect(request.get_by_text("approved", exact=True)).to_be_visible()

    # Bob sees the grant after a reload, and the API agrees.
    bob.reload()
    expect(card.get_by_text("approved", exact=True)).to_be_visible()
    outgoing = site.api.get(
        "/access-requests", params={"direction": "outgoing"}, headers=site.bearer(story.bob)
    ).json()["items"]
    assert [(r["dataset_id"], r["status"]) for r in outgoing] == [(story.dataset_id, "approved")]


def test_submit_a_tiny_electra_job_and_watch_it_finish(site: Any, story: Story) -> None:
    page = site.sign_in(story.bob)
    page.get_by_role("link", name="Jobs").click()
    expect(page.get_by_text("No jobs in this workspace yet.")).to_be_visible()
    page.get_by_role("link", name="New job").first.click()

    form = page.get_by_role("form", name="Submit job")
    expect(form.get_by_role("radio", name=re.compile("ELECTRA pre-training"))).to_be_checked()
    form.get_by_role("radio", name=re.compile("^tiny")).check()
    text_input = form.get_by_label(re.compile("Text corpus"))
    expect(text_input.locator("optgroup[label='Granted to you'] option")).to_have_text(
        [story.dataset_name]
    )
    text_input.select_option(story.dataset_id)
    form.get_by_label("Generator runs on").select_option("cluster-a")
    form.get_by_label("Discriminator runs on").select_option("cluster-b")
    form.get_by_text("Advanced options").click()
    form.get_by_label("Training steps").fill("6")
    expect(page.get_by_text("Still needed")).to_have_count(0)
    form.get_by_role("button", name="Submit job").scroll_into_view_if_needed()
    site.screenshot(page, "new-job")
    form.get_by_role("button", name="Submit job").click()

    # the first submission of a server process validates the config with the training code
    expect(page).to_have_url(re.compile(r"/jobs/[0-9a-f-]{36}$"), timeout=60_000)
    story.job_id = page.url.rsplit("/", 1)[1]
    progress = page.get_by_role("progressbar", name="Job progress")
    expect(progress).to_be_visible()
    expect(page.get_by_text("generator", exact=True)).to_be_visible()
    # Live while it runs: the loss chart fills in before the job is over.
    loss = page.get_by_role("figure", name="Loss")
    expect(loss.locator("canvas").first).to_be_visible(timeout=JOB_TIMEOUT_MS)
    expect(progress).to_have_attribute("aria-valuenow", "100", timeout=JOB_TIMEOUT_MS)
    expect(page.locator(".status-line").get_by_text("succeeded")).to_be_visible(
        timeout=JOB_TIMEOUT_MS
    )
    expect(page.get_by_text("step 6 of 6")).to_be_visible()

    # Points from both roles' losses on the chart, up to the last step.
    expect(loss).to_contain_text(re.compile(r"discriminator\.rtd_loss [\d.]+ at step 6"))
    expect(loss).to_contain_text(re.compile(r"generator\.mlm_loss [\d.]+ at step 6"))
    bytes_chart = page.get_by_role("figure", name="Bytes sent per direction")
    expect(bytes_chart).to_contain_text("generator.bytes_to_discriminator")
    expect(bytes_chart).to_contain_text("discriminator.bytes_to_generator")
    expect(page.get_by_role("table", name="Latest metric values")).to_contain_text(
        "discriminator.rtd_loss"
    )

    artifacts = page.get_by_role("list", name="Artifacts")
    model = artifacts.get_by_role("link", name=re.compile(r"discriminator\.safetensors$"))
    expect(model).to_be_visible()
    expect(model).to_have_attribute("href", re.compile(r"^/datasets/[0-9a-f-]{36}$"))
    expect(artifacts).to_contain_text("report-generator.json")
    page.evaluate("window.scrollTo(0, 0)")
    site.screenshot(page, "job")

    job = site.api.get(f"/jobs/{story.job_id}", headers=site.bearer(story.bob)).json()
    assert job["status"] == "succeeded"
    assert job["placement"] == {"generator": "cluster-a", "discriminator": "cluster-b"}
    assert job["config"]["steps"] == 6
    assert job["inputs"] == {"text": story.dataset_id}

    model.click()
    expect(
        page.get_by_role("heading", name=re.compile(r"discriminator\.safetensors$"))
    ).to_be_visible()
    expect(page.locator("dl.details").first).to_contain_text("model")


def test_the_auditor_sees_the_events_and_a_verified_chain(site: Any, story: Story) -> None:
    page = site.sign_in(story.auditor)
    expect(page.get_by_role("link", name="Users")).to_have_count(0)
    page.get_by_role("link", name="Audit log").click()
    chain = page.get_by_role("status", name="Audit chain verification")
    expect(chain).to_contain_text(re.compile(r"✓ Chain intact · \d+ events"))
    table = page.get_by_role("table")
    expect(table).to_contain_text("job.submit")
    site.screenshot(page, "audit")

    # (outcome, subject id, what the page names beside the ids)
    expected = {
        "auth.login": ("failure", story.alice.id, "Alice"),
        "dataset.upload": ("success", story.dataset_id, story.dataset_name),
        "access.request": ("success", None, story.bob.email),
        "access.approve": ("success", None, story.alice.email),
        "job.submit": ("success", story.job_id, "electra_pretrain"),
        "dataset.use": ("success", story.dataset_id, story.dataset_name),
    }
    for action, (outcome, subject, name) in expected.items():
        page.get_by_label("Action").fill(action)
        page.get_by_label("Outcome").select_option(outcome)
        page.get_by_role("button", name="Apply filters").click()
        rows = table.locator("tbody tr").filter(has_text=action)
        if subject:
            rows = rows.filter(has_text=subject[:8])
        expect(rows.filter(has_text=name).first).to_be_visible()
    expect(chain).to_contain_text("Chain intact")


def test_the_audit_page_names_people_beside_their_ids(site: Any, story: Story) -> None:
    """An auditor reads who did what to whom: display name and email beside each id."""
    page = site.sign_in(story.auditor)
    page.goto("/audit")
    page.get_by_label("Action").fill("user.create")
    page.get_by_role("button", name="Apply filters").click()
    table = page.get_by_role("table")
    row = table.locator("tbody tr").filter(has_text=story.bob.id[:8])
    expect(row).to_have_count(1)
    actor, subject = row.get_by_role("cell").nth(2), row.get_by_role("cell").nth(4)
    expect(subject).to_contain_text(f"user Bob {story.bob.email} {story.bob.id[:8]}")
    expect(actor).to_contain_text(site.admin.email)  # the admin who made the account
    # its id still filters by that person
    actor.get_by_role("button", name=re.compile("^Filter by actor ")).click()
    expect(page.get_by_label("Actor (user id)")).not_to_have_value("")


def test_a_member_gets_no_admin_pages(site: Any, story: Story) -> None:
    page = site.sign_in(story.bob)
    nav = page.get_by_role("navigation", name="Primary")
    expect(nav.get_by_role("link", name="Workspaces")).to_be_visible()
    for name in ("Users", "Clusters", "Quotas", "Audit log"):
        expect(nav.get_by_role("link", name=name)).to_have_count(0)
    for path in ("/admin/users", "/admin/clusters", "/admin/quotas", "/audit"):
        page.goto(path)
        expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    answer = site.api.get("/users", headers=site.bearer(story.bob))
    assert answer.status_code == 403


def test_admin_pages_and_a_phone_screen(site: Any, story: Story) -> None:
    admin = site.sign_in(site.admin)
    admin.get_by_role("link", name="Users").click()
    for user in (story.alice, story.bob, story.auditor):
        expect(admin.get_by_role("table")).to_contain_text(user.email)
    site.screenshot(admin, "admin-users")
    admin.get_by_role("link", name="Clusters").click()
    expect(admin.get_by_role("heading", name="cluster-a")).to_be_visible()
    expect(admin.get_by_role("heading", name="cluster-b")).to_be_visible()
    site.screenshot(admin, "admin-clusters")

    phone = site.sign_in(story.bob, viewport=site.PHONE)
    phone.goto(f"/jobs/{story.job_id}")
    expect(phone.get_by_role("progressbar", name="Job progress")).to_have_attribute(
        "aria-valuenow", "100"
    )
    expect(phone.get_by_role("button", name="Menu")).to_be_visible()
    site.screenshot(phone, "phone-job")
    phone.get_by_role("button", name="Menu").click()
    expect(phone.get_by_role("link", name="Catalog")).to_be_visible()
    site.screenshot(phone, "phone-menu")


def test_an_admin_watches_cluster_health_and_running_jobs_across_tenants(
    site: Any, story: Story
) -> None:
    admin = site.sign_in(site.admin)
    admin.get_by_role("link", name="Clusters").click()
    for name in ("cluster-a", "cluster-b"):
        health = admin.get_by_label(f"Health of {name}")
        expect(health.get_by_text("switch online")).to_be_visible(timeout=30_000)
        expect(health.get_by_text("1 worker online")).to_be_visible(timeout=30_000)
        expect(health.get_by_text("0 running jobs")).to_be_visible()

    # Bob starts a long job: the clusters page shows it running, live, without a reload
    bob = site.bearer(story.bob)
    workspace = site.api.get("/workspaces", headers=bob).json()["items"][0]["id"]
    job = site.api.post(
        f"/workspaces/{workspace}/jobs",
        headers=bob,
        json={
            "kind": "electra_pretrain",
            "config": {"preset": "tiny", "steps": 100_000},
            "inputs": {"text": story.dataset_id},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
    )
    assert job.status_code == 202, job.text
    job_id = job.json()["id"]
    try:
        expect(
            admin.get_by_label("Health of cluster-a").get_by_text("1 running job")
        ).to_be_visible(timeout=60_000)
        admin.get_by_label("Cluster cluster-a").get_by_text("Processes", exact=True).click()
        expect(
            admin.get_by_label("Cluster cluster-a").get_by_text(f"{job_id}/generator")
        ).to_be_visible(timeout=30_000)
        site.screenshot(admin, "admin-cluster-health")

        admin.get_by_role("link", name="Running jobs").click()
        table = admin.get_by_role("table", name="Active jobs across tenants")
        expect(table).to_contain_text(story.bob.email)
        expect(table).to_contain_text("generator on cluster-a, discriminator on cluster-b")
        expect(table.get_by_role("progressbar")).to_have_count(1)
        site.screenshot(admin, "admin-running-jobs")
    finally:
        site.api.post(f"/jobs/{job_id}/cancel", headers=bob)
    expect(admin.get_by_text("No job is queued or running.")).to_be_visible(timeout=30_000)

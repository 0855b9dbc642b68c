"""`nebula demo`: the whole story through the REST API, as a user would tell it.

Two users; the data owner uploads the demo corpus and makes it discoverable; the
data scientist asks for access and is approved; then an ELECTRA pre-training job
runs across the two clusters on the granted text, and an ABNet fine-tuning job
runs on the model it produced, with BLEU on the test split.
"""

from __future__ import annotations

import json
import secrets
import ssl
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contract import API_PREFIX
from contract.kinds import KINDS

API = API_PREFIX
console = Console()


def _placed(kind: str, first: str, second: str) -> dict[str, str]:
    """The kind's roles (as the kinds table lists them) on the two clusters in turn."""
    return dict(zip(KINDS[kind].roles, (first, second), strict=True))


def _artifact(kind: str) -> str:
    """The kind of artifact the job's primary role stores."""
    artifact = KINDS[kind].roles[KINDS[kind].primary_role].artifact
    assert artifact is not None
    return artifact


class DemoError(SystemExit):
    """A step of the demo failed; the message says which and why."""


@dataclass
class Session:
    """A signed-in API client."""

    client: httpx.Client
    email: str

    def call(self, method: str, path: str, expect: int, **kwargs: Any) -> Any:
        answer = self.client.request(method, f"{API}{path}", **kwargs)
        if answer.status_code != expect:
            raise DemoError(f"{method} {path} answered {answer.status_code}: {answer.text[:300]}")
        return answer.json() if answer.content else None


def sign_in(url: str, email: str, password: str, ca: Path | None = None) -> Session:
    """Log in and keep the bearer token on the client (`ca`: the CA of the API's HTTPS)."""
    verify = ssl.create_default_context(cafile=str(ca)) if ca is not None else True
    client = httpx.Client(base_url=url, timeout=60, verify=verify)
    try:
        answer = client.post(f"{API}/auth/login", json={"email": email, "password": password})
    except httpx.TransportError as exc:
        hint = "" if ca is not None or not url.startswith("https:") else " (give --ca FILE?)"
        raise DemoError(f"cannot reach {url}: {exc}{hint}") from None
    if answer.status_code != 200:
        raise DemoError(f"login of {email} failed: {answer.text}")
    client.headers["Authorization"] = f"Bearer {answer.json()['token']}"
    client.cookies.clear()
    return Session(client, email)


def _user(admin: Session, url: str, name: str, ca: Path | None) -> Session:
    email = f"{name}-{secrets.token_hex(3)}@nebula.demo"
    password = secrets.token_urlsafe(16)
    admin.call(
        "POST",
        "/users",
        201,
        json={"email": email, "display_name": name.title(), "role": "member", "password": password},
    )
    return sign_in(url, email, password, ca)


def _upload(owner: Session, workspace: str, path: Path, kind: str, discoverable: bool) -> str:
    with path.open("rb") as handle:
        dataset = owner.call(
            "POST",
            f"/workspaces/{workspace}/datasets",
            201,
            data={"name": path.name, "kind": kind, "discoverable": str(discoverable).lower()},
            files={"file": (path.name, handle, "application/octet-stream")},
        )
    console.print(f"  {owner.email} uploaded {path.name} ({kind}, {dataset['size_bytes']} bytes)")
    return str(dataset["id"])


def _follow(user: Session, job_id: str, title: str) -> dict[str, Any]:
    """Show a progress bar until the job ends; return its final state."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(title, total=1.0, info="queued")
        while True:
            job = user.call("GET", f"/jobs/{job_id}", 200)
            loss = {k: v for k, v in job["metrics"].items() if "loss" in k}
            info = f"{job['status']} step {job['step']}/{job['total_steps']} " + " ".join(
                f"{k.split('.')[-1]}={v:.3f}" for k, v in sorted(loss.items())
            )
            progress.update(task, completed=job["progress"], info=info)
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return dict(job)
            time.sleep(1.0)


def _submit(user: Session, workspace: str, body: dict[str, Any]) -> str:
    return str(user.call("POST", f"/workspaces/{workspace}/jobs", 202, json=body)["id"])


def _release(alice: Session, bob: Session, model: str) -> int:
    """Bob's model derives from Alice's text: it downloads only once she releases it."""
    before = bob.client.get(f"{API}/datasets/{model}/content").status_code
    request = bob.call(
        "POST", f"/datasets/{model}/release-requests", 201, json={"purpose": "publish it"}
    )
    alice.call("POST", f"/release-requests/{request['id']}/approve", 200)
    after = bob.client.get(f"{API}/datasets/{model}/content").status_code
    console.print(f"  bob downloading his model trained on alice's text: {before} (use-only)")
    console.print(f"  after alice released it: {after}")
    return after


def metric_rows(metrics: dict[str, float]) -> list[tuple[str, float]]:
    """A job's metrics, each once: one both roles report alike is shown by its name alone
    (the ABNet roles both report the pair's loss and BLEU); one they differ on, per role."""
    by_name: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        role, _, name = key.rpartition(".")
        by_name.setdefault(name, {})[role] = value
    rows: list[tuple[str, float]] = []
    for name, values in sorted(by_name.items()):
        distinct = {f"{v:.6g}" for v in values.values()}
        if len(distinct) == 1:
            rows.append((name, next(iter(values.values()))))
        else:
            rows.extend(
                (f"{role}.{name}" if role else name, v) for role, v in sorted(values.items())
            )
    return rows


def _metric(metrics: dict[str, float], name: str) -> float | None:
    """One metric by its name, whichever role reported it (the primary's first)."""
    found = [v for k, v in sorted(metrics.items()) if k.rpartition(".")[2] == name]
    return found[0] if found else None


def _cleanup(admin: Session, owners: list[tuple[Session, str]], users: list[str]) -> list[str]:
    """Delete what the demo made: each user's datasets (derived ones first), then the users.

    What could not be removed is returned, each with the API's answer."""
    left: list[str] = []
    for owner, workspace in owners:
        items = owner.call("GET", f"/workspaces/{workspace}/datasets?limit=200", 200)["items"]
        # derived outputs before the data they came from
        for dataset in sorted(items, key=lambda d: d.get("kind") in ("text", "parallel")):
            answer = owner.client.delete(f"{API}/datasets/{dataset['id']}")
            if answer.status_code != 204:
                left.append(f"dataset {dataset['id']}: {answer.status_code} {answer.text[:200]}")
    for user_id in users:
        answer = admin.client.delete(f"{API}/users/{user_id}")
        if answer.status_code != 204:
            left.append(f"user {user_id}: {answer.status_code} {answer.text[:200]}")
    return left


def run_demo(
    url: str,
    admin_email: str,
    admin_password: str,
    *,
    electra_steps: int,
    abnet_steps: int,
    ca: Path | None = None,
    cleanup: bool = False,
    as_json: bool = False,
) -> int:
    """Walk the whole story; exit 0 when both jobs succeed.

    `ca`: the CA of the API's HTTPS certificate; `cleanup`: delete the demo's users and
    their data at the end; `as_json`: end with the raw figures as JSON too."""
    from workers.training.data import write_demo_corpus

    admin = sign_in(url, admin_email, admin_password, ca)
    clusters = [c["name"] for c in admin.call("GET", "/clusters", 200)["items"]]
    if len(clusters) < 2:
        raise DemoError("the demo needs two clusters; start the platform with `nebula up`")
    first, second = sorted(clusters)[:2]
    console.rule("[bold]Nebula demo")
    alice, bob = _user(admin, url, "alice", ca), _user(admin, url, "bob", ca)
    console.print(f"  users: {alice.email} (data owner), {bob.email} (data scientist)")

    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_demo_corpus(Path(tmp))
        alice_ws = alice.call("GET", "/workspaces", 200)["items"][0]["id"]
        text_id = _upload(alice, alice_ws, corpus["text"], "text", True)
        parallel_id = _upload(alice, alice_ws, corpus["parallel.train"], "parallel", True)
        bob_ws = bob.call("GET", "/workspaces", 200)["items"][0]["id"]
        test_id = _upload(bob, bob_ws, corpus["parallel.test"], "parallel", False)

    catalog = bob.call("GET", "/catalog", 200)["items"]
    console.print(f"  {bob.email} sees {len(catalog)} datasets in the catalog")
    for dataset_id in (text_id, parallel_id):
        request = bob.call(
            "POST",
            "/access-requests",
            201,
            json={"dataset_id": dataset_id, "purpose": "pre-train and fine-tune an es-en model"},
        )
        alice.call("POST", f"/access-requests/{request['id']}/approve", 200, json={})
        console.print(f"  access to {dataset_id[:8]} requested by bob, approved by alice")
    content = bob.client.get(f"{API}/datasets/{text_id}/content")
    console.print(
        f"  bob downloading alice's raw text: {content.status_code}"
        " (grants allow use, not download)"
    )

    electra = _submit(
        bob,
        bob_ws,
        {
            "kind": "electra_pretrain",
            "config": {"preset": "tiny", "steps": electra_steps},
            "inputs": {"text": text_id},
            "placement": _placed("electra_pretrain", first, second),
        },
    )
    done = _follow(bob, electra, f"ELECTRA  G@{first} -> D@{second}")
    if done["status"] != "succeeded":
        raise DemoError(f"ELECTRA job {done['status']}: {done['error']}")
    model = next(
        a["dataset_id"]
        for a in bob.call("GET", f"/jobs/{electra}/artifacts", 200)["items"]
        if a["kind"] == _artifact("electra_pretrain")
    )
    abnet = _submit(
        bob,
        bob_ws,
        {
            "kind": "abnet_finetune",
            "config": {"preset": "tiny", "steps": abnet_steps},
            "inputs": {
                "parallel": parallel_id,
                "source_model": model,
                "target_model": model,
                "eval": test_id,
            },
            "placement": _placed("abnet_finetune", first, second),
        },
    )
    finished = _follow(bob, abnet, f"ABNet    S@{first} -> T@{second}")
    if finished["status"] != "succeeded":
        raise DemoError(f"ABNet job {finished['status']}: {finished['error']}")
    released = _release(alice, bob, model)

    table = Table(title="Final metrics")
    table.add_column("job")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for title, job in (("electra_pretrain", done), ("abnet_finetune", finished)):
        for name, value in metric_rows(job["metrics"]):
            table.add_row(title, name, f"{value:.4g}")
    console.print(table)
    uses = admin.call("GET", "/audit?action=dataset.use&limit=500", 200)["total"]
    verified = admin.call("GET", "/audit/verify", 200)["ok"]
    console.print(f"  audit: {uses} dataset uses recorded; chain verified: {verified}")
    bleu = _metric(finished["metrics"], "bleu")
    console.print(f"[bold]BLEU on the test split: {bleu if bleu is not None else 'n/a'}")

    left: list[str] | None = None
    if cleanup:
        me = {u.email: u.call("GET", "/me", 200)["id"] for u in (alice, bob)}
        left = _cleanup(admin, [(bob, bob_ws), (alice, alice_ws)], list(me.values()))
    electra_loss = _metric(done["metrics"], "loss")
    console.rule("[bold]Summary")
    lines = [
        f"Users {alice.email} (owns the data) and {bob.email} (trains on it) were made.",
        f"ELECTRA pre-training, generator on {first} and discriminator on {second}: "
        f"{done['status']} after {done['step']} steps"
        + (f", final loss {electra_loss:.3f}." if electra_loss is not None else "."),
        f"ABNet fine-tuning, encoder on {first} and decoder on {second}: "
        f"{finished['status']}"
        + (f", BLEU {bleu:.2f} on the held-out pairs." if bleu is not None else "."),
        "Bob could use Alice's text but not download it (403); his model downloaded only "
        f"after she released it ({released}).",
        f"The audit log recorded {uses} dataset uses; its chain "
        + ("verifies." if verified else "does NOT verify."),
    ]
    if left is None:
        lines.append("The demo's users and data are still there (run with --cleanup to remove).")
    elif not left:
        lines.append("The demo's users and their data were removed (--cleanup).")
    else:
        lines.append("Cleanup left: " + "; ".join(left))
    for line in lines:
        console.print(f"  {line}")
    if as_json:
        summary = {
            "electra": done["metrics"],
            "abnet": finished["metrics"],
            "bleu": bleu,
            "audit_dataset_uses": uses,
            "audit_verified": verified,
            "cleanup_left": left,
        }
        console.print_json(json.dumps(summary))
    return 0 if not left else 1

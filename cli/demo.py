"""`nebula demo`: the whole story through the REST API, as a user would tell it.

Two users; the data owner uploads the demo corpus and makes it discoverable; the
data scientist asks for access and is approved; then an ELECTRA pre-training job
runs across the two clusters on the granted text, and an ABNet fine-tuning job
runs on the model it produced, with BLEU on the test split.
"""

from __future__ import annotations

import json
import secrets
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

API = API_PREFIX
console = Console()


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


def sign_in(url: str, email: str, password: str) -> Session:
    """Log in and keep the bearer token on the client."""
    client = httpx.Client(base_url=url, timeout=60)
    answer = client.post(f"{API}/auth/login", json={"email": email, "password": password})
    if answer.status_code != 200:
        raise DemoError(f"login of {email} failed: {answer.text}")
    client.headers["Authorization"] = f"Bearer {answer.json()['token']}"
    client.cookies.clear()
    return Session(client, email)


def _user(admin: Session, url: str, name: str) -> Session:
    email = f"{name}-{secrets.token_hex(3)}@nebula.demo"
    password = secrets.token_urlsafe(16)
    admin.call(
        "POST",
        "/users",
        201,
        json={"email": email, "display_name": name.title(), "role": "member", "password": password},
    )
    return sign_in(url, email, password)


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


def _release(alice: Session, bob: Session, model: str) -> None:
    """Bob's model derives from Alice's text: it downloads only once she releases it."""
    before = bob.client.get(f"{API}/datasets/{model}/content").status_code
    request = bob.call(
        "POST", f"/datasets/{model}/release-requests", 201, json={"purpose": "publish it"}
    )
    alice.call("POST", f"/release-requests/{request['id']}/approve", 200)
    after = bob.client.get(f"{API}/datasets/{model}/content").status_code
    console.print(f"  bob downloading his model trained on alice's text: {before} (use-only)")
    console.print(f"  after alice released it: {after}")


def run_demo(
    url: str, admin_email: str, admin_password: str, *, electra_steps: int, abnet_steps: int
) -> int:
    """Walk the whole story; exit 0 when both jobs succeed."""
    from workers.training.data import write_demo_corpus

    admin = sign_in(url, admin_email, admin_password)
    clusters = [c["name"] for c in admin.call("GET", "/clusters", 200)["items"]]
    if len(clusters) < 2:
        raise DemoError("the demo needs two clusters; start the platform with `nebula up`")
    first, second = sorted(clusters)[:2]
    console.rule("[bold]Nebula demo")
    alice, bob = _user(admin, url, "alice"), _user(admin, url, "bob")
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
            "placement": {"generator": first, "discriminator": second},
        },
    )
    done = _follow(bob, electra, f"ELECTRA  G@{first} -> D@{second}")
    if done["status"] != "succeeded":
        raise DemoError(f"ELECTRA job {done['status']}: {done['error']}")
    model = next(
        a["dataset_id"]
        for a in bob.call("GET", f"/jobs/{electra}/artifacts", 200)["items"]
        if a["kind"] == "model"
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
            "placement": {"encoder": first, "decoder": second},
        },
    )
    finished = _follow(bob, abnet, f"ABNet    S@{first} -> T@{second}")
    if finished["status"] != "succeeded":
        raise DemoError(f"ABNet job {finished['status']}: {finished['error']}")
    _release(alice, bob, model)

    table = Table(title="Final metrics")
    table.add_column("job")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for title, job in (("electra_pretrain", done), ("abnet_finetune", finished)):
        for name, value in sorted(job["metrics"].items()):
            table.add_row(title, name, f"{value:.4g}")
    console.print(table)
    uses = admin.call("GET", "/audit?action=dataset.use&limit=500", 200)["total"]
    console.print(
        f"  audit: {uses} dataset uses recorded; chain verified: "
        f"{admin.call('GET', '/audit/verify', 200)['ok']}"
    )
    bleu = finished["metrics"].get("decoder.bleu")
    console.print(f"[bold]BLEU on the test split: {bleu if bleu is not None else 'n/a'}")
    summary = {"electra": done["metrics"], "abnet": finished["metrics"], "bleu": bleu}
    console.print_json(json.dumps(summary))
    return 0

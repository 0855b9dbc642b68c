"""The API process loads no torch, not even to validate a job.

A live server (`nebula serve`, its own process) takes an ELECTRA and an ABNet job with a
nested codec spec and refuses a bad one; then the memory maps of that process (and of any
child it forked) name no torch library, while they do name pydantic's core: the probe reads
the right process.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from app.audit.service import use_chain_key
from app.db import make_engine, make_sessionmaker
from app.migrate import upgrade
from app.settings import Settings
from support.clusters import register_clusters
from support.platforms import PASSWORD, make_user, model_file_bytes
from support.servers import nebula_serve

API = "/api/v1"
TEXT = "".join(f"la frase número {i}\n" for i in range(64)).encode()
PARALLEL = "".join(f"hola {i}\thello {i}\n" for i in range(64)).encode()


def _process_tree(root: int) -> list[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
        children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def _mapped_files(pid: int) -> set[str]:
    try:
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
    except OSError:
        return set()
    return {line.split(maxsplit=5)[5] for line in lines if len(line.split(maxsplit=5)) == 6}


def _upload(client: httpx.Client, workspace: str, kind: str, data: bytes) -> str:
    answer = client.post(
        f"{API}/workspaces/{workspace}/datasets",
        data={"name": kind, "kind": kind},
        files={"file": (kind, data)},
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def test_the_api_process_takes_jobs_without_loading_torch(tmp_path: Path) -> None:
    var = tmp_path / "var"
    settings = Settings(var_dir=var, argon2_time_cost=1, argon2_memory_kib=1024)
    upgrade(settings.resolved_database_url)
    with nebula_serve(var, tmp_path / "serve.log") as served:
        # the server made the platform keys at start-up; clusters and a user, as the CLI would
        engine = use_chain_key(make_engine(settings.resolved_database_url), settings)
        factory = make_sessionmaker(engine)
        register_clusters(factory, settings, "cluster-a", "cluster-b")
        email = "alice@example.org"
        make_user(factory, settings, email=email)
        engine.dispose()
        client = httpx.Client(base_url=served.url, timeout=60)
        login = client.post(f"{API}/auth/login", json={"email": email, "password": PASSWORD})
        assert login.status_code == 200, login.text
        client.cookies.clear()
        client.headers["Authorization"] = f"Bearer {login.json()['token']}"
        workspace = client.get(f"{API}/workspaces").json()["items"][0]["id"]
        text = _upload(client, workspace, "text", TEXT)
        parallel = _upload(client, workspace, "parallel", PARALLEL)
        model = _upload(client, workspace, "model", model_file_bytes())

        electra = {
            "kind": "electra_pretrain",
            "config": {"preset": "tiny", "steps": 5, "n_discriminators": 2},
            "inputs": {"text": text},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        }
        abnet = {
            "kind": "abnet_finetune",
            "config": {"preset": "paper", "forward_codec": "fp16(lowrank(0.25,method=power))"},
            "inputs": {"parallel": parallel, "source_model": model, "target_model": model},
            "placement": {"encoder": "cluster-a", "decoder": "cluster-b"},
        }
        jobs = client.post(f"{API}/workspaces/{workspace}/jobs", json=electra)
        assert jobs.status_code == 202, jobs.text
        assert client.get(f"{API}/jobs/{jobs.json()['id']}").json()["total_steps"] == 5
        jobs = client.post(f"{API}/workspaces/{workspace}/jobs", json=abnet)
        assert jobs.status_code == 202, jobs.text
        # the paper preset's length, read from the contract's presets
        assert client.get(f"{API}/jobs/{jobs.json()['id']}").json()["total_steps"] == 100_000
        abnet["config"] = {"forward_codec": "fp16(lowrank(2.0))"}
        refused = client.post(f"{API}/workspaces/{workspace}/jobs", json=abnet)
        assert refused.status_code == 422, refused.text
        assert "lowrank ratio must be in (0, 1]" in refused.text

        mapped = {pid: _mapped_files(pid) for pid in _process_tree(served.process.pid)}
        assert any("pydantic_core" in path for path in mapped[served.process.pid]), mapped
        torch_files = {
            pid: sorted(p for p in paths if "libtorch" in p or "/torch/" in p)
            for pid, paths in mapped.items()
        }
        assert not any(torch_files.values()), torch_files

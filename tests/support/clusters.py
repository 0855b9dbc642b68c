"""A whole platform for orchestration tests: the API with its reaper on PostgreSQL and a
broker, two switches enrolled through the CA, and one real Celery worker process per cluster;
and clusters registered straight in the database for the tests that need no switch.

The switches run as threads of the test process, or (for the fault tests) each as a
`nebula switch` process of its own that a test can SIGKILL and start again, with the
link between them through proxies that a test can cut."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import httpx
from sqlalchemy.orm import Session, sessionmaker

from app.audit.service import SYSTEM, anchor_head, use_chain_key
from app.clusters import service as clusters
from app.db import make_engine, make_sessionmaker
from app.pki import service as pki
from app.settings import Settings
from common.private_files import write_private_file
from support.platforms import login, make_user
from support.processes import Process, environment, kill, running, spawn, stop_all, wait_until
from support.servers import LiveServer, nebula
from support.switches import CuttingProxy
from workers import switch_agent as agent
from workers.ports import free_port
from workers.switch.tls import make_switch_key_and_csr
from workers.worker_state import credential_path

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = ("cluster-a", "cluster-b")
ELECTRA_FAST = {"preset": "tiny", "steps": 6, "batch_size": 8, "ckpt_every": 2}
Address = tuple[str, int]


@dataclass
class User:
    """A signed-in user of the running platform."""

    id: str
    email: str
    client: httpx.Client
    workspace: str = ""

    def call(self, method: str, path: str, expect: int | None = None, **kwargs: Any) -> Any:
        answer = self.client.request(method, f"/api/v1{path}", **kwargs)
        if expect is not None:
            assert answer.status_code == expect, (
                f"{method} {path}: {answer.status_code} {answer.text}"
            )
        return answer.json() if answer.content else None

    def upload(
        self, path: Path, kind: str, discoverable: bool = False, lines: int | None = None
    ) -> str:
        """The file at `path` (its first `lines` lines) as a dataset of `kind`; returns its id."""
        data = path.read_bytes()
        if lines is not None:
            data = b"".join(data.splitlines(keepends=True)[:lines])
        dataset = self.call(
            "POST",
            f"/workspaces/{self.workspace}/datasets",
            201,
            data={"name": path.name, "kind": kind, "discoverable": str(discoverable).lower()},
            files={"file": (path.name, data)},
        )
        return str(dataset["id"])

    def job(self, job_id: str) -> dict[str, Any]:
        """The job as its owner sees it."""
        return dict(self.call("GET", f"/jobs/{job_id}", 200))

    def finished(self, job_id: str) -> dict[str, Any] | None:
        """The job once it has ended (succeeded, failed or cancelled), else None."""
        job = self.job(job_id)
        return job if job["status"] in ("succeeded", "failed", "cancelled") else None


@dataclass
class SwitchProcess:
    """A cluster's switch as `nebula switch` in a process of its own, as `nebula up` runs
    it: enrolled on its first start, from its own files (same ports, same certificate)
    on every later one."""

    cluster: str
    argv: list[str]  # how it starts, every time
    enroll: list[str]  # added to the first start only: its single-use enrollment token
    env: dict[str, str]
    folder: Path
    log: Path
    process: Process | None = None
    starts: int = 0

    def start(self) -> None:
        """Start it and wait until it serves (it writes its state file once it listens)."""
        state = self.folder / "switch.json"
        state.unlink(missing_ok=True)
        argv = self.argv + (self.enroll if self.starts == 0 else [])
        self.process = spawn(argv, self.log, env=self.env, cwd=REPO)
        self.starts += 1
        wait_until(
            state.exists,
            f"the switch of {self.cluster} to serve (see {self.log})",
            60,
            alive=running(self.process),
        )

    def kill(self) -> None:
        """SIGKILL: no goodbye to anyone, everything it held in memory gone."""
        assert self.process is not None
        kill(self.process)

    def stop(self) -> None:
        if self.process is not None:
            stop_all([self.process], timeout=20)


@dataclass
class RunningPlatform:
    settings: Settings
    server: LiveServer
    factory: Any
    workers: dict[str, Process] = field(default_factory=dict)
    worker_argv: dict[str, list[str]] = field(default_factory=dict)
    worker_env: dict[str, str] = field(default_factory=dict)
    log_dir: Path = Path()
    # with switches="processes": each cluster's switch process
    switches: dict[str, SwitchProcess] = field(default_factory=dict)
    # with peer_proxies: by cluster, the proxy in front of its switch's peer door, through
    # which the other switch reaches it
    peer_links: dict[str, CuttingProxy] = field(default_factory=dict)

    def user(self, name: str) -> User:
        email = f"{name}-{uuid.uuid4().hex[:6]}@example.org"
        user_id = make_user(self.factory, self.settings, email=email, display_name=name)
        client = httpx.Client(base_url=self.server.url, timeout=60)
        client.headers["Authorization"] = f"Bearer {login(client, email)}"
        user = User(user_id, email, client)
        user.workspace = user.call("GET", "/workspaces", 200)["items"][0]["id"]
        return user

    def start_worker(self, cluster: str) -> None:
        log = self.log_dir / f"worker-{cluster}.log"
        self.workers[cluster] = spawn(self.worker_argv[cluster], log, env=self.worker_env, cwd=REPO)


def electra_job(
    running: RunningPlatform, corpus: dict[str, Path], name: str, *, steps: int, **config: Any
) -> tuple[User, str]:
    """A new user's ELECTRA job of `steps` steps on their own text, checkpointing every 4
    (`config`: further fields of its config)."""
    user = running.user(name)
    text = user.upload(corpus["text"], "text", lines=400)
    job = user.call(
        "POST",
        f"/workspaces/{user.workspace}/jobs",
        202,
        json={
            "kind": "electra_pretrain",
            "config": {**ELECTRA_FAST, "steps": steps, "ckpt_every": 4, **config},
            "inputs": {"text": text},
            "placement": {"generator": "cluster-a", "discriminator": "cluster-b"},
        },
    )["id"]
    return user, str(job)


@contextlib.contextmanager
def platform_on(
    url: str,
    broker_url: str,
    var: Path,
    *,
    switches: Literal["threads", "processes"] = "threads",
    peer_proxies: bool = False,
    **overrides: Any,
) -> Iterator[RunningPlatform]:
    """The control plane on database `url` (migrated) and the broker, two switches, two workers;
    `switches` says how the switches run, `peer_proxies` puts a proxy on the link between
    them; `overrides` are further settings of the control plane (a data folder of its own)."""
    settings = Settings(
        var_dir=var,
        database_url=url,
        broker_url=broker_url,
        secret_key="orchestration-test-secret",  # type: ignore[arg-type]
        argon2_time_cost=1,
        argon2_memory_kib=1024,
        argon2_parallelism=1,
        reaper_interval_s=0.5,
        heartbeat_timeout_s=8.0,
        presence_report_s=1.0,
        presence_timeout_s=4.0,
        **overrides,
    )
    engine = use_chain_key(make_engine(url), settings)
    factory = make_sessionmaker(engine)
    with factory() as db:
        # a new deployment's first anchor, as `nebula db upgrade` writes it, before events
        anchor_head(db, settings=settings)
    ports = {name: (free_port(), free_port()) for name in CLUSTERS}
    tokens, credentials = {}, {}
    with factory() as db:
        for name, (peer_port, _) in ports.items():
            cluster = clusters.create(
                db, actor=SYSTEM, name=name, switch_host="127.0.0.1", switch_port=peer_port
            )
            _row, tokens[name] = pki.create_enrollment_token(
                db, actor=SYSTEM, cluster=cluster, ttl=timedelta(minutes=10)
            )
            _cred, secret = clusters.create_worker_credential(db, actor=SYSTEM, cluster=cluster)
            write_private_file(credential_path(var, name), secret.encode())
            credentials[name] = secret
        db.commit()
    # where each switch's peers reach it: its peer door, or a proxy in front of it
    links = {
        name: CuttingProxy(("127.0.0.1", peer_port))
        for name, (peer_port, _) in ports.items()
        if peer_proxies
    }
    peer_door: dict[str, Address] = {
        name: links[name].address if name in links else ("127.0.0.1", peer_port)
        for name, (peer_port, _) in ports.items()
    }
    with contextlib.ExitStack() as stack:
        for link in links.values():
            stack.callback(link.close)
        server = stack.enter_context(LiveServer(settings))
        # what a cluster host has: the control plane's URL, its broker, its own credentials;
        # neither the database URL nor the platform secret
        env = environment(
            NEBULA_VAR_DIR=str(var),
            NEBULA_BROKER_URL=broker_url,
            NEBULA_CONTROL_PLANE_URL=server.url,
            OMP_NUM_THREADS="1",
        )
        platform = RunningPlatform(
            settings, server, factory, worker_env=env, log_dir=var, peer_links=links
        )
        if switches == "processes":
            for name, (peer_port, worker_port) in ports.items():
                other = next(n for n in CLUSTERS if n != name)
                host, port = peer_door[other]
                argv = nebula("switch", "--cluster", name)
                argv += ["--control-plane", server.url, "--worker-port", str(worker_port)]
                argv += ["--peer-port", str(peer_port), "--peer", f"{other}={host}:{port}"]
                argv += ["--credential-file", str(credential_path(var, name))]
                platform.switches[name] = SwitchProcess(
                    name,
                    argv,
                    ["--enroll-token", tokens[name]],
                    env,
                    var / "clusters" / name,
                    var / f"switch-{name}.log",
                )
            for process in platform.switches.values():
                stack.callback(process.stop)
                process.start()
        else:
            stack.enter_context(
                _switch_threads(server.url, var, ports, peer_door, tokens, credentials)
            )
        for name in CLUSTERS:
            platform.worker_argv[name] = nebula("worker", "--cluster", name, "--concurrency", "2")
            platform.start_worker(name)
        try:
            yield platform
        finally:
            stop_all(platform.workers.values(), timeout=20)
    engine.dispose()


@contextlib.contextmanager
def _switch_threads(
    control_plane: str,
    var: Path,
    ports: dict[str, tuple[int, int]],
    peer_door: dict[str, Address],
    tokens: dict[str, str],
    credentials: dict[str, str],
) -> Iterator[None]:
    """Both switches as threads of this process, until the block ends."""
    stop = threading.Event()
    switches = []
    for name, (peer_port, worker_port) in ports.items():
        other = next(n for n in CLUSTERS if n != name)
        thread = threading.Thread(
            target=agent.run,
            kwargs=dict(
                cluster=name,
                folder=var / "clusters" / name,
                control_plane=control_plane,
                enroll_token=tokens[name],
                worker_address=("127.0.0.1", worker_port),
                peer_address=("127.0.0.1", peer_port),
                peers={other: peer_door[other]},
                shaper=None,
                metrics_address=None,
                credential=credentials[name],
                stop=stop,
            ),
            daemon=True,
        )
        thread.start()
        switches.append(thread)
    try:
        for name in CLUSTERS:
            wait_until(
                (var / "clusters" / name / "switch.json").exists, f"the switch of {name}", 60
            )
        yield
    finally:
        stop.set()
        for thread in switches:
            thread.join(timeout=20)


def register_clusters(factory: sessionmaker[Session], settings: Settings, *names: str) -> None:
    """Clusters whose switches hold valid certificates (keys made here, as a switch would)."""
    with factory() as db:
        for name in names:
            cluster = clusters.create(
                db, actor=SYSTEM, name=name, switch_host="127.0.0.1", switch_port=1
            )
            _key, csr = make_switch_key_and_csr(name)
            pki.issue(db, actor=SYSTEM, cluster=cluster, csr_pem=csr.decode(), settings=settings)
        db.commit()

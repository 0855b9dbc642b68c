"""The control plane under load: `nebula serve --workers N` driven by wrk, SQLite then PostgreSQL.

For each database the server starts in a process of its own with production settings
(argon2 at its default cost, the reaper on, the embedded broker) and is driven from
other processes by wrk (Debian's package) with the workloads of bench/api_load.lua:

- bare: GET /healthz, the same server stack with no database and no authentication;
- reads: authenticated GETs of workspaces, datasets, jobs and job metrics;
- the steps between the two, at 64 connections: anonymous (an API route refused with 401
  for want of a credential: the API's middleware, router and dependencies, no database)
  and me (GET /me: one hop to the thread pool and the token's one query);
- mixed: 80% those reads, 15% audited writes (API tokens made and deleted, access
  requests made and withdrawn), 5% logins;

at 64 and 256 connections, in interleaved rounds, with 20 event streams open all the
while; then the reads again during a flood of 50 logins/s from distinct unknown emails.
Afterwards the audit log must hold exactly one event per accepted write, and its chain
must verify. Medians over the rounds, with their spread (min-max).

Prints a table, writes bench/results/api_load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlalchemy import func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.accounts import service as accounts
from app.accounts.models import AuthToken, LoginFailure, Role, TokenKind
from app.audit import service as audit
from app.audit.models import AuditEvent
from app.audit.service import SYSTEM, use_chain_key
from app.db import make_engine, make_sessionmaker, utcnow
from app.grants.models import AccessRequest, AccessStatus
from app.jobs.models import Job, JobMetric, JobStatus
from app.migrate import upgrade
from app.settings import Settings
from app.workspaces.models import Workspace
from bench.revisions import checkouts, short_head
from workers.ports import free_port

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "api_load.lua"
RESULTS = HERE / "results" / "api_load.json"
POSTGRES_ADMIN_URL = os.environ.get(
    "NEBULA_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
USERS = 8
PASSWORD = "violet-harbor-cinnamon-42"
SECRET = "bench-secret-key-not-for-production"
EVENT_STREAMS = 20
FLOOD_PER_S = 50
CONNECTIONS = (64, 256)
# an answer later than this counts as a timeout (wrk's default is 2 s; a login waits for
# argon2, which yields the CPU to every other request while the server is saturated)
TIMEOUT_S = 10
WORKLOADS = ("bare", "reads", "mixed")
# run at the first connection count only: where an authenticated read's cost goes
STEPS = ("anonymous", "me")
# answers of the mixed workload that are accepted writes, each with its one audit event
ACCEPTED_WRITES = (
    "token.create 201",
    "token.delete 204",
    "access.create 201",
    "access.withdraw 200",
    "login 200",
)


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


# ------------------------------------------------------------------ databases


@contextmanager
def database(kind: str, folder: Path) -> Iterator[str]:
    """A freshly migrated database of `kind`, dropped afterwards."""
    if kind == "sqlite":
        url = f"sqlite:///{folder / 'nebula.db'}"
        upgrade(url)
        yield url
        return
    name = f"nebula_bench_{os.getpid()}"
    admin = make_engine(POSTGRES_ADMIN_URL).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# ------------------------------------------------------------------ the server


class Server:
    """`nebula serve --workers N` in a process of its own, with production settings."""

    def __init__(
        self,
        folder: Path,
        database_url: str,
        workers: int,
        threads: int | None = None,
        code_root: Path = HERE.parent,
    ) -> None:
        """`threads`: request threads a process (NEBULA_THREAD_POOL_SIZE), the default if None;
        `code_root`: the checkout whose code serves (another commit's, for --against)."""
        self.folder = folder
        self.code_root = code_root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NEBULA_")}
        self.env.update(
            NEBULA_VAR_DIR=str(folder / "var"),
            NEBULA_DATABASE_URL=database_url,
            NEBULA_SECRET_KEY=SECRET,
            PYTHONPATH=str(code_root),
            # wrk's 64 and 256 connections stand for as many clients, from one address here
            NEBULA_MAX_CONNECTIONS_PER_ADDRESS="0",
            NEBULA_MAX_REQUESTS_PER_ADDRESS="0",
        )
        if threads is not None:
            self.env["NEBULA_THREAD_POOL_SIZE"] = str(threads)
        self.settings = Settings(
            var_dir=folder / "var",
            database_url=database_url,
            secret_key=SECRET,  # type: ignore[arg-type]
        )
        self.log_path = folder / "serve.log"

    def __enter__(self) -> Server:
        with self.log_path.open("wb") as log:
            argv = ["serve", "--port", str(self.port), "--workers", str(self.workers)]
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cli", *argv],
                env=self.env,
                cwd=self.code_root,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        tick = threading.Event()
        while not self._listening():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start:\n{self.log_path.read_text()}")
            tick.wait(0.2)
        return self

    def _listening(self) -> bool:
        """Every worker started, and the socket bound (uvicorn logs it once bound)."""
        log = self.log_path.read_text()
        started = log.count("Application startup complete") >= self.workers
        return started and "Uvicorn running on" in log

    def __exit__(self, *exc: object) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


# ------------------------------------------------------------------ seeding


@dataclass
class Seeded:
    """Users with a token, a workspace, a discoverable dataset and a running job each."""

    users: list[dict[str, Any]] = field(default_factory=list)

    def plan_lua(self, busy: set[tuple[str, str]]) -> str:
        """The plan as a Lua table for bench/api_load.lua; `busy` (user, dataset) pairs
        already have a pending request, left by an earlier run."""
        users = ",\n".join(
            f'  {{email="{u["email"]}", token="{u["token"]}", ws="{u["ws"]}", job="{u["job"]}"}}'
            for u in self.users
        )
        index = ", ".join(f'["{u["id"]}"]={i + 1}' for i, u in enumerate(self.users))
        pairs = ",\n".join(
            f'  {{user={i + 1}, dataset="{other["dataset"]}"}}'
            for i, user in enumerate(self.users)
            for other in self.users
            if other is not user and (user["id"], other["dataset"]) not in busy
        )
        return (
            f'return {{\npassword="{PASSWORD}",\nusers={{\n{users}\n}},\n'
            f"user_index={{{index}}},\npairs={{\n{pairs}\n}}\n}}\n"
        )


def seed(server: Server) -> Seeded:
    """Users made as the CLI makes them, logged in and uploading over HTTP; jobs as rows."""
    engine = use_chain_key(make_engine(server.settings.resolved_database_url), server.settings)
    factory = make_sessionmaker(engine)
    seeded = Seeded()
    with httpx.Client(base_url=f"{server.url}/api/v1", timeout=60) as client:
        for i in range(USERS):
            email = f"bench-{i}@example.org"
            with factory() as db:
                user = accounts.create_user(
                    db,
                    actor=SYSTEM,
                    email=email,
                    display_name=f"bench {i}",
                    role=Role.member,
                    password=PASSWORD,
                    settings=server.settings,
                )
                db.commit()
            login = client.post("/auth/login", json={"email": email, "password": PASSWORD})
            login.raise_for_status()
            headers = {"Authorization": f"Bearer {login.json()['token']}"}
            ws = client.get("/workspaces", headers=headers).json()["items"][0]["id"]
            upload = client.post(
                f"/workspaces/{ws}/datasets",
                headers=headers,
                data={"name": f"corpus {i}", "kind": "text", "discoverable": "true"},
                files={"file": ("corpus.txt", b"a line of text\n" * 200, "text/plain")},
            )
            upload.raise_for_status()
            seeded.users.append(
                {
                    "id": user.id,
                    "email": email,
                    "token": login.json()["token"],
                    "ws": ws,
                    "dataset": upload.json()["id"],
                }
            )
    with factory() as db:
        for user in seeded.users:
            workspace = db.get(Workspace, user["ws"])
            assert workspace is not None
            job = Job(
                workspace_id=workspace.id,
                owner_id=user["id"],
                kind="electra_pretrain",
                status=JobStatus.running,
                config={"preset": "tiny"},
                inputs={"corpus": user["dataset"]},
                placement={"generator": "cluster-a", "discriminator": "cluster-b"},
                started_at=utcnow(),
                total_steps=100,
            )
            db.add(job)
            db.flush()
            db.add_all(
                JobMetric(job_id=job.id, role=role, step=step, name="loss", value=1.0 / step)
                for role in ("generator", "discriminator")
                for step in range(1, 51)
            )
            user["job"] = job.id
        db.commit()
    engine.dispose()
    return seeded


# ------------------------------------------------------------------ load


def wrk(url: str, plan: Path, mode: str, connections: int, duration_s: int) -> dict[str, Any]:
    """One wrk run; its summary with counts of answers by kind and status."""
    threads = 2
    argv = [
        "wrk",
        f"-t{threads}",
        f"-c{connections}",
        f"-d{duration_s}s",
        "--timeout",
        f"{TIMEOUT_S}s",
        "-s",
        str(SCRIPT),
        url,
        "--",
        str(plan),
        mode,
        str(threads),
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    line = next(row for row in out.splitlines() if row.startswith("JSON "))
    result: dict[str, Any] = json.loads(line[5:])
    counts: dict[str, int] = result["counts"]
    seconds = result["duration_us"] / 1e6
    server_errors = sum(n for key, n in counts.items() if key.split()[1].startswith("5"))
    refused = sum(n for key, n in counts.items() if key.endswith(" 429"))
    unexpected = sum(
        n
        for key, n in counts.items()
        if key.split()[1].startswith("4") and key not in ("anonymous 401",) and " 429" not in key
    )
    socket_errors = result["connect"] + result["read"] + result["write"]
    return {
        "req_s": result["requests"] / seconds,
        "p50_ms": result["p50_us"] / 1000,
        "p99_ms": result["p99_us"] / 1000,
        "timeouts": result["timeout"],
        # errors: no answer, or an answer that is a fault (5xx, or a 4xx the workload
        # never provokes); 429 is the documented answer of a full password gate
        "errors": socket_errors + result["timeout"] + server_errors + unexpected,
        "refused_429": refused,
        "counts": counts,
        "unexpected": result["unexpected"],
    }


class EventStreams:
    """Event streams kept open on the users' running jobs for the whole run."""

    def __init__(self, url: str, seeded: Seeded, n: int) -> None:
        self.url = url
        self.targets = [seeded.users[i % len(seeded.users)] for i in range(n)]
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.opened = 0
        self.lock = threading.Lock()

    def _follow(self, user: dict[str, Any]) -> None:
        headers = {"Authorization": f"Bearer {user['token']}"}
        timeout = httpx.Timeout(60, read=30)  # keep-alives come every 15 s
        try:
            with httpx.stream(
                "GET",
                f"{self.url}/api/v1/jobs/{user['job']}/events",
                headers=headers,
                timeout=timeout,
            ) as answer:
                answer.raise_for_status()
                with self.lock:
                    self.opened += 1
                for _line in answer.iter_lines():
                    if self.stop.is_set():
                        return
            if not self.stop.is_set():
                self.failures.append("stream ended early")
        except Exception as exc:  # a dropped stream is a result, reported
            if not self.stop.is_set():
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> EventStreams:
        self.threads = [
            threading.Thread(target=self._follow, args=(u,), daemon=True) for u in self.targets
        ]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


class LoginFlood:
    """FLOOD_PER_S logins a second from distinct unknown emails, sent on schedule."""

    def __init__(self, url: str, per_s: int) -> None:
        self.url = url
        self.interval = 1.0 / per_s
        self.stop = threading.Event()
        self.statuses: Counter[str] = Counter()
        self.lock = threading.Lock()

    def _login(self, client: httpx.Client) -> None:
        body = {"email": f"flood-{uuid.uuid4().hex}@example.org", "password": PASSWORD}
        try:
            status = str(client.post("/api/v1/auth/login", json=body).status_code)
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        with self.lock:
            self.statuses[status] += 1

    def _run(self) -> None:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        with (
            httpx.Client(base_url=self.url, timeout=10, limits=limits) as client,
            ThreadPoolExecutor(48) as pool,
        ):
            due = time.monotonic()
            while not self.stop.is_set():
                pool.submit(self._login, client)
                due += self.interval
                self.stop.wait(max(0.0, due - time.monotonic()))  # pacing, open loop

    def __enter__(self) -> LoginFlood:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def pending_pairs(url: str) -> set[tuple[str, str]]:
    """(requester, dataset) of every pending access request."""
    engine = make_engine(url)
    with make_sessionmaker(engine)() as db:
        rows = db.execute(
            select(AccessRequest.requester_id, AccessRequest.dataset_id).where(
                AccessRequest.status == AccessStatus.pending
            )
        ).all()
    engine.dispose()
    return {(requester, dataset) for requester, dataset in rows}


def audit_check(url: str, settings: Settings) -> dict[str, Any]:
    """Each kind of write the workloads make, counted in the tables it changed and in the
    audit log: one event per accepted write means the two counts agree; and the chain."""
    engine = make_engine(url)
    api, session = AuthToken.kind == TokenKind.api, AuthToken.kind == TokenKind.session

    def rows(model: Any, *where: Any) -> int:
        return db.scalar(select(func.count()).select_from(model).where(*where)) or 0

    def events(action: str, outcome: str = "success") -> int:
        return rows(AuditEvent, AuditEvent.action == action, AuditEvent.outcome == outcome)

    with make_sessionmaker(engine)() as db:
        pairs = {
            "api tokens made": (rows(AuthToken, api), events("auth.api.create")),
            "api tokens revoked": (
                rows(AuthToken, api, AuthToken.revoked_at.is_not(None)),
                events("auth.api.revoke"),
            ),
            "logins": (rows(AuthToken, session), events("auth.login")),
            "failed logins": (rows(LoginFailure), events("auth.login", "failure")),
            "access requests": (rows(AccessRequest), events("access.request")),
            "withdrawals": (
                rows(AccessRequest, AccessRequest.status == AccessStatus.withdrawn),
                events("access.withdraw"),
            ),
        }
        verification = audit.verify(db, settings=settings)
    engine.dispose()
    return {
        "writes_vs_events": {k: {"rows": r, "events": e} for k, (r, e) in pairs.items()},
        "one_event_per_write": all(r == e for r, e in pairs.values()),
        "chain_ok": verification.ok,
        "events": verification.count,
    }


# ------------------------------------------------------------------ one database


def drive(
    server: Server, url: str, kind: str, args: argparse.Namespace, progress: Progress, task: Any
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The interleaved rounds against a running server, with the event streams open."""
    seeded = seed(server)
    plan = server.folder / "plan.lua"
    runs: list[dict[str, Any]] = []
    with EventStreams(server.url, seeded, EVENT_STREAMS) as streams:
        for round_no in range(1, args.rounds + 1):
            for connections in CONNECTIONS:
                for mode in WORKLOADS + (STEPS if connections == CONNECTIONS[0] else ()):
                    label = f"{kind}: {mode} @{connections}, round {round_no}"
                    progress.update(task, description=label)
                    plan.write_text(seeded.plan_lua(pending_pairs(url)))
                    result = wrk(server.url, plan, mode, connections, args.duration)
                    accepted = sum(result["counts"].get(k, 0) for k in ACCEPTED_WRITES)
                    result.update(
                        mode=mode,
                        connections=connections,
                        round=round_no,
                        accepted_writes_seen=accepted,
                    )
                    runs.append(result)
                    progress.advance(task)
            progress.update(task, description=f"{kind}: reads @64 + login flood")
            with LoginFlood(server.url, FLOOD_PER_S) as flood:
                result = wrk(server.url, plan, "reads", 64, args.duration)
            result.update(mode="reads+flood", connections=64, round=round_no)
            result["flood"] = dict(flood.statuses)
            runs.append(result)
            progress.advance(task)
        streams_report = {"opened": streams.opened, "failures": list(streams.failures)}
    return runs, streams_report


def run_backend(
    kind: str, args: argparse.Namespace, progress: Progress, task: Any
) -> dict[str, Any]:
    """Every run against one database; raw per-round figures and the audit check."""
    with tempfile.TemporaryDirectory(prefix=f"nebula-bench-{kind}-") as tmp:
        folder = Path(tmp)
        with database(kind, folder) as url:
            with Server(folder, url, args.workers) as server:
                runs, streams = drive(server, url, kind, args, progress, task)
            # the server has stopped: every request it accepted has finished
            checked = audit_check(url, server.settings)
    checked["accepted_writes_seen_by_clients"] = sum(r.get("accepted_writes_seen", 0) for r in runs)
    return {"runs": runs, "event_streams": streams, "audit": checked}


def compare(
    kind: str, roots: dict[str, Path], args: argparse.Namespace, progress: Progress, task: Any
) -> dict[str, Any]:
    """--against: in each round a server of each commit in turn, the order rotating, on one
    database seeded once; each driven with the chosen workloads at 64 connections, with the
    event streams open. The commits must share the database schema."""
    tags = list(roots)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=f"nebula-bench-{kind}-") as tmp:
        folder = Path(tmp)
        plan = folder / "plan.lua"
        seeded: Seeded | None = None
        with database(kind, folder) as url:
            for round_no in range(1, args.rounds + 1):
                shift = round_no % len(tags)
                for tag in tags[shift:] + tags[:shift]:
                    with Server(folder, url, args.workers, code_root=roots[tag]) as server:
                        seeded = seeded or seed(server)
                        with EventStreams(server.url, seeded, EVENT_STREAMS):
                            for mode in args.workloads:
                                label = f"{kind} {tag}: {mode} @64, round {round_no}"
                                progress.update(task, description=label)
                                plan.write_text(seeded.plan_lua(pending_pairs(url)))
                                result = wrk(server.url, plan, mode, 64, args.duration)
                                result.update(
                                    rev=tag, mode=mode, round=round_no, load=os.getloadavg()[0]
                                )
                                runs.append(result)
                                progress.advance(task)
    head = tags[0]
    summary: dict[str, Any] = {}
    for tag in tags:
        for mode in args.workloads:
            mine = [r for r in runs if r["rev"] == tag and r["mode"] == mode]
            row: dict[str, Any] = {
                "req_s": round(statistics.median(r["req_s"] for r in mine), 1),
                "req_s_rounds": [round(r["req_s"], 1) for r in mine],
                "p99_ms": round(statistics.median(r["p99_ms"] for r in mine), 2),
                "errors": sum(r["errors"] for r in mine),
                "load_rounds": [round(r["load"], 2) for r in mine],
            }
            if tag != head:
                # this checkout's rate over the other commit's, within each round
                base = {
                    r["round"]: r["req_s"] for r in runs if r["rev"] == head and r["mode"] == mode
                }
                ratios = [base[r["round"]] / r["req_s"] for r in mine]
                row[f"{head}_vs_this"] = round(statistics.median(ratios), 3)
                row[f"{head}_vs_this_rounds"] = [round(x, 3) for x in ratios]
            summary.setdefault(tag, {})[mode] = row
    return summary


def run_against(args: argparse.Namespace, console: Console) -> None:
    """The --against comparison: a table of each commit's rates and the ratios."""
    head = short_head()
    with checkouts(args.against) as others:
        roots = {head: HERE.parent} | {rev: path for rev, path in others.items()}
        total = args.rounds * len(roots) * len(args.workloads) * len(args.kinds)
        with Progress(console=console) as progress:
            task = progress.add_task("api load", total=total)
            result = {kind: compare(kind, roots, args, progress, task) for kind in args.kinds}
    table = Table(title=f"{head} against {', '.join(args.against)}, 64 connections")
    for column in ("database", "commit", "workload", "req/s (rounds)", f"{head} / this"):
        table.add_column(column)
    for kind, by_rev in result.items():
        for tag, rows in by_rev.items():
            for mode, row in rows.items():
                rounds = ", ".join(f"{x:.0f}" for x in row["req_s_rounds"])
                ratio = row.get(f"{head}_vs_this")
                table.add_row(
                    kind,
                    tag,
                    mode,
                    f"{row['req_s']:.0f} ({rounds})",
                    "" if ratio is None else f"{ratio:.3f}",
                )
    console.print(table)
    out = {
        "measured_at": utcnow().isoformat(timespec="seconds"),
        "commit": head,
        "against": args.against,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "duration_s": args.duration,
        "rounds": args.rounds,
        "workers": args.workers,
        "connections": 64,
        "note": args.note,
        "by_database": result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"written: {args.out}")


def summarize(kind: str, backend: dict[str, Any]) -> dict[str, Any]:
    """Medians and spreads per (workload, connections); the named ratios."""
    rows: dict[str, Any] = {}
    for run in backend["runs"]:
        rows.setdefault(f"{run['mode']}@{run['connections']}", []).append(run)
    table: dict[str, Any] = {}
    for key, group in rows.items():
        rate = [r["req_s"] for r in group]
        table[key] = {
            "req_s": round(statistics.median(rate), 1),
            "req_s_min": round(min(rate), 1),
            "req_s_max": round(max(rate), 1),
            "p50_ms": round(statistics.median(r["p50_ms"] for r in group), 2),
            "p99_ms": round(statistics.median(r["p99_ms"] for r in group), 2),
            "p99_ms_max": round(max(r["p99_ms"] for r in group), 2),
            "errors": sum(r["errors"] for r in group),
            "timeouts": sum(r["timeouts"] for r in group),
            "refused_429": sum(r["refused_429"] for r in group),
        }
    # ratios within each round, then their median: rounds see different machine load
    by_round: dict[int, dict[str, Any]] = {}
    for run in backend["runs"]:
        by_round.setdefault(run["round"], {})[f"{run['mode']}@{run['connections']}"] = run
    auth_vs_bare = [r["reads@64"]["req_s"] / r["bare@64"]["req_s"] for r in by_round.values()]
    steps = {
        mode: statistics.median(
            r[f"{mode}@64"]["req_s"] / r["bare@64"]["req_s"] for r in by_round.values()
        )
        for mode in STEPS
    }
    flood_p99 = [r["reads+flood@64"]["p99_ms"] / r["reads@64"]["p99_ms"] for r in by_round.values()]
    return {
        "rows": table,
        f"authenticated_vs_bare_{kind}": round(statistics.median(auth_vs_bare), 3),
        f"authenticated_vs_bare_{kind}_rounds": [round(x, 3) for x in auth_vs_bare],
        **{f"{mode}_vs_bare_{kind}": round(ratio, 3) for mode, ratio in steps.items()},
        f"errors_256_{kind}": table["reads@256"]["errors"] + table["mixed@256"]["errors"],
        f"timeouts_256_{kind}": table["reads@256"]["timeouts"] + table["mixed@256"]["timeouts"],
        f"p99_ms_reads_64_{kind}": table["reads@64"]["p99_ms"],
        f"login_flood_p99_ratio_{kind}": round(statistics.median(flood_p99), 3),
        "event_streams": backend["event_streams"],
        "audit": backend["audit"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=30, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="nebula serve --workers")
    parser.add_argument("--databases", default="sqlite,postgresql")
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="REV",
        help="also serve REV's code (a temporary git worktree) in the same interleaved rounds, "
        "on the same database: REV must share this checkout's schema",
    )
    parser.add_argument(
        "--workloads", default="bare,reads", help="with --against: the workloads, at 64 connections"
    )
    parser.add_argument("--note", default="", help="with --against: a note kept in the JSON")
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE / "results" / "api_load_against.json",
        help="with --against",
    )
    args = parser.parse_args()
    kinds = args.databases.split(",")
    console = Console()
    if args.against:
        if args.rounds < 3:
            parser.error("at least 3 rounds: one run cannot tell a change from noise")
        args.kinds = kinds
        args.workloads = args.workloads.split(",")
        run_against(args, console)
        return
    load_before = load_average()
    per_backend = args.rounds * (len(CONNECTIONS) * len(WORKLOADS) + len(STEPS) + 1)
    summaries: dict[str, Any] = {}
    with Progress(console=console) as progress:
        task = progress.add_task("api load", total=per_backend * len(kinds))
        for kind in kinds:
            summaries[kind] = summarize(kind, run_backend(kind, args, progress, task))
    load_after = load_average()

    table = Table(
        title=f"nebula serve --workers {args.workers}, wrk {args.duration} s x {args.rounds} rounds"
    )
    for column in ("database", "workload", "conns", "req/s (min-max)", "p50 ms", "p99 ms"):
        table.add_column(column, justify="right" if column != "workload" else "left")
    table.add_column("errors", justify="right")
    table.add_column("429", justify="right")
    for kind, summary in summaries.items():
        for key, row in summary["rows"].items():
            mode, conns = key.split("@")
            table.add_row(
                kind,
                mode,
                conns,
                f"{row['req_s']:.0f} ({row['req_s_min']:.0f}-{row['req_s_max']:.0f})",
                f"{row['p50_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                str(row["errors"]),
                str(row["refused_429"]),
            )
    console.print(table)

    result: dict[str, Any] = {
        "measured_at": utcnow().isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": load_after,
        },
        "duration_s": args.duration,
        "rounds": args.rounds,
        "workers": args.workers,
        "open_event_streams": EVENT_STREAMS,
        "login_flood_per_s": FLOOD_PER_S,
    }
    for kind, summary in summaries.items():
        for key, value in summary.items():
            if key in ("rows", "event_streams", "audit"):
                result.setdefault(key, {})[kind] = value
            else:
                result[key] = value
    for kind in kinds:
        s = summaries[kind]
        console.print(
            f"{kind}: authenticated/bare {s[f'authenticated_vs_bare_{kind}']:.2f} "
            f"(anonymous 401 {s[f'anonymous_vs_bare_{kind}']:.2f}, "
            f"/me {s[f'me_vs_bare_{kind}']:.2f}), "
            f"p99 reads@64 {s[f'p99_ms_reads_64_{kind}']:.1f} ms, "
            f"errors@256 {s[f'errors_256_{kind}']}, "
            f"login flood p99 x{s[f'login_flood_p99_ratio_{kind}']:.2f}, "
            f"audit chain {'ok' if s['audit']['chain_ok'] else 'BROKEN'}, one event per write: "
            f"{'yes' if s['audit']['one_event_per_write'] else 'NO'}, "
            f"event streams {s['event_streams']['opened']} opened, "
            f"{len(s['event_streams']['failures'])} dropped"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"written: {RESULTS.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()

"""ELECTRA discriminator throughput: does the split run hide the generator and the link?

The `tiny` preset on the demo text, for n = 1 and n = 2 discriminators (replicas),
two ways each, every role in a process of its own with one intra-op thread:

(split)  the generator on cluster-a, the discriminator (and its replica) on cluster-b,
         joined through two real switches, each in its own process (mutual TLS, job
         tokens), the link between them shaped both ways to RATE_MBIT with DELAY_MS of
         one-way delay;
(d-only) the same discriminator role on the same batches, pre-generated: a replay link
         in its process hands it G's hello and G's batch messages byte for byte and
         swallows its syncs. No generator runs, nothing crosses a network.

split / d-only is the share of the discriminator's own speed the split run keeps: 1.0
means the generator's compute and the link are hidden entirely. The discriminator gets
no text, so whole corrupted sequences cross (`full` mode, the larger message). Steady
state: the first SKIP steps and the last one (it writes the model) are left out. The
variants run in ROUNDS interleaved rounds (the order alternating), so that load from
other processes falls on every variant alike; each ratio is the median of the per-round
ratios, with their spread. Beside the figures: the link's bytes per step against its
physical limit (bytes / bandwidth, and the delay G's lead of `max_lag` steps must cover),
and the CPU seconds each role spent per step (on a shared 2-core machine the generator's
compute is taken from the same cores).

Prints a table, writes bench/results/electra_throughput.json. `--quick`: fewer steps,
to try it out (the figures are not comparable with the committed ones).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.pki import ca
from workers.switch.client import SwitchLink
from workers.switch.link import Link, LinkEstimate, Payload
from workers.switch.server import Switch, SwitchConfig, crl_from_file
from workers.switch.shaper import ShaperConfig
from workers.training.data import batch_indices, clean_lines, encode_lines, write_demo_corpus
from workers.training.electra import run_electra_discriminator, run_electra_generator
from workers.training.electra.config import ElectraConfig, electra_preset
from workers.training.electra.model import PAD_ID
from workers.training.electra.pace import AUTO
from workers.training.electra.roles import DISCRIMINATOR
from workers.training.electra.sides import job_tokenizer
from workers.training.electra.wire import BATCH, HELLO
from workers.training.hooks import Hooks
from workers.training.messages import pack_message, unpack_message
from workers.training.role import StepSync

RESULTS = Path(__file__).parent / "results" / "electra_throughput.json"
STEPS, SKIP, ROUNDS = 60, 15, 3  # --quick: 30, 10 (each run also starts 3-5 processes)
SEED = 3
RATE_MBIT = 60.0  # the paper's slow link
DELAY_MS = 25.0  # one way, on both switches' outgoing link
N_DISCRIMINATORS = (1, 2)
D_CPUS, G_CPUS = {0}, {1}
"""In both runs (split and d-only) D and its replicas are pinned to CPU 0 and everything
else, G, both switches and this bench's own process, to CPU 1 (os.sched_setaffinity), so
that the ratio measures what crosses the link and not who shares D's core. Other builds
on the machine are not pinned: the load average stands beside the figures."""


def pin(cpus: set[int] | None) -> None:
    """Pin the calling process (and the processes it starts later) to `cpus`."""
    if cpus is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


@functools.cache
def pinning() -> bool:
    """Whether the roles are pinned: a Linux machine with both CPUs (asked once, before
    the bench pins itself)."""
    return hasattr(os, "sched_setaffinity") and os.sched_getaffinity(0) >= (D_CPUS | G_CPUS)


# ---------------------------------------------------------------- two switches


class _SwitchEnd(Protocol):
    cluster: str

    @property
    def worker_address(self) -> tuple[str, int]: ...
    @property
    def peer_address(self) -> tuple[str, int]: ...

    def add_peer(self, cluster: str, address: tuple[str, int]) -> None: ...
    def stop(self) -> None: ...


class SwitchProcess:
    """A switch in a process of its own (spawned), steered through a pipe.

    Its addresses are known once the process has started the switch: asking for
    them waits for that, so that two switches start side by side.
    """

    def __init__(self, config: SwitchConfig, cpus: set[int] | None = None) -> None:
        self.cluster = config.cluster
        self._conn, child = multiprocessing.get_context("spawn").Pipe()
        self._proc = multiprocessing.get_context("spawn").Process(
            target=_switch_main, args=(config, child, cpus), daemon=True
        )
        self._proc.start()
        self._addresses: tuple[tuple[str, int], tuple[str, int]] | None = None

    def _started(self) -> tuple[tuple[str, int], tuple[str, int]]:
        if self._addresses is None:
            if not self._conn.poll(120):
                raise RuntimeError(f"switch {self.cluster} did not start")
            self._addresses = self._conn.recv()
        return self._addresses

    @property
    def worker_address(self) -> tuple[str, int]:
        """Where this cluster's workers connect."""
        return self._started()[0]

    @property
    def peer_address(self) -> tuple[str, int]:
        """Where the peer switch connects."""
        return self._started()[1]

    def add_peer(self, cluster: str, address: tuple[str, int]) -> None:
        """Tell the switch where its peer switch listens."""
        self._started()
        self._conn.send(("peer", cluster, address))
        self._conn.recv()

    def cpu_s(self) -> float:
        """CPU seconds the switch's process has used so far."""
        self._started()
        self._conn.send(("cpu",))
        return float(self._conn.recv())

    def stop(self) -> None:
        """Stop the switch and its process."""
        self._conn.send(("stop",))
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()


def _switch_main(config: SwitchConfig, conn: Connection, cpus: set[int] | None) -> None:
    os.setsid()  # a CPU share of its own (see `_role_process`)
    pin(cpus)
    switch = Switch(config).start()
    conn.send((switch.worker_address, switch.peer_address))
    while (message := conn.recv())[0] != "stop":
        if message[0] == "peer":
            switch.add_peer(message[1], message[2])
            conn.send("ok")
        else:
            conn.send(time.process_time())
    switch.stop()


class SwitchPair:
    """Two switches on loopback, each the other's peer, certificates from a throwaway CA.

    `own_processes`: each switch runs in a process of its own (its TLS, framing and
    shaping then take no time from the roles' processes); otherwise in this one.
    """

    def __init__(
        self,
        root: Path,
        shaper: ShaperConfig | None = None,
        *,
        own_processes: bool = False,
        cpus: set[int] | None = None,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.ca_key, self.ca_cert = ca.create_root_ca("Bench CA")
        self.ca_path = root / "ca.pem"
        self.ca_path.write_bytes(ca.certificate_pem(self.ca_cert))
        crl_path = root / "crl.pem"
        next_update = datetime.now(UTC) + timedelta(days=1)
        crl_path.write_bytes(ca.build_crl(self.ca_key, self.ca_cert, [], next_update=next_update))
        self.token_key = ca.make_job_token_key()
        self.switches: list[_SwitchEnd] = []
        for cluster in ("cluster-a", "cluster-b"):
            key_pem, csr = ca.make_switch_key_and_csr(cluster)
            key_path, cert_path = root / f"{cluster}.key", root / f"{cluster}.crt"
            key_path.write_bytes(key_pem)
            cert_path.write_bytes(ca.sign_csr(self.ca_key, self.ca_cert, csr, cluster_name=cluster))
            config = SwitchConfig(
                cluster=cluster,
                key_path=key_path,
                cert_path=cert_path,
                ca_path=self.ca_path,
                crl_source=crl_from_file(crl_path),
                job_token_public_key=ca.job_token_public_key_pem(self.token_key),
                shaper=shaper,
            )
            self.switches.append(
                SwitchProcess(config, cpus) if own_processes else Switch(config).start()
            )
        a, b = self.switches
        a.add_peer("cluster-b", b.peer_address)
        b.add_peer("cluster-a", a.peer_address)

    def tickets(self, job: str, role_a: str, role_b: str) -> tuple[LinkTicket, LinkTicket]:
        """How `role_a` (on cluster-a) and `role_b` (on cluster-b) open their links."""
        out = []
        a, b = self.switches
        for switch, role, peer in ((a, role_a, role_b), (b, role_b, role_a)):
            token = ca.sign_job_token(
                self.token_key,
                job_id=job,
                role=role,
                cluster=switch.cluster,
                expires_at=time.time() + 3600,
            )
            out.append(LinkTicket(switch.worker_address, self.ca_path, token, job, role, peer))
        return out[0], out[1]

    def cpu_s(self) -> float:
        """CPU seconds both switch processes have used so far (0.0: in this process)."""
        return sum(s.cpu_s() for s in self.switches if isinstance(s, SwitchProcess))

    def stop(self) -> None:
        """Stop both switches."""
        for switch in self.switches:
            switch.stop()


@dataclass(frozen=True)
class LinkTicket:
    """What a role process needs to open its end of the link (picklable)."""

    address: tuple[str, int]
    ca_path: Path
    token: str
    job: str
    role: str
    peer: str

    def open(self) -> SwitchLink:
        """Connect to the local switch; the switch pairs the two ends of the job."""
        return SwitchLink(
            self.address,
            ca_path=self.ca_path,
            token=self.token,
            job_id=self.job,
            role=self.role,
            peer_role=self.peer,
        )


# ---------------------------------------------------------------- role processes

RoleTarget = Callable[..., Any]


def _role_process(
    target: RoleTarget,
    args: tuple[Any, ...],
    conn: Connection,
    own_session: bool,
    cpus: set[int] | None = None,
) -> None:
    """Child: one intra-op thread (roles share 2 cores), run the role, send its result.

    `own_session`: the process leaves its parent's session, so that the kernel's autogroup
    scheduling gives it (and the replicas it starts) a CPU share of its own, as a cluster
    of its own would have; otherwise it shares one with its parent and its siblings.
    """
    if own_session:
        os.setsid()
    pin(cpus)  # before anything starts: D's replicas inherit it
    torch.set_num_threads(1)
    try:
        conn.send(("result", target(conn, *args)))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def run_processes(
    roles: Sequence[tuple[RoleTarget, tuple[Any, ...]]],
    on_event: Callable[[Any], None],
    *,
    own_sessions: bool = False,
    cpus: Sequence[set[int] | None] | None = None,
) -> list[Any]:
    """Each role in a process of its own, as clusters run them; events and results come back.

    A target is called as target(conn, *args); it may conn.send(("event", x)) as it
    goes (handed to on_event) and returns its result. `own_sessions`: see `_role_process`.
    `cpus`: per role, the CPUs its process (and those it starts) is pinned to.
    """
    spawn = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for slot, (target, args) in enumerate(roles):
        parent, child = spawn.Pipe()
        role_cpus = cpus[slot] if cpus is not None else None
        proc = spawn.Process(  # not a daemon: it may start replicas
            target=_role_process, args=(target, args, child, own_sessions, role_cpus)
        )
        proc.start()
        procs.append(proc)
        conns.append(parent)
    results: dict[int, Any] = {}
    try:
        while len(results) < len(roles):
            for conn in wait([c for i, c in enumerate(conns) if i not in results]):
                slot = conns.index(conn)  # type: ignore[arg-type]
                try:
                    kind, value = conn.recv()  # type: ignore[union-attr,call-arg]
                except EOFError:
                    raise RuntimeError(f"role process {slot} died") from None
                if kind == "event":
                    on_event(value)
                elif kind == "error":
                    raise RuntimeError(f"role process {slot} failed: {value}")
                else:
                    results[slot] = value
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    return [results[i] for i in range(len(roles))]


def run_in_processes(
    role_a: tuple[RoleTarget, tuple[Any, ...]],
    role_b: tuple[RoleTarget, tuple[Any, ...]],
    on_event: Callable[[Any], None],
) -> tuple[Any, Any]:
    """Two roles in two processes (see `run_processes`)."""
    a, b = run_processes([role_a, role_b], on_event)
    return a, b


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_now() -> dict[str, Any]:
    """What a result file says of the machine as a run ends: load, CPUs, torch, time."""
    return {
        "load_average_after": load_average(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------- pre-generated batches


class _NoNetwork:
    """What a Link says of a network it does not have."""

    def bytes_sent(self) -> dict[str, int]:
        return {}

    def link_estimate(self) -> LinkEstimate | None:
        return None

    def close(self) -> None:
        pass


class _EchoLink(_NoNetwork):
    """G's end of a link to no discriminator: D's hello, and a sync for every step sent."""

    def __init__(self, d_hello: dict[str, Any]) -> None:
        self.d_hello = pack_message(d_hello)
        self.sent: list[tuple[str, bytes]] = []
        self._last_step = 0

    def send(self, channel: str, payload: Payload) -> None:
        assert isinstance(payload, bytes)
        self.sent.append((channel, payload))
        if channel == BATCH:
            self._last_step = int(unpack_message(payload)[0].get("step", self._last_step))

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        if channel == HELLO:
            return self.d_hello
        return StepSync(self._last_step, 0.0, 0.0).to_payload()


class ReplayLink(_NoNetwork):
    """D's end of a link that replays what G sent (hello, then batches) and drops D's syncs."""

    def __init__(self, transcript: list[tuple[str, bytes]]) -> None:
        self._queues = {HELLO: [b for c, b in transcript if c == HELLO]}
        self._queues[BATCH] = [b for c, b in transcript if c == BATCH]
        self._queues[BATCH].reverse()
        self._queues[HELLO].reverse()

    def send(self, channel: str, payload: Payload) -> None:
        pass

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        return self._queues[channel].pop()


class WaitTimer(_NoNetwork):
    """A Link wrapper that adds up the time its role waited for a batch to arrive (the
    role asks its link for nothing but sends and receives; the inner link is closed by
    whoever opened it)."""

    def __init__(self, inner: Link) -> None:
        self.inner, self.waited_s = inner, 0.0

    def send(self, channel: str, payload: Payload) -> None:
        self.inner.send(channel, payload)

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        t0 = time.perf_counter()
        payload = self.inner.recv(channel, timeout)
        if channel == BATCH:
            self.waited_s += time.perf_counter() - t0
        return payload


def pregenerate(cfg: ElectraConfig, lines: list[str], root: Path) -> list[tuple[str, bytes]]:
    """What G sends a discriminator without the text over a whole run, in order."""
    d_hello = {
        "role": DISCRIMINATOR,
        "config": asdict(cfg),
        "seed": SEED,
        "text_digest": None,
        "checkpoints": [],
    }
    link = _EchoLink(d_hello)
    run_electra_generator(cfg, link, lines, root, seed=SEED)
    return [(c, b) for c, b in link.sent if c in (HELLO, BATCH)]


# ---------------------------------------------------------------- the runs


@dataclass
class Run:
    """Steady-state figures of one run (steps SKIP+1 .. steps-1)."""

    tokens_per_s: float
    step_s: float  # wall seconds per discriminator step
    d_cpu_s: float  # CPU seconds of the root discriminator's process per step
    d_wait_s: float  # seconds per step the root discriminator waited for a batch
    g_cpu_s: float = 0.0  # CPU seconds of the generator's process per step (split only)
    switch_cpu_s: float = 0.0  # CPU seconds of both switch processes per step (split only)
    g_compute_s: float = 0.0  # G's own compute per step, from its metrics (split only)
    bytes_to_discriminator: float = 0.0  # payload bytes per step
    bytes_to_generator: float = 0.0
    lag: float = 0.0  # G's lead in steps (median over the steady steps with `auto`)


def tokens_per_step(cfg: ElectraConfig, ids: torch.Tensor) -> list[int]:
    """Non-padding tokens the discriminator sees at steps 1..cfg.steps (index 0 = step 1)."""
    n = cfg.n_discriminators
    counts = []
    for step in range(1, cfg.steps + 1):
        total = 0
        for micro in range(n):
            index = batch_indices(len(ids), cfg.batch_size, (step - 1) * n + micro, SEED)
            total += int((ids[index] != PAD_ID).sum())
        counts.append(total)
    return counts


def _measured(d: dict[str, Any], tokens: list[int]) -> dict[str, float]:
    """D's tokens/s, and its wall, CPU and waiting seconds per step, of steps SKIP+1 .. steps-1."""
    last = len(tokens) - 1
    wall, cpu, waited = (b - a for a, b in zip(d["done_at"][SKIP], d["done_at"][last], strict=True))
    per_step = last - SKIP
    return {
        "tokens_per_s": sum(tokens[SKIP:last]) / wall,
        "step_s": wall / per_step,
        "d_cpu_s": cpu / per_step,
        "d_wait_s": waited / per_step,
    }


def discriminator_role(
    conn: Connection,
    cfg: ElectraConfig,
    ticket: LinkTicket | None,
    transcript: list[tuple[str, bytes]] | None,
    root: Path,
) -> dict[str, Any]:
    """Cluster D's process: the discriminator role without the text, through the switch
    (`ticket`) or on the replayed batches (`transcript`); step times go out as events."""
    done_at: dict[int, tuple[float, float, float]] = {}
    timer: WaitTimer

    def on_step(step: int, _metrics: dict[str, float]) -> None:
        done_at[step] = (time.perf_counter(), time.process_time(), timer.waited_s)
        conn.send(("event", step))

    hooks = Hooks(on_metrics=on_step)
    if ticket is not None:
        with ticket.open() as link:
            timer = WaitTimer(link)
            result = run_electra_discriminator(cfg, timer, None, root / "d", hooks, seed=SEED)
    else:
        assert transcript is not None
        timer = WaitTimer(ReplayLink(transcript))
        result = run_electra_discriminator(cfg, timer, None, root / "d", hooks, seed=SEED)
    return {"history": result.history, "done_at": done_at}


def generator_role(
    conn: Connection, cfg: ElectraConfig, ticket: LinkTicket, lines: list[str], root: Path
) -> dict[str, Any]:
    """Cluster G's process: the generator role; returns its metrics and its CPU seconds
    per step from step SKIP to the one before the last (start-up left out)."""
    cpu_at: dict[int, float] = {}
    hooks = Hooks(on_metrics=lambda step, _m: cpu_at.__setitem__(step, time.process_time()))
    with ticket.open() as link:
        result = run_electra_generator(cfg, link, lines, root / "g", hooks, seed=SEED)
    last = cfg.steps - 1
    return {
        "history": result.history,
        "mode_shared": result.extra["mode_shared"],
        "cpu_s_per_step": (cpu_at[last] - cpu_at[SKIP]) / (last - SKIP),
    }


def split(
    cfg: ElectraConfig,
    lines: list[str],
    tokenizer: Any,
    tokens: list[int],
    root: Path,
    advance: Callable[[], None],
    *,
    own_sessions: bool = True,
) -> Run:
    """G and D in processes of their own, through two switches in processes of their own.

    `own_sessions`: G and D each get a CPU share of their own, as on two hosts; False: G's
    process shares D's (see `_role_process`)."""
    (root / "g").mkdir(parents=True)
    tokenizer.save(str(root / "g" / "tokenizer.json"))  # G uses it instead of training its own
    shaper = ShaperConfig(rate_mbit=RATE_MBIT, delay_ms=DELAY_MS)
    pinned = pinning()
    switches = SwitchPair(root / "pki", shaper, own_processes=True, cpus=G_CPUS if pinned else None)
    g_ticket, d_ticket = switches.tickets("electra-bench", "generator", "discriminator")
    switch_cpu: dict[int, float] = {}

    def on_step(step: int) -> None:
        advance()
        if step in (SKIP, cfg.steps - 1):
            switch_cpu[step] = switches.cpu_s()

    try:
        g, d = run_processes(
            [
                (generator_role, (cfg, g_ticket, lines, root)),
                (discriminator_role, (cfg, d_ticket, None, root)),
            ],
            on_step,
            own_sessions=own_sessions,
            cpus=[G_CPUS, D_CPUS] if pinned else None,
        )
    finally:
        switches.stop()
    assert g["mode_shared"] == 0.0  # whole sequences crossed
    steady = g["history"][SKIP:]
    return Run(
        **_measured(d, tokens),
        g_cpu_s=g["cpu_s_per_step"],
        switch_cpu_s=(switch_cpu[cfg.steps - 1] - switch_cpu[SKIP]) / (cfg.steps - 1 - SKIP),
        g_compute_s=statistics.mean(
            h["bytes_to_discriminator"] / h["bytes_per_token"] / h["tokens_per_s"] for h in steady
        ),
        bytes_to_discriminator=statistics.mean(h["bytes_to_discriminator"] for h in steady),
        bytes_to_generator=statistics.mean(h["bytes_to_generator"] for h in d["history"][SKIP:]),
        lag=statistics.median(h.get("max_lag", cfg.max_lag) for h in steady),
    )


def d_only(
    cfg: ElectraConfig,
    transcript: list[tuple[str, bytes]],
    tokens: list[int],
    root: Path,
    advance: Callable[[], None],
) -> Run:
    """The discriminator role alone in its process, on the pre-generated batches."""
    (d,) = run_processes(
        [(discriminator_role, (cfg, None, transcript, root))],
        lambda _step: advance(),
        own_sessions=True,
        cpus=[D_CPUS] if pinning() else None,
    )
    return Run(**_measured(d, tokens))


# ---------------------------------------------------------------- report


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, smallest and largest of per-round figures."""
    return {
        "median": round(statistics.median(values), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def main() -> None:
    """Run every variant in interleaved rounds, print the table, write the JSON."""
    global STEPS, SKIP, ROUNDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="30 steps: to try, not to commit")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds")
    parser.add_argument(
        "--max-lag",
        type=lambda v: v if v == AUTO else int(v),
        default=None,
        help="the generator's lead in steps, or auto (default: the preset's)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()
    if args.quick:
        STEPS, SKIP = 30, 10
    ROUNDS = args.rounds
    console = Console(width=150)
    load_before = load_average()
    torch.set_num_threads(1)
    if pinning():
        pin(G_CPUS)  # this process reads the events; it keeps off D's core
    rounds: list[dict[str, Run]] = []
    loads: list[list[float]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_demo_corpus(Path(tmp) / "corpus")
        lines = clean_lines(corpus["text"].read_text(encoding="utf-8").splitlines())
        cfgs = {
            n: electra_preset(
                "tiny",
                steps=STEPS,
                ckpt_every=STEPS,
                n_discriminators=n,
                **({} if args.max_lag is None else {"max_lag": args.max_lag}),
            )
            for n in N_DISCRIMINATORS
        }
        # one tokenizer for every run, so that every run sees the same tokens
        tokenizer = job_tokenizer(cfgs[1], lines, None)
        (Path(tmp) / "pre").mkdir()
        tokenizer.save(str(Path(tmp) / "pre" / "tokenizer.json"))
        transcripts = {n: pregenerate(cfg, lines, Path(tmp) / "pre") for n, cfg in cfgs.items()}
        ids = encode_lines(tokenizer, lines, cfgs[1].seq_len)
        tokens = {n: tokens_per_step(cfg, ids) for n, cfg in cfgs.items()}
        variants = [f"{kind}-{n}" for n in N_DISCRIMINATORS for kind in ("split", "d_only")]
        variants.insert(1, "split_one_session-1")
        with Progress(console=console) as progress:
            for round_ in range(ROUNDS):
                figures: dict[str, Run] = {}
                order = variants if round_ % 2 == 0 else variants[::-1]
                for key in order:
                    kind, n = key.split("-")[0], int(key.split("-")[1])
                    task = progress.add_task(f"round {round_ + 1}: {key}", total=STEPS)
                    root = Path(tmp) / f"{key}-{round_}"

                    def advance(task: Any = task) -> None:
                        progress.advance(task)

                    if kind.startswith("split"):
                        figures[key] = split(
                            cfgs[n],
                            lines,
                            tokenizer,
                            tokens[n],
                            root,
                            advance,
                            own_sessions=kind == "split",
                        )
                    else:
                        figures[key] = d_only(cfgs[n], transcripts[n], tokens[n], root, advance)
                    progress.update(task, completed=STEPS)
                rounds.append(figures)
                loads.append(load_average())
    wall_s = time.perf_counter() - started
    bandwidth = RATE_MBIT * 1e6 / 8  # bytes/s

    table = Table(
        title=(
            f"ELECTRA tiny, discriminator tokens/s, steps {SKIP + 1}-{STEPS - 1} of {STEPS}, "
            f"{ROUNDS} rounds, link {RATE_MBIT:g} Mbit/s + {DELAY_MS:g} ms one way, "
            f"{os.cpu_count()} CPUs, load {load_before[0]:.1f} -> {loads[-1][0]:.1f}, "
            + (
                "D pinned to CPU 0, G + switches + bench to CPU 1 in both runs"
                if pinning()
                else "not pinned"
            )
        )
    )
    columns = (
        "n",
        "split tokens/s",
        "d-only tokens/s",
        "split / d-only (min-max)",
        "D step s",
        "G compute s",
        "CPU s/step D, G, switches",
        "CPU-bound ratio",
        "D waits s/step",
        "bytes/step to D",
        "wire s/step",
        "G's lead (steps)",
    )
    for column in columns:
        table.add_column(column, justify="right")

    def compare(n: int, split_key: str, label: str) -> dict[str, Any]:
        """The split runs `split_key` against the d-only runs, n discriminators; adds a row."""
        s_runs = [r[f"{split_key}-{n}"] for r in rounds]
        d_runs = [r[f"d_only-{n}"] for r in rounds]
        ratio = spread(
            [s.tokens_per_s / d.tokens_per_s for s, d in zip(s_runs, d_runs, strict=True)]
        )
        to_d = statistics.mean(s.bytes_to_discriminator for s in s_runs)
        wire_s = to_d / bandwidth
        figures_n: dict[str, Any] = {
            "split_vs_d_only": ratio,
            "tokens_per_s_split": spread([s.tokens_per_s for s in s_runs]),
            "tokens_per_s_d_only": spread([d.tokens_per_s for d in d_runs]),
            "step_s_split": spread([s.step_s for s in s_runs]),
            "step_s_d_only": spread([d.step_s for d in d_runs]),
            "cpu_s_per_step_d_split": spread([s.d_cpu_s for s in s_runs]),
            "cpu_s_per_step_d_only": spread([d.d_cpu_s for d in d_runs]),
            "cpu_s_per_step_g": spread([s.g_cpu_s for s in s_runs]),
            "wait_s_per_step_d_split": spread([s.d_wait_s for s in s_runs]),
            "wait_s_per_step_d_only": spread([d.d_wait_s for d in d_runs]),
            "cpu_s_per_step_switches": spread([s.switch_cpu_s for s in s_runs]),
            # with every core busy, the CPU of G and of the switches comes out of D's share:
            # the ratio a CPU-bound split keeps
            "cpu_bound_expectation": spread(
                [
                    n * d.d_cpu_s / (n * d.d_cpu_s + s.g_cpu_s + s.switch_cpu_s)
                    for s, d in zip(s_runs, d_runs, strict=True)
                ]
            ),
            "g_compute_s_per_step": spread([s.g_compute_s for s in s_runs]),
            "bytes_per_step_to_discriminator": round(to_d, 1),
            "bytes_per_step_to_generator": round(
                statistics.mean(s.bytes_to_generator for s in s_runs), 1
            ),
            # the physical limit of the link: bytes at the shaped rate, and the delay G's
            # lead of max_lag steps must cover (a sync back, the next batch out)
            "wire_s_per_step_at_rate": round(wire_s, 6),
            "wire_share_of_d_step": round(wire_s / statistics.median(d.step_s for d in d_runs), 5),
            "latency_to_hide_s": round(2 * DELAY_MS / 1000, 3),
            # the lead in steps: the config's, or with `auto` the median G chose (per round)
            "max_lag_chosen": spread([s.lag for s in s_runs]),
            "lead_s": round(
                (statistics.median(s.lag for s in s_runs) - 1)
                * statistics.median(d.step_s for d in d_runs),
                3,
            ),
        }
        table.add_row(
            label,
            f"{figures_n['tokens_per_s_split']['median']:,.0f}",
            f"{figures_n['tokens_per_s_d_only']['median']:,.0f}",
            f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})",
            f"{figures_n['step_s_split']['median']:.3f} / "
            f"{figures_n['step_s_d_only']['median']:.3f}",
            f"{figures_n['g_compute_s_per_step']['median']:.3f}",
            f"{figures_n['cpu_s_per_step_d_split']['median']:.3f}, "
            f"{figures_n['cpu_s_per_step_g']['median']:.3f}, "
            f"{figures_n['cpu_s_per_step_switches']['median']:.3f}",
            f"{figures_n['cpu_bound_expectation']['median']:.3f}",
            f"{figures_n['wait_s_per_step_d_split']['median']:.3f} / "
            f"{figures_n['wait_s_per_step_d_only']['median']:.3f}",
            f"{to_d:,.0f}",
            f"{wire_s * 1000:.2f} ms",
            f"{figures_n['max_lag_chosen']['median']:g} "
            f"({figures_n['max_lag_chosen']['min']:g}-{figures_n['max_lag_chosen']['max']:g})",
        )
        return figures_n

    per_n: dict[str, Any] = {str(n): compare(n, "split", str(n)) for n in N_DISCRIMINATORS}
    one_session = compare(1, "split_one_session", "1, G in D's session")
    console.print(table)
    summary: dict[str, Any] = {
        "electra_split_vs_d_only": per_n["1"]["split_vs_d_only"]["median"],
        "electra_split_vs_d_only_n2": per_n["2"]["split_vs_d_only"]["median"],
        # the same split with G's process in D's session: G's CPU then comes out of D's share
        "electra_split_one_session_vs_d_only": one_session["split_vs_d_only"]["median"],
        "one_session_n1": one_session,
        "target_split_vs_d_only": 0.9,
        "by_n_discriminators": per_n,
        "per_round": [{key: round(run.tokens_per_s, 1) for key, run in r.items()} for r in rounds],
        "pinned": pinning(),
        "pinning": "D (and its replica) on CPU 0; G, both switches and the bench process on "
        "CPU 1, in the split and the d-only runs alike (os.sched_setaffinity); other builds "
        "on the machine are not pinned (see the load averages)",
        "notes": (
            "split: G, D (and D's replica) and both switches each in a process of their own, "
            "each in a session of its own (the kernel's autogroup scheduling then gives each "
            "a CPU share of its own, as separate hosts have; one_session_n1: G and D in the "
            "bench's session, sharing one), "
            "one intra-op thread per role, the inter-switch link shaped both ways; "
            "d_only: the same D role and replicas on G's pre-generated messages replayed in "
            "its process; D without the text (full mode); ratios are medians of per-round "
            "ratios (min-max beside); bytes are payload bytes per step; wire_s_per_step_at_rate"
            " = bytes / bandwidth; cpu_bound_expectation = n * D's CPU s per step / (that + "
            "G's + the switches'): what the split keeps when every core is busy and their CPU "
            "is taken from D's; "
            "wait_s = D's time blocked waiting for a batch; "
            "latency_to_hide_s = a sync back plus a batch out; max_lag_chosen = G's lead in "
            "steps (with max_lag auto: the median of the lags G chose over the steady steps of "
            "each run); lead_s = (that - 1) D steps, the time G's lead gives"
        ),
        "preset": "tiny",
        "quick": args.quick,
        "batch_size": cfgs[1].batch_size,
        "seq_len": cfgs[1].seq_len,
        "max_lag": cfgs[1].max_lag,
        "steps": STEPS,
        "skipped_warmup_steps": SKIP,
        "rounds": ROUNDS,
        "shaper_rate_mbit": RATE_MBIT,
        "shaper_delay_ms_one_way": DELAY_MS,
        "wall_s": round(wall_s, 1),
        "load_average_before": load_before,
        "load_average_after_each_round": loads,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

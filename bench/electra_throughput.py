"""ELECTRA discriminator throughput, one process against two clusters (Nebula-I's Table 3).

The `tiny` preset on the demo text, three ways, all in this process:

(a) one process, no link: `train_electra_local`, the reference, one intra-op thread
    (on this 2-core machine, shared with other work, 2 threads were several times
    slower per step: the tiny models are too small to split);
(b) the generator and the discriminator in two processes (two clusters), one
    intra-op thread each, joined through two real switches on loopback (mutual
    TLS, job tokens);
(c) the same with the switches' inter-switch link shaped to 60 Mbit/s.

The discriminator gets no text, so whole corrupted sequences cross (`full` mode,
the larger message). Steady state: the first SKIP steps are left out. The runs are
repeated in ROUNDS interleaved rounds so that load from other processes falls on
every variant alike; each ratio is the median of the per-round ratios.

Prints a table, writes bench/results/electra_throughput.json.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress, TaskID
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.pki import ca
from workers.switch.client import SwitchLink
from workers.switch.server import Switch, SwitchConfig, crl_from_file
from workers.switch.shaper import ShaperConfig
from workers.training.data import (
    PAD,
    SPECIAL_TOKENS,
    batch_indices,
    clean_lines,
    encode_lines,
    write_demo_corpus,
)
from workers.training.electra import (
    ElectraConfig,
    electra_preset,
    job_tokenizer,
    run_electra_discriminator,
    run_electra_generator,
    train_electra_local,
)
from workers.training.runtime import Hooks

RESULTS = Path(__file__).parent / "results" / "electra_throughput.json"
STEPS = 250
SKIP = 50  # warm-up steps left out of every figure
ROUNDS = 3
SEED = 3
RATE_MBIT = 60.0  # the paper's slow link
PAD_ID = SPECIAL_TOKENS.index(PAD)


# ---------------------------------------------------------------- two switches


class SwitchPair:
    """Two switches on loopback, each the other's peer, certificates from a throwaway CA."""

    def __init__(self, root: Path, shaper: ShaperConfig | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.ca_key, self.ca_cert = ca.create_root_ca("Bench CA")
        self.ca_path = root / "ca.pem"
        self.ca_path.write_bytes(ca.certificate_pem(self.ca_cert))
        crl_path = root / "crl.pem"
        next_update = datetime.now(UTC) + timedelta(days=1)
        crl_path.write_bytes(ca.build_crl(self.ca_key, self.ca_cert, [], next_update=next_update))
        self.token_key = ca.make_job_token_key()
        self.switches: list[Switch] = []
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
            self.switches.append(Switch(config).start())
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


RoleTarget = Callable[..., Any]


def _role_process(target: RoleTarget, args: tuple[Any, ...], conn: Connection) -> None:
    """Child: one intra-op thread (two roles share 2 cores), run the role, send its result."""
    torch.set_num_threads(1)
    try:
        conn.send(("result", target(conn, *args)))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def run_in_processes(
    role_a: tuple[RoleTarget, tuple[Any, ...]],
    role_b: tuple[RoleTarget, tuple[Any, ...]],
    on_event: Callable[[Any], None],
) -> tuple[Any, Any]:
    """Two roles in two processes, as two clusters run them; events and results come back.

    A target is called as target(conn, *args); it may conn.send(("event", x)) as it
    goes (handed to on_event) and returns its result.
    """
    spawn = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for target, args in (role_a, role_b):
        parent, child = spawn.Pipe()
        proc = spawn.Process(target=_role_process, args=(target, args, child), daemon=True)
        proc.start()
        procs.append(proc)
        conns.append(parent)
    results: dict[int, Any] = {}
    try:
        while len(results) < 2:
            for conn in wait([c for i, c in enumerate(conns) if i not in results]):
                slot = conns.index(conn)  # type: ignore[arg-type]
                try:
                    kind, value = conn.recv()  # type: ignore[union-attr]
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
    return results[0], results[1]


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------- the runs


@dataclass
class Run:
    """Steady-state figures of one run."""

    tokens_per_s: float
    bytes_to_discriminator: float = 0.0  # per step
    bytes_to_generator: float = 0.0  # per step


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


def single_process(cfg: ElectraConfig, lines: list[str], tokenizer: Any, tokens: list[int]) -> Run:
    """(a) Tokens/s of steps SKIP+1..STEPS: a run of STEPS steps less a run of SKIP steps."""
    seconds = []
    for steps in (SKIP, STEPS):
        start = time.perf_counter()
        train_electra_local(cfg, lines, seed=SEED, steps=steps, tokenizer=tokenizer)
        seconds.append(time.perf_counter() - start)
    return Run(sum(tokens[SKIP:STEPS]) / (seconds[1] - seconds[0]))


def generator_role(
    conn: Connection, cfg: ElectraConfig, ticket: LinkTicket, lines: list[str], root: Path
) -> dict[str, Any]:
    """Cluster G's process: the generator role; returns its per-step metrics."""
    with ticket.open() as link:
        result = run_electra_generator(cfg, link, lines, root / "g", seed=SEED)
    return {"history": result.history, "mode_shared": result.extra["mode_shared"]}


def discriminator_role(
    conn: Connection, cfg: ElectraConfig, ticket: LinkTicket, root: Path
) -> dict[str, Any]:
    """Cluster D's process: the discriminator role without the text; step times go out."""

    done_at: dict[int, float] = {}

    def on_step(step: int, _metrics: dict[str, float]) -> None:
        done_at[step] = time.perf_counter()
        conn.send(("event", step))

    hooks = Hooks(on_metrics=on_step)
    with ticket.open() as link:
        result = run_electra_discriminator(cfg, link, None, root / "d", hooks, seed=SEED)
    return {"history": result.history, "done_at": done_at}


def split(
    cfg: ElectraConfig,
    lines: list[str],
    tokenizer: Any,
    tokens: list[int],
    root: Path,
    shaper: ShaperConfig | None,
    advance: Callable[[], None],
) -> Run:
    """(b), (c): G and D in two processes through two switches; D's tokens/s from its steps."""
    (root / "g").mkdir(parents=True)
    tokenizer.save(str(root / "g" / "tokenizer.json"))  # G uses it instead of training its own
    switches = SwitchPair(root / "pki", shaper)
    g_ticket, d_ticket = switches.tickets("electra-bench", "generator", "discriminator")
    try:
        g, d = run_in_processes(
            (generator_role, (cfg, g_ticket, lines, root)),
            (discriminator_role, (cfg, d_ticket, root)),
            lambda _step: advance(),
        )
    finally:
        switches.stop()
    assert g["mode_shared"] == 0.0  # whole sequences crossed
    # the last step also writes a checkpoint and the model file: measure up to the one before
    last = STEPS - 1
    seconds = d["done_at"][last] - d["done_at"][SKIP]
    return Run(
        tokens_per_s=sum(tokens[SKIP:last]) / seconds,
        bytes_to_discriminator=statistics.mean(
            h["bytes_to_discriminator"] for h in g["history"][SKIP:]
        ),
        bytes_to_generator=statistics.mean(h["bytes_to_generator"] for h in d["history"][SKIP:]),
    )


def main() -> None:
    """Run every variant ROUNDS times, print the table, write the JSON."""
    console = Console(width=140)
    load_before = load_average()
    cfg = electra_preset("tiny", steps=STEPS, ckpt_every=STEPS)
    torch.set_num_threads(1)
    rounds: list[dict[str, Run]] = []
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_demo_corpus(Path(tmp) / "corpus")
        lines = clean_lines(corpus["text"].read_text(encoding="utf-8").splitlines())
        # one tokenizer for every run, so that every run sees the same tokens
        tokenizer = job_tokenizer(cfg, lines, None)
        tokens = tokens_per_step(cfg, encode_lines(tokenizer, lines, cfg.seq_len))
        plan: list[tuple[str, Callable[[Callable[[], None], Path], Run]]] = [
            ("single", lambda _a, _r: single_process(cfg, lines, tokenizer, tokens)),
            ("switch", lambda a, r: split(cfg, lines, tokenizer, tokens, r, None, a)),
            (
                "shaped",
                lambda a, r: split(
                    cfg, lines, tokenizer, tokens, r, ShaperConfig(rate_mbit=RATE_MBIT), a
                ),
            ),
        ]
        labels = {
            "single": "(a) one process, no link",
            "switch": "(b) two switches, loopback mTLS",
            "shaped": f"(c) two switches, {RATE_MBIT:g} Mbit/s",
        }
        started = time.perf_counter()
        with Progress(console=console) as progress:
            for round_ in range(ROUNDS):
                figures: dict[str, Run] = {}
                for key, fn in plan:
                    task: TaskID = progress.add_task(
                        f"round {round_ + 1}: {labels[key]}", total=STEPS
                    )
                    root = Path(tmp) / f"{key}-{round_}"
                    figures[key] = fn(lambda task=task: progress.advance(task), root)
                    progress.update(task, completed=STEPS)
                rounds.append(figures)
        wall_s = time.perf_counter() - started

    def median_of(key: str) -> float:
        return statistics.median(r[key].tokens_per_s for r in rounds)

    def ratio(key: str) -> float:
        return statistics.median(r[key].tokens_per_s / r["single"].tokens_per_s for r in rounds)

    table = Table(
        title=(
            f"ELECTRA tiny, discriminator tokens/s, steps {SKIP + 1}-{STEPS - 1} of {STEPS}, "
            f"{ROUNDS} rounds, {os.cpu_count()} CPUs"
        )
    )
    for column in ("variant", "tokens/s", "vs one process", "bytes/step to D", "bytes/step to G"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for key, label in labels.items():
        last = rounds[-1][key]
        split_run = key in ("switch", "shaped")
        table.add_row(
            label,
            f"{median_of(key):,.0f}",
            f"{ratio(key):.3f}",
            f"{last.bytes_to_discriminator:,.0f}" if split_run else "",
            f"{last.bytes_to_generator:,.0f}" if split_run else "",
        )
    console.print(table)
    summary: dict[str, Any] = {
        "cross_cluster_vs_single_process": round(ratio("switch"), 4),
        "shaped_60mbit_vs_single_process": round(ratio("shaped"), 4),
        "tokens_per_s": {
            "single_process": round(median_of("single"), 1),
            "cross_cluster": round(median_of("switch"), 1),
            "shaped_60mbit": round(median_of("shaped"), 1),
        },
        "tokens_per_s_per_round": [
            {key: round(run.tokens_per_s, 1) for key, run in r.items()} for r in rounds
        ],
        "bytes_per_step": {
            key: {
                "to_discriminator": rounds[-1][key].bytes_to_discriminator,
                "to_generator": rounds[-1][key].bytes_to_generator,
            }
            for key in ("switch", "shaped")
        },
        "notes": (
            "single_process: G and D in turn in one process, one intra-op thread; "
            "split runs: G and D in two processes, one intra-op thread each, D without the "
            "text (full mode); "
            "ratios are medians of per-round ratios; bytes are payload bytes per step"
        ),
        "preset": "tiny",
        "batch_size": cfg.batch_size,
        "seq_len": cfg.seq_len,
        "steps": STEPS,
        "skipped_warmup_steps": SKIP,
        "rounds": ROUNDS,
        "shaper_rate_mbit": RATE_MBIT,
        "wall_s": round(wall_s, 1),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()

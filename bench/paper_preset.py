"""The `paper` preset on CPU: a few steps of each scenario at Nebula-I's sizes.

Both scenarios run as the platform runs them: each side's role in a process of its own
(one intra-op thread each: two roles on the 2 cores), the two talking through two real
switches, each switch in a process of its own (mutual TLS, job tokens; the link is not
shaped: the link's share is computed from the bytes instead).

- ELECTRA (Scenario-I): the `paper` preset's generator (ELECTRA-Base's, 74M parameters)
  on cluster-a, its discriminator (an ERNIE-M base, 278M) on cluster-b, sequences of 512
  pieces of a 250,002-piece vocabulary. The discriminator gets no text (`full` mode).
- ABNet (Scenario-II): the `paper` preset's adapters around two frozen PLMs of the
  discriminator's size (random weights: the step costs the same), 128-token sentences.

What is not the paper's: the batch. One step of the paper's batch (32 sequences of 512
for ELECTRA, 8 micro-batches of 32 sentence pairs for ABNet) would take many minutes per
step on one core, so the runs take BATCHES (below) and the step time at the paper's
batch is also given as an estimate, linear in the batch. The data are synthetic: lines of
words drawn from a tokenizer of the preset's vocabulary, every sequence full length.

Per scenario: WARMUP steps, then STEPS timed steps (median and spread, the load average
at each); the peak resident memory of each role's process; the CPU's own limit (the
step's matrix products at the rate one thread multiplies in this run); the bytes per
step that cross the link, measured and computed. For ABNet the bytes per step at the
paper's sizes for every Table 5 codec row (bench/table5.py's sync ROWS), computed by encoding
real activations and activation gradients of the ABNet sides with each row's codecs:
those of one chunk of sentences at the paper's sizes, repeated to the paper's micro-batch
(byte counts depend on the shapes alone, and `auto`'s choice on relative errors, which
repeating rows keeps).

    python bench/paper_preset.py             # the committed figures (about 15 minutes)
    python bench/paper_preset.py --size tiny # the same code path at tiny sizes (seconds)
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.electra_throughput import (
    LinkTicket,
    SwitchPair,
    load_average,
    machine_now,
    run_processes,
    spread,
)
from bench.table5 import ROWS, Row
from workers.training.abnet import AbnetConfig, abnet_preset, run_abnet_decoder, run_abnet_encoder
from workers.training.abnet.sides import DecoderSide, EncoderSide
from workers.training.abnet.wire import (
    BACKWARD,
    FORWARD,
    Batch,
    Kind,
    StreamEncoder,
    chunks,
    pack_coded,
    pack_meta,
    pack_valid,
)
from workers.training.bert import BertConfig, init_weights
from workers.training.data import SPECIAL_TOKENS, UNK, encode_lines
from workers.training.electra import (
    CorruptedBatch,
    Discriminator,
    ElectraConfig,
    electra_preset,
    encode_batch,
    export_pretrained,
    load_pretrained,
    parameter_counts,
    run_electra_discriminator,
    run_electra_generator,
)
from workers.training.hooks import Hooks
from workers.training.role import StepSync

RESULTS = Path(__file__).parent / "results" / "paper_preset.json"
CODEC_ROWS = [row for row in ROWS if row.schedule == "sync"]  # bytes do not depend on it
SEED = 5
RATES_MBIT = (60.0, 10.0)  # the paper's links (Table 5)
N_LINES = 64  # lines of synthetic text per side


@dataclass(frozen=True)
class Sizes:
    """What one run takes: the presets, the overrides that make it fit, the data."""

    preset: str
    vocab_size: int
    electra: dict[str, Any] = field(default_factory=dict)  # overrides of the ELECTRA preset
    abnet: dict[str, Any] = field(default_factory=dict)  # overrides of the ABNet preset
    codec_chunk: int = 8  # sentences whose tensors stand for one chunk at the paper's sizes

    def electra_config(self, **overrides: Any) -> ElectraConfig:
        """The ELECTRA config of the run."""
        return electra_preset(self.preset, vocab_size=self.vocab_size, **self.electra, **overrides)

    def abnet_config(self, **overrides: Any) -> AbnetConfig:
        """The ABNet config of the run."""
        return abnet_preset(self.preset, **self.abnet, **overrides)

    def plm_body(self) -> BertConfig:
        """The frozen PLMs of ABNet: the preset's ELECTRA discriminator."""
        cfg = electra_preset(self.preset, vocab_size=self.vocab_size)
        return cfg.discriminator_body(self.vocab_size)


# BATCHES: the paper's model sizes, sequence lengths and vocabulary; the batch cut to fit
PAPER = Sizes(
    "paper",
    vocab_size=250_002,  # ERNIE-M's
    electra={"batch_size": 2},  # of 32
    abnet={"batch_size": 4, "micro_batches": 2, "activation_chunks": 2},  # of 32 x 8, 4 chunks
)
TINY = Sizes(
    "tiny",
    vocab_size=400,
    electra={"batch_size": 2},
    abnet={"batch_size": 4, "micro_batches": 2, "activation_chunks": 2},
    codec_chunk=2,
)


# ---------------------------------------------------------------- synthetic data


def synthetic_tokenizer(vocab_size: int) -> Tokenizer:
    """A WordPiece tokenizer of exactly `vocab_size` ids: the special tokens, then words
    `w0`, `w1`, ... (trained the way a job's is, it would need a corpus of that many words)."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for i in range(vocab_size - len(vocab)):
        vocab[f"w{i}"] = len(vocab)
    tok = Tokenizer(models.WordPiece(vocab, unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def synthetic_lines(tok: Tokenizer, count: int, words: int, seed: int) -> list[str]:
    """`count` lines of `words` words of the tokenizer, drawn at random: every line fills
    a sequence of `words` pieces or fewer."""
    rng = random.Random(seed)
    n = tok.get_vocab_size() - len(SPECIAL_TOKENS)
    return [" ".join(f"w{rng.randrange(n)}" for _ in range(words)) for _ in range(count)]


def write_plm(body: BertConfig, tok: Tokenizer, path: Path) -> int:
    """An ELECTRA discriminator of size `body`, random weights, as a `model` file at
    `path`; returns its parameter count."""
    model = Discriminator(body)
    init_weights(model, torch.Generator().manual_seed(SEED))
    path.write_bytes(export_pretrained(model, tok, {"synthetic": True}))
    return sum(p.numel() for p in model.parameters())


# ---------------------------------------------------------------- role processes


def peak_rss_mib() -> float:
    """This process's peak resident memory (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _step_hooks(conn: Connection, name: str, times: dict[int, tuple[float, float]]) -> Hooks:
    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        if "bleu" not in metrics:
            times[step] = (time.perf_counter(), time.process_time())
            conn.send(("event", (name, step)))

    return Hooks(on_metrics=on_metrics)


def electra_generator(
    conn: Connection, cfg: ElectraConfig, ticket: LinkTicket, lines: list[str], root: Path, n: int
) -> dict[str, Any]:
    """Cluster-a: the generator role, stopped after `n` steps (no final checkpoint)."""
    times: dict[int, tuple[float, float]] = {}
    hooks = _step_hooks(conn, "electra-generator", times)
    hooks.should_stop = lambda: len(times) >= n  # G reports each step as it ends
    with ticket.open() as link:
        result = run_electra_generator(cfg, link, lines, root / "g", hooks, seed=SEED)
    return {"history": result.history, "times": times, "peak_rss_mib": peak_rss_mib()}


def electra_discriminator(
    conn: Connection, cfg: ElectraConfig, ticket: LinkTicket, root: Path
) -> dict[str, Any]:
    """Cluster-b: the discriminator role, without the text; runs until G stops."""
    times: dict[int, tuple[float, float]] = {}
    with ticket.open() as link:
        result = run_electra_discriminator(
            cfg,
            link,
            None,
            root / "d",
            _step_hooks(conn, "electra-discriminator", times),
            seed=SEED,
        )
    return {"history": result.history, "times": times, "peak_rss_mib": peak_rss_mib()}


def abnet_role(
    conn: Connection,
    role: str,
    cfg: AbnetConfig,
    ticket: LinkTicket,
    lines: list[str],
    plm: Path,
    root: Path,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Cluster-a's `encoder` role, stopped after `stop_after` steps (no final checkpoint),
    or cluster-b's `decoder` role, which runs until the encoder stops."""
    run = run_abnet_encoder if role == "encoder" else run_abnet_decoder
    times: dict[int, tuple[float, float]] = {}
    hooks = _step_hooks(conn, f"abnet-{role}", times)
    # the clocks as each step ends: S asks whether to stop once before every step
    ends: dict[int, tuple[float, float]] = {}

    def should_stop() -> bool:
        ends[len(ends)] = (time.perf_counter(), time.process_time())
        # S reports step k - 1 after step k (T's sync comes back a step late)
        return stop_after is not None and len(times) >= stop_after - 1

    hooks.should_stop = should_stop
    with ticket.open() as link:
        result = run(cfg, link, lines, plm.read_bytes(), root / role, hooks, seed=SEED)
    # T's reports wait for the next micro-batch: its clocks are taken at its reports
    return {
        "history": result.history,
        "times": ends if role == "encoder" else times,
        "peak_rss_mib": peak_rss_mib(),
    }


# ---------------------------------------------------------------- the CPU's limit


def matmul_gflops(rounds: int = 5) -> float:
    """What one thread multiplies now, GFLOP/s: (4096 x 768) @ (768 x 3072), the shape of
    a 768-wide layer's feed-forward on 4096 tokens (median of `rounds`)."""
    a, b = torch.randn(4096, 768), torch.randn(768, 3072)
    a @ b
    rates = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        a @ b
        rates.append(2 * 4096 * 768 * 3072 / (time.perf_counter() - t0) / 1e9)
    return statistics.median(rates)


def body_flops(body: BertConfig, batch: int, seq_len: int) -> float:
    """Forward matrix-product FLOPs of a BERT body: projections, feed-forward, attention."""
    C, F, T = body.d_model, body.d_ff, seq_len
    per_layer = 2 * batch * T * (4 * C * C + 2 * C * F) + 4 * batch * T * T * C
    return float(body.n_layers * per_layer)


def electra_train_flops(cfg: ElectraConfig, vocab_size: int) -> dict[str, float]:
    """Training FLOPs per step of each ELECTRA role (forward x 3, the usual estimate); G's
    output layer covers the masked positions only, as electra.model.Generator computes."""
    B, T = cfg.batch_size * cfg.n_discriminators, cfg.seq_len
    g, d = cfg.generator_body(vocab_size), cfg.discriminator_body(vocab_size)
    masked = cfg.mask_prob * B * T
    g_head = 2 * masked * (g.d_model * g.d_model + g.d_model * vocab_size)
    d_head = 2 * B * T * (d.d_model * d.d_model + d.d_model)
    return {
        "generator": 3 * (body_flops(g, B, T) + g_head),
        "discriminator": 3 * (body_flops(d, B, T) + d_head),
    }


# ---------------------------------------------------------------- bytes on the link


def electra_bytes_per_step(cfg: ElectraConfig, tok: Tokenizer, lines: list[str]) -> dict[str, int]:
    """What crosses per step in `full` mode at `cfg`'s batch: G's corrupted batches (15% of
    the pieces replaced, as G's masking does) and D's sync back."""
    V = tok.get_vocab_size()
    gen = torch.Generator().manual_seed(SEED)
    rows = [lines[i % len(lines)] for i in range(cfg.batch_size)]
    original = encode_lines(tok, rows, cfg.seq_len)
    replace = torch.rand(original.shape, generator=gen) < cfg.mask_prob
    replace &= original >= len(SPECIAL_TOKENS)
    fakes = torch.randint(len(SPECIAL_TOKENS), V, original.shape, generator=gen)
    corrupted = torch.where(replace, fakes, original)
    index = torch.arange(cfg.batch_size)
    blob = encode_batch(
        "full", 1, 0, index, original, CorruptedBatch(corrupted, corrupted != original), V, 1000
    )
    sync = StepSync(1, 0.5, 0.5).to_payload()
    return {
        "to_discriminator": len(blob) * cfg.n_discriminators,
        "to_generator": sync.numel() * sync.element_size(),
    }


@dataclass
class AbnetTensors:
    """Real tensors that cross in ABNet: a chunk's activations and their gradient."""

    activations: torch.Tensor  # (B, S, C) S -> T
    gradients: torch.Tensor  # (B, S, C) T -> S
    src_len: torch.Tensor  # (B,)


def abnet_tensors(cfg: AbnetConfig, plm: bytes, lines: list[str], n: int) -> AbnetTensors:
    """The activations of `n` sentences through S's adapted encoder and the gradient T's
    adapted decoder sends back for them (one micro-batch of each side, as a step does)."""
    sentences = lines[:n]
    enc = EncoderSide(cfg, load_pretrained(plm), sentences, SEED, "cpu")
    with torch.no_grad():
        h, src_len = enc.forward(enc.data)
    d_model = enc.d_model
    del enc
    dec = DecoderSide(cfg, load_pretrained(plm), sentences, d_model, SEED, "cpu")
    grad, _ = dec.train_micro(torch.arange(n), h, src_len)
    return AbnetTensors(h, grad.detach(), src_len)  # as T sends it


def tile(x: torch.Tensor, rows: int) -> torch.Tensor:
    """`x`'s sentences repeated (or cut) to `rows` sentences."""
    reps = -(-rows // x.shape[0])
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:rows]


def abnet_bytes_per_step(cfg: AbnetConfig, tensors: AbnetTensors) -> dict[str, Any]:
    """Bytes of one step under `cfg`'s codecs, as the roles send them: per micro-batch its
    META, its activations chunk by chunk (valid positions only) and its gradient."""
    B = cfg.batch_size
    h, grad = tile(tensors.activations, B), tile(tensors.gradients, B)
    src_len = tile(tensors.src_len, B)
    forward = StreamEncoder(cfg, "forward", FORWARD)
    backward = StreamEncoder(cfg, "backward", BACKWARD)
    n_chunks = min(cfg.activation_chunks, B)
    batch = Batch(Kind.TRAIN, 1, 0, torch.arange(B), src_len, n_chunks, h.shape[1])
    fwd = len(pack_meta(batch, 100_000, cfg.src_len))
    specs = []
    for piece, lengths in zip(chunks(h, n_chunks), chunks(src_len, n_chunks), strict=True):
        coded = forward.encode(1, pack_valid(piece, lengths))
        fwd += len(pack_coded(coded))
        specs.append(coded.spec)
    coded = backward.encode(1, pack_valid(grad, src_len))
    bwd = len(pack_coded(coded))
    # every micro-batch of a step has the same shape: the same bytes
    return {
        "forward": fwd * cfg.micro_batches,
        "backward": bwd * cfg.micro_batches,
        "forward_spec": sorted(set(specs)),
        "backward_spec": coded.spec,
    }


def link_s(forward: float, backward: float, rate_mbit: float) -> float:
    """Seconds per step the link needs at `rate_mbit` (both ways at once, full duplex)."""
    return max(forward, backward) * 8 / (rate_mbit * 1e6)


# ---------------------------------------------------------------- runs


@dataclass
class ScenarioRun:
    """One scenario's split run: its roles' results and the load at each step."""

    roles: dict[str, dict[str, Any]]
    load_at_step: dict[int, float]
    wall_s: float


def split_run(
    roles: list[tuple[str, Callable[..., Any], tuple[Any, ...]]],
    clock_role: str,
    advance: Callable[[], None],
) -> ScenarioRun:
    """The roles in processes of their own (own sessions: a CPU share each, as two hosts);
    `clock_role`'s steps advance the progress bar and take the load average."""
    load: dict[int, float] = {}

    def on_event(event: tuple[str, int]) -> None:
        name, step = event
        if name == clock_role:
            load[step] = load_average()[0]
            advance()

    t0 = time.perf_counter()
    results = run_processes(
        [(target, args) for _, target, args in roles], on_event, own_sessions=True
    )
    return ScenarioRun(
        {name: r for (name, _, _), r in zip(roles, results, strict=True)},
        load,
        time.perf_counter() - t0,
    )


def intervals(
    times: dict[int, tuple[float, float]], warmup: int
) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each step after the first `warmup` (step k: end of k - 1 to
    end of k)."""
    steps = sorted(times)
    wall, cpu = [], []
    for prev, k in itertools.pairwise(steps):
        if k > warmup:
            wall.append(times[k][0] - times[prev][0])
            cpu.append(times[k][1] - times[prev][1])
    return wall, cpu


def run_electra(
    sizes: Sizes, tok: Tokenizer, root: Path, warmup: int, steps: int, advance: Callable[[], None]
) -> tuple[ElectraConfig, ScenarioRun]:
    """ELECTRA split across two switches for warmup + steps steps."""
    cfg = sizes.electra_config()
    lines = synthetic_lines(tok, N_LINES, cfg.seq_len, SEED)
    (root / "g").mkdir(parents=True)
    tok.save(str(root / "g" / "tokenizer.json"))  # the job's tokenizer, not trained here
    switches = SwitchPair(root / "pki", own_processes=True)
    g_ticket, d_ticket = switches.tickets("paper-electra", "generator", "discriminator")
    try:
        run = split_run(
            [
                ("generator", electra_generator, (cfg, g_ticket, lines, root, warmup + steps)),
                ("discriminator", electra_discriminator, (cfg, d_ticket, root)),
            ],
            "electra-discriminator",
            advance,
        )
    finally:
        switches.stop()
    return cfg, run


def run_abnet(
    sizes: Sizes,
    plm: Path,
    lines: list[str],
    root: Path,
    warmup: int,
    steps: int,
    advance: Callable[[], None],
) -> tuple[AbnetConfig, ScenarioRun]:
    """ABNet split across two switches for warmup + steps steps."""
    cfg = sizes.abnet_config()
    total = warmup + steps
    switches = SwitchPair(root / "pki", own_processes=True)
    s_ticket, t_ticket = switches.tickets("paper-abnet", "encoder", "decoder")
    try:
        run = split_run(
            [
                ("encoder", abnet_role, ("encoder", cfg, s_ticket, lines, plm, root, total)),
                ("decoder", abnet_role, ("decoder", cfg, t_ticket, lines, plm, root)),
            ],
            "abnet-decoder",
            advance,
        )
    finally:
        switches.stop()
    return cfg, run


# ---------------------------------------------------------------- report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run both scenarios, print the table, write the JSON; returns what it wrote."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("paper", "tiny"), default="paper")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the timing")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (at least 3)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.steps < 3 or args.warmup < 1:
        parser.error("--steps must be at least 3 and --warmup at least 1")
    sizes = PAPER if args.size == "paper" else TINY
    console = Console(width=150)
    torch.set_num_threads(1)
    load_before = load_average()
    started = time.perf_counter()
    gemm = [matmul_gflops()]
    tok = synthetic_tokenizer(sizes.vocab_size)
    V = tok.get_vocab_size()
    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp, Progress(console=console) as progress:
        root = Path(tmp)
        task = progress.add_task("ELECTRA split, steps", total=total)
        e_cfg, electra = run_electra(
            sizes, tok, root / "electra", args.warmup, args.steps, lambda: progress.advance(task)
        )
        gemm.append(matmul_gflops())
        a_cfg = sizes.abnet_config()
        task = progress.add_task("ABNet PLM and data", total=1)
        plm = root / "plm.safetensors"
        plm_params = write_plm(sizes.plm_body(), tok, plm)
        lines = synthetic_lines(tok, N_LINES, max(a_cfg.src_len, a_cfg.tgt_len) - 2, SEED + 1)
        progress.advance(task)
        task = progress.add_task("ABNet split, steps", total=total)
        a_cfg, abnet = run_abnet(
            sizes,
            plm,
            lines,
            root / "abnet",
            args.warmup,
            args.steps,
            lambda: progress.advance(task),
        )
        gemm.append(matmul_gflops())
        task = progress.add_task("codec rows (Table 5)", total=len(CODEC_ROWS) + 2)
        paper_abnet = abnet_preset(sizes.preset)
        blob = plm.read_bytes()
        tensors = abnet_tensors(paper_abnet, blob, lines, sizes.codec_chunk)
        progress.advance(task)
        own_row = Row("run", a_cfg.forward_codec, a_cfg.backward_codec)
        computed_run = abnet_bytes_per_step(
            sizes.abnet_config(forward_codec=own_row.forward, backward_codec=own_row.backward),
            tensors,
        )
        progress.advance(task)
        rows: dict[str, Any] = {}
        for row in CODEC_ROWS:
            row_cfg = abnet_preset(
                sizes.preset, forward_codec=row.forward, backward_codec=row.backward
            )
            rows[row.key] = {"label": row.label, **abnet_bytes_per_step(row_cfg, tensors)}
            progress.advance(task)
        gemm.append(matmul_gflops())
        e_lines = synthetic_lines(tok, N_LINES, e_cfg.seq_len, SEED)
        e_bytes_run = electra_bytes_per_step(e_cfg, tok, e_lines)
        e_bytes_paper = electra_bytes_per_step(
            electra_preset(sizes.preset, vocab_size=V), tok, e_lines
        )
    wall_s = time.perf_counter() - started
    gflops = statistics.median(gemm)

    # ELECTRA: the pipeline's step is D's (G runs up to max_lag steps ahead)
    d_wall, d_cpu = intervals(electra.roles["discriminator"]["times"], args.warmup)
    g_wall, g_cpu = intervals(electra.roles["generator"]["times"], args.warmup)
    flops = electra_train_flops(e_cfg, V)
    e_step = spread(d_wall)
    g_hist = electra.roles["generator"]["history"][args.warmup :]
    measured_to_d = statistics.mean(h["bytes_to_discriminator"] for h in g_hist)
    paper_batch_e = electra_preset(sizes.preset).batch_size
    electra_figures = {
        "step_s": e_step,
        "step_s_per_sequence": round(e_step["median"] / e_cfg.batch_size, 3),
        "discriminator_cpu_s_per_step": spread(d_cpu),
        "generator_cpu_s_per_step": spread(g_cpu),
        "generator_wall_s_per_step": spread(g_wall),
        "load_average_at_step": electra.load_at_step,
        "peak_rss_mib": {r: electra.roles[r]["peak_rss_mib"] for r in electra.roles},
        "batch_size_run": e_cfg.batch_size,
        "batch_size_paper": paper_batch_e,
        "seq_len": e_cfg.seq_len,
        "vocab_size": V,
        "parameters": parameter_counts(e_cfg, V),
        "train_gflop_per_step": {k: round(v / 1e9, 1) for k, v in flops.items()},
        # the CPU's limit: D's matrix products at the rate one thread multiplies
        "compute_floor_s_discriminator": round(flops["discriminator"] / (gflops * 1e9), 2),
        "step_vs_compute_floor": round(
            e_step["median"] / (flops["discriminator"] / (gflops * 1e9)), 2
        ),
        "bytes_per_step_to_discriminator_measured": round(measured_to_d, 1),
        "bytes_per_step_to_discriminator_computed": e_bytes_run["to_discriminator"],
        "computed_vs_measured": round(e_bytes_run["to_discriminator"] / measured_to_d, 4),
        "bytes_per_step_paper_batch": e_bytes_paper,
        "link_s_per_step_paper_batch": {
            f"{r:g}mbit": round(link_s(e_bytes_paper["to_discriminator"], 0, r), 3)
            for r in RATES_MBIT
        },
        "step_s_paper_batch_estimate": round(
            e_step["median"] * paper_batch_e / e_cfg.batch_size, 1
        ),
        "wall_s": round(electra.wall_s, 1),
    }

    # ABNet: S's step (its wall time from step to step, the gradients' wait included)
    s_hist = abnet.roles["encoder"]["history"]
    a_wall = [h["seconds"] for h in s_hist[args.warmup :] if "seconds" in h]
    _, s_cpu = intervals(abnet.roles["encoder"]["times"], args.warmup)
    _, t_cpu = intervals(abnet.roles["decoder"]["times"], args.warmup)
    a_step = spread(a_wall)
    measured_fwd = statistics.mean(h["bytes_to_decoder"] for h in s_hist[args.warmup :])
    t_hist = abnet.roles["decoder"]["history"][args.warmup :]
    measured_bwd = statistics.mean(h["bytes_to_encoder"] for h in t_hist)
    none = rows["none_none"]
    for figures in rows.values():
        figures["bytes_vs_none"] = round(
            (figures["forward"] + figures["backward"]) / (none["forward"] + none["backward"]), 4
        )
        for r in RATES_MBIT:
            figures[f"link_s_per_step_{r:g}mbit"] = round(
                link_s(figures["forward"], figures["backward"], r), 3
            )
    sentences_run = a_cfg.batch_size * a_cfg.micro_batches
    sentences_paper = paper_abnet.batch_size * paper_abnet.micro_batches
    abnet_figures = {
        "step_s": a_step,
        "decoder_cpu_s_per_step": spread(t_cpu),
        "encoder_cpu_s_per_step": spread(s_cpu),
        "load_average_at_step": abnet.load_at_step,
        "peak_rss_mib": {r: abnet.roles[r]["peak_rss_mib"] for r in abnet.roles},
        "plm_parameters": plm_params,
        "sentences_per_step_run": sentences_run,
        "sentences_per_step_paper": sentences_paper,
        "batch_run": {
            "batch_size": a_cfg.batch_size,
            "micro_batches": a_cfg.micro_batches,
            "activation_chunks": a_cfg.activation_chunks,
        },
        "batch_paper": {
            "batch_size": paper_abnet.batch_size,
            "micro_batches": paper_abnet.micro_batches,
            "activation_chunks": paper_abnet.activation_chunks,
        },
        "src_len": a_cfg.src_len,
        "tgt_len": a_cfg.tgt_len,
        "run_codecs": own_row.label,
        "bytes_per_step_measured": {
            "forward": round(measured_fwd, 1),
            "backward": round(measured_bwd, 1),
        },
        "bytes_per_step_computed": {
            "forward": computed_run["forward"],
            "backward": computed_run["backward"],
        },
        "computed_vs_measured": {
            "forward": round(computed_run["forward"] / measured_fwd, 4),
            "backward": round(computed_run["backward"] / measured_bwd, 4),
        },
        "table5_rows_paper_sizes": rows,
        "step_s_paper_batch_estimate": round(a_step["median"] * sentences_paper / sentences_run, 1),
        "wall_s": round(abnet.wall_s, 1),
    }
    summary: dict[str, Any] = {
        "paper_electra_step_s_cpu": e_step["median"],
        "paper_abnet_step_s_cpu": a_step["median"],
        "electra": electra_figures,
        "abnet": abnet_figures,
        "matmul_gflops_one_thread": spread(gemm),
        "size": args.size,
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "notes": (
            "each role in a process of its own (own session), one intra-op thread, through two "
            "switch processes (mutual TLS, job tokens, link not shaped); step_s: median (min, "
            "max) of the timed steps: ELECTRA from D's step ends (the pipeline's pace), ABNet "
            "S's step time (its gradients' wait included); batch cut to fit (batch_size_run "
            "against batch_size_paper), step_s_paper_batch_estimate = step_s x the ratio of "
            "the batches (linear); peak_rss_mib: ru_maxrss of each role's process (the PLM "
            "file's bytes included); compute_floor_s = the step's matrix-product FLOPs (forward "
            "x 3) / matmul_gflops_one_thread; table5 rows: bytes per step at the paper's batch, "
            "from real activations and gradients of codec_chunk sentences repeated to a "
            "micro-batch; link_s = max(forward, backward) bytes / rate; computed_vs_measured: "
            "the same computation at the run's batch against the bytes the run's roles counted"
        ),
        "codec_chunk_sentences": sizes.codec_chunk,
        "wall_s": round(wall_s, 1),
        "load_average_before": load_before,
        "sizes": asdict(sizes),
        **machine_now(),
    }
    show(console, summary)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    console.print(f"wrote {args.out}")
    return summary


def show(console: Console, summary: dict[str, Any]) -> None:
    """The two tables: the scenarios' steps, and the codec rows' bytes."""
    e, a = summary["electra"], summary["abnet"]
    table = Table(
        title=f"`{summary['size']}` preset on CPU, {summary['timed_steps']} timed steps after "
        f"{summary['warmup_steps']}, load {summary['load_average_before'][0]:.1f} -> "
        f"{summary['load_average_after'][0]:.1f}, one thread multiplies at "
        f"{summary['matmul_gflops_one_thread']['median']:.1f} GFLOP/s"
    )
    for column in (
        "scenario",
        "batch (run / paper)",
        "s/step (min-max)",
        "at the paper's batch, s",
        "peak RSS MiB",
        "bytes/step measured",
        "computed / measured",
    ):
        table.add_column(column, justify="right")
    es, as_ = e["step_s"], a["step_s"]
    table.add_row(
        "ELECTRA",
        f"{e['batch_size_run']} / {e['batch_size_paper']} x {e['seq_len']}",
        f"{es['median']:.2f} ({es['min']:.2f}-{es['max']:.2f})",
        f"{e['step_s_paper_batch_estimate']:,.0f}",
        ", ".join(f"{k} {v:,.0f}" for k, v in e["peak_rss_mib"].items()),
        f"{e['bytes_per_step_to_discriminator_measured']:,.0f}",
        f"{e['computed_vs_measured']:.3f}",
    )
    table.add_row(
        "ABNet",
        f"{a['sentences_per_step_run']} / {a['sentences_per_step_paper']} x {a['src_len']}",
        f"{as_['median']:.2f} ({as_['min']:.2f}-{as_['max']:.2f})",
        f"{a['step_s_paper_batch_estimate']:,.0f}",
        ", ".join(f"{k} {v:,.0f}" for k, v in a["peak_rss_mib"].items()),
        f"{a['bytes_per_step_measured']['forward']:,.0f} / "
        f"{a['bytes_per_step_measured']['backward']:,.0f}",
        f"{a['computed_vs_measured']['forward']:.3f} / {a['computed_vs_measured']['backward']:.3f}",
    )
    console.print(table)
    rows = Table(title="ABNet bytes per step at the paper's sizes, Table 5's codec rows")
    for column in (
        "forward / backward",
        "forward B",
        "backward B",
        "vs none",
        "60 Mbit/s s",
        "10 Mbit/s s",
        "chosen",
    ):
        rows.add_column(column, justify="right")
    for figures in a["table5_rows_paper_sizes"].values():
        rows.add_row(
            figures["label"],
            f"{figures['forward']:,}",
            f"{figures['backward']:,}",
            f"{figures['bytes_vs_none']:.3f}",
            f"{figures['link_s_per_step_60mbit']:.2f}",
            f"{figures['link_s_per_step_10mbit']:.2f}",
            f"{', '.join(figures['forward_spec'])} / {figures['backward_spec']}",
        )
    console.print(rows)


if __name__ == "__main__":
    main()

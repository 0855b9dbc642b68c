"""Benchmark the compression codecs against exact SVD: on a real ABNet activation stream
and on synthetic activation-like matrices.

The real stream: ABNet's encoder (the Table 5 bench's PLM, bench/table5.py) trains
with float32 links for STREAM_STEPS steps; each step's activations, a different batch
of sentences through adapters that moved, are one (sentences x positions) x width
matrix. Power iteration encodes the stream cold (a fresh codec per matrix) and warm
(one codec for the stream, as a role keeps it), beside exact SVD at the same rank, in
interleaved order per matrix. The synthetic shapes (a fixed matrix plus 2% noise per
step, which flatters warm starts) give the per-codec costs.

Prints the tables and writes bench/results/compression.json. Every speed figure is a
ratio against the exact SVD run in the same process, so a loaded machine shifts all
rows alike.

    python bench/compression.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workers.compression import Codec, parse_spec, relative_error, transfer_seconds

RESULTS = Path(__file__).parent / "results" / "compression.json"
CLOCK = time.thread_time
"""CPU seconds of this thread (torch runs on it alone, set_num_threads(1)): on a machine that
other builds load, wall time measures who else ran as much as the codec."""
LINK_BPS = 60e6  # the paper's slow link, 60 Mbit/s
WARMUP_STEPS = 6
REPEATS = 3
RATIO = 0.2
SHAPES = [(4096, 768)]
STREAM_STEPS = 24  # real activation matrices
STREAM_WARMUP = 4  # left out of the warm figures
STREAM_BATCH = 64  # sentences per matrix: 64 x 24 positions x 256 wide


def real_activation_stream(steps: int, progress: Progress, console: Console) -> list[torch.Tensor]:
    """ABNet encoder activations of `steps` consecutive training steps, one matrix each."""
    from bench.table5 import N_TRAIN, PLM_SEED, SEED, pretrained_plm
    from workers.training.abnet import abnet_preset
    from workers.training.abnet.sides import DecoderSide, EncoderSide
    from workers.training.data import tsv_side, write_demo_corpus
    from workers.training.electra import load_pretrained

    del PLM_SEED
    with tempfile.TemporaryDirectory() as tmp:
        corpus = write_demo_corpus(Path(tmp))
        plm_bytes = pretrained_plm(corpus["text"].read_text(encoding="utf-8").splitlines(), console)
        train = corpus["parallel.train"].read_text(encoding="utf-8").splitlines()[:N_TRAIN]
    plm = load_pretrained(plm_bytes)
    cfg = abnet_preset(
        "tiny", batch_size=STREAM_BATCH, micro_batches=1, adapter_dim=64, warmup_steps=5
    )
    enc = EncoderSide(cfg, plm, tsv_side(train, 0), SEED, "cpu")
    dec = DecoderSide(cfg, load_pretrained(plm_bytes), tsv_side(train, 1), enc.d_model, SEED, "cpu")
    task = progress.add_task("real ABNet activations", total=steps)
    out = []
    for k in range(1, steps + 1):
        index = enc.indices(k, 0)
        h, src_len = enc.forward(enc.data[index])  # (B, S, C)
        out.append(h.detach().reshape(-1, h.shape[-1]).clone())
        grad, _ = dec.train_micro(index, h.detach(), src_len)
        h.backward(grad)
        enc.step(k)
        dec.step(k)
        progress.advance(task)
    return out


def bench_real_stream(
    matrices: list[torch.Tensor], rounds: int, progress: Progress, console: Console
) -> dict[str, Any]:
    """Exact SVD, power iteration cold and warm, and the stream basis, on each matrix of
    the stream, interleaved matrix by matrix, in `rounds` rounds (fresh stateful codecs
    each, the order rotating from round to round); the load average is read after each
    round. The stream basis is coded by one codec and decoded by another, as the two ends
    of a link do: the receiver knows only the bases that crossed."""
    spec_svd, spec_power = f"lowrank({RATIO})", f"lowrank({RATIO},method=power)"
    spec_power0 = f"lowrank({RATIO},method=power,oversample=0)"
    spec_stream = f"lowrank({RATIO},method=stream)"
    labels = ("svd", "cold", "warm", "warm_oversample0", "stream")
    per_round: list[dict[str, list[tuple[float, float, int]]]] = []
    loads: list[float] = []
    task = progress.add_task("codecs on the real stream (rounds)", total=rounds * len(matrices))
    for round_ in range(rounds):
        warm = {"warm": parse_spec(spec_power), "warm_oversample0": parse_spec(spec_power0)}
        sender, receiver = parse_spec(spec_stream), parse_spec(spec_stream)
        rows: dict[str, list[tuple[float, float, int]]] = {label: [] for label in labels}
        order = labels[round_ % len(labels) :] + labels[: round_ % len(labels)]
        for x in matrices:
            for label in order:
                if label == "stream":
                    enc, dec, nbytes, err = once(sender, x, receiver)
                else:
                    codec = {"svd": parse_spec(spec_svd), "cold": parse_spec(spec_power)}.get(label)
                    enc, dec, nbytes, err = once(codec or warm[label], x)
                rows[label].append((enc + dec, err, nbytes))
            progress.advance(task)
        per_round.append(rows)
        loads.append(round(os.getloadavg()[0], 2))
    after = slice(STREAM_WARMUP, None)

    def ratios(
        rows: dict[str, list[tuple[float, float, int]]], label: str, what: int
    ) -> list[float]:
        return [
            a[what] / b[what] for a, b in zip(rows[label][after], rows["svd"][after], strict=True)
        ]

    m, n = matrices[0].shape
    table = Table(
        title=f"real ABNet activations: {len(matrices)} steps of {m} x {n}, r = {RATIO}, "
        f"figures over steps {STREAM_WARMUP + 1}-{len(matrices)}, {rounds} interleaved rounds "
        f"(load {', '.join(map(str, loads))})"
    )
    for column in (
        "codec",
        "ms (median)",
        "time / svd: median of rounds",
        "rounds",
        "error / optimal median",
        "min",
        "max",
        "bytes / svd's",
    ):
        table.add_column(column, justify="left" if column == "codec" else "right")
    figures: dict[str, Any] = {"real_stream_rounds": rounds, "real_stream_load_per_round": loads}
    for label in labels:
        errs = ratios(per_round[0], label, 1)  # deterministic: the same in every round
        times = [statistics.median(ratios(rows, label, 0)) for rows in per_round]
        ms = statistics.median(t for rows in per_round for t, _, _ in rows[label][after]) * 1e3
        # bytes over the whole stream, the matrices that carry a basis too
        bytes_ratio = sum(b for _, _, b in per_round[0][label]) / sum(
            b for _, _, b in per_round[0]["svd"]
        )
        table.add_row(
            {
                "svd": "exact SVD (optimal)",
                "cold": "power, cold",
                "warm": "power, warm",
                "warm_oversample0": "power, warm, oversample=0",
                "stream": "stream basis (warm)",
            }[label],
            f"{ms:.1f}",
            f"{statistics.median(times):.3f}",
            ", ".join(f"{t:.3f}" for t in times),
            f"{statistics.median(errs):.4f}",
            f"{min(errs):.4f}",
            f"{max(errs):.4f}",
            f"{bytes_ratio:.3f}",
        )
        figures[f"real_stream_{label}_bytes_vs_svd"] = bytes_ratio
        figures[f"real_stream_{label}_ms"] = ms
        figures[f"real_stream_{label}_error_vs_optimal"] = statistics.median(errs)
        figures[f"real_stream_{label}_error_vs_optimal_max"] = max(errs)
        figures[f"real_stream_{label}_time_vs_svd"] = statistics.median(times)
        figures[f"real_stream_{label}_time_vs_svd_rounds"] = times
        figures[f"real_stream_{label}_time_vs_svd_spread"] = max(times) - min(times)
    figures["real_stream_optimal_error"] = statistics.median(
        e for _, e, _ in per_round[0]["svd"][after]
    )
    console.print(table)
    return figures


LOWRANK_INPUT_RANKS = (26, 52, 64, 128)  # of the gradient's 1536 x 256: k = 52 at r = 0.2


def bench_lowrank_inputs(
    shape: tuple[int, int], steps: int, progress: Progress, console: Console
) -> dict[str, float]:
    """Warm power iteration on streams of rank-deficient matrices of the gradient's shape.

    Each stream keeps its rank r: X_t = U (S + N_t) V^T with fixed bases and a fresh 2%
    r x r perturbation per step. Ranks <= k must come back exactly (absolute error); for
    ranks > k the error is a ratio to the optimal rank-k error, as elsewhere.
    """
    m, n = shape
    k = math.ceil(RATIO * min(m, n))
    figures: dict[str, float] = {}
    table = Table(title=f"rank-deficient {m} x {n} streams, r = {RATIO} (k = {k}), warm power")
    for column in (
        "rank",
        "rel error (max)",
        "optimal",
        "error / optimal median",
        "max",
        "oversample=0 median",
    ):
        table.add_column(column, justify="right")
    task = progress.add_task("rank-deficient streams", total=len(LOWRANK_INPUT_RANKS) * steps)
    ratios_above_k: list[float] = []
    ratios0_above_k: list[float] = []  # the same streams without oversampling
    for rank in LOWRANK_INPUT_RANKS:
        g = torch.Generator().manual_seed(rank)
        u, _ = torch.linalg.qr(torch.randn(m, rank, generator=g, dtype=torch.float64))
        v, _ = torch.linalg.qr(torch.randn(n, rank, generator=g, dtype=torch.float64))
        s = torch.diag(1.0 / torch.arange(1, rank + 1, dtype=torch.float64))
        codec = parse_spec(f"lowrank({RATIO},method=power)")
        codec0 = parse_spec(f"lowrank({RATIO},method=power,oversample=0)")
        errs, errs0, opts = [], [], []
        for step in range(steps):
            noise = 0.02 * torch.randn(rank, rank, generator=g, dtype=torch.float64) / rank
            x = (u @ (s + noise) @ v.T).float()
            _, _, _, err = once(codec, x)
            _, _, _, err0 = once(codec0, x)
            sv = torch.linalg.svdvals(x.double())
            optimal = float(sv[k:].square().sum().sqrt() / sv.square().sum().sqrt())
            if step >= STREAM_WARMUP:
                errs.append(err)
                errs0.append(err0)
                opts.append(optimal)
            progress.advance(task)
        if rank <= k:
            figures[f"lowrank_input_rank{rank}_max_error"] = max(errs)
            table.add_row(str(rank), f"{max(errs):.2e}", "0 (exact)", "", "", "")
        else:
            ratios = [e / o for e, o in zip(errs, opts, strict=True)]
            ratios_above_k.extend(ratios)
            ratios0 = [e / o for e, o in zip(errs0, opts, strict=True)]
            ratios0_above_k.extend(ratios0)
            figures[f"lowrank_input_rank{rank}_error_vs_optimal_oversample0"] = statistics.median(
                ratios0
            )
            figures[f"lowrank_input_rank{rank}_error_vs_optimal"] = statistics.median(ratios)
            table.add_row(
                str(rank),
                f"{max(errs):.2e}",
                f"{statistics.median(opts):.2e}",
                f"{statistics.median(ratios):.4f}",
                f"{max(ratios):.4f}",
                f"{statistics.median(ratios0):.4f}",
            )
    figures["lowrank_input_error_vs_optimal"] = statistics.median(ratios_above_k)
    figures["lowrank_input_error_vs_optimal_max"] = max(ratios_above_k)
    figures["lowrank_input_error_vs_optimal_oversample0"] = statistics.median(ratios0_above_k)
    figures["lowrank_input_exact_max_error"] = max(
        v for key, v in figures.items() if key.endswith("_max_error")
    )
    console.print(table)
    return figures


def activation_like(m: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """Gaussian rows through a decaying spectrum s_i = 1 / (i + 1): activation-like data."""
    g = torch.randn(m, n, generator=generator) / math.sqrt(m)
    v, _ = torch.linalg.qr(torch.randn(n, n, generator=generator))
    s = 1.0 / torch.arange(1, n + 1, dtype=torch.float32)
    return (g * s) @ v.T


def stream(base: torch.Tensor, steps: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Successive steps: the base matrix plus 2% fresh noise each step."""
    scale = 0.02 * float(base.norm()) / math.sqrt(base.numel())
    return [base + scale * torch.randn(base.shape, generator=generator) for _ in range(steps)]


def once(
    codec: Codec, x: torch.Tensor, receiver: Codec | None = None
) -> tuple[float, float, int, float]:
    """Encode and decode seconds, bytes and error of one run (decoded by `receiver`, the
    far end's codec of a stateful pair, when given)."""
    start = CLOCK()
    blob = codec.encode(x)
    middle = CLOCK()
    y = (receiver or codec).decode(blob)
    return middle - start, CLOCK() - middle, len(blob), relative_error(x, y)


def timed(codec: Codec, x: torch.Tensor) -> tuple[float, float, int, float]:
    """Encode and decode seconds (median of REPEATS), bytes and error of the last run."""
    encodes, decodes = [], []
    blob, y = b"", x
    for _ in range(REPEATS):
        start = CLOCK()
        blob = codec.encode(x)
        middle = CLOCK()
        y = codec.decode(blob)
        encodes.append(middle - start)
        decodes.append(CLOCK() - middle)
    return statistics.median(encodes), statistics.median(decodes), len(blob), relative_error(x, y)


def torch_svd_lowrank(x: torch.Tensor, k: int) -> tuple[float, float]:
    """Seconds and error of torch.svd_lowrank (q = k, niter = 2) plus the product."""
    times = []
    y = x
    for _ in range(REPEATS):
        start = CLOCK()
        u, s, v = torch.svd_lowrank(x, q=k, niter=2)
        y = (u * s) @ v.T
        times.append(CLOCK() - start)
    return statistics.median(times), relative_error(x, y)


def bench_shape(m: int, n: int, progress: Progress, console: Console) -> dict[str, float]:
    """All codecs on one m x n stream; returns named figures."""
    generator = torch.Generator().manual_seed(m * 7 + n)
    base = activation_like(m, n, generator)
    steps = stream(base, WARMUP_STEPS + 1, generator)
    x = steps[-1]
    k = math.ceil(RATIO * min(m, n))
    fp32_bytes = 4 * x.numel()
    rows: list[tuple[str, float, float, int, float]] = []
    figures: dict[str, float] = {}
    plan: list[tuple[str, str, int]] = [
        ("svd r=0.2 (exact, baseline)", "lowrank(0.2)", 0),
        ("rsvd r=0.2", "lowrank(0.2,method=rsvd)", 0),
        ("power r=0.2 (cold, 1 step)", "lowrank(0.2,method=power)", 0),
        (f"power r=0.2 (after {WARMUP_STEPS} steps)", "lowrank(0.2,method=power)", WARMUP_STEPS),
        ("none (fp32)", "none", 0),
        ("fp16", "fp16", 0),
        ("bf16", "bf16", 0),
        ("int8", "int8", 0),
        ("int8 stochastic", "int8(stochastic=true)", 0),
        ("fp16(power r=0.2)", "fp16(lowrank(0.2,method=power))", WARMUP_STEPS),
        ("int8(power r=0.2)", "int8(lowrank(0.2,method=power))", WARMUP_STEPS),
        ("fp16(rsvd r=0.2)", "fp16(lowrank(0.2,method=rsvd))", 0),
        ("fp16(svd r=0.9)", "fp16(lowrank(0.9))", 0),
    ]
    task = progress.add_task(f"{m} x {n}", total=REPEATS * len(plan) + 2)
    codecs = [parse_spec(spec) for _, spec, _ in plan]
    for codec, (_, _, warmup) in zip(codecs, plan, strict=True):
        for step in steps[:warmup]:
            codec.encode(step)
    # rounds interleave every codec with the SVD baseline, so load from other processes
    # lands on the baseline and the codecs alike; the cold power step is measured once
    samples: list[list[tuple[float, float, int, float]]] = [[] for _ in plan]
    for round_ in range(REPEATS):
        for index, (codec, (label, _, _)) in enumerate(zip(codecs, plan, strict=True)):
            if "cold" not in label or round_ == 0:
                samples[index].append(once(codec, x))
            progress.advance(task)
    time_ratios: dict[str, float] = {}
    svd_rounds = [enc + dec for enc, dec, _, _ in samples[0]]
    for (label, _, _), runs in zip(plan, samples, strict=True):
        ratios = [(enc + dec) / svd_rounds[i] for i, (enc, dec, _, _) in enumerate(runs)]
        enc = statistics.median(r[0] for r in runs)
        dec = statistics.median(r[1] for r in runs)
        time_ratios[label] = statistics.median(ratios)
        rows.append((label, enc, dec, runs[-1][2], runs[-1][3]))
    for codec, (_, _, nbytes, _) in zip(codecs, (r[-1] for r in samples), strict=True):
        assert nbytes == codec.wire_nbytes(x.shape)
    svd_time = rows[0][1] + rows[0][2]
    optimal = rows[0][4]
    ref_time, ref_err = torch_svd_lowrank(x, k)
    progress.advance(task)

    # activations (B, T, H): one (B T) x H matrix or B matrices of T x H
    batch = 8
    act = x.reshape(batch, m // batch, n)
    layouts = {}
    for layout in ("flat", "sample"):
        codec = parse_spec(f"fp16(lowrank(0.2,method=power,layout={layout}))")
        for step in steps[:WARMUP_STEPS]:
            codec.encode(step.reshape(act.shape))
        enc, dec, nbytes, err = timed(codec, act)
        layouts[layout] = (enc + dec, nbytes, err)
    progress.advance(task)

    table = Table(title=f"{m} x {n} float32, r = {RATIO} (k = {k}), link {LINK_BPS / 1e6:g} Mbit/s")
    for column in (
        "codec",
        "encode ms",
        "decode ms",
        "time / svd",
        "bytes / fp32",
        "rel error",
        "error / optimal",
        "wire s",
        "saved s",
    ):
        table.add_column(column, justify="left" if column == "codec" else "right")
    wire_fp32 = transfer_seconds(fp32_bytes, LINK_BPS)
    for label, enc, dec, nbytes, err in rows:
        wire = transfer_seconds(nbytes, LINK_BPS)
        table.add_row(
            label,
            f"{enc * 1e3:.1f}",
            f"{dec * 1e3:.1f}",
            f"{time_ratios[label]:.3f}",
            f"{nbytes / fp32_bytes:.4f}",
            f"{err:.2e}",
            f"{err / optimal:.3f}" if "r=0.2" in label else "",
            f"{wire:.3f}",
            f"{wire_fp32 - wire - enc - dec:.3f}",
        )
    table.add_row(
        "torch.svd_lowrank q=k niter=2",
        f"{ref_time * 1e3:.1f}",
        "",
        f"{ref_time / svd_time:.3f}",
        "",
        f"{ref_err:.2e}",
        f"{ref_err / optimal:.3f}",
        "",
        "",
    )
    for layout, (seconds, nbytes, err) in layouts.items():
        table.add_row(
            f"fp16(power r=0.2) {batch} x ({m // batch} x {n}) {layout}",
            f"{seconds * 1e3:.1f}",
            "(enc+dec)",
            f"{seconds / svd_time:.3f}",
            f"{nbytes / fp32_bytes:.4f}",
            f"{err:.2e}",
            "",
            f"{transfer_seconds(nbytes, LINK_BPS):.3f}",
            "",
        )
    console.print(table)

    by_label = {label: (enc, dec, nbytes, err) for label, enc, dec, nbytes, err in rows}

    def time_of(label: str) -> float:
        return by_label[label][0] + by_label[label][1]

    def err_of(label: str) -> float:
        return by_label[label][3]

    warm = f"power r=0.2 (after {WARMUP_STEPS} steps)"
    figures["svd_r02_ms"] = svd_time * 1e3
    figures["optimal_error_r02"] = optimal

    figures["power_r02_time_vs_svd"] = time_ratios[warm]
    figures["power_r02_speedup_vs_svd"] = 1 / time_ratios[warm]
    figures["power_r02_error_vs_optimal"] = err_of(warm) / optimal
    figures["power_r02_cold_error_vs_optimal"] = err_of("power r=0.2 (cold, 1 step)") / optimal
    figures["rsvd_r02_time_vs_svd"] = time_ratios["rsvd r=0.2"]
    figures["rsvd_r02_speedup_vs_svd"] = 1 / time_ratios["rsvd r=0.2"]
    figures["rsvd_r02_error_vs_optimal"] = err_of("rsvd r=0.2") / optimal
    figures["torch_svd_lowrank_time_vs_svd"] = ref_time / svd_time
    figures["torch_svd_lowrank_error_vs_optimal"] = ref_err / optimal
    for label, key in (("fp16", "fp16"), ("int8", "int8"), ("none (fp32)", "none")):
        figures[f"{key}_ms"] = time_of(label) * 1e3
    figures["fp16_power_r02_bytes_ratio"] = by_label["fp16(power r=0.2)"][2] / fp32_bytes
    figures["fp16_power_r02_error_vs_optimal"] = err_of("fp16(power r=0.2)") / optimal
    figures["int8_power_r02_bytes_ratio"] = by_label["int8(power r=0.2)"][2] / fp32_bytes
    figures["fp16_svd_r09_dense_fallback"] = float(
        parse_spec("fp16(lowrank(0.9))").plan(x.shape).dense_fallback
    )
    # forward activations fp16(lowrank(0.2)), backward gradients int8, one tensor each way
    codec_s = time_of("fp16(power r=0.2)") + time_of("int8")
    saved_s = 2 * wire_fp32 - transfer_seconds(
        by_label["fp16(power r=0.2)"][2] + by_label["int8"][2], LINK_BPS
    )
    figures["fp16_lowrank_int8_codec_s"] = codec_s
    figures["fp16_lowrank_int8_saved_transfer_s"] = saved_s
    figures["fp16_lowrank_int8_codec_vs_saved"] = codec_s / saved_s
    for layout, (seconds, nbytes, err) in layouts.items():
        figures[f"activations_{layout}_time_vs_svd"] = seconds / svd_time
        figures[f"activations_{layout}_bytes_ratio"] = nbytes / fp32_bytes
        figures[f"activations_{layout}_rel_error"] = err
    progress.advance(task)
    return figures


def main() -> None:
    """Run the real stream and every shape, print the tables, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="a short real stream, no synthetic shapes"
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    console = Console(width=170)
    load_before = [round(x, 2) for x in os.getloadavg()]
    results: dict[str, object] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "stream_steps": STREAM_STEPS,
        "stream_warmup": STREAM_WARMUP,
        "link_bps": LINK_BPS,
        "ratio": RATIO,
        "warmup_steps": WARMUP_STEPS,
        "notes": (
            "*_time_vs_svd = (encode + decode) / exact SVD encode + decode in the same run, "
            "in CPU seconds of the one thread torch uses (time.thread_time), not wall time; "
            "*_error_vs_optimal = relative error / optimal truncated-SVD error at the same rank; "
            "real_stream_*: consecutive ABNet activations (medians over the stream after "
            "the warm-up; times: the median over interleaved rounds of each round's median "
            "ratio, with the rounds, their spread (max - min) and the 1-minute load average "
            "after each round); the top-level power_* ratios are the real stream's warm power "
            "iteration; synthetic_* figures come from the first synthetic shape; "
            "warm_oversample0 / *_oversample0: power iteration without the 4 columns past k "
            "it keeps by default; stream: lowrank(0.2,method=stream), one basis per "
            "stream, coded and decoded by two codecs as a link's ends, its bytes over the "
            "whole stream (bases included) against exact SVD's; "
            "power_error_vs_optimal_lowrank_input: warm power iteration on streams of "
            "rank-deficient 1536 x 256 matrices (the gradient's shape) of rank 64 and 128 "
            "> k = 52, median over steps; ranks 26 and 52 <= k must come back exactly "
            "(power_max_error_exact_lowrank_input); the machine is shared with other "
            "builds, see the load averages"
        ),
    }
    run: Callable[[int, int], dict[str, float]]
    steps = 10 if args.quick else STREAM_STEPS
    with Progress(console=console) as progress:
        real = bench_real_stream(
            real_activation_stream(steps, progress, console), args.rounds, progress, console
        )

        def run(m: int, n: int) -> dict[str, float]:
            return bench_shape(m, n, progress, console)

        per_shape = {} if args.quick else {f"{m}x{n}": run(m, n) for m, n in SHAPES}
        lowrank_inputs = bench_lowrank_inputs(
            (STREAM_BATCH * 24, 256), 10 if args.quick else STREAM_STEPS, progress, console
        )
    results["real_stream"] = real
    results["shapes"] = per_shape
    results["power_error_vs_optimal_real_stream"] = real["real_stream_warm_error_vs_optimal"]
    results["power_cold_error_vs_optimal_real_stream"] = real["real_stream_cold_error_vs_optimal"]
    results["power_time_vs_svd"] = real["real_stream_warm_time_vs_svd"]
    results["power_time_vs_svd_rounds"] = real["real_stream_warm_time_vs_svd_rounds"]
    results["power_time_vs_svd_spread"] = real["real_stream_warm_time_vs_svd_spread"]
    results["stream_time_vs_svd"] = real["real_stream_stream_time_vs_svd"]
    results["stream_error_vs_optimal_real_stream"] = real["real_stream_stream_error_vs_optimal"]
    results["stream_bytes_vs_svd_real_stream"] = real["real_stream_stream_bytes_vs_svd"]
    results["load_average_per_round"] = real["real_stream_load_per_round"]
    results["lowrank_inputs"] = lowrank_inputs
    results["power_error_vs_optimal_lowrank_input"] = lowrank_inputs[
        "lowrank_input_error_vs_optimal"
    ]
    results["power_max_error_exact_lowrank_input"] = lowrank_inputs["lowrank_input_exact_max_error"]
    if per_shape:
        first = per_shape[f"{SHAPES[0][0]}x{SHAPES[0][1]}"]
        results.update({f"synthetic_{key}": first[key] for key in sorted(first)})
    results["load_average_before"] = load_before
    results["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    results["cpus"] = os.cpu_count()
    path = RESULTS.with_name("compression.quick.json") if args.quick else RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()

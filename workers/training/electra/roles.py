"""Scenario-I's two roles, each a `RoleLoop` (workers/training/role.py) around its step.

- `run_electra_generator` (cluster G) masks, predicts and samples with the
  generator (`GeneratorSide`, sides.py) and sends corrupted batches (wire.py).
  G does not wait for D: it may run `max_lag` steps ahead of the last
  `StepSync` D sent, and its sends go out on a background thread while it
  computes the next micro-batch. With `max_lag: auto` the lead follows the
  measured round trip and both roles' step times (pace.py).
- `run_electra_discriminator` (cluster D) trains the discriminator on them.
  With `n_discriminators = n`, G produces n micro-batches per step; the root D
  scatters them to n data-parallel replicas (torch.distributed, gloo on CPU,
  nccl on GPU; replicas.py) which average their gradients, then the root
  syncs with G. It writes the `model` artifact (artifact.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from tokenizers import Tokenizer

from workers.switch.link import Link
from workers.training.checkpoints import restore_training_state, training_state
from workers.training.data import SpecialIds, clean_lines, encode_lines, lines_digest
from workers.training.electra.artifact import export_pretrained, load_pretrained
from workers.training.electra.config import ElectraConfig
from workers.training.electra.model import CorruptedBatch, Initial
from workers.training.electra.pace import AUTO, AutoLag, auto_lag_cap
from workers.training.electra.replicas import discriminator_replicas
from workers.training.electra.sides import DiscriminatorSide, GeneratorSide, job_tokenizer
from workers.training.electra.wire import (
    BATCH,
    HELLO,
    STOP_MESSAGE,
    SYNC,
    decode_batch,
    encode_batch,
)
from workers.training.hooks import Hooks, ReportableError, RoleResult
from workers.training.messages import expect_bytes, unpack_message
from workers.training.pipeline import AsyncSender
from workers.training.role import RoleLoop, StepSync, TrainingState

GENERATOR, DISCRIMINATOR = "electra-generator", "electra-discriminator"


# ---------------------------------------------------------------- pretrained starts


def initial_model(blob: bytes, cfg: ElectraConfig, what: str) -> tuple[Initial, Tokenizer]:
    """A `model` input (a Nebula model file or an imported Hugging Face folder) as the start
    of one ELECTRA model, with the tokenizer it brings (never retrained)."""
    plm = load_pretrained(blob)
    positions = plm.config.max_len - max(plm.config.position_pad_id + 1, 0)
    if cfg.seq_len > positions:
        raise ValueError(f"seq_len {cfg.seq_len} exceeds {what}'s {positions} positions")
    return (plm.config, plm.discriminator), plm.tokenizer


# ---------------------------------------------------------------- the generator role


def run_electra_generator(
    cfg: ElectraConfig,
    link: Link,
    text_lines: Iterable[str],
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    seed: int = 0,
    device: str = "cpu",
    init_model: bytes | None = None,
) -> RoleResult:
    """Scenario-I, cluster G: train the generator and feed corrupted batches to D.

    `init_model` (the job's `init_generator`) starts G from a pretrained model, whose
    tokenizer then is the job's.
    """
    lines = clean_lines(text_lines)
    if len(lines) < cfg.batch_size:
        raise ReportableError(f"need at least {cfg.batch_size} lines of text, got {len(lines)}")
    loop = RoleLoop.of(GENERATOR, cfg, link, hooks or Hooks(), ckpt_dir, channel=HELLO)
    init: Initial | None = None
    if init_model is not None:
        init, tok = initial_model(init_model, cfg, "init_generator")
    else:
        tok = job_tokenizer(cfg, lines, loop.store)
    V = tok.get_vocab_size()
    ids = encode_lines(tok, lines, cfg.seq_len)
    special = SpecialIds.of(tok)
    side = GeneratorSide(cfg, ids, V, seed, device, special=special, init=init)

    digest = lines_digest(lines)
    mine = {"config": asdict(cfg), "seed": seed, "tokenizer": tok.to_str(), "text_digest": digest}
    peer = loop.hello(mine, peer_role=DISCRIMINATOR, what="ELECTRA roles")
    mode = "shared" if peer["text_digest"] == digest else "full"
    start = loop.resume(
        lambda t, meta: restore_training_state(t, meta, side.model, side.opt, side.generators())
    )

    sender = AsyncSender(link)
    last_synced, sent_total = start, 0
    pace = (
        AutoLag(auto_lag_cap(cfg.ckpt_every, cfg.keep_checkpoints)) if cfg.max_lag == AUTO else None
    )
    lag = pace.lag if pace is not None else int(cfg.max_lag)
    sent_at: dict[int, float] = {}  # with `auto`: when each step's last batch was sent

    def take_sync() -> None:
        nonlocal last_synced, lag
        asked = time.perf_counter()
        sync = StepSync.from_payload(link.recv(SYNC, timeout=cfg.recv_timeout_s))
        received = time.perf_counter()
        last_synced = sync.step
        sent = sent_at.pop(sync.step, None)
        if pace is not None and sent is not None and sync.step_s is not None:
            waited = sync.waited_s or 0.0
            lag = pace.synced(sent, received, received - asked, sync.step_s, waited)
        if sync.stop:
            loop.peer_stopped()

    for k in loop.steps():
        while k - last_synced > lag and not loop.stopped_by_peer:
            take_sync()  # pace: D is more than `lag` steps behind
        if loop.stopped_by_peer:
            break
        t0 = time.perf_counter()
        mlm, tokens, sent = 0.0, 0, 0
        for m in range(cfg.n_discriminators):
            index, original, batch, loss = side.micro_batch(k, m)
            blob = encode_batch(mode, k, m, index, original, batch, V, len(ids))
            sender.send(BATCH, blob)  # goes out while the next micro-batch computes
            mlm += loss / cfg.n_discriminators
            tokens += int((original != special.pad).sum())
            sent += len(blob)
        if pace is not None:  # what D waits on: the step's last batch
            sent_at[k] = time.perf_counter()
            pace.generator_stepped(sent_at[k] - t0)
        side.step(k)
        sent_total += sent
        loop.finished(k, lambda: training_state(side.model, side.opt, side.generators()))
        loop.report(
            k,
            {
                "mlm_loss": mlm,
                "tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
                "bytes_to_discriminator": float(sent),
                "bytes_to_discriminator_total": float(sent_total),
                "bytes_per_token": sent / max(tokens, 1),
                **(pace.metrics() if pace is not None else {}),
            },
        )
    if loop.cancelled:
        sender.send(BATCH, STOP_MESSAGE)
    sender.close()
    while last_synced < loop.result.last_step and not loop.stopped_by_peer:
        take_sync()  # let D finish every step that was sent
    loop.result.extra["mode_shared"] = float(mode == "shared")
    return loop.result


# ---------------------------------------------------------------- the discriminator role


def run_electra_discriminator(
    cfg: ElectraConfig,
    link: Link,
    text_lines: Iterable[str] | None,
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    seed: int = 0,
    device: str = "cpu",
    init_model: bytes | None = None,
) -> RoleResult:
    """Scenario-I, cluster D: train the discriminator (n replicas) on what G sends.

    `init_model` (the job's `init_discriminator`) starts D from a pretrained model; its
    tokenizer must be the generator's (the job's), and there is one replica.

    `text_lines` is None when this cluster may not read the job's text (full
    mode). The result's `artifact` is `ckpt_dir / "model.safetensors"`, the
    trained discriminator with its tokenizer (see `export_pretrained`).
    """
    hooks = hooks or Hooks()
    loop = RoleLoop.of(DISCRIMINATOR, cfg, link, hooks, ckpt_dir, channel=HELLO)
    lines = clean_lines(text_lines) if text_lines is not None else None
    digest = lines_digest(lines) if lines is not None else None
    mine = {"config": asdict(cfg), "seed": seed, "text_digest": digest}
    peer = loop.hello(mine, peer_role=GENERATOR, what="ELECTRA roles")
    tok = Tokenizer.from_str(peer["tokenizer"])
    V = tok.get_vocab_size()
    special = SpecialIds.of(tok)
    init: Initial | None = None
    if init_model is not None:
        init, own = initial_model(init_model, cfg, "init_discriminator")
        if own.get_vocab() != tok.get_vocab():
            raise ValueError(
                "init_discriminator's tokenizer is not the generator's: give init_generator "
                "a model with the same vocabulary (an ELECTRA generator and discriminator pair)"
            )
        if cfg.n_discriminators != 1:
            raise ValueError("init_discriminator needs n_discriminators = 1")
    shared = lines is not None and peer["text_digest"] == digest
    text_ids = encode_lines(tok, lines, cfg.seq_len) if shared and lines is not None else None
    start = loop.resume(lambda _t, _meta: None)  # restored below, once the replicas joined
    n = cfg.n_discriminators

    with discriminator_replicas(cfg, seed, device, loop.store, V, start, hooks) as group:
        side = DiscriminatorSide(cfg, V, seed, group.device, special=special, init=init)
        if start:
            tensors, meta = loop.store.load(start)
            restore_training_state(tensors, meta, side.model, side.opt, side.generators())
            group.restore_rng(tensors, side)
        sender = AsyncSender(link)
        sent_total = 0
        timed = cfg.max_lag == AUTO  # G then sets its lead by D's timings (pace.py)
        for k in loop.steps():
            t0 = time.perf_counter()
            batches: list[CorruptedBatch] = []
            received = waited = 0.0
            for _ in range(n):
                asked = time.perf_counter()
                blob = expect_bytes(link.recv(BATCH, timeout=cfg.recv_timeout_s))
                received = time.perf_counter()
                waited = received - asked  # the last batch's counts: what G's lead covers
                header, arrays = unpack_message(blob)
                if header["kind"] == "stop":
                    break
                if (header["step"], header["micro"]) != (k, len(batches)):
                    raise RuntimeError(f"out-of-order batch {header} at step {k}")
                batches.append(decode_batch(header, arrays, text_ids))
            if len(batches) < n:
                loop.peer_stopped()
                break
            rtd, acc, tokens = group.train_step(side, k, batches)
            side.step(k)
            held = time.perf_counter() - received
            timings = (held, waited) if timed else (None, None)
            sync = StepSync(k, rtd, acc, False, *timings).to_payload()  # keeps G at D's pace
            sender.send(SYNC, sync)
            sync_bytes = sync.numel() * sync.element_size()
            sent_total += sync_bytes

            def state() -> TrainingState:
                tensors, meta = training_state(side.model, side.opt, side.generators())
                tensors.update(group.gather_rng(side))
                return tensors, meta

            loop.finished(k, state)
            loop.report(
                k,
                {
                    "rtd_loss": rtd,
                    "rtd_accuracy": acc,
                    "tokens_per_s": tokens / max(time.perf_counter() - t0, 1e-9),
                    "bytes_to_generator": float(sync_bytes),
                    "bytes_to_generator_total": float(sent_total),
                },
            )
        if loop.cancelled:
            sender.send(SYNC, StepSync(loop.result.last_step, 0.0, 0.0, stop=True).to_payload())
        sender.close()
        result = loop.result
        result.extra["replica_max_abs_diff"] = group.replica_max_abs_diff(side)
        if not result.stopped:
            info = {"steps": result.last_step, "seed": seed, "preset_config": asdict(cfg)}
            result.artifact = loop.store.write_file(
                "model.safetensors", export_pretrained(side.model, tok, info)
            )
    return result

"""Both ABNet sides in one process, codecs applied in between: the reference of a split run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from workers.training.abnet.config import AbnetConfig
from workers.training.abnet.sides import DecoderSide, EncoderSide, bleu, check_lines, step_metrics
from workers.training.abnet.wire import BACKWARD, FORWARD, StreamDecoder, StreamEncoder, round_trip
from workers.training.data import encode_lines
from workers.training.electra import load_pretrained


@dataclass
class LocalAbnetRun:
    """Result of `train_abnet_local`."""

    encoder: EncoderSide
    decoder: DecoderSide
    history: list[dict[str, float]]
    bleu: float | None


def _stream(cfg: AbnetConfig, name: str, which: int) -> tuple[StreamEncoder, StreamDecoder]:
    return StreamEncoder(cfg, name, which), StreamDecoder(cfg, name, which)


def train_abnet_local(
    cfg: AbnetConfig,
    source_plm: bytes,
    target_plm: bytes,
    source_lines: Sequence[str],
    target_lines: Sequence[str],
    *,
    eval_source_lines: Sequence[str] | None = None,
    eval_target_lines: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
    steps: int | None = None,
) -> LocalAbnetRun:
    """Micro-batch by micro-batch, the activations and gradients through the roles' codecs.

    The same chunks, codec instances per stream and accumulation order as the split
    roles; `auto` sees no link measurement here (it picks the fewest bytes in its bound).
    Under `schedule: stale1` step k's forwards run on the encoder's weights after update
    k - 2 (workers/training/abnet/stale.py), the update the split roles make while the
    next step's forwards overlap this one's gradients; here the steps simply follow one
    another. The evaluation runs on the live weights, after the last update.
    """
    src_plm, tgt_plm = load_pretrained(source_plm, device), load_pretrained(target_plm, device)
    enc = EncoderSide(cfg, src_plm, check_lines(source_lines, "source"), seed, device)
    dec = DecoderSide(cfg, tgt_plm, check_lines(target_lines, "target"), enc.d_model, seed, device)
    forward, backward = _stream(cfg, "forward", FORWARD), _stream(cfg, "backward", BACKWARD)
    history = []
    last = steps or cfg.steps
    for k in range(1, last + 1):
        stats = []
        for m in range(cfg.micro_batches):
            index = enc.indices(k, m)
            h, src_len = enc.forward(enc.data[index], k)
            memory = round_trip(*forward, k, h, cfg.activation_chunks, src_len)
            grad, st = dec.train_micro(index, memory, src_len)
            h.backward(round_trip(*backward, k, grad, 1, src_len).to(h.device))
            stats.append(st)
        enc.step(k)
        dec.step(k)
        history.append(step_metrics(stats))
    score = None
    if eval_source_lines is not None and eval_target_lines is not None:
        evaluation = (
            StreamEncoder(cfg, "eval", FORWARD, warm_source=forward[0]),
            StreamDecoder(cfg, "eval", FORWARD),
        )
        src_ids = encode_lines(src_plm.tokenizer, list(eval_source_lines), cfg.src_len)
        hyps: list[str] = []
        for lo in range(0, len(src_ids), cfg.eval_batch_size):
            enc.model.eval()
            with torch.no_grad():
                h, src_len = enc.forward(src_ids[lo : lo + cfg.eval_batch_size])
            enc.model.train()
            memory = round_trip(*evaluation, last, h, cfg.activation_chunks, src_len)
            hyps += dec.translate(memory, src_len)
        score = bleu(hyps, [s.rstrip("\r\n") for s in eval_target_lines])
    return LocalAbnetRun(enc, dec, history, score)

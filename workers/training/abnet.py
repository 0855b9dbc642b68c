"""Scenario-II: ABNet translation fine-tuning split across a source and a target cluster.

ABNet (Guo et al. 2020, "Incorporating BERT into Parallel Sequence Decoding
with Adapters") keeps two pre-trained models frozen and trains only adapters:

- cluster S (encoder): the source-language PLM with an adapter (layer norm,
  down-projection, GELU, up-projection, residual) after each sub-layer;
- cluster T (decoder): the target-language PLM with the same adapters plus,
  in every layer, a cross-attention adapter (multi-head attention over the
  encoder output, feed-forward, layer norms, residuals), a length predictor and
  a new output layer (the PLM, a discriminator, has no language-model head).
  Training is conditional MLM (Mask-Predict: mask 1..L target tokens, predict
  them); inference is mask-predict iterative decoding over the top length
  candidates.

The last encoder layer's activations go S -> T through the forward codec,
their gradients T -> S through the backward codec (spec strings of
workers/compression, `fp16` and `int8` by default as in Nebula-I, `none`
until `compress_from_step`). S reads only source lines, T only target lines;
the i-th lines of both are a pair, and S tells T which indices a micro-batch
holds. S computes micro-batch k+1 while T works on k (one micro-batch in
flight); gradients are accumulated in micro-batch order, as
`train_abnet_local` does in one process, so a split run with `none` codecs
equals it.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import sacrebleu
import torch
import torch.nn.functional as F
from safetensors.torch import save as save_safetensors
from tokenizers import Tokenizer
from torch import nn

from contract.presets import ABNET_PRESETS, preset_values
from workers.switch.link import Link
from workers.training.bert import Dropout, Encoder, MultiHeadAttention, set_dropout_generator
from workers.training.data import CLS, MASK, PAD, SEP, SPECIAL_TOKENS, batch_indices, encode_lines
from workers.training.electra import PretrainedModel, load_pretrained
from workers.training.runtime import (
    AsyncSender,
    CheckpointStore,
    Codec,
    CodecBook,
    Hooks,
    RoleResult,
    expect_bytes,
    hello,
    linear_warmup_decay,
    pack_message,
    pack_uint,
    restore_training_state,
    resume_step,
    set_lr,
    training_state,
    unpack_int,
    unpack_message,
)

HELLO, META, ACT, GRAD, SYNC = "abnet.hello", "abnet.meta", "abnet.act", "abnet.grad", "abnet.sync"
N_SPECIAL = len(SPECIAL_TOKENS)
PAD_ID, CLS_ID, SEP_ID, MASK_ID = (SPECIAL_TOKENS.index(t) for t in (PAD, CLS, SEP, MASK))


@dataclass
class AbnetConfig:
    """One ABNet job. Defaults: `tiny`."""

    adapter_dim: int = 256  # bottleneck; wider than the tiny PLM: adapters carry the new task
    cross_heads: int = 4
    src_len: int = 24  # at most the PLM's positions; demo sentences have at most 17 tokens
    tgt_len: int = 24
    batch_size: int = 32  # sentence pairs per micro-batch
    micro_batches: int = 2  # per optimizer step; S computes k+1 while T works on k
    steps: int = 250
    lr: float = 2e-3  # adapters start as identities; a high rate is safe on the demo
    warmup_steps: int = 40
    weight_decay: float = 0.01
    dropout: float = 0.1  # in the adapters; the frozen PLMs run in eval mode
    length_loss_weight: float = 0.1  # Mask-Predict's
    decode_iterations: int = 4  # mask-predict refinement rounds
    length_candidates: int = 3  # Mask-Predict's length beam
    forward_codec: str = "fp16"  # activations S -> T (Nebula-I)
    backward_codec: str = "int8"  # gradients T -> S (Nebula-I)
    compress_from_step: int = 0  # steps before this one send float32 (`none`)
    ckpt_every: int = 100
    keep_checkpoints: int = 3
    eval_every: int = 0  # BLEU on the eval lines every N steps (0: only after the last step)
    eval_batch_size: int = 100
    recv_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if min(self.batch_size, self.micro_batches, self.steps, self.ckpt_every) < 1:
            raise ValueError("batch_size, micro_batches, steps and ckpt_every must be at least 1")
        if min(self.src_len, self.tgt_len) < 3 or self.adapter_dim < 1:
            raise ValueError("src_len and tgt_len must be at least 3, adapter_dim at least 1")
        if self.decode_iterations < 1 or self.length_candidates < 1:
            raise ValueError("decode_iterations and length_candidates must be at least 1")

    @classmethod
    def tiny(cls, **overrides: Any) -> AbnetConfig:
        """Reaches a clear BLEU on the demo corpus in a few CPU minutes (the defaults)."""
        return abnet_preset("tiny", **overrides)

    @classmethod
    def paper(cls, **overrides: Any) -> AbnetConfig:
        """Sizes for the `paper` ELECTRA models on GPUs."""
        return abnet_preset("paper", **overrides)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AbnetConfig:
        """The config a dict (e.g. a job's JSON) describes; unknown keys are an error."""
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown ABNet config keys: {sorted(unknown)}")
        return cls(**values)

    def codecs(self, step: int) -> tuple[str, str]:
        """Forward and backward codec specs in force at `step`."""
        if step < self.compress_from_step:
            return "none", "none"
        return self.forward_codec, self.backward_codec


def abnet_preset(name: str, **overrides: Any) -> AbnetConfig:
    """The `tiny` or `paper` config (contract.presets), with overrides."""
    return AbnetConfig(**preset_values(ABNET_PRESETS, name, **overrides))


# ---------------------------------------------------------------- adapters and the two models


class Adapter(nn.Module):
    """h + up(GELU(down(LN(h)))); `up` starts at zero so the frozen model is unchanged at first."""

    def __init__(self, d_model: int, d_adapter: int, dropout: float) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.down = nn.Linear(d_model, d_adapter)
        self.up = nn.Linear(d_adapter, d_model)
        self.drop = Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.drop(self.up(F.gelu(self.down(self.ln(h)))))  # (B, T, C)


class CrossAttentionAdapter(nn.Module):
    """Multi-head attention over the encoder output, then a feed-forward; pre-LN residuals."""

    def __init__(self, d_model: int, d_src: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, d_kv=d_src)
        self.ln_ff = nn.LayerNorm(d_model)
        self.ff_in = nn.Linear(d_model, d_ff)
        self.ff_out = nn.Linear(d_ff, d_model)
        self.drop = Dropout(dropout)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, memory_valid: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln_attn(x), memory, memory_valid))  # (B, T, C)
        return x + self.drop(self.ff_out(F.gelu(self.ff_in(self.ln_ff(x)))))


def _freeze(plm: Encoder) -> Encoder:
    for p in plm.parameters():
        p.requires_grad_(False)
    return plm.eval()


def _init_adapters(module: nn.Module, generator: torch.Generator) -> None:
    """Normal(0.02) weights except the output projections, which start at zero (identity)."""
    for name, m in module.named_modules():
        if name.startswith("plm"):
            continue
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02, generator=generator)
            nn.init.zeros_(m.bias)
            if name.endswith((".up", ".ff_out", ".attn.out")):
                nn.init.zeros_(m.weight)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class AdaptedEncoder(nn.Module):
    """Cluster S: the frozen source PLM with an adapter after each sub-layer."""

    def __init__(self, plm: Encoder, cfg: AbnetConfig) -> None:
        super().__init__()
        self.plm = _freeze(plm)
        d = plm.cfg.d_model
        n = plm.cfg.n_layers
        self.after_attn = nn.ModuleList(Adapter(d, cfg.adapter_dim, cfg.dropout) for _ in range(n))
        self.after_ffn = nn.ModuleList(Adapter(d, cfg.adapter_dim, cfg.dropout) for _ in range(n))

    def train(self, mode: bool = True) -> AdaptedEncoder:
        super().train(mode)
        self.plm.eval()  # the frozen model never drops out
        return self

    def forward(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        x = self.plm.embed(ids)  # (B, S, C)
        for block, a1, a2 in zip(self.plm.layers(), self.after_attn, self.after_ffn, strict=True):
            x = x + a1(block.attention(block.ln1(x), valid))
            x = x + a2(block.feed_forward(block.ln2(x)))
        return self.plm.ln_f(x)  # (B, S, C): what crosses to cluster T


class AdaptedDecoder(nn.Module):
    """Cluster T: the frozen target PLM with adapters, cross-attention adapters and heads."""

    def __init__(self, plm: Encoder, d_src: int, cfg: AbnetConfig) -> None:
        super().__init__()
        self.plm = _freeze(plm)
        d, n, a = plm.cfg.d_model, plm.cfg.n_layers, cfg.adapter_dim
        self.after_attn = nn.ModuleList(Adapter(d, a, cfg.dropout) for _ in range(n))
        self.cross = nn.ModuleList(
            CrossAttentionAdapter(d, d_src, cfg.cross_heads, a, cfg.dropout) for _ in range(n)
        )
        self.after_ffn = nn.ModuleList(Adapter(d, a, cfg.dropout) for _ in range(n))
        self.length = nn.Linear(d_src, cfg.tgt_len + 1)  # number of target tokens, 0..tgt_len
        # a new output layer: the PLM is a discriminator and has no language-model head
        self.head_dense = nn.Linear(d, d)
        self.head_ln = nn.LayerNorm(d)
        self.head_out = nn.Linear(d, plm.cfg.vocab_size)

    def train(self, mode: bool = True) -> AdaptedDecoder:
        super().train(mode)
        self.plm.eval()
        return self

    def forward(
        self,
        ids: torch.Tensor,
        valid: torch.Tensor,
        memory: torch.Tensor,
        memory_valid: torch.Tensor,
    ) -> torch.Tensor:
        x = self.plm.embed(ids)  # (B, T, C)
        layers = zip(self.plm.layers(), self.after_attn, self.cross, self.after_ffn, strict=True)
        for block, a1, cross, a2 in layers:
            x = x + a1(block.attention(block.ln1(x), valid))
            x = cross(x, memory, memory_valid)  # memory (B, S, C_src)
            x = x + a2(block.feed_forward(block.ln2(x)))
        h = self.head_ln(F.gelu(self.head_dense(self.plm.ln_f(x))))
        return self.head_out(h)  # (B, T, V)

    def predict_length(self, memory: torch.Tensor, memory_valid: torch.Tensor) -> torch.Tensor:
        """Logits over target lengths from the mean-pooled encoder output: (B, tgt_len + 1)."""
        w = memory_valid.unsqueeze(-1).to(memory.dtype)  # (B, S, 1)
        pooled = (memory * w).sum(1) / w.sum(1).clamp(min=1.0)  # (B, C_src)
        return self.length(pooled)


def _adamw(model: nn.Module, cfg: AbnetConfig) -> torch.optim.AdamW:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups: list[dict[str, Any]] = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)


# ---------------------------------------------------------------- the two sides


def _check_lines(lines: Sequence[str], what: str) -> list[str]:
    out = [line.rstrip("\r\n") for line in lines]
    if any(not line.strip() for line in out):
        raise ValueError(f"empty {what} line: pairs are aligned by index, so none may be empty")
    return out


def _check_length(length: int, plm: PretrainedModel) -> None:
    if length > plm.config.max_len:
        raise ValueError(
            f"sequence length {length} exceeds the PLM's {plm.config.max_len} positions"
        )


class EncoderSide:
    """S's adapted encoder, optimizer and dropout stream."""

    def __init__(
        self,
        cfg: AbnetConfig,
        plm: PretrainedModel,
        lines: Sequence[str],
        seed: int,
        device: str,
    ) -> None:
        self.cfg, self.seed, self.device = cfg, seed, torch.device(device)
        self.tokenizer = plm.tokenizer
        _check_length(cfg.src_len, plm)
        self.data = encode_lines(plm.tokenizer, lines, cfg.src_len)  # (N, S)
        self.model = AdaptedEncoder(plm.discriminator.body, cfg)
        _init_adapters(self.model, torch.Generator().manual_seed(seed + 10))
        self.model.to(self.device).train()
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 11)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = _adamw(self.model, cfg)

    @property
    def d_model(self) -> int:
        """Width of the activations sent to T."""
        return int(self.model.plm.cfg.d_model)

    def generators(self) -> dict[str, torch.Generator]:
        """The random streams a checkpoint must keep."""
        return {"dropout": self.rng_dropout}

    def indices(self, step: int, micro: int) -> torch.Tensor:
        """Pair indices of micro-batch `micro` of `step` (a pure function of the seed)."""
        position = (step - 1) * self.cfg.micro_batches + micro
        return batch_indices(len(self.data), self.cfg.batch_size, position, self.seed)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder output (B, S, C) and source lengths (B,) of a batch of source ids."""
        ids = ids.to(self.device)
        valid = ids != PAD_ID
        return self.model(ids, valid), valid.sum(1)

    def step(self, step: int) -> None:
        """One optimizer step on the accumulated adapter gradients."""
        set_lr(
            self.opt, linear_warmup_decay(step, self.cfg.lr, self.cfg.warmup_steps, self.cfg.steps)
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


@dataclass
class DecoderStats:
    """Figures of one micro-batch on T."""

    loss: float
    token_loss: float
    length_loss: float
    token_accuracy: float
    tokens: int


class DecoderSide:
    """T's adapted decoder, optimizer and random streams, training and decoding."""

    def __init__(
        self,
        cfg: AbnetConfig,
        plm: PretrainedModel,
        lines: Sequence[str],
        d_src: int,
        seed: int,
        device: str,
    ) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.tokenizer = plm.tokenizer
        _check_length(cfg.tgt_len, plm)
        self.data = encode_lines(plm.tokenizer, lines, cfg.tgt_len)  # (N, T)
        self.model = AdaptedDecoder(plm.discriminator.body, d_src, cfg)
        _init_adapters(self.model, torch.Generator().manual_seed(seed + 20))
        self.model.to(self.device).train()
        self.rng_mask = torch.Generator(self.device).manual_seed(seed + 21)
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 22)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = _adamw(self.model, cfg)

    def generators(self) -> dict[str, torch.Generator]:
        """The random streams a checkpoint must keep."""
        return {"mask": self.rng_mask, "dropout": self.rng_dropout}

    def train_micro(
        self, index: torch.Tensor, memory: torch.Tensor, src_lengths: torch.Tensor
    ) -> tuple[torch.Tensor, DecoderStats]:
        """Conditional-MLM loss of one micro-batch; returns d loss / d memory and figures."""
        ids = self.data[index.cpu()].to(self.device)  # (B, T)
        memory = memory.to(self.device).requires_grad_(True)  # (B, S, C_src)
        memory_valid = _prefix_mask(src_lengths.to(self.device), memory.shape[1])
        valid = ids != PAD_ID
        real = ids >= N_SPECIAL  # the target's own tokens
        lengths = real.sum(1)  # (B,)
        # Mask-Predict: mask a uniform 1..L of the L target tokens, at random places
        u = torch.rand(ids.shape[0], generator=self.rng_mask, device=self.device)
        n_mask = (u * lengths).long().clamp(max=lengths - 1) + 1  # (B,)
        scores = torch.rand(ids.shape, generator=self.rng_mask, device=self.device)
        scores = scores.masked_fill(~real, 2.0)
        ranks = scores.argsort(1).argsort(1)
        masked = ranks < n_mask.unsqueeze(1)  # (B, T)
        logits = self.model(ids.masked_fill(masked, MASK_ID), valid, memory, memory_valid)
        token_loss = F.cross_entropy(logits[masked], ids[masked])
        length_loss = F.cross_entropy(self.model.predict_length(memory, memory_valid), lengths)
        loss = token_loss + self.cfg.length_loss_weight * length_loss
        (loss / self.cfg.micro_batches).backward()
        with torch.no_grad():
            acc = (logits[masked].argmax(-1) == ids[masked]).float().mean()
        assert memory.grad is not None
        stats = DecoderStats(
            float(loss.detach()),
            float(token_loss.detach()),
            float(length_loss.detach()),
            float(acc),
            int(masked.sum()),
        )
        return memory.grad, stats

    def step(self, step: int) -> None:
        """One optimizer step on the accumulated adapter gradients."""
        set_lr(
            self.opt, linear_warmup_decay(step, self.cfg.lr, self.cfg.warmup_steps, self.cfg.steps)
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    @torch.no_grad()
    def translate(self, memory: torch.Tensor, src_lengths: torch.Tensor) -> list[str]:
        """Mask-predict decoding of a batch of encoder outputs."""
        self.model.eval()
        try:
            return [
                decode_text(self.tokenizer, ids) for ids in self._mask_predict(memory, src_lengths)
            ]
        finally:
            self.model.train()

    def _mask_predict(self, memory: torch.Tensor, src_lengths: torch.Tensor) -> list[list[int]]:
        cfg = self.cfg
        memory = memory.to(self.device)
        memory_valid = _prefix_mask(src_lengths.to(self.device), memory.shape[1])
        B, K, rounds = memory.shape[0], cfg.length_candidates, cfg.decode_iterations
        length_logits = self.model.predict_length(memory, memory_valid)  # (B, tgt_len + 1)
        length_logits[:, 0] = float("-inf")
        lengths = length_logits.topk(K, dim=-1).indices.clamp(1, cfg.tgt_len - 2)  # (B, K)
        L = lengths.reshape(-1)  # (BK,)
        mem = memory.repeat_interleave(K, 0)  # (BK, S, C)
        mem_valid = memory_valid.repeat_interleave(K, 0)
        T = int(L.max()) + 2
        pos = torch.arange(T, device=self.device).unsqueeze(0)  # (1, T)
        real = (pos >= 1) & (pos <= L.unsqueeze(1))  # (BK, T)
        ids = torch.full((B * K, T), PAD_ID, dtype=torch.long, device=self.device)
        ids[:, 0] = CLS_ID
        ids[real] = MASK_ID
        ids[pos.expand_as(ids) == (L + 1).unsqueeze(1)] = SEP_ID
        valid = ids != PAD_ID
        logp = torch.zeros(B * K, T, device=self.device)
        for it in range(rounds):
            logits = self.model(ids, valid, mem, mem_valid)  # (BK, T, V)
            logits[..., :N_SPECIAL] = float("-inf")
            best_logp, best = logits.log_softmax(-1).max(-1)
            update = ids == MASK_ID
            ids = torch.where(update, best, ids)
            logp = torch.where(update, best_logp, logp)
            if it == rounds - 1:
                break
            n_remask = (L * (rounds - 1 - it) // rounds).unsqueeze(1)  # fewer each round
            ranks = logp.masked_fill(~real, float("inf")).argsort(1).argsort(1)
            ids = ids.masked_fill(ranks < n_remask, MASK_ID)
        score = (logp * real).sum(1) / L  # mean log-probability per candidate
        choice = score.view(B, K).argmax(1)  # (B,)
        out = []
        for b in range(B):
            row = b * K + int(choice[b])
            out.append(ids[row, 1 : int(L[row]) + 1].tolist())
        return out


_JOINED_PUNCTUATION = re.compile(r" ?([-'\u2019]) ?")


def _prefix_mask(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """(B, width) bool, True at the first lengths[b] positions."""
    return torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def decode_text(tok: Tokenizer, ids: Sequence[int]) -> str:
    """Detokenized text of token ids, special tokens dropped."""
    text = str(tok.decode(list(ids), skip_special_tokens=True))
    # the pre-tokenizer split "forty-three" and "Ana's" at the punctuation; join them back
    return _JOINED_PUNCTUATION.sub(r"\1", text)


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (sacrebleu, 13a tokenization)."""
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)]).score)


def _round_trip(codec: Codec, x: torch.Tensor) -> torch.Tensor:
    return codec.decode(codec.encode(x.detach()))


# ---------------------------------------------------------------- single-process reference


@dataclass
class LocalAbnetRun:
    """Result of `train_abnet_local`."""

    encoder: EncoderSide
    decoder: DecoderSide
    history: list[dict[str, float]]
    bleu: float | None


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
    """Both sides in one process, codecs applied in between: the reference of a split run."""
    src_plm, tgt_plm = load_pretrained(source_plm, device), load_pretrained(target_plm, device)
    enc = EncoderSide(cfg, src_plm, _check_lines(source_lines, "source"), seed, device)
    dec = DecoderSide(cfg, tgt_plm, _check_lines(target_lines, "target"), enc.d_model, seed, device)
    history = []
    last = steps or cfg.steps
    codecs = CodecBook()
    for k in range(1, last + 1):
        forward_spec, backward_spec = cfg.codecs(k)
        fwd, bwd = codecs.get("forward", forward_spec), codecs.get("backward", backward_spec)
        stats = []
        for m in range(cfg.micro_batches):
            index = enc.indices(k, m)
            h, src_len = enc.forward(enc.data[index])
            grad, st = dec.train_micro(index, _round_trip(fwd, h), src_len)
            h.backward(_round_trip(bwd, grad).to(h.device))
            stats.append(st)
        enc.step(k)
        dec.step(k)
        history.append(_step_metrics(stats))
    score = None
    if eval_source_lines is not None and eval_target_lines is not None:
        fwd = codecs.get("eval", cfg.codecs(last)[0])
        src_ids = encode_lines(src_plm.tokenizer, list(eval_source_lines), cfg.src_len)
        hyps: list[str] = []
        for lo in range(0, len(src_ids), cfg.eval_batch_size):
            enc.model.eval()
            with torch.no_grad():
                h, src_len = enc.forward(src_ids[lo : lo + cfg.eval_batch_size])
            enc.model.train()
            hyps += dec.translate(_round_trip(fwd, h), src_len)
        score = bleu(hyps, [s.rstrip("\r\n") for s in eval_target_lines])
    return LocalAbnetRun(enc, dec, history, score)


def _step_metrics(stats: list[DecoderStats]) -> dict[str, float]:
    n = len(stats)
    return {
        "loss": sum(s.loss for s in stats) / n,
        "token_loss": sum(s.token_loss for s in stats) / n,
        "length_loss": sum(s.length_loss for s in stats) / n,
        "token_accuracy": sum(s.token_accuracy for s in stats) / n,
    }


# ---------------------------------------------------------------- the encoder role (cluster S)


class _ActivationSender:
    """S's outgoing stream: one META message, then one ACT blob, per micro-batch."""

    def __init__(self, link: Link, cfg: AbnetConfig, max_index: int) -> None:
        self.sender = AsyncSender(link)
        self.cfg = cfg
        self.max_index = max_index
        self.total = 0

    def activations(
        self,
        kind: str,
        step: int,
        index: torch.Tensor,
        h: torch.Tensor,
        src_len: torch.Tensor,
        codec: Codec,
    ) -> int:
        """Queue one micro-batch's pair indices, source lengths and encoded activations."""
        meta = pack_message(
            {"kind": kind, "step": step},
            {
                "index": pack_uint(index, self.max_index),
                "src_len": pack_uint(src_len, self.cfg.src_len),
            },
        )
        blob = codec.encode(h.detach())
        self.sender.send(META, meta)
        self.sender.send(ACT, blob)
        self.total += len(meta) + len(blob)
        return len(meta) + len(blob)

    def control(self, kind: str, step: int) -> None:
        """Queue a control message (`eval_end`, `stop`)."""
        self.sender.send(META, pack_message({"kind": kind, "step": step}))


def run_abnet_encoder(
    cfg: AbnetConfig,
    link: Link,
    source_lines: Sequence[str],
    source_plm: bytes,
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    eval_source_lines: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> RoleResult:
    """Scenario-II, cluster S: train the encoder adapters; only activations leave this cluster.

    `source_lines` are the source sides of the training pairs, in pair order;
    `eval_source_lines` those of the evaluation pairs (T computes the BLEU and
    reports it back). The result's `artifact` is `ckpt_dir / "adapters.safetensors"`.
    """
    hooks = hooks or Hooks()
    store = CheckpointStore(ckpt_dir, keep=cfg.keep_checkpoints, key=hooks.checkpoint_key)
    plm = load_pretrained(source_plm, device)
    side = EncoderSide(cfg, plm, _check_lines(source_lines, "source"), seed, device)
    eval_ids = None
    if eval_source_lines is not None:
        eval_lines = _check_lines(eval_source_lines, "source")
        eval_ids = encode_lines(plm.tokenizer, eval_lines, cfg.src_len)
    n_eval = len(eval_ids) if eval_ids is not None else 0
    mine = {
        "role": "abnet-encoder",
        "config": asdict(cfg),
        "seed": seed,
        "n_train": len(side.data),
        "n_eval": n_eval,
        "d_model": side.d_model,
        "checkpoints": store.steps(),
    }
    peer = hello(link, HELLO, mine, cfg.recv_timeout_s)
    _check_peer(peer, mine, "abnet-decoder")
    start = resume_step(store.steps(), peer["checkpoints"])
    if start:
        tensors, meta = store.load(start)
        restore_training_state(tensors, meta, side.model, side.opt, side.generators())

    out = _ActivationSender(link, cfg, max(len(side.data), n_eval))
    result = RoleResult(start_step=start, last_step=start, stopped=False)
    codecs = CodecBook()

    def recv_sync() -> torch.Tensor:
        sync = link.recv(SYNC, timeout=cfg.recv_timeout_s)
        if not isinstance(sync, torch.Tensor):
            raise ValueError("expected a sync tensor from the decoder role")
        return sync

    def evaluate(step: int) -> float:
        """Send the eval sources' encodings; T decodes them and answers with its BLEU."""
        assert eval_ids is not None
        fwd = codecs.get("eval", cfg.codecs(step)[0])
        side.model.eval()
        with torch.no_grad():
            for lo in range(0, n_eval, cfg.eval_batch_size):
                index = torch.arange(lo, min(lo + cfg.eval_batch_size, n_eval))
                h, src_len = side.forward(eval_ids[index])
                out.activations("eval", step, index, h, src_len, fwd)
        side.model.train()
        out.control("eval_end", step)
        return float(recv_sync()[1])

    for k in range(start + 1, cfg.steps + 1):
        if hooks.stop_requested():
            result.stopped = True
            out.control("stop", k)
            break
        t0 = time.perf_counter()
        forward_spec, backward_spec = cfg.codecs(k)
        fwd, bwd = codecs.get("forward", forward_spec), codecs.get("backward", backward_spec)
        pending: deque[torch.Tensor] = deque()
        sent = 0

        for m in range(cfg.micro_batches):
            index = side.indices(k, m)
            h, src_len = side.forward(side.data[index])  # (B, S, C)
            sent += out.activations("train", k, index, h, src_len, fwd)
            pending.append(h)
            if len(pending) > 1:
                # T worked on the previous micro-batch while this one computed
                _backward_oldest(pending, bwd, link, cfg.recv_timeout_s)
        while pending:
            _backward_oldest(pending, bwd, link, cfg.recv_timeout_s)
        side.step(k)
        sync = recv_sync()  # [step, loss, token accuracy, stop]
        result.last_step = k
        if k % cfg.ckpt_every == 0 or k == cfg.steps:
            tensors, meta = training_state(side.model, side.opt, side.generators(), True)
            hooks.checkpointed(k, store.save(k, tensors, {**meta, "step": k}))
        metrics = {
            "loss": float(sync[1]),
            "token_accuracy": float(sync[2]),
            "seconds": time.perf_counter() - t0,
            "bytes_to_decoder": float(sent),
            "bytes_to_decoder_total": float(out.total),
        }
        if float(sync[3]) > 0:  # T was asked to stop after this step
            result.stopped = True
        elif eval_ids is not None and (
            k == cfg.steps or (cfg.eval_every and k % cfg.eval_every == 0)
        ):
            metrics["bleu"] = evaluate(k)
            result.extra["bleu"] = metrics["bleu"]
        result.history.append(metrics)
        hooks.metrics(k, metrics)
        if result.stopped:
            break
    if not result.stopped:
        out.control("stop", result.last_step)
    out.sender.close()
    if not result.stopped:
        result.artifact = _save_adapters(side.model, store, "abnet-encoder", cfg)
    return result


def _backward_oldest(
    pending: deque[torch.Tensor], codec: Codec, link: Link, timeout: float
) -> None:
    """Backpropagate the oldest micro-batch in flight with the gradient T sent for it."""
    h = pending.popleft()
    # the gradient of exactly what was sent: another shape is refused before it is built
    grad = codec.decode(expect_bytes(link.recv(GRAD, timeout=timeout)), shape=tuple(h.shape))
    h.backward(grad.to(h.device))


def _check_peer(peer: dict[str, Any], mine: dict[str, Any], role: str) -> None:
    if peer.get("role") != role:
        raise ValueError(f"expected the {role} role at the other end, got {peer.get('role')!r}")
    if peer["config"] != mine["config"] or peer["seed"] != mine["seed"]:
        raise ValueError("the two ABNet roles were given different configs or seeds")
    if (peer["n_train"], peer["n_eval"]) != (mine["n_train"], mine["n_eval"]):
        raise ValueError(
            "source and target sides differ in length: "
            f"{mine['n_train']}/{mine['n_eval']} vs {peer['n_train']}/{peer['n_eval']} lines"
        )


def _save_adapters(model: nn.Module, store: CheckpointStore, kind: str, cfg: AbnetConfig) -> Path:
    """The trained adapters of one side (the frozen PLM is not repeated)."""
    tensors = {
        n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad
    }
    meta = {"nebula.kind": kind, "config": json.dumps(asdict(cfg))}
    return store.write_file("adapters.safetensors", save_safetensors(tensors, metadata=meta))


# ---------------------------------------------------------------- the decoder role (cluster T)


def run_abnet_decoder(
    cfg: AbnetConfig,
    link: Link,
    target_lines: Sequence[str],
    target_plm: bytes,
    ckpt_dir: Path,
    hooks: Hooks | None = None,
    *,
    eval_target_lines: Sequence[str] | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> RoleResult:
    """Scenario-II, cluster T: train the decoder adapters; only gradients leave this cluster.

    `target_lines` are the target sides of the training pairs, in pair order;
    `eval_target_lines` the references BLEU is measured against (metric `bleu`,
    and `result.extra["bleu"]` after the last step). The result's `artifact`
    is `ckpt_dir / "adapters.safetensors"`.
    """
    hooks = hooks or Hooks()
    store = CheckpointStore(ckpt_dir, keep=cfg.keep_checkpoints, key=hooks.checkpoint_key)
    plm = load_pretrained(target_plm, device)
    lines = _check_lines(target_lines, "target")
    refs = _check_lines(eval_target_lines, "target") if eval_target_lines is not None else []
    mine: dict[str, Any] = {
        "role": "abnet-decoder",
        "config": asdict(cfg),
        "seed": seed,
        "n_train": len(lines),
        "n_eval": len(refs),
        "checkpoints": store.steps(),
    }
    peer = hello(link, HELLO, mine, cfg.recv_timeout_s)
    _check_peer(peer, mine, "abnet-encoder")
    d_model = int(peer["d_model"])
    side = DecoderSide(cfg, plm, lines, d_model, seed, device)
    # what one activation blob may decode to: (pairs, positions, d_model) of a batch
    max_memory_numel = max(cfg.batch_size, cfg.eval_batch_size) * cfg.src_len * d_model
    start = resume_step(store.steps(), peer["checkpoints"])
    if start:
        tensors, meta = store.load(start)
        restore_training_state(tensors, meta, side.model, side.opt, side.generators())

    sender = AsyncSender(link)
    result = RoleResult(start_step=start, last_step=start, stopped=False)
    codecs = CodecBook()
    sent_total = 0

    def receive() -> tuple[dict[str, Any], torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Next META (and its ACT blob, decoded with the codec of its step)."""
        header, arrays = unpack_message(expect_bytes(link.recv(META, timeout=cfg.recv_timeout_s)))
        if header["kind"] not in ("train", "eval"):
            return header, torch.empty(0), torch.empty(0), None
        fwd = codecs.get("forward", cfg.codecs(int(header["step"]))[0])
        index = unpack_int(arrays["index"])
        memory = fwd.decode(
            expect_bytes(link.recv(ACT, timeout=cfg.recv_timeout_s)),
            shape=(len(index), None, d_model),
            max_numel=max_memory_numel,
        )
        return header, index, unpack_int(arrays["src_len"]), memory

    k = start
    hyps: list[str] = []
    while True:
        header, index, src_len, memory = receive()
        kind = header["kind"]
        if kind == "stop":
            result.stopped = result.last_step < cfg.steps
            break
        if kind == "eval":
            assert memory is not None
            hyps += side.translate(memory, src_len)
            continue
        if kind == "eval_end":
            score = bleu(hyps, [refs[i] for i in range(len(hyps))])
            hyps = []
            sender.send(SYNC, torch.tensor([float(header["step"]), score, 0.0, 0.0]))
            result.extra["bleu"] = score
            if result.history:
                result.history[-1]["bleu"] = score
            hooks.metrics(int(header["step"]), {"bleu": score})
            continue
        # a training step: its first micro-batch has just arrived
        k = int(header["step"])
        if k != result.last_step + 1:
            raise RuntimeError(f"expected step {result.last_step + 1}, got {k}")
        t0 = time.perf_counter()
        bwd = codecs.get("backward", cfg.codecs(k)[1])
        stats, sent = [], 0
        for m in range(cfg.micro_batches):
            if m:
                header, index, src_len, memory = receive()
                if header.get("kind") != "train" or int(header["step"]) != k:
                    raise RuntimeError(f"out-of-order message {header} in step {k}")
            assert memory is not None
            grad, st = side.train_micro(index, memory, src_len)
            blob = bwd.encode(grad)
            sender.send(GRAD, blob)  # S backpropagates it while this side takes the next one
            sent += len(blob)
            stats.append(st)
        side.step(k)
        stop = hooks.stop_requested()
        m_ = _step_metrics(stats)
        sender.send(SYNC, torch.tensor([float(k), m_["loss"], m_["token_accuracy"], float(stop)]))
        sent_total += sent
        result.last_step = k
        if k % cfg.ckpt_every == 0 or k == cfg.steps:
            tensors, meta = training_state(side.model, side.opt, side.generators(), True)
            hooks.checkpointed(k, store.save(k, tensors, {**meta, "step": k}))
        metrics = {
            **m_,
            "tokens_per_s": sum(s.tokens for s in stats) / max(time.perf_counter() - t0, 1e-9),
            "bytes_to_encoder": float(sent),
            "bytes_to_encoder_total": float(sent_total),
        }
        result.history.append(metrics)
        hooks.metrics(k, metrics)
        if stop:
            result.stopped = True
            break
    sender.close()
    if not result.stopped:
        result.artifact = _save_adapters(side.model, store, "abnet-decoder", cfg)
    return result

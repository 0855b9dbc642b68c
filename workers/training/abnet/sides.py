"""ABNet's two sides as the training loop sees them: model, optimizer, random streams, data.

`EncoderSide` (cluster S) turns source ids into the activations that cross;
`DecoderSide` (cluster T) trains on them with conditional MLM (Mask-Predict: mask
1..L target tokens, predict them) and decodes with mask-predict over the top
length candidates. Both the split roles and the single-process reference drive
these; neither knows of links or codecs.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sacrebleu
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from workers.training.abnet.config import AbnetConfig
from workers.training.abnet.model import AdaptedDecoder, AdaptedEncoder, init_adapters
from workers.training.abnet.stale import DelayedWeights
from workers.training.bert import autocast, set_dropout_generator
from workers.training.data import (
    CLS,
    MASK,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    SpecialIds,
    batch_indices,
    encode_lines,
)
from workers.training.electra import PretrainedModel
from workers.training.schedule import linear_warmup_decay, set_lr

N_SPECIAL = len(SPECIAL_TOKENS)
PAD_ID, CLS_ID, SEP_ID, MASK_ID = (SPECIAL_TOKENS.index(t) for t in (PAD, CLS, SEP, MASK))
# Nebula's own tokenizers; an imported model's tokenizer has its own (`SpecialIds.of`)


def adamw(model: nn.Module, cfg: AbnetConfig) -> torch.optim.AdamW:
    """AdamW on the trainable parameters; no decay on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    groups: list[dict[str, Any]] = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": rest},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.0)


def check_lines(lines: Sequence[str], what: str) -> list[str]:
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
        self.special = SpecialIds.of(plm.tokenizer)
        _check_length(cfg.src_len, plm)
        self.data = encode_lines(plm.tokenizer, lines, cfg.src_len)  # (N, S)
        self.model = AdaptedEncoder(plm.body, cfg)
        init_adapters(self.model, torch.Generator().manual_seed(seed + 10))
        self.model.to(self.device).train()
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 11)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = adamw(self.model, cfg)
        self.delayed = DelayedWeights(self.model) if cfg.staleness else None

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

    def forward(
        self, ids: torch.Tensor, step: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder output (B, S, C) and source lengths (B,) of a batch of source ids.

        A training forward names its step: under `stale1` it runs on the weights that
        step's forwards use. Without a step (an evaluation) and under `sync`, it runs
        on the live weights.
        """
        ids = ids.to(self.device)
        valid = ids != self.special.pad
        with autocast(self.device, self.cfg.precision):
            if self.delayed is not None and step is not None:
                h = self.delayed(step, ids, valid)
            else:
                h = self.model(ids, valid)
        return h.float(), valid.sum(1)  # float32 on the wire whatever the precision

    def step(self, step: int) -> None:
        """One optimizer step on the accumulated adapter gradients (under `stale1`, those
        taken at the step's delayed weights, applied to the live ones)."""
        set_lr(
            self.opt, linear_warmup_decay(step, self.cfg.lr, self.cfg.warmup_steps, self.cfg.steps)
        )
        if self.delayed is not None:
            self.delayed.take_gradients(step)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.delayed is not None:
            self.delayed.updated(step)


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
        self.special = SpecialIds.of(plm.tokenizer)
        _check_length(cfg.tgt_len, plm)
        self.data = encode_lines(plm.tokenizer, lines, cfg.tgt_len)  # (N, T)
        self.model = AdaptedDecoder(plm.body, d_src, cfg)
        init_adapters(self.model, torch.Generator().manual_seed(seed + 20))
        self.model.to(self.device).train()
        self.rng_mask = torch.Generator(self.device).manual_seed(seed + 21)
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 22)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = adamw(self.model, cfg)

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
        sp = self.special
        valid = ids != sp.pad
        real = ~sp.is_special(ids)  # the target's own tokens
        lengths = real.sum(1)  # (B,)
        # Mask-Predict: mask a uniform 1..L of the L target tokens, at random places
        u = torch.rand(ids.shape[0], generator=self.rng_mask, device=self.device)
        n_mask = (u * lengths).long().clamp(max=lengths - 1) + 1  # (B,)
        scores = torch.rand(ids.shape, generator=self.rng_mask, device=self.device)
        scores = scores.masked_fill(~real, 2.0)
        ranks = scores.argsort(1).argsort(1)
        masked = ranks < n_mask.unsqueeze(1)  # (B, T)
        with autocast(self.device, self.cfg.precision):
            logits = self.model(ids.masked_fill(masked, sp.mask), valid, memory, memory_valid)
            token_loss = F.cross_entropy(logits[masked], ids[masked])
            length_logits = self.model.predict_length(memory, memory_valid)
            length_loss = F.cross_entropy(length_logits, lengths)
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
        with autocast(self.device, cfg.precision):
            length_logits = self.model.predict_length(memory, memory_valid).float()  # (B, L+1)
        length_logits[:, 0] = float("-inf")
        lengths = length_logits.topk(K, dim=-1).indices.clamp(1, cfg.tgt_len - 2)  # (B, K)
        L = lengths.reshape(-1)  # (BK,)
        mem = memory.repeat_interleave(K, 0)  # (BK, S, C)
        mem_valid = memory_valid.repeat_interleave(K, 0)
        T = int(L.max()) + 2
        pos = torch.arange(T, device=self.device).unsqueeze(0)  # (1, T)
        real = (pos >= 1) & (pos <= L.unsqueeze(1))  # (BK, T)
        sp = self.special
        ids = torch.full((B * K, T), sp.pad, dtype=torch.long, device=self.device)
        ids[:, 0] = sp.cls
        ids[real] = sp.mask
        ids[pos.expand_as(ids) == (L + 1).unsqueeze(1)] = sp.sep
        valid = ids != sp.pad
        logp = torch.zeros(B * K, T, device=self.device)
        for it in range(rounds):
            with autocast(self.device, cfg.precision):
                logits = self.model(ids, valid, mem, mem_valid).float()  # (BK, T, V)
            logits[..., list(sp.special)] = float("-inf")
            best_logp, best = logits.log_softmax(-1).max(-1)
            update = ids == sp.mask
            ids = torch.where(update, best, ids)
            logp = torch.where(update, best_logp, logp)
            if it == rounds - 1:
                break
            n_remask = (L * (rounds - 1 - it) // rounds).unsqueeze(1)  # fewer each round
            ranks = logp.masked_fill(~real, float("inf")).argsort(1).argsort(1)
            ids = ids.masked_fill(ranks < n_remask, sp.mask)
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


def step_metrics(stats: Sequence[DecoderStats]) -> dict[str, float]:
    """The means over one step's micro-batches."""
    n = len(stats)
    return {
        "loss": sum(s.loss for s in stats) / n,
        "token_loss": sum(s.token_loss for s in stats) / n,
        "length_loss": sum(s.length_loss for s in stats) / n,
        "token_accuracy": sum(s.token_accuracy for s in stats) / n,
    }

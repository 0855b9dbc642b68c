"""The two sides of one ELECTRA step: each model with its optimizer and random streams.

`GeneratorSide` and `DiscriminatorSide` hold each model (model.py) with its
optimizer and random streams; the split roles (roles.py), the discriminator's
replicas (replicas.py) and the single-process reference `train_electra_local`
(local.py) all train through them.

Because ELECTRA's discriminator loss never reaches the generator (sampling is
discrete), a split run computes exactly what `train_electra_local` computes in
one process with the same seed: both build the same objects and call the same
methods in the same order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from workers.training.bert import autocast, init_weights, set_dropout_generator
from workers.training.checkpoints import CheckpointStore
from workers.training.data import NEBULA_SPECIAL, SpecialIds, batch_indices, train_tokenizer
from workers.training.electra.config import ElectraConfig
from workers.training.electra.model import (
    CorruptedBatch,
    Discriminator,
    Generator,
    Initial,
    load_initial,
)
from workers.training.schedule import linear_warmup_decay, set_lr


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with no decay on biases and norms (ELECTRA's split)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)


class GeneratorSide:
    """G's model, optimizer and random streams, and how it makes one micro-batch.

    `init` starts it from a pretrained model (its size then, not the preset's); `special`
    names the tokenizer's special ids (Nebula's own at 0..4 by default).
    """

    def __init__(
        self,
        cfg: ElectraConfig,
        ids: torch.Tensor,
        vocab_size: int,
        seed: int,
        device: str,
        *,
        special: SpecialIds = NEBULA_SPECIAL,
        init: Initial | None = None,
    ) -> None:
        self.cfg, self.seed, self.device = cfg, seed, torch.device(device)
        self.data = ids  # (N, T) original ids of the whole text, on CPU
        self.vocab_size = vocab_size
        self.special = special
        self.model = Generator(init[0] if init else cfg.generator_body(vocab_size))
        init_weights(self.model, torch.Generator().manual_seed(seed))
        if init is not None:
            load_initial(self.model, init[1])
        self.model.to(self.device)
        self.rng_mask = torch.Generator(self.device).manual_seed(seed + 1)
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 2)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = _adamw(self.model, cfg.lr_generator, cfg.weight_decay)

    def generators(self) -> dict[str, torch.Generator]:
        """The random streams a checkpoint must keep."""
        return {"mask": self.rng_mask, "dropout": self.rng_dropout}

    def indices(self, step: int, micro: int) -> torch.Tensor:
        """Example indices of micro-batch `micro` of `step` (a pure function of the seed)."""
        position = (step - 1) * self.cfg.n_discriminators + micro
        return batch_indices(len(self.data), self.cfg.batch_size, position, self.seed)

    def micro_batch(
        self, step: int, micro: int
    ) -> tuple[torch.Tensor, torch.Tensor, CorruptedBatch, float]:
        """Mask, predict, accumulate the MLM gradient and sample replacements.

        Returns the example indices, the original ids, the corrupted batch and the MLM loss.
        """
        index = self.indices(step, micro)
        ids = self.data[index].to(self.device)  # (B, T)
        sp = self.special
        valid = ids != sp.pad
        maskable = ~sp.is_special(ids)
        draw = torch.rand(ids.shape, generator=self.rng_mask, device=self.device)
        masked = (draw < self.cfg.mask_prob) & maskable  # (B, T)
        if not bool(masked.any()):
            masked[0, 1] = True  # every sequence holds a token at 1; keeps the loss defined
        with autocast(self.device, self.cfg.precision):
            logits = self.model(ids.masked_fill(masked, sp.mask), valid, masked)  # (M, V)
            loss = F.cross_entropy(logits, ids[masked])
        (loss / self.cfg.n_discriminators).backward()
        with torch.no_grad():
            logits = logits.detach().to(torch.float32, copy=True)
            logits[:, list(sp.special)] = float("-inf")  # never sample [PAD], [MASK], ...
            probs = torch.softmax(logits, dim=-1)
            sampled = torch.multinomial(probs, 1, generator=self.rng_mask).squeeze(1)  # (M,)
            corrupted = ids.clone()
            corrupted[masked] = sampled
        return index, ids, CorruptedBatch(corrupted, corrupted != ids), float(loss.detach())

    def step(self, step: int) -> None:
        """One optimizer step on the accumulated gradient."""
        set_lr(
            self.opt,
            linear_warmup_decay(step, self.cfg.lr_generator, self.cfg.warmup_steps, self.cfg.steps),
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


class DiscriminatorSide:
    """D's model, optimizer and random stream, and how it trains on one micro-batch."""

    def __init__(
        self,
        cfg: ElectraConfig,
        vocab_size: int,
        seed: int,
        device: str,
        rank: int = 0,
        *,
        special: SpecialIds = NEBULA_SPECIAL,
        init: Initial | None = None,
    ) -> None:
        self.cfg, self.device = cfg, torch.device(device)
        self.special = special
        self.model = Discriminator(init[0] if init else cfg.discriminator_body(vocab_size))
        init_weights(self.model, torch.Generator().manual_seed(seed + 100))  # same on every rank
        if init is not None:
            load_initial(self.model, init[1])
        self.model.to(self.device)
        self.rng_dropout = torch.Generator(self.device).manual_seed(seed + 200 + rank)
        set_dropout_generator(self.model, self.rng_dropout)
        self.opt = _adamw(self.model, cfg.lr_discriminator, cfg.weight_decay)

    def generators(self) -> dict[str, torch.Generator]:
        """The random streams a checkpoint must keep."""
        return {"dropout": self.rng_dropout}

    def train_micro(self, batch: CorruptedBatch, scale: float = 1.0) -> tuple[float, float, int]:
        """Accumulate the RTD gradient of one micro-batch; returns loss, accuracy, tokens."""
        ids = batch.ids.to(self.device)
        target = batch.replaced.to(self.device)
        valid = ids != self.special.pad
        with autocast(self.device, self.cfg.precision):
            logits = self.model(ids, valid)  # (B, T)
            loss = F.binary_cross_entropy_with_logits(logits[valid], target[valid].float())
        (loss * scale).backward()
        with torch.no_grad():
            acc = ((logits[valid] > 0) == target[valid]).float().mean()
        return float(loss.detach()), float(acc), int(valid.sum())

    def step(self, step: int) -> None:
        """One optimizer step on the accumulated (and, with replicas, averaged) gradient."""
        set_lr(
            self.opt,
            linear_warmup_decay(
                step, self.cfg.lr_discriminator, self.cfg.warmup_steps, self.cfg.steps
            ),
        )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


TOKENIZER_FILE = "tokenizer.json"


def job_tokenizer(cfg: ElectraConfig, lines: list[str], store: CheckpointStore | None) -> Tokenizer:
    """The job's tokenizer: the one the role's `store` holds, else trained on `lines` (and
    kept there, sealed like the checkpoints: its vocabulary comes from the job's text)."""
    if store is not None and store.has_file(TOKENIZER_FILE):
        return Tokenizer.from_str(store.read_file(TOKENIZER_FILE).decode())
    tok = train_tokenizer(lines, cfg.vocab_size, cfg.min_token_frequency)
    if store is not None:
        store.write_file(TOKENIZER_FILE, tok.to_str().encode())
    return tok

"""Scenario-I's models and the arithmetic of one training step, with no link.

The generator G (a small BERT trained with masked-language modelling) masks
15% of the tokens, samples replacements from its own predictions and hands the
corrupted sequences to the discriminator D (a larger BERT trained to tell
which tokens were replaced). `GeneratorSide` and `DiscriminatorSide` hold each
model with its optimizer and random streams; the split roles
(`workers/training/electra.py`), the discriminator's replicas (`replicas.py`)
and the single-process reference `train_electra_local` below all train
through them.

Because ELECTRA's discriminator loss never reaches the generator (sampling is
discrete), a split run computes exactly what `train_electra_local` computes in
one process with the same seed: both build the same objects and call the same
methods in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from workers.training.bert import (
    BertConfig,
    Encoder,
    autocast,
    count_parameters,
    init_weights,
    set_dropout_generator,
)
from workers.training.data import (
    MASK,
    NEBULA_SPECIAL,
    PAD,
    SPECIAL_TOKENS,
    SpecialIds,
    batch_indices,
    clean_lines,
    encode_lines,
    train_tokenizer,
)
from workers.training.electra_config import ElectraConfig
from workers.training.runtime import CheckpointStore, linear_warmup_decay, set_lr

N_SPECIAL = len(SPECIAL_TOKENS)  # ids below this are special tokens, never masked nor sampled
PAD_ID, MASK_ID = SPECIAL_TOKENS.index(PAD), SPECIAL_TOKENS.index(MASK)


# ---------------------------------------------------------------- models


class Generator(nn.Module):
    """Masked-language model: predicts the original token at masked positions."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.body = Encoder(cfg)
        E = cfg.d_embed or cfg.d_model  # the output embedding is the (maybe narrower) input one
        self.dense = nn.Linear(cfg.d_model, E)
        self.ln = nn.LayerNorm(E, eps=cfg.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))

    def forward(self, ids: torch.Tensor, valid: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        h = self.body(ids, valid)[masked]  # (M, C): only the masked positions
        h = self.ln(F.gelu(self.dense(h)))
        # output embedding tied to the generator's own input embedding, as BERT
        return h @ self.body.embed.tok.weight.T + self.bias  # (M, V)


class Discriminator(nn.Module):
    """Replaced-token detection: one logit per position, > 0 meaning 'replaced'."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.body = Encoder(cfg)
        self.dense = nn.Linear(cfg.d_model, cfg.d_model)
        self.out = nn.Linear(cfg.d_model, 1)

    def forward(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        h = self.body(ids, valid)  # (B, T, C)
        return self.out(F.gelu(self.dense(h))).squeeze(-1)  # (B, T)


def _adamw(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with no decay on biases and norms (ELECTRA's split)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)


# ---------------------------------------------------------------- the two sides of a step


@dataclass
class CorruptedBatch:
    """One micro-batch as the discriminator trains on it."""

    ids: torch.Tensor  # (B, T) corrupted token ids
    replaced: torch.Tensor  # (B, T) bool: True where G's sample differs from the original


Initial = tuple[BertConfig, nn.Module]  # a pretrained body's config and module (imported)


def load_initial(target: nn.Module, source: nn.Module) -> None:
    """Start `target` (a Generator or Discriminator) from a pretrained model: all of it when
    the model is of the same kind, else its body (a bare encoder, or the other head's)."""
    if type(source) is type(target):
        target.load_state_dict(source.state_dict())
        return
    body = source if isinstance(source, Encoder) else source.body
    target.body.load_state_dict(body.state_dict())  # type: ignore[union-attr]


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


# ---------------------------------------------------------------- single-process reference


@dataclass
class LocalElectraRun:
    """Result of `train_electra_local`."""

    generator: GeneratorSide
    discriminator: DiscriminatorSide
    tokenizer: Tokenizer
    history: list[dict[str, float]]


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


def train_electra_local(
    cfg: ElectraConfig,
    text_lines: Iterable[str],
    *,
    seed: int = 0,
    device: str = "cpu",
    steps: int | None = None,
    tokenizer: Tokenizer | None = None,
    init_generator: Initial | None = None,
    init_discriminator: Initial | None = None,
) -> LocalElectraRun:
    """Both roles in one process, no link: the reference a split run must equal.

    Pass the split run's `tokenizer` (its generator's `tokenizer.json`) to
    compare: the `tokenizers` WordPiece trainer breaks ties in hash-map order,
    so two trainings on the same text may differ. With pretrained models (`init_*`) pass
    their tokenizer too.
    """
    lines = clean_lines(text_lines)
    tok = tokenizer or job_tokenizer(cfg, lines, None)
    V = tok.get_vocab_size()
    ids = encode_lines(tok, lines, cfg.seq_len)
    sp = SpecialIds.of(tok)
    g = GeneratorSide(cfg, ids, V, seed, device, special=sp, init=init_generator)
    d = DiscriminatorSide(cfg, V, seed, device, special=sp, init=init_discriminator)
    n = cfg.n_discriminators
    history = []
    for k in range(1, (steps or cfg.steps) + 1):
        mlm, rtd, acc = 0.0, 0.0, 0.0
        for m in range(n):
            _, _, batch, loss = g.micro_batch(k, m)
            rtd_m, acc_m, _ = d.train_micro(batch, scale=1.0 / n)
            mlm, rtd, acc = mlm + loss / n, rtd + rtd_m / n, acc + acc_m / n
        g.step(k)
        d.step(k)
        history.append({"mlm_loss": mlm, "rtd_loss": rtd, "rtd_accuracy": acc})
    return LocalElectraRun(g, d, tok, history)


def parameter_counts(cfg: ElectraConfig, vocab_size: int | None = None) -> dict[str, int]:
    """Parameters of the generator and the discriminator (built on the meta device)."""
    V = vocab_size or cfg.vocab_size
    with torch.device("meta"):
        g = Generator(cfg.generator_body(V))
        d = Discriminator(cfg.discriminator_body(V))
    return {"generator": count_parameters(g), "discriminator": count_parameters(d)}

"""Scenario-I's two models: the generator, the discriminator and what D trains on.

The generator G (a small BERT trained with masked-language modelling) masks
15% of the tokens, samples replacements from its own predictions and hands the
corrupted sequences (`CorruptedBatch`) to the discriminator D (a larger BERT
trained to tell which tokens were replaced). The arithmetic of a training step
is in sides.py; the models here have no optimizer, data or link.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workers.training.bert import BertConfig, Encoder, count_parameters
from workers.training.data import MASK, PAD, SPECIAL_TOKENS
from workers.training.electra.config import ElectraConfig

N_SPECIAL = len(SPECIAL_TOKENS)  # ids below this are special tokens, never masked nor sampled
PAD_ID, MASK_ID = SPECIAL_TOKENS.index(PAD), SPECIAL_TOKENS.index(MASK)


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


def parameter_counts(cfg: ElectraConfig, vocab_size: int | None = None) -> dict[str, int]:
    """Parameters of the generator and the discriminator (built on the meta device)."""
    V = vocab_size or cfg.vocab_size
    with torch.device("meta"):
        g = Generator(cfg.generator_body(V))
        d = Discriminator(cfg.discriminator_body(V))
    return {"generator": count_parameters(g), "discriminator": count_parameters(d)}

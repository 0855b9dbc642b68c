"""A BERT-style bidirectional transformer: the body of both ELECTRA models and of ABNet's PLMs.

Nebula trains pre-layer-norm blocks (x + f(LN(x)), one final norm), not BERT's post-LN:
trained from scratch at a high rate for a few hundred steps, post-LN bodies
learnt the replaced-token rate by making every position's output alike, which
left ABNet nothing to adapt; the pre-LN residual stream keeps each token's
identity. Imported checkpoints (BERT, ELECTRA, RoBERTa: workers/training/hf_weights.py)
bring BERT's own layout, which the config's `post_ln`, `type_vocab_size`, `d_embed`
and `position_pad_id` describe. Each block exposes its two sub-layers (`attention`,
`feed_forward`) so ABNet can insert adapters after them without copying the
block.

Randomness never comes from torch's global generator: dropout draws from a
`torch.Generator` that the owner installs with `set_dropout_generator`, and
`init_weights` takes one too. Two roles that run in two threads of one process
(the tests) then get the same streams as in two processes or in one reference
run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class BertConfig:
    """Size of one transformer body."""

    vocab_size: int = 2048  # set from the job's WordPiece tokenizer
    max_len: int = 64  # positions; sequences are truncated to this
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 2  # head size d_model / n_heads = 64, as BERT
    d_ff: int = 512  # 4 x d_model, as BERT
    dropout: float = 0.1  # BERT's and ELECTRA's
    layer_norm_eps: float = 1e-12  # BERT's
    # BERT's own layout, for imported checkpoints; the defaults are Nebula's
    post_ln: bool = False  # x = LN(x + f(x)) and no final norm, as BERT, ELECTRA, RoBERTa
    type_vocab_size: int = 0  # 0: no token-type (segment) embeddings
    d_embed: int = 0  # 0: embed at d_model; ELECTRA may embed narrower, then project
    position_pad_id: int = -1  # >= 0: RoBERTa's positions, pad id + 1 on over real tokens


class Dropout(nn.Module):
    """Inverted dropout drawing from an explicit generator (see module docstring)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand(x.shape, generator=self.generator, device=x.device) >= self.p
        return x * keep / (1.0 - self.p)


def set_dropout_generator(module: nn.Module, generator: torch.Generator) -> None:
    """Make every `Dropout` inside `module` draw from `generator`."""
    for m in module.modules():
        if isinstance(m, Dropout):
            m.generator = generator


def init_weights(module: nn.Module, generator: torch.Generator, std: float = 0.02) -> None:
    """BERT's initialisation (normal 0.02, zero biases, unit layer norms), reproducibly."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std, generator=generator)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std, generator=generator)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class MultiHeadAttention(nn.Module):
    """Multi-head attention; keys may come from another sequence (cross-attention)."""

    def __init__(self, d_model: int, n_heads: int, d_kv: int | None = None) -> None:
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_kv or d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(
        self, x: torch.Tensor, memory: torch.Tensor, memory_valid: torch.Tensor
    ) -> torch.Tensor:
        B, T, C = x.shape  # queries (B, T, C)
        S = memory.shape[1]  # keys and values (B, S, C_kv)
        h = self.n_heads
        q = self.q(x).view(B, T, h, C // h).transpose(1, 2)  # (B, h, T, c)
        k, v = self.kv(memory).split(C, dim=-1)
        k = k.view(B, S, h, C // h).transpose(1, 2)  # (B, h, S, c)
        v = v.view(B, S, h, C // h).transpose(1, 2)
        mask = memory_valid[:, None, None, :]  # (B, 1, 1, S): True where a key is real
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, h, T, c)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """One transformer block: pre-LN x = x + attn(LN(x)); x = x + ffn(LN(x)), or post-LN
    x = LN(x + attn(x)); x = LN(x + ffn(x)) when `cfg.post_ln`."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.post_ln = cfg.post_ln
        self.attn = MultiHeadAttention(cfg.d_model, cfg.n_heads)
        self.attn_drop = Dropout(cfg.dropout)
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.ff_in = nn.Linear(cfg.d_model, cfg.d_ff)
        self.ff_out = nn.Linear(cfg.d_ff, cfg.d_model)
        self.ff_drop = Dropout(cfg.dropout)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)

    def attention(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """The self-attention sub-layer's output on normed input, before the residual."""
        return self.attn_drop(self.attn(x, x, valid))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The feed-forward sub-layer's output on normed input, before the residual."""
        return self.ff_drop(self.ff_out(F.gelu(self.ff_in(x))))

    def forward(self, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        if self.post_ln:
            x = self.ln1(x + self.attention(x, valid))  # (B, T, C)
            return self.ln2(x + self.feed_forward(x))
        x = x + self.attention(self.ln1(x), valid)  # (B, T, C)
        return x + self.feed_forward(self.ln2(x))


class Embeddings(nn.Module):
    """Token + learned position (+ token-type) embeddings, layer norm, dropout, and a
    projection to d_model when the embeddings are narrower (ELECTRA)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        E = cfg.d_embed or cfg.d_model
        self.position_pad_id = cfg.position_pad_id
        self.tok = nn.Embedding(cfg.vocab_size, E)
        self.pos = nn.Embedding(cfg.max_len, E)
        self.segment = nn.Embedding(cfg.type_vocab_size, E) if cfg.type_vocab_size else None
        self.ln = nn.LayerNorm(E, eps=cfg.layer_norm_eps)
        self.drop = Dropout(cfg.dropout)
        self.project = nn.Linear(E, cfg.d_model) if cfg.d_model != E else None

    def positions(self, ids: torch.Tensor) -> torch.Tensor:
        """Position ids (B, T) or (T,): 0..T-1, or RoBERTa's count over non-pad tokens."""
        if self.position_pad_id < 0:
            return torch.arange(ids.shape[1], device=ids.device)
        real = (ids != self.position_pad_id).long()  # (B, T)
        return torch.cumsum(real, dim=1) * real + self.position_pad_id

    def forward(self, ids: torch.Tensor, token_types: torch.Tensor | None = None) -> torch.Tensor:
        x = self.tok(ids) + self.pos(self.positions(ids))  # ids (B, T) -> (B, T, E)
        if self.segment is not None:
            types = token_types if token_types is not None else torch.zeros_like(ids)
            x = x + self.segment(types)
        x = self.drop(self.ln(x))
        return self.project(x) if self.project is not None else x  # (B, T, C)


class Encoder(nn.Module):
    """Embeddings, a stack of blocks, a final norm: ids (B, T) -> hidden states (B, T, C)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        # post-LN blocks end normed already
        self.ln_f: nn.Module = (
            nn.Identity() if cfg.post_ln else nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        )

    def layers(self) -> list[Block]:
        """The blocks, typed (ABNet wraps each one's sub-layers)."""
        return [cast(Block, b) for b in self.blocks]

    def forward(
        self, ids: torch.Tensor, valid: torch.Tensor, token_types: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.embed(ids, token_types)  # (B, T, C)
        for block in self.blocks:
            x = block(x, valid)
        return self.ln_f(x)


PRECISIONS = ("fp32", "bf16")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """A job's `precision`: bf16 autocast (matmuls in bfloat16, norms and losses in float32)
    on CPU or CUDA, or plain float32."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def count_parameters(module: nn.Module) -> int:
    """Number of scalars in the module's parameters."""
    return sum(p.numel() for p in module.parameters())

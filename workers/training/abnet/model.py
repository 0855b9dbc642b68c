"""ABNet's two models: frozen PLMs with adapters (Guo et al. 2020), no training loop here.

- cluster S (encoder): the source-language PLM with an adapter (layer norm,
  down-projection, GELU, up-projection, residual) after each sub-layer;
- cluster T (decoder): the target-language PLM with the same adapters plus,
  in every layer, a cross-attention adapter (multi-head attention over the
  encoder output, feed-forward, layer norms, residuals), a length predictor and
  a new output layer (the PLM, a discriminator, has no language-model head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workers.training.abnet.config import AbnetConfig
from workers.training.bert import Block, Dropout, Encoder, MultiHeadAttention


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


def freeze(plm: Encoder) -> Encoder:
    for p in plm.parameters():
        p.requires_grad_(False)
    return plm.eval()


def init_adapters(module: nn.Module, generator: torch.Generator) -> None:
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


def adapted_attention(
    block: Block, adapter: nn.Module, x: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """A frozen block's attention sub-layer with an adapter on its output, in the block's
    own layout: inside the residual for pre-LN, before the norm for post-LN (Houlsby)."""
    if block.post_ln:
        return block.ln1(x + adapter(block.attention(x, valid)))
    return x + adapter(block.attention(block.ln1(x), valid))


def adapted_feed_forward(block: Block, adapter: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A frozen block's feed-forward sub-layer with an adapter on its output (as above)."""
    if block.post_ln:
        return block.ln2(x + adapter(block.feed_forward(x)))
    return x + adapter(block.feed_forward(block.ln2(x)))


class AdaptedEncoder(nn.Module):
    """Cluster S: the frozen source PLM with an adapter after each sub-layer."""

    def __init__(self, plm: Encoder, cfg: AbnetConfig) -> None:
        super().__init__()
        self.plm = freeze(plm)
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
            x = adapted_attention(block, a1, x, valid)
            x = adapted_feed_forward(block, a2, x)
        return self.plm.ln_f(x)  # (B, S, C): what crosses to cluster T


class AdaptedDecoder(nn.Module):
    """Cluster T: the frozen target PLM with adapters, cross-attention adapters and heads."""

    def __init__(self, plm: Encoder, d_src: int, cfg: AbnetConfig) -> None:
        super().__init__()
        self.plm = freeze(plm)
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
            x = adapted_attention(block, a1, x, valid)
            x = cross(x, memory, memory_valid)  # memory (B, S, C_src)
            x = adapted_feed_forward(block, a2, x)
        h = self.head_ln(F.gelu(self.head_dense(self.plm.ln_f(x))))
        return self.head_out(h)  # (B, T, V)

    def predict_length(self, memory: torch.Tensor, memory_valid: torch.Tensor) -> torch.Tensor:
        """Logits over target lengths from the mean-pooled encoder output: (B, tgt_len + 1)."""
        w = memory_valid.unsqueeze(-1).to(memory.dtype)  # (B, S, 1)
        pooled = (memory * w).sum(1) / w.sum(1).clamp(min=1.0)  # (B, C_src)
        return self.length(pooled)

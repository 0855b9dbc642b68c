"""How large a model Nebula builds from a file's config: one rule for the upload and the worker.

A `model` dataset carries its transformer's size in its metadata, and a worker builds
that model before it reads a single weight: a config claiming a 10M x 65536 embedding
would ask for 2.6 TB. The control plane refuses such a file at upload (422) and a worker
checks again before building. Pure Python: the control plane imports it without torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ModelTooLarge(ValueError):
    """A model config outside the limits, or not a config at all."""


@dataclass(frozen=True)
class ModelLimits:
    """Per-field bounds and a total; the defaults hold the paper's presets with room."""

    vocab_size: int = 1 << 18  # WordPiece vocabularies are ~30k
    max_len: int = 8192
    d_model: int = 8192
    n_layers: int = 128
    n_heads: int = 256
    d_ff: int = 65536
    parameters: int = 2_000_000_000  # ~8 GB of float32 weights before any optimizer state


DEFAULT_LIMITS = ModelLimits()
_INT_FIELDS = ("vocab_size", "max_len", "d_model", "n_layers", "n_heads", "d_ff")
_FLOAT_FIELDS = ("dropout", "layer_norm_eps")
# BERT's own layout (imported models): absent from older files, which mean Nebula's defaults
_LAYOUT_FIELDS = {
    "type_vocab_size": (0, 16),
    "d_embed": (0, 8192),
    "position_pad_id": (-1, 1 << 18),
}


def bert_parameters(config: Mapping[str, int]) -> int:
    """About how many weights a BERT body of `config` has (embeddings and blocks)."""
    d, layers, d_ff = config["d_model"], config["n_layers"], config["d_ff"]
    embeddings = (config["vocab_size"] + config["max_len"]) * d
    per_block = 4 * d * d + 2 * d * d_ff  # attention projections and the feed-forward pair
    return embeddings + layers * per_block


def check_bert_config(config: Any, limits: ModelLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """The config as given if it is a BERT body within `limits`; ModelTooLarge otherwise."""
    if not isinstance(config, dict):
        raise ModelTooLarge("the model config is not an object")
    unknown = (
        set(config) - set(_INT_FIELDS) - set(_FLOAT_FIELDS) - set(_LAYOUT_FIELDS) - {"post_ln"}
    )
    if unknown:
        raise ModelTooLarge(f"unknown model config fields: {', '.join(sorted(unknown))[:200]}")
    sizes: dict[str, int] = {}
    for name in _INT_FIELDS:
        value = config.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelTooLarge(f"model config field {name!r} must be a positive integer")
        if value > getattr(limits, name):
            raise ModelTooLarge(f"model config {name} = {value} exceeds {getattr(limits, name)}")
        sizes[name] = value
    for name in _FLOAT_FIELDS:
        value = config.get(name, 0.0)
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not math.isfinite(value)
        ):
            raise ModelTooLarge(f"model config field {name!r} must be a number")
    if not isinstance(config.get("post_ln", False), bool):
        raise ModelTooLarge("model config field 'post_ln' must be true or false")
    for name, (low, high) in _LAYOUT_FIELDS.items():
        value = config.get(name, low)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise ModelTooLarge(f"model config field {name!r} must be an integer in {low}..{high}")
    if sizes["d_model"] % sizes["n_heads"]:
        raise ModelTooLarge("model config d_model is not a multiple of n_heads")
    total = bert_parameters(sizes)
    if total > limits.parameters:
        raise ModelTooLarge(
            f"the model config asks for ~{total:,} weights, over {limits.parameters:,}"
        )
    return config

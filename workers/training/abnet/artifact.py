"""The `adapters` artifact: one side's trained adapters as safetensors, the frozen PLM left out.

Metadata: `nebula.kind` (`abnet-encoder` or `abnet-decoder`) and `config` (the job's
AbnetConfig as JSON), so a reader knows which side it holds and with which sizes.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from workers.training.abnet.config import AbnetConfig
from workers.training.checkpoints import CheckpointStore, read_safetensors_metadata

FILE_NAME = "adapters.safetensors"
KINDS = ("abnet-encoder", "abnet-decoder")


def adapters_bytes(model: nn.Module, kind: str, cfg: AbnetConfig) -> bytes:
    """The trainable parameters of `model` (one side) as an `adapters` file."""
    if kind not in KINDS:
        raise ValueError(f"an adapters artifact is one of {KINDS}, not {kind!r}")
    tensors = {
        n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad
    }
    meta = {"nebula.kind": kind, "config": json.dumps(asdict(cfg))}
    return save_safetensors(tensors, metadata=meta)


def save_adapters(model: nn.Module, store: CheckpointStore, kind: str, cfg: AbnetConfig) -> Path:
    """Write the side's artifact into its store (sealed like its checkpoints)."""
    return store.write_file(FILE_NAME, adapters_bytes(model, kind, cfg))


def read_adapters(blob: bytes) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
    """The side, config and tensors of an `adapters` file; ValueError if it is not one."""
    meta = read_safetensors_metadata(blob)
    kind = meta.get("nebula.kind")
    if kind not in KINDS:
        raise ValueError(f"not an ABNet adapters file (kind {kind!r})")
    return kind, json.loads(meta["config"]), load_safetensors(blob)

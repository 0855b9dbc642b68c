"""A role's checkpoints: the store of its files on disk and what a checkpoint holds.

`CheckpointStore` keeps the newest checkpoints of one role in one folder (sealed
with the job's key when it has one, workers/training/sealed.py); `training_state`
and `restore_training_state` turn a model, its optimizer and its random streams
into flat tensors and back; `resume_step` is where two roles restart together.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from workers.training import sealed

_CKPT = re.compile(r"^step-(\d{8})\.safetensors$")


class CheckpointStore:
    """Checkpoints of one role in one folder: step-00000100.safetensors, the newest `keep` kept.

    With a `key`, every file it writes is sealed (workers/training/sealed.py).
    """

    def __init__(self, directory: Path, keep: int = 3, key: bytes | None = None) -> None:
        self.directory = directory
        self.keep = keep
        self.key = key
        directory.mkdir(parents=True, exist_ok=True)

    def steps(self) -> list[int]:
        """Steps that have a complete checkpoint, ascending."""
        found = (_CKPT.match(p.name) for p in self.directory.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def path(self, step: int) -> Path:
        """Where the checkpoint of `step` lives."""
        return self.directory / f"step-{step:08d}.safetensors"

    def save(self, step: int, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> Path:
        """Write atomically (temp file + rename), then drop the oldest beyond `keep`."""
        path = self.path(step)
        cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        self.write_file(path.name, save_safetensors(cpu, metadata={"nebula": json.dumps(meta)}))
        for old in self.steps()[: -self.keep]:
            self.path(old).unlink(missing_ok=True)
        return path

    def load(self, step: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Tensors and metadata of the checkpoint of `step`."""
        blob = self.read_file(self.path(step).name)
        meta = json.loads(read_safetensors_metadata(blob)["nebula"])
        return load_safetensors(blob), meta

    def write_file(self, name: str, data: bytes) -> Path:
        """Another file of the role (its tokenizer, its artifact), sealed like checkpoints."""
        path = self.directory / name
        sealed.write(path, data, self.key)
        return path

    def read_file(self, name: str) -> bytes:
        """What `write_file` wrote."""
        return sealed.read(self.directory / name, self.key)

    def has_file(self, name: str) -> bool:
        """Whether the role wrote `name`."""
        return (self.directory / name).exists()


def read_safetensors_metadata(blob: bytes) -> dict[str, str]:
    """The `__metadata__` strings of a safetensors file given as bytes."""
    (n,) = struct.unpack("<Q", blob[:8])
    try:
        header = json.loads(blob[8 : 8 + n])
    except RecursionError:  # a header nested past the parser's depth
        raise ValueError("the safetensors header is nested too deeply") from None
    meta: dict[str, str] = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    return meta


def resume_step(mine: list[int], theirs: list[int]) -> int:
    """The newest step both roles hold a checkpoint of (0: start from scratch)."""
    common = set(mine) & set(theirs)
    return max(common, default=0)


def training_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generators: Mapping[str, torch.Generator],
    trainable_only: bool = False,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Model weights, optimizer state and RNG states as flat tensors plus JSON metadata."""
    tensors: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if p.requires_grad or not trainable_only:
            tensors[f"model.{name}"] = p.data
    if not trainable_only:
        for name, b in model.named_buffers():
            tensors[f"buffer.{name}"] = b
    opt = optimizer.state_dict()
    for index, state in opt["state"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{key}"] = value
    for name, g in generators.items():
        tensors[f"rng.{name}"] = g.get_state()
    return tensors, {"param_groups": opt["param_groups"]}


def restore_training_state(
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generators: Mapping[str, torch.Generator],
) -> None:
    """Put back what `training_state` saved."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            key = f"model.{name}"
            if key in tensors:
                p.copy_(tensors[key])
        for name, b in model.named_buffers():
            key = f"buffer.{name}"
            if key in tensors:
                b.copy_(tensors[key])
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optim."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    for name, g in generators.items():
        g.set_state(tensors[f"rng.{name}"].to(torch.uint8))

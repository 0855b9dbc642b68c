"""`schedule: stale1`: the encoder's forwards of step k run on its adapters after update k - 2.

PipeDream-2BW (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN
Training") lets a pipeline start step k+1 before step k's last gradient is back:

    W_k = AdamW(W_{k-1}, grad f_k(V_k)),    V_k = W_{k-2},    W_{-1} = W_0

so cluster S never waits out the round trip of a step's last micro-batch. Only S's
adapters go stale: T takes the micro-batches in order and updates on what it has.

A forward graph keeps the tensors it ran on, and the optimizer updates the live
parameters in place, so each version a step runs on is a copy of its own, taken
right after the update it is (V_{k+2} after update k) and used through
`torch.func.functional_call`; its gradients move onto the live parameters for the
update. The frozen PLM is shared, never copied. Two versions are kept at a time: that
of the oldest step not yet updated and that of the step after it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.func import functional_call

Weights = dict[str, torch.Tensor]
PREFIX = "stale."  # a checkpoint's keys of the version the next step runs on


def _copy(weights: Mapping[str, torch.Tensor]) -> Weights:
    return {n: t.detach().clone().requires_grad_(True) for n, t in weights.items()}


class DelayedWeights:
    """The trainable weights of `model` each step's forwards run on: V_k = W_{k-2}."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.live = {n: p for n, p in model.named_parameters() if p.requires_grad}
        # before any update both first steps run on the initial weights (W_{-1} = W_0)
        self.versions = {1: _copy(self.live), 2: _copy(self.live)}

    def __call__(self, step: int, *args: torch.Tensor) -> torch.Tensor:
        """`model(*args)` on the weights of step `step` (the frozen ones as they are)."""
        out: torch.Tensor = functional_call(self.model, self.versions[step], args)
        return out

    def take_gradients(self, step: int) -> None:
        """Move step `step`'s gradients onto the live weights, ahead of update `step`.

        The version is dropped: no forward runs on it again. The gradients are moved,
        not added, so the update sees the very tensors backward accumulated.
        """
        version = self.versions.pop(step)
        for name, p in self.live.items():
            p.grad = version[name].grad

    def updated(self, step: int) -> None:
        """Update `step` is done: the live weights are those step `step + 2` runs on."""
        self.versions[step + 2] = _copy(self.live)

    def state(self, step: int) -> Weights:
        """What a checkpoint after update `step` adds: the weights step `step + 1` runs on
        (W_{step-1}); those of step `step + 2` are the live ones it holds anyway."""
        if set(self.versions) != {step + 1, step + 2}:
            raise RuntimeError(f"a checkpoint after step {step} needs its gradients all applied")
        return {PREFIX + n: t.detach() for n, t in self.versions[step + 1].items()}

    def restore(self, step: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Resume after update `step` from what `state` saved; the live weights are restored."""
        missing = [n for n in self.live if PREFIX + n not in tensors]
        if missing:
            raise ValueError(f"the checkpoint of step {step} has no stale1 weights ({missing[0]})")
        device = next(iter(self.live.values())).device
        previous = {n: tensors[PREFIX + n].to(device) for n in self.live}
        self.versions = {step + 1: _copy(previous), step + 2: _copy(self.live)}

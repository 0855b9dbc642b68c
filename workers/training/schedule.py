"""The learning-rate schedule both scenarios train with."""

from __future__ import annotations

import torch


def linear_warmup_decay(step: int, peak: float, warmup: int, total: int) -> float:
    """Learning rate at `step` (1-based): linear warm-up, then linear decay to 10% of peak."""
    if step <= warmup:
        return peak * step / max(1, warmup)
    frac = (step - warmup) / max(1, total - warmup)
    return peak * max(0.1, 1.0 - 0.9 * frac)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr

"""A job's configuration turned into its scenario's config: what a worker trains with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract.kinds import KINDS
from workers.training.abnet.config import abnet_preset
from workers.training.electra.config import electra_preset

# each job kind's preset constructor (contract.kinds.KINDS names the kinds)
PRESET_BY_KIND: dict[str, Callable[..., Any]] = {
    "electra_pretrain": electra_preset,
    "abnet_finetune": abnet_preset,
}


def training_config(kind: str, config: dict[str, Any]) -> Any:
    """The `ElectraConfig` or `AbnetConfig` of a job: its preset with the job's overrides."""
    parsed = KINDS[kind].config.model_validate(config)
    return PRESET_BY_KIND[kind](parsed.preset, **parsed.overrides())

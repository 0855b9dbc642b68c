"""A job's validated configuration turned into the training code's config object."""

from __future__ import annotations

from typing import Any

from contract.kinds import KINDS


def training_config(kind: str, config: dict[str, Any]) -> Any:
    """The `ElectraConfig` or `AbnetConfig` of a job: its preset with the job's overrides."""
    parsed = KINDS[kind].config.model_validate(config)
    if kind == "electra_pretrain":
        from workers.training.electra import electra_preset

        return electra_preset(parsed.preset, **parsed.overrides())
    from workers.training.abnet import abnet_preset

    return abnet_preset(parsed.preset, **parsed.overrides())

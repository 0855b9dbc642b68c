"""A job's configuration turned into its scenario's config (workers/training/job_config.py)."""

from __future__ import annotations

import pytest

from contract.kinds import KINDS
from workers.training.abnet import AbnetConfig
from workers.training.electra import ElectraConfig
from workers.training.job_config import PRESET_BY_KIND, training_config


def test_every_job_kind_has_a_scenario_config() -> None:
    assert set(PRESET_BY_KIND) == set(KINDS)


def test_a_job_gets_its_preset_with_its_overrides() -> None:
    electra = training_config("electra_pretrain", {"preset": "tiny", "steps": 3})
    assert isinstance(electra, ElectraConfig)
    assert electra.steps == 3
    assert electra == ElectraConfig.tiny(steps=3)
    abnet = training_config("abnet_finetune", {"preset": "paper"})
    assert isinstance(abnet, AbnetConfig)
    assert abnet == AbnetConfig.paper()


def test_max_lag_auto_reaches_the_electra_config() -> None:
    electra = training_config("electra_pretrain", {"preset": "tiny", "max_lag": "auto"})
    assert isinstance(electra, ElectraConfig) and electra.max_lag == "auto"


def test_abnets_schedule_reaches_the_abnet_config() -> None:
    abnet = training_config("abnet_finetune", {"preset": "tiny", "schedule": "stale1"})
    assert isinstance(abnet, AbnetConfig) and abnet.schedule == "stale1"
    assert training_config("abnet_finetune", {"preset": "tiny"}) == AbnetConfig.tiny()


def test_an_override_the_kind_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError):
        training_config("electra_pretrain", {"preset": "tiny", "colour": "red"})

"""What a role needs against what a worker has, as a table; what a job may ask for."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contract.cluster_api import ClaimIn, PresenceIn
from contract.devices import DeviceInfo, role_device
from contract.kinds import KINDS, device_need


@pytest.mark.parametrize(
    ("need", "worker", "runs_on"),
    [
        ("any", "cpu", "cpu"),
        ("any", "cuda", "cuda"),
        ("cpu", "cpu", "cpu"),
        ("cpu", "cuda", "cpu"),  # every worker has a CPU
        ("cuda", "cuda", "cuda"),
        ("cuda", "cpu", None),  # refused at claim
    ],
)
def test_role_device(need: str, worker: str, runs_on: str | None) -> None:
    assert role_device(need, worker) == runs_on  # type: ignore[arg-type]


def test_each_kinds_config_names_its_placed_roles() -> None:
    for spec in KINDS.values():
        assert set(spec.config.ROLES) == set(spec.roles)


def test_a_job_asks_for_any_device_unless_it_says_otherwise() -> None:
    assert device_need("abnet_finetune", "encoder", {}) == "any"
    config = {"device": "cuda", "role_devices": {"generator": "cpu"}}
    assert device_need("electra_pretrain", "generator", config) == "cpu"
    assert device_need("electra_pretrain", "discriminator", config) == "cuda"
    # a replica needs what its discriminator does
    config = {"n_discriminators": 3, "role_devices": {"discriminator": "cuda"}}
    assert device_need("electra_pretrain", "replica-2", config) == "cuda"
    assert device_need("electra_pretrain", "generator", config) == "any"


@pytest.mark.parametrize(
    "config",
    [
        {"device": "tpu"},
        {"device": "CUDA"},
        {"role_devices": {"encoder": "cuda"}},  # ELECTRA has no encoder
        {"role_devices": {"replica-1": "cuda"}},  # replicas follow their discriminator
        {"role_devices": {"generator": "gpu"}},
    ],
)
def test_a_device_field_off_the_list_is_refused(config: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KINDS["electra_pretrain"].config.model_validate(config)


def test_a_worker_that_does_not_say_counts_as_cpu_only() -> None:
    assert ClaimIn.model_validate({"attempt": 1, "worker": "w"}).device == "cpu"
    assert (
        PresenceIn.model_validate({"kind": "switch", "instance": "s", "version": "1"}).device
        is None
    )


@pytest.mark.parametrize(
    "device",
    [
        {"kind": "tpu"},
        {"kind": "cuda", "name": "line\nbreak"},
        {"kind": "cuda", "count": -1},
        {"kind": "cuda", "memory_bytes": 2**60},
        {"kind": "cuda", "runtime": "12 4"},
        {"kind": "cpu", "cores": 4},  # no such field
    ],
)
def test_a_device_report_off_its_schema_is_refused(device: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DeviceInfo.model_validate(device)

"""The runner is driven by the kinds table: one training entry per (kind, role) it names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from contract.kinds import KINDS
from workers.runner import ROLE_ENTRIES, RoleInputs, describe_device, resolve_device
from workers.training.hooks import Hooks


def test_every_role_of_the_table_has_its_training_code_and_no_other() -> None:
    assert set(ROLE_ENTRIES) == {
        (kind, role) for kind, spec in KINDS.items() for role in spec.roles
    }


def test_each_role_reads_one_model_at_most() -> None:
    # RoleInputs.model() hands a role its only model input
    for spec in KINDS.values():
        kinds = {**spec.inputs, **spec.optional_inputs}
        for role in spec.roles.values():
            assert sum(kinds[name] == "model" for name in role.reads) <= 1


def test_the_worker_device_reaches_every_role_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.training.abnet as abnet
    import workers.training.electra as electra

    seen: dict[str, object] = {}

    def recorder(name: str) -> Callable[..., str]:
        def run(*args: object, **kwargs: object) -> str:
            seen[name] = kwargs.get("device")
            return name

        return run

    for module, name in (
        (electra, "run_electra_generator"),
        (electra, "run_electra_discriminator"),
        (abnet, "run_abnet_encoder"),
        (abnet, "run_abnet_decoder"),
    ):
        monkeypatch.setattr(module, name, recorder(name))
    inputs = RoleInputs(
        lines={"text": ["a line"], "parallel": ["a\tb"]}, files={"source_model": b"model"}
    )
    for entry in ROLE_ENTRIES.values():
        entry(None, None, inputs, Path("/nonexistent"), Hooks(), 0, "cuda:3")  # type: ignore[arg-type]
    assert seen == {
        "run_electra_generator": "cuda:3",
        "run_electra_discriminator": "cuda:3",
        "run_abnet_encoder": "cuda:3",
        "run_abnet_decoder": "cuda:3",
    }


def test_nebula_worker_device_choice() -> None:
    assert resolve_device("cpu") == "cpu"
    has_cuda = torch.cuda.is_available()
    assert resolve_device("auto") == ("cuda" if has_cuda else "cpu")
    if not has_cuda:
        with pytest.raises(ValueError, match="no CUDA device"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="cpu, cuda or auto"):
        resolve_device("tpu")


def test_a_cpu_worker_describes_its_device_within_the_contract() -> None:
    from contract.devices import DeviceInfo

    device = describe_device("cpu")
    assert device.kind == "cpu" and device.count >= 1
    assert device.memory_bytes is None and device.runtime == ""
    # what the presence report sends is what the control plane validates
    assert DeviceInfo.model_validate(device.model_dump()) == device

"""Devices: what a worker trains on, what a job's roles need, and whether the one serves the
other. Workers report theirs in their presence and with every claim; the control plane
decides at claim (`role_device`) and refuses a worker that lacks what the role needs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from contract.fields import StrictIn

# what a worker trains on (`nebula worker --device cpu|cuda|auto`, auto resolved)
DeviceKind = Literal["cpu", "cuda"]
# what a job's role asks for: a CPU, a CUDA device, or whatever its worker has
DeviceNeed = Literal["cpu", "cuda", "any"]
ANY_DEVICE: DeviceNeed = "any"


class DeviceInfo(StrictIn):
    """A worker's device as it reports it: cheap facts, read once when it starts."""

    kind: DeviceKind
    # CUDA: the first device's name ("NVIDIA H200"); CPU: the processor's model, or ""
    name: str = Field(default="", max_length=128, pattern=r"^[\x20-\x7e]*$")
    # CUDA devices visible to the worker; CPU: cores it may use
    count: int = Field(default=1, ge=0, le=4096)
    # CUDA: the first device's memory; CPU: None
    memory_bytes: int | None = Field(default=None, ge=0, le=2**50)
    # CUDA: the CUDA runtime torch was built with ("12.4"); CPU: ""
    runtime: str = Field(default="", max_length=32, pattern=r"^[\x21-\x7e]*$")


def role_device(need: DeviceNeed, worker: DeviceKind) -> DeviceKind | None:
    """The device a role that needs `need` runs on, on a worker with `worker`; None when
    the worker lacks it (a CPU worker asked for CUDA).

    Every worker has a CPU, so a role that needs the CPU runs there even on a CUDA
    worker (a reference run, or a role too small to gain from the GPU)."""
    if need == "cuda":
        return "cuda" if worker == "cuda" else None
    if need == "cpu":
        return "cpu"
    return worker

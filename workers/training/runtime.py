"""What every training role shares: hooks, checkpoints, wire messages, codecs.

A role talks to its peer role only through a `Link` (workers/switch/link.py).
Payloads here are `bytes` built by `pack_message`: a small JSON header and raw
little-endian arrays, so a message means the same on any machine and carries
exactly the integer widths the sender chose.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from contract.cluster_api import Rendezvous
from workers.compression import Codec, parse_spec
from workers.switch.link import Link, Payload
from workers.training import sealed

# ---------------------------------------------------------------- hooks and results


@dataclass
class Hooks:
    """How the caller follows and steers a role: metrics out, cancellation in."""

    on_metrics: Callable[[int, dict[str, float]], None] | None = None
    should_stop: Callable[[], bool] | None = None
    on_checkpoint: Callable[[int, Path], None] | None = None
    # With replicas in other processes (roles of their own): publish(rendezvous) tells them
    # where to join; None: the role starts its replicas itself, as local processes.
    publish_rendezvous: Callable[[Rendezvous], None] | None = None
    rendezvous_host: str = "127.0.0.1"  # the address other processes reach this one at
    # seals what the role leaves on disk (checkpoints, tokenizer, artifact); None: plain
    checkpoint_key: bytes | None = None

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Report the metrics of one finished step."""
        if self.on_metrics is not None:
            self.on_metrics(step, values)

    def stop_requested(self) -> bool:
        """Whether the caller asks the role to stop (checked between steps)."""
        return self.should_stop is not None and self.should_stop()

    def checkpointed(self, step: int, path: Path) -> None:
        """Tell the caller a checkpoint was written."""
        if self.on_checkpoint is not None:
            self.on_checkpoint(step, path)


class ReportableError(ValueError):
    """A failure whose message Nebula's code wrote from fixed words and numbers, never from
    data: the one kind of error text a role sends to the control plane (workers/runner.py)."""


@dataclass
class RoleResult:
    """What a role function returns once its loop ends."""

    start_step: int  # the step it resumed from (0: from scratch)
    last_step: int  # the last step it finished
    stopped: bool  # True when cancelled before `steps`
    history: list[dict[str, float]] = field(default_factory=list)  # metrics of each step run
    artifact: Path | None = None  # the role's output file, if it writes one
    extra: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- wire messages

_MAGIC = b"NBM1"


def smallest_uint(max_value: int) -> np.dtype[Any]:
    """The narrowest unsigned integer dtype that holds 0..max_value."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def pack_message(
    header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None
) -> bytes:
    """Serialize a JSON header and named arrays (dtype and shape kept) into bytes."""
    specs = []
    blobs = []
    for name, arr in (arrays or {}).items():
        a = np.asarray(arr, order="C")  # not ascontiguousarray: it turns 0-d into 1-d
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape)})
        blobs.append(a.tobytes())
    head = json.dumps({"h": dict(header), "a": specs}, separators=(",", ":")).encode()
    return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *blobs])


def unpack_message(blob: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of `pack_message`; raises ValueError on a malformed message."""
    if blob[:4] != _MAGIC or len(blob) < 8:
        raise ValueError("not a training message")
    (n,) = struct.unpack("<I", blob[4:8])
    meta = json.loads(blob[8 : 8 + n])
    offset = 8 + n
    arrays: dict[str, np.ndarray] = {}
    for spec in meta["a"]:
        dtype = np.dtype(spec["dtype"])
        count = int(np.prod(spec["shape"], dtype=np.int64))
        size = count * dtype.itemsize
        if offset + size > len(blob):
            raise ValueError("truncated training message")
        arrays[spec["name"]] = np.frombuffer(blob, dtype, count, offset).reshape(
            tuple(spec["shape"])
        )
        offset += size
    if offset != len(blob):
        raise ValueError("trailing bytes in training message")
    return meta["h"], arrays


def pack_uint(t: torch.Tensor, max_value: int) -> np.ndarray:
    """A non-negative integer tensor as the narrowest unsigned array that holds max_value."""
    return t.detach().cpu().numpy().astype(smallest_uint(max_value))


def unpack_int(a: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """An integer array back as an int64 tensor."""
    return torch.from_numpy(a.astype(np.int64)).to(device)


def expect_bytes(payload: Payload) -> bytes:
    """The payload as bytes; training roles send only bytes."""
    if not isinstance(payload, bytes):
        raise ValueError(f"expected bytes from the peer role, got {type(payload).__name__}")
    return payload


# ---------------------------------------------------------------- codecs


class CodecBook:
    """One codec per (stream, spec) for the life of a role.

    Stateful codecs need this: a power iteration's warm start and error feedback's
    residual carry from one step to the next only if the same instance encodes them.
    """

    def __init__(self) -> None:
        self._codecs: dict[tuple[str, str], Codec] = {}

    def get(self, stream: str, spec: str) -> Codec:
        """The codec of `spec` on `stream` ("forward", "backward", "eval", ...)."""
        codec = self._codecs.get((stream, spec))
        if codec is None:
            codec = self._codecs[(stream, spec)] = parse_spec(spec)
        return codec


# ---------------------------------------------------------------- checkpoints

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


def hello(link: Link, channel: str, mine: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Exchange a JSON hello with the peer role (both send first, then receive)."""
    link.send(channel, pack_message(mine))
    theirs, _ = unpack_message(expect_bytes(link.recv(channel, timeout=timeout)))
    return theirs

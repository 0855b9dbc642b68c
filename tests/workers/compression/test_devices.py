"""Codecs compute on the tensor's device: only the wire bytes go to the host.

No accelerator is needed to check it. `Elsewhere` is a tensor subclass that says it lives
on a device of its own (`cpu:1`) and counts every byte that leaves it for the host
(`.cpu()`, `.to("cpu")`, `.numpy()`, `.tolist()`): an encode may move exactly the bytes its
blob carries, and the state a codec keeps (a residual, a warm basis) must stay on the
device. Decoding onto the `meta` device proves that everything after reading the bytes
runs on the device asked for: an operation mixing host and meta tensors raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from workers.compression import ErrorFeedback, LowRankCodec, decode, parse_spec
from workers.compression.wire import header_nbytes, unpack_header

DEVICE = torch.device("cpu", 1)  # a device torch computes on like the host, told apart here
HOST = torch.device("cpu")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class Elsewhere(torch.Tensor):
    """A tensor on DEVICE; what leaves it for the host is counted in `to_host`."""

    to_host: ClassVar[list[int]] = []  # bytes of each move to the host, 0-d reads apart

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func == torch.Tensor.device.__get__:  # a method-wrapper: equal, not the same
            return DEVICE
        this = args[0] if args else None
        if isinstance(this, Elsewhere) and _leaves_for_host(func, args[1:], kwargs):
            plain = this.as_subclass(torch.Tensor)
            if plain.dim():  # a scalar's flag (all finite?) is not data
                cls.to_host.append(_nbytes(plain))
            if func is torch.Tensor.to and _stays_same_dtype(args[1:], kwargs):
                return plain.clone()
            with torch._C.DisableTorchFunctionSubclass():
                return func(plain, *args[1:], **kwargs)
        if func is torch.Tensor.to and _target(args[1:], kwargs) == DEVICE:
            return this  # already here
        return super().__torch_function__(func, types, args, kwargs)


def _target(rest: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.device | None:
    for value in (*rest, kwargs.get("device")):
        if isinstance(value, torch.device):
            return value
        if isinstance(value, str):
            return torch.device(value)
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _stays_same_dtype(rest: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    return not any(isinstance(v, torch.dtype) for v in (*rest, *kwargs.values()))


def _leaves_for_host(
    func: Callable[..., Any], rest: tuple[Any, ...], kwargs: dict[str, Any]
) -> bool:
    if func in (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist):
        return True
    return func is torch.Tensor.to and _target(rest, kwargs) == HOST


def elsewhere(x: torch.Tensor) -> Elsewhere:
    """`x` as a tensor on DEVICE."""
    return x.clone().as_subclass(Elsewhere)  # type: ignore[return-value]


@pytest.fixture(autouse=True)
def _count_afresh() -> None:
    Elsewhere.to_host.clear()


def _wire_payload(blob: bytes) -> int:
    """Bytes of tensor data in a blob: all but its headers (and a low-rank blob's layout and
    rank field)."""
    kind, _shape, body = unpack_header(memoryview(blob), 0)
    if kind.name != "LOWRANK":
        return len(blob) - body
    p_end = _dense_end(blob, body + 8)
    p_body = unpack_header(memoryview(blob), body + 8)[2]
    q_body = unpack_header(memoryview(blob), p_end)[2]
    return (p_end - p_body) + (len(blob) - q_body)


def _dense_end(blob: bytes, start: int) -> int:
    """Where the dense blob that starts at `start` ends."""
    kind, shape, body = unpack_header(memoryview(blob), start)
    count = math.prod(shape)
    if kind.name == "INT8":
        return body + 4 * (count // shape[-1] if shape else 1) + count
    return body + {"NONE": 4, "FP16": 2, "BF16": 2}[kind.name] * count


def _matrix(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # rank 6 plus a little noise: the low-rank codecs have something to find
    return (torch.randn(48, 6, generator=g) @ torch.randn(6, 40, generator=g)) + 0.01 * torch.randn(
        48, 40, generator=g
    )


SPECS = [
    "none",
    "fp16",
    "bf16",
    "int8",
    "int8(stochastic=true)",
    "lowrank(0.25)",
    "lowrank(0.25,method=rsvd)",
    "lowrank(0.25,method=power)",
    "fp16(lowrank(0.25,method=power))",
    "int8(lowrank(0.25,method=power))",
    "ef(int8)",
    "ef(fp16(lowrank(0.25,method=power)))",
]


@pytest.mark.parametrize("spec", SPECS)
def test_encode_moves_only_the_wire_bytes_to_the_host(spec: str) -> None:
    codec = parse_spec(spec)
    for step in range(3):  # warm starts and residuals carried from step to step
        x = _matrix(step)
        Elsewhere.to_host.clear()
        blob = codec.encode(elsewhere(x))
        assert sum(Elsewhere.to_host) == _wire_payload(blob), (spec, Elsewhere.to_host)
        assert decode(blob).shape == x.shape


@pytest.mark.parametrize("spec", SPECS)
def test_encode_on_the_device_gives_the_host_encodes_blob(spec: str) -> None:
    here, there = parse_spec(spec), parse_spec(spec)
    for step in range(3):
        x = _matrix(step)
        assert there.encode(elsewhere(x)) == here.encode(x), (spec, step)


@pytest.mark.parametrize("spec", ["ef(int8)", "ef(fp16(lowrank(0.25,method=power)))"])
def test_the_residual_stays_on_the_device(spec: str) -> None:
    codec = parse_spec(spec)
    assert isinstance(codec, ErrorFeedback)
    codec.encode(elsewhere(_matrix()))
    assert isinstance(codec.residual, Elsewhere)


@pytest.mark.parametrize("spec", ["lowrank(0.25,method=power)", "fp16(lowrank(0.25,method=power))"])
def test_the_warm_basis_stays_on_the_device(spec: str) -> None:
    codec = parse_spec(spec)
    assert isinstance(codec, LowRankCodec)
    for step in range(2):
        codec.encode(elsewhere(_matrix(step)))
        assert isinstance(codec.warm_start, Elsewhere)


@pytest.mark.parametrize("spec", SPECS)
def test_decode_computes_on_the_device_asked_for(spec: str) -> None:
    codec = parse_spec(spec)
    x = _matrix()
    blob = codec.encode(x)
    on_meta = codec.decode(blob, shape=x.shape, device="meta")
    assert on_meta.device.type == "meta" and on_meta.shape == x.shape
    assert on_meta.dtype == torch.float32
    assert decode(blob, device="meta").device.type == "meta"
    assert torch.equal(codec.decode(blob, shape=x.shape), decode(blob))  # the host by default


def test_header_bytes_are_not_tensor_data() -> None:
    # the payload count above leaves out exactly the headers
    blob = parse_spec("fp16").encode(torch.ones(3, 5))
    assert _wire_payload(blob) == len(blob) - header_nbytes(2) == 30

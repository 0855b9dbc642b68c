"""Adaptive codec choice per tensor: least encode + transfer + decode time under an error bound.

The switch measures the link bandwidth; `profile_codec` measures what each candidate
costs on this machine and how much error it makes on a sample of the stream.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from workers.compression.codecs import Codec
from workers.compression.errors import CodecError
from workers.compression.spec import parse_spec


@dataclass(frozen=True)
class CodecProfile:
    """Measured cost and error of one codec on one tensor shape."""

    spec: str
    shape: tuple[int, ...]
    encode_s: float
    decode_s: float
    wire_nbytes: int
    rel_error: float

    def transfer_s(self, bandwidth_bps: float) -> float:
        """Seconds the blob takes on a link of `bandwidth_bps` bits per second."""
        return transfer_seconds(self.wire_nbytes, bandwidth_bps)

    def total_s(self, bandwidth_bps: float) -> float:
        """Encode + transfer + decode seconds."""
        return self.encode_s + self.transfer_s(bandwidth_bps) + self.decode_s


@dataclass(frozen=True)
class Choice:
    """The chosen codec and every candidate's verdict, best first."""

    spec: str
    total_s: float
    ranking: tuple[tuple[str, float, bool], ...]  # (spec, cost, within the bound)
    rel_error: float = 0.0  # the chosen codec's, as profiled
    wire_nbytes: int = 0


def transfer_seconds(nbytes: int, bandwidth_bps: float) -> float:
    """Seconds to move `nbytes` over a link of `bandwidth_bps` bits per second."""
    if bandwidth_bps <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_bps}")
    return 8.0 * nbytes / bandwidth_bps


def relative_error(x: torch.Tensor, y: torch.Tensor) -> float:
    """||x - y||_F / ||x||_F (0 for a zero x reproduced exactly)."""
    norm = float(torch.linalg.vector_norm(x.float()))
    diff = float(torch.linalg.vector_norm(x.float() - y.float()))
    if norm == 0.0:
        return 0.0 if diff == 0.0 else float("inf")
    return diff / norm


def profile_codec(codec: Codec | str, x: torch.Tensor, steps: int = 3) -> CodecProfile:
    """Time and error of a codec on `x`, measured on the last of `steps` encodes.

    Stateful codecs (power iteration) are profiled warm, as a stream sees them.
    """
    if steps < 1:
        raise ValueError("steps must be >= 1")
    codec = parse_spec(codec) if isinstance(codec, str) else codec
    encode_s = decode_s = 0.0
    blob = b""
    y = x
    for _ in range(steps):
        start = time.perf_counter()
        blob = codec.encode(x)
        middle = time.perf_counter()
        y = codec.decode(blob)
        encode_s, decode_s = middle - start, time.perf_counter() - middle
    return CodecProfile(
        spec=codec.spec,
        shape=tuple(x.shape),
        encode_s=encode_s,
        decode_s=decode_s,
        wire_nbytes=len(blob),
        rel_error=relative_error(x, y),
    )


def choose_codec(
    profiles: Iterable[CodecProfile], bandwidth_bps: float | None, max_rel_error: float
) -> Choice:
    """The profile with the least total time among those within the error bound.

    With `bandwidth_bps` None (the link not measured yet) the link is taken to be the
    bottleneck: the fewest wire bytes win, and `total_s` is the codec time alone.
    """

    def cost(p: CodecProfile) -> float:
        if bandwidth_bps is None:
            return float(p.wire_nbytes)
        return p.total_s(bandwidth_bps)

    scored = sorted(
        ((cost(p), p.rel_error <= max_rel_error, p.spec, p) for p in profiles),
        key=lambda item: (not item[1], item[0]),
    )
    if not scored or not scored[0][1]:
        raise CodecError(
            f"no candidate codec keeps the relative error under {max_rel_error:g}; "
            "add 'none' to the candidates"
        )
    best = scored[0][3]
    return Choice(
        spec=best.spec,
        total_s=best.encode_s + best.decode_s
        if bandwidth_bps is None
        else best.total_s(bandwidth_bps),
        ranking=tuple((spec, total, ok) for total, ok, spec, _ in scored),
        rel_error=best.rel_error,
        wire_nbytes=best.wire_nbytes,
    )


@dataclass
class AdaptivePolicy:
    """Per-stream codec choice; profiles each (stream, shape) once and keeps one codec each."""

    candidates: Sequence[str] = ("none", "fp16", "bf16", "int8")
    max_rel_error: float = 1e-2
    profile_steps: int = 3
    _profiles: dict[tuple[str, tuple[int, ...]], list[CodecProfile]] = field(
        default_factory=dict, repr=False
    )
    _codecs: dict[tuple[str, str], Codec] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("an adaptive policy needs at least one candidate")
        self.candidates = tuple(parse_spec(spec).spec for spec in self.candidates)

    def profiles(self, stream: str, x: torch.Tensor) -> list[CodecProfile]:
        """Measured profiles of every candidate for this stream's shape (measured once)."""
        key = (stream, tuple(x.shape))
        if key not in self._profiles:
            self._profiles[key] = [
                profile_codec(spec, x, steps=self.profile_steps) for spec in self.candidates
            ]
        return self._profiles[key]

    def forget(self, stream: str) -> None:
        """Drop the profiles of a stream, so the next call measures again."""
        for key in [k for k in self._profiles if k[0] == stream]:
            del self._profiles[key]

    def choose(self, stream: str, x: torch.Tensor, bandwidth_bps: float | None) -> Choice:
        """The best candidate for `x` on a link of `bandwidth_bps` bits per second."""
        return choose_codec(self.profiles(stream, x), bandwidth_bps, self.max_rel_error)

    def codec(
        self, stream: str, x: torch.Tensor, bandwidth_bps: float | None
    ) -> tuple[Codec, Choice]:
        """The codec instance to encode `x` with (one per stream and spec, state kept)."""
        choice = self.choose(stream, x, bandwidth_bps)
        key = (stream, choice.spec)
        if key not in self._codecs:
            self._codecs[key] = parse_spec(choice.spec)
        return self._codecs[key], choice

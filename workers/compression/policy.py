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
    # in float64: float32 sums of squares overflow past |x| ~ 1e19 and underflow below 1e-19
    xd = x.detach().double()
    norm = float(torch.linalg.vector_norm(xd))
    diff = float(torch.linalg.vector_norm(xd - y.detach().double()))
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
class StreamState:
    """What `auto` uses on one stream and what it measured there (the job's metrics)."""

    choice: Choice | None = None
    since_profile: int = 0  # tensors encoded since the last profile
    since_check: int = 0  # tensors encoded since the last live measurement
    measured_error: float | None = None  # on the last live tensor measured
    profiles: int = 0  # how often the stream was profiled (the first time included)
    over_bound: int = 0  # live measurements past the bound (each one re-profiled)


@dataclass(frozen=True)
class Encoded:
    """One tensor encoded by `AdaptivePolicy.encode`."""

    spec: str
    blob: bytes
    choice: Choice
    measured_error: float | None  # this tensor's error, when it was measured


@dataclass
class AdaptivePolicy:
    """Per-stream codec choice that keeps its error bound on live tensors.

    Each stream is profiled on its first tensor (every candidate, on that tensor), and
    again every `remeasure_every` tensors, since a stream's spectrum moves as training
    goes on. Every `check_every` tensors the error of the blob actually sent is measured
    (decoded here, as the receiver will); past `max_rel_error` the stream is profiled
    again on that tensor at once and the tensor encoded anew with the new choice, so no
    blob that is measured past the bound leaves.
    """

    candidates: Sequence[str] = ("none", "fp16", "bf16", "int8")
    max_rel_error: float = 1e-2
    profile_steps: int = 3
    remeasure_every: int = 50
    check_every: int = 1
    _profiles: dict[tuple[str, tuple[int, ...]], list[CodecProfile]] = field(
        default_factory=dict, repr=False
    )
    _codecs: dict[tuple[str, str], Codec] = field(default_factory=dict, repr=False)
    _streams: dict[str, StreamState] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("an adaptive policy needs at least one candidate")
        if self.remeasure_every < 1 or self.check_every < 1:
            raise ValueError("remeasure_every and check_every must be >= 1")
        self.candidates = tuple(parse_spec(spec).spec for spec in self.candidates)

    def profiles(self, stream: str, x: torch.Tensor) -> list[CodecProfile]:
        """Measured profiles of every candidate for this stream's shape (kept until forgotten)."""
        key = (stream, tuple(x.shape))
        if key not in self._profiles:
            # the instances profiled become the stream's: a stateful codec (power
            # iteration) then goes on from the state that reached the profiled error
            fresh = {spec: parse_spec(spec) for spec in self.candidates}
            self._profiles[key] = [
                profile_codec(codec, x, steps=self.profile_steps) for codec in fresh.values()
            ]
            self._codecs.update({(stream, spec): codec for spec, codec in fresh.items()})
            self.state(stream).profiles += 1
        return self._profiles[key]

    def forget(self, stream: str) -> None:
        """Drop the profiles of a stream, so the next call measures again."""
        for key in [k for k in self._profiles if k[0] == stream]:
            del self._profiles[key]

    def state(self, stream: str) -> StreamState:
        """The stream's choice and measurements (created empty on first use)."""
        return self._streams.setdefault(stream, StreamState())

    def choose(self, stream: str, x: torch.Tensor, bandwidth_bps: float | None) -> Choice:
        """The best candidate for `x` on a link of `bandwidth_bps` bits per second."""
        return choose_codec(self.profiles(stream, x), bandwidth_bps, self.max_rel_error)

    def codec(
        self, stream: str, x: torch.Tensor, bandwidth_bps: float | None
    ) -> tuple[Codec, Choice]:
        """The codec instance to encode `x` with (one per stream and spec, state kept)."""
        choice = self.choose(stream, x, bandwidth_bps)
        return self._instance(stream, choice.spec), choice

    def _instance(self, stream: str, spec: str) -> Codec:
        key = (stream, spec)
        if key not in self._codecs:
            self._codecs[key] = parse_spec(spec)
        return self._codecs[key]

    def encode(self, stream: str, x: torch.Tensor, bandwidth_bps: float | None) -> Encoded:
        """`x` encoded with the stream's choice, re-profiled when due or past the bound."""
        state = self.state(stream)
        if state.choice is None or state.since_profile >= self.remeasure_every:
            self.forget(stream)
            state.since_profile = 0
        codec, choice = self.codec(stream, x, bandwidth_bps)
        state.choice = choice
        blob = codec.encode(x)
        state.since_profile += 1
        state.since_check += 1
        measured: float | None = None
        if state.since_check >= self.check_every:
            state.since_check = 0
            measured = relative_error(x, codec.decode(blob))
            if measured > self.max_rel_error:
                # the spectrum moved away from what the profile saw: profile on this tensor
                state.over_bound += 1
                self.forget(stream)
                state.since_profile = 1
                codec, choice = self.codec(stream, x, bandwidth_bps)
                state.choice = choice
                blob = codec.encode(x)
                measured = relative_error(x, codec.decode(blob))
            state.measured_error = measured
        return Encoded(choice.spec, blob, choice, measured)

"""What crosses between ABNet's clusters, as named types, and the codec streams that carry it.

Channels:
- META (S -> T): a `Batch` header (pair indices, source lengths, how many chunks follow
  on ACT) or a `Control` (`eval_end`, `stop`).
- ACT (S -> T): one `Coded` chunk of a micro-batch's activations; a micro-batch is cut
  along its sentences so T decodes chunk i while chunk i+1 is on the wire.
- GRAD (T -> S): one `Coded` gradient of a micro-batch's activations.
- SYNC (T -> S): a `StepSync` after each step (figures, and whether T asks to stop),
  an `EvalScore` after an evaluation.

Every coded payload names its codec spec, so `auto` streams decode what was chosen;
a spec the config does not allow at that step is refused before anything is decoded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import torch

from workers.compression import AdaptivePolicy, Choice, Codec, LowRankCodec, StreamBasisCodec
from workers.switch.link import LinkEstimate
from workers.training.abnet.config import AUTO, AUTO_CANDIDATES, AbnetConfig
from workers.training.messages import (
    CodecBook,
    expect_bytes,
    pack_message,
    pack_uint,
    unpack_int,
    unpack_message,
)

HELLO, META, ACT, GRAD, SYNC = "abnet.hello", "abnet.meta", "abnet.act", "abnet.grad", "abnet.sync"


class Kind(StrEnum):
    """What a META message announces."""

    TRAIN = "train"  # a training micro-batch; its chunks follow on ACT
    EVAL = "eval"  # a batch of evaluation sources; its chunks follow on ACT
    EVAL_END = "eval_end"  # the evaluation batches of a step are all sent
    STOP = "stop"  # S sends nothing more


@dataclass(frozen=True)
class Control:
    """A META message without activations."""

    kind: Kind
    step: int


def _int(header: dict[str, Any], key: str) -> int:
    value = header.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Batch:
    """A micro-batch (or eval batch) header: which pairs, their source lengths, the chunks."""

    kind: Kind
    step: int
    micro: int
    index: torch.Tensor  # (B,) pair indices
    src_len: torch.Tensor  # (B,) source lengths: the valid positions of each sentence
    chunks: int
    positions: int = 0  # S, the padded length the receiver rebuilds (B, S, C) at


def pack_meta(item: Batch | Control, max_index: int, max_len: int) -> bytes:
    """META bytes of a batch header or a control message."""
    if isinstance(item, Control):
        return pack_message({"kind": str(item.kind), "step": item.step})
    arrays = {
        "index": pack_uint(item.index, max_index),
        "src_len": pack_uint(item.src_len, max_len),
    }
    header = {
        "kind": str(item.kind),
        "step": item.step,
        "micro": item.micro,
        "chunks": item.chunks,
        "positions": item.positions,
    }
    return pack_message(header, arrays)


def unpack_meta(blob: bytes, max_chunks: int, max_len: int | None = None) -> Batch | Control:
    """Inverse of `pack_meta`; ValueError on anything else, lengths that do not fit the
    tensor (`check_lengths`) included, before anything of the batch is allocated."""
    header, arrays = unpack_message(blob)
    kind, step = Kind(header["kind"]), _int(header, "step")
    if kind in (Kind.EVAL_END, Kind.STOP):
        return Control(kind, step)
    chunks = _int(header, "chunks")
    index, src_len = unpack_int(arrays["index"]), unpack_int(arrays["src_len"])
    if not 1 <= chunks <= max_chunks or len(index) != len(src_len) or chunks > len(index):
        raise ValueError(f"malformed batch header {header}")
    positions = _int(header, "positions")
    check_lengths(src_len, positions, max_len)
    return Batch(kind, step, _int(header, "micro"), index, src_len, chunks, positions)


def check_lengths(lengths: torch.Tensor, positions: int, max_len: int | None = None) -> None:
    """ValueError, with the reason, unless `lengths` can be the valid prefixes of a
    (len(lengths), positions, C) tensor: each within 0..positions, positions within
    1..max_len, so that they sum to at most the batch's len(lengths) x positions."""
    if positions < 1 or (max_len is not None and positions > max_len):
        raise ValueError(f"the batch claims {positions} positions, the limit is {max_len}")
    if len(lengths) == 0:
        return
    if int(lengths.min()) < 0:
        raise ValueError(f"a declared length is negative ({int(lengths.min())})")
    total, room = int(lengths.sum()), len(lengths) * positions
    if total > room:
        raise ValueError(f"declared lengths sum to {total}, more than the batch's {room} positions")
    if int(lengths.max()) > positions:
        raise ValueError(
            f"a declared length ({int(lengths.max())}) exceeds the tensor's {positions} positions"
        )


def _prefix(lengths: torch.Tensor, positions: int) -> torch.Tensor:
    """(B, positions) bool, True at the first lengths[b] positions of each row."""
    return torch.arange(positions, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)


def pack_valid(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The valid positions of a padded (B, S, C) tensor as one (sum(lengths), C) matrix,
    sentence after sentence: padding never crosses."""
    return x[_prefix(lengths.to(x.device), x.shape[1])]


def unpack_valid(packed: torch.Tensor, lengths: torch.Tensor, positions: int) -> torch.Tensor:
    """The padded (B, positions, C) tensor `pack_valid` came from, zeros at the padding.
    `lengths` must have passed `check_lengths` and `packed` have sum(lengths) rows."""
    mask = _prefix(lengths.to(packed.device), positions)
    out = packed.new_zeros((len(lengths), positions, packed.shape[-1]))
    out[mask] = packed
    return out


@dataclass(frozen=True)
class StepSync:
    """T's word after a step: its figures, and whether it asks S to stop after the next."""

    step: int
    loss: float
    token_accuracy: float
    stop: bool


@dataclass(frozen=True)
class EvalScore:
    """T's BLEU on the evaluation pairs S sent at `step`."""

    step: int
    bleu: float


def pack_sync(item: StepSync | EvalScore) -> bytes:
    """SYNC bytes."""
    if isinstance(item, EvalScore):
        return pack_message({"kind": "eval", "step": item.step, "bleu": item.bleu})
    values = {"loss": item.loss, "token_accuracy": item.token_accuracy, "stop": item.stop}
    return pack_message({"kind": "step", "step": item.step, **values})


def unpack_sync(blob: bytes) -> StepSync | EvalScore:
    """Inverse of `pack_sync`."""
    h, _ = unpack_message(blob)
    if h.get("kind") == "eval":
        return EvalScore(_int(h, "step"), float(h["bleu"]))
    if h.get("kind") != "step" or not isinstance(h.get("stop"), bool):
        raise ValueError(f"malformed sync message {h}")
    return StepSync(_int(h, "step"), float(h["loss"]), float(h["token_accuracy"]), h["stop"])


@dataclass(frozen=True)
class Coded:
    """One encoded tensor and the spec that encoded it."""

    spec: str
    step: int
    blob: bytes
    choice: Choice | None = None  # set when `auto` chose the spec (not sent)


def pack_coded(coded: Coded) -> bytes:
    """ACT / GRAD bytes: the spec, the step and the blob."""
    blob = np.frombuffer(coded.blob, dtype=np.uint8)
    return pack_message({"spec": coded.spec, "step": coded.step}, {"blob": blob})


def unpack_coded(payload: object) -> Coded:
    """Inverse of `pack_coded`."""
    header, arrays = unpack_message(expect_bytes(payload))  # type: ignore[arg-type]
    blob = arrays.get("blob")
    if not isinstance(header.get("spec"), str) or blob is None or blob.dtype != np.uint8:
        raise ValueError("malformed coded tensor")
    return Coded(header["spec"], _int(header, "step"), blob.tobytes())


def chunks(x: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """`x` cut along its first axis (the sentences) into at most `n` pieces."""
    return torch.tensor_split(x, min(n, x.shape[0]), dim=0)


# ---------------------------------------------------------------- codec streams

FORWARD, BACKWARD = 0, 1  # which of `AbnetConfig.codecs(step)` a stream uses


class StreamEncoder:
    """The sending end of one stream: the spec in force at each step, `auto` resolved per tensor.

    One instance per stream for the life of a role, used by one thread, so stateful
    codecs (power iteration's warm start) carry from one tensor to the next. `auto`
    asks `estimate` for the link's measurement; until there is one (None, or no samples)
    the link is taken to be the bottleneck and the fewest bytes within
    `cfg.auto_max_error` win. With a `warm_source` (the eval stream's, the training
    stream's encoder), a power-iteration codec starts each step from the source's basis.
    """

    def __init__(
        self,
        cfg: AbnetConfig,
        stream: str,
        which: int,
        estimate: Callable[[], LinkEstimate | None] = lambda: None,
        warm_source: StreamEncoder | None = None,
    ) -> None:
        self.cfg, self.stream, self.which, self.estimate = cfg, stream, which, estimate
        self.warm_source = warm_source
        self._warmed_at: int | None = None
        self.book = CodecBook()
        self.policy = AdaptivePolicy(candidates=AUTO_CANDIDATES, max_rel_error=cfg.auto_max_error)
        self.last_choice: Choice | None = None
        self.last_bandwidth_bps: float | None = None

    def encode(self, step: int, x: torch.Tensor) -> Coded:
        """`x` (float32) encoded with the codec of `step`."""
        x = x.detach()
        spec = self.cfg.codecs(step)[self.which]
        choice = None
        codec: Codec
        if spec == AUTO:
            est = self.estimate()
            bandwidth = 8.0 * est.bandwidth_bytes_per_s if est and est.samples > 0 else None
            encoded = self.policy.encode(self.stream, x, bandwidth)
            self.last_choice, self.last_bandwidth_bps = encoded.choice, bandwidth
            return Coded(encoded.spec, step, encoded.blob, encoded.choice)
        codec = self.book.get(self.stream, spec)
        if self.warm_source is not None and step != self._warmed_at:
            self._warmed_at = step
            self._warm(codec, spec)
        return Coded(codec.spec, step, codec.encode(x), choice)

    def _warm(self, codec: Codec, spec: str) -> None:
        """Start a power-iteration codec from the warm source's basis of the same spec
        (the training stream's, for the eval stream), so that the first chunk of an
        evaluation is not coded from a random start."""
        assert self.warm_source is not None
        source = self.warm_source.book.get(self.warm_source.stream, spec)
        if isinstance(codec, LowRankCodec) and isinstance(source, LowRankCodec):
            if source.warm_start is not None:
                codec.warm_from(source)
        elif isinstance(codec, StreamBasisCodec) and isinstance(source, StreamBasisCodec):
            codec.warm_from(source)


class StreamDecoder:
    """The receiving end of one stream: decodes what the spec of its step allows, nothing else."""

    def __init__(self, cfg: AbnetConfig, stream: str, which: int) -> None:
        self.cfg, self.stream, self.which = cfg, stream, which
        self.book = CodecBook()

    def decode(
        self,
        coded: Coded,
        shape: Sequence[int | None],
        max_numel: int,
        device: torch.device | None = None,
    ) -> torch.Tensor:
        """The float32 tensor of `coded` on `device` (None: the host); ValueError for a spec
        the step does not allow."""
        allowed = self.cfg.codecs(coded.step)[self.which]
        if allowed == AUTO:
            ok = coded.spec in AUTO_CANDIDATES
        else:
            ok = coded.spec == self.book.get(self.stream, allowed).spec
        if not ok:
            raise ValueError(
                f"{self.stream} step {coded.step}: spec {coded.spec!r} is not the one in force"
            )
        codec = self.book.get(self.stream, coded.spec)
        return codec.decode(coded.blob, shape=shape, max_numel=max_numel, device=device)


def round_trip(
    encoder: StreamEncoder,
    decoder: StreamDecoder,
    step: int,
    x: torch.Tensor,
    n_chunks: int,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """What the far side decodes of the padded (B, S, C) `x`, chunk by chunk, only the
    valid positions crossing (the single-process reference's link)."""
    out = []
    for piece, lens in zip(chunks(x, n_chunks), chunks(lengths, n_chunks), strict=True):
        packed = pack_valid(piece, lens)
        shape = tuple(packed.shape)
        got = decoder.decode(encoder.encode(step, packed), shape, packed.numel())
        out.append(unpack_valid(got, lens, x.shape[1]))
    return torch.cat(out)


class ByteCount:
    """Payload bytes a sending thread put on the link, per (kind, step); read by the role."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by: dict[tuple[str, int], int] = {}
        self.total = 0

    def add(self, kind: str, step: int, n: int) -> None:
        """Count `n` bytes of `kind` at `step`."""
        with self._lock:
            self._by[(kind, step)] = self._by.get((kind, step), 0) + n
            self.total += n

    def take(self, kind: str, step: int) -> int:
        """The bytes counted for (kind, step), forgotten once read."""
        with self._lock:
            return self._by.pop((kind, step), 0)


def auto_metrics(stream: str, encoder: StreamEncoder) -> dict[str, float]:
    """What `auto` uses on a stream, as metrics: the codec in use (its index in
    AUTO_CANDIDATES), the error measured on the live tensors and the one profiled, how
    often it profiled the stream and how often a live tensor passed the bound, the link."""
    choice = encoder.last_choice
    if choice is None:
        return {}
    state = encoder.policy.state(encoder.stream)
    out = {
        f"auto.{stream}.choice": float(AUTO_CANDIDATES.index(choice.spec)),
        f"auto.{stream}.rel_error": choice.rel_error,
        f"auto.{stream}.wire_bytes": float(choice.wire_nbytes),
        f"auto.{stream}.measured": float(encoder.last_bandwidth_bps is not None),
        f"auto.{stream}.profiles": float(state.profiles),
        f"auto.{stream}.over_bound": float(state.over_bound),
    }
    if state.measured_error is not None:
        out[f"auto.{stream}.measured_error"] = state.measured_error
    if encoder.last_bandwidth_bps is not None:
        out[f"auto.{stream}.bandwidth_mbit"] = encoder.last_bandwidth_bps / 1e6
    return out

"""Codecs: encode a float32 tensor to a self-describing blob, decode it back.

Dense codecs (`none`, `fp16`, `bf16`, `int8`) are stateless apart from scratch
buffers and a random generator. `lowrank` nests a dense codec for its factors and
keeps the power-iteration warm start; `lowrank(r,method=stream)` the stream's basis (on
both ends); `ef` keeps the error-feedback residual. Keep one instance per tensor stream.
Any blob decodes with `decode` alone, except a stream-basis blob that names a basis sent
before it: that one needs its stream's codec (`codec.decode`).

Codecs compute on the tensor's device: its state (residual, warm basis, int8 scratch)
stays there, and only the wire bytes go to the host (`wire.tensor_bytes`). Decoding
reads the bytes on the host, moves the wire-dtype values to the device asked for and
computes the rest there.
"""

from __future__ import annotations

import math
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from contract.codec_spec import STREAM_REFRESH
from workers.compression import lowrank
from workers.compression.errors import CodecError, NonFiniteError, WireError
from workers.compression.wire import (
    DENSE_DTYPE,
    Kind,
    header_nbytes,
    numel,
    pack_header,
    read_tensor,
    row_count,
    tensor_bytes,
    unpack_header,
)

Method = Literal["svd", "rsvd", "power"]
Layout = Literal["flat", "sample"]
LAYOUT_CODE: dict[str, int] = {"flat": 0, "sample": 1}
_LOWRANK_BODY = struct.Struct("<B3xI")
STREAM_LAYOUT = 2
"""The low-rank layout code of `lowrank(r,method=stream)`: P = X Q on the stream's basis Q."""
_STREAM_BODY = struct.Struct("<IB3x")  # the basis's version; 1 when Q follows P
STREAM_DECAY = 0.95
"""Weight of the covariance gathered so far against the next matrix's X^T X."""
STREAM_FLOAT32_FROM = 1e-3
"""The share of a stream's energy its basis must leave out before the stream's covariance
is gathered in float32 (`_gram`); below it (a stream its basis holds nearly whole), and
for a stream's first matrix, in float64."""
STREAM_DRIFT = 2.0
"""A matrix whose energy outside the stream's basis is past this many times the share
the basis was made to leave out gets a new basis at once, not at the next refresh."""
INT8_TINY = 1e-30
"""Rows of int8 whose absolute maximum is below this are sent as zeros."""
MAX_DECODED_NUMEL = 1 << 28
"""Elements a blob may decode to unless the caller says otherwise (1 GiB of float32).

Low-rank blobs expand: a 16 KiB one can claim 64 MiB, a 4 MiB one 4 TiB. The claimed
shape is checked against this (or the shape the stream expects) before allocating."""


@dataclass(frozen=True)
class Accepted:
    """The blob kinds a codec produces, hence the only ones its receiver takes."""

    kinds: frozenset[Kind]
    factor_kinds: frozenset[Kind] = frozenset()


@dataclass(frozen=True)
class WirePlan:
    """What a codec will put on the wire for one shape, against plain float32."""

    nbytes: int
    fp32_nbytes: int
    rank: int | None = None
    matrices: tuple[int, int, int] | None = None
    dense_fallback: bool = False

    @property
    def ratio(self) -> float:
        """Wire bytes over float32 bytes (header included)."""
        return self.nbytes / self.fp32_nbytes if self.fp32_nbytes else 1.0


def fp32_nbytes(shape: Sequence[int]) -> int:
    """Bytes of the tensor sent raw as float32, without a header."""
    return 4 * numel(shape)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value is finite; one cheap reduction unless the sum overflows."""
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum(dtype=torch.float32))):
        return True
    return bool(torch.isfinite(t).all())


def check_input(x: object) -> torch.Tensor:
    """The detached dense float32 tensor to encode, or a clear CodecError."""
    if not isinstance(x, torch.Tensor):
        raise CodecError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise CodecError(f"only dense tensors are supported, got layout {x.layout}")
    if x.dtype != torch.float32:
        raise CodecError(
            f"expected a float32 tensor, got {x.dtype}; cast it first (x.float()), "
            "decode always returns float32"
        )
    return x.detach()


Blob = bytes | bytearray | memoryview
Device = torch.device | str | None
"""Where a decoded tensor is made: a device, its name, or None for the host."""
HOST = torch.device("cpu")


def _device_generator(
    generators: dict[torch.device, torch.Generator], device: torch.device, seed: int
) -> torch.Generator:
    """The stream's random generator on `device` (a CUDA sketch needs a CUDA generator);
    every device's starts from the same seed."""
    device = torch.device(device.type, device.index) if device.type != "cpu" else HOST
    if device not in generators:
        generators[device] = torch.Generator(device=device).manual_seed(seed)
    return generators[device]


def _non_finite(what: str) -> NonFiniteError:
    return NonFiniteError(f"{what}: the tensor holds NaN or Inf; nothing was encoded")


class Codec(ABC):
    """Encoder of float32 tensors into self-describing blobs; `decode` needs only the blob."""

    @property
    @abstractmethod
    def spec(self) -> str:
        """The canonical spec string; parse_spec(spec) builds an equivalent codec."""

    @abstractmethod
    def encode(self, x: torch.Tensor) -> bytes:
        """The wire form of `x` (float32, any shape)."""

    @abstractmethod
    def plan(self, shape: Sequence[int]) -> WirePlan:
        """Exact bytes, rank and fallback for a tensor of `shape`."""

    def wire_nbytes(self, shape: Sequence[int]) -> int:
        """Exact length of the blob `encode` produces for a tensor of `shape`."""
        return self.plan(shape).nbytes

    @abstractmethod
    def accepts(self) -> Accepted:
        """The kinds of blob this codec writes."""

    def decode(
        self,
        blob: bytes | bytearray | memoryview,
        *,
        shape: Sequence[int | None] | None = None,
        max_numel: int = MAX_DECODED_NUMEL,
        device: Device = None,
    ) -> torch.Tensor:
        """The float32 tensor a blob of this codec carries, on `device` (None: the host);
        WireError for any other codec's blob, or a claimed shape other than `shape` (None:
        any size on that axis) or past `max_numel` elements, before anything is allocated."""
        return self._decode(blob, shape, max_numel, device)

    def _decode(
        self, blob: Blob, shape: Sequence[int | None] | None, max_numel: int, device: Device
    ) -> torch.Tensor:
        """`decode` for a codec whose blobs decode alone; a stateful codec overrides it."""
        return decode(
            blob, shape=shape, max_numel=max_numel, accepted=self.accepts(), device=device
        )

    def reset(self) -> None:
        """Forget carried state (warm starts, residuals); stateless codecs have none."""
        return None

    def __repr__(self) -> str:
        return f"parse_spec({self.spec!r})"


class DenseCodec(Codec):
    """A codec that sends every value; the ones a low-rank codec nests."""

    kind: Kind

    def dense_nbytes(self, shape: Sequence[int]) -> int:
        """Blob length for `shape`."""
        return header_nbytes(len(shape)) + self.body_nbytes(shape)

    @abstractmethod
    def body_nbytes(self, shape: Sequence[int]) -> int:
        """Body length for `shape`."""

    def plan(self, shape: Sequence[int]) -> WirePlan:
        """Exact bytes for a tensor of `shape`."""
        return WirePlan(nbytes=self.dense_nbytes(shape), fp32_nbytes=fp32_nbytes(shape))

    def accepts(self) -> Accepted:
        """Its own dense kind."""
        return Accepted(frozenset({self.kind}))


class CastCodec(DenseCodec):
    """`none` (float32), `fp16` or `bf16`: a plain cast, round to nearest even."""

    def __init__(self, kind: Kind) -> None:
        if kind not in DENSE_DTYPE:
            raise ValueError(f"{kind!r} is not a cast kind")
        self.kind = kind
        self.dtype = DENSE_DTYPE[kind]

    @property
    def spec(self) -> str:
        """`none`, `fp16` or `bf16`."""
        return {Kind.NONE: "none", Kind.FP16: "fp16", Kind.BF16: "bf16"}[self.kind]

    def body_nbytes(self, shape: Sequence[int]) -> int:
        """One value of the wire dtype per element."""
        return torch.empty((), dtype=self.dtype).element_size() * numel(shape)

    def encode(self, x: torch.Tensor) -> bytes:
        """Header and the values cast to the wire dtype."""
        x = check_input(x)
        y = x.to(self.dtype)  # on x's device; tensor_bytes takes the cast values to the host
        if not all_finite(y):
            if all_finite(x):
                raise NonFiniteError(
                    f"{self.spec}: values beyond the {self.dtype} range "
                    f"(max {torch.finfo(self.dtype).max:g}); use bf16, int8 or none"
                )
            raise _non_finite(self.spec)
        return b"".join((pack_header(self.kind, x.shape), tensor_bytes(y)))


class Int8Codec(DenseCodec):
    """Per-row absmax INT8 (rows = all axes but the last), optional stochastic rounding."""

    kind = Kind.INT8

    def __init__(self, stochastic: bool = False, seed: int = 0) -> None:
        self.stochastic = stochastic
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self._scratch: torch.Tensor | None = None

    @property
    def spec(self) -> str:
        """`int8` with its non-default options."""
        opts = []
        if self.stochastic:
            opts.append("stochastic=true")
        if self.seed:
            opts.append(f"seed={self.seed}")
        return f"int8({','.join(opts)})" if opts else "int8"

    def body_nbytes(self, shape: Sequence[int]) -> int:
        """A float32 scale per row and one byte per element."""
        return 4 * row_count(shape) + numel(shape)

    def reset(self) -> None:
        """Restart the rounding noise from the seed."""
        self._generators.clear()

    def _buffer(self, x: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        # reusing the float32 scratch is several times faster than allocating it per call
        scratch = self._scratch
        if scratch is None or tuple(scratch.shape) != shape or scratch.device != x.device:
            self._scratch = scratch = x.new_empty(shape)
        return scratch

    def encode(self, x: torch.Tensor) -> bytes:
        """Header, float32 scales (absmax / 127 per row), then the int8 values."""
        x = check_input(x)
        rows = row_count(x.shape)
        cols = x.shape[-1] if x.dim() else 1
        x2 = x.reshape(rows, cols)
        if x2.numel():
            absmax = torch.linalg.vector_norm(x2, ord=math.inf, dim=1)
        else:
            absmax = x.new_zeros(rows)
        if not all_finite(absmax):
            raise _non_finite(self.spec)
        live = absmax >= INT8_TINY
        scale = torch.where(live, absmax / 127.0, 0.0)
        inverse = torch.where(live, 127.0 / torch.where(live, absmax, 1.0), 0.0)
        y = torch.mul(x2, inverse.unsqueeze(1), out=self._buffer(x, (rows, cols)))
        if self.stochastic:
            generator = _device_generator(self._generators, y.device, self.seed)
            y.add_(torch.empty_like(y).uniform_(generator=generator)).floor_()
        else:
            y.round_()
        q = y.clamp_(-127.0, 127.0).to(torch.int8)
        return b"".join((pack_header(self.kind, x.shape), tensor_bytes(scale), tensor_bytes(q)))


def default_oversample(method: str) -> int:
    """Extra sketch columns by default: randomized SVD needs them at small ranks; power
    iteration keeps 4 more than k, which hold the directions near the k-th singular value
    from step to step (1.018 -> 1.007 x optimal on a rank-64 stream at k = 52)."""
    return {"rsvd": 8, "power": 4}.get(method, 0)


def _nested_spec(core: str, inner: DenseCodec) -> str:
    """`core` (a lowrank(...) spec) wrapped in its factor codec's spec, as the grammar
    writes it: `fp16(lowrank(0.2))`, `int8(lowrank(0.2),stochastic=true)`."""
    if isinstance(inner, CastCodec) and inner.kind == Kind.NONE:
        return core
    spec = inner.spec
    if spec.endswith(")"):
        name, options = spec.split("(", 1)
        return f"{name}({core},{options}"
    return f"{spec}({core})"


class LowRankCodec(Codec):
    """Rank-k factors P, Q with X ~= P Q^T, each sent with a nested dense codec.

    The tensor is one (prod(shape[:-1]), shape[-1]) matrix (`layout=flat`) or, with
    `layout=sample` and 3 or more axes, shape[0] matrices of
    (prod(shape[1:-1]), shape[-1]). k = ceil(ratio * min(m, n)); while k >= mn/(m+n)
    the factors would cost more than the matrix, so the codec sends the nested codec's
    dense blob instead (`plan(shape).dense_fallback`), unless `fallback=False`.
    """

    def __init__(
        self,
        ratio: float,
        method: Method = "svd",
        inner: DenseCodec | None = None,
        iters: int = 1,
        oversample: int | None = None,
        layout: Layout = "flat",
        fallback: bool = True,
        seed: int = 0,
    ) -> None:
        if not 0.0 < ratio <= 1.0 or not math.isfinite(ratio):
            raise ValueError(f"the keep ratio must be in (0, 1], got {ratio}")
        if method not in ("svd", "rsvd", "power"):
            raise ValueError(f"unknown low-rank method {method!r}")
        if layout not in LAYOUT_CODE:
            raise ValueError(f"unknown layout {layout!r}")
        if oversample is None:
            oversample = default_oversample(method)
        if iters < 1 or oversample < 0:
            raise ValueError("iters must be >= 1 and oversample >= 0")
        self.ratio = float(ratio)
        self.method: Method = method
        self.inner: DenseCodec = inner if inner is not None else CastCodec(Kind.NONE)
        self.iters = iters
        self.oversample = oversample
        self.layout: Layout = layout
        self.fallback = fallback
        self.seed = seed
        self._generator = torch.Generator().manual_seed(seed)  # cold starts, on the host
        self._generators: dict[torch.device, torch.Generator] = {}  # sketches, on the device
        self._warm: torch.Tensor | None = None  # on the device of the tensors it factors

    @property
    def spec(self) -> str:
        """`lowrank(r,...)` nested in its factor codec, with non-default options."""
        opts = [repr(self.ratio)]
        if self.method != "svd":
            opts.append(f"method={self.method}")
        if self.iters != 1:
            opts.append(f"iters={self.iters}")
        if self.oversample != default_oversample(self.method):
            opts.append(f"oversample={self.oversample}")
        if self.layout != "flat":
            opts.append(f"layout={self.layout}")
        if not self.fallback:
            opts.append("fallback=false")
        if self.seed:
            opts.append(f"seed={self.seed}")
        return _nested_spec(f"lowrank({','.join(opts)})", self.inner)

    def accepts(self) -> Accepted:
        """Low-rank blobs with factors of the nested codec, or its dense fallback."""
        return Accepted(frozenset({Kind.LOWRANK, self.inner.kind}), frozenset({self.inner.kind}))

    def reset(self) -> None:
        """Drop the warm start and restart the random sketches from the seed."""
        self._warm = None
        self._generator.manual_seed(self.seed)
        self._generators.clear()

    def matrices(self, shape: Sequence[int]) -> tuple[int, int, int]:
        """(batch, m, n): how the tensor is cut into matrices."""
        if self.layout == "sample" and len(shape) >= 3:
            return shape[0], math.prod(shape[1:-1]), shape[-1]
        if not shape:
            return 1, 1, 1
        return 1, math.prod(shape[:-1]), shape[-1]

    def _factor_shapes(self, b: int, m: int, n: int, k: int) -> tuple[tuple[int, ...], ...]:
        if self.layout == "sample":
            return (b, k, m), (b, k, n)
        return (k, m), (k, n)

    def plan(self, shape: Sequence[int]) -> WirePlan:
        """Rank, fallback and exact bytes for a tensor of `shape`."""
        shape = tuple(shape)
        b, m, n = self.matrices(shape)
        k = lowrank.rank_for(self.ratio, m, n)
        dense = not lowrank.low_rank_pays(k, m, n) and (self.fallback or k == 0)
        if dense:
            nbytes = self.inner.dense_nbytes(shape)
        else:
            p_shape, q_shape = self._factor_shapes(b, m, n, k)
            nbytes = (
                header_nbytes(len(shape))
                + _LOWRANK_BODY.size
                + self.inner.dense_nbytes(p_shape)
                + self.inner.dense_nbytes(q_shape)
            )
        return WirePlan(
            nbytes=nbytes,
            fp32_nbytes=fp32_nbytes(shape),
            rank=k,
            matrices=(b, m, n),
            dense_fallback=dense,
        )

    def factors(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Balanced factors P (b, m, k), Q (b, n, k) of the (b, m, n) batch `x`."""
        if self.method == "svd":
            return lowrank.svd_factors(x, k)
        if self.method == "rsvd":
            generator = _device_generator(self._generators, x.device, self.seed)
            return lowrank.rsvd_factors(x, k, self.iters, self.oversample, generator)
        b, m, n = x.shape
        width = min(k + self.oversample, m, n)
        warm = self._warm
        if warm is None or tuple(warm.shape[:-1]) != (b, n) or warm.device != x.device:
            # a cold start is drawn on the host, so that every device starts alike
            warm = torch.randn((b, n, width), generator=self._generator).to(x.device)
        else:  # another number of rows changes k, not the subspace: keep the basis
            warm = lowrank.fit_warm(warm, width)
        start = lowrank.refill_warm(warm, self._generator)
        p, q, warm = lowrank.power_factors(x, k, self.iters, start)
        self._warm = warm if all_finite(warm) else None  # stays on x's device
        return p, q

    @property
    def warm_start(self) -> torch.Tensor | None:
        """The basis the next power-iteration encode starts from (b, n, width), its columns
        ascending in strength, None when cold; a matrix of another width takes its
        strongest columns, or all of them and random ones (`lowrank.fit_warm`)."""
        return self._warm

    def warm_from(self, other: LowRankCodec) -> None:
        """Start where `other` (a codec of the same stream's kind, e.g. the training stream
        of the same tensor, whose matrices may have other row counts) stands: its warm
        basis, when it has one; cold otherwise."""
        self._warm = None if other._warm is None else other._warm.clone()

    def encode(self, x: torch.Tensor) -> bytes:
        """The factor blob, or the nested dense blob past the break-even rank."""
        x = check_input(x)
        plan = self.plan(x.shape)
        if plan.dense_fallback:
            return self.inner.encode(x)
        assert plan.matrices is not None and plan.rank is not None
        b, m, n = plan.matrices
        k = plan.rank
        if not all_finite(x):
            raise _non_finite(self.spec)
        p, q = self.factors(x.reshape(b, m, n), k)
        if not (all_finite(p) and all_finite(q)):
            raise _non_finite(self.spec)
        p_shape, q_shape = self._factor_shapes(b, m, n, k)
        return b"".join(
            (
                pack_header(Kind.LOWRANK, x.shape),
                _LOWRANK_BODY.pack(LAYOUT_CODE[self.layout], k),
                self.inner.encode(p.mT.reshape(p_shape)),
                self.inner.encode(q.mT.reshape(q_shape)),
            )
        )


def _gram(mat: torch.Tensor, *, exact: bool) -> torch.Tensor:
    """X^T X of a finite float32 (m, n) matrix, in float64.

    Not `exact`: the product is formed in float32, twice as fast as in float64 and
    without X's float64 copy. Its rounding (about u = 6e-8 of |X|^2 per entry) moves the
    basis's eigenvectors by u |X|^2 over the eigenvalue gap, which costs a share of the
    energy of order k m u: nothing beside a basis that leaves out 1e-3 of it
    (STREAM_FLOAT32_FROM), but a visible error on a stream that its basis holds exactly
    (an ill-conditioned rank-7 matrix came back with 1.7e-3). X is first scaled by a
    power of two (exact) to max|X| <= 2^40, so that no square overflows (a sum of m
    squares stays below m 2^80) and the large ones do not vanish; the product is scaled
    back in float64."""
    if exact:
        xd = mat.double()
        return xd.mT @ xd
    scale = lowrank.scale_of(mat)
    if scale == 1.0:
        return (mat.mT @ mat).double()
    scaled = mat / scale
    return (scaled.mT @ scaled).double().mul_(scale * scale)


class StreamBasisCodec(Codec):
    """`lowrank(r,method=stream)`: every matrix of a stream projected on one basis Q of
    width k = ceil(r n) that the stream shares, so a matrix costs m k values, not k (m + n).

    Per-matrix factors of rank ceil(r m) keep only what a matrix's own m rows concentrate
    (ABNet's chunks of about 90 tokens: rank 18). The rows of a stream of activations
    share a subspace from one chunk to the next: the encoder gathers C = sum of decayed
    X^T X and projects each X on Q, the top k eigenvectors of C (k = 52 of 256 at r = 0.2,
    at about the bytes of rank 18; bench/table5.py's stream-basis row). Q is recomputed
    and sent with the first matrix, every `refresh`-th one after, and any matrix that
    has drifted out of it (more than twice the energy outside Q than the covariance
    predicted, see `_drifted`), as the nested codec writes it; a blob in between carries
    P = X Q and the version of the basis it was projected on. Encoder and receiver both
    use Q as it decodes, so they agree to the bit. The receiving codec keeps the last
    basis it read: a blob naming a basis it never got is a WireError, never a guess.
    Blobs that carry their basis decode with `decode` alone; the others need the
    stream's codec (`self.decode`), and arrive in the order they were encoded (a stream
    is one ordered channel of a link).
    """

    def __init__(
        self,
        ratio: float,
        inner: DenseCodec | None = None,
        refresh: int = STREAM_REFRESH,
        fallback: bool = True,
    ) -> None:
        if not 0.0 < ratio <= 1.0 or not math.isfinite(ratio):
            raise ValueError(f"the keep ratio must be in (0, 1], got {ratio}")
        if refresh < 1:
            raise ValueError("refresh must be >= 1")
        self.ratio = float(ratio)
        self.inner: DenseCodec = inner if inner is not None else CastCodec(Kind.NONE)
        self.refresh = refresh
        self.fallback = fallback
        self._covariance: torch.Tensor | None = None  # float64 (n, n), on x's device
        self._known: tuple[int, torch.Tensor] | None = None  # (version, Q as decoded)
        self._version = 0
        self._since = 0  # matrices projected on the current basis by this encoder
        self._expected_residual = 0.0  # the share of energy the current basis leaves out

    @property
    def spec(self) -> str:
        """`lowrank(r,method=stream,...)` nested in its factor codec."""
        opts = [repr(self.ratio), "method=stream"]
        if self.refresh != STREAM_REFRESH:
            opts.append(f"refresh={self.refresh}")
        if not self.fallback:
            opts.append("fallback=false")
        return _nested_spec(f"lowrank({','.join(opts)})", self.inner)

    def accepts(self) -> Accepted:
        """Low-rank blobs with factors of the nested codec, or its dense fallback."""
        return Accepted(frozenset({Kind.LOWRANK, self.inner.kind}), frozenset({self.inner.kind}))

    def reset(self) -> None:
        """Forget the covariance and the basis: the next blob carries a new one."""
        self._covariance = None
        self._known = None
        self._since = 0

    @property
    def warm_start(self) -> torch.Tensor | None:
        """The basis the next matrices are projected on (n, k), None before the first."""
        return None if self._known is None else self._known[1]

    def warm_from(self, other: StreamBasisCodec) -> None:
        """Start from `other`'s covariance (the training stream's, for the eval stream):
        the next blob carries a basis made from it and the next matrix."""
        self._covariance = None if other._covariance is None else other._covariance.clone()
        self._known = None
        self._since = 0

    def _new_basis(self, k: int, device: torch.device) -> bytes:
        """Q from the covariance, as the nested codec sends it; the stream now uses it."""
        assert self._covariance is not None
        values, q = lowrank.top_eigenvectors(self._covariance, k)
        total = float(self._covariance.diagonal().sum())
        kept = float(values.clamp_min(0.0).sum())
        self._expected_residual = max(0.0, 1.0 - kept / total) if total > 0 else 0.0
        blob = self.inner.encode(q.to(torch.float32).contiguous())
        self._version = (self._version + 1) & 0xFFFFFFFF
        self._known = (self._version, decode(blob, device=device))
        self._since = 0
        return blob

    def _drifted(self, p: torch.Tensor, energy: float) -> bool:
        """Whether X has left the basis's subspace: the share of its energy (|X|^2) outside
        (1 - |X Q|^2 / |X|^2, Q orthonormal) is past STREAM_DRIFT times what the
        covariance's discarded eigenvalues predicted when Q was made, plus 1e-4."""
        if energy == 0.0:
            return False
        residual = 1.0 - float(p.double().square().sum()) / energy
        return residual > STREAM_DRIFT * self._expected_residual + 1e-4

    def _due(self, n: int, k: int) -> bool:
        known = self._known
        return known is None or self._since >= self.refresh or tuple(known[1].shape) != (n, k)

    def plan(self, shape: Sequence[int]) -> WirePlan:
        """Rank, fallback and exact bytes of the *next* blob for a tensor of `shape`: the
        basis travels with the first matrix and every `refresh`-th after."""
        shape = tuple(shape)
        m, n = _flat_matrix(shape)
        k = lowrank.rank_for(self.ratio, n, n)
        if k >= n and self.fallback:
            return WirePlan(self.inner.dense_nbytes(shape), fp32_nbytes(shape), k, (1, m, n), True)
        nbytes = (
            header_nbytes(len(shape))
            + _LOWRANK_BODY.size
            + _STREAM_BODY.size
            + self.inner.dense_nbytes((m, k))
            + (self.inner.dense_nbytes((n, k)) if self._due(n, k) else 0)
        )
        return WirePlan(nbytes, fp32_nbytes(shape), k, (1, m, n))

    def encode(self, x: torch.Tensor) -> bytes:
        """P = X Q, after Q itself when a new basis is due; the dense blob when k >= n."""
        x = check_input(x)
        plan = self.plan(x.shape)
        if plan.dense_fallback:
            return self.inner.encode(x)
        if not all_finite(x):
            raise _non_finite(self.spec)
        assert plan.matrices is not None and plan.rank is not None
        _, m, n = plan.matrices
        k = plan.rank
        mat = x.reshape(m, n)
        gram = _gram(
            mat, exact=self._known is None or self._expected_residual < STREAM_FLOAT32_FROM
        )
        cov = self._covariance
        if cov is None or cov.shape != gram.shape or cov.device != gram.device:
            self._covariance = gram
        else:
            self._covariance = cov.mul_(STREAM_DECAY).add_(gram)
        basis_blob = b""
        if self._due(n, k) or self._known is None or self._known[1].device != x.device:
            basis_blob = self._new_basis(k, x.device)
        assert self._known is not None
        p = mat @ self._known[1]
        if not basis_blob and self._drifted(p, float(gram.diagonal().sum())):
            basis_blob = self._new_basis(k, x.device)
            p = mat @ self._known[1]
        self._since += 1
        if not all_finite(p):
            raise _non_finite(self.spec)
        version = self._known[0]
        return b"".join(
            (
                pack_header(Kind.LOWRANK, x.shape),
                _LOWRANK_BODY.pack(STREAM_LAYOUT, k),
                _STREAM_BODY.pack(version, 1 if basis_blob else 0),
                self.inner.encode(p.contiguous()),
                basis_blob,
            )
        )

    def _decode(
        self, blob: Blob, shape: Sequence[int | None] | None, max_numel: int, device: Device
    ) -> torch.Tensor:
        """The tensor of a blob of this stream: P Q^T on the basis the blob carries (kept
        for the blobs after it) or names (the last one kept, else WireError)."""
        buf = _as_buffer(blob)
        target = HOST if device is None else torch.device(device)
        accepted = self.accepts()
        kind, claimed, offset = unpack_header(buf, 0)
        if kind != Kind.LOWRANK:  # the dense fallback
            return super()._decode(blob, shape, max_numel, device)
        check_claimed_shape(claimed, shape, max_numel)
        part, end = _stream_blob_at(buf, offset, claimed, accepted, target)
        if end != len(buf):
            raise WireError(f"{len(buf) - end} unexpected bytes after the blob")
        if part.basis is not None:
            self._known = (part.version, part.basis)
        elif self._known is None or self._known[0] != part.version:
            have = "none" if self._known is None else f"basis {self._known[0]}"
            raise WireError(
                f"the blob is projected on basis {part.version} of its stream, which this "
                f"codec never received (it holds {have}): a blob was lost or reordered"
            )
        q = self._known[1].to(target)
        return (part.p @ q.mT).reshape(claimed)


class ErrorFeedback(Codec):
    """Adds the residual left by step t to the input of step t+1 before encoding."""

    def __init__(self, inner: Codec) -> None:
        if isinstance(inner, ErrorFeedback):
            raise ValueError("error feedback cannot nest error feedback")
        self.inner = inner
        self._residual: torch.Tensor | None = None

    @property
    def spec(self) -> str:
        """`ef(<inner spec>)`."""
        return f"ef({self.inner.spec})"

    def plan(self, shape: Sequence[int]) -> WirePlan:
        """The inner codec's plan: feedback changes values, not bytes."""
        return self.inner.plan(shape)

    def accepts(self) -> Accepted:
        """The inner codec's kinds: feedback changes values, not the wire form."""
        return self.inner.accepts()

    def reset(self) -> None:
        """Drop the residual and the inner state."""
        self._residual = None
        self.inner.reset()

    @property
    def residual(self) -> torch.Tensor | None:
        """What the last blob left out, to be added to the next input."""
        return self._residual

    def encode(self, x: torch.Tensor) -> bytes:
        """Encode x plus the carried residual; carry what this blob leaves out."""
        x = check_input(x)
        if self._residual is not None and self._residual.shape == x.shape:
            x = x + self._residual.to(x.device)
        blob = self.inner.encode(x)
        self._residual = (x - self.inner.decode(blob, device=x.device)).contiguous()
        return blob


def check_claimed_shape(
    claimed: tuple[int, ...], expected: Sequence[int | None] | None, max_numel: int
) -> None:
    """WireError unless `claimed` fits `expected` (None: any size) and `max_numel`."""
    if expected is not None and (
        len(claimed) != len(expected)
        or any(
            want is not None and got != want for got, want in zip(claimed, expected, strict=True)
        )
    ):
        raise WireError(f"blob claims shape {claimed}, the stream expects {tuple(expected)}")
    if numel(claimed) > max_numel:
        raise WireError(f"blob claims {numel(claimed)} elements, more than {max_numel}")


def _to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Wire values (a read-only view of the blob) as a tensor of their own on `device`,
    still in the wire dtype: the fewest bytes cross to the device."""
    return values.to(device, copy=True)


def _dense_from(
    buf: memoryview, offset: int, kind: Kind, shape: tuple[int, ...], device: torch.device
) -> tuple[torch.Tensor, int]:
    if kind in DENSE_DTYPE:
        values, end = read_tensor(buf, offset, DENSE_DTYPE[kind], shape)
        if kind == Kind.NONE or device == HOST:
            return values.to(device=device, dtype=torch.float32, copy=True), end
        return _to_device(values, device).to(torch.float32), end
    if kind == Kind.INT8:
        rows = row_count(shape)
        scale, offset = read_tensor(buf, offset, torch.float32, (rows,))
        q, end = read_tensor(buf, offset, torch.int8, shape)
        cols = shape[-1] if shape else 1
        scale, q = _to_device(scale, device), _to_device(q, device)
        x = q.reshape(rows, cols).to(torch.float32).mul_(scale.unsqueeze(1))
        return x.reshape(shape), end
    raise WireError(f"a low-rank factor must be a dense blob, got kind {kind.name.lower()}")


def _factor_at(
    buf: memoryview, offset: int, accepted: Accepted | None, device: torch.device
) -> tuple[torch.Tensor, int]:
    body, kind, shape = _header_of(buf, offset)
    if accepted is not None and kind not in accepted.factor_kinds:
        raise WireError(f"low-rank factors of kind {kind.name.lower()} are not this stream's")
    # a factor is read from bytes the blob holds, so its size is bounded by the blob's
    return _dense_from(buf, body, kind, shape, device)


def _decode_at(
    buf: memoryview,
    offset: int,
    shape_check: tuple[Sequence[int | None] | None, int],
    accepted: Accepted | None,
    device: torch.device,
) -> tuple[torch.Tensor, int]:
    kind, shape, offset = unpack_header(buf, offset)
    if accepted is not None and kind not in accepted.kinds:
        raise WireError(f"a {kind.name.lower()} blob is not what this stream's codec sends")
    check_claimed_shape(shape, *shape_check)
    if kind != Kind.LOWRANK:
        return _dense_from(buf, offset, kind, shape, device)
    if len(buf) - offset < _LOWRANK_BODY.size:
        raise WireError("truncated low-rank blob")
    layout, k = _LOWRANK_BODY.unpack_from(buf, offset)
    if layout == STREAM_LAYOUT:
        part, end = _stream_blob_at(buf, offset, shape, accepted, device)
        if part.basis is None:
            raise WireError(
                f"the blob is projected on basis {part.version} of its stream and does not "
                "carry it: only the stream's codec decodes it"
            )
        return (part.p @ part.basis.mT).reshape(shape), end
    if layout not in LAYOUT_CODE.values():
        raise WireError(f"unknown low-rank layout {layout}")
    b, m, n = (
        (shape[0], math.prod(shape[1:-1]), shape[-1])
        if layout == LAYOUT_CODE["sample"] and len(shape) >= 3
        else (1, math.prod(shape[:-1]) if shape else 1, shape[-1] if shape else 1)
    )
    if not 1 <= k <= min(m, n):
        raise WireError(f"rank {k} is impossible for {m} x {n} matrices")
    pt, offset = _factor_at(buf, offset + _LOWRANK_BODY.size, accepted, device)
    qt, end = _factor_at(buf, offset, accepted, device)
    if pt.numel() != b * k * m or qt.numel() != b * k * n:
        raise WireError(
            f"low-rank factors {tuple(pt.shape)} and {tuple(qt.shape)} do not fit "
            f"shape {shape} at rank {k}"
        )
    x = pt.reshape(b, k, m).mT @ qt.reshape(b, k, n)
    return x.reshape(shape), end


@dataclass(frozen=True)
class _StreamPart:
    """A stream-basis blob's body: P, the basis version, and Q when it travels with P."""

    version: int
    p: torch.Tensor  # (m, k)
    basis: torch.Tensor | None  # (n, k)


def _stream_blob_at(
    buf: memoryview,
    offset: int,
    shape: tuple[int, ...],
    accepted: Accepted | None,
    device: torch.device,
) -> tuple[_StreamPart, int]:
    """The body of a `lowrank(r,method=stream)` blob of `shape` from its low-rank body on."""
    if len(buf) - offset < _LOWRANK_BODY.size + _STREAM_BODY.size:
        raise WireError("truncated low-rank blob")
    layout, k = _LOWRANK_BODY.unpack_from(buf, offset)
    if layout != STREAM_LAYOUT:
        raise WireError(f"low-rank layout {layout} is not a stream-basis blob")
    m, n = _flat_matrix(shape)
    if not 1 <= k <= n:
        raise WireError(f"basis width {k} is impossible for {n} columns")
    version, has_basis = _STREAM_BODY.unpack_from(buf, offset + _LOWRANK_BODY.size)
    if has_basis not in (0, 1):
        raise WireError(f"stream-basis flag {has_basis} is neither 0 nor 1")
    p, offset = _factor_at(buf, offset + _LOWRANK_BODY.size + _STREAM_BODY.size, accepted, device)
    if p.numel() != m * k:
        raise WireError(f"projection {tuple(p.shape)} does not fit shape {shape} at width {k}")
    basis = None
    if has_basis:
        basis, offset = _factor_at(buf, offset, accepted, device)
        if basis.numel() != n * k:
            raise WireError(f"basis {tuple(basis.shape)} does not fit {n} columns at width {k}")
        basis = basis.reshape(n, k)
    return _StreamPart(version, p.reshape(m, k), basis), offset


def _flat_matrix(shape: tuple[int, ...]) -> tuple[int, int]:
    """(m, n): a tensor as one matrix of its last axis' columns."""
    return (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1)


def _as_buffer(blob: bytes | bytearray | memoryview) -> memoryview:
    return memoryview(blob).cast("B") if not isinstance(blob, bytes) else memoryview(blob)


def _header_of(buf: memoryview, offset: int) -> tuple[int, Kind, tuple[int, ...]]:
    kind, shape, body = unpack_header(buf, offset)
    return body, kind, shape


def decode(
    blob: bytes | bytearray | memoryview,
    *,
    shape: Sequence[int | None] | None = None,
    max_numel: int = MAX_DECODED_NUMEL,
    accepted: Accepted | None = None,
    device: Device = None,
) -> torch.Tensor:
    """The float32 tensor carried by a blob, on `device` (None: the host); WireError on
    malformed input, on a kind not in `accepted` (None: any), or on a claimed shape off
    `shape` or past `max_numel`."""
    buf = _as_buffer(blob)
    target = HOST if device is None else torch.device(device)
    x, end = _decode_at(buf, 0, (shape, max_numel), accepted, target)
    if end != len(buf):
        raise WireError(f"{len(buf) - end} unexpected bytes after the blob")
    return x

"""Round trips, error bounds, exact bytes and bad input for every codec."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from workers.compression import (
    CodecError,
    ErrorFeedback,
    LowRankCodec,
    NonFiniteError,
    WireError,
    decode,
    parse_spec,
)

SETTINGS = settings(max_examples=40, deadline=None)
shapes = st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple)


def tensors(max_value: float = 1e4) -> st.SearchStrategy[torch.Tensor]:
    """Float32 tensors of small random shapes, sometimes non-contiguous."""
    values = st.floats(-max_value, max_value, width=32, allow_nan=False, allow_subnormal=False)
    arrays_ = shapes.flatmap(lambda s: arrays("float32", s, elements=values))
    return st.tuples(arrays_, st.booleans()).map(_to_tensor)


def _to_tensor(args: tuple[object, bool]) -> torch.Tensor:
    array, transpose = args
    x = torch.tensor(array)
    return x.mT if transpose and x.dim() >= 2 else x


def decaying_matrix(m: int, n: int, alpha: float = 1.0, seed: int = 0) -> torch.Tensor:
    """An m x n float32 matrix with singular values (i + 1) ** -alpha."""
    g = torch.Generator().manual_seed(seed)
    r = min(m, n)
    u, _ = torch.linalg.qr(torch.randn(m, r, generator=g, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(n, r, generator=g, dtype=torch.float64))
    s = torch.arange(1, r + 1, dtype=torch.float64) ** -alpha
    return ((u * s) @ v.T).float()


def optimal_error(x: torch.Tensor, k: int) -> float:
    """Relative Frobenius error of the best rank-k approximation."""
    s = torch.linalg.svdvals(x.double())
    return float(s[k:].square().sum().sqrt() / s.square().sum().sqrt())


def header(ndim: int) -> int:
    return 8 + 8 * ndim


def dense_bytes(spec: str, shape: tuple[int, ...]) -> int:
    """Wire bytes by the formula, written independently of the codec code."""
    n = math.prod(shape)
    rows = math.prod(shape[:-1]) if shape else 1
    body = {"none": 4 * n, "fp16": 2 * n, "bf16": 2 * n, "int8": 4 * rows + n}[spec]
    return header(len(shape)) + body


@SETTINGS
@given(tensors())
def test_none_round_trip_is_exact(x: torch.Tensor) -> None:
    codec = parse_spec("none")
    blob = codec.encode(x)
    y = codec.decode(blob)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.equal(y, x)
    assert len(blob) == codec.wire_nbytes(x.shape) == dense_bytes("none", tuple(x.shape))


@SETTINGS
@given(tensors(max_value=6e4))
def test_fp16_within_half_an_ulp(x: torch.Tensor) -> None:
    y = decode(parse_spec("fp16").encode(x))
    bound = torch.maximum(x.abs() * 2.0**-11, torch.tensor(2.0**-25))
    assert bool(((x - y).abs() <= bound).all())


@SETTINGS
@given(tensors(max_value=2.0**100))
def test_bf16_within_half_an_ulp(x: torch.Tensor) -> None:
    y = decode(parse_spec("bf16").encode(x))
    assert bool(((x - y).abs() <= x.abs() * 2.0**-8).all())


def _row_absmax(x: torch.Tensor) -> torch.Tensor:
    rows = math.prod(x.shape[:-1]) if x.dim() else 1
    cols = x.shape[-1] if x.dim() else 1
    x2 = x.reshape(rows, cols)
    return x2.abs().amax(dim=1, keepdim=True) if x2.numel() else x2


@SETTINGS
@given(tensors(), st.booleans())
def test_int8_within_its_scale(x: torch.Tensor, stochastic: bool) -> None:
    codec = parse_spec("int8(stochastic=true)" if stochastic else "int8")
    blob = codec.encode(x)
    y = codec.decode(blob)
    assert len(blob) == codec.wire_nbytes(x.shape) == dense_bytes("int8", tuple(x.shape))
    if x.numel() == 0:
        return
    absmax = _row_absmax(x)
    # half a step deterministic, under one step stochastic; float slack for the scale
    step = absmax / 127.0
    bound = (step if stochastic else step / 2) * (1 + 1e-5) + 1e-30
    err = (x.reshape(absmax.shape[0], -1) - y.reshape(absmax.shape[0], -1)).abs()
    assert bool((err <= bound).all())


def test_int8_stochastic_rounding_is_unbiased() -> None:
    x = torch.linspace(-1, 1, 257).reshape(1, -1)
    codec = parse_spec("int8(stochastic=true,seed=3)")
    mean = torch.stack([decode(codec.encode(x)) for _ in range(400)]).mean(0)
    step = 1 / 127
    # 400 draws: the standard error of each mean is below step / 40
    assert float((mean - x).abs().max()) < step / 8


def test_int8_sends_tiny_rows_as_zeros() -> None:
    x = torch.tensor([[1e-35, -2e-36], [1.0, 0.5]])
    y = decode(parse_spec("int8").encode(x))
    assert torch.equal(y[0], torch.zeros(2))
    assert torch.allclose(y[1], x[1], atol=1 / 254)


@pytest.mark.parametrize("method", ["svd", "rsvd", "power"])
@pytest.mark.parametrize("shape", [(12, 7), (7, 12), (3, 4, 5), (1, 9), (9, 1), (6, 6)])
def test_lowrank_at_full_rank_reconstructs(method: str, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    codec = parse_spec(f"lowrank(1,method={method},fallback=false)")
    assert isinstance(codec, LowRankCodec) and not codec.plan(shape).dense_fallback
    y = codec.decode(codec.encode(x))
    assert torch.allclose(y, x, atol=1e-5, rtol=1e-4)


def test_full_rank_falls_back_to_the_exact_dense_form() -> None:
    x = torch.randn(10, 6)
    codec = parse_spec("lowrank(1.0)")
    blob = codec.encode(x)
    assert codec.plan(x.shape).dense_fallback
    assert blob == parse_spec("none").encode(x)
    assert torch.equal(decode(blob), x)


@settings(max_examples=15, deadline=None)
@given(
    m=st.integers(2, 60),
    n=st.integers(2, 60),
    ratio=st.sampled_from([0.1, 0.2, 0.3]),
    alpha=st.sampled_from([0.7, 1.0, 2.0]),
    seed=st.integers(0, 1000),
)
def test_lowrank_error_near_optimal(m: int, n: int, ratio: float, alpha: float, seed: int) -> None:
    x = decaying_matrix(m, n, alpha, seed)
    k = math.ceil(ratio * min(m, n))
    best = optimal_error(x, k)
    for method, steps in (("svd", 1), ("rsvd", 1), ("power", 20)):
        codec = parse_spec(f"lowrank({ratio},method={method},fallback=false)")
        for _ in range(steps):
            y = codec.decode(codec.encode(x))
        err = float((x - y).norm() / x.norm())
        assert err <= 1.05 * best + 1e-6, (method, err, best)


def test_power_warm_start_improves_and_resets() -> None:
    x = decaying_matrix(96, 64, 1.0, seed=5)
    codec = parse_spec("lowrank(0.2,method=power)")
    errors = [float((x - decode(codec.encode(x))).norm() / x.norm()) for _ in range(10)]
    best = optimal_error(x, math.ceil(0.2 * 64))
    assert errors[-1] < errors[0]
    assert errors[-1] <= 1.05 * best
    codec.reset()
    assert float((x - decode(codec.encode(x))).norm() / x.norm()) == pytest.approx(errors[0])


def test_power_restarts_when_the_shape_changes() -> None:
    codec = parse_spec("lowrank(0.2,method=power)")
    for shape in [(40, 30), (50, 30), (40, 30)]:
        x = torch.randn(shape)
        assert decode(codec.encode(x)).shape == x.shape


LOWRANK_SPECS = [
    "lowrank({r})",
    "fp16(lowrank({r},method=power))",
    "bf16(lowrank({r},method=rsvd))",
    "int8(lowrank({r},method=power))",
    "int8(lowrank({r},layout=sample),stochastic=true)",
    "fp16(lowrank({r},method=rsvd,layout=sample))",
    "ef(fp16(lowrank({r},method=power)))",
]
INNER = {"lowrank": "none", "fp16": "fp16", "bf16": "bf16", "int8": "int8", "ef": "fp16"}


def predicted_lowrank_bytes(spec: str, ratio: float, shape: tuple[int, ...]) -> int:
    """The issue's formula: k = ceil(r min(m, n)); factors only while k < mn / (m + n)."""
    inner = INNER[spec.split("(")[0]]
    per_sample = "layout=sample" in spec and len(shape) >= 3
    if per_sample:
        b, m, n = shape[0], math.prod(shape[1:-1]), shape[-1]
    else:
        b, m, n = 1, (math.prod(shape[:-1]) if shape else 1), (shape[-1] if shape else 1)
    k = math.ceil(round(ratio * 1000) * min(m, n) / 1000)
    if not (k > 0 and k < m * n / (m + n)):
        return dense_bytes(inner, shape)
    factor_shapes = [(b, k, m), (b, k, n)] if "layout=sample" in spec else [(k, m), (k, n)]
    return header(len(shape)) + 8 + sum(dense_bytes(inner, s) for s in factor_shapes)


@settings(max_examples=60, deadline=None)
@given(
    template=st.sampled_from(LOWRANK_SPECS),
    ratio=st.sampled_from([0.05, 0.1, 0.2, 0.3, 0.5, 0.9, 1.0]),
    shape=st.lists(st.integers(0, 24), min_size=0, max_size=4).map(tuple),
)
def test_bytes_on_the_wire_match_the_formula(
    template: str, ratio: float, shape: tuple[int, ...]
) -> None:
    spec = template.format(r=ratio)
    codec = parse_spec(spec)
    x = torch.randn(shape)
    blob = codec.encode(x)
    expected = predicted_lowrank_bytes(spec, ratio, shape)
    assert len(blob) == codec.wire_nbytes(shape) == expected
    y = decode(blob)
    assert y.shape == x.shape and y.dtype == torch.float32


@pytest.mark.parametrize("spec", ["none", "fp16", "bf16", "int8"])
@given(shape=shapes)
@SETTINGS
def test_dense_bytes_match_the_formula(spec: str, shape: tuple[int, ...]) -> None:
    codec = parse_spec(spec)
    assert len(codec.encode(torch.randn(shape))) == codec.wire_nbytes(shape)
    assert codec.wire_nbytes(shape) == dense_bytes(spec, shape)


def test_rank_is_computed_from_the_decimal_ratio() -> None:
    # 0.1 * 30 is 3.0000000000000004 in floating point; the rank must be 3
    assert parse_spec("lowrank(0.1)").plan((30, 400)).rank == 3
    assert parse_spec("lowrank(0.2)").plan((4096, 768)).rank == 154


def test_break_even_rank() -> None:
    # 100 x 100: mn / (m + n) = 50, so rank 49 pays and rank 50 does not
    assert not parse_spec("lowrank(0.49)").plan((100, 100)).dense_fallback
    assert parse_spec("lowrank(0.5)").plan((100, 100)).dense_fallback
    # the paper's FP16(SVD(0.9)): 0.9 * 768 = 692 > 4096 * 768 / 4864 = 646.7
    plan = parse_spec("fp16(lowrank(0.9))").plan((4096, 768))
    assert plan.dense_fallback and plan.nbytes == dense_bytes("fp16", (4096, 768))


def test_huge_ratio_matrices() -> None:
    # (2000, 2) at rank 1: 2002 factor values against 4000; (1, 5000): 5001 against 5000
    tall = decaying_matrix(2000, 2, 1.0, seed=2)
    codec = parse_spec("fp16(lowrank(0.5,method=rsvd))")
    assert not codec.plan(tall.shape).dense_fallback
    y = decode(codec.encode(tall))
    assert float((tall - y).norm() / tall.norm()) <= 1.05 * optimal_error(tall, 1) + 1e-3
    wide = torch.randn(1, 5000)
    codec = parse_spec("fp16(lowrank(0.5,method=power))")
    assert codec.plan(wide.shape).dense_fallback
    assert torch.equal(decode(codec.encode(wide)), wide.half().float())
    x = decaying_matrix(3000, 40, 1.0, seed=3)
    codec = parse_spec("lowrank(0.1,method=power)")
    for _ in range(10):
        y = decode(codec.encode(x))
    assert float((x - y).norm() / x.norm()) <= 1.05 * optimal_error(x, 4)


def test_per_sample_and_flat_layouts_both_round_trip() -> None:
    x = torch.stack([decaying_matrix(32, 24, 2.0, seed=s) for s in range(4)])
    for layout in ("flat", "sample"):
        codec = parse_spec(f"lowrank(0.3,layout={layout})")
        y = codec.decode(codec.encode(x))
        assert y.shape == x.shape
        assert float((x - y).norm() / x.norm()) < 0.2


@pytest.mark.parametrize(
    "spec",
    [
        "none",
        "fp16",
        "bf16",
        "int8",
        "lowrank(0.2)",
        "int8(lowrank(0.2,method=power))",
        "fp16(lowrank(0.2,method=rsvd))",
        "ef(int8)",
    ],
)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_input_is_refused(spec: str, bad: float) -> None:
    x = torch.randn(40, 30)
    x[3, 7] = bad
    with pytest.raises(NonFiniteError, match="NaN or Inf"):
        parse_spec(spec).encode(x)


def test_fp16_overflow_is_refused_not_sent_as_inf() -> None:
    x = torch.tensor([1.0, 7e4])
    with pytest.raises(NonFiniteError, match="range"):
        parse_spec("fp16").encode(x)
    assert torch.allclose(decode(parse_spec("bf16").encode(x)), x, rtol=2**-8)


@pytest.mark.parametrize(
    "x",
    [
        torch.zeros(3, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float16),
        torch.zeros(3, dtype=torch.bfloat16),
        torch.zeros(3, dtype=torch.int64),
        torch.zeros(3, dtype=torch.complex64),
        [1.0, 2.0],
    ],
)
def test_unsupported_inputs_get_clear_errors(x: object) -> None:
    with pytest.raises(CodecError, match=r"float32|torch\.Tensor"):
        parse_spec("fp16").encode(x)  # type: ignore[arg-type]


def test_malformed_blobs_are_refused() -> None:
    blob = parse_spec("int8(lowrank(0.2,method=power))").encode(torch.randn(50, 40))
    with pytest.raises(WireError, match="truncated"):
        decode(blob[:-1])
    with pytest.raises(WireError, match="unexpected bytes"):
        decode(blob + b"\0")
    with pytest.raises(WireError, match="magic"):
        decode(b"XX" + blob[2:])
    with pytest.raises(WireError, match="version"):
        decode(blob[:2] + b"\x09" + blob[3:])
    with pytest.raises(WireError, match="kind"):
        decode(blob[:3] + b"\x63" + blob[4:])
    with pytest.raises(WireError):
        decode(b"")


def test_requires_grad_and_non_contiguous_inputs() -> None:
    x = torch.randn(20, 30, requires_grad=True)
    y = decode(parse_spec("fp16").encode(x))
    assert not y.requires_grad
    strided = torch.randn(40, 60)[::2, ::3]
    assert torch.equal(decode(parse_spec("none").encode(strided)), strided)


def test_a_fresh_codec_of_the_spec_decodes_its_blobs_and_no_other() -> None:
    x = torch.randn(64, 48)
    spec = "fp16(lowrank(0.2,method=power))"
    blob = parse_spec(spec).encode(x)
    assert torch.equal(parse_spec(spec).decode(blob), decode(blob))  # no encoder state needed
    with pytest.raises(WireError, match="not what this stream's codec sends"):
        parse_spec("int8").decode(blob)
    with pytest.raises(WireError, match="factors of kind fp16 are not this stream's"):
        parse_spec("int8(lowrank(0.2))").decode(blob)


def test_error_feedback_carries_the_residual() -> None:
    codec = parse_spec("ef(int8(lowrank(0.1,method=power)))")
    assert isinstance(codec, ErrorFeedback)
    g = torch.Generator().manual_seed(0)
    sent = torch.zeros(60, 50)
    total = torch.zeros(60, 50)
    for _ in range(6):
        x = torch.randn(60, 50, generator=g)
        total += x
        sent += decode(codec.encode(x))
    assert codec.residual is not None
    # what was sent plus what is still owed is exactly what came in
    assert torch.allclose(sent + codec.residual, total, atol=1e-4)

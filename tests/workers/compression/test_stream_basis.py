"""`lowrank(r,method=stream)`: one basis per stream, kept in step by both ends."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.compression import (
    ErrorFeedback,
    SpecError,
    StreamBasisCodec,
    WireError,
    decode,
    parse_spec,
    relative_error,
)
from workers.compression.codecs import STREAM_FLOAT32_FROM

SPEC = "fp16(lowrank(0.2,method=stream))"


def subspace_stream(
    count: int, n: int = 256, rank: int = 40, seed: int = 0, rows: tuple[int, ...] = (88, 93, 79)
) -> list[torch.Tensor]:
    """Matrices of varying row counts whose rows all lie in one `rank`-dim subspace."""
    gen = torch.Generator().manual_seed(seed)
    basis = torch.randn(n, rank, generator=gen)
    return [torch.randn(rows[i % len(rows)], rank, generator=gen) @ basis.T for i in range(count)]


def pair(spec: str = SPEC) -> tuple[StreamBasisCodec, StreamBasisCodec]:
    sender, receiver = parse_spec(spec), parse_spec(spec)
    assert isinstance(sender, StreamBasisCodec) and isinstance(receiver, StreamBasisCodec)
    return sender, receiver


def test_a_stream_in_a_subspace_narrower_than_the_basis_crosses_exactly() -> None:
    sender, receiver = pair("lowrank(0.2,method=stream)")
    for x in subspace_stream(20):
        y = receiver.decode(sender.encode(x), shape=x.shape)
        assert relative_error(x, y) < 1e-5


def noisy_stream(count: int, noise: float = 0.3) -> list[torch.Tensor]:
    """A subspace stream with noise all around it: its basis leaves out a share of the
    energy past STREAM_FLOAT32_FROM, so its covariance is gathered in float32."""
    gen = torch.Generator().manual_seed(1)
    return [x + noise * torch.randn(x.shape, generator=gen) for x in subspace_stream(count)]


def stream_errors(stream: list[torch.Tensor], scale: float = 1.0) -> list[float]:
    sender, receiver = pair("lowrank(0.2,method=stream)")
    errors = []
    for x in stream:
        x = x * scale
        y = receiver.decode(sender.encode(x), shape=x.shape)
        assert torch.isfinite(y).all()
        errors.append(relative_error(x, y))
    assert sender._expected_residual >= STREAM_FLOAT32_FROM  # the float32 covariance
    return errors


@pytest.mark.parametrize("scale", [1e30, 1e18, 1e-30])
def test_a_stream_of_any_magnitude_crosses_as_at_unit_scale(scale: float) -> None:
    """Past the first matrix this stream's covariance is formed in float32 (`_gram`):
    sums of squares of 1e30 or 1e18 would overflow it and squares of 1e-30 vanish,
    unless X is scaled first (each case fails without it); a wrong covariance gives a
    basis that misses the stream's subspace, and an error near 1."""
    stream = noisy_stream(6)
    expected = stream_errors(stream)
    assert min(expected) > 0.01 and max(expected) < 0.3
    for got, want in zip(stream_errors(stream, scale), expected, strict=True):
        assert got == pytest.approx(want, rel=1e-3)


def test_a_stream_its_basis_holds_whole_is_gathered_in_float64() -> None:
    """An ill-conditioned matrix of rank k whose basis is built in float32 misses its
    weakest direction by about u |X|^2 / sigma_k^2: a later row along it came back with
    7e-3 of error (3e-5 in float64, what the float32 matrix itself holds of that
    direction). Such a stream (its basis leaves out nothing) is gathered in float64."""
    gen = torch.Generator().manual_seed(3)
    u, _ = torch.linalg.qr(torch.randn(7, 7, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(28, 7, generator=gen))
    first = (u * torch.tensor([26.0, 16, 13, 10, 5.7, 3.9, 0.025])) @ v.T
    later = v[:, -1:].T * 14.0 + 1e-3 * first[:1]  # mostly along the weakest direction
    sender, receiver = pair("lowrank(0.25,method=stream,refresh=3)")
    for x in (first, later):
        y = receiver.decode(sender.encode(x), shape=x.shape)
        assert relative_error(x, y) < 1e-4


def test_fp16_factors_stay_within_fp16_rounding_and_both_ends_agree() -> None:
    sender, receiver = pair()
    for x in subspace_stream(12):
        blob = sender.encode(x)
        assert relative_error(x, receiver.decode(blob, shape=x.shape)) < 2e-3
        # the sender's own view of the blob is the receiver's, to the bit
        assert torch.equal(sender.decode(blob), receiver.decode(blob))
    assert sender.warm_start is not None and receiver.warm_start is not None
    assert torch.equal(sender.warm_start, receiver.warm_start)


def test_the_basis_travels_with_the_first_matrix_and_every_refresh_after() -> None:
    sender, _ = pair("fp16(lowrank(0.2,method=stream,refresh=3))")
    sizes = []
    for x in subspace_stream(7, rows=(50,)):
        planned = sender.wire_nbytes(x.shape)
        blob = sender.encode(x)
        assert len(blob) == planned
        sizes.append(len(blob))
    k = 52  # ceil(0.2 * 256)
    with_basis, without = sizes[0], sizes[0] - parse_spec("fp16").wire_nbytes((256, k))
    assert sizes == [with_basis, without, without] * 2 + [with_basis]
    # a matrix costs its m k values, not the k (m + n) of per-matrix factors
    assert without < 0.21 * 50 * 256 * 2


def test_a_blob_without_its_basis_needs_the_streams_codec() -> None:
    sender, receiver = pair()
    xs = subspace_stream(3)
    first, second = sender.encode(xs[0]), sender.encode(xs[1])
    assert relative_error(xs[0], decode(first)) < 2e-3  # carries its basis
    with pytest.raises(WireError, match="only the stream's codec"):
        decode(second)
    with pytest.raises(WireError, match="never received"):
        receiver.decode(second)  # the first blob, with the basis, was lost
    receiver.decode(first)
    assert relative_error(xs[1], receiver.decode(second)) < 2e-3


def test_a_stale_basis_is_refused_not_guessed() -> None:
    sender, receiver = pair("lowrank(0.2,method=stream,refresh=2)")
    blobs = [sender.encode(x) for x in subspace_stream(4)]  # bases 1, -, 2, -
    receiver.decode(blobs[0])
    receiver.decode(blobs[1])
    with pytest.raises(WireError, match=r"basis 2 .* holds basis 1"):
        receiver.decode(blobs[3])  # blobs[2], which carried basis 2, was lost


def test_a_stream_that_leaves_its_subspace_gets_a_new_basis_at_once() -> None:
    sender, receiver = pair("lowrank(0.2,method=stream,refresh=4)")
    for x in subspace_stream(6, seed=1):
        receiver.decode(sender.encode(x))
    after = subspace_stream(30, seed=2)
    assert not sender._due(256, 52)  # not due by the count
    first = sender.encode(after[0])
    assert receiver.warm_start is not None
    old_basis = receiver.warm_start.clone()
    errors = [relative_error(after[0], receiver.decode(first))]
    assert not torch.equal(receiver.warm_start, old_basis)  # drifted: Q sent with it
    errors += [relative_error(x, receiver.decode(sender.encode(x))) for x in after[1:]]
    # the decayed covariance forgets the old subspace: by 30 matrices the new one is kept
    assert errors[-1] < 0.05 < 0.5 < errors[0]


def test_zero_and_rank_one_streams_decode_finite() -> None:
    sender, receiver = pair()
    zero = torch.zeros(40, 256)
    assert torch.equal(receiver.decode(sender.encode(zero)), zero)
    one = torch.outer(torch.arange(1.0, 41.0), torch.linspace(-1, 1, 256))
    y = receiver.decode(sender.encode(one))
    assert torch.isfinite(y).all() and relative_error(one, y) < 2e-3


def test_warm_from_carries_the_covariance_and_reset_forgets_it() -> None:
    train, receiver = pair()
    xs = subspace_stream(5)
    for x in xs[:4]:
        receiver.decode(train.encode(x))
    one_row = xs[4][:1]
    warm, warm_receiver = pair()
    warm.warm_from(train)
    cold, cold_receiver = pair()
    # both first blobs carry a basis; the warm one is made from the training covariance,
    # so the next full chunk needs none, where the cold one's (of one row) has drifted
    for codec, rx in ((warm, warm_receiver), (cold, cold_receiver)):
        rx.decode(codec.encode(one_row))
    warm_blob, cold_blob = warm.encode(xs[4]), cold.encode(xs[4])
    assert len(warm_blob) < len(cold_blob)
    assert relative_error(xs[4], warm_receiver.decode(warm_blob)) < 2e-3
    train.reset()
    assert train.warm_start is None
    assert relative_error(xs[1], decode(train.encode(xs[1]))) < 2e-3


def test_full_ratio_falls_back_to_the_dense_form() -> None:
    codec = parse_spec("fp16(lowrank(1.0,method=stream))")
    x = torch.randn(10, 16)
    assert codec.plan(x.shape).dense_fallback
    assert relative_error(x, codec.decode(codec.encode(x))) < 1e-3


def test_error_feedback_decodes_through_the_streams_codec() -> None:
    codec = parse_spec("ef(lowrank(0.2,method=stream))")
    assert isinstance(codec, ErrorFeedback)
    xs = subspace_stream(3)
    for x in xs:
        codec.encode(x)
        assert codec.residual is not None and float(codec.residual.abs().max()) < 1e-3


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("lowrank(0.2,method=stream,iters=2)", "takes no iters"),
        ("lowrank(0.2,method=stream,oversample=4)", "takes no oversample"),
        ("lowrank(0.2,method=stream,seed=1)", "takes no seed"),
        ("lowrank(0.2,method=stream,layout=sample)", "needs layout=flat"),
        ("lowrank(0.2,method=stream,refresh=0)", "refresh must be an integer >= 1"),
        ("lowrank(0.2,method=power,refresh=4)", "unknown option"),
    ],
)
def test_bad_specs_are_refused(spec: str, why: str) -> None:
    with pytest.raises(SpecError, match=why):
        parse_spec(spec)


def test_the_spec_round_trips() -> None:
    for spec in (SPEC, "int8(lowrank(0.3,method=stream,refresh=4,fallback=false))"):
        assert parse_spec(spec).spec == spec


@settings(max_examples=30, deadline=None)
@given(
    rank=st.integers(1, 12),
    n=st.integers(16, 64),
    rows=st.lists(st.integers(1, 40), min_size=2, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_any_stream_within_the_width_crosses_exactly(
    rank: int, n: int, rows: list[int], seed: int
) -> None:
    """Rows in a subspace of dimension <= k, which the first matrix spans: every matrix,
    the first included, comes back."""
    k = -(-n // 4)  # lowrank(0.25): ceil(n / 4)
    rank = min(rank, k)
    rows[0] = max(rows[0], rank)
    sender, receiver = pair("lowrank(0.25,method=stream,refresh=3)")
    for x in subspace_stream(len(rows), n=n, rank=rank, seed=seed, rows=tuple(rows)):
        y = receiver.decode(sender.encode(x), shape=x.shape)
        assert torch.isfinite(y).all()
        assert relative_error(x, y) < 1e-3


def test_malformed_stream_blobs_are_refused() -> None:
    sender, receiver = pair()
    blob = bytearray(sender.encode(subspace_stream(1)[0]))
    with pytest.raises(WireError, match="unexpected bytes"):
        receiver.decode(bytes(blob) + b"\0")
    with pytest.raises(WireError):
        receiver.decode(bytes(blob[:40]))
    flag_at = blob.index(b"\x01\x00\x00\x00\x01")  # version 1, basis follows
    bad = bytearray(blob)
    bad[flag_at + 4] = 7
    with pytest.raises(WireError, match="neither 0 nor 1"):
        receiver.decode(bytes(bad))
    with pytest.raises(WireError, match="expects"):
        receiver.decode(bytes(blob), shape=(89, 256))

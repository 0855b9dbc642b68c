"""The adaptive codec policy and the per-stream error-feedback rule."""

from __future__ import annotations

import pytest
import torch

from workers.compression import (
    AdaptivePolicy,
    CodecError,
    CodecProfile,
    SpecError,
    check_stream_spec,
    choose_codec,
    parse_spec,
    profile_codec,
    relative_error,
    transfer_seconds,
)


def profile(spec: str, seconds: float, nbytes: int, error: float) -> CodecProfile:
    return CodecProfile(spec, (4096, 768), seconds / 2, seconds / 2, nbytes, error)


PROFILES = [
    profile("none", 0.001, 12_582_912, 0.0),
    profile("fp16", 0.005, 6_291_456, 2e-4),
    profile("int8", 0.015, 3_162_112, 4e-3),
    profile("fp16(lowrank(0.2,method=power))", 0.03, 1_419_264, 0.05),
]


def test_slow_links_pick_the_fewest_bytes_within_the_bound() -> None:
    assert choose_codec(PROFILES, 60e6, max_rel_error=0.1).spec.startswith("fp16(lowrank")
    assert choose_codec(PROFILES, 60e6, max_rel_error=0.01).spec == "int8"
    assert choose_codec(PROFILES, 60e6, max_rel_error=1e-3).spec == "fp16"


def test_fast_links_pick_the_cheapest_codec() -> None:
    choice = choose_codec(PROFILES, 1e12, max_rel_error=0.1)
    assert choice.spec == "none"
    assert next(spec for spec, _, _ in choice.ranking) == "none"


def test_no_admissible_codec_is_an_error() -> None:
    with pytest.raises(CodecError, match="no candidate"):
        choose_codec(PROFILES[1:], 60e6, max_rel_error=1e-6)
    with pytest.raises(ValueError):
        transfer_seconds(10, 0)


def test_transfer_seconds() -> None:
    # the figure: 4096 x 768 float32 over 60 Mbit/s is about 1.7 s
    assert transfer_seconds(4096 * 768 * 4, 60e6) == pytest.approx(1.68, abs=0.01)


def test_profile_measures_bytes_and_error() -> None:
    x = torch.randn(64, 48)
    p = profile_codec("int8", x)
    assert p.wire_nbytes == parse_spec("int8").wire_nbytes(x.shape)
    assert 0 < p.rel_error < 0.02
    assert p.encode_s >= 0 and p.decode_s >= 0
    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0


def test_adaptive_policy_keeps_one_codec_per_stream() -> None:
    policy = AdaptivePolicy(candidates=["none", "fp16", "int8"], max_rel_error=1e-3)
    x = torch.randn(64, 48)
    codec, choice = policy.codec("act", x, bandwidth_bps=1e6)
    assert codec.spec == choice.spec == "fp16"
    assert 0 < choice.rel_error <= 1e-3
    assert choice.wire_nbytes == codec.wire_nbytes(x.shape)
    assert policy.codec("act", x, bandwidth_bps=1e6)[0] is codec
    assert policy.choose("act", x, bandwidth_bps=1e15).spec in {"none", "fp16", "int8"}
    policy.forget("act")
    with pytest.raises(SpecError):
        AdaptivePolicy(candidates=["int9"])


def test_an_unmeasured_link_is_taken_as_the_bottleneck() -> None:
    # no bandwidth yet: the fewest bytes within the bound, whatever the codec costs
    assert choose_codec(PROFILES, None, max_rel_error=0.01).spec == "int8"
    assert choose_codec(PROFILES, None, max_rel_error=0.1).spec.startswith("fp16(lowrank")
    assert choose_codec(PROFILES, None, max_rel_error=0.01).total_s == pytest.approx(0.015)


def test_error_feedback_is_refused_on_per_sample_streams_only() -> None:
    with pytest.raises(SpecError, match="per-sample"):
        check_stream_spec("ef(int8)", "forward_codec", "per-sample")
    assert check_stream_spec("ef(int8)", "weight deltas", "parameter").spec == "ef(int8)"
    assert check_stream_spec("int8", "forward_codec", "per-sample").spec == "int8"
    with pytest.raises(SpecError, match="unknown codec"):
        check_stream_spec("int9", "forward_codec", "parameter")


def _rank(m: int, n: int, r: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, r, generator=g) @ torch.randn(r, n, generator=g)


def test_auto_switches_when_the_stream_turns_full_rank_and_keeps_its_bound() -> None:
    bound = 0.01
    lowrank = parse_spec("fp16(lowrank(0.2,method=power))").spec
    policy = AdaptivePolicy(
        candidates=["none", "fp16", "int8", lowrank], max_rel_error=bound, remeasure_every=6
    )
    # steps 0-9 of rank 8 (k = 20), then full rank, then rank 8 again
    stream = (
        [_rank(200, 100, 8, seed) for seed in range(10)]
        + [torch.randn(200, 100, generator=torch.Generator().manual_seed(s)) for s in range(10)]
        + [_rank(200, 100, 8, 100 + seed) for seed in range(10)]
    )
    specs, errors = [], []
    for x in stream:
        out = policy.encode("act", x, bandwidth_bps=None)
        y = parse_spec(out.spec).decode(out.blob)  # what a fresh receiver decodes
        specs.append(out.spec)
        errors.append(relative_error(x, y))
        assert out.measured_error == pytest.approx(errors[-1])
    assert max(errors) <= bound, errors
    assert specs[:10] == [lowrank] * 10  # the fewest bytes while it is of low rank
    assert specs[10] == "int8"  # the first full-rank tensor is caught, not sent at 80% error
    assert set(specs[10:20]) == {"int8"}
    assert specs[-1] == lowrank  # a periodic re-profile finds the low rank again
    state = policy.state("act")
    assert state.over_bound == 1
    assert state.profiles >= 4 and state.measured_error is not None
    assert state.choice is not None and state.choice.spec == lowrank


def test_auto_without_checks_on_every_tensor_still_reprofiles() -> None:
    policy = AdaptivePolicy(candidates=["fp16", "int8"], remeasure_every=3, check_every=2)
    x = torch.randn(40, 30)
    results = [policy.encode("s", x, None) for _ in range(7)]
    assert [r.measured_error is not None for r in results] == [i % 2 == 1 for i in range(7)]
    assert policy.state("s").profiles == 3  # tensors 0, 3 and 6
    with pytest.raises(ValueError):
        AdaptivePolicy(remeasure_every=0)

"""The spec grammar: canonical round trips and clear errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.compression import ErrorFeedback, LowRankCodec, SpecError, parse_spec

lowrank_specs = st.builds(
    lambda r, method, iters, layout, fallback: (
        f"lowrank({r},method={method},iters={iters},layout={layout},fallback={fallback})"
    ),
    st.sampled_from(["0.05", "0.2", "0.6", "1", "1e-1"]),
    st.sampled_from(["svd", "rsvd", "power"]),
    st.integers(1, 3),
    st.sampled_from(["flat", "sample"]),
    st.sampled_from(["true", "false"]),
)
dense_specs = st.sampled_from(["none", "fp16", "bf16", "int8", "int8(stochastic=true)"])


@st.composite
def specs(draw: st.DrawFn) -> str:
    dense = draw(dense_specs)
    spec = dense
    if draw(st.booleans()):
        inner = draw(lowrank_specs)
        spec = f"{dense[:-1]}, {inner})" if dense.endswith(")") else f"{dense}( {inner} )"
    return f"ef({spec})" if draw(st.booleans()) else spec


@settings(max_examples=60, deadline=None)
@given(specs())
def test_canonical_spec_round_trips(spec: str) -> None:
    canonical = parse_spec(spec).spec
    assert parse_spec(canonical).spec == canonical
    assert " " not in canonical


def test_nesting_builds_the_right_codecs() -> None:
    codec = parse_spec("ef(fp16(lowrank(0.6,method=power)))")
    assert isinstance(codec, ErrorFeedback)
    assert isinstance(codec.inner, LowRankCodec)
    assert codec.inner.inner.spec == "fp16"
    assert codec.inner.method == "power" and codec.inner.ratio == 0.6
    assert parse_spec("lowrank(0.2)").spec == "lowrank(0.2)"
    assert parse_spec("INT8").spec == "int8"
    assert parse_spec("fp32").spec == "none"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("zip", "unknown codec 'zip'"),
        ("fp16(", "column 6: expected an argument"),
        ("fp16)", "unexpected"),
        ("lowrank", "one keep ratio"),
        ("lowrank()", "one keep ratio"),
        ("lowrank(0)", r"\(0, 1\]"),
        ("lowrank(1.5)", r"\(0, 1\]"),
        ("lowrank(-0.2)", r"\(0, 1\]"),
        ("lowrank(0.2,0.3)", "one keep ratio"),
        ("lowrank(0.2,method=qr)", "method must be one of svd, rsvd, power"),
        ("lowrank(0.2,iters=0)", "iters must be an integer >= 1"),
        ("lowrank(0.2,iters=1.5)", "iters must be an integer"),
        ("lowrank(0.2,layout=cols)", "layout must be one of"),
        ("lowrank(0.2,fallback=maybe)", "true or false"),
        ("lowrank(0.2,foo=1)", "unknown option"),
        ("lowrank(0.2,method=svd,method=power)", "given twice"),
        ("lowrank(0.2,method=)", "needs a value"),
        ("int8(fp16)", "can only wrap one lowrank"),
        ("fp16(lowrank(0.2),lowrank(0.3))", "can only wrap one lowrank"),
        ("lowrank(lowrank(0.2))", "one keep ratio"),
        ("fp16(0.5)", "can only wrap one lowrank"),
        ("ef(ef(int8))", "outermost"),
        ("ef()", "exactly one codec"),
        ("fp16(lowrank(0.2)) int8", "unexpected 'int8'"),
        ("fp16;", "unexpected character"),
        ("x" * 600, "longer than"),
    ],
)
def test_bad_specs_get_clear_errors(spec: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_a_spec_must_be_a_string() -> None:
    with pytest.raises(SpecError, match="string"):
        parse_spec(None)  # type: ignore[arg-type]

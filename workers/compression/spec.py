"""Codecs from spec strings: the grammar is the contract's (contract.codec_spec), the codec
objects are built here.
"""

from __future__ import annotations

from contract import codec_spec as grammar
from workers.compression import codecs
from workers.compression.errors import SpecError
from workers.compression.wire import Kind

_CASTS = {"none": Kind.NONE, "fp16": Kind.FP16, "bf16": Kind.BF16}


def _dense(spec: grammar.DenseSpec) -> codecs.DenseCodec:
    if isinstance(spec, grammar.Int8Spec):
        return codecs.Int8Codec(stochastic=spec.stochastic, seed=spec.seed)
    return codecs.CastCodec(_CASTS[spec.dtype])


def build_codec(spec: grammar.CodecSpec) -> codecs.Codec:
    """A fresh codec for a parsed spec."""
    if isinstance(spec, grammar.ErrorFeedbackSpec):
        return codecs.ErrorFeedback(build_codec(spec.inner))
    if isinstance(spec, grammar.LowRankSpec) and spec.method == "stream":
        return codecs.StreamBasisCodec(
            spec.ratio, inner=_dense(spec.inner), refresh=spec.refresh, fallback=spec.fallback
        )
    if isinstance(spec, grammar.LowRankSpec):
        return codecs.LowRankCodec(
            spec.ratio,
            method=spec.method,  # type: ignore[arg-type]
            inner=_dense(spec.inner),
            iters=spec.iters,
            oversample=spec.oversample,  # None: the codec takes the method's default
            layout=spec.layout,
            fallback=spec.fallback,
            seed=spec.seed,
        )
    return _dense(spec)


PER_SAMPLE, PARAMETER = grammar.PER_SAMPLE, grammar.PARAMETER


def check_stream_spec(spec: str, stream: str, kind: grammar.StreamKind) -> codecs.Codec:
    """A fresh codec for `spec`, refused (SpecError) where its stream's kind forbids it:
    error feedback on a per-sample stream (contract.codec_spec.check_stream_spec says why)."""
    try:
        parsed = grammar.check_stream_spec(spec, stream, kind)
    except grammar.SpecError as exc:
        raise SpecError(str(exc)) from None
    return build_codec(parsed)


def parse_spec(spec: str) -> codecs.Codec:
    """A fresh codec for `spec`; SpecError saying where and why when it does not parse."""
    try:
        parsed = grammar.parse_codec_spec(spec)
    except grammar.SpecError as exc:
        raise SpecError(str(exc)) from None
    return build_codec(parsed)

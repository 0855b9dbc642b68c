"""Communication compression for the slow link: FP16, BF16, INT8, low rank, error feedback.

codec = parse_spec("fp16(lowrank(0.2,method=power))")
blob = codec.encode(x)            # self-describing bytes
y = codec.decode(blob, shape=x.shape)  # this spec's blobs only, of the expected shape
y = decode(blob)                  # any codec's blob (capped at MAX_DECODED_NUMEL elements)
check_stream_spec("ef(int8)", "forward_codec", PER_SAMPLE)  # SpecError: ef on per-sample data
codec.wire_nbytes(x.shape) == len(blob)
"""

from workers.compression.codecs import (
    MAX_DECODED_NUMEL,
    CastCodec,
    Codec,
    DenseCodec,
    ErrorFeedback,
    Int8Codec,
    LowRankCodec,
    StreamBasisCodec,
    WirePlan,
    decode,
)
from workers.compression.errors import CodecError, NonFiniteError, SpecError, WireError
from workers.compression.policy import (
    AdaptivePolicy,
    Choice,
    CodecProfile,
    Encoded,
    StreamState,
    choose_codec,
    profile_codec,
    relative_error,
    transfer_seconds,
)
from workers.compression.spec import PARAMETER, PER_SAMPLE, check_stream_spec, parse_spec

__all__ = [
    "MAX_DECODED_NUMEL",
    "PARAMETER",
    "PER_SAMPLE",
    "AdaptivePolicy",
    "CastCodec",
    "Choice",
    "Codec",
    "CodecError",
    "CodecProfile",
    "DenseCodec",
    "Encoded",
    "ErrorFeedback",
    "Int8Codec",
    "LowRankCodec",
    "NonFiniteError",
    "SpecError",
    "StreamBasisCodec",
    "StreamState",
    "WireError",
    "WirePlan",
    "check_stream_spec",
    "choose_codec",
    "decode",
    "parse_spec",
    "profile_codec",
    "relative_error",
    "transfer_seconds",
]

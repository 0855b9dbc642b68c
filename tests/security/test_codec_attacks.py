"""Codec blobs from a hostile peer: small blobs that claim huge tensors, foreign codecs."""

from __future__ import annotations

import struct

import pytest
import torch

from workers.compression import MAX_DECODED_NUMEL, WireError, decode, parse_spec
from workers.compression.wire import Kind, pack_header, tensor_bytes


def lowrank_blob(m: int, n: int, factor: Kind = Kind.FP16) -> bytes:
    """A rank-1 low-rank blob of an m x n matrix: (m + n) factor values, m * n decoded."""
    dtype = torch.float16 if factor is Kind.FP16 else torch.float32
    p_t = pack_header(factor, (1, m)) + bytes(tensor_bytes(torch.ones(1, m, dtype=dtype)))
    q_t = pack_header(factor, (1, n)) + bytes(tensor_bytes(torch.ones(1, n, dtype=dtype)))
    return pack_header(Kind.LOWRANK, (m, n)) + struct.pack("<B3xI", 0, 1) + p_t + q_t


def test_a_4_mib_blob_claiming_4_tib_is_refused_before_allocating() -> None:
    blob = lowrank_blob(1 << 20, 1 << 20)
    assert len(blob) < 4.1 * 2**20
    with pytest.raises(WireError, match=f"more than {MAX_DECODED_NUMEL}"):
        decode(blob)
    with pytest.raises(WireError, match="more than"):
        parse_spec("fp16(lowrank(0.1))").decode(blob)


def test_a_16_kib_blob_of_another_shape_than_the_stream_expects_is_refused() -> None:
    blob = lowrank_blob(4096, 4096)  # 16 KiB of factors, 64 MiB decoded
    assert len(blob) < 17 * 1024
    codec = parse_spec("fp16(lowrank(0.1))")
    with pytest.raises(WireError, match=r"claims shape \(4096, 4096\), the stream expects"):
        codec.decode(blob, shape=(64, 48))
    with pytest.raises(WireError, match="more than 1000000"):
        codec.decode(blob, max_numel=1_000_000)
    # what the stream does expect still decodes, with any size where it allows one
    x = torch.randn(8, 24, 16)
    good = codec.encode(x)
    assert codec.decode(good, shape=(8, None, 16)).shape == x.shape


def test_an_impossible_rank_is_refused() -> None:
    blob = bytearray(lowrank_blob(4, 3))
    struct.pack_into("<B3xI", blob, len(pack_header(Kind.LOWRANK, (4, 3))), 0, 9)
    with pytest.raises(WireError, match="rank 9 is impossible"):
        decode(bytes(blob))


def test_the_receiver_accepts_only_the_agreed_codec() -> None:
    x = torch.randn(32, 20)
    for sent, agreed in (("none", "int8"), ("int8", "fp16"), ("fp16(lowrank(0.2))", "int8")):
        with pytest.raises(WireError, match="not"):
            parse_spec(agreed).decode(parse_spec(sent).encode(x))
    # factors of another dense codec than the agreed one are refused too
    with pytest.raises(WireError, match="factors of kind none are not"):
        parse_spec("fp16(lowrank(0.2))").decode(lowrank_blob(32, 20, factor=Kind.NONE))
    # error feedback and the dense fallback of low rank are the same wire forms
    assert parse_spec("ef(int8)").decode(parse_spec("int8").encode(x)).shape == x.shape
    tiny = torch.randn(2, 2)  # low rank does not pay: the nested codec's dense blob
    assert parse_spec("fp16(lowrank(0.5))").decode(parse_spec("fp16").encode(tiny)).shape == (2, 2)

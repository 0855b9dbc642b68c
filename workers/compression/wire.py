"""The self-describing wire form shared by every codec.

Every blob starts with an 8-byte header and the original shape:

    b"NB" | version u8 | kind u8 | ndim u8 | 3 pad bytes | ndim x u64 shape

so that each body starts 8-byte aligned. Bodies, by kind:

    none     float32 values, row-major
    fp16     float16 values
    bf16     bfloat16 values
    int8     float32 scale per row (last axis), then int8 values
    lowrank  layout u8 | pad u8 x3 | rank u32 | blob(P^T) | blob(Q^T)

where X ~= P @ Q^T and the factor blobs are complete blobs of a dense kind.
"""

from __future__ import annotations

import math
import struct
import warnings
from collections.abc import Sequence
from enum import IntEnum

import torch

from workers.compression.errors import CodecError, WireError

MAGIC = b"NB"
VERSION = 1
_HEAD = struct.Struct("<2sBBB3x")
_DIM = struct.Struct("<Q")
MAX_NDIM = 32


class Kind(IntEnum):
    """What follows the header."""

    NONE = 0
    FP16 = 1
    BF16 = 2
    INT8 = 3
    LOWRANK = 4


DENSE_DTYPE: dict[Kind, torch.dtype] = {
    Kind.NONE: torch.float32,
    Kind.FP16: torch.float16,
    Kind.BF16: torch.bfloat16,
}


def header_nbytes(ndim: int) -> int:
    """Bytes of the header for a tensor of `ndim` dimensions."""
    return _HEAD.size + _DIM.size * ndim


def pack_header(kind: Kind, shape: Sequence[int]) -> bytes:
    """The header of a blob of `kind` for a tensor of `shape`."""
    if len(shape) > MAX_NDIM:
        raise CodecError(f"tensors of more than {MAX_NDIM} dimensions are not supported")
    return _HEAD.pack(MAGIC, VERSION, int(kind), len(shape)) + b"".join(
        _DIM.pack(int(d)) for d in shape
    )


def unpack_header(buf: memoryview, offset: int) -> tuple[Kind, tuple[int, ...], int]:
    """Kind, shape and body offset of the blob that starts at `offset`."""
    if len(buf) - offset < _HEAD.size:
        raise WireError(f"truncated blob: {len(buf) - offset} bytes, a header needs {_HEAD.size}")
    magic, version, kind, ndim = _HEAD.unpack_from(buf, offset)
    if magic != MAGIC:
        raise WireError(f"not a codec blob: magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise WireError(f"unsupported wire version {version}, this side reads {VERSION}")
    try:
        kind_ = Kind(kind)
    except ValueError:
        raise WireError(f"unknown codec kind {kind}") from None
    if ndim > MAX_NDIM:
        raise WireError(f"blob claims {ndim} dimensions, at most {MAX_NDIM} are allowed")
    end = offset + header_nbytes(ndim)
    if len(buf) < end:
        raise WireError("truncated blob: the shape is cut short")
    shape = tuple(
        _DIM.unpack_from(buf, offset + _HEAD.size + _DIM.size * i)[0] for i in range(ndim)
    )
    return kind_, shape, end


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a tensor of `shape`."""
    return math.prod(shape)


def row_count(shape: Sequence[int]) -> int:
    """Rows of the (rows, last axis) view that per-row scales use; a scalar is one row."""
    return math.prod(shape[:-1]) if shape else 1


def tensor_bytes(x: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor, without copying on the host; a tensor on another device
    comes to the host here, and only here: these are the wire bytes."""
    x = x.contiguous()
    if x.device.type != "cpu":
        x = x.cpu()
    if x.numel() == 0:
        return memoryview(b"")
    return x.reshape(-1).view(torch.uint8).numpy().data.cast("B")


def read_tensor(
    buf: memoryview, offset: int, dtype: torch.dtype, shape: Sequence[int]
) -> tuple[torch.Tensor, int]:
    """A tensor of `dtype` and `shape` read at `offset` (a view when aligned), and its end."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    count = numel(shape)
    nbytes = itemsize * count
    end = offset + nbytes
    if len(buf) < end:
        raise WireError(f"truncated blob: body needs {nbytes} bytes, {len(buf) - offset} left")
    if count == 0:
        return torch.empty(tuple(shape), dtype=dtype), end
    with warnings.catch_warnings():
        # the buffer is read-only; every caller copies or converts before handing it out
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=offset)
    if raw.data_ptr() % itemsize:
        raw = raw.clone()
    return raw.view(dtype).reshape(tuple(shape)), end

"""What crosses the link between two roles: messages, hello, codecs.

A role talks to its peer role only through a `Link` (workers/switch/link.py).
Payloads here are `bytes` built by `pack_message`: a small JSON header and raw
little-endian arrays, so a message means the same on any machine and carries
exactly the integer widths the sender chose. A scenario's own message types are
built on these (workers/training/electra/wire.py, workers/training/abnet/wire.py).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from workers.compression import Codec, parse_spec
from workers.switch.link import Link, Payload

_MAGIC = b"NBM1"


def smallest_uint(max_value: int) -> np.dtype[Any]:
    """The narrowest unsigned integer dtype that holds 0..max_value."""
    for dtype in (np.uint8, np.uint16, np.uint32):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    return np.dtype(np.uint64)


def pack_message(
    header: Mapping[str, Any], arrays: Mapping[str, np.ndarray] | None = None
) -> bytes:
    """Serialize a JSON header and named arrays (dtype and shape kept) into bytes."""
    specs = []
    blobs = []
    for name, arr in (arrays or {}).items():
        a = np.asarray(arr, order="C")  # not ascontiguousarray: it turns 0-d into 1-d
        specs.append({"name": name, "dtype": a.dtype.str, "shape": list(a.shape)})
        blobs.append(a.tobytes())
    head = json.dumps({"h": dict(header), "a": specs}, separators=(",", ":")).encode()
    return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *blobs])


def unpack_message(blob: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Inverse of `pack_message`; raises ValueError on a malformed message."""
    if blob[:4] != _MAGIC or len(blob) < 8:
        raise ValueError("not a training message")
    (n,) = struct.unpack("<I", blob[4:8])
    meta = json.loads(blob[8 : 8 + n])
    offset = 8 + n
    arrays: dict[str, np.ndarray] = {}
    for spec in meta["a"]:
        dtype = np.dtype(spec["dtype"])
        count = int(np.prod(spec["shape"], dtype=np.int64))
        size = count * dtype.itemsize
        if offset + size > len(blob):
            raise ValueError("truncated training message")
        arrays[spec["name"]] = np.frombuffer(blob, dtype, count, offset).reshape(
            tuple(spec["shape"])
        )
        offset += size
    if offset != len(blob):
        raise ValueError("trailing bytes in training message")
    return meta["h"], arrays


def pack_uint(t: torch.Tensor, max_value: int) -> np.ndarray:
    """A non-negative integer tensor as the narrowest unsigned array that holds max_value."""
    return t.detach().cpu().numpy().astype(smallest_uint(max_value))


def unpack_int(a: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """An integer array back as an int64 tensor."""
    return torch.from_numpy(a.astype(np.int64)).to(device)


def expect_bytes(payload: Payload) -> bytes:
    """The payload as bytes; training roles send only bytes."""
    if not isinstance(payload, bytes):
        raise ValueError(f"expected bytes from the peer role, got {type(payload).__name__}")
    return payload


def hello(link: Link, channel: str, mine: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Exchange a JSON hello with the peer role (both send first, then receive)."""
    link.send(channel, pack_message(mine))
    theirs, _ = unpack_message(expect_bytes(link.recv(channel, timeout=timeout)))
    return theirs


class CodecBook:
    """One codec per (stream, spec) for the life of a role.

    Stateful codecs need this: a power iteration's warm start and error feedback's
    residual carry from one step to the next only if the same instance encodes them.
    """

    def __init__(self) -> None:
        self._codecs: dict[tuple[str, str], Codec] = {}

    def get(self, stream: str, spec: str) -> Codec:
        """The codec of `spec` on `stream` ("forward", "backward", "eval", ...)."""
        codec = self._codecs.get((stream, spec))
        if codec is None:
            codec = self._codecs[(stream, spec)] = parse_spec(spec)
        return codec

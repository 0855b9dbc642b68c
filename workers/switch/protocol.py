"""The switch wire protocol, sans IO: frames in, bytes out, no sockets.

Split the way h11 is, each part in its own module and re-exported here:

- frames.py: the frame classes and their per-kind encode/decode table (`KINDS`), `encode`;
- decoder.py: `FrameDecoder`, a byte stream to frames, checking each header first;
- connection.py: `Connection`, which frames each end may send and take, and when;
- rules.py: the pure decisions over frames (`StreamTracker`, the peer-frame verdict,
  the channel check, admission).
"""

from __future__ import annotations

from workers.switch.connection import Connection, ConnState, Side
from workers.switch.decoder import ALL_KINDS, CLOSED, NEED_DATA, Event, FrameDecoder
from workers.switch.frames import (
    DEFAULT_MAX_BODY_BYTES,
    DTYPE_SIZES,
    HEADER,
    KINDS,
    MAGIC,
    MAX_HANDSHAKE_META_BYTES,
    MAX_META_BYTES,
    MAX_NAME_CHARS,
    MAX_TENSOR_DIMS,
    VERSION,
    Ack,
    Buffer,
    Data,
    Direction,
    Error,
    Frame,
    Hello,
    Kind,
    LinkReport,
    PeerHello,
    Ping,
    ProtocolError,
    Receipt,
    Routed,
    TensorSpec,
    Welcome,
    encode,
)
from workers.switch.rules import StreamTracker

__all__ = [
    "ALL_KINDS",
    "CLOSED",
    "DEFAULT_MAX_BODY_BYTES",
    "DTYPE_SIZES",
    "HEADER",
    "KINDS",
    "MAGIC",
    "MAX_HANDSHAKE_META_BYTES",
    "MAX_META_BYTES",
    "MAX_NAME_CHARS",
    "MAX_TENSOR_DIMS",
    "NEED_DATA",
    "VERSION",
    "Ack",
    "Buffer",
    "ConnState",
    "Connection",
    "Data",
    "Direction",
    "Error",
    "Event",
    "Frame",
    "FrameDecoder",
    "Hello",
    "Kind",
    "LinkReport",
    "PeerHello",
    "Ping",
    "ProtocolError",
    "Receipt",
    "Routed",
    "Side",
    "StreamTracker",
    "TensorSpec",
    "Welcome",
    "encode",
]

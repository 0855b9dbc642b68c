"""The switch wire protocol, sans IO: frames in, bytes out, no sockets.

Every frame is a 16-byte header, a JSON meta block and a binary body::

    magic "NB" | version u8 | kind u8 | meta_len u32 | body_len u64 | meta | body

Only DATA frames have a body. The header is checked before anything is
buffered, so a peer announcing a huge frame gets a `ProtocolError`, not an
allocation; so does a kind the connection's state does not allow: until the
handshake is done a server reads only a HELLO (or PEER_HELLO) with a small
meta and no body, so a stranger who has not authenticated never makes it
allocate a body. `Connection` is the state machine a shell (server.py,
client.py) drives: `receive_data()` / `next_event()` on the way in (or
`body_view()` / `advance_body()` to receive straight into a frame's body),
`send()` on the way out, which returns the buffers to write: a DATA body goes
out as the caller's memoryview, never copied.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

MAGIC: Final = b"NB"
VERSION: Final = 1
HEADER = struct.Struct("!2sBBIQ")
MAX_META_BYTES: Final = 64 * 1024
# a hello's meta is a job token (at most 8192 characters) and four short names
MAX_HANDSHAKE_META_BYTES: Final = 12 * 1024
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
MAX_NAME_CHARS: Final = 256
MAX_TENSOR_DIMS: Final = 32

# dtype name -> bytes per element; names follow torch (`str(torch.float32)` minus "torch.")
DTYPE_SIZES: Final[Mapping[str, int]] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

Buffer = bytes | bytearray | memoryview


class ProtocolError(Exception):
    """The byte stream or the frame order breaks the protocol; the connection must close."""


class Kind(enum.IntEnum):
    """Frame kinds on the wire."""

    HELLO = 1  # worker -> its switch: job token and which way this connection carries data
    PEER_HELLO = 2  # switch -> peer switch: the cluster it claims to be (checked on the cert)
    WELCOME = 3  # answer to a hello: accepted
    DATA = 4
    ACK = 5  # cumulative count of DATA and RECEIPT frames taken on this connection
    ERROR = 6  # the reason for closing, sent before the close
    RECEIPT = 7  # end to end, receiving role -> sending role: what arrived, what to resend
    PING = 8  # switch -> peer switch: answered by an ACK, shows the peer still reads
    LINK = 9  # switch -> worker: the latest measurement of the link to the peer


class Direction(enum.StrEnum):
    """Which way a worker connection carries data frames."""

    SEND = "send"  # worker -> switch
    RECV = "recv"  # switch -> worker


@dataclass(frozen=True)
class Hello:
    """A worker introduces itself to its switch."""

    token: str
    job_id: str
    role: str
    peer_role: str
    direction: Direction


@dataclass(frozen=True)
class PeerHello:
    """A switch introduces itself to a peer switch; `session` changes when it restarts.

    `resume_from` numbers the first frame this connection carries among all the frames
    this session has sent the peer, so that the peer drops what it took before a cut.
    """

    cluster: str
    session: str = "-"
    resume_from: int = 0


@dataclass(frozen=True)
class Welcome:
    """The hello was accepted."""


@dataclass(frozen=True)
class TensorSpec:
    """How to rebuild a tensor from a body: dtype, shape, and the codec that encoded it, if any."""

    dtype: str
    shape: tuple[int, ...]
    codec: str | None = None
    codec_params: Mapping[str, Any] = field(default_factory=dict)

    def raw_nbytes(self) -> int:
        """Body length of the tensor when it travels without a codec."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class Data:
    """A payload of one job, from one role to another, on a channel, with its sequence number."""

    job_id: str
    channel: str
    seq: int
    src_role: str
    dst_role: str
    body: Buffer
    tensor: TensorSpec | None = None  # None: the body is raw bytes


@dataclass(frozen=True)
class Ack:
    """The receiver has taken `count` DATA and RECEIPT frames on this connection so far;
    `ping` answers the PING of that id."""

    count: int
    ping: int | None = None


@dataclass(frozen=True)
class Error:
    """Why the other end is closing the connection."""

    reason: str


@dataclass(frozen=True)
class Receipt:
    """End to end, from the role `src_role` back to the role `dst_role` that sends it data.

    Every DATA frame of `dst_role` below `next_seq` has arrived; with `resend`, the frames
    from `next_seq` on went missing (a switch restarted, a connection dropped): send them
    again. It travels the switches like DATA, and is cumulative: a lost one is made good
    by the next.
    """

    job_id: str
    src_role: str
    dst_role: str
    next_seq: int
    resend: bool = False


@dataclass(frozen=True)
class Ping:
    """A switch asks its peer to show it still reads; the answer is an ACK naming `id`."""

    id: int


@dataclass(frozen=True)
class LinkReport:
    """A switch tells a role what it measured of the link to the peer switch."""

    bandwidth_bytes_per_s: float
    rtt_s: float
    samples: int


Frame = Hello | PeerHello | Welcome | Data | Ack | Error | Receipt | Ping | LinkReport
Routed = Data | Receipt  # what a switch carries from role to role


class _Sentinel(enum.Enum):
    NEED_DATA = "need data"
    CLOSED = "closed"


NEED_DATA: Final = _Sentinel.NEED_DATA
CLOSED: Final = _Sentinel.CLOSED
Event = Frame | _Sentinel


def _meta_of(frame: Frame) -> tuple[Kind, dict[str, Any]]:
    if isinstance(frame, Data):
        meta: dict[str, Any] = {
            "job": frame.job_id,
            "ch": frame.channel,
            "seq": frame.seq,
            "src": frame.src_role,
            "dst": frame.dst_role,
        }
        if frame.tensor is not None:
            spec = frame.tensor
            meta["tensor"] = {"dtype": spec.dtype, "shape": list(spec.shape)}
            if spec.codec is not None:
                meta["tensor"]["codec"] = spec.codec
                meta["tensor"]["params"] = dict(spec.codec_params)
        return Kind.DATA, meta
    if isinstance(frame, Ack):
        if frame.ping is None:
            return Kind.ACK, {"count": frame.count}
        return Kind.ACK, {"count": frame.count, "ping": frame.ping}
    if isinstance(frame, Hello):
        return Kind.HELLO, {
            "token": frame.token,
            "job": frame.job_id,
            "role": frame.role,
            "peer": frame.peer_role,
            "dir": frame.direction.value,
        }
    if isinstance(frame, PeerHello):
        return Kind.PEER_HELLO, {
            "cluster": frame.cluster,
            "session": frame.session,
            "from": frame.resume_from,
        }
    if isinstance(frame, Welcome):
        return Kind.WELCOME, {}
    if isinstance(frame, Receipt):
        route = {"job": frame.job_id, "src": frame.src_role, "dst": frame.dst_role}
        return Kind.RECEIPT, route | {"next": frame.next_seq, "resend": frame.resend}
    if isinstance(frame, Ping):
        return Kind.PING, {"id": frame.id}
    if isinstance(frame, LinkReport):
        return Kind.LINK, {
            "bw": frame.bandwidth_bytes_per_s,
            "rtt": frame.rtt_s,
            "n": frame.samples,
        }
    return Kind.ERROR, {"reason": frame.reason}


def encode(frame: Frame, *, max_body: int = DEFAULT_MAX_BODY_BYTES) -> list[Buffer]:
    """Bytes for one frame: [header and meta, body]; the body is the frame's own buffer."""
    kind, meta = _meta_of(frame)
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
    if len(meta_bytes) > MAX_META_BYTES:
        raise ProtocolError(f"meta of {len(meta_bytes)} bytes exceeds {MAX_META_BYTES}")
    if not isinstance(frame, Data):
        return [HEADER.pack(MAGIC, VERSION, kind, len(meta_bytes), 0) + meta_bytes]
    _check_data(frame.job_id, frame.channel, frame.seq, frame.src_role, frame.dst_role)
    body = frame.body if isinstance(frame.body, memoryview) else memoryview(frame.body)
    nbytes = body.nbytes
    if nbytes > max_body:
        raise ProtocolError(f"body of {nbytes} bytes exceeds the maximum of {max_body}")
    if frame.tensor is not None:
        _check_tensor_length(frame.tensor, nbytes)
    header = HEADER.pack(MAGIC, VERSION, kind, len(meta_bytes), nbytes) + meta_bytes
    return [header, body] if nbytes else [header]


def _name(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise ProtocolError(f"field {key!r} must be a string of 1 to {MAX_NAME_CHARS} characters")
    return value


def _check_data(job: str, channel: str, seq: int, src: str, dst: str) -> None:
    for key, value in (("job", job), ("ch", channel), ("src", src), ("dst", dst)):
        _name({key: value}, key)
    _seq({"seq": seq}, "seq")


def _seq(meta: Mapping[str, Any], key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise ProtocolError(f"field {key!r} must be an integer in [0, 2**63)")
    return value


def _rate(meta: Mapping[str, Any], key: str) -> float:
    value = meta.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e15:
        raise ProtocolError(f"field {key!r} must be a non-negative number")
    return float(value)


def _check_tensor_length(spec: TensorSpec, nbytes: int) -> None:
    if spec.codec is None and spec.raw_nbytes() != nbytes:
        raise ProtocolError(
            f"tensor {spec.dtype}{list(spec.shape)} needs {spec.raw_nbytes()} bytes,"
            f" the body has {nbytes}"
        )


def _parse_tensor(raw: Any) -> TensorSpec:
    if not isinstance(raw, dict):
        raise ProtocolError("field 'tensor' must be an object")
    dtype, shape = raw.get("dtype"), raw.get("shape")
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise ProtocolError(f"unknown dtype {str(dtype)[:40]!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_TENSOR_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape)
    ):
        raise ProtocolError("field 'shape' must be a list of non-negative integers")
    codec = raw.get("codec")
    params = raw.get("params", {})
    if codec is not None and (not isinstance(codec, str) or not 0 < len(codec) <= MAX_NAME_CHARS):
        raise ProtocolError("field 'codec' must be a short string")
    if not isinstance(params, dict):
        raise ProtocolError("field 'params' must be an object")
    return TensorSpec(dtype=dtype, shape=tuple(shape), codec=codec, codec_params=params)


def _parse_meta(kind: Kind, meta: Mapping[str, Any]) -> Frame | dict[str, Any]:
    """A bodiless frame, or for DATA the validated fields the body will join."""
    if kind is Kind.DATA:
        seq = meta.get("seq")
        fields = {
            "job_id": _name(meta, "job"),
            "channel": _name(meta, "ch"),
            "seq": seq,
            "src_role": _name(meta, "src"),
            "dst_role": _name(meta, "dst"),
            "tensor": None if meta.get("tensor") is None else _parse_tensor(meta["tensor"]),
        }
        if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 2**63:
            raise ProtocolError("field 'seq' must be an integer in [0, 2**63)")
        return fields
    if kind is Kind.ACK:
        count = meta.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ProtocolError("field 'count' must be a non-negative integer")
        return Ack(count=count, ping=_seq(meta, "ping") if "ping" in meta else None)
    if kind is Kind.HELLO:
        token = meta.get("token")
        if not isinstance(token, str) or len(token) > 8192:
            raise ProtocolError("field 'token' must be a string")
        try:
            direction = Direction(str(meta.get("dir")))
        except ValueError:
            raise ProtocolError("field 'dir' must be 'send' or 'recv'") from None
        return Hello(
            token=token,
            job_id=_name(meta, "job"),
            role=_name(meta, "role"),
            peer_role=_name(meta, "peer"),
            direction=direction,
        )
    if kind is Kind.PEER_HELLO:
        return PeerHello(
            cluster=_name(meta, "cluster"),
            session=_name(meta, "session"),
            resume_from=_seq(meta, "from") if "from" in meta else 0,
        )
    if kind is Kind.WELCOME:
        return Welcome()
    if kind is Kind.RECEIPT:
        resend = meta.get("resend", False)
        if not isinstance(resend, bool):
            raise ProtocolError("field 'resend' must be a boolean")
        return Receipt(
            job_id=_name(meta, "job"),
            src_role=_name(meta, "src"),
            dst_role=_name(meta, "dst"),
            next_seq=_seq(meta, "next"),
            resend=resend,
        )
    if kind is Kind.PING:
        return Ping(_seq(meta, "id"))
    if kind is Kind.LINK:
        samples = _seq(meta, "n")
        return LinkReport(_rate(meta, "bw"), _rate(meta, "rtt"), samples)
    reason = meta.get("reason")
    if not isinstance(reason, str):
        raise ProtocolError("field 'reason' must be a string")
    return Error(reason=reason[:1000])


class _State(enum.Enum):
    HEADER = "header"
    META = "meta"
    BODY = "body"
    FAILED = "failed"


ALL_KINDS: Final = frozenset(Kind)


class FrameDecoder:
    """Turns a byte stream into frames; holds at most one frame's bytes plus what it was given."""

    def __init__(self, *, max_body: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.max_body = max_body
        self.max_meta = MAX_META_BYTES
        self.allowed: frozenset[Kind] = ALL_KINDS
        self.stage = "here"
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._state = _State.HEADER
        self._kind = Kind.DATA
        self._meta_len = 0
        self._body_len = 0
        self._fields: dict[str, Any] = {}
        self._body = bytearray()
        self._filled = 0

    def receive_data(self, data: Buffer) -> None:
        """Feed bytes from the stream; an empty chunk means the other end closed."""
        if self._eof and data:
            raise ProtocolError("data after the end of the stream")
        if not data:
            self._eof = True
            return
        view = memoryview(data).cast("B")
        if self._state is _State.BODY and self._pos == len(self._buf):
            take = min(len(view), self._body_len - self._filled)
            self._body[self._filled : self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
        if len(view):
            if self._pos and self._pos == len(self._buf):
                self._buf.clear()
                self._pos = 0
            self._buf += view

    def expect(self, allowed: frozenset[Kind], *, max_meta: int, max_body: int, stage: str) -> None:
        """From the next header on, accept only `allowed` kinds within these sizes."""
        self.allowed, self.max_meta, self.max_body = allowed, max_meta, max_body
        self.stage = stage

    def body_view(self) -> memoryview | None:
        """Where a shell may `recv_into` the rest of the current body, or None."""
        if self._state is _State.BODY and self._pos == len(self._buf) and not self._eof:
            return memoryview(self._body)[self._filled :]
        return None

    def advance_body(self, count: int) -> None:
        """Record that `count` bytes were written into the view from `body_view`."""
        if not 0 <= count <= self._body_len - self._filled:
            raise ValueError("advanced past the end of the body")
        self._filled += count

    def next_event(self) -> Event:
        """The next complete frame, NEED_DATA, or CLOSED after a clean end of stream."""
        if self._state is _State.FAILED:
            raise ProtocolError("the stream already failed")
        try:
            return self._next_event()
        except ProtocolError:
            self._state = _State.FAILED
            raise

    def _take(self, count: int) -> bytes | None:
        if len(self._buf) - self._pos < count:
            return None
        chunk = bytes(self._buf[self._pos : self._pos + count])
        self._pos += count
        if self._pos > 65536:
            del self._buf[: self._pos]
            self._pos = 0
        return chunk

    def _next_event(self) -> Event:
        if self._state is _State.HEADER:
            header = self._take(HEADER.size)
            if header is None:
                if self._eof:
                    if self._pos == len(self._buf):
                        return CLOSED
                    raise ProtocolError("stream ended inside a frame header")
                return NEED_DATA
            self._read_header(header)
        if self._state is _State.META:
            meta = self._take(self._meta_len)
            if meta is None:
                if self._eof:
                    raise ProtocolError("stream ended inside a frame's meta")
                return NEED_DATA
            frame = self._read_meta(meta)
            if frame is not None:
                return frame
        if self._state is _State.BODY:
            take = min(len(self._buf) - self._pos, self._body_len - self._filled)
            if take:
                end = self._pos + take
                self._body[self._filled : self._filled + take] = self._buf[self._pos : end]
                self._pos = end
                self._filled += take
            if self._filled < self._body_len:
                if self._eof:
                    raise ProtocolError("stream ended inside a frame body")
                return NEED_DATA
            body, self._body = self._body, bytearray()
            self._state = _State.HEADER
            return Data(body=body, **self._fields)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_header(self, header: bytes) -> None:
        magic, version, kind, meta_len, body_len = HEADER.unpack(header)
        if magic != MAGIC:
            raise ProtocolError("not a Nebula switch stream (bad magic)")
        if version != VERSION:
            raise ProtocolError(
                f"unsupported protocol version {version}, this end speaks {VERSION}"
            )
        try:
            self._kind = Kind(kind)
        except ValueError:
            raise ProtocolError(f"unknown frame kind {kind}") from None
        # refused on the header alone: nothing of the frame is buffered or allocated yet
        if self._kind not in self.allowed:
            raise ProtocolError(f"unexpected {self._kind.name} frame {self.stage}")
        if meta_len > self.max_meta:
            raise ProtocolError(f"meta of {meta_len} bytes exceeds {self.max_meta}")
        if body_len > self.max_body:
            raise ProtocolError(
                f"frame body of {body_len} bytes exceeds the maximum {self.max_body}"
            )
        if body_len and self._kind is not Kind.DATA:
            raise ProtocolError(f"{self._kind.name} frames carry no body")
        self._meta_len, self._body_len = meta_len, body_len
        self._state = _State.META

    def _read_meta(self, meta_bytes: bytes) -> Frame | None:
        try:
            meta = json.loads(meta_bytes)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise ProtocolError("frame meta is not JSON") from None
        if not isinstance(meta, dict):
            raise ProtocolError("frame meta must be a JSON object")
        parsed = _parse_meta(self._kind, meta)
        if isinstance(parsed, dict):
            if parsed["tensor"] is not None:
                _check_tensor_length(parsed["tensor"], self._body_len)
            self._fields = parsed
            self._body = bytearray(self._body_len)
            self._filled = 0
            self._state = _State.BODY
            return None
        self._state = _State.HEADER
        return parsed


class Side(enum.Enum):
    """Which end of a connection a `Connection` plays."""

    CLIENT = "client"  # says hello, waits for welcome
    SERVER = "server"  # waits for hello, answers welcome or error


class ConnState(enum.Enum):
    """Where a connection stands."""

    HANDSHAKE = "handshake"
    OPEN = "open"
    CLOSED = "closed"


_HANDSHAKE_KINDS: Final[Mapping[Side, frozenset[Kind]]] = {
    Side.SERVER: frozenset({Kind.HELLO, Kind.PEER_HELLO, Kind.ERROR}),
    Side.CLIENT: frozenset({Kind.WELCOME, Kind.ERROR}),
}
_OPEN_KINDS: Final = frozenset(
    {Kind.DATA, Kind.ACK, Kind.ERROR, Kind.RECEIPT, Kind.PING, Kind.LINK}
)
_OPEN_FRAMES: Final = (Data, Ack, Receipt, Ping, LinkReport)


class Connection:
    """One end of a switch connection: frame order rules on top of the decoder."""

    def __init__(self, side: Side, *, max_body: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.side = side
        self.state = ConnState.HANDSHAKE
        self.max_body = max_body
        self._decoder = FrameDecoder(max_body=max_body)
        self._hello_sent = False
        # Until the handshake is done only its frames may come, small and bodiless: a
        # server has not authenticated anyone yet, a client not yet heard its switch.
        first = _HANDSHAKE_KINDS[side]
        self._decoder.expect(
            first, max_meta=MAX_HANDSHAKE_META_BYTES, max_body=0, stage="before the handshake"
        )

    def _open(self) -> None:
        self.state = ConnState.OPEN
        self._decoder.expect(
            _OPEN_KINDS,
            max_meta=MAX_META_BYTES,
            max_body=self.max_body,
            stage="after the handshake",
        )

    def receive_data(self, data: Buffer) -> None:
        """Feed bytes read from the stream (b"" at end of stream)."""
        self._decoder.receive_data(data)

    def body_view(self) -> memoryview | None:
        """Where to `recv_into` the rest of a body without an extra copy, or None."""
        return self._decoder.body_view()

    def advance_body(self, count: int) -> None:
        """Count bytes written into the view from `body_view`."""
        self._decoder.advance_body(count)

    def next_event(self) -> Event:
        """The next frame, NEED_DATA or CLOSED; raises ProtocolError on a bad stream or order."""
        event = self._decoder.next_event()
        if event is NEED_DATA:
            return event
        if event is CLOSED:
            self.state = ConnState.CLOSED
            return event
        assert not isinstance(event, _Sentinel)
        self._check_incoming(event)
        return event

    def _check_incoming(self, frame: Frame) -> None:
        if isinstance(frame, Error):
            self.state = ConnState.CLOSED
            return
        if self.state is ConnState.CLOSED:
            raise ProtocolError("frame after the connection closed")
        if self.state is ConnState.HANDSHAKE:
            if self.side is Side.SERVER and isinstance(frame, Hello | PeerHello):
                return
            if self.side is Side.CLIENT and isinstance(frame, Welcome):
                self._open()
                return
            raise ProtocolError(f"unexpected {type(frame).__name__} frame before the handshake")
        if not isinstance(frame, _OPEN_FRAMES):
            raise ProtocolError(f"unexpected {type(frame).__name__} frame after the handshake")

    def send(self, frame: Frame) -> list[Buffer]:
        """Buffers to write for `frame`, after checking it fits the connection's state."""
        if self.state is ConnState.CLOSED:
            raise ProtocolError("the connection is closed")
        if isinstance(frame, Error):
            self.state = ConnState.CLOSED
        elif self.state is ConnState.HANDSHAKE:
            if self.side is Side.CLIENT and isinstance(frame, Hello | PeerHello):
                if self._hello_sent:
                    raise ProtocolError("hello already sent")
                self._hello_sent = True
            elif self.side is Side.SERVER and isinstance(frame, Welcome):
                self._open()
            else:
                raise ProtocolError(f"cannot send {type(frame).__name__} during the handshake")
        elif not isinstance(frame, _OPEN_FRAMES):
            raise ProtocolError(f"cannot send {type(frame).__name__} on an open connection")
        return encode(frame, max_body=self.max_body)


class StreamTracker:
    """Sequence numbers per stream: delivers each once and in order, drops replays, spots gaps."""

    def __init__(self, *, max_streams: int = 65536) -> None:
        self.max_streams = max_streams
        self._next: dict[tuple[str, ...], int] = {}

    def is_new(self, stream: tuple[str, ...], seq: int) -> bool:
        """True if `seq` is the next on `stream`, False for a duplicate; ProtocolError on a gap."""
        expected = self._next.get(stream, 0)
        if seq < expected:
            return False
        if seq > expected:
            raise ProtocolError(f"sequence gap on {stream}: expected {expected}, got {seq}")
        if stream not in self._next and len(self._next) >= self.max_streams:
            raise ProtocolError(f"more than {self.max_streams} streams")
        return True

    def admit(self, stream: tuple[str, ...], seq: int) -> bool:
        """Like `is_new`, and a new `seq` counts as delivered."""
        if not self.is_new(stream, seq):
            return False
        self._next[stream] = seq + 1
        return True

    def forget(self, job_id: str, dst_role: str | None = None) -> int:
        """Drop the streams of a finished job (only those to `dst_role` when given).

        Keys are (job, src, dst, channel); returns how many were dropped.
        """
        doomed = [
            k
            for k in self._next
            if k and k[0] == job_id and (dst_role is None or (len(k) > 2 and k[2] == dst_role))
        ]
        for key in doomed:
            del self._next[key]
        return len(doomed)

    def __len__(self) -> int:
        return len(self._next)

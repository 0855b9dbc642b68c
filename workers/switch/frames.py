"""The switch's frames and their wire form, one table entry per kind.

Every frame is a 16-byte header, a JSON meta block and a binary body::

    magic "NB" | version u8 | kind u8 | meta_len u32 | body_len u64 | meta | body

Only DATA frames have a body. `KINDS` holds, for each `Kind`, the frame class and the
two functions between it and its meta: adding a kind is one class and one entry here
(and the connection states that allow it, connection.py). `encode` writes a frame;
the decoder (decoder.py) reads the header and hands the meta to `parse_meta`.
"""

from __future__ import annotations

import enum
import json
import json.encoder
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

MAGIC: Final = b"NB"
VERSION: Final = 1
HEADER = struct.Struct("!2sBBIQ")
MAX_META_BYTES: Final = 64 * 1024
# a hello's meta is a job token (at most 8192 characters) and four short names
MAX_HANDSHAKE_META_BYTES: Final = 12 * 1024
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
MAX_NAME_CHARS: Final = 256
MAX_TENSOR_DIMS: Final = 32
MAX_TOKEN_CHARS: Final = 8192
MAX_REASON_CHARS: Final = 1000

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
    # the header and meta it came in with, when read from a connection: a switch passes
    # the frame on with them as they were (`encode`), instead of building them again. Not
    # an argument: `dataclasses.replace` makes a frame without it, whose fields may differ.
    wire: bytes | None = field(default=None, init=False, compare=False, repr=False)


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
Meta = dict[str, Any]


# field checks, shared by every kind


def _name(meta: Mapping[str, Any], key: str) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
        raise _bad_name(key)
    return value


def _bad_name(key: str) -> ProtocolError:
    return ProtocolError(f"field {key!r} must be a string of 1 to {MAX_NAME_CHARS} characters")


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


def _flag(meta: Mapping[str, Any], key: str) -> bool:
    value = meta.get(key, False)
    if not isinstance(value, bool):
        raise ProtocolError(f"field {key!r} must be a boolean")
    return value


def _text(meta: Mapping[str, Any], key: str, max_chars: int) -> str:
    value = meta.get(key)
    if not isinstance(value, str) or len(value) > max_chars:
        raise ProtocolError(f"field {key!r} must be a string")
    return value


def check_tensor_length(spec: TensorSpec, nbytes: int) -> None:
    """A raw tensor's body must be exactly its dtype's size times its elements."""
    if spec.codec is None and spec.raw_nbytes() != nbytes:
        raise ProtocolError(
            f"tensor {spec.dtype}{list(spec.shape)} needs {spec.raw_nbytes()} bytes,"
            f" the body has {nbytes}"
        )


def _tensor_meta(spec: TensorSpec) -> Meta:
    meta: Meta = {"dtype": spec.dtype, "shape": list(spec.shape)}
    if spec.codec is not None:
        meta["codec"] = spec.codec
        meta["params"] = dict(spec.codec_params)
    return meta


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


# each kind: frame -> meta, meta -> frame (for DATA, the fields its body will join)


def _data_meta(f: Data) -> Meta:
    meta: Meta = {"job": f.job_id, "ch": f.channel, "seq": f.seq, "src": f.src_role}
    meta["dst"] = f.dst_role
    if f.tensor is not None:
        meta["tensor"] = _tensor_meta(f.tensor)
    return meta


def data_fields(meta: Mapping[str, Any]) -> Meta:
    """A DATA frame's fields from its meta, checked; the body joins them."""
    # the common case first, in one pass of plain checks (a switch parses every frame's
    # meta on each hop): short names, a sequence number, no tensor or a plain one
    job, ch, seq = meta.get("job"), meta.get("ch"), meta.get("seq")
    src, dst = meta.get("src"), meta.get("dst")
    if (
        type(job) is str
        and type(ch) is str
        and type(src) is str
        and type(dst) is str
        and type(seq) is int
        and 0 < len(job) <= MAX_NAME_CHARS
        and 0 < len(ch) <= MAX_NAME_CHARS
        and 0 < len(src) <= MAX_NAME_CHARS
        and 0 < len(dst) <= MAX_NAME_CHARS
        and 0 <= seq < 2**63
    ):
        tensor = meta.get("tensor")
        return {
            "job_id": job,
            "channel": ch,
            "seq": seq,
            "src_role": src,
            "dst_role": dst,
            "tensor": None if tensor is None else _parse_tensor(tensor),
        }
    # else each field's own check, which says what is wrong
    tensor = meta.get("tensor")
    return {
        "job_id": _name(meta, "job"),
        "channel": _name(meta, "ch"),
        "seq": _seq(meta, "seq"),
        "src_role": _name(meta, "src"),
        "dst_role": _name(meta, "dst"),
        "tensor": None if tensor is None else _parse_tensor(tensor),
    }


def _ack_meta(f: Ack) -> Meta:
    return {"count": f.count} if f.ping is None else {"count": f.count, "ping": f.ping}


def _parse_ack(meta: Mapping[str, Any]) -> Ack:
    count = meta.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ProtocolError("field 'count' must be a non-negative integer")
    return Ack(count=count, ping=_seq(meta, "ping") if "ping" in meta else None)


def _hello_meta(f: Hello) -> Meta:
    return {
        "token": f.token,
        "job": f.job_id,
        "role": f.role,
        "peer": f.peer_role,
        "dir": f.direction.value,
    }


def _parse_hello(meta: Mapping[str, Any]) -> Hello:
    token = _text(meta, "token", MAX_TOKEN_CHARS)
    try:
        direction = Direction(str(meta.get("dir")))
    except ValueError:
        raise ProtocolError("field 'dir' must be 'send' or 'recv'") from None
    return Hello(token, _name(meta, "job"), _name(meta, "role"), _name(meta, "peer"), direction)


def _peer_hello_meta(f: PeerHello) -> Meta:
    return {"cluster": f.cluster, "session": f.session, "from": f.resume_from}


def _parse_peer_hello(meta: Mapping[str, Any]) -> PeerHello:
    resume_from = _seq(meta, "from") if "from" in meta else 0
    return PeerHello(_name(meta, "cluster"), _name(meta, "session"), resume_from)


def _receipt_meta(f: Receipt) -> Meta:
    route = {"job": f.job_id, "src": f.src_role, "dst": f.dst_role}
    return route | {"next": f.next_seq, "resend": f.resend}


def _parse_receipt(meta: Mapping[str, Any]) -> Receipt:
    resend = _flag(meta, "resend")
    route = _name(meta, "job"), _name(meta, "src"), _name(meta, "dst")
    return Receipt(*route, next_seq=_seq(meta, "next"), resend=resend)


def _link_meta(f: LinkReport) -> Meta:
    return {"bw": f.bandwidth_bytes_per_s, "rtt": f.rtt_s, "n": f.samples}


def _parse_link(meta: Mapping[str, Any]) -> LinkReport:
    samples = _seq(meta, "n")
    return LinkReport(_rate(meta, "bw"), _rate(meta, "rtt"), samples)


def _parse_error(meta: Mapping[str, Any]) -> Error:
    reason = meta.get("reason")
    if not isinstance(reason, str):
        raise ProtocolError("field 'reason' must be a string")
    return Error(reason=reason[:MAX_REASON_CHARS])


class KindCodec(NamedTuple):
    """How one kind of frame goes to and from its meta."""

    type: type
    meta: Callable[[Any], Meta]
    parse: Callable[[Mapping[str, Any]], Frame | Meta]


KINDS: Final[Mapping[Kind, KindCodec]] = {
    Kind.HELLO: KindCodec(Hello, _hello_meta, _parse_hello),
    Kind.PEER_HELLO: KindCodec(PeerHello, _peer_hello_meta, _parse_peer_hello),
    Kind.WELCOME: KindCodec(Welcome, lambda f: {}, lambda meta: Welcome()),
    Kind.DATA: KindCodec(Data, _data_meta, data_fields),
    Kind.ACK: KindCodec(Ack, _ack_meta, _parse_ack),
    Kind.ERROR: KindCodec(Error, lambda f: {"reason": f.reason}, _parse_error),
    Kind.RECEIPT: KindCodec(Receipt, _receipt_meta, _parse_receipt),
    Kind.PING: KindCodec(Ping, lambda f: {"id": f.id}, lambda meta: Ping(_seq(meta, "id"))),
    Kind.LINK: KindCodec(LinkReport, _link_meta, _parse_link),
}
KIND_OF: Final[Mapping[type, Kind]] = {codec.type: kind for kind, codec in KINDS.items()}
assert set(KINDS) == set(Kind), "every kind needs its table entry"


def parse_meta(kind: Kind, meta: Mapping[str, Any]) -> Frame | Meta:
    """A bodiless frame, or for DATA the validated fields the body will join."""
    return KINDS[kind].parse(meta)


def _compact_dumps() -> Callable[[Meta], str]:
    """`json.dumps(meta, separators=(",", ":"))`, the same text, from one C encoder made
    once: `dumps` builds a `JSONEncoder` and a C encoder on every call, two thirds of its
    time on a frame's meta. Metas are trees the frames build, so there is no circular
    check (a cycle would end in RecursionError, not ValueError)."""
    compact = json.JSONEncoder(separators=(",", ":"))
    make = getattr(json.encoder, "c_make_encoder", None)  # absent from the stubs
    if make is None:  # pragma: no cover - CPython without its _json accelerator
        return compact.encode
    encoder = make(
        None,
        compact.default,
        json.encoder.encode_basestring_ascii,
        None,
        compact.key_separator,
        compact.item_separator,
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    return lambda meta: "".join(encoder(meta, 0))


_dumps: Final = _compact_dumps()


def _meta_bytes(kind: Kind, frame: Frame) -> bytes:
    meta_bytes = _dumps(KINDS[kind].meta(frame)).encode()
    if len(meta_bytes) > MAX_META_BYTES:
        raise ProtocolError(f"meta of {len(meta_bytes)} bytes exceeds {MAX_META_BYTES}")
    return meta_bytes


def _check_data(frame: Data) -> None:
    for key, value in (
        ("job", frame.job_id),
        ("ch", frame.channel),
        ("src", frame.src_role),
        ("dst", frame.dst_role),
    ):
        if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME_CHARS:
            raise _bad_name(key)
    _seq({"seq": frame.seq}, "seq")


def encode(frame: Frame, *, max_body: int = DEFAULT_MAX_BODY_BYTES) -> list[Buffer]:
    """Bytes for one frame: [header and meta, body]; the body is the frame's own buffer."""
    if type(frame) is Data and frame.wire is not None:
        # passed on as it came: its header and meta were checked when it was read
        nbytes = memoryview(frame.body).nbytes
        if nbytes > max_body:
            raise ProtocolError(f"body of {nbytes} bytes exceeds the maximum of {max_body}")
        return [frame.wire, frame.body] if nbytes else [frame.wire]
    kind = KIND_OF[type(frame)]
    meta_bytes = _meta_bytes(kind, frame)
    if not isinstance(frame, Data):
        return [HEADER.pack(MAGIC, VERSION, kind, len(meta_bytes), 0) + meta_bytes]
    _check_data(frame)
    body = frame.body if isinstance(frame.body, memoryview) else memoryview(frame.body)
    nbytes = body.nbytes
    if nbytes > max_body:
        raise ProtocolError(f"body of {nbytes} bytes exceeds the maximum of {max_body}")
    if frame.tensor is not None:
        check_tensor_length(frame.tensor, nbytes)
    header = HEADER.pack(MAGIC, VERSION, kind, len(meta_bytes), nbytes) + meta_bytes
    return [header, body] if nbytes else [header]

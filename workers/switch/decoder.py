"""The frame decoder, sans IO: bytes in, frames out.

The header is checked before anything is buffered, so a peer announcing a huge frame
gets a `ProtocolError`, not an allocation; so does a kind the caller's `expect()` does
not allow. A DATA body may be received in place: `body_view()` is where a shell
`recv_into`s the rest of the current body, `advance_body()` counts what it wrote.
A large body's buffer comes from a `BufferPool` (buffers.py): one no frame refers to
any more, not a fresh allocation per frame.
"""

from __future__ import annotations

import enum
import json
import json.scanner
from typing import Any, Final

from workers.switch.buffers import BODIES, POOLED_BYTES, BufferPool
from workers.switch.frames import (
    DEFAULT_MAX_BODY_BYTES,
    HEADER,
    MAGIC,
    MAX_META_BYTES,
    VERSION,
    Buffer,
    Data,
    Frame,
    Kind,
    ProtocolError,
    check_tensor_length,
    data_fields,
    parse_meta,
)


class _Sentinel(enum.Enum):
    NEED_DATA = "need data"
    CLOSED = "closed"


NEED_DATA: Final = _Sentinel.NEED_DATA
CLOSED: Final = _Sentinel.CLOSED
Event = Frame | _Sentinel


class _State(enum.Enum):
    HEADER = "header"
    META = "meta"
    BODY = "body"
    FAILED = "failed"


ALL_KINDS: Final = frozenset(Kind)
_KIND_OF_BYTE: Final = {int(kind): kind for kind in Kind}
_decode_json: Final = json.JSONDecoder().decode
# (the stubs type the context as the scanner itself; it is the decoder whose settings it reads)
_scan_json: Final = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def _loads(text: str) -> Any:
    """`json.loads(text)`: an object as the encoders write it (no white space around it)
    is scanned at once, without `decode`'s two white-space matches; anything else, and
    every error, goes through `decode`."""
    if text[:1] == "{":
        try:
            value, end = _scan_json(text, 0)
        except StopIteration:
            pass
        else:
            if end == len(text):
                return value
    return _decode_json(text)


class FrameDecoder:
    """Turns a byte stream into frames; holds at most one frame's bytes plus what it was given."""

    def __init__(
        self, *, max_body: int = DEFAULT_MAX_BODY_BYTES, pool: BufferPool = BODIES
    ) -> None:
        self.max_body = max_body
        self._pool = pool
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
        self._wire = b""  # a DATA frame's header and meta, as read (`Data.wire`)

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

    def _next_event(self) -> Event:
        if self._state is _State.HEADER:
            if len(self._buf) - self._pos < HEADER.size:
                if self._eof:
                    if self._pos == len(self._buf):
                        return CLOSED
                    raise ProtocolError("stream ended inside a frame header")
                return NEED_DATA
            self._read_header(HEADER.unpack_from(self._buf, self._pos))
            self._pos += HEADER.size
        if self._state is _State.META:
            end = self._pos + self._meta_len
            if len(self._buf) < end:
                if self._eof:
                    raise ProtocolError("stream ended inside a frame's meta")
                return NEED_DATA
            meta = self._buf[self._pos : end]
            self._pos = end
            frame = self._read_meta(meta)
            if self._pos > 65536:  # what was read goes, once there is a fair amount of it
                del self._buf[: self._pos]
                self._pos = 0
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
            return self._data(body)
        raise AssertionError("unreachable")  # pragma: no cover

    def _data(self, body: bytearray) -> Data:
        frame = Data(body=body, **self._fields)
        object.__setattr__(frame, "wire", self._wire)
        return frame

    def _read_header(self, header: tuple[bytes, int, int, int, int]) -> None:
        magic, version, kind, meta_len, body_len = header
        if magic != MAGIC:
            raise ProtocolError("not a Nebula switch stream (bad magic)")
        if version != VERSION:
            raise ProtocolError(
                f"unsupported protocol version {version}, this end speaks {VERSION}"
            )
        known = _KIND_OF_BYTE.get(kind)
        if known is None:
            raise ProtocolError(f"unknown frame kind {kind}")
        self._kind = known
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

    def _read_meta(self, meta_bytes: bytearray) -> Frame | None:
        try:
            meta = _loads(meta_bytes.decode())
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            # what else `json.loads` takes (UTF-16 or 32, a byte order mark), or the error
            try:
                meta = json.loads(meta_bytes)
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                raise ProtocolError("frame meta is not JSON") from None
        if not isinstance(meta, dict):
            raise ProtocolError("frame meta must be a JSON object")
        # DATA, the frame of every step, straight to its fields (`parse_meta` looks it up)
        parsed = data_fields(meta) if self._kind is Kind.DATA else parse_meta(self._kind, meta)
        if isinstance(parsed, dict):
            if parsed["tensor"] is not None:
                check_tensor_length(parsed["tensor"], self._body_len)
            self._fields = parsed
            # as the frame's sender wrote it: the header is the one just checked
            header = HEADER.pack(MAGIC, VERSION, self._kind, self._meta_len, self._body_len)
            self._wire = header + meta_bytes
            start = self._pos
            if self._body_len < POOLED_BYTES and len(self._buf) - start >= self._body_len:
                # a small body already here becomes the frame's own bytes in one copy
                self._pos = start + self._body_len
                self._state = _State.HEADER
                return self._data(self._buf[start : self._pos])
            self._body = self._pool.take(self._body_len)
            self._filled = 0
            self._state = _State.BODY
            return None
        self._state = _State.HEADER
        return parsed

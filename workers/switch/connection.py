"""The connection state machine, sans IO: which frames each end may send and take when.

Until the handshake is done a server reads only a HELLO (or PEER_HELLO) with a small
meta and no body, so a stranger who has not authenticated never makes it allocate a
body. A shell (stream.py) drives it: `receive_data()` / `next_event()` on the way in
(or `body_view()` / `advance_body()` to receive straight into a frame's body), `send()`
on the way out, which returns the buffers to write: a DATA body goes out as the
caller's memoryview, never copied.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from workers.switch import frames
from workers.switch.decoder import CLOSED, NEED_DATA, Event, FrameDecoder, _Sentinel
from workers.switch.frames import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_HANDSHAKE_META_BYTES,
    MAX_META_BYTES,
    Ack,
    Buffer,
    Data,
    Error,
    Frame,
    Kind,
    LinkReport,
    Ping,
    ProtocolError,
    Receipt,
    Welcome,
    encode,
)


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
_HELLOS: Final = (frames.Hello, frames.PeerHello)


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
        if type(event) is Data and self.state is ConnState.OPEN:
            return event  # the frame of every step, as `_check_incoming` would pass it
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
            if self.side is Side.SERVER and isinstance(frame, _HELLOS):
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
            if self.side is Side.CLIENT and isinstance(frame, _HELLOS):
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

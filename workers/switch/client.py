"""`SwitchLink`: the `Link` a training role holds, through its cluster's switch.

A link opens two TLS connections to the local switch, each introduced by the
role's job token: one to send, one to receive, so that each TLS socket is
only ever used by one thread. Tensors leave as a memoryview of their storage
(`send` returns once the bytes are written, so the caller may then reuse
them) and arrive as tensors over the received buffer, without another copy.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import ssl
import threading
from collections import defaultdict
from pathlib import Path

import torch

from contract.jobtoken import unverified_claims
from workers.switch.link import LinkClosed, LinkEstimate, Payload
from workers.switch.protocol import (
    CLOSED,
    DEFAULT_MAX_BODY_BYTES,
    DTYPE_SIZES,
    Buffer,
    Connection,
    Data,
    Direction,
    Error,
    Hello,
    ProtocolError,
    Side,
    TensorSpec,
    Welcome,
)
from workers.switch.stream import FrameStream
from workers.switch.tls import PeerRejected, check_peer, client_context

log = logging.getLogger("nebula.switch.client")
Address = tuple[str, int]


class LinkRefused(Exception):
    """The switch refused this link (token, job, role or TLS); the reason says which."""


def tensor_to_wire(tensor: torch.Tensor) -> tuple[memoryview, TensorSpec]:
    """A view of a tensor's bytes (no copy when it is contiguous on CPU) and its spec."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in DTYPE_SIZES:
        raise TypeError(f"dtype {tensor.dtype} cannot travel through the switch")
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    return raw.numpy().data, TensorSpec(dtype=dtype, shape=tuple(tensor.shape))


def tensor_from_wire(body: Buffer, spec: TensorSpec) -> torch.Tensor:
    """The tensor a raw (codec-less) body holds, sharing the body's memory."""
    dtype = getattr(torch, spec.dtype)
    if not len(body):
        return torch.empty(spec.shape, dtype=dtype)
    return torch.frombuffer(body, dtype=dtype).reshape(spec.shape)


class SwitchLink:
    """A `Link` between two roles of a job, through the switches of their clusters."""

    def __init__(
        self,
        address: Address,
        *,
        ca_path: str | Path,
        token: str,
        job_id: str,
        role: str,
        peer_role: str,
        cluster: str | None = None,
        timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_BODY_BYTES,
        recv_queue_frames: int = 16,
    ) -> None:
        self.job_id, self.role, self.peer_role = str(job_id), role, peer_role
        # the switch must prove it serves the cluster the token was issued for
        self.cluster = cluster or unverified_claims(token).cluster
        self._context = client_context(ca_path=ca_path)
        self._max_frame = max_frame_bytes
        self._seq: defaultdict[str, int] = defaultdict(int)
        self._sent: defaultdict[str, int] = defaultdict(int)
        self._estimate: LinkEstimate | None = None
        self._send_lock = threading.Lock()
        self._closed = threading.Event()
        self._queues: defaultdict[str, queue.Queue[Data | None]] = defaultdict(
            lambda: queue.Queue(recv_queue_frames)
        )
        self._queues_lock = threading.Lock()
        self._out = self._open(address, token, Direction.SEND, timeout)
        try:
            self._in = self._open(address, token, Direction.RECV, timeout)
        except BaseException:
            self._out.close()
            raise
        self._reader = threading.Thread(target=self._read_loop, name=f"link-{role}", daemon=True)
        self._reader.start()

    def _open(
        self, address: Address, token: str, direction: Direction, timeout: float
    ) -> FrameStream:
        raw = socket.create_connection(address, timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock = self._context.wrap_socket(raw, server_hostname=self.cluster)
            check_peer(sock, expected_cluster=self.cluster, revoked=frozenset())
        except (ssl.SSLError, PeerRejected) as exc:
            raw.close()
            raise LinkRefused(f"TLS to the switch failed: {exc}") from exc
        stream = FrameStream(sock, Connection(Side.CLIENT, max_body=self._max_frame))
        hello = Hello(token, self.job_id, self.role, self.peer_role, direction)
        try:
            stream.write(hello)
            answer = stream.read_event()
        except (OSError, ProtocolError) as exc:
            stream.close()
            raise LinkRefused(f"the switch closed the connection: {exc}") from exc
        if isinstance(answer, Error):
            stream.close()
            raise LinkRefused(answer.reason)
        if not isinstance(answer, Welcome):
            stream.close()
            raise LinkRefused("the switch did not answer the hello")
        sock.settimeout(None)
        return stream

    def _queue(self, channel: str) -> queue.Queue[Data | None]:
        with self._queues_lock:
            return self._queues[channel]

    def _read_loop(self) -> None:
        try:
            while not self._closed.is_set():
                event = self._in.read_event()
                if isinstance(event, Error):
                    log.warning(
                        "link %s/%s: the switch ended it: %s", self.job_id, self.role, event.reason
                    )
                    return
                if event is CLOSED:
                    log.info("link %s/%s: the switch closed the connection", self.job_id, self.role)
                    return
                if not isinstance(event, Data):
                    raise ProtocolError("the switch sent a frame other than data")
                self._queue(event.channel).put(event)
        except (OSError, ProtocolError) as exc:
            if not self._closed.is_set():
                log.warning("link %s/%s: receiving stopped: %s", self.job_id, self.role, exc)
        finally:
            self._wake_receivers()

    def _wake_receivers(self) -> None:
        with self._queues_lock:
            queues = list(self._queues.values())
        for q in queues:
            with contextlib.suppress(queue.Full):
                q.put_nowait(None)

    def send(self, channel: str, payload: Payload) -> None:
        """Write a payload for the peer on `channel`; returns once written (backpressure)."""
        if isinstance(payload, torch.Tensor):
            body, spec = tensor_to_wire(payload)
            self.send_encoded(channel, body, spec)
        else:
            self.send_encoded(channel, payload, None)

    def send_encoded(self, channel: str, body: Buffer, tensor: TensorSpec | None) -> None:
        """Send a body as it is; `tensor` describes it (a codec's output travels untouched)."""
        if self._closed.is_set():
            raise LinkClosed(channel)
        with self._send_lock:
            seq = self._seq[channel]
            frame = Data(self.job_id, channel, seq, self.role, self.peer_role, body, tensor)
            try:
                self._out.write(frame)
            except (OSError, ProtocolError) as exc:
                raise LinkClosed(f"{channel}: {exc}") from exc
            self._seq[channel] = seq + 1
            self._sent[channel] += memoryview(body).nbytes

    def recv_frame(self, channel: str, timeout: float | None = None) -> Data:
        """The next frame from the peer on `channel`, with its tensor spec and codec."""
        q = self._queue(channel)
        try:
            item = q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"nothing on channel {channel!r} within {timeout} s") from None
        if item is None:
            q.put(None)  # keep waking the next receiver
            raise LinkClosed(channel)
        return item

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        """Next payload from the peer on `channel`; raises TimeoutError or LinkClosed."""
        frame = self.recv_frame(channel, timeout)
        if frame.tensor is None:
            return bytes(frame.body)
        if frame.tensor.codec is not None:
            raise TypeError(f"channel {channel!r} carries {frame.tensor.codec}; use recv_frame")
        return tensor_from_wire(frame.body, frame.tensor)

    def bytes_sent(self) -> dict[str, int]:
        """Payload bytes sent so far, per channel."""
        return dict(self._sent)

    def link_estimate(self) -> LinkEstimate | None:
        """The switches' latest measurement of the link (None until they report one)."""
        return self._estimate

    def close(self) -> None:
        """Close both connections; blocked receivers get LinkClosed."""
        self._closed.set()
        for stream in (self._out, self._in):
            with contextlib.suppress(OSError):
                stream.sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=5)
        self._out.close()
        self._in.close()
        self._wake_receivers()

    def __enter__(self) -> SwitchLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

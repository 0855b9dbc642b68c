"""`SwitchLink`: the `Link` a training role holds, through its cluster's switch.

A link opens two TLS connections to the local switch, each introduced by the
role's job token: one to send, one to receive, each with a thread of its own (a
writer, a reader). No TLS socket is used by two threads at once: the sending one
is used under its outlet's lock (outlet.py), by the writer or, while the writer is
idle, by the thread that has something small to write (the role's own thread in
`send`, the reader owing a receipt), which writes it without waking the writer.
The receiving one likewise: a role's thread waiting in `recv` reads it itself while
no other thread does, and the reader stands aside while the role's threads read
(`reader_waits` in linkstate.py), so that a frame wakes the thread that waits for it
and no other; the reader reads whatever else comes (receipts, other channels' frames)
once they stop, reads ahead after a large frame (`role_reads`: its receiving overlaps
the role's work on the one before), and deals with a lost connection.

Delivery is end to end: `send` keeps a copy of each frame in a `ResendWindow`
(so the caller may reuse its tensor at once) until the far role's RECEIPT says
it arrived. When a connection drops, or the switch restarts, the link dials
again with its job token; its writer sends every unacknowledged frame again,
its reader asks the far role to do the same (a RECEIPT with `resend`), and
each end drops by sequence number what it already has. A switch restart or a
dropped connection thus loses nothing and delivers nothing twice. A path that
drops every byte silently (no end of stream, no reset, no backpressure) is found by
pings: each connection pings the switch every `ping_interval_s` and is dialled again
once a ping has had nothing back for `io_timeout_s` (a `Heartbeat`); the switch, for
its part, cuts a worker connection it has heard nothing on for its own `io_timeout_s`,
so the link's ping interval must stay below the switch's timeout. Frames
arrive as tensors over the received buffer, without another copy. The switch
also tells the link what it measured of the link to the peer switch
(`link_estimate()`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import socket
import ssl
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch

from contract.jobtoken import unverified_claims
from workers.switch.buffers import BODIES
from workers.switch.link import LinkClosed, LinkEstimate, Payload
from workers.switch.linkstate import LinkState, Taken, reader_waits, role_reads
from workers.switch.outlet import Outlet
from workers.switch.protocol import (
    CLOSED,
    DEFAULT_MAX_BODY_BYTES,
    DTYPE_SIZES,
    Ack,
    Buffer,
    Connection,
    Data,
    Direction,
    Error,
    Event,
    Hello,
    LinkReport,
    Ping,
    ProtocolError,
    Receipt,
    Side,
    TensorSpec,
    Welcome,
)
from workers.switch.rules import Heartbeat
from workers.switch.stream import FrameStream, cut, tune
from workers.switch.tls import PeerRejected, check_peer, client_context

log = logging.getLogger("nebula.switch.client")
Address = tuple[str, int]


class LinkRefused(Exception):
    """The switch refused this link (token, job, role or TLS); the reason says which."""


GOODBYE = "the role closed its link"


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


def _resend_copy(body: Buffer) -> Buffer:
    """What the resend window keeps of a body: `bytes` as they are (nothing can change
    them), anything else copied (the caller may reuse it at once), a large body into a
    recycled buffer: a fresh one per frame costs its pages' faults and zeroing, as much
    again as the copy (bench/results/switch_profiles/NOTES.md)."""
    if isinstance(body, bytes):
        return body
    view = memoryview(body)
    if not view.c_contiguous:
        return view.tobytes()
    view = view.cast("B")
    kept = BODIES.take(view.nbytes)
    kept[:] = view
    return kept


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
        window_frames: int = 64,
        window_bytes: int = 256 * 1024 * 1024,
        resume_timeout_s: float = 120.0,
        resend_after_s: float = 15.0,
        ping_interval_s: float = 1.0,
        io_timeout_s: float = 5.0,
    ) -> None:
        self.job_id, self.role, self.peer_role = str(job_id), role, peer_role
        # the switch must prove it serves the cluster the token was issued for
        self.cluster = cluster or unverified_claims(token).cluster
        self._address, self._token, self._timeout = address, token, timeout
        self._context = client_context(ca_path=ca_path)
        self._max_frame = max_frame_bytes
        self.resume_timeout_s, self.resend_after_s = resume_timeout_s, resend_after_s
        # the switch's settings of the same names, for its link to a peer switch
        self.ping_interval_s, self.io_timeout_s = ping_interval_s, io_timeout_s
        self._sent: defaultdict[str, int] = defaultdict(int)
        self._estimate: LinkEstimate | None = None
        # the link's decisions, the writer's and the reader's, under `_cond`
        self._cond = threading.Condition()
        self._state = LinkState(
            job_id=self.job_id,
            role=role,
            peer_role=peer_role,
            window_frames=window_frames,
            window_bytes=window_bytes,
            resend_after_s=resend_after_s,
            now=time.monotonic(),
        )
        self._failure: str | None = None  # why the link cannot go on
        self._closed = threading.Event()
        self._queues: defaultdict[str, queue.Queue[Data | None]] = defaultdict(
            lambda: queue.Queue(recv_queue_frames)
        )
        self._queues_lock = threading.Lock()
        # the receiving connection, for one thread at a time: the reader's, or a role's
        # thread in `recv` that reads for itself while the reader stands aside (`_next`)
        self._in_lock = threading.Lock()
        self._readers = threading.Condition()  # the reader stands aside on it
        self._waiting = 0  # role threads in `recv` waiting on a queue, not reading
        self._read_by_role_at = -math.inf  # when a role's thread last read for itself
        self._reader_wanted = False  # a role's thread asks the reader to read
        # what a role's thread met on the receiving connection and leaves to the reader
        # (its end, an error, a frame that ends the link): (event, the error)
        self._in_trouble: tuple[Event, Exception | None] | None = None
        self._room_waiters = 0  # senders waiting for room in the window
        self._reads = 0  # data frames read by the role's threads in `recv`
        # one each: a connection's silence is its own, whatever the other one hears
        self._out_beat, self._in_beat = self._heartbeat(), self._heartbeat()
        self._out = self._open(Direction.SEND)
        try:
            self._in = self._open(Direction.RECV)
        except BaseException:
            self._out.close()
            raise
        # the sending connection, for one thread at a time: the writer's, or the thread
        # that sends a frame (or owes a receipt) and writes it while the writer is idle
        self._outlet = Outlet(wake=self._wake_writer)
        self._outlet.attach(self._out)
        self._closing = False  # close() waits for every frame to be written
        self._reader = threading.Thread(target=self._read_loop, name=f"link-{role}", daemon=True)
        self._writer = threading.Thread(
            target=self._write_loop, name=f"link-{role}-out", daemon=True
        )
        self._reader.start()
        self._writer.start()

    # connections

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(
            interval_s=self.ping_interval_s, timeout_s=self.io_timeout_s, now=time.monotonic()
        )

    def _hear(self, stream: FrameStream, beat: Heartbeat) -> None:
        """Note the bytes heard on `stream`; OSError when its pings went unanswered."""
        beat.heard(stream.last_read_at)
        if beat.gone(time.monotonic()):
            raise TimeoutError(f"no answer to a ping in {self.io_timeout_s:.0f} s")

    def _ping_if_due(self, stream: FrameStream, beat: Heartbeat) -> None:
        """Ping the switch when the interval is up (by the connection's own thread)."""
        ping = beat.ping_due(time.monotonic())
        if ping is not None:
            stream.write(Ping(ping))

    def _open(self, direction: Direction) -> FrameStream:
        raw = socket.create_connection(self._address, timeout=self._timeout)
        tune(raw)
        try:
            sock = self._context.wrap_socket(raw, server_hostname=self.cluster)
            check_peer(sock, expected_cluster=self.cluster, revoked=frozenset())
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
            # the connection ended in the middle of the handshake (a cut path, a switch
            # going down): a failure of the network, dialled again, not a refusal
            raw.close()
            raise
        except (ssl.SSLError, PeerRejected) as exc:
            raw.close()
            raise LinkRefused(f"TLS to the switch failed: {exc}") from exc
        stream = FrameStream(sock, Connection(Side.CLIENT, max_body=self._max_frame))
        hello = Hello(self._token, self.job_id, self.role, self.peer_role, direction)
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

    def _reopen(self, direction: Direction, why: object) -> FrameStream | None:
        """Dial the switch again until it takes us back; None when the link cannot go on."""
        log.warning("link %s/%s: %s connection lost (%s)", self.job_id, self.role, direction, why)
        deadline = time.monotonic() + self.resume_timeout_s
        backoff = 0.05
        while not self._closed.is_set():
            try:
                stream = self._open(direction)
            except LinkRefused as exc:
                # the switch may not have seen our old connection go yet; else it is final
                if "already connected" not in str(exc):
                    self._fail(f"the switch refused to resume the link: {exc}")
                    return None
            except OSError:
                pass
            else:
                log.info("link %s/%s: %s connection resumed", self.job_id, self.role, direction)
                return stream
            if time.monotonic() > deadline:
                self._fail(f"the switch did not come back within {self.resume_timeout_s:.0f} s")
                return None
            self._closed.wait(backoff)
            backoff = min(backoff * 2, 1.0)
        return None

    def _fail(self, reason: str) -> None:
        log.warning("link %s/%s: %s", self.job_id, self.role, reason)
        with self._cond:
            self._failure = self._failure or reason
            self._cond.notify_all()
        self._wake_receivers()
        self._want_reader()

    # receiving

    def _queue(self, channel: str) -> queue.Queue[Data | None]:
        with self._queues_lock:
            return self._queues[channel]

    def _read_loop(self) -> None:
        try:
            while not self._closed.is_set() and self._failure is None:
                self._stand_aside()
                with self._in_lock:
                    if not self._read_one():
                        return
        except ProtocolError as exc:
            self._fail(f"receiving stopped: {exc}")
        finally:
            self._wake_receivers()

    def _stand_aside(self) -> None:
        """Leave the receiving connection to the role's threads while they read it
        themselves (`reader_waits`); return when this thread is to read."""
        with self._readers:
            while not self._closed.is_set() and self._failure is None:
                wait = reader_waits(
                    time.monotonic(),
                    role_read_at=self._read_by_role_at,
                    role_reading=self._in_lock.locked(),
                    asked=self._reader_wanted,
                )
                if wait is None:
                    self._reader_wanted = False
                    return
                self._readers.wait(wait)

    def _want_reader(self) -> None:
        with self._readers:
            self._reader_wanted = True
            self._readers.notify_all()

    def _read_one(self) -> bool:
        """Read one event and act on it, or on what a role's thread left (the caller
        holds `_in_lock`); False when the link is done."""
        lost: Exception | None = None
        event: Event | None
        if self._in_trouble is not None:
            (event, lost), self._in_trouble = self._in_trouble, None
        else:
            try:
                self._ping_if_due(self._in, self._in_beat)
                event = self._in.read_event(idle=self._reader_idle)
            except (OSError, ProtocolError) as exc:
                if self._closed.is_set():
                    return False
                event, lost = CLOSED, exc
        if isinstance(event, Error):
            self._fail(f"the switch ended the link: {event.reason}")
            return False
        if event is CLOSED:
            if self._closed.is_set():
                return False
            self._in.close()
            stream = self._reopen(Direction.RECV, lost or "end of stream")
            if stream is None:
                return False
            self._in, self._in_beat = stream, self._heartbeat()
            with self._cond:  # what was on its way to us may be gone: ask for it
                self._state.receiving_resumed()
                self._cond.notify_all()
            return True
        self._handle(event)
        if isinstance(event, Data) and self._waiting and role_reads(len(event.body)):
            # handed to a role's thread that waited for it: it will be back for the
            # next, and reads it itself if this thread stands aside
            with self._readers:
                self._read_by_role_at = time.monotonic()
        return True

    def _handle(self, event: Event | None) -> None:
        """Act on a frame from the switch (ProtocolError for one it may not send)."""
        if isinstance(event, Data):
            self._take(event)
        elif isinstance(event, Receipt):
            self._receipt(event)
        elif isinstance(event, LinkReport):
            self._estimate = LinkEstimate(event.bandwidth_bytes_per_s, event.rtt_s, event.samples)
        elif not isinstance(event, Ack):  # an Ack: a ping's answer, heard as every byte is
            raise ProtocolError(f"the switch sent a {type(event).__name__} frame")

    def _reader_idle(self) -> float:
        """While nothing is left to read: ping when due, give up a silent switch; the
        seconds to wait for bytes before asking again."""
        self._hear(self._in, self._in_beat)
        self._ping_if_due(self._in, self._in_beat)
        return self._in_beat.wait_s(time.monotonic())

    def _take(self, frame: Data) -> None:
        """Deliver the next frame in order; drop a duplicate; ask again after a gap."""
        with self._cond:
            owed_at = self._state.receipt_at
            taken = self._state.take(frame, time.monotonic())
            sooner = self._state.receipt_at != owed_at
        # the writer waits for its next receipt: woken only when that comes sooner, not
        # for each frame (a wake-up it has nothing to do for, in the way of the role's),
        # and not even then when the receipt is due and this thread can write it itself
        if sooner:
            self._write_or_wake(receipt_sooner=True)
        if taken is not Taken.DELIVER:
            return
        q = self._queue(frame.channel)
        while not self._closed.is_set():
            try:
                q.put(frame, timeout=min(1.0, self.ping_interval_s))
                return
            except queue.Full:
                # the switch hears from us meanwhile: it would cut a silent connection
                with contextlib.suppress(OSError, ProtocolError):
                    self._ping_if_due(self._in, self._in_beat)
                # the role reads slowly: tell the sender we are here, not gone
                with self._cond:
                    self._state.still_here()
                    self._cond.notify_all()

    def _receipt(self, receipt: Receipt) -> None:
        with self._cond:
            resend = self._state.take_receipt(receipt, time.monotonic())
            # the writer is woken for a resend; senders for the room a receipt frees
            if resend or self._room_waiters or self._closing:
                self._cond.notify_all()
        if resend:
            log.info(
                "link %s/%s: the peer asks again from frame %d",
                self.job_id,
                self.role,
                receipt.next_seq,
            )

    def _wake_receivers(self) -> None:
        with self._queues_lock:
            queues = list(self._queues.values())
        for q in queues:
            with contextlib.suppress(queue.Full):
                q.put_nowait(None)

    # sending

    def _await_work(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds for something to write (a frame, a receipt, what
        a direct write left); False when the link is done."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self._failure is not None:
                    return False
                now = time.monotonic()
                if self._closed.is_set():
                    self._state.receipt_now(now)  # the last word on what came is not held
                outlet = self._outlet
                if self._state.has_work(now) or outlet.rest is not None or outlet.broken:
                    return True
                if self._closed.is_set():
                    return False
                if now >= deadline:
                    return True
                wake = deadline
                if self._state.receipt_at is not None:  # a receipt held back a little
                    wake = min(wake, self._state.receipt_at)
                self._cond.wait(timeout=min(1.0, max(wake - now, 0.0)))

    def _write_loop(self) -> None:
        while self._await_work(self._out_beat.wait_s(time.monotonic())):
            with self._outlet.lock:
                if not self._write_step():
                    return

    def _write_step(self) -> bool:
        """Hear the switch, ping it when due, write what is next, in order (a frame before
        a receipt: a reply of the role is not held up by it); the caller holds the outlet's
        lock, under which alone the next frame is taken, so that a frame written directly
        never overtakes it. False when the link is done."""
        try:
            self._outlet.finish(while_blocked=self._hear_out, poll_s=0.2)
            self._tend_out()
        except (OSError, ProtocolError) as exc:
            return self._resume_sending(exc)
        with self._cond:
            now = time.monotonic()
            if not self._state.has_work(now):
                return True
            writes = self._state.next_to_write(now)
        for frame in (writes.frame, writes.receipt):
            while frame is not None:
                try:
                    self._out.write(frame, while_blocked=self._hear_out, poll_s=0.2)
                    break
                except (OSError, ProtocolError) as exc:
                    if not self._resume_sending(exc):
                        return False
                    if isinstance(frame, Data):
                        break  # it is among those
        return True

    def _wake_writer(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _write_or_wake(self, *, receipt_sooner: bool = False) -> None:
        """Write what is next on this thread while the writer is idle (outlet.py), else
        wake the writer for it; with `receipt_sooner` (a receipt is owed sooner than the
        writer knows), wake it too while that receipt is still owed."""
        written = self._outlet.try_write(self._take_direct)
        if written is None or (receipt_sooner and self._state.receipt_at is not None):
            self._wake_writer()

    def _take_direct(self) -> list[Data | Receipt] | None:
        with self._cond:
            if self._failure is not None or self._closed.is_set():
                return None
            writes = self._state.take_direct(time.monotonic())
            if writes is None:
                return None
            if self._closing:
                self._cond.notify_all()  # all written, maybe
        return [frame for frame in (writes.frame, writes.receipt) if frame is not None]

    def _hear_out(self) -> None:
        """Take what the switch sent on the sending connection (its pings' answers, or
        word that it is there while it waits on the link beyond), without writing."""
        while (event := self._out.read_event(block=False)) is not None:
            if event is CLOSED or isinstance(event, Error):
                raise OSError(f"the switch closed: {getattr(event, 'reason', 'end of stream')}")
            if not isinstance(event, Ack):
                raise ProtocolError(f"the switch sent a {type(event).__name__} frame")
        self._hear(self._out, self._out_beat)

    def _tend_out(self) -> None:
        """Between frames: hear the switch, ping it when due."""
        self._hear_out()
        self._ping_if_due(self._out, self._out_beat)

    def _resume_sending(self, why: object) -> bool:
        """Dial the sending connection again; the new one starts with every unacknowledged
        frame and a receipt. False when the link cannot go on."""
        self._out.close()
        stream = self._reopen(Direction.SEND, why)
        if stream is None:
            return False
        self._out, self._out_beat = stream, self._heartbeat()
        self._outlet.attach(stream)
        with self._cond:
            self._state.sending_resumed()
        return True

    def send(self, channel: str, payload: Payload) -> None:
        """Send a payload to the peer on `channel`; returns once it is kept for resending
        (a copy: the caller may reuse it), waiting while the window is full."""
        if isinstance(payload, torch.Tensor):
            body, spec = tensor_to_wire(payload)
            self.send_encoded(channel, body, spec)
        else:
            self.send_encoded(channel, payload, None)

    def send_encoded(self, channel: str, body: Buffer, tensor: TensorSpec | None) -> None:
        """Send a body as it is; `tensor` describes it (a codec's output travels untouched)."""
        kept = _resend_copy(body)
        with self._cond:
            if not self._state.has_room(len(kept)):
                self._want_reader()  # the receipts that free room may wait unread
            self._room_waiters += 1
            self._cond.wait_for(
                lambda: (
                    self._closed.is_set()
                    or self._failure is not None
                    or self._state.has_room(len(kept))
                )
            )
            self._room_waiters -= 1
            if self._closed.is_set() or self._failure is not None:
                raise LinkClosed(f"{channel}: {self._failure or 'closed'}")
            self._state.push(channel, kept, tensor)
            self._sent[channel] += len(kept)
        self._write_or_wake()

    def recv_frame(self, channel: str, timeout: float | None = None) -> Data:
        """The next frame from the peer on `channel`, with its tensor spec and codec."""
        q = self._queue(channel)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with contextlib.suppress(queue.Empty):
                item = q.get_nowait()
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"nothing on channel {channel!r} within {timeout} s")
            with contextlib.suppress(queue.Empty):
                item = self._next(q, deadline, left)
                break
        if item is None:
            q.put(None)  # keep waking the next receiver
            raise LinkClosed(f"{channel}: {self._failure or 'closed'}")
        return item

    def _next(
        self, q: queue.Queue[Data | None], deadline: float | None, left: float | None
    ) -> Data | None:
        """The next item of `q`, read from the receiving connection on this thread while
        no other thread reads it (the reader stands aside while a role's thread reads for
        itself: `_stand_aside`), else put there by the thread that does; queue.Empty when
        none came (in `left` seconds, or before this thread stopped reading)."""
        with self._readers:  # counted first: a thread that stops reading calls the reader
            self._waiting += 1
        trouble = self._in_trouble is not None or self._closed.is_set() or self._failure
        if trouble or not self._in_lock.acquire(blocking=False):
            try:
                return q.get(timeout=left)
            finally:
                with self._readers:
                    self._waiting -= 1
        with self._readers:
            self._waiting -= 1
        last = 0
        try:
            last = self._read_for(q, deadline)
        finally:
            self._in_lock.release()
            with self._readers:
                self._read_by_role_at = time.monotonic()
                # the reader's turn: what this thread leaves behind (a lost connection,
                # a thread waiting), or the next large frame to read ahead
                if self._waiting or self._in_trouble is not None or not role_reads(last):
                    self._reader_wanted = True
                    self._readers.notify_all()
        return q.get_nowait()

    def _read_for(self, q: queue.Queue[Data | None], deadline: float | None) -> int:
        """Read and act on frames on the calling role's thread, as the reader does, until
        `q` holds one, the deadline passes, or something is the reader's to deal with (a
        lost connection, the link's end: `_in_trouble`); the body size of the last data
        frame read. The caller holds `_in_lock`."""
        stream, beat = self._in, self._in_beat
        last = 0
        while q.empty() and not self._closed.is_set() and self._failure is None:
            event: Event | None = None
            try:
                event = stream.read_event(block=False)
                if event is None:  # nothing more now: the reader's idle duties, then wait
                    self._hear(stream, beat)
                    self._ping_if_due(stream, beat)
                    now = time.monotonic()
                    wait = beat.wait_s(now)
                    if deadline is not None:
                        if now >= deadline:
                            return last
                        wait = min(wait, deadline - now)
                    stream.wait_readable(max(wait, 0.001))
                    continue
                if event is not CLOSED and not isinstance(event, Error):
                    self._handle(event)
                    if isinstance(event, Data):
                        self._reads += 1
                        last = len(event.body)
                    continue
            except (OSError, ProtocolError) as exc:
                self._in_trouble = (CLOSED if event is None else event, exc)
                return last
            self._in_trouble = (event, None)
            return last
        return last

    def recv(self, channel: str, timeout: float | None = None) -> Payload:
        """Next payload from the peer on `channel`; raises TimeoutError or LinkClosed."""
        frame = self.recv_frame(channel, timeout)
        if frame.tensor is None:
            return bytes(frame.body)
        if frame.tensor.codec is not None:
            raise TypeError(f"channel {channel!r} carries {frame.tensor.codec}; use recv_frame")
        return tensor_from_wire(frame.body, frame.tensor)

    def bytes_sent(self) -> dict[str, int]:
        """Payload bytes sent so far, per channel (each frame once, resending aside)."""
        return dict(self._sent)

    def direct_writes(self) -> int:
        """Frames and receipts written by the threads that had them (a sending role's, the
        reader's), without waking the writer thread."""
        return self._outlet.direct

    def direct_reads(self) -> int:
        """Data frames the role's threads read from the switch themselves, in `recv`,
        handed over by no reader thread."""
        return self._reads

    def unacknowledged(self) -> int:
        """Frames sent that the peer role has not acknowledged yet."""
        with self._cond:
            return len(self._state.window)

    def link_estimate(self) -> LinkEstimate | None:
        """The switches' latest measurement of the link (None until they report one)."""
        return self._estimate

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued (within `timeout`), say goodbye, close both connections;
        blocked receivers get LinkClosed."""
        with self._cond:
            self._closing = True
            self._cond.wait_for(
                lambda: self._failure is not None or self._state.all_written(),
                timeout,
            )
            self._closed.set()
            self._cond.notify_all()
        self._writer.join(timeout=timeout)
        if not self._writer.is_alive():  # the connection is this thread's alone now
            with self._outlet.lock, contextlib.suppress(OSError, ProtocolError):
                self._outlet.finish(poll_s=0.2)  # a direct write's last bytes first
                self._out.write(Error(GOODBYE))  # no resume: the switch frees the role now
        for stream in (self._out, self._in):
            cut(stream.sock)
        self._want_reader()  # from standing aside, to see the link closed
        self._reader.join(timeout=5)
        self._out.close()
        # a role's thread reading it sees the end of the stream first, and lets go
        locked = self._in_lock.acquire(timeout=5)
        self._in.close()
        if locked:
            self._in_lock.release()
        self._wake_receivers()

    def __enter__(self) -> SwitchLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

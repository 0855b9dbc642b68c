"""Peer switches: dialling, the fair queue, the resend window, receiving.

A peer's frames go out on the connection this switch dialled, written by its sender
thread (`PeerSending`) in turn from the jobs' queues, or, when nothing is queued and the
link plays no shaper, by the thread that read the frame from a worker (`_send_direct`,
outlet.py): one thread hand-off fewer per small frame. Every use of that connection,
acknowledgements read included, holds the outbound's outlet lock.
"""

from __future__ import annotations

import collections
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Generic

from workers.switch.core import (
    PING_POLL_S,
    POLL_S,
    Address,
    K,
    T,
    log,
)
from workers.switch.doors import Doors
from workers.switch.outlet import Drained
from workers.switch.protocol import (
    CLOSED,
    Ack,
    Connection,
    Data,
    Error,
    Event,
    PeerHello,
    Ping,
    ProtocolError,
    Receipt,
    Routed,
    Side,
    Welcome,
)
from workers.switch.rules import (
    AckSchedule,
    LinkMeter,
    ResendWindow,
    Verdict,
    WindowError,
    peer_frame_is_fresh,
    peer_frame_verdict,
    writes_directly,
)
from workers.switch.shaper import Shaper
from workers.switch.stream import FrameStream, cut, tune
from workers.switch.tls import (
    PeerRejected,
    check_peer,
    validate_cluster_name,
)


class FairQueue(Drained, Generic[K, T]):
    """A bounded FIFO per key, served in turn: a busy key never starves the others. The
    peer's connection's writer thread drains it; past it, while it is empty, the threads
    that have frames write them on the connection themselves (its `outlet`)."""

    def __init__(self, per_key: int) -> None:
        super().__init__()
        self.per_key = per_key
        self._queues: collections.OrderedDict[K, collections.deque[T]] = collections.OrderedDict()

    def put(self, key: K, item: T, timeout: float) -> bool:
        """Queue `item` under `key`; False when its queue stayed full for `timeout`."""
        return self._put_when(
            lambda: len(self._queues.get(key, ())) < self.per_key,
            lambda: self._queues.setdefault(key, collections.deque()).append(item),
            timeout,
        )

    def pop(self) -> T | None:
        """The head of the next key's queue in turn, or None when all are empty."""
        with self._cond:
            if not self._queues:
                return None
            key, items = self._queues.popitem(last=False)
            item = items.popleft()
            if items:
                self._queues[key] = items  # to the back of the line
            self._cond.notify_all()
            return item

    def _ready(self) -> bool:
        return bool(self._queues)

    def __bool__(self) -> bool:
        with self._cond:
            return bool(self._queues)

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def keys(self) -> int:
        """How many keys have something queued."""
        with self._cond:
            return len(self._queues)


@dataclass
class PeersIn:
    """Connections peers dialled, by (cluster, session), and how many frames each
    session's stream has delivered here (its frames below that number are duplicates)."""

    streams: dict[tuple[str, str], FrameStream] = field(default_factory=dict)
    taken: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class Outbound:
    """What a switch holds for one peer it sends to."""

    cluster: str
    address: Address
    queue: FairQueue[str, tuple[Routed, float]]
    window: ResendWindow[Routed]
    meter: LinkMeter = field(default_factory=LinkMeter)
    pending: tuple[Routed, float] | None = None  # taken from the queue, waiting for room
    stream: FrameStream | None = None
    # the connection's sending, once its window's frames went again (under the outlet's lock)
    sending: PeerSending | None = None
    connected: threading.Event = field(default_factory=threading.Event)
    connections: int = 0


class Peers(Doors):
    """Peer switches: dialling them and sending in turn, receiving from them."""

    def add_peer(self, cluster: str, address: Address) -> None:
        """Start sending to (and accepting) the peer switch of `cluster` at `address`."""
        validate_cluster_name(cluster)
        cfg = self.config
        with self._lock:
            cfg.peers[cluster] = address
            if cluster in self._outbound:
                self._outbound[cluster].address = address
                return
            window: ResendWindow[Routed] = ResendWindow(
                max_frames=cfg.resend_frames, max_bytes=cfg.resend_bytes
            )
            out = Outbound(cluster, address, FairQueue(cfg.queue_frames), window)
            self._outbound[cluster] = out
        if not self._stop.is_set() and self._doors.listeners:
            self._spawn(self._peer_sender, out, name=f"to-{cluster}")

    def wait_connected(self, cluster: str, timeout: float) -> bool:
        """Wait until the connection to `cluster`'s switch is up."""
        return self._outbound[cluster].connected.wait(timeout)

    def peer_connections(self, cluster: str) -> int:
        """How many times this switch has connected to `cluster` (1 + reconnections)."""
        return self._outbound[cluster].connections

    def unacked_frames(self, cluster: str) -> int:
        """Frames sent (or being sent) to `cluster`'s switch that it has not acknowledged."""
        return len(self._outbound[cluster].window)

    def link_estimate(self, cluster: str) -> tuple[float, float, int] | None:
        """(bandwidth in bytes/s, round trip in s, samples) measured to `cluster`'s switch."""
        return self._outbound[cluster].meter.estimate()

    def _serve_peer(self, raw: socket.socket, address: Address) -> None:
        stream = self._open_door(raw, "peer", address)
        if stream is None:
            return
        sock = stream.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            hello = stream.read_event()
            if not isinstance(hello, PeerHello):
                self._refuse(sock, "peer", address, "expected a peer hello", "protocol", stream)
                return
            cluster, session = hello.cluster, hello.session
            if cluster not in self.config.peers:
                self._refuse(sock, "peer", address, f"unknown cluster {cluster!r}", "name", stream)
                return
            try:
                identity = check_peer(
                    sock, expected_cluster=cluster, revoked=self._revocation.revoked
                )
            except PeerRejected as exc:
                self._refuse(sock, "peer", address, str(exc), "name", stream)
                return
            sock.settimeout(self.config.io_timeout_s)
            with self._lock:
                self._doors.peers[stream] = identity
                # a newer connection of the same peer session replaces a half-dead older one
                older = self._peers_in.streams.get((cluster, session))
                self._peers_in.streams[(cluster, session)] = stream
                if older is not None:
                    self._doors.peers.pop(older, None)
            if older is not None:
                cut(older.sock)
            stream.write(Welcome())
            self._authenticated()
            log.info("switch %s: peer %s connected from %s", self.cluster, cluster, address)
            self._receive_from_peer(stream, cluster, session, hello.resume_from)
        except (OSError, ProtocolError) as exc:
            if not self._stop.is_set():
                log.info("switch %s: peer connection from %s ended: %s", self.cluster, address, exc)
        finally:
            with self._lock:
                self._doors.peers.pop(stream, None)
                streams = self._peers_in.streams
                for key in [k for k, v in streams.items() if v is stream]:
                    del streams[key]
            stream.close()

    def _receive_from_peer(
        self, stream: FrameStream, cluster: str, session: str, first: int
    ) -> None:
        """Take a peer's frames, acknowledge them (`AckSchedule`: after the shaper's
        delay, the way back of the link it plays, or a few small frames at once), and cut
        a peer that sends nothing, not even pings."""
        shaper = self.config.shaper
        acks = AckSchedule(shaper.delay_ms / 1000 if shaper is not None else 0.0)
        stall = self.config.io_timeout_s

        def flush() -> float | None:
            """Write the acknowledgements due; the seconds to the next, or to the stall."""
            now = time.monotonic()
            for ack in acks.due(now):
                stream.write(ack)
            if now - stream.last_read_at > stall:
                raise TimeoutError(f"peer {cluster} sent nothing for {stall:.0f} s")
            until_stall = stall - (now - stream.last_read_at)
            next_at = acks.next_at()
            return until_stall if next_at is None else min(next_at - now, until_stall)

        key = (cluster, session)
        while not self._stop.is_set():
            frame = stream.read_event(idle=flush)
            if frame is CLOSED:
                return
            if isinstance(frame, Ping):
                acks.pinged(time.monotonic(), frame.id)
                flush()
                continue
            if not isinstance(frame, Data | Receipt):
                raise ProtocolError("peers send only data frames, receipts and pings")
            count = acks.count
            with self._lock:
                fresh = peer_frame_is_fresh(first, count, self._peers_in.taken.get(key))
                if fresh:
                    self._peers_in.taken[key] = first + count + 1
            if fresh:
                self._take_from_peer(frame, cluster)
            acks.took(time.monotonic(), len(frame.body) if isinstance(frame, Data) else 0)
            flush()

    def _take_from_peer(self, frame: Routed, cluster: str) -> None:
        key = (frame.job_id, frame.dst_role)
        with self._lock:
            verdict, why = peer_frame_verdict(
                frame,
                cluster,
                self.cluster,
                self._jobs.placement.get(frame.job_id),
                connected=key in self._jobs.roles,
                ended=key in self._jobs.ended,
            )
        if verdict is Verdict.ENDED:
            # late or resent frames of an attempt that is over here: acknowledged, dropped
            log.info(
                "switch %s: dropped a late frame of job %s for %s: its attempt has ended",
                self.cluster,
                frame.job_id,
                frame.dst_role,
            )
            self._meters.refused.labels("ended").inc()
        elif verdict is Verdict.PLACEMENT:
            log.warning(
                "switch %s: dropped a frame of job %s from cluster %s: %s",
                self.cluster,
                frame.job_id,
                cluster,
                why,
            )
            self._meters.refused.labels("placement").inc()
        elif self._deliver(frame, None, peer=None if verdict is Verdict.DELIVER else cluster):
            self._meters.count(frame, "from_peer")

    # peers: sending

    def _connect_peer(self, out: Outbound) -> FrameStream:
        raw = socket.create_connection(out.address, timeout=self.config.handshake_timeout_s)
        tune(raw)
        with self._lock:
            context = self._peer_client_ctx
        try:
            sock = context.wrap_socket(raw, server_hostname=out.cluster)
            identity = check_peer(
                sock, expected_cluster=out.cluster, revoked=self._revocation.revoked
            )
        except BaseException:
            raw.close()
            raise
        stream = FrameStream(sock, Connection(Side.CLIENT, max_body=self.config.max_frame_bytes))
        stream.write(PeerHello(self.cluster, self._session, out.window.acked))
        answer = stream.read_event()
        if isinstance(answer, Error):
            stream.close()
            raise PeerRejected(f"peer refused us: {answer.reason}")
        if not isinstance(answer, Welcome):
            stream.close()
            raise ProtocolError("peer did not welcome us")
        sock.settimeout(self.config.io_timeout_s)
        with self._lock:
            self._doors.peers[stream] = identity
        return stream

    def _send_direct(self, out: Outbound, frame: Routed) -> bool:
        """Write a worker's frame to the peer on the thread that read it, when nothing
        waits ahead of it and the link is not shaped (outlet.py); False: queue it."""
        shaped = self.config.shaper is not None and self.config.shaper.shapes

        def take() -> list[Routed] | None:
            sending = out.sending
            return None if sending is None else sending.send_direct(frame, shaped)

        # False: the connection broke, the frame is in the window and goes again
        if out.queue.outlet.try_write(take) is None:
            return False
        self._meters.count(frame, "to_peer")
        self._meters.direct["to_peer"].inc()
        return True

    def _peer_sender(self, out: Outbound) -> None:
        backoff = self.config.backoff_initial_s
        current: list[PeerSending] = []

        def sleep(seconds: float) -> None:
            # the shaper's pauses read the peer's answers as they come, so that
            # acknowledgements are seen (and timed) when they arrive
            if current:
                current[0].sleep_reading(seconds)
            else:
                time.sleep(seconds)

        config = self.config.shaper
        shaper = Shaper(config, sleep=sleep) if config is not None else None
        while not self._stop.is_set():
            try:
                stream = self._connect_peer(out)
            except (OSError, ProtocolError, PeerRejected, ValueError) as exc:
                log.warning(
                    "switch %s: cannot reach peer %s at %s: %s",
                    self.cluster,
                    out.cluster,
                    out.address,
                    exc,
                )
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self.config.backoff_max_s)
                continue
            backoff = self.config.backoff_initial_s
            out.stream = stream
            out.connections += 1
            out.connected.set()
            try:
                current[:] = [PeerSending(self, out, stream, shaper)]
                current[0].run()
            except (OSError, ProtocolError) as exc:
                if not self._stop.is_set():
                    log.warning(
                        "switch %s: link to %s dropped (%s); %d frames to resend",
                        self.cluster,
                        out.cluster,
                        exc,
                        len(out.window),
                    )
            finally:
                current.clear()
                out.connected.clear()
                out.stream = None
                with self._lock:
                    self._doors.peers.pop(stream, None)
                stream.close()


class PeerSending:
    """One connection's worth of sending to a peer: the window's frames again, then new
    ones in turn from the jobs' queues, reading acknowledgements and pings' answers."""

    def __init__(
        self, switch: Peers, out: Outbound, stream: FrameStream, shaper: Shaper | None
    ) -> None:
        self.switch, self.out, self.stream, self.shaper = switch, out, stream, shaper
        self.cfg = switch.config
        self.base = out.window.acked  # the hop number of this connection's first frame
        self.sent = 0  # frames sent on this connection
        self.pings = 0
        self.ping_at: float | None = None  # when the outstanding ping was made
        self.ping_due: float | None = None  # when it leaves (the played link's delay)
        self.ping_sent: float | None = None  # when it left
        self.last_ping = time.monotonic()
        self.delay = shaper.config.delay_ms / 1000 if shaper is not None else 0.0

    def sleep_reading(self, seconds: float) -> None:
        """Wait `seconds`, taking the peer's answers meanwhile."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.stream.wait_readable(left):
                self.take_all()

    def take(self, event: Event | None) -> None:
        if event is None:
            return
        if event is CLOSED or isinstance(event, Error):
            raise OSError(f"peer closed the link: {getattr(event, 'reason', 'end of stream')}")
        if not isinstance(event, Ack) or event.count > self.sent:
            raise ProtocolError("bad acknowledgement")
        now = time.monotonic()
        window = self.out.window
        before = window.nbytes
        try:
            window.ack(self.base + event.count)
        except WindowError as exc:
            raise ProtocolError(f"bad acknowledgement: {exc}") from None
        unacked = len(window) + len(self.out.queue)
        self.out.meter.acknowledged(now, before - window.nbytes, unacked)
        if event.ping is not None and event.ping == self.pings and self.ping_sent is not None:
            # from the ping leaving, plus the played link's delay it spent before (the
            # time it waited behind a frame being written is no part of the link's)
            assert self.ping_at is not None
            held = min(self.ping_sent - self.ping_at, self.delay)
            self.out.meter.round_trip(now - self.ping_sent + held)
            self.ping_at = self.ping_sent = None

    def take_all(self) -> None:
        while (event := self.stream.read_event(block=False)) is not None:
            self.take(event)
        if self.ping_at is not None and time.monotonic() - self.ping_at > self.cfg.io_timeout_s:
            raise OSError(f"peer stalled: no answer to a ping in {self.cfg.io_timeout_s:.0f} s")

    def send(self, frame: Routed | Ping) -> None:
        # A write blocked on a peer that takes no more bytes still reads: a peer that
        # closed (or a cut that half-closed the link) ends the connection at once, not
        # after io_timeout_s with every frame behind it held up.
        shaper = None if isinstance(frame, Ping) else self.shaper
        self.stream.write(frame, shaper, while_blocked=self.take_all, poll_s=POLL_S)

    def ping_if_due(self) -> float:
        """Make a ping each `ping_interval_s`, send it once it has spent the played link's
        delay (without holding up the frames meanwhile); the seconds to wait at most."""
        now = time.monotonic()
        if self.ping_at is None and now - self.last_ping >= self.cfg.ping_interval_s:
            self.pings += 1
            self.ping_at = self.last_ping = now
            self.ping_due = now + self.delay
        if self.ping_due is not None and now >= self.ping_due:
            self.ping_due = None
            self.ping_sent = time.monotonic()
            self.send(Ping(self.pings))
        if self.ping_due is not None:
            return max(0.0, self.ping_due - now)
        # while a ping is out, look for its answer often: it times the round trip
        return PING_POLL_S if self.ping_at is not None else POLL_S

    def run(self) -> None:
        """Send until the connection fails (OSError, ProtocolError) or the switch stops:
        the window's frames again, then each frame in turn, each step holding the outlet's
        lock; between frames, the threads that have them may write on it (`send_direct`)."""
        out, stop, outlet = self.out, self.switch._stop, self.out.queue.outlet
        with outlet.lock:
            for _, frame in out.window.replay():
                self.sent += 1  # first: its acknowledgement may come while it is written
                self.send(frame)
            out.sending = self
            outlet.attach(self.stream)
        try:
            while not stop.is_set():
                with outlet.lock:
                    wait = self.step()
                if wait is not None:
                    out.queue.wait(wait)
        finally:
            with outlet.lock:
                out.sending = None
                outlet.attach(None)

    def step(self) -> float | None:
        """Send the next frame in turn (the caller holds the outlet's lock); when there is
        none, the seconds to wait for one (the next ping's, or its answer's, time)."""
        out = self.out
        out.queue.outlet.finish(while_blocked=self.take_all, poll_s=POLL_S)
        self.take_all()
        wait = self.ping_if_due()
        if out.pending is None:
            # taken under the lock: no frame written directly overtakes it (outlet.py)
            out.pending = out.queue.pop()
            if out.pending is None:
                return wait
        frame, queued_at = out.pending
        nbytes = len(frame.body) if isinstance(frame, Data) else 0
        if not out.window.has_room(nbytes):
            # full: wait for the peer to catch up, a poll at a time
            self.stream.wait_readable(min(wait, POLL_S))
            return None
        out.pending = None  # it stays with the outbound (not this connection) till here
        out.window.push(frame, nbytes)
        if self.shaper is not None:
            self.shaper.hold(queued_at)
        self.sent += 1
        self.send(frame)
        self.switch._meters.count(frame, "to_peer")
        return None

    def send_direct(self, frame: Routed, shaped: bool) -> list[Routed] | None:
        """A frame to write now on the thread that has it, numbered in the window, or None
        to queue it (`rules.writes_directly`); the caller holds the outlet's lock."""
        out = self.out
        nbytes = len(frame.body) if isinstance(frame, Data) else 0
        try:
            self.take_all()  # the acknowledgements come in: room in the window, the meter
        except (OSError, ProtocolError) as exc:
            out.queue.outlet.fail(exc)
            return None
        queued = out.pending is not None or bool(out.queue)
        room = out.window.has_room(nbytes)
        if not writes_directly(nbytes, queued=queued, shaped=shaped, room=room):
            return None
        out.window.push(frame, nbytes)
        self.sent += 1
        return [frame]

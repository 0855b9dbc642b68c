"""The switch server: the only door of a cluster, one per cluster.

Blocking TLS sockets, one thread per connection (measured faster than asyncio
TLS here, and OpenSSL releases the GIL while it encrypts). Two listeners:

- workers of this cluster connect over TLS and present a job token; a worker
  opens one connection to send and one to receive, so that no TLS socket is
  ever read and written by two threads at once. A role whose connections drop
  without its goodbye may come back within `resume_grace_s` with the same token
  (its `SwitchLink` resends what the far role has not acknowledged, end to end).
  The link pings on both connections; the switch answers each ping (and says it is
  there while it waits on the link beyond), and cuts a worker connection it has
  heard nothing on for `io_timeout_s`: a path gone silent;
- peer switches connect with mutual TLS; each switch dials every peer and
  sends its frames on the connection it dialled, and reads acknowledgements
  back on it. Unacknowledged frames stay in a bounded `ResendWindow` and go
  again, in order, after a reconnection; the peer hello says where they start,
  so the receiver drops what it already took. Frames of each job wait in their
  own queue, served in turn, and a receiving switch never waits on one job's
  mailbox: a job whose role reads slowly holds up no other job on the link.
  A peer that takes no bytes, or answers no ping, for `io_timeout_s` is
  reconnected; the pings also time the link's round trip, and the
  acknowledged bytes its rate (`LinkMeter`), reported on /metrics per job and
  to the roles.

A switch runs from plain files (key, certificate, CA certificate) plus a CRL
source (any callable returning CRL PEM) and the job-token public key.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import queue
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Generic, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
    start_http_server,
)

from contract.jobtoken import (
    JobClaims,
    JobTokenError,
    load_job_token_public_key,
    verify_job_token,
)
from workers.private_files import write_private_file
from workers.switch.protocol import (
    CLOSED,
    DEFAULT_MAX_BODY_BYTES,
    Ack,
    Connection,
    Data,
    Direction,
    Error,
    Event,
    Hello,
    LinkReport,
    PeerHello,
    Ping,
    ProtocolError,
    Receipt,
    Routed,
    Side,
    Welcome,
)
from workers.switch.rules import LinkMeter, ResendWindow, WindowError, admit_worker
from workers.switch.shaper import Shaper, ShaperConfig
from workers.switch.stream import FrameStream, cut, tune
from workers.switch.tls import (
    CrlInfo,
    PeerIdentity,
    PeerRejected,
    check_peer,
    client_context,
    make_switch_key_and_csr,
    needs_renewal,
    read_crl,
    server_context,
    validate_cluster_name,
)

__all__ = ["Address", "Switch", "SwitchConfig", "admit_worker", "crl_from_file"]

log = logging.getLogger("nebula.switch")
Address = tuple[str, int]
RoleKey = tuple[str, str]  # (job, role)
POLL_S = 0.2
PING_POLL_S = 0.002
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


def crl_from_file(path: str | Path) -> Callable[[], bytes]:
    """A CRL source that re-reads `path` each time it is asked (picklable, for subprocesses)."""
    return functools.partial(Path.read_bytes, Path(path))


@dataclass
class SwitchConfig:
    """Everything a switch needs; all of it plain files, callables and addresses."""

    cluster: str
    key_path: Path
    cert_path: Path
    ca_path: Path
    crl_source: Callable[[], bytes]  # returns the current CRL PEM (a file, GET /pki/crl.pem, ...)
    job_token_public_key: Ed25519PublicKey | bytes  # the key or its PEM
    worker_address: Address = ("127.0.0.1", 0)
    peer_address: Address = ("127.0.0.1", 0)
    peers: dict[str, Address] = field(default_factory=dict)  # cluster name -> its peer address
    crl_refresh_s: float = 30.0  # revoked peers are cut within this long
    # after the last good CRL refresh, keep serving this long at most, then fail closed
    crl_grace_s: float = 300.0
    shaper: ShaperConfig | None = None  # on frames sent to peers (and their acknowledgements)
    max_frame_bytes: int = DEFAULT_MAX_BODY_BYTES
    queue_frames: int = 8  # per job waiting for a peer link
    mailbox_frames: int = 128  # per role; twice what a SwitchLink keeps unacknowledged
    resend_frames: int = 64
    resend_bytes: int = 256 * 1024 * 1024
    max_mailboxes: int = 4096
    # accepted connections, both doors together: in all, and from one source address
    max_connections: int = 1024
    max_connections_per_source: int = 64
    auth_timeout_s: float = 5.0  # a connection not through its hello by then is closed
    ended_roles_kept: int = 65536  # finished (job, role)s remembered, to drop late frames
    resume_grace_s: float = 30.0  # a role dropped without its goodbye may come back so long
    handshake_timeout_s: float = 10.0
    io_timeout_s: float = 5.0  # a peer that takes, sends or answers nothing so long is cut
    ping_interval_s: float = 1.0  # a ping to each peer this often
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 5.0
    metrics_address: Address | None = None  # serve Prometheus /metrics here when given
    # renew(csr_pem) -> cert_pem: when set, the switch renews its own certificate in time
    renew: Callable[[bytes], bytes] | None = None
    renew_check_s: float = 3600.0


class FairQueue(Generic[K, T]):
    """A bounded FIFO per key, served in turn: a busy key never starves the others."""

    def __init__(self, per_key: int) -> None:
        self.per_key = per_key
        self._queues: collections.OrderedDict[K, collections.deque[T]] = collections.OrderedDict()
        self._cond = threading.Condition()

    def put(self, key: K, item: T, timeout: float) -> bool:
        """Queue `item` under `key`; False when its queue stayed full for `timeout`."""
        with self._cond:
            if not self._cond.wait_for(
                lambda: len(self._queues.get(key, ())) < self.per_key, timeout
            ):
                return False
            self._queues.setdefault(key, collections.deque()).append(item)
            self._cond.notify_all()
            return True

    def get(self, timeout: float) -> T | None:
        """The head of the next key's queue in turn, or None after `timeout`."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._queues), timeout):
                return None
            key, items = self._queues.popitem(last=False)
            item = items.popleft()
            if items:
                self._queues[key] = items  # to the back of the line
            self._cond.notify_all()
            return item

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._queues.values())

    def keys(self) -> int:
        """How many keys have something queued."""
        with self._cond:
            return len(self._queues)


@dataclass
class _Role:
    """A job attempt's role on this switch: its live connections and what it holds."""

    claims: JobClaims
    peer_cluster: str | None  # where its peer role runs, when known
    connections: dict[Direction, FrameStream] = field(default_factory=dict)
    goodbye: bool = False  # it said it is done: no resume
    detached_at: float | None = None  # its connections dropped; it may come back


@dataclass
class _Jobs:
    """What the switch holds per job attempt: roles, mailboxes, and the attempts over."""

    roles: dict[RoleKey, _Role] = field(default_factory=dict)
    mailboxes: dict[RoleKey, queue.Queue[Routed]] = field(default_factory=dict)
    # (job, role)s whose attempt ended here, oldest first: their late frames are dropped
    ended: collections.OrderedDict[RoleKey, None] = field(default_factory=collections.OrderedDict)


@dataclass
class _Doors:
    """The connections both doors accepted."""

    listeners: list[socket.socket] = field(default_factory=list)
    open_by_source: collections.Counter[str] = field(default_factory=collections.Counter)
    # serving thread -> (deadline, a dup of its socket that can cut it at any stage)
    unauthenticated: dict[int, tuple[float, socket.socket]] = field(default_factory=dict)
    workers: set[FrameStream] = field(default_factory=set)
    peers: dict[FrameStream, PeerIdentity] = field(default_factory=dict)  # both ways


@dataclass
class _Revocation:
    """The CRL held, and whether the switch fails closed for want of a fresh one."""

    crl: CrlInfo | None = None
    revoked: frozenset[int] = frozenset()
    fresh_at: float = 0.0  # monotonic time of the last good refresh
    failed_closed: bool = False


@dataclass
class _PeersIn:
    """Connections peers dialled, by (cluster, session), and how many frames each
    session's stream has delivered here (its frames below that number are duplicates)."""

    streams: dict[tuple[str, str], FrameStream] = field(default_factory=dict)
    taken: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass
class _Outbound:
    """What a switch holds for one peer it sends to."""

    cluster: str
    address: Address
    queue: FairQueue[str, tuple[Routed, float]]
    window: ResendWindow[Routed]
    meter: LinkMeter = field(default_factory=LinkMeter)
    pending: tuple[Routed, float] | None = None  # taken from the queue, waiting for room
    stream: FrameStream | None = None
    connected: threading.Event = field(default_factory=threading.Event)
    connections: int = 0


class _Meters:
    """The switch's Prometheus series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ["job", "direction"]
        self.bytes = Counter(
            "nebula_switch_bytes",
            "Payload bytes through the switch",
            labels,
            registry=self.registry,
        )
        self.frames = Counter(
            "nebula_switch_frames",
            "Data frames through the switch",
            labels,
            registry=self.registry,
        )
        self.refused = Counter(
            "nebula_switch_refused",
            "Connections or frames refused",
            ["reason"],
            registry=self.registry,
        )
        link = ["job", "peer"]
        self.bandwidth = Gauge(
            "nebula_switch_link_bandwidth_bytes_per_second",
            "Measured rate of the link a job's frames leave on, from acknowledged bytes",
            link,
            registry=self.registry,
        )
        self.rtt = Gauge(
            "nebula_switch_link_rtt_seconds",
            "Measured round trip of the link a job's frames leave on",
            link,
            registry=self.registry,
        )

    def count(self, frame: Routed, direction: str) -> None:
        if isinstance(frame, Data):
            self.bytes.labels(frame.job_id, direction).inc(len(frame.body))
            self.frames.labels(frame.job_id, direction).inc()


class Switch:
    """A switch server run by threads in this process: `start()`, `stop()`, or `with`."""

    def __init__(self, config: SwitchConfig) -> None:
        validate_cluster_name(config.cluster)
        self.config = config
        self.cluster = config.cluster
        key = config.job_token_public_key
        self._token_key = load_job_token_public_key(key) if isinstance(key, bytes) else key
        self._ca_pem = Path(config.ca_path).read_bytes()
        self._session = secrets.token_hex(8)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server: object | None = None
        # one lock for the state below; `_changed` tells waiters a role or connection went
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._doors = _Doors()
        self._revocation = _Revocation()
        self._jobs = _Jobs()
        self._peers_in = _PeersIn()
        self._outbound: dict[str, _Outbound] = {}
        self._meters = _Meters()
        self.registry = self._meters.registry
        self.reload_certificate()
        self.worker_address: Address = config.worker_address
        self.peer_address: Address = config.peer_address

    # life cycle

    def start(self) -> Switch:
        """Load the CRL (failing if it cannot), bind both listeners and start the threads."""
        self.refresh_crl(strict=True)
        worker_listener = self._listen(self.config.worker_address)
        peer_listener = self._listen(self.config.peer_address)
        self.worker_address = worker_listener.getsockname()[:2]
        self.peer_address = peer_listener.getsockname()[:2]
        self._spawn(self._accept_loop, worker_listener, self._serve_worker, name="workers")
        self._spawn(self._accept_loop, peer_listener, self._serve_peer, name="peers")
        self._spawn(self._crl_loop, name="crl")
        self._spawn(self._auth_watchdog, name="auth-watchdog")
        if self.config.renew is not None:
            self._spawn(self._renew_loop, name="renew")
        for cluster, address in self.config.peers.items():
            self.add_peer(cluster, address)
        if self.config.metrics_address is not None:
            host, port = self.config.metrics_address
            self._metrics_server, _ = start_http_server(port, host, registry=self.registry)
        log.info(
            "switch %s: workers on %s, peers on %s",
            self.cluster,
            self.worker_address,
            self.peer_address,
        )
        return self

    def stop(self) -> None:
        """Close every listener and connection and join the threads."""
        self._stop.set()
        for listener in self._doors.listeners:
            cut(listener)
        with self._lock:
            streams = [*self._doors.peers, *self._doors.workers]
            streams += [o.stream for o in self._outbound.values() if o.stream is not None]
        for stream in streams:
            cut(stream.sock)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()  # type: ignore[attr-defined]
        for thread in self._threads:
            thread.join(timeout=5)
        for listener in self._doors.listeners:
            listener.close()  # its port is free for a switch started in its place

    def __enter__(self) -> Switch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

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
            out = _Outbound(cluster, address, FairQueue(cfg.queue_frames), window)
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

    def metrics_text(self) -> bytes:
        """The Prometheus text exposition of this switch's counters."""
        return generate_latest(self.registry)

    # certificates and revocation

    def reload_certificate(self) -> None:
        """Re-read key and certificate; new connections use them, open ones go on."""
        cfg = self.config
        worker_ctx = server_context(cert_path=cfg.cert_path, key_path=cfg.key_path, ca_path=None)
        peer_server_ctx = server_context(
            cert_path=cfg.cert_path, key_path=cfg.key_path, ca_path=str(cfg.ca_path)
        )
        peer_client_ctx = client_context(
            ca_path=cfg.ca_path, cert_path=cfg.cert_path, key_path=cfg.key_path
        )
        with self._lock:
            self._worker_ctx, self._peer_server_ctx = worker_ctx, peer_server_ctx
            self._peer_client_ctx = peer_client_ctx

    def renew_if_due(self, renew: Callable[[bytes], bytes], now: datetime | None = None) -> bool:
        """Renew the certificate through `renew(csr_pem) -> cert_pem` when a third is left."""
        if not needs_renewal(Path(self.config.cert_path).read_bytes(), now):
            return False
        key_pem, csr_pem = make_switch_key_and_csr(self.cluster)
        cert_pem = renew(csr_pem)
        write_private_file(self.config.key_path, key_pem)
        write_private_file(self.config.cert_path, cert_pem)
        self.reload_certificate()
        log.info("switch %s: certificate renewed", self.cluster)
        return True

    def refresh_crl(self, *, strict: bool = False) -> None:
        """Fetch and verify the CRL; cut open peer connections whose certificate is now revoked.

        A CRL past its nextUpdate, or older (a lower CRL number) than the one held, is
        refused. When no good CRL came for `crl_grace_s`, or the held one went stale, the
        switch fails closed: it cuts every connection and refuses new ones until a good
        CRL arrives.
        """
        try:
            info = read_crl(self.config.crl_source(), self._ca_pem)
            if self._revocation.crl is not None and info.number < self._revocation.crl.number:
                raise ValueError(
                    f"CRL number {info.number} is older than the held {self._revocation.crl.number}"
                )
        except Exception as exc:
            if strict:
                raise
            log.warning(
                "switch %s: CRL refresh failed, keeping the last one: %s", self.cluster, exc
            )
            self._fail_closed_if_stale()
            return
        with self._lock:
            held = self._revocation
            held.crl, held.revoked, held.fresh_at = info, info.revoked, time.monotonic()
            if held.failed_closed:
                log.warning("switch %s: a good CRL came; serving again", self.cluster)
            held.failed_closed = False
            peers = self._doors.peers
            doomed = [(s, i.serial) for s, i in peers.items() if i.serial in info.revoked]
            for stream, _ in doomed:
                peers.pop(stream, None)
        for stream, serial in doomed:
            log.warning(
                "switch %s: closing a connection of revoked certificate serial %s",
                self.cluster,
                serial,
            )
            self._meters.refused.labels("revoked").inc()
            cut(stream.sock)

    @property
    def revoked(self) -> frozenset[int]:
        """Serials of the certificates the held CRL revokes."""
        return self._revocation.revoked

    @property
    def failed_closed(self) -> bool:
        """Whether the switch refuses everything for want of a fresh CRL."""
        return self._revocation.failed_closed

    def _fail_closed_if_stale(self) -> None:
        held = self._revocation
        stale = held.crl is None or held.crl.next_update <= datetime.now(UTC)
        if not stale and time.monotonic() - held.fresh_at <= self.config.crl_grace_s:
            return
        with self._lock:
            if held.failed_closed:
                return
            held.failed_closed = True
            doomed = list(self._doors.peers) + list(self._doors.workers)
            self._doors.peers.clear()
        log.error("switch %s: no fresh CRL within the grace period; failing closed", self.cluster)
        for stream in doomed:
            cut(stream.sock)

    def _crl_loop(self) -> None:
        while not self._stop.wait(self.config.crl_refresh_s):
            self.refresh_crl()

    def _renew_loop(self) -> None:
        assert self.config.renew is not None
        while not self._stop.is_set():
            try:
                self.renew_if_due(self.config.renew)
            except Exception as exc:
                log.warning("switch %s: certificate renewal failed: %s", self.cluster, exc)
            if self._stop.wait(self.config.renew_check_s):
                return

    # plumbing

    def _spawn(self, target: Callable[..., None], *args: object, name: str) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(
            target=target, args=args, name=f"switch-{self.cluster}-{name}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _listen(self, address: Address) -> socket.socket:
        listener = socket.create_server(address, reuse_port=False)
        self._doors.listeners.append(listener)
        return listener

    def _accept_loop(
        self, listener: socket.socket, serve: Callable[[socket.socket, Address], None]
    ) -> None:
        while not self._stop.is_set():
            try:
                raw, address = listener.accept()
            except OSError:
                return
            source = address[0]
            with self._lock:
                counts = self._doors.open_by_source
                total = sum(counts.values())
                if total >= self.config.max_connections:
                    refusal = f"{total} connections open, the most this switch takes"
                elif counts[source] >= self.config.max_connections_per_source:
                    refusal = f"{counts[source]} connections open from this source"
                else:
                    refusal = None
                    counts[source] += 1
            if refusal is not None:
                log.info(
                    "switch %s: refused a connection from %s: %s", self.cluster, address, refusal
                )
                self._meters.refused.labels("connections").inc()
                _shutdown(raw)
                continue
            tune(raw)
            self._spawn(self._serve_counted, serve, raw, address, name=f"conn-{address[1]}")

    def _serve_counted(
        self, serve: Callable[[socket.socket, Address], None], raw: socket.socket, address: Address
    ) -> None:
        # wrap_socket takes the descriptor over; the dup stays valid to cut the TCP connection
        guard = raw.dup()
        with self._lock:
            deadline = time.monotonic() + self.config.auth_timeout_s
            self._doors.unauthenticated[threading.get_ident()] = (deadline, guard)
        try:
            serve(raw, address)
        finally:
            self._authenticated()
            with self._changed:
                counts = self._doors.open_by_source
                counts[address[0]] -= 1
                if counts[address[0]] <= 0:
                    del counts[address[0]]
                self._changed.notify_all()

    def _authenticated(self) -> None:
        """The calling connection is through its hello: no deadline from here on."""
        with self._lock:
            pending = self._doors.unauthenticated.pop(threading.get_ident(), None)
        if pending is not None:
            pending[1].close()

    def _auth_watchdog(self) -> None:
        # one thread for every deadline: a stranger trickling a byte at a time through the
        # TLS handshake or the hello is cut all the same
        step = min(0.25, self.config.auth_timeout_s / 4)
        while not self._stop.wait(step):
            now = time.monotonic()
            self._end_detached(now)
            with self._lock:
                pending = self._doors.unauthenticated
                late = [k for k, (deadline, _) in pending.items() if deadline < now]
                guards = [pending.pop(k)[1] for k in late]
            for guard in guards:
                log.info(
                    "switch %s: closed a connection silent past its hello deadline", self.cluster
                )
                self._meters.refused.labels("auth_timeout").inc()
                _shutdown(guard)

    def wait_connections(self, at_most: int, timeout: float) -> bool:
        """Wait until at most `at_most` accepted connections are open, both doors together."""
        with self._changed:
            return self._changed.wait_for(
                lambda: sum(self._doors.open_by_source.values()) <= at_most, timeout
            )

    def held_state(self) -> dict[str, int]:
        """How much per-job state the switch holds now (mailboxes, roles, queues)."""
        with self._lock:
            roles = self._jobs.roles.values()
            held = {
                "mailboxes": len(self._jobs.mailboxes),
                "roles": len(self._jobs.roles),
                "detached_roles": sum(r.detached_at is not None for r in roles),
            }
            outbound = list(self._outbound.values())
        held["job_queues"] = sum(out.queue.keys() for out in outbound)
        return held

    def wait_role_ended(self, job_id: str, role: str, timeout: float) -> bool:
        """Wait until the attempt `job_id`'s `role` has no connection left here."""
        with self._changed:
            return self._changed.wait_for(lambda: (job_id, role) not in self._jobs.roles, timeout)

    def _handshake(
        self, raw: socket.socket, context: ssl.SSLContext, what: str, address: Address
    ) -> ssl.SSLSocket | None:
        raw.settimeout(self.config.handshake_timeout_s)
        if self._revocation.failed_closed:
            self._refuse(raw, what, address, "no fresh CRL: failing closed", "crl")
            return None
        try:
            sock = context.wrap_socket(raw, server_side=True)
        except (OSError, ValueError) as exc:
            self._refuse(raw, what, address, f"TLS handshake failed: {exc}", "tls")
            return None
        return sock

    def _refuse(
        self,
        sock: socket.socket,
        what: str,
        address: Address,
        reason: str,
        label: str,
        stream: FrameStream | None = None,
    ) -> None:
        log.warning("switch %s: refused %s from %s: %s", self.cluster, what, address, reason)
        self._meters.refused.labels(label).inc()
        if stream is not None:
            with contextlib.suppress(OSError, ProtocolError):
                stream.write(Error(reason))
        _shutdown(sock)

    # workers

    def _serve_worker(self, raw: socket.socket, address: Address) -> None:
        with self._lock:
            context = self._worker_ctx
        sock = self._handshake(raw, context, "worker", address)
        if sock is None:
            return
        stream = FrameStream(sock, Connection(Side.SERVER, max_body=self.config.max_frame_bytes))
        with self._lock:
            self._doors.workers.add(stream)
        admitted: tuple[RoleKey, Direction] | None = None
        try:
            hello = stream.read_event()
            if not isinstance(hello, Hello):
                self._refuse(sock, "worker", address, "expected a hello", "protocol", stream)
                return
            try:
                claims = verify_job_token(hello.token, self._token_key)
            except JobTokenError as exc:
                self._refuse(sock, "worker", address, f"job token: {exc}", "token", stream)
                return
            key = (claims.job_id, claims.role)
            peer_cluster = self._peer_of(claims, hello.peer_role)
            with self._lock:
                role = self._jobs.roles.get(key)
                live = role.connections if role is not None else {}
                ended = key in self._jobs.ended
                refusal = admit_worker(hello, claims, self.cluster, live, ended=ended)
                if refusal is None:
                    if role is None:
                        role = self._jobs.roles[key] = _Role(claims, peer_cluster)
                    if role.detached_at is not None:
                        log.info("switch %s: role %s of job %s resumes", self.cluster, *key[::-1])
                    role.connections[hello.direction] = stream
                    role.detached_at = None
                    admitted = key, hello.direction
            if refusal is not None:
                label = "token" if refusal.startswith(("job token", "hello")) else "role"
                self._refuse(sock, "worker", address, refusal, label, stream)
                return
            sock.settimeout(None)
            stream.write(Welcome())
            self._authenticated()
            if hello.direction is Direction.SEND:
                self._worker_sends(stream, claims, hello, address)
            else:
                self._worker_receives(stream, claims, hello)
        except (OSError, ProtocolError) as exc:
            if not self._stop.is_set():
                log.info(
                    "switch %s: worker connection from %s ended: %s", self.cluster, address, exc
                )
        finally:
            with self._lock:
                self._doors.workers.discard(stream)
            if admitted is not None:
                self._leave(*admitted, stream)
            stream.close()

    def _leave(self, key: RoleKey, direction: Direction, stream: FrameStream) -> None:
        """A role's connection has closed; once all have, the attempt ends here, at once
        after its goodbye, else when it has not come back within `resume_grace_s`."""
        with self._lock:
            role = self._jobs.roles.get(key)
            if role is None or role.connections.get(direction) is not stream:
                return
            del role.connections[direction]
            if role.connections:
                return
            if not role.goodbye and self.config.resume_grace_s > 0 and not self._stop.is_set():
                role.detached_at = time.monotonic()
                return
        self._end_role(key)

    def _end_detached(self, now: float) -> None:
        """End the attempts whose roles left without a goodbye and did not come back."""
        grace = self.config.resume_grace_s
        with self._lock:
            gone = [
                key
                for key, role in self._jobs.roles.items()
                if role.detached_at is not None and now - role.detached_at > grace
            ]
        for key in gone:
            log.info("switch %s: role %s of job %s did not come back", self.cluster, *key[::-1])
            self._end_role(key)

    def _end_role(self, key: RoleKey) -> None:
        # A new attempt has a new job id, so what this one held here is freed now, not
        # when the switch restarts; its late frames are dropped.
        with self._changed:
            role = self._jobs.roles.get(key)
            if role is None or role.connections:
                return
            del self._jobs.roles[key]
            self._jobs.mailboxes.pop(key, None)
            self._jobs.ended[key] = None
            while len(self._jobs.ended) > self.config.ended_roles_kept:
                self._jobs.ended.popitem(last=False)
            self._changed.notify_all()
        if role.peer_cluster is not None:
            for gauge in (self._meters.bandwidth, self._meters.rtt):
                with contextlib.suppress(KeyError):
                    gauge.remove(key[0], role.peer_cluster)

    def _peer_of(self, claims: JobClaims, dst_role: str) -> str | None:
        """The cluster whose switch serves `dst_role` of the job, or None if unknown."""
        if dst_role in claims.placement:
            return claims.placement[dst_role]
        with self._lock:
            peers = list(self._outbound)
        return peers[0] if len(peers) == 1 else None

    def _route(self, claims: JobClaims, dst_role: str) -> str:
        """The cluster whose switch serves `dst_role` of the job."""
        target = self._peer_of(claims, dst_role)
        if target is None:
            raise ProtocolError(f"no placement for role {dst_role!r} among several peers")
        return target

    def _worker_sends(
        self, stream: FrameStream, claims: JobClaims, hello: Hello, address: Address
    ) -> None:
        target = self._route(claims, hello.peer_role)
        stall = self.config.io_timeout_s
        count = 0  # frames taken on this connection
        said_at = time.monotonic()

        def idle() -> float:
            """Reading waits: cut a worker that sends nothing, not even its pings."""
            silent = time.monotonic() - stream.last_read_at
            if silent > stall:
                raise TimeoutError(f"the worker sent nothing for {stall:.0f} s")
            return stall - silent

        def here() -> bool:
            """Waiting on room for a frame, the worker's pings go unread: say we are here."""
            nonlocal said_at
            if time.monotonic() - said_at >= self.config.ping_interval_s:
                stream.write(Ack(count))
                said_at = time.monotonic()
            return not self._stop.is_set()

        while not self._stop.is_set():
            frame = stream.read_event(idle=idle)
            if frame is CLOSED:
                return
            if isinstance(frame, Error):  # the role's goodbye: it is done, no resume
                with self._lock:
                    role = self._jobs.roles.get((claims.job_id, claims.role))
                    if role is not None:
                        role.goodbye = True
                return
            if isinstance(frame, Ping):
                stream.write(Ack(count, ping=frame.id))
                continue
            if not isinstance(frame, Data | Receipt):
                raise ProtocolError("workers send only data frames, receipts and pings")
            if (frame.job_id, frame.src_role, frame.dst_role) != (
                claims.job_id,
                claims.role,
                hello.peer_role,
            ):
                reason = (
                    f"frame for job {frame.job_id!r} {frame.src_role}->{frame.dst_role} outside"
                    f" its token's job {claims.job_id!r} {claims.role}->{hello.peer_role}"
                )
                self._refuse(stream.sock, "worker frame", address, reason, "channel", stream)
                return
            count += 1
            # sequence numbers are the roles' own, end to end: a role resending after a
            # switch restart repeats them, and its peer drops what it already has
            self._meters.count(frame, "from_worker")
            said_at = time.monotonic()
            if target == self.cluster:
                self._deliver(frame, here)
                continue
            outbound = self._outbound.get(target)
            if outbound is None:
                raise ProtocolError(f"no peer switch for cluster {target!r}")
            item = (frame, time.monotonic())
            while not outbound.queue.put(frame.job_id, item, timeout=POLL_S):
                if not here():
                    raise OSError("switch stopping")

    def _mailbox_locked(self, key: RoleKey) -> queue.Queue[Routed] | None:
        """The mailbox of (job, role), made if there is room; the caller holds the lock."""
        box = self._jobs.mailboxes.get(key)
        if box is None and len(self._jobs.mailboxes) < self.config.max_mailboxes:
            box = self._jobs.mailboxes[key] = queue.Queue(self.config.mailbox_frames)
        return box

    def _deliver(self, frame: Routed, alive: Callable[[], bool] | None) -> bool:
        """Put `frame` in its role's mailbox; False when dropped: that attempt has ended
        here, no mailbox is left for a new one, or (with `alive` None, for frames from a
        peer, which never wait on one job) the mailbox is full. The roles' end-to-end
        resend makes good a dropped frame. With `alive`, waits for room (OSError when
        stopping or `alive()` turns false)."""
        key = (frame.job_id, frame.dst_role)
        while not self._stop.is_set() and (alive is None or alive()):
            with self._lock:
                if key in self._jobs.ended:
                    return False
                box = self._mailbox_locked(key)
            if box is None:
                log.warning(
                    "switch %s: dropped a frame of job %s: %d mailboxes in use",
                    self.cluster,
                    frame.job_id,
                    self.config.max_mailboxes,
                )
                self._meters.refused.labels("mailboxes").inc()
                return False
            try:
                # a poll at a time, so that an attempt ending meanwhile is noticed
                box.put(frame, block=alive is not None, timeout=POLL_S)
                return True
            except queue.Full:
                if alive is None:
                    self._meters.refused.labels("mailbox_full").inc()
                    return False
        raise OSError("switch stopping or connection closed")

    def _worker_receives(self, stream: FrameStream, claims: JobClaims, hello: Hello) -> None:
        with self._lock:
            box = self._mailbox_locked((claims.job_id, claims.role))
        if box is None:
            raise ProtocolError("too many mailboxes")
        peer = self._peer_of(claims, hello.peer_role)
        outbound = self._outbound.get(peer) if peer is not None else None
        stall = self.config.io_timeout_s
        answers: list[Ack] = []  # pings read, to answer between frames

        def hear() -> bool:
            """Take the worker's pings (it sends nothing else here); False once it has
            closed; cut a worker that sends nothing, not even them. Writes nothing: it
            may run in the middle of a frame."""
            while (event := stream.read_event(block=False)) is not None:
                if event is CLOSED or isinstance(event, Error):
                    return False
                if not isinstance(event, Ping):
                    raise ProtocolError("a receiving worker sends only pings")
                answers.append(Ack(0, ping=event.id))
            if time.monotonic() - stream.last_read_at > stall:
                raise TimeoutError(f"the worker sent nothing for {stall:.0f} s")
            return True

        def hear_while_blocked() -> None:
            if not hear():
                raise OSError("the worker closed the connection")

        reported = -1
        while not self._stop.is_set():
            if outbound is not None and outbound.meter.version != reported:
                reported = outbound.meter.version
                self._report_link(stream, claims.job_id, outbound)
            try:
                frame = box.get(timeout=POLL_S)
            except queue.Empty:
                frame = None
            if frame is not None:
                stream.write(frame, while_blocked=hear_while_blocked, poll_s=POLL_S)
                self._meters.count(frame, "to_worker")
            if not hear():
                return
            for ack in answers:
                stream.write(ack)
            answers.clear()

    def _report_link(self, stream: FrameStream, job_id: str, out: _Outbound) -> None:
        """Tell a role what was measured of the link its own frames leave on (and /metrics)."""
        estimate = out.meter.estimate()
        if estimate is None:
            return
        bandwidth, rtt, samples = estimate
        self._meters.bandwidth.labels(job_id, out.cluster).set(bandwidth)
        self._meters.rtt.labels(job_id, out.cluster).set(rtt)
        stream.write(LinkReport(bandwidth, rtt, samples))

    # peers: receiving

    def _serve_peer(self, raw: socket.socket, address: Address) -> None:
        with self._lock:
            context = self._peer_server_ctx
        sock = self._handshake(raw, context, "peer", address)
        if sock is None:
            return
        stream = FrameStream(sock, Connection(Side.SERVER, max_body=self.config.max_frame_bytes))
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
        """Take a peer's frames, acknowledge them (after the shaper's delay, the way back
        of the link it plays), and cut a peer that sends nothing, not even pings."""
        shaper = self.config.shaper
        delay = shaper.delay_ms / 1000 if shaper is not None else 0.0
        stall = self.config.io_timeout_s
        count = 0  # frames taken on this connection
        due: collections.deque[tuple[float, Ack]] = collections.deque()

        def flush() -> float | None:
            """Write the acknowledgements due; the seconds to the next, or to the stall."""
            now = time.monotonic()
            while due and due[0][0] <= now:
                _, ack = due.popleft()
                # a later count due now says as much; each ping is answered
                if ack.ping is not None or not due or due[0][0] > now:
                    stream.write(ack)
            if now - stream.last_read_at > stall:
                raise TimeoutError(f"peer {cluster} sent nothing for {stall:.0f} s")
            until_stall = stall - (now - stream.last_read_at)
            return min(due[0][0] - now, until_stall) if due else until_stall

        key = (cluster, session)
        while not self._stop.is_set():
            frame = stream.read_event(idle=flush)
            if frame is CLOSED:
                return
            if isinstance(frame, Ping):
                due.append((time.monotonic() + delay, Ack(count, ping=frame.id)))
                flush()
                continue
            if not isinstance(frame, Data | Receipt):
                raise ProtocolError("peers send only data frames, receipts and pings")
            with self._lock:
                taken = self._peers_in.taken.get(key, first)
                fresh = first + count >= taken
                if fresh:
                    self._peers_in.taken[key] = first + count + 1
            count += 1
            if fresh:
                self._take_from_peer(frame, cluster)
            due.append((time.monotonic() + delay, Ack(count)))
            flush()

    def _take_from_peer(self, frame: Routed, cluster: str) -> None:
        with self._lock:
            role = self._jobs.roles.get((frame.job_id, frame.dst_role))
            ended = (frame.job_id, frame.dst_role) in self._jobs.ended
        placed = role.claims.placement.get(frame.src_role) if role is not None else None
        if ended:
            # late or resent frames of an attempt that is over here: acknowledged, dropped
            log.info(
                "switch %s: dropped a late frame of job %s for %s: its attempt has ended",
                self.cluster,
                frame.job_id,
                frame.dst_role,
            )
            self._meters.refused.labels("ended").inc()
        elif placed is not None and placed != cluster:
            log.warning(
                "switch %s: dropped a frame of job %s from cluster %s: role %s runs on %s",
                self.cluster,
                frame.job_id,
                cluster,
                frame.src_role,
                placed,
            )
            self._meters.refused.labels("placement").inc()
        elif self._deliver(frame, None):
            self._meters.count(frame, "from_peer")

    # peers: sending

    def _connect_peer(self, out: _Outbound) -> FrameStream:
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

    def _peer_sender(self, out: _Outbound) -> None:
        backoff = self.config.backoff_initial_s
        current: list[_PeerSending] = []

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
                current[:] = [_PeerSending(self, out, stream, shaper)]
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


class _PeerSending:
    """One connection's worth of sending to a peer: the window's frames again, then new
    ones in turn from the jobs' queues, reading acknowledgements and pings' answers."""

    def __init__(
        self, switch: Switch, out: _Outbound, stream: FrameStream, shaper: Shaper | None
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
        out, stop = self.out, self.switch._stop
        for _, frame in out.window.replay():
            self.sent += 1  # first: its acknowledgement may come while it is written
            self.send(frame)
        while not stop.is_set():
            self.take_all()
            wait = self.ping_if_due()
            if out.pending is None:
                out.pending = out.queue.get(timeout=wait)
                if out.pending is None:
                    continue
            frame, queued_at = out.pending
            nbytes = len(frame.body) if isinstance(frame, Data) else 0
            if not out.window.has_room(nbytes):
                # full: wait for the peer to catch up, a poll at a time
                self.stream.wait_readable(min(wait, POLL_S))
                continue
            out.pending = None  # it stays with the outbound (not this connection) till here
            out.window.push(frame, nbytes)
            if self.shaper is not None:
                self.shaper.hold(queued_at)
            self.sent += 1
            self.send(frame)
            self.switch._meters.count(frame, "to_peer")


def _shutdown(sock: socket.socket) -> None:
    cut(sock)
    with contextlib.suppress(OSError):
        sock.close()

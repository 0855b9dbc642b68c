"""The switch server: the only door of a cluster, one per cluster.

Blocking TLS sockets, one thread per connection (measured faster than asyncio
TLS here, and OpenSSL releases the GIL while it encrypts). Two listeners:

- workers of this cluster connect over TLS and present a job token; a worker
  opens one connection to send and one to receive, so that no TLS socket is
  ever read and written by two threads at once;
- peer switches connect with mutual TLS; each switch dials every peer and
  sends its frames on the connection it dialled, and reads acknowledgements
  back on it. Unacknowledged frames stay in a bounded resend buffer and go
  again, in order, after a reconnection; the receiver drops what it already
  has by sequence number, so each frame is delivered once.

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
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from prometheus_client import CollectorRegistry, Counter, generate_latest, start_http_server

from contract.jobtoken import (
    JobClaims,
    JobTokenError,
    load_job_token_public_key,
    verify_job_token,
)
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
    PeerHello,
    ProtocolError,
    Side,
    StreamTracker,
    Welcome,
)
from workers.switch.shaper import Shaper, ShaperConfig
from workers.switch.stream import FrameStream
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
    write_private_file,
)

log = logging.getLogger("nebula.switch")
Address = tuple[str, int]
POLL_S = 0.2


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
    shaper: ShaperConfig | None = None  # on frames sent to peers
    max_frame_bytes: int = DEFAULT_MAX_BODY_BYTES
    queue_frames: int = 8  # per outbound peer queue and per worker mailbox
    resend_frames: int = 64
    resend_bytes: int = 256 * 1024 * 1024
    max_mailboxes: int = 4096
    # accepted connections, both doors together: in all, and from one source address
    max_connections: int = 1024
    max_connections_per_source: int = 64
    auth_timeout_s: float = 5.0  # a connection not through its hello by then is closed
    ended_roles_kept: int = 65536  # finished (job, role)s remembered, to drop late frames
    handshake_timeout_s: float = 10.0
    io_timeout_s: float = 60.0  # a peer that takes no bytes for this long is reconnected
    backoff_initial_s: float = 0.05
    backoff_max_s: float = 5.0
    metrics_address: Address | None = None  # serve Prometheus /metrics here when given
    # renew(csr_pem) -> cert_pem: when set, the switch renews its own certificate in time
    renew: Callable[[bytes], bytes] | None = None
    renew_check_s: float = 3600.0


@dataclass
class _Role:
    """A job attempt's role on this switch: its live connections and what it holds."""

    claims: JobClaims
    connections: dict[Direction, FrameStream] = field(default_factory=dict)


def admit_worker(
    hello: Hello, claims: JobClaims, cluster: str, live: Collection[Direction], *, ended: bool
) -> str | None:
    """Why a worker whose token verified is refused, or None to admit it.

    `live` holds the directions this (job, attempt, role) already has connected here;
    `ended` says its attempt has come and gone here.
    """
    if claims.cluster != cluster:
        return f"job token is for cluster {claims.cluster!r}"
    if (claims.job_id, claims.role) != (hello.job_id, hello.role):
        return "hello names another job or role than its token"
    # Newest-wins would let anyone holding the token take over a live role's stream;
    # a role reconnects only once its first connection is gone.
    if hello.direction in live:
        return (
            f"role {hello.role!r} of job {hello.job_id!r} is already connected to {hello.direction}"
        )
    # What an ended attempt held is freed; its streams cannot resume from nothing, and the
    # control plane starts a new attempt (a new job id) for a role that must run again.
    if ended:
        return f"role {hello.role!r} of job {hello.job_id!r} has ended here"
    return None


@dataclass
class _Outbound:
    """What a switch holds for one peer it sends to."""

    cluster: str
    address: Address
    queue: queue.Queue[tuple[Data, float]]
    unacked: collections.deque[Data] = field(default_factory=collections.deque)
    unacked_bytes: int = 0
    stream: FrameStream | None = None
    connected: threading.Event = field(default_factory=threading.Event)
    connections: int = 0


class Switch:
    """A switch server run by threads in this process: `start()`, `stop()`, or `with`."""

    def __init__(self, config: SwitchConfig) -> None:
        validate_cluster_name(config.cluster)
        self.config = config
        self.cluster = config.cluster
        key = config.job_token_public_key
        self._token_key = load_job_token_public_key(key) if isinstance(key, bytes) else key
        self._ca_pem = Path(config.ca_path).read_bytes()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._listeners: list[socket.socket] = []
        self._live: dict[FrameStream, PeerIdentity] = {}
        self._worker_streams: set[FrameStream] = set()
        self._revoked: frozenset[int] = frozenset()
        self._crl: CrlInfo | None = None
        self._crl_fresh_at = 0.0  # monotonic time of the last good refresh
        self._failed_closed = False
        self._session = secrets.token_hex(8)
        self._out_seq: dict[tuple[str, ...], int] = {}
        self._trackers: dict[tuple[str, str], tuple[threading.Lock, StreamTracker]] = {}
        self._peer_in: dict[tuple[str, str], FrameStream] = {}
        self._mailboxes: dict[tuple[str, str], queue.Queue[Data]] = {}
        self._roles: dict[tuple[str, str], _Role] = {}
        # (job, role)s whose attempt ended here, oldest first: their late frames are dropped
        self._ended: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._role_ended = threading.Condition(self._lock)
        self._connections: collections.Counter[str] = collections.Counter()
        self._connection_closed = threading.Condition(self._lock)
        # serving thread -> (deadline, a dup of its socket that can cut it at any stage)
        self._unauthenticated: dict[int, tuple[float, socket.socket]] = {}
        self._outbound: dict[str, _Outbound] = {}
        self._metrics_server: object | None = None
        self.registry = CollectorRegistry()
        self._bytes = Counter(
            "nebula_switch_bytes",
            "Payload bytes through the switch",
            ["job", "direction"],
            registry=self.registry,
        )
        self._frames = Counter(
            "nebula_switch_frames",
            "Data frames through the switch",
            ["job", "direction"],
            registry=self.registry,
        )
        self._refused = Counter(
            "nebula_switch_refused",
            "Connections or frames refused",
            ["reason"],
            registry=self.registry,
        )
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
        for listener in self._listeners:
            _cut(listener)
        with self._lock:
            streams = [*self._live, *self._worker_streams]
            streams += [o.stream for o in self._outbound.values() if o.stream is not None]
        for stream in streams:
            _cut(stream.sock)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()  # type: ignore[attr-defined]
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> Switch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_peer(self, cluster: str, address: Address) -> None:
        """Start sending to (and accepting) the peer switch of `cluster` at `address`."""
        validate_cluster_name(cluster)
        with self._lock:
            self.config.peers[cluster] = address
            if cluster in self._outbound:
                self._outbound[cluster].address = address
                return
            out = _Outbound(cluster, address, queue.Queue(self.config.queue_frames))
            self._outbound[cluster] = out
        if not self._stop.is_set() and self._listeners:
            self._spawn(self._peer_sender, out, name=f"to-{cluster}")

    def wait_connected(self, cluster: str, timeout: float) -> bool:
        """Wait until the connection to `cluster`'s switch is up."""
        return self._outbound[cluster].connected.wait(timeout)

    def peer_connections(self, cluster: str) -> int:
        """How many times this switch has connected to `cluster` (1 + reconnections)."""
        return self._outbound[cluster].connections

    def unacked_frames(self, cluster: str) -> int:
        """Frames sent (or being sent) to `cluster`'s switch that it has not acknowledged."""
        return len(self._outbound[cluster].unacked)

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
            if self._crl is not None and info.number < self._crl.number:
                raise ValueError(
                    f"CRL number {info.number} is older than the held {self._crl.number}"
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
            self._crl, self._revoked = info, info.revoked
            self._crl_fresh_at = time.monotonic()
            if self._failed_closed:
                log.warning("switch %s: a good CRL came; serving again", self.cluster)
            self._failed_closed = False
            doomed = [(s, i.serial) for s, i in self._live.items() if i.serial in info.revoked]
            for stream, _ in doomed:
                self._live.pop(stream, None)
        for stream, serial in doomed:
            log.warning(
                "switch %s: closing a connection of revoked certificate serial %s",
                self.cluster,
                serial,
            )
            self._refused.labels("revoked").inc()
            _cut(stream.sock)

    @property
    def failed_closed(self) -> bool:
        """Whether the switch refuses everything for want of a fresh CRL."""
        return self._failed_closed

    def _fail_closed_if_stale(self) -> None:
        held = self._crl
        stale = held is None or held.next_update <= datetime.now(UTC)
        if not stale and time.monotonic() - self._crl_fresh_at <= self.config.crl_grace_s:
            return
        with self._lock:
            if self._failed_closed:
                return
            self._failed_closed = True
            doomed = list(self._live) + list(self._worker_streams)
            self._live.clear()
        log.error("switch %s: no fresh CRL within the grace period; failing closed", self.cluster)
        for stream in doomed:
            _cut(stream.sock)

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
        self._listeners.append(listener)
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
                total = sum(self._connections.values())
                if total >= self.config.max_connections:
                    refusal = f"{total} connections open, the most this switch takes"
                elif self._connections[source] >= self.config.max_connections_per_source:
                    refusal = f"{self._connections[source]} connections open from this source"
                else:
                    refusal = None
                    self._connections[source] += 1
            if refusal is not None:
                log.info(
                    "switch %s: refused a connection from %s: %s", self.cluster, address, refusal
                )
                self._refused.labels("connections").inc()
                _shutdown(raw)
                continue
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._spawn(self._serve_counted, serve, raw, address, name=f"conn-{address[1]}")

    def _serve_counted(
        self, serve: Callable[[socket.socket, Address], None], raw: socket.socket, address: Address
    ) -> None:
        # wrap_socket takes the descriptor over; the dup stays valid to cut the TCP connection
        guard = raw.dup()
        with self._lock:
            deadline = time.monotonic() + self.config.auth_timeout_s
            self._unauthenticated[threading.get_ident()] = (deadline, guard)
        try:
            serve(raw, address)
        finally:
            self._authenticated()
            with self._connection_closed:
                self._connections[address[0]] -= 1
                if self._connections[address[0]] <= 0:
                    del self._connections[address[0]]
                self._connection_closed.notify_all()

    def _authenticated(self) -> None:
        """The calling connection is through its hello: no deadline from here on."""
        with self._lock:
            pending = self._unauthenticated.pop(threading.get_ident(), None)
        if pending is not None:
            pending[1].close()

    def _auth_watchdog(self) -> None:
        # one thread for every deadline: a stranger trickling a byte at a time through the
        # TLS handshake or the hello is cut all the same
        step = min(0.25, self.config.auth_timeout_s / 4)
        while not self._stop.wait(step):
            now = time.monotonic()
            with self._lock:
                late = [k for k, (deadline, _) in self._unauthenticated.items() if deadline < now]
                guards = [self._unauthenticated.pop(k)[1] for k in late]
            for guard in guards:
                log.info(
                    "switch %s: closed a connection silent past its hello deadline", self.cluster
                )
                self._refused.labels("auth_timeout").inc()
                _shutdown(guard)

    def wait_connections(self, at_most: int, timeout: float) -> bool:
        """Wait until at most `at_most` accepted connections are open, both doors together."""
        with self._connection_closed:
            return self._connection_closed.wait_for(
                lambda: sum(self._connections.values()) <= at_most, timeout
            )

    def held_state(self) -> dict[str, int]:
        """How much per-job state the switch holds now (mailboxes, roles, streams)."""
        with self._lock:
            return {
                "mailboxes": len(self._mailboxes),
                "roles": len(self._roles),
                "out_streams": len(self._out_seq),
                "in_streams": sum(len(tracker) for _, tracker in self._trackers.values()),
            }

    def wait_role_ended(self, job_id: str, role: str, timeout: float) -> bool:
        """Wait until the attempt `job_id`'s `role` has no connection left here."""
        with self._role_ended:
            return self._role_ended.wait_for(lambda: (job_id, role) not in self._roles, timeout)

    def _handshake(
        self, raw: socket.socket, context: ssl.SSLContext, what: str, address: Address
    ) -> ssl.SSLSocket | None:
        raw.settimeout(self.config.handshake_timeout_s)
        if self._failed_closed:
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
        self._refused.labels(label).inc()
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
            self._worker_streams.add(stream)
        admitted: tuple[tuple[str, str], Direction] | None = None
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
            with self._lock:
                role = self._roles.get((claims.job_id, claims.role))
                live = role.connections if role is not None else {}
                key = (claims.job_id, claims.role)
                ended = key in self._ended
                refusal = admit_worker(hello, claims, self.cluster, live, ended=ended)
                if refusal is None:
                    if role is None:
                        role = self._roles[key] = _Role(claims)
                    role.connections[hello.direction] = stream
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
                self._worker_receives(stream, claims)
        except (OSError, ProtocolError) as exc:
            if not self._stop.is_set():
                log.info(
                    "switch %s: worker connection from %s ended: %s", self.cluster, address, exc
                )
        finally:
            with self._lock:
                self._worker_streams.discard(stream)
            if admitted is not None:
                self._leave(*admitted, stream)
            stream.close()

    def _leave(self, key: tuple[str, str], direction: Direction, stream: FrameStream) -> None:
        """A role's connection has closed; the last one to go ends its attempt here."""
        with self._lock:
            role = self._roles.get(key)
            if role is None or role.connections.get(direction) is not stream:
                return
            del role.connections[direction]
            if role.connections:
                return
            # No client reconnects within an attempt (a new attempt has a new job id), so
            # what the attempt held here is freed now, not when the switch restarts.
            job_id, name = key
            del self._roles[key]
            self._mailboxes.pop(key, None)
            for stream_key in [k for k in self._out_seq if k[0] == job_id and k[1] == name]:
                del self._out_seq[stream_key]
            self._ended[key] = None
            while len(self._ended) > self.config.ended_roles_kept:
                self._ended.popitem(last=False)
            trackers = list(self._trackers.values())
        # each tracker's lock is taken apart from the switch's: a peer thread holds it
        # while it waits (a poll at most) for room in a mailbox, which needs the switch's
        for lock, tracker in trackers:
            with lock:
                tracker.forget(job_id, name)
        with self._role_ended:
            self._role_ended.notify_all()

    def _route(self, claims: JobClaims, dst_role: str) -> str:
        """The cluster whose switch serves `dst_role` of the job."""
        if dst_role in claims.placement:
            return claims.placement[dst_role]
        with self._lock:
            peers = list(self._outbound)
        if len(peers) == 1:
            return peers[0]
        raise ProtocolError(f"no placement for role {dst_role!r} and {len(peers)} peers")

    def _worker_sends(
        self, stream: FrameStream, claims: JobClaims, hello: Hello, address: Address
    ) -> None:
        tracker = StreamTracker()
        target = self._route(claims, hello.peer_role)
        while not self._stop.is_set():
            frame = stream.read_event()
            if frame is CLOSED:
                return
            if not isinstance(frame, Data):
                raise ProtocolError("workers send only data frames")
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
            key = (frame.job_id, frame.src_role, frame.dst_role, frame.channel)
            if not tracker.admit(key, frame.seq):
                raise ProtocolError("a worker repeated a sequence number")
            nbytes = len(frame.body)
            self._bytes.labels(frame.job_id, "from_worker").inc(nbytes)
            self._frames.labels(frame.job_id, "from_worker").inc()
            with self._lock:
                seq = self._out_seq.get(key, 0)
                self._out_seq[key] = seq + 1
            out = Data(
                frame.job_id,
                frame.channel,
                seq,
                frame.src_role,
                frame.dst_role,
                frame.body,
                frame.tensor,
            )
            if target == self.cluster:
                self._deliver(out, lambda: not self._stop.is_set())
            else:
                outbound = self._outbound.get(target)
                if outbound is None:
                    raise ProtocolError(f"no peer switch for cluster {target!r}")
                self._put(outbound.queue, (out, time.monotonic()))

    def _put(
        self, q: queue.Queue[Any], item: object, alive: Callable[[], bool] | None = None
    ) -> None:
        while not self._stop.is_set() and (alive is None or alive()):
            try:
                q.put(item, timeout=POLL_S)
                return
            except queue.Full:
                continue
        raise OSError("switch stopping or connection closed")

    def _mailbox_locked(self, key: tuple[str, str]) -> queue.Queue[Data] | None:
        """The mailbox of (job, role), made if there is room; the caller holds the lock."""
        box = self._mailboxes.get(key)
        if box is None and len(self._mailboxes) < self.config.max_mailboxes:
            box = self._mailboxes[key] = queue.Queue(self.config.queue_frames)
        return box

    def _deliver(self, frame: Data, alive: Callable[[], bool]) -> bool:
        """Put `frame` in its role's mailbox; False when dropped (that attempt has ended here,
        or no mailbox is left for a new one); OSError when stopping or `alive()` turns false."""
        key = (frame.job_id, frame.dst_role)
        while not self._stop.is_set() and alive():
            with self._lock:
                if key in self._ended:
                    return False
                box = self._mailbox_locked(key)
            if box is None:
                log.warning(
                    "switch %s: dropped a frame of job %s: %d mailboxes in use",
                    self.cluster,
                    frame.job_id,
                    self.config.max_mailboxes,
                )
                self._refused.labels("mailboxes").inc()
                return False
            try:
                # a poll at a time, so that an attempt ending meanwhile is noticed
                box.put(frame, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        raise OSError("switch stopping or connection closed")

    def _worker_receives(self, stream: FrameStream, claims: JobClaims) -> None:
        with self._lock:
            box = self._mailbox_locked((claims.job_id, claims.role))
        if box is None:
            raise ProtocolError("too many mailboxes")
        while not self._stop.is_set():
            try:
                frame = box.get(timeout=POLL_S)
            except queue.Empty:
                if stream.read_event(block=False) is CLOSED:
                    return
                continue
            stream.write(frame)
            self._bytes.labels(frame.job_id, "to_worker").inc(len(frame.body))
            self._frames.labels(frame.job_id, "to_worker").inc()

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
                identity = check_peer(sock, expected_cluster=cluster, revoked=self._revoked)
            except PeerRejected as exc:
                self._refuse(sock, "peer", address, str(exc), "name", stream)
                return
            sock.settimeout(self.config.io_timeout_s)
            with self._lock:
                self._live[stream] = identity
                tracker = self._trackers.setdefault(
                    (cluster, session), (threading.Lock(), StreamTracker())
                )
                # a newer connection of the same peer session replaces a half-dead older one
                older = self._peer_in.get((cluster, session))
                self._peer_in[(cluster, session)] = stream
                if older is not None:
                    self._live.pop(older, None)
            if older is not None:
                _cut(older.sock)
            stream.write(Welcome())
            self._authenticated()
            log.info("switch %s: peer %s connected from %s", self.cluster, cluster, address)
            self._receive_from_peer(stream, cluster, tracker)
        except (OSError, ProtocolError) as exc:
            if not self._stop.is_set():
                log.info("switch %s: peer connection from %s ended: %s", self.cluster, address, exc)
        finally:
            with self._lock:
                self._live.pop(stream, None)
                for key in [k for k, v in self._peer_in.items() if v is stream]:
                    del self._peer_in[key]
            stream.close()

    def _receive_from_peer(
        self, stream: FrameStream, cluster: str, tracker: tuple[threading.Lock, StreamTracker]
    ) -> None:
        count = 0
        lock, seqs = tracker
        alive = lambda: stream in self._live  # noqa: E731
        while not self._stop.is_set():
            frame = stream.read_event()
            if frame is CLOSED:
                return
            if not isinstance(frame, Data):
                raise ProtocolError("peers send only data frames")
            with self._lock:
                role = self._roles.get((frame.job_id, frame.dst_role))
                ended = (frame.job_id, frame.dst_role) in self._ended
            placed = role.claims.placement.get(frame.src_role) if role is not None else None
            if ended:
                # late or resent frames of an attempt that is over here: acknowledged, dropped
                log.info(
                    "switch %s: dropped a late frame of job %s for %s: its attempt has ended",
                    self.cluster,
                    frame.job_id,
                    frame.dst_role,
                )
                self._refused.labels("ended").inc()
            elif placed is not None and placed != cluster:
                log.warning(
                    "switch %s: dropped a frame of job %s from cluster %s: role %s runs on %s",
                    self.cluster,
                    frame.job_id,
                    cluster,
                    frame.src_role,
                    placed,
                )
                self._refused.labels("placement").inc()
            else:
                key = (frame.job_id, frame.src_role, frame.dst_role, frame.channel)
                # a frame counts as delivered only once it is in the mailbox: a link cut
                # while waiting for room leaves it to the resend
                with lock:
                    if seqs.is_new(key, frame.seq) and self._deliver(frame, alive):
                        seqs.admit(key, frame.seq)
                        self._bytes.labels(frame.job_id, "from_peer").inc(len(frame.body))
                        self._frames.labels(frame.job_id, "from_peer").inc()
            count += 1
            stream.write(Ack(count))

    # peers: sending

    def _connect_peer(self, out: _Outbound) -> FrameStream:
        raw = socket.create_connection(out.address, timeout=self.config.handshake_timeout_s)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            context = self._peer_client_ctx
        try:
            sock = context.wrap_socket(raw, server_hostname=out.cluster)
            identity = check_peer(sock, expected_cluster=out.cluster, revoked=self._revoked)
        except BaseException:
            raw.close()
            raise
        stream = FrameStream(sock, Connection(Side.CLIENT, max_body=self.config.max_frame_bytes))
        stream.write(PeerHello(self.cluster, self._session))
        answer = stream.read_event()
        if isinstance(answer, Error):
            stream.close()
            raise PeerRejected(f"peer refused us: {answer.reason}")
        if not isinstance(answer, Welcome):
            stream.close()
            raise ProtocolError("peer did not welcome us")
        sock.settimeout(self.config.io_timeout_s)
        with self._lock:
            self._live[stream] = identity
        return stream

    def _peer_sender(self, out: _Outbound) -> None:
        backoff = self.config.backoff_initial_s
        shaper = Shaper(self.config.shaper) if self.config.shaper is not None else None
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
                self._send_to_peer(out, stream, shaper)
            except (OSError, ProtocolError) as exc:
                if not self._stop.is_set():
                    log.warning(
                        "switch %s: link to %s dropped (%s); %d frames to resend",
                        self.cluster,
                        out.cluster,
                        exc,
                        len(out.unacked),
                    )
            finally:
                out.connected.clear()
                out.stream = None
                with self._lock:
                    self._live.pop(stream, None)
                stream.close()

    def _send_to_peer(self, out: _Outbound, stream: FrameStream, shaper: Shaper | None) -> None:
        acked = 0  # frames acknowledged on this connection

        def take_ack(event: Event | None) -> None:
            nonlocal acked
            if event is None:
                return
            if event is CLOSED or isinstance(event, Error):
                raise OSError(f"peer closed the link: {getattr(event, 'reason', 'end of stream')}")
            if (
                not isinstance(event, Ack)
                or event.count > acked + len(out.unacked)
                or event.count < acked
            ):
                raise ProtocolError("bad acknowledgement")
            for _ in range(event.count - acked):
                done = out.unacked.popleft()
                out.unacked_bytes -= len(done.body)
            acked = event.count

        def take_acks() -> None:
            while (event := stream.read_event(block=False)) is not None:
                take_ack(event)

        def send(frame: Data) -> None:
            # A write blocked on a peer that takes no more bytes still reads: a peer that
            # closed (or a cut that half-closed the link) ends the connection at once, not
            # after io_timeout_s with every frame behind it held up.
            stream.write(frame, shaper, while_blocked=take_acks, poll_s=POLL_S)

        for frame in list(out.unacked):
            send(frame)
        while not self._stop.is_set():
            take_acks()
            cfg = self.config
            if len(out.unacked) >= cfg.resend_frames or out.unacked_bytes >= cfg.resend_bytes:
                take_ack(stream.read_event())  # full: wait for the peer to catch up
                continue
            try:
                frame, queued_at = out.queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            out.unacked.append(frame)
            out.unacked_bytes += len(frame.body)
            if shaper is not None:
                shaper.hold(queued_at)
            send(frame)
            self._bytes.labels(frame.job_id, "to_peer").inc(len(frame.body))
            self._frames.labels(frame.job_id, "to_peer").inc()


def _cut(sock: socket.socket) -> None:
    """Shut a socket down from another thread; its owner notices and closes it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()

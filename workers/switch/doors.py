"""The doors: listeners, the accept loop, the connection limits, the hello deadline."""

from __future__ import annotations

import collections
import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workers.switch.connection import Connection, Side
from workers.switch.core import (
    Address,
    SwitchCore,
    log,
    shutdown_socket,
)
from workers.switch.frames import Error, ProtocolError
from workers.switch.stream import FrameStream, tune
from workers.switch.tls import (
    PeerIdentity,
)


@dataclass
class DoorState:
    """The connections both doors accepted."""

    listeners: list[socket.socket] = field(default_factory=list)
    open_by_source: collections.Counter[str] = field(default_factory=collections.Counter)
    # serving thread -> (deadline, a dup of its socket that can cut it at any stage)
    unauthenticated: dict[int, tuple[float, socket.socket]] = field(default_factory=dict)
    workers: set[FrameStream] = field(default_factory=set)
    peers: dict[FrameStream, PeerIdentity] = field(default_factory=dict)  # both ways


class Doors(SwitchCore):
    """Both doors: the accept loop, the limits on connections, the hello deadline."""

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
                shutdown_socket(raw)
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
            self._housekeeping(now)
            with self._lock:
                pending = self._doors.unauthenticated
                late = [k for k, (deadline, _) in pending.items() if deadline < now]
                guards = [pending.pop(k)[1] for k in late]
            for guard in guards:
                log.info(
                    "switch %s: closed a connection silent past its hello deadline", self.cluster
                )
                self._meters.refused.labels("auth_timeout").inc()
                shutdown_socket(guard)

    def wait_connections(self, at_most: int, timeout: float) -> bool:
        """Wait until at most `at_most` accepted connections are open, both doors together."""
        with self._changed:
            return self._changed.wait_for(
                lambda: sum(self._doors.open_by_source.values()) <= at_most, timeout
            )

    def _open_door(self, raw: socket.socket, what: str, address: Address) -> FrameStream | None:
        """The TLS handshake of a connection to the door `what` ("worker" or "peer"), and
        the server end of a frame stream on it; None when refused."""
        with self._lock:
            context = self._worker_ctx if what == "worker" else self._peer_server_ctx
        sock = self._handshake(raw, context, what, address)
        if sock is None:
            return None
        return FrameStream(sock, Connection(Side.SERVER, max_body=self.config.max_frame_bytes))

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
        shutdown_socket(sock)

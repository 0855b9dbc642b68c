"""The parts every piece of the switch shares: configuration, meters, the core state."""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import ssl
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
)

from workers.switch.protocol import (
    DEFAULT_MAX_BODY_BYTES,
    Data,
    Routed,
)
from workers.switch.shaper import ShaperConfig
from workers.switch.stream import cut

if TYPE_CHECKING:
    from workers.switch.credentials import Revocation
    from workers.switch.doors import DoorState
    from workers.switch.peers import Outbound, PeersIn
    from workers.switch.roles import Jobs


log = logging.getLogger("nebula.switch")
Address = tuple[str, int]
RoleKey = tuple[str, str]  # (job, role)
POLL_S = 0.2
PING_POLL_S = 0.002
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
M = TypeVar("M", Counter, Gauge)


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
    # mailboxes a peer's frames make for roles not connected here (finding 27.5): at most
    # so many per peer, given up when no role claims them in so long
    unclaimed_mailboxes_per_peer: int = 64
    unclaimed_mailbox_s: float = 60.0
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


class Meters:
    """The switch's Prometheus series."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._traffic: dict[tuple[str, str], tuple[Counter, Counter]] = {}
        traffic, link = ["job", "direction"], ["job", "peer"]
        self.bytes = self._new(Counter, "bytes", "Payload bytes through the switch", traffic)
        self.frames = self._new(Counter, "frames", "Data frames through the switch", traffic)
        self.refused = self._new(Counter, "refused", "Connections or frames refused", ["reason"])
        # of the frames to_peer and to_worker, those written by the thread that had them,
        # handed to no writer thread (outlet.py)
        direct = self._new(
            Counter, "direct_frames", "Frames written without a thread hand-off", ["direction"]
        )
        self.direct = {where: direct.labels(where) for where in ("to_peer", "to_worker")}
        self.bandwidth = self._new(
            Gauge,
            "link_bandwidth_bytes_per_second",
            "Measured rate of the link a job's frames leave on, from acknowledged bytes",
            link,
        )
        self.rtt = self._new(
            Gauge,
            "link_rtt_seconds",
            "Measured round trip of the link a job's frames leave on",
            link,
        )

    def _new(self, kind: type[M], name: str, doc: str, labels: list[str]) -> M:
        return kind(f"nebula_switch_{name}", doc, labels, registry=self.registry)

    def count(self, frame: Routed, direction: str) -> None:
        if not isinstance(frame, Data):
            return
        # each frame counts twice at each switch: the series' children are looked up
        # once per (job, direction), not with `labels()` (a lock and its checks) each time
        key = (frame.job_id, direction)
        series = self._traffic.get(key)
        if series is None:
            series = self._traffic[key] = (self.bytes.labels(*key), self.frames.labels(*key))
        series[0].inc(len(frame.body))
        series[1].inc()


class SwitchCore(ABC):
    """What every part of a switch shares: its configuration, one lock over the state of
    all parts (`_changed` tells waiters a role or connection went), the stop event, the
    threads and the meters. The parts (credentials, doors, roles, peers) are mixins of
    it, each in its own module; `Switch` (server.py) puts them together. The abstract
    methods are those one part calls and another defines (roles.py, peers.py)."""

    config: SwitchConfig
    cluster: str
    _lock: threading.Lock
    _changed: threading.Condition
    _stop: threading.Event
    _threads: list[threading.Thread]
    _meters: Meters
    _session: str
    _token_key: Ed25519PublicKey
    _ca_pem: bytes
    _doors: DoorState
    _revocation: Revocation
    _jobs: Jobs
    _peers_in: PeersIn
    _outbound: dict[str, Outbound]
    _worker_ctx: ssl.SSLContext
    _peer_server_ctx: ssl.SSLContext
    _peer_client_ctx: ssl.SSLContext

    def _spawn(self, target: Callable[..., None], *args: object, name: str) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        thread = threading.Thread(
            target=target, args=args, name=f"switch-{self.cluster}-{name}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    @abstractmethod
    def _deliver(
        self, frame: Routed, alive: Callable[[], bool] | None, *, peer: str | None = None
    ) -> bool:
        """Put a frame in its role's mailbox (roles.py)."""

    @abstractmethod
    def _housekeeping(self, now: float) -> None:
        """Expire what has waited too long (roles.py)."""

    @abstractmethod
    def _send_direct(self, out: Outbound, frame: Routed) -> bool:
        """Write a worker's frame to the peer on the thread that read it (peers.py)."""


def shutdown_socket(sock: socket.socket) -> None:
    cut(sock)
    with contextlib.suppress(OSError):
        sock.close()
